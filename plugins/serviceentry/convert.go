package serviceentry

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	networking "istio.io/api/networking/v1alpha3"

	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/istio"
)

// build converts accepted objects into the instance's services and
// endpoints, with notices about what could not be merged. It is a pure
// function of its input.
//
// Rules, mirroring Istio where the registry model allows:
//   - one service per host; the oldest entry (creation time, then the order
//     objs are given in) owns it: name, namespace, resolution, location,
//     exportTo;
//   - a newer entry of the same namespace adds its ports, addresses, labels
//     and endpoints; on a conflict (same port number under another name or
//     protocol, another resolution, ...) the older entry's value stays and
//     the conflict is reported;
//   - a newer entry of another namespace cannot share the host, because
//     services are keyed by host name within an instance: its claim on that
//     host is dropped and reported.
func build(cluster string, objs []*object) (sdk.Snapshot, []sdk.Notice) {
	b := &builder{cluster: cluster, hosts: map[string]*hostState{}, workloads: map[string][]*object{}}
	var entries []*object
	for _, o := range objs {
		switch {
		case o.se != nil:
			entries = append(entries, o)
		case o.we != nil:
			b.workloads[o.key.Namespace] = append(b.workloads[o.key.Namespace], o)
		}
		for _, w := range o.warnings {
			b.notice(o, "%s", w)
		}
	}
	// Oldest first; objs' order breaks ties, so the result is deterministic.
	slices.SortStableFunc(entries, func(a, b *object) int { return a.created.Compare(b.created) })
	for _, ws := range b.workloads {
		slices.SortFunc(ws, func(a, b *object) int { return cmp.Compare(a.key.Name, b.key.Name) })
	}
	for _, o := range entries {
		b.addEntry(o)
	}

	snap := sdk.Snapshot{Endpoints: make(map[string][]sdk.Endpoint, len(b.hosts))}
	for _, host := range slices.Sorted(maps.Keys(b.hosts)) {
		h := b.hosts[host]
		b.checkPortCoverage(h)
		slices.SortStableFunc(h.eps, func(x, y sdk.Endpoint) int {
			return cmp.Or(cmp.Compare(x.Address, y.Address), cmp.Compare(x.WorkloadName, y.WorkloadName))
		})
		snap.Services = append(snap.Services, h.svc)
		if len(h.eps) > 0 {
			snap.Endpoints[host] = h.eps
		}
	}
	slices.SortFunc(b.notices, func(x, y sdk.Notice) int {
		return cmp.Or(cmp.Compare(x.Subject, y.Subject), cmp.Compare(x.Message, y.Message))
	})
	return snap, b.notices
}

type builder struct {
	cluster string
	hosts   map[string]*hostState
	// workloads are the WorkloadEntries of each namespace, by name.
	workloads map[string][]*object
	notices   []sdk.Notice
}

// hostState is one service being assembled from the entries that name its
// host.
type hostState struct {
	svc        *sdk.Service
	owner      *object // the oldest entry
	resolution networking.ServiceEntry_Resolution
	byName     map[string]sdk.Port
	byNumber   map[uint32]sdk.Port
	eps        []sdk.Endpoint
	// from is the entry that listed each endpoint first.
	from []*object
	// index finds the endpoints of an address and workload, to merge the
	// ports of the same workload listed by two entries.
	index map[endpointKey][]int
	// entries counts the entries merged into the host.
	entries int
}

type endpointKey struct{ address, workload string }

// entryPort is a port of an entry with where its endpoints listen.
type entryPort struct {
	sdk.Port
	target uint32 // the entry's targetPort, 0 if unset
}

func (b *builder) notice(o *object, format string, args ...any) {
	b.notices = append(b.notices, sdk.Notice{Subject: o.subject(), Message: fmt.Sprintf(format, args...)})
}

func (b *builder) addEntry(o *object) {
	se := o.se
	ports := make([]entryPort, len(se.GetPorts()))
	for i, p := range se.GetPorts() {
		proto, _ := portProtocol(p.GetProtocol())
		ports[i] = entryPort{Port: sdk.Port{Name: p.GetName(), Number: p.GetNumber(), Protocol: string(proto)}, target: p.GetTargetPort()}
	}
	for _, host := range se.GetHosts() {
		h, ok := b.hosts[host]
		var accepted []entryPort
		switch {
		case !ok:
			h = b.newHost(o, host, ports)
			b.hosts[host] = h
			accepted = ports
		case h.owner.key.Namespace != o.key.Namespace:
			b.notice(o, "host %s: already defined in namespace %s by the older %s; a host belongs to one namespace in this registry, so this entry's claim on it is ignored",
				host, h.owner.key.Namespace, h.owner.subject())
			continue
		default:
			if accepted, ok = b.merge(h, o, host, ports); !ok {
				continue
			}
		}
		h.entries++
		if len(accepted) == 0 {
			continue // endpoints serve an entry's ports; it has none here
		}
		for _, ep := range b.endpoints(o, host, accepted) {
			h.addEndpoint(o, ep)
		}
	}
}

func (b *builder) newHost(o *object, host string, ports []entryPort) *hostState {
	se := o.se
	svc := &sdk.Service{
		Hostname:     host,
		Namespace:    o.key.Namespace,
		Name:         o.key.Name,
		Labels:       o.labels,
		Resolution:   resolution(se.GetResolution()),
		MeshExternal: se.GetLocation() == networking.ServiceEntry_MESH_EXTERNAL,
		ExportTo:     se.GetExportTo(),
		// Shared with the object, never modified in place (merge copies).
		SubjectAltNames: se.GetSubjectAltNames(),
	}
	if o.mtlsMode != sdk.MTLSModeUnset {
		svc.MTLSMode, svc.MTLSModeSource = o.mtlsMode, "annotation "+sdk.AnnotationMTLSMode+" of "+o.key.String()
	}
	svc.LocalityFailover = o.localityFailover
	if addrs := vips(se.GetAddresses()); len(addrs) > 0 {
		svc.VIPs = map[string][]string{b.cluster: addrs}
	}
	h := &hostState{svc: svc, owner: o, resolution: se.GetResolution(),
		byName: map[string]sdk.Port{}, byNumber: map[uint32]sdk.Port{}, index: map[endpointKey][]int{}}
	for _, p := range ports {
		svc.Ports = append(svc.Ports, p.Port)
		h.byName[p.Name] = p.Port
		h.byNumber[p.Number] = p.Port
	}
	return h
}

// merge adds a newer entry of the owner's namespace to h. It returns the
// entry's ports that made it into the service, and false if the entry
// cannot be merged at all.
func (b *builder) merge(h *hostState, o *object, host string, ports []entryPort) ([]entryPort, bool) {
	se, svc := o.se, h.svc
	if se.GetResolution() != h.resolution {
		b.notice(o, "host %s: resolution %s conflicts with %s of the older %s; this entry's ports and endpoints for the host are ignored",
			host, se.GetResolution(), h.resolution, h.owner.subject())
		return nil, false
	}
	// svc is this build's own; the maps and slices it took from the owner
	// object are shared with other builds, so they are copied before changing.
	if mext := se.GetLocation() == networking.ServiceEntry_MESH_EXTERNAL; mext != svc.MeshExternal {
		b.notice(o, "host %s: location %s conflicts with the older %s; keeping %s",
			host, se.GetLocation(), h.owner.subject(), h.owner.se.GetLocation())
	}
	if o.mtlsMode != svc.MTLSMode {
		b.notice(o, "host %s: mTLS mode %q (annotation %s) conflicts with %q of the older %s; keeping the older",
			host, o.mtlsMode, sdk.AnnotationMTLSMode, svc.MTLSMode, h.owner.subject())
	}
	if o.localityFailover != svc.LocalityFailover {
		b.notice(o, "host %s: locality failover %s (annotation %s) conflicts with %s of the older %s; keeping the older",
			host, o.localityFailover, sdk.AnnotationLocalityFailover, svc.LocalityFailover, h.owner.subject())
	}
	if !slices.Equal(se.GetExportTo(), svc.ExportTo) {
		b.notice(o, "host %s: exportTo %v conflicts with %v of the older %s; keeping the older",
			host, se.GetExportTo(), svc.ExportTo, h.owner.subject())
	}
	// Newer entries add subject alt names, as they add addresses.
	if sans := se.GetSubjectAltNames(); len(sans) > 0 {
		merged := slices.Clone(svc.SubjectAltNames)
		for _, n := range sans {
			if !slices.Contains(merged, n) {
				merged = append(merged, n)
			}
		}
		svc.SubjectAltNames = merged
	}
	if addrs := vips(se.GetAddresses()); len(addrs) > 0 {
		have := svc.VIPs[b.cluster]
		merged := slices.Clone(have)
		for _, a := range addrs {
			if !slices.Contains(merged, a) {
				merged = append(merged, a)
			}
		}
		if len(merged) != len(have) {
			svc.VIPs = map[string][]string{b.cluster: merged}
		}
	}
	if len(o.labels) > 0 {
		labels := maps.Clone(svc.Labels)
		if labels == nil {
			labels = map[string]string{}
		}
		for _, k := range sortedKeys(o.labels) {
			v := o.labels[k]
			if old, ok := labels[k]; ok && old != v {
				b.notice(o, "host %s: label %s=%q conflicts with %q of the older %s; keeping the older", host, k, v, old, h.owner.subject())
				continue
			}
			labels[k] = v
		}
		svc.Labels = labels
	}
	var accepted []entryPort
	for _, p := range ports {
		byNum, numOK := h.byNumber[p.Number]
		byName, nameOK := h.byName[p.Name]
		switch {
		case numOK && byNum == p.Port:
			accepted = append(accepted, p)
		case numOK:
			b.notice(o, "host %s: port %d is declared as %s/%s by the older %s; this entry's %s/%s is ignored",
				host, p.Number, byNum.Name, byNum.Protocol, h.owner.subject(), p.Name, p.Protocol)
		case nameOK:
			b.notice(o, "host %s: port name %q is used for port %d by the older %s; this entry's port %d is ignored",
				host, p.Name, byName.Number, h.owner.subject(), p.Number)
		default:
			svc.Ports = append(slices.Clip(svc.Ports), p.Port)
			h.byName[p.Name] = p.Port
			h.byNumber[p.Number] = p.Port
			accepted = append(accepted, p)
		}
	}
	return accepted, true
}

// endpoints lists what serves host for entry o on the given ports: its
// inline endpoints, the WorkloadEntries it selects, or, for DNS resolution
// without either, the host itself.
func (b *builder) endpoints(o *object, host string, ports []entryPort) []sdk.Endpoint {
	se := o.se
	// Where a workload without its own port mapping listens. The map is
	// shared by those endpoints (and never modified).
	defaults := make(map[string]uint32, len(ports))
	for _, p := range ports {
		defaults[p.Name] = cmp.Or(p.target, p.Number)
	}
	switch {
	case se.GetWorkloadSelector() != nil:
		var out []sdk.Endpoint
		for _, w := range b.workloads[o.key.Namespace] {
			if !selects(se.GetWorkloadSelector().GetLabels(), w.we.GetLabels()) {
				continue
			}
			if err := addressFits(w.we.GetAddress(), se.GetResolution(), len(ports)); err != nil {
				b.notice(w, "selected by %s for host %s, but not used: %v", o.key, host, err)
				continue
			}
			ep := endpoint(w.we, w.key.Name, ports, defaults)
			if w.unhealthy {
				ep.Health = sdk.HealthUnhealthy
			}
			out = append(out, ep)
		}
		return out
	case len(se.GetEndpoints()) > 0:
		out := make([]sdk.Endpoint, len(se.GetEndpoints()))
		for i, we := range se.GetEndpoints() {
			out[i] = endpoint(we, "", ports, defaults)
		}
		return out
	case isDNS(se.GetResolution()):
		return []sdk.Endpoint{{Address: host, TargetPorts: defaults}}
	}
	return nil
}

// endpoint converts one workload (inline or a WorkloadEntry) serving ports.
// Where it listens: its own port mapping, else the entry's targetPort, else
// the port number (defaults holds the latter two).
func endpoint(we *networking.WorkloadEntry, name string, ports []entryPort, defaults map[string]uint32) sdk.Endpoint {
	ep := sdk.Endpoint{
		Address:        we.GetAddress(),
		Labels:         we.GetLabels(),
		Network:        cmp.Or(we.GetNetwork(), we.GetLabels()[istio.LabelNetwork]),
		Weight:         we.GetWeight(),
		ServiceAccount: we.GetServiceAccount(),
		WorkloadName:   name,
		TargetPorts:    defaults,
	}
	switch loc := we.GetLocality(); {
	case loc != "":
		ep.Locality = sdk.ParseLocality(loc)
	case we.GetLabels()[istio.LabelLocality] != "":
		ep.Locality = sdk.ParseLocality(strings.ReplaceAll(we.GetLabels()[istio.LabelLocality], ".", "/"))
	}
	// Istio: the label decides; without it, a service account means the
	// workload runs a sidecar that speaks Istio mTLS.
	if mode, ok := we.GetLabels()[istio.LabelTLSMode]; ok {
		if mode == istio.TLSModeIstio {
			ep.TLSMode = sdk.TLSModeIstio
		}
	} else if we.GetServiceAccount() != "" {
		ep.TLSMode = sdk.TLSModeIstio
	}
	if strings.HasPrefix(ep.Address, unixPrefix) {
		ep.TargetPorts = nil // a socket has no port
		return ep
	}
	var own map[string]uint32
	for _, p := range ports {
		if n := we.GetPorts()[p.Name]; n > 0 && n != defaults[p.Name] {
			if own == nil {
				own = maps.Clone(defaults)
			}
			own[p.Name] = n
		}
	}
	if own != nil {
		ep.TargetPorts = own
	}
	return ep
}

// addEndpoint adds ep, folding it into an endpoint of another entry with
// the same address and workload that differs only in ports it does not map
// differently (the same workload listed by two entries of the host, for
// different ports). Two processes on one address, listening on different
// ports for the same service port, stay two endpoints; so do the endpoints
// one entry lists twice.
func (h *hostState) addEndpoint(from *object, ep sdk.Endpoint) {
	k := endpointKey{ep.Address, ep.WorkloadName}
	for _, i := range h.index[k] {
		old := &h.eps[i]
		cp := *old
		cp.TargetPorts = ep.TargetPorts
		if h.from[i] == from || !cp.Equal(&ep) || !compatiblePorts(old.TargetPorts, ep.TargetPorts) {
			continue
		}
		if len(ep.TargetPorts) > len(old.TargetPorts) || !maps.Equal(old.TargetPorts, ep.TargetPorts) {
			// Both maps may be shared: merge into a new one.
			ports := maps.Clone(old.TargetPorts)
			if ports == nil {
				ports = map[string]uint32{}
			}
			maps.Copy(ports, ep.TargetPorts)
			old.TargetPorts = ports
		}
		return
	}
	h.index[k] = append(h.index[k], len(h.eps))
	h.eps = append(h.eps, ep)
	h.from = append(h.from, from)
}

// compatiblePorts reports whether two port mappings agree on every port
// they both map.
func compatiblePorts(a, b map[string]uint32) bool {
	for name, n := range a {
		if m, ok := b[name]; ok && m != n {
			return false
		}
	}
	return true
}

// checkPortCoverage reports endpoints that the merged service would send
// traffic for ports their entry never declared: the registry model has no
// per-port endpoints, so they receive it. Unix sockets serve every port.
func (b *builder) checkPortCoverage(h *hostState) {
	if h.entries < 2 {
		return
	}
	missing := map[*object][]string{}
	var order []*object
	for i := range h.eps {
		ep, from := &h.eps[i], h.from[i]
		if ep.TargetPorts == nil {
			continue
		}
		for _, p := range h.svc.Ports {
			if _, ok := ep.TargetPorts[p.Name]; ok {
				continue
			}
			name := fmt.Sprintf("%s (%d)", p.Name, p.Number)
			if _, seen := missing[from]; !seen {
				order = append(order, from)
			}
			if !slices.Contains(missing[from], name) {
				missing[from] = append(missing[from], name)
			}
		}
	}
	for _, o := range order {
		b.notice(o, "host %s: the merged service also has %s, which this entry does not declare; its endpoints will receive that traffic too",
			h.svc.Hostname, plural(missing[o], "port"))
	}
}

// plural renders "port a" or "ports a, b".
func plural(items []string, noun string) string {
	if len(items) == 1 {
		return noun + " " + items[0]
	}
	return noun + "s " + strings.Join(items, ", ")
}

// selects reports whether workload labels match every selector label.
func selects(selector, labels map[string]string) bool {
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// vips normalises an entry's addresses: IPs and CIDRs, with /32 (/128)
// written as a plain IP, as Istio does.
func vips(addrs []string) []string {
	out := make([]string, 0, len(addrs))
	for _, a := range addrs {
		if ip, err := netip.ParseAddr(a); err == nil {
			out = append(out, ip.String())
		} else if pfx, err := netip.ParsePrefix(a); err == nil {
			if pfx.IsSingleIP() {
				out = append(out, pfx.Addr().String())
			} else {
				out = append(out, pfx.Masked().String())
			}
		}
	}
	return out
}

func resolution(r networking.ServiceEntry_Resolution) sdk.Resolution {
	switch r {
	case networking.ServiceEntry_STATIC:
		return sdk.ResolutionStatic
	case networking.ServiceEntry_DNS:
		return sdk.ResolutionDNS
	case networking.ServiceEntry_DNS_ROUND_ROBIN:
		return sdk.ResolutionDNSRoundRobin
	}
	return sdk.ResolutionPassthrough
}
