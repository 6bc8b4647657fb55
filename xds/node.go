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
// The package encodes, caches and serves; it decides nothing about
// endpoints. What a view receives for an EDS cluster comes from the
// endpoint pipeline (host/pipeline), and everything else from the
// aggregate registry (host/aggregate), both answered from the host's
// in-memory replica: the xDS path never calls a plugin.
package xds

import (
	"slices"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/sdk"
)

// Metadata keys Istio proxies send, which Estuary reads the same way.
const (
	metaNetwork        = "NETWORK"
	metaClusterID      = "CLUSTER_ID"
	metaRequestedViews = "REQUESTED_NETWORK_VIEW"
	metaGenerator      = "GENERATOR"
	metaNamespace      = "NAMESPACE"
)

// ParseNode reads what decides a node's view from its id and metadata.
// Istio node ids look like "TYPE~IP~POD.NAMESPACE~NAMESPACE.svc.DOMAIN"
// with TYPE sidecar or router; proxyless gRPC clients announce themselves
// with GENERATOR=grpc or a gRPC user agent.
func ParseNode(n *corev3.Node) model.Node {
	out := model.Node{ID: n.GetId(), Kind: model.KindEnvoy}
	md := n.GetMetadata().GetFields()
	str := func(k string) string { return md[k].GetStringValue() }
	out.Network = str(metaNetwork)
	out.ClusterID = str(metaClusterID)
	out.RequestedNetworks = splitList(md[metaRequestedViews])
	out.Namespace = model.NodeNamespace(out.ID, str(metaNamespace))
	// Spelled as endpoints' localities are, so that equal ones compare equal.
	l := n.GetLocality()
	out.Locality = sdk.Locality{Region: l.GetRegion(), Zone: l.GetZone(), Subzone: l.GetSubZone()}.String()
	switch {
	case strings.Split(out.ID, "~")[0] == "router":
		out.Kind = model.KindRouter
	case str(metaGenerator) == "grpc" || strings.HasPrefix(n.GetUserAgentName(), "gRPC"):
		out.Kind = model.KindProxyless
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
