package xds

import (
	"github.com/estuary-mesh/estuary/host/model"
	"slices"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

func TestParseNode(t *testing.T) {
	md := func(m map[string]any) *structpb.Struct {
		s, err := structpb.NewStruct(m)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	tests := []struct {
		name string
		node *corev3.Node
		want model.Node
		view model.View
	}{
		{
			name: "istio sidecar",
			node: &corev3.Node{Id: "sidecar~10.1.2.3~reviews-v1-abc.bookinfo~bookinfo.svc.cluster.local", Metadata: md(map[string]any{
				"NETWORK": "network1", "CLUSTER_ID": "cluster1", "LABELS": map[string]any{"app": "reviews"},
			})},
			want: model.Node{ID: "sidecar~10.1.2.3~reviews-v1-abc.bookinfo~bookinfo.svc.cluster.local", Kind: model.KindEnvoy, Network: "network1",
				ClusterID: "cluster1", Namespace: "bookinfo"},
			view: model.View{Kind: model.KindEnvoy, Network: "network1", Cluster: "cluster1"},
		},
		{
			name: "east-west gateway with a requested network view",
			node: &corev3.Node{Id: "router~10.0.0.9~istio-eastwestgateway-1.istio-system~istio-system.svc.cluster.local", Metadata: md(map[string]any{
				"NETWORK": "network2", "REQUESTED_NETWORK_VIEW": "network2", "INSTANCE_IPS": "10.0.0.9,fd00::9",
			})},
			want: model.Node{ID: "router~10.0.0.9~istio-eastwestgateway-1.istio-system~istio-system.svc.cluster.local", Kind: model.KindRouter,
				Network: "network2", RequestedNetworks: []string{"network2"}, Namespace: "istio-system"},
			view: model.View{Kind: model.KindRouter, Network: "network2", Networks: "network2"},
		},
		{
			name: "proxyless gRPC by generator, several requested networks as a list",
			node: &corev3.Node{Id: "client-1", Metadata: md(map[string]any{
				"GENERATOR": "grpc", "NAMESPACE": "default", "REQUESTED_NETWORK_VIEW": []any{"n2", "n1", "n2"},
			})},
			want: model.Node{ID: "client-1", Kind: model.KindProxyless, RequestedNetworks: []string{"n1", "n2"}, Namespace: "default"},
			view: model.View{Kind: model.KindProxyless, Networks: "n1,n2"},
		},
		{
			name: "proxyless gRPC by user agent, no metadata",
			node: &corev3.Node{Id: "grpc-client", UserAgentName: "gRPC Go"},
			want: model.Node{ID: "grpc-client", Kind: model.KindProxyless},
			view: model.View{Kind: model.KindProxyless},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ParseNode(tt.node)
			if got.ID != tt.want.ID || got.Kind != tt.want.Kind || got.Network != tt.want.Network || got.ClusterID != tt.want.ClusterID ||
				got.Namespace != tt.want.Namespace || !slices.Equal(got.RequestedNetworks, tt.want.RequestedNetworks) {
				t.Errorf("ParseNode = %+v, want %+v", got, tt.want)
			}
			if v := got.View(); v != tt.view {
				t.Errorf("model.View = %+v, want %+v", v, tt.view)
			}
		})
	}
}

// TestLocalityViews: a node's locality reaches its view only with
// LocalityViews on, so a mesh without locality failover keeps exactly the
// views it had; nodes of one locality share a view; an east-west gateway
// never gets one.
func TestLocalityViews(t *testing.T) {
	node := func(kind, zone string) *corev3.Node {
		id := kind + "~10.0.0.1~a.default~default.svc.cluster.local"
		return &corev3.Node{Id: id, Locality: &corev3.Locality{Region: "us-east1", Zone: zone}}
	}
	off, on := &Cache{}, &Cache{localityViews: true}
	view := func(c *Cache, n *corev3.Node) model.View {
		p := ParseNode(n)
		return c.viewOf(&p)
	}
	if p := ParseNode(node("sidecar", "b")); p.Locality != "us-east1/b" {
		t.Errorf("node locality %q, want us-east1/b", p.Locality)
	}
	if a, b := view(off, node("sidecar", "a")), view(off, node("sidecar", "b")); a != b || a.Locality != "" {
		t.Errorf("locality views off: zones a and b get %s and %s, want one view without locality", a, b)
	}
	if a, b := view(on, node("sidecar", "a")), view(on, node("sidecar", "b")); a == b || a.Locality != "us-east1/a" {
		t.Errorf("locality views on: zones a and b get %s and %s, want two", a, b)
	}
	if a, b := view(on, node("sidecar", "a")), view(on, &corev3.Node{Id: "sidecar~10.0.0.2~b.default~default.svc.cluster.local", Locality: &corev3.Locality{Region: "us-east1", Zone: "a"}}); a != b {
		t.Errorf("two nodes of one locality get %s and %s, want one view", a, b)
	}
	if v := view(on, node("router", "a")); v.Locality != "" {
		t.Errorf("east-west gateway view %s carries a locality", v)
	}
}
