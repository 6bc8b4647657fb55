package consul

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/hashicorp/consul/api"

	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/istio"
)

// Meta keys and tags the conversion reads. Service meta and tags are per
// instance in Consul.
const (
	// metaProtocol (service meta, or a "protocol=..." tag) is the protocol of
	// the instance's port. A plain tag naming a protocol ("http") works too.
	metaProtocol = "protocol"
	// metaPortPrefix declares a further named port: port_admin = "9901".
	metaPortPrefix = "port_"
	// metaProtocolPrefix gives a named port's protocol: protocol_admin = "http".
	// Without it the port name decides, as in Istio ("http-admin" is HTTP).
	metaProtocolPrefix = "protocol_"
	// metaNetwork (service meta, else node meta) is the endpoint's network.
	metaNetwork = "network"
	// metaZone (node meta) is the endpoint's zone.
	metaZone = "zone"
	// metaTLSMode = "istio" (service meta) marks a workload that accepts
	// Istio mTLS. Consul meta keys allow only letters, digits, "-" and "_",
	// so Istio's label key works as a tag instead:
	// security.istio.io/tlsMode=istio.
	metaTLSMode = "tls_mode"
	// metaNetworkGateway = NET (service meta), or the tag
	// labelNetworkGateway=NET, makes every healthy instance of the service a
	// gateway into network NET.
	metaNetworkGateway  = "network_gateway"
	labelNetworkGateway = "estuary.io/network-gateway"
	// metaGatewayPort (service meta), or the tag
	// networking.istio.io/gatewayPort=N as Istio's label, is the gateway's
	// port.
	metaGatewayPort = "gateway_port"
	// metaMTLSMode (service meta) = STRICT, PERMISSIVE or DISABLE is the
	// service's own workload mTLS mode, over the mesh's. Meta is per
	// instance: the first instance (by node/ID) that sets it decides.
	metaMTLSMode = "mtls_mode"
	// metaLocalityFailover (service meta) = "true" or "false" turns
	// locality failover on or off for the service, over the mesh's
	// locality_failover; the first instance that sets it decides.
	metaLocalityFailover = "locality_failover"

	// taggedVirtual is the tagged address holding a service's virtual IP.
	taggedVirtual = "consul-virtual"
	// taggedWAN is the tagged address other networks reach a gateway on.
	taggedWAN = "wan"

	// maxNoticesPerService bounds the notices one service contributes.
	maxNoticesPerService = 10
)

// convertOptions are the settings the conversion depends on.
type convertOptions struct {
	datacenter string
	// domainSuffix follows the service's name in its hostname: the
	// block's domain_suffix, with the scope's labels outside the default
	// scope (scope.hostSuffix).
	domainSuffix string
	namespace    string // the services' namespace: the Consul namespace
	scope        string // " in namespace team-a" outside the default scope, for notices
	warning      bool   // warning instances are endpoints too
}

// view is one Consul service as Estuary reports it. Everything in it is
// sorted, so two views of the same data are equal.
type view struct {
	// service is nil when Consul lists no instance to report.
	service   *sdk.Service
	endpoints []sdk.Endpoint
	gateways  []sdk.NetworkGateway
	notices   []sdk.Notice
}

func (v *view) equal(o *view) bool {
	if (v.service == nil) != (o.service == nil) || v.service != nil && !v.service.Equal(o.service) {
		return false
	}
	return slices.EqualFunc(v.endpoints, o.endpoints, func(a, b sdk.Endpoint) bool { return a.Equal(&b) }) &&
		slices.Equal(v.gateways, o.gateways) && slices.Equal(v.notices, o.notices)
}

func hostname(name, suffix string) string { return strings.ToLower(name) + "." + suffix }

// portSpec is one port of one instance.
type portSpec struct {
	number   uint32
	protocol string
}

// instance is one Consul service instance, parsed.
type instance struct {
	e      *api.ServiceEntry
	id     string // "node/serviceID", the endpoint's workload name
	status string // Consul's aggregated check status
	labels map[string]string
	ports  map[string]portSpec
}

// convert turns the health entries of one Consul service into a view.
// Instances of every health state decide the ports and the service labels,
// so a service keeps its shape while its instances fail; only the instances
// the health setting admits become endpoints.
func convert(name string, entries []*api.ServiceEntry, o convertOptions) view {
	n := &notices{service: name + o.scope}
	var insts []*instance
	for _, e := range entries {
		// Connect proxies and Consul's own gateways are plumbing, not services.
		if e == nil || e.Service == nil || e.Node == nil || e.Service.Kind != api.ServiceKindTypical {
			continue
		}
		insts = append(insts, parseInstance(e, n))
	}
	if len(insts) == 0 {
		return view{}
	}
	slices.SortFunc(insts, func(a, b *instance) int { return cmp.Compare(a.id, b.id) })

	svc := &sdk.Service{
		Hostname:  hostname(name, o.domainSuffix),
		Namespace: o.namespace,
		Name:      name,
		Ports:     servicePorts(insts, n),
		Labels:    commonLabels(insts),
	}
	svc.MTLSMode = firstMeta(insts, n, metaMTLSMode, "want STRICT, PERMISSIVE or DISABLE", func(v string) (sdk.MTLSMode, bool) {
		m, err := sdk.ParseMTLSMode(v)
		return m, err == nil && m != sdk.MTLSModeUnset
	})
	if svc.MTLSMode != sdk.MTLSModeUnset {
		svc.MTLSModeSource = "service meta " + metaMTLSMode
	}
	svc.LocalityFailover = firstMeta(insts, n, metaLocalityFailover, `want "true" or "false"`, func(v string) (sdk.LocalityFailover, bool) {
		f, err := sdk.ParseLocalityFailover(v)
		return f, err == nil
	})
	for _, in := range insts {
		if vip := in.e.Service.TaggedAddresses[taggedVirtual].Address; vip != "" {
			svc.VIPs = map[string][]string{o.datacenter: {vip}}
			break
		}
	}

	var eps []sdk.Endpoint
	var gws []sdk.NetworkGateway
	dns := false
	for _, in := range insts {
		ep, ok := endpoint(in, svc.Ports, o, n)
		if !ok {
			continue
		}
		if _, err := netip.ParseAddr(ep.Address); err != nil && !strings.HasPrefix(ep.Address, "unix://") {
			dns = true
		}
		eps = append(eps, ep)
		if net := in.value(metaNetworkGateway, labelNetworkGateway); net != "" {
			gws = append(gws, gateway(in, net, ep, o, n))
		}
	}
	if dns {
		// Consul accepts host names as service addresses.
		svc.Resolution = sdk.ResolutionDNS
	}
	slices.SortFunc(eps, func(a, b sdk.Endpoint) int {
		return cmp.Or(cmp.Compare(a.Address, b.Address), cmp.Compare(a.WorkloadName, b.WorkloadName))
	})
	slices.SortFunc(gws, func(a, b sdk.NetworkGateway) int {
		return cmp.Or(cmp.Compare(a.Network, b.Network), cmp.Compare(a.Cluster, b.Cluster),
			cmp.Compare(a.Address, b.Address), cmp.Compare(a.Port, b.Port))
	})
	return view{service: svc, endpoints: eps, gateways: gws, notices: n.list()}
}

// firstMeta is a service-wide setting read from its instances' meta key
// (Consul keeps meta per instance): the first valid value, in instance
// order, else T's zero value (follow the mesh). A value parse refuses
// is a notice saying want; one that disagrees with the value kept is a
// notice naming the instance that decided.
func firstMeta[T interface {
	comparable
	fmt.Stringer
}](insts []*instance, n *notices, key, want string, parse func(string) (T, bool)) T {
	var kept, unset T
	from := ""
	for _, in := range insts {
		v, ok := in.e.Service.Meta[key]
		if !ok {
			continue
		}
		got, valid := parse(v)
		switch {
		case !valid:
			n.add(in.id, fmt.Sprintf("meta %s = %q ignored: %s", key, v, want))
		case kept == unset:
			kept, from = got, in.id
		case got != kept:
			n.add(in.id, fmt.Sprintf("meta %s = %q ignored: instance %s says %s first", key, v, from, kept))
		}
	}
	return kept
}

func parseInstance(e *api.ServiceEntry, n *notices) *instance {
	s := e.Service
	in := &instance{
		e:      e,
		id:     e.Node.Node + "/" + s.ID,
		status: e.Checks.AggregatedStatus(),
		labels: labels(s.Tags, s.Meta),
		ports:  map[string]portSpec{},
	}
	// Named ports: Consul's own multi-port list, then port_<name> meta.
	for _, p := range s.Ports {
		if p.Name == "" || p.Port < 1 || p.Port > 65535 {
			n.add(in.id, fmt.Sprintf("port %q number %d ignored: not between 1 and 65535", p.Name, p.Port))
			continue
		}
		in.ports[p.Name] = portSpec{uint32(p.Port), namedProtocol(p.Name, s.Meta, in.id, n)}
	}
	for _, k := range slices.Sorted(maps.Keys(s.Meta)) {
		name, ok := strings.CutPrefix(k, metaPortPrefix)
		if !ok {
			continue
		}
		num, err := strconv.ParseUint(s.Meta[k], 10, 16)
		if name == "" || err != nil || num == 0 {
			n.add(in.id, fmt.Sprintf("meta %s = %q ignored: want a port name after %q and a number between 1 and 65535", k, s.Meta[k], metaPortPrefix))
			continue
		}
		in.ports[name] = portSpec{uint32(num), namedProtocol(name, s.Meta, in.id, n)}
	}
	// The instance's own port, named after its protocol, unless a named port
	// already stands for it.
	if s.Port > 0 && s.Port <= 65535 {
		proto := mainProtocol(s, in.id, n)
		mainName := strings.ToLower(proto)
		hidden := false
		for pn, p := range in.ports {
			if p.number == uint32(s.Port) {
				hidden = true
			} else if pn == mainName {
				n.add(in.id, fmt.Sprintf("port %s = %d replaces the instance port %d, which would take the same name", pn, p.number, s.Port))
				hidden = true
			}
		}
		if !hidden {
			in.ports[mainName] = portSpec{uint32(s.Port), proto}
		}
	}
	return in
}

// value returns the service meta metaKey, else the label labelKey (from a
// "key=value" tag).
func (in *instance) value(metaKey, labelKey string) string {
	if v := in.e.Service.Meta[metaKey]; v != "" {
		return v
	}
	return in.labels[labelKey]
}

// labels turns tags and meta into labels: "key=value" tags split, plain
// tags become tag=true, and meta wins over a tag with the same key.
func labels(tags []string, meta map[string]string) map[string]string {
	if len(tags)+len(meta) == 0 {
		return nil
	}
	out := make(map[string]string, len(tags)+len(meta))
	for _, t := range tags {
		k, v, ok := strings.Cut(t, "=")
		if !ok {
			v = "true"
		}
		if k != "" {
			out[k] = v
		}
	}
	maps.Copy(out, meta)
	return out
}

// mainProtocol is the protocol of the instance's own port: the protocol
// meta, else a protocol=X tag, else a tag naming a protocol, else TCP.
// Names are read as Istio's protocol.Parse reads them.
func mainProtocol(s *api.AgentService, id string, n *notices) string {
	if v, ok := s.Meta[metaProtocol]; ok {
		return knownProtocol(v, "meta "+metaProtocol, id, n)
	}
	for _, t := range s.Tags {
		if k, v, ok := strings.Cut(t, "="); ok && k == metaProtocol {
			return knownProtocol(v, "tag "+t, id, n)
		}
	}
	for _, t := range s.Tags {
		if p := istio.ParseProtocol(t); p.Known() {
			return string(p)
		}
	}
	return string(istio.TCP)
}

// namedProtocol is the protocol of a named port: its protocol_NAME meta,
// else Istio's port-naming rule ("http-admin" is HTTP), else TCP.
func namedProtocol(name string, meta map[string]string, id string, n *notices) string {
	if v, ok := meta[metaProtocolPrefix+name]; ok {
		return knownProtocol(v, "meta "+metaProtocolPrefix+name, id, n)
	}
	return string(istio.PortNameProtocol(name).OrTCP())
}

func knownProtocol(v, where, id string, n *notices) string {
	if p := istio.ParseProtocol(v); p.Known() {
		return string(p)
	}
	n.add(id, fmt.Sprintf("%s: unknown protocol %q, using TCP (known: %s)", where, v, istio.KnownProtocols()))
	return string(istio.TCP)
}

// servicePorts merges the instances' ports by name. Where instances
// disagree, the number (then the protocol) most of them use wins, ties
// going to the lowest; endpoints keep their own number as a target port.
// Two names on one number would make two listeners collide, so the second
// name is dropped.
func servicePorts(insts []*instance, n *notices) []sdk.Port {
	numbers := map[string]map[uint32]int{}
	protos := map[string]map[string]int{}
	for _, in := range insts {
		for name, p := range in.ports {
			if numbers[name] == nil {
				numbers[name], protos[name] = map[uint32]int{}, map[string]int{}
			}
			numbers[name][p.number]++
			protos[name][p.protocol]++
		}
	}
	var ports []sdk.Port
	byNumber := map[uint32]string{}
	for _, name := range slices.Sorted(maps.Keys(numbers)) {
		num := mostCommon(numbers[name])
		if other, dup := byNumber[num]; dup {
			n.add("", fmt.Sprintf("ports %q and %q both resolve to number %d; %q is dropped", other, name, num, name))
			continue
		}
		byNumber[num] = name
		ports = append(ports, sdk.Port{Name: name, Number: num, Protocol: mostCommon(protos[name])})
	}
	return ports
}

func mostCommon[K cmp.Ordered](counts map[K]int) K {
	var best K
	bestN := 0
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		if counts[k] > bestN {
			best, bestN = k, counts[k]
		}
	}
	return best
}

// commonLabels are the labels every instance carries with the same value:
// the service's own labels, where the endpoints carry their instance's.
func commonLabels(insts []*instance) map[string]string {
	var common map[string]string
	for i, in := range insts {
		if i == 0 {
			common = maps.Clone(in.labels)
			continue
		}
		maps.DeleteFunc(common, func(k, v string) bool {
			w, ok := in.labels[k]
			return !ok || w != v
		})
	}
	if len(common) == 0 {
		return nil
	}
	return common
}

// endpoint converts an instance the health setting admits.
func endpoint(in *instance, ports []sdk.Port, o convertOptions, n *notices) (sdk.Endpoint, bool) {
	s, node := in.e.Service, in.e.Node
	var weight int
	switch in.status {
	case api.HealthPassing:
		weight = s.Weights.Passing
	case api.HealthWarning:
		if !o.warning {
			return sdk.Endpoint{}, false
		}
		// Consul's Weights.Warning = 0 means "send no traffic while warning".
		if weight = s.Weights.Warning; weight <= 0 {
			return sdk.Endpoint{}, false
		}
	default: // critical, maintenance, or a status Consul does not define
		return sdk.Endpoint{}, false
	}
	ep := sdk.Endpoint{
		Address:      cmp.Or(s.Address, node.Address),
		Labels:       in.labels,
		Network:      cmp.Or(s.Meta[metaNetwork], node.Meta[metaNetwork]),
		Locality:     sdk.Locality{Region: o.datacenter, Zone: zone(in.e)},
		WorkloadName: in.id,
	}
	if ep.Address == "" && s.SocketPath != "" {
		ep.Address = "unix://" + s.SocketPath
	}
	if ep.Address == "" {
		n.add(in.id, "instance has no address and its node none either; skipped")
		return sdk.Endpoint{}, false
	}
	if weight > 0 {
		ep.Weight = uint32(min(weight, 1<<31))
	}
	if in.value(metaTLSMode, istio.LabelTLSMode) == istio.TLSModeIstio {
		ep.TLSMode = sdk.TLSModeIstio
	}
	for _, p := range ports {
		ip, ok := in.ports[p.Name]
		switch {
		case !ok:
			n.add(in.id, fmt.Sprintf("instance lacks port %q that other instances declare; clients of that port will reach it on %d", p.Name, p.Number))
		case ip.number != p.Number:
			if ep.TargetPorts == nil {
				ep.TargetPorts = map[string]uint32{}
			}
			ep.TargetPorts[p.Name] = ip.number
		}
	}
	return ep, true
}

// zone is the node meta zone, else Consul's own locality of the service or
// the node.
func zone(e *api.ServiceEntry) string {
	if z := e.Node.Meta[metaZone]; z != "" {
		return z
	}
	if l := e.Service.Locality; l != nil && l.Zone != "" {
		return l.Zone
	}
	if l := e.Node.Locality; l != nil {
		return l.Zone
	}
	return ""
}

// gateway reports a healthy instance of a gateway service. Other networks
// reach it on its WAN tagged address when it has one.
func gateway(in *instance, network string, ep sdk.Endpoint, o convertOptions, n *notices) sdk.NetworkGateway {
	s := in.e.Service
	gw := sdk.NetworkGateway{Network: network, Cluster: o.datacenter, Address: ep.Address, Locality: ep.Locality}
	wan := s.TaggedAddresses[taggedWAN]
	if wan.Address != "" {
		gw.Address = wan.Address
	}
	if v := in.value(metaGatewayPort, istio.LabelGatewayPort); v != "" {
		if p, err := strconv.ParseUint(v, 10, 16); err == nil && p > 0 {
			gw.Port = uint32(p)
			return gw
		}
		n.add(in.id, fmt.Sprintf("gateway port %q (meta %s or tag %s) is not a port number; ignored", v, metaGatewayPort, istio.LabelGatewayPort))
	}
	switch {
	case wan.Port > 0:
		gw.Port = uint32(wan.Port)
	case s.Port > 0:
		gw.Port = uint32(s.Port)
	default:
		gw.Port = istio.DefaultGatewayPort
	}
	return gw
}

// notices collects the problems of one service.
type notices struct {
	service string
	items   []sdk.Notice
}

func (n *notices) add(instanceID, msg string) {
	subject := "service " + n.service
	if instanceID != "" {
		subject += ", instance " + instanceID
	}
	n.items = append(n.items, sdk.Notice{Subject: subject, Message: msg})
}

// list returns the notices in subject order, at most maxNoticesPerService
// of them and a count of the rest, so one broken service cannot crowd out
// the others in the datacenter's health.
func (n *notices) list() []sdk.Notice {
	slices.SortStableFunc(n.items, func(a, b sdk.Notice) int { return cmp.Compare(a.Subject, b.Subject) })
	l := sdk.NoticeList{Max: maxNoticesPerService, Subject: "service " + n.service}
	l.Add(n.items...)
	return l.List()
}
