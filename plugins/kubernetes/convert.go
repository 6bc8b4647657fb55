package kubernetes

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/istio"
)

// labelServiceName names an EndpointSlice's service. Istio's labels and
// annotations are in sdk/istio, Kubernetes' topology labels in corev1.
const labelServiceName = discoveryv1.LabelServiceName

// converter turns one cluster's Kubernetes objects into SDK values. It is
// used by one goroutine at a time (the cluster's worker).
type converter struct {
	clusterID    string
	domainSuffix string
	trustDomain  string
	// network is given to endpoints whose pod names none: the system
	// namespace's label, else the configured network.
	network string
	// clusterLocal marks cluster.local services cluster-local
	// (clusterset_only).
	clusterLocal bool
	// identities interns SPIFFE identities, which 100,000 endpoints share
	// among a few hundred service accounts.
	identities map[string]string
}

// hostname is the service's DNS name, NAME.NAMESPACE.svc.DOMAIN_SUFFIX.
func (c *converter) hostname(namespace, name string) string {
	return name + "." + namespace + ".svc." + c.domainSuffix
}

// service converts a Kubernetes Service.
func (c *converter) service(svc *corev1.Service) *sdk.Service {
	out := &sdk.Service{
		Hostname:  c.hostname(svc.Namespace, svc.Name),
		Namespace: svc.Namespace,
		Name:      svc.Name,
		Labels:    svc.Labels,
		ExportTo:  exportTo(svc.Annotations[istio.AnnotationExportTo]),
		// With clusterset_only, cluster.local reaches the client's own
		// cluster only; clusterset.local spans the exporting clusters.
		ClusterLocal: c.clusterLocal,
	}
	if m, err := mtlsMode(svc); err == nil && m != sdk.MTLSModeUnset {
		out.MTLSMode, out.MTLSModeSource = m, "annotation "+sdk.AnnotationMTLSMode
	}
	out.LocalityFailover, _ = localityFailover(svc)
	for _, p := range svc.Spec.Ports {
		if p.Protocol == corev1.ProtocolSCTP {
			continue // no proxy can carry SCTP
		}
		out.Ports = append(out.Ports, sdk.Port{Name: p.Name, Number: uint32(p.Port), Protocol: protocol(p)})
	}
	switch {
	case svc.Spec.Type == corev1.ServiceTypeExternalName:
		out.Resolution = sdk.ResolutionDNS
		out.MeshExternal = true
	case isHeadless(svc):
		out.Resolution = sdk.ResolutionPassthrough
	default:
		if vips := clusterIPs(svc); len(vips) > 0 {
			out.VIPs = map[string][]string{c.clusterID: vips}
		}
	}
	if ext := externalAddresses(svc); len(ext) > 0 {
		out.ExternalAddresses = map[string][]string{c.clusterID: ext}
	}
	if np := nodePorts(svc); len(np) > 0 {
		out.NodePorts = map[string]map[uint32]uint32{c.clusterID: np}
	}
	return out
}

// mtlsMode reads the service's own mTLS mode from its annotation; a
// value that is not a mode is an error, and the service follows the mesh.
func mtlsMode(svc *corev1.Service) (sdk.MTLSMode, error) {
	v, ok := svc.Annotations[sdk.AnnotationMTLSMode]
	if !ok {
		return sdk.MTLSModeUnset, nil
	}
	m, err := sdk.ParseMTLSMode(v)
	if err != nil || m == sdk.MTLSModeUnset {
		return sdk.MTLSModeUnset, fmt.Errorf("annotation %s = %q ignored, the service follows the mesh's mode: want STRICT, PERMISSIVE or DISABLE", sdk.AnnotationMTLSMode, v)
	}
	return m, nil
}

// localityFailover reads the service's own locality failover from its
// annotation; a value that is not "true" or "false" is an error, and the
// service follows the mesh.
func localityFailover(svc *corev1.Service) (sdk.LocalityFailover, error) {
	v, ok := svc.Annotations[sdk.AnnotationLocalityFailover]
	if !ok {
		return sdk.LocalityFailoverMesh, nil
	}
	f, err := sdk.ParseLocalityFailover(v)
	if err != nil {
		return sdk.LocalityFailoverMesh, fmt.Errorf("annotation %s = %q ignored, the service follows the mesh's locality_failover: want \"true\" or \"false\"", sdk.AnnotationLocalityFailover, v)
	}
	return f, nil
}

// annotationErr is what is wrong with the service's Estuary annotations,
// nil when nothing is: the Service's notice.
func annotationErr(svc *corev1.Service) error {
	_, merr := mtlsMode(svc)
	_, lerr := localityFailover(svc)
	return errors.Join(merr, lerr)
}

func isHeadless(svc *corev1.Service) bool {
	return svc.Spec.ClusterIP == corev1.ClusterIPNone
}

func clusterIPs(svc *corev1.Service) []string {
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	var out []string
	for _, ip := range ips {
		if ip != "" && ip != corev1.ClusterIPNone {
			out = append(out, ip)
		}
	}
	return out
}

// externalAddresses are spec.externalIPs, then LoadBalancer ingress IPs or
// hostnames (kept unresolved), without repeats.
func externalAddresses(svc *corev1.Service) []string {
	var out []string
	add := func(a string) {
		if a != "" && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	for _, ip := range svc.Spec.ExternalIPs {
		add(ip)
	}
	if svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
		for _, in := range svc.Status.LoadBalancer.Ingress {
			add(cmp.Or(in.IP, in.Hostname))
		}
	}
	return out
}

func nodePorts(svc *corev1.Service) map[uint32]uint32 {
	if svc.Spec.Type != corev1.ServiceTypeNodePort && svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
		return nil
	}
	var out map[uint32]uint32
	for _, p := range svc.Spec.Ports {
		if p.NodePort == 0 {
			continue
		}
		if out == nil {
			out = map[uint32]uint32{}
		}
		out[uint32(p.Port)] = uint32(p.NodePort)
	}
	return out
}

// exportTo parses networking.istio.io/exportTo: namespaces separated by
// commas, "*" for all, "." for the service's own.
func exportTo(v string) []string {
	if v == "" {
		return nil
	}
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// protocol is Istio's choice of a service port's protocol
// (kube.ConvertProtocol: UDP ports, appProtocol, the port name's prefix,
// well-known ports); a port Istio would sniff is reported as TCP.
func protocol(p corev1.ServicePort) string {
	return string(istio.ServicePort{Name: p.Name, Number: uint32(p.Port), Transport: string(p.Protocol), AppProtocol: p.AppProtocol}.Protocol().OrTCP())
}

// objects is what endpoint conversion reads from a cluster's caches.
type objects interface {
	pod(namespace, name string) *podInfo
	node(name string) *corev1.Node
}

// externalNameEndpoints is the one endpoint of an ExternalName service: the
// external name itself, resolved by DNS.
func (c *converter) externalNameEndpoints(svc *corev1.Service) []sdk.Endpoint {
	if svc.Spec.ExternalName == "" {
		return nil
	}
	return []sdk.Endpoint{{Address: svc.Spec.ExternalName, Network: c.network}}
}

// endpoints builds a service's endpoints from its EndpointSlices: the ready
// endpoints and the draining ones (all of them if the service publishes
// not-ready addresses; see endpointHealth), one
// per address, with the service port names mapped to the slice's ports,
// sorted by address.
// An address listed by several slices (for example while the EndpointSlice
// controller moves it) appears once, with the ports of all. So does a pod
// listed by several slices with different addresses: a dual-stack pod is
// in an IPv4 and an IPv6 slice (one per address family, both naming it in
// targetRef). It is one endpoint, counted once in load balancing: its
// address is the one of the service's primary family (spec.ipFamilies[0])
// and the others are AdditionalAddresses.
func (c *converter) endpoints(svc *corev1.Service, epSlices []*discoveryv1.EndpointSlice, objs objects) []sdk.Endpoint {
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		return c.externalNameEndpoints(svc)
	}
	n := 0
	for _, s := range epSlices {
		n += len(s.Endpoints)
	}
	out := make([]sdk.Endpoint, 0, n)
	var seen map[workloadKey]int // -> index in out, only with several slices
	if len(epSlices) > 1 {
		seen = make(map[workloadKey]int, n)
	}
	dual := false
	for _, s := range epSlices {
		if s.AddressType != discoveryv1.AddressTypeIPv4 && s.AddressType != discoveryv1.AddressTypeIPv6 {
			continue
		}
		ports := targetPorts(svc, s) // shared by the slice's endpoints; never modified
		for i := range s.Endpoints {
			e := &s.Endpoints[i]
			health, ok := endpointHealth(e, svc.Spec.PublishNotReadyAddresses)
			if len(e.Addresses) == 0 || !ok {
				continue
			}
			addr := e.Addresses[0] // the others are the same endpoint
			if seen != nil {
				// By address too: two pods never share one, so an address
				// already seen is that endpoint, whatever its targetRef.
				key, byAddr := workloadOf(svc.Namespace, e), workloadKey{addr: addr}
				j, dup := seen[byAddr]
				if !dup && key.pod != "" {
					j, dup = seen[key]
				}
				if dup {
					seen[byAddr] = j
					o := &out[j]
					o.TargetPorts = mergePorts(o.TargetPorts, ports)
					if addr != o.Address && !slices.Contains(o.AdditionalAddresses, addr) {
						o.AdditionalAddresses = append(o.AdditionalAddresses, addr)
						dual = true
					}
					continue
				}
				seen[byAddr] = len(out)
				if key.pod != "" {
					seen[key] = len(out)
				}
			}
			ep := c.endpoint(svc.Namespace, addr, ports, e, objs)
			ep.Health = health
			out = append(out, ep)
		}
	}
	if dual {
		primary := primaryFamily(svc)
		for i := range out {
			if len(out[i].AdditionalAddresses) > 0 {
				choosePrimary(&out[i], primary)
			}
		}
	}
	// By address: the same endpoints give the same slice however the
	// EndpointSlice controller spreads them, so State sees no change.
	slices.SortFunc(out, func(a, b sdk.Endpoint) int { return strings.Compare(a.Address, b.Address) })
	return out
}

// workloadKey identifies what slice endpoints stand for: a pod, by
// namespace and name, or an address.
type workloadKey struct{ namespace, pod, addr string }

// workloadOf is the pod a slice endpoint's targetRef names; a key with no
// pod, never stored, if it names none.
func workloadOf(namespace string, e *discoveryv1.Endpoint) workloadKey {
	if ref := e.TargetRef; ref != nil && ref.Kind == "Pod" && ref.Name != "" {
		return workloadKey{namespace: cmp.Or(ref.Namespace, namespace), pod: ref.Name}
	}
	return workloadKey{}
}

// primaryFamily is the service's first IP family, IPv4 if it names none.
func primaryFamily(svc *corev1.Service) corev1.IPFamily {
	if len(svc.Spec.IPFamilies) > 0 {
		return svc.Spec.IPFamilies[0]
	}
	return corev1.IPv4Protocol
}

// choosePrimary makes the endpoint's address one of the primary family,
// if it has one, and sorts the others: whichever slice the pod was seen in
// first, the endpoint comes out the same.
func choosePrimary(ep *sdk.Endpoint, primary corev1.IPFamily) {
	all := append([]string{ep.Address}, ep.AdditionalAddresses...)
	slices.Sort(all)
	i := slices.IndexFunc(all, func(a string) bool { return family(a) == primary })
	if i < 0 {
		i = 0
	}
	ep.Address = all[i]
	ep.AdditionalAddresses = slices.Delete(all, i, i+1)
}

func family(addr string) corev1.IPFamily {
	if ip, err := netip.ParseAddr(addr); err == nil && ip.Is6() && !ip.Is4In6() {
		return corev1.IPv6Protocol
	}
	return corev1.IPv4Protocol
}

// endpointHealth says whether an endpoint is sent, and with which health.
// A ready endpoint is HEALTHY. One the EndpointSlice controller marks
// serving and terminating (ready false: its pod is shutting down but still
// passes readiness) is DRAINING: Envoy keeps its connections and requests
// in flight but picks it for no new one, which is what the pod's grace
// period is for. Any other not-ready endpoint, terminating or not, leaves,
// unless the service publishes not-ready addresses: then it stays
// HEALTHY, as before, or DRAINING if it is terminating and serving.
//
// Serving and terminating follow the API's conventions for unset
// conditions: unset serving means the same as ready, unset terminating
// means not terminating.
func endpointHealth(e *discoveryv1.Endpoint, publishNotReady bool) (sdk.Health, bool) {
	if isReady(e) {
		return sdk.HealthHealthy, true
	}
	serving := e.Conditions.Serving != nil && *e.Conditions.Serving
	terminating := e.Conditions.Terminating != nil && *e.Conditions.Terminating
	if serving && terminating {
		return sdk.HealthDraining, true
	}
	return sdk.HealthHealthy, publishNotReady
}

func isReady(e *discoveryv1.Endpoint) bool {
	// Unset means ready (API convention for EndpointConditions.Ready).
	return e.Conditions.Ready == nil || *e.Conditions.Ready
}

func (c *converter) endpoint(namespace, addr string, ports map[string]uint32, e *discoveryv1.Endpoint, objs objects) sdk.Endpoint {
	ep := sdk.Endpoint{Address: addr, TargetPorts: ports, Network: c.network}
	var pod *podInfo
	if ref := e.TargetRef; ref != nil && ref.Kind == "Pod" {
		pod = objs.pod(cmp.Or(ref.Namespace, namespace), ref.Name)
		ep.WorkloadName = ref.Name
	}
	nodeName := ""
	if e.NodeName != nil {
		nodeName = *e.NodeName
	}
	if pod != nil {
		ep.Labels = pod.Labels // shared with the cache, never modified
		if n := pod.Labels[istio.LabelNetwork]; n != "" {
			ep.Network = n
		}
		if pod.Labels[istio.LabelTLSMode] == istio.TLSModeIstio {
			ep.TLSMode = sdk.TLSModeIstio
		}
		ep.ServiceAccount = c.identity(pod.Namespace, pod.ServiceAccount)
		nodeName = cmp.Or(nodeName, pod.NodeName)
	}
	if node := objs.node(nodeName); node != nil {
		ep.Locality = nodeLocality(node)
	} else if e.Zone != nil {
		ep.Locality.Zone = *e.Zone
	}
	return ep
}

// identity is the SPIFFE identity of a service account, as Istio writes it.
func (c *converter) identity(namespace, account string) string {
	if account == "" {
		return ""
	}
	key := namespace + "/" + account
	if id, ok := c.identities[key]; ok {
		return id
	}
	id := "spiffe://" + c.trustDomain + "/ns/" + namespace + "/sa/" + account
	if c.identities == nil {
		c.identities = map[string]string{}
	}
	c.identities[key] = id
	return id
}

func nodeLocality(n *corev1.Node) sdk.Locality {
	return sdk.Locality{Region: n.Labels[corev1.LabelTopologyRegion], Zone: n.Labels[corev1.LabelTopologyZone], Subzone: n.Labels[istio.LabelSubzone]}
}

// targetPorts maps the service's port names to the slice's port numbers.
func targetPorts(svc *corev1.Service, s *discoveryv1.EndpointSlice) map[string]uint32 {
	var out map[string]uint32
	for _, sp := range s.Ports {
		if sp.Port == nil {
			continue
		}
		name := ""
		if sp.Name != nil {
			name = *sp.Name
		}
		if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == name }) {
			continue
		}
		if out == nil {
			out = make(map[string]uint32, len(s.Ports))
		}
		out[name] = uint32(*sp.Port)
	}
	return out
}

func mergePorts(a, b map[string]uint32) map[string]uint32 {
	if len(b) == 0 || maps.Equal(a, b) {
		return a
	}
	out := maps.Clone(a)
	if out == nil {
		out = map[string]uint32{}
	}
	for k, v := range b {
		if _, ok := out[k]; !ok {
			out[k] = v
		}
	}
	return out
}
