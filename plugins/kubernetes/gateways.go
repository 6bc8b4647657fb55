package kubernetes

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/istio"
)

// Labels and annotations of east-west gateway services.
const (
	// annotationGatewayAddress replaces the discovered addresses: a comma
	// separated list of IPs or host names, each optionally with ":port".
	annotationGatewayAddress = "estuary.io/gateway-address"
)

// gatewayObjects is what gateway discovery reads from a cluster's caches.
type gatewayObjects interface {
	// nodes lists the cluster's nodes.
	nodes() []*corev1.Node
	// endpointNodes names the nodes that run a ready endpoint of svc.
	endpointNodes(svc *corev1.Service) map[string]bool
}

// gateways finds the network gateways among a cluster's services: every
// service labelled topology.istio.io/network=NET is a gateway into NET.
// Each address or node that could have been a gateway but was dropped comes
// back as a notice saying why.
func gateways(cluster string, svcs []*corev1.Service, objs gatewayObjects) ([]sdk.NetworkGateway, []sdk.Notice) {
	var gws []sdk.NetworkGateway
	var notices []sdk.Notice
	for _, svc := range svcs {
		network := svc.Labels[istio.LabelNetwork]
		if network == "" {
			continue
		}
		g := gatewayBuilder{cluster: cluster, network: network, svc: svc, subject: "service " + svc.Namespace + "/" + svc.Name}
		g.build(objs)
		gws = append(gws, g.gws...)
		notices = append(notices, g.notices...)
	}
	return gws, notices
}

type gatewayBuilder struct {
	cluster, network string
	svc              *corev1.Service
	subject          string
	gws              []sdk.NetworkGateway
	notices          []sdk.Notice
}

func (g *gatewayBuilder) notice(format string, args ...any) {
	g.notices = append(g.notices, sdk.Notice{Subject: g.subject, Message: fmt.Sprintf(format, args...)})
}

func (g *gatewayBuilder) add(addr string, port uint32, loc sdk.Locality) {
	gw := sdk.NetworkGateway{Network: g.network, Cluster: g.cluster, Address: addr, Port: port, Locality: loc}
	if !slices.Contains(g.gws, gw) {
		g.gws = append(g.gws, gw)
	}
}

func (g *gatewayBuilder) build(objs gatewayObjects) {
	svc := g.svc
	port := g.port()
	if override, ok := svc.Annotations[annotationGatewayAddress]; ok {
		g.override(override, port)
		return
	}
	for _, a := range externalAddresses(svc) {
		g.add(a, port, sdk.Locality{})
	}
	sel, hasSel := svc.Annotations[istio.AnnotationNodeSelector]
	switch {
	case hasSel && svc.Spec.Type == corev1.ServiceTypeNodePort:
		g.nodeGateways(sel, port, objs)
	case hasSel:
		g.notice("%s ignored: the service's type is %s, not NodePort", istio.AnnotationNodeSelector, svc.Spec.Type)
	}
	if len(g.gws) == 0 {
		switch svc.Spec.Type {
		case corev1.ServiceTypeLoadBalancer:
			g.notice("no gateway address: the LoadBalancer has no ingress yet and the service has no externalIPs")
		case corev1.ServiceTypeNodePort:
			if !hasSel {
				g.notice("no gateway address: a NodePort gateway needs the %s annotation or externalIPs", istio.AnnotationNodeSelector)
			}
		default:
			g.notice("no gateway address: the service is of type %s without externalIPs", svc.Spec.Type)
		}
	}
}

// port is the gateway's port: networking.istio.io/gatewayPort as a label,
// else as an annotation, else 15443.
func (g *gatewayBuilder) port() uint32 {
	v, ok := g.svc.Labels[istio.LabelGatewayPort]
	if !ok {
		v, ok = g.svc.Annotations[istio.LabelGatewayPort]
	}
	if !ok {
		return istio.DefaultGatewayPort
	}
	n, err := strconv.ParseUint(v, 10, 16)
	if err != nil || n == 0 {
		g.notice("%s %q is not a port number; using %d", istio.LabelGatewayPort, v, istio.DefaultGatewayPort)
		return istio.DefaultGatewayPort
	}
	return uint32(n)
}

// override applies estuary.io/gateway-address.
func (g *gatewayBuilder) override(v string, port uint32) {
	for _, item := range strings.Split(v, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		addr, p, err := splitGatewayAddress(item, port)
		if err != nil {
			g.notice("%s: %v", annotationGatewayAddress, err)
			continue
		}
		g.add(addr, p, sdk.Locality{})
	}
	for _, a := range externalAddresses(g.svc) {
		g.notice("address %s dropped: replaced by the %s annotation", a, annotationGatewayAddress)
	}
	if _, ok := g.svc.Annotations[istio.AnnotationNodeSelector]; ok {
		g.notice("%s ignored: replaced by the %s annotation", istio.AnnotationNodeSelector, annotationGatewayAddress)
	}
	if len(g.gws) == 0 {
		g.notice("no gateway address: %s lists none that is valid", annotationGatewayAddress)
	}
}

// splitGatewayAddress parses "ADDR" or "ADDR:PORT" ("[IPv6]:PORT").
func splitGatewayAddress(s string, defPort uint32) (string, uint32, error) {
	if ip, err := netip.ParseAddr(s); err == nil {
		return ip.String(), defPort, nil
	}
	host, port := s, defPort
	if h, p, err := net.SplitHostPort(s); err == nil {
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil || n == 0 {
			return "", 0, fmt.Errorf("%q: port %q is not a port number", s, p)
		}
		host, port = h, uint32(n)
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return host, port, nil
	}
	if errs := validation.IsDNS1123Subdomain(strings.ToLower(host)); len(errs) > 0 {
		return "", 0, fmt.Errorf("%q is neither an IP address nor a host name", s)
	}
	return host, port, nil
}

// nodeGateways adds the ExternalIPs of the nodes a NodePort gateway's
// selector matches, at the node port of the gateway port. With
// externalTrafficPolicy Local a node without a ready gateway endpoint drops
// the traffic, so only nodes running one are used.
func (g *gatewayBuilder) nodeGateways(selector string, port uint32, objs gatewayObjects) {
	sel, err := parseNodeSelector(selector)
	if err != nil {
		g.notice("%s: %v", istio.AnnotationNodeSelector, err)
		return
	}
	var nodePort uint32
	for _, p := range g.svc.Spec.Ports {
		if uint32(p.Port) == port && p.NodePort != 0 {
			nodePort = uint32(p.NodePort)
		}
	}
	if nodePort == 0 {
		g.notice("no node gateways: the service has no port %d (%s) with a node port", port, istio.LabelGatewayPort)
		return
	}
	local := g.svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
	var ready map[string]bool
	if local {
		ready = objs.endpointNodes(g.svc)
	}
	nodes := objs.nodes()
	slices.SortFunc(nodes, func(a, b *corev1.Node) int { return strings.Compare(a.Name, b.Name) })
	matched := 0
	for _, n := range nodes {
		if !sel.Matches(labels.Set(n.Labels)) {
			continue
		}
		matched++
		ips := nodeExternalIPs(n)
		switch {
		case len(ips) == 0:
			g.notice("node %s dropped: it has no ExternalIP address", n.Name)
		case local && !ready[n.Name]:
			g.notice("node %s (%s) dropped: externalTrafficPolicy is Local and no ready endpoint of the gateway runs on it",
				n.Name, strings.Join(ips, ", "))
		default:
			for _, ip := range ips {
				g.add(ip, nodePort, nodeLocality(n))
			}
		}
	}
	if matched == 0 {
		g.notice("no node gateways: no node matches %s %s", istio.AnnotationNodeSelector, selector)
	}
}

// parseNodeSelector accepts Istio's form, a JSON map of labels, and a JSON
// metav1.LabelSelector (matchLabels, matchExpressions). An empty selector
// matches every node.
func parseNodeSelector(s string) (labels.Selector, error) {
	var set map[string]string
	if err := json.Unmarshal([]byte(s), &set); err == nil {
		sel, err := labels.ValidatedSelectorFromSet(set)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", s, err)
		}
		return sel, nil
	}
	var ls metav1.LabelSelector
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ls); err != nil {
		return nil, fmt.Errorf("%q is neither a JSON map of labels nor a label selector: %w", s, err)
	}
	sel, err := metav1.LabelSelectorAsSelector(&ls)
	if err != nil {
		return nil, fmt.Errorf("%q: %w", s, err)
	}
	return sel, nil
}

func nodeExternalIPs(n *corev1.Node) []string {
	var out []string
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeExternalIP && a.Address != "" && !slices.Contains(out, a.Address) {
			out = append(out, a.Address)
		}
	}
	return out
}
