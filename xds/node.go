// Package xds serves the aggregate registry over xDS (ADS, State of the
// World and Delta) with go-control-plane.
//
// What a node receives depends only on its view: its kind (proxyless gRPC,
// Envoy sidecar, or east-west gateway), its network, the networks it asked
// to see, and its cluster. Nodes are grouped by view and every resource is
// built once per view, stored marshaled, and shared by all nodes of the
// view. Watches are indexed by resource name, so a change to one service
// reaches only the clients that watch it.
//
// The xDS path reads the host's in-memory replica through host/aggregate.
// It never calls a plugin.
package xds

import (
	"slices"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// Kind is what kind of client a node is.
type Kind uint8

const (
	// KindProxyless is a gRPC client using grpc-go's xDS support.
	KindProxyless Kind = iota
	// KindEnvoy is an Envoy sidecar.
	KindEnvoy
	// KindRouter is an Envoy east-west gateway (Istio node type "router").
	KindRouter
)

func (k Kind) String() string {
	switch k {
	case KindEnvoy:
		return "envoy"
	case KindRouter:
		return "router"
	}
	return "proxyless"
}

// Node is a connected client as its node id and metadata describe it.
type Node struct {
	ID        string
	Kind      Kind
	Network   string
	ClusterID string
	// RequestedNetworks is REQUESTED_NETWORK_VIEW: when set, the node sees
	// only endpoints on these networks (and those whose network is unknown).
	RequestedNetworks []string
	Labels            map[string]string
	Namespace         string
	IPs               []string
}

// View is what a node's configuration depends on. Nodes with equal views
// receive identical resources.
type View struct {
	Kind    Kind
	Network string
	// Networks is the sorted, comma-joined REQUESTED_NETWORK_VIEW; empty
	// means every network.
	Networks string
	Cluster  string
}

func (v View) String() string {
	var b strings.Builder
	b.WriteString(v.Kind.String())
	b.WriteString("/network=")
	b.WriteString(v.Network)
	if v.Networks != "" {
		b.WriteString("/sees=")
		b.WriteString(v.Networks)
	}
	if v.Cluster != "" {
		b.WriteString("/cluster=")
		b.WriteString(v.Cluster)
	}
	return b.String()
}

// Sees reports whether the view includes endpoints on network. Endpoints
// whose network is unknown are always seen.
func (v View) Sees(network string) bool {
	if v.Networks == "" || network == "" {
		return true
	}
	for n := range strings.SplitSeq(v.Networks, ",") {
		if n == network {
			return true
		}
	}
	return false
}

// View returns the node's view.
func (n *Node) View() View {
	return View{Kind: n.Kind, Network: n.Network, Networks: strings.Join(n.RequestedNetworks, ","), Cluster: n.ClusterID}
}

// Metadata keys Istio proxies send, which Estuary reads the same way.
const (
	metaNetwork        = "NETWORK"
	metaClusterID      = "CLUSTER_ID"
	metaRequestedViews = "REQUESTED_NETWORK_VIEW"
	metaLabels         = "LABELS"
	metaNamespace      = "NAMESPACE"
	metaInstanceIPs    = "INSTANCE_IPS"
	metaGenerator      = "GENERATOR"
)

// ParseNode reads a node's id and metadata. Istio node ids look like
// "TYPE~IP~POD.NAMESPACE~NAMESPACE.svc.DOMAIN" with TYPE sidecar or
// router; proxyless gRPC clients announce themselves with GENERATOR=grpc or
// a gRPC user agent.
func ParseNode(n *corev3.Node) Node {
	out := Node{ID: n.GetId(), Kind: KindEnvoy}
	md := n.GetMetadata().GetFields()
	str := func(k string) string { return md[k].GetStringValue() }
	out.Network = str(metaNetwork)
	out.ClusterID = str(metaClusterID)
	out.Namespace = str(metaNamespace)
	out.RequestedNetworks = splitList(md[metaRequestedViews])
	out.IPs = splitList(md[metaInstanceIPs])
	if l := md[metaLabels].GetStructValue(); l != nil {
		out.Labels = map[string]string{}
		for k, v := range l.GetFields() {
			out.Labels[k] = v.GetStringValue()
		}
	}
	parts := strings.Split(out.ID, "~")
	switch {
	case len(parts) > 0 && parts[0] == "router":
		out.Kind = KindRouter
	case str(metaGenerator) == "grpc" || strings.HasPrefix(n.GetUserAgentName(), "gRPC"):
		out.Kind = KindProxyless
	}
	if len(out.IPs) == 0 && len(parts) == 4 && parts[1] != "" {
		out.IPs = []string{parts[1]}
	}
	if out.Namespace == "" && len(parts) == 4 {
		if _, ns, ok := strings.Cut(parts[2], "."); ok {
			out.Namespace = ns
		}
	}
	return out
}

// splitList accepts a comma-separated string or a list value.
func splitList(v *structpb.Value) []string {
	if v == nil {
		return nil
	}
	var out []string
	if l := v.GetListValue(); l != nil {
		for _, x := range l.GetValues() {
			if s := strings.TrimSpace(x.GetStringValue()); s != "" {
				out = append(out, s)
			}
		}
	} else {
		for s := range strings.SplitSeq(v.GetStringValue(), ",") {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
