// Package model holds the types the host core and the xDS server share:
// who a client is (Node, its View), what a cluster is called, what a
// registry change touched (Change), and the endpoints a view receives
// (LocalityGroup, LbEndpoint).
//
// It sits below both sides and imports neither: the host core decides what
// a view receives in these terms, and xds only encodes and serves them.
package model

import "strings"

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
// Only what decides its view is kept: everything else a node announces is
// either unused or untrusted.
type Node struct {
	ID        string
	Kind      Kind
	Network   string
	ClusterID string
	// RequestedNetworks is REQUESTED_NETWORK_VIEW: when set, the node sees
	// only endpoints on these networks (and those whose network is unknown).
	RequestedNetworks []string
	// Locality is the node's "region/zone/subzone", from the locality of
	// its xDS Node; empty when it announces none.
	Locality string
	// Namespace is the node's namespace (NodeNamespace), which decides
	// the services it sees (host/visibility). It is not part of the view:
	// resources are shared across namespaces, and visibility filters them.
	Namespace string
}

// NodeNamespace is the namespace a node is in, as Istio reads it: the
// NAMESPACE metadata if sent, else the first label of the DNS domain of
// an id TYPE~IP~POD.NAMESPACE~NAMESPACE.svc.DOMAIN. Empty when neither
// names one.
func NodeNamespace(id, metadata string) string {
	if metadata != "" {
		return metadata
	}
	parts := strings.Split(id, "~")
	if len(parts) != 4 {
		return ""
	}
	if ns, _, dotted := strings.Cut(parts[3], "."); dotted {
		return ns
	}
	return ""
}

// View returns the node's view.
func (n *Node) View() View {
	return View{Kind: n.Kind, Network: n.Network, Networks: strings.Join(n.RequestedNetworks, ","), Cluster: n.ClusterID, Locality: n.Locality}
}

// View is what a node's configuration depends on. Nodes with equal views
// receive identical resources, so everything is built once per view.
type View struct {
	Kind    Kind
	Network string
	// Networks is the sorted, comma-joined REQUESTED_NETWORK_VIEW; empty
	// means every network.
	Networks string
	Cluster  string
	// Locality is the node's "region/zone/subzone" when locality failover
	// is configured (the xDS server leaves it empty otherwise, so views
	// stay as many as before): nodes of one locality share a view, and
	// the endpoint pipeline orders priorities relative to it.
	Locality string
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
	if v.Locality != "" {
		b.WriteString("/locality=")
		b.WriteString(v.Locality)
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
