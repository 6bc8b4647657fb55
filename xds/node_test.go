package xds

import (
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
		want Node
		view View
	}{
		{
			name: "istio sidecar",
			node: &corev3.Node{Id: "sidecar~10.1.2.3~reviews-v1-abc.bookinfo~bookinfo.svc.cluster.local", Metadata: md(map[string]any{
				"NETWORK": "network1", "CLUSTER_ID": "cluster1", "LABELS": map[string]any{"app": "reviews"},
			})},
			want: Node{ID: "sidecar~10.1.2.3~reviews-v1-abc.bookinfo~bookinfo.svc.cluster.local", Kind: KindEnvoy, Network: "network1",
				ClusterID: "cluster1", Labels: map[string]string{"app": "reviews"}, Namespace: "bookinfo", IPs: []string{"10.1.2.3"}},
			view: View{Kind: KindEnvoy, Network: "network1", Cluster: "cluster1"},
		},
		{
			name: "east-west gateway with a requested network view",
			node: &corev3.Node{Id: "router~10.0.0.9~istio-eastwestgateway-1.istio-system~istio-system.svc.cluster.local", Metadata: md(map[string]any{
				"NETWORK": "network2", "REQUESTED_NETWORK_VIEW": "network2", "INSTANCE_IPS": "10.0.0.9,fd00::9",
			})},
			want: Node{ID: "router~10.0.0.9~istio-eastwestgateway-1.istio-system~istio-system.svc.cluster.local", Kind: KindRouter,
				Network: "network2", RequestedNetworks: []string{"network2"}, Namespace: "istio-system", IPs: []string{"10.0.0.9", "fd00::9"}},
			view: View{Kind: KindRouter, Network: "network2", Networks: "network2"},
		},
		{
			name: "proxyless gRPC by generator, several requested networks as a list",
			node: &corev3.Node{Id: "client-1", Metadata: md(map[string]any{
				"GENERATOR": "grpc", "NAMESPACE": "default", "REQUESTED_NETWORK_VIEW": []any{"n2", "n1", "n2"},
			})},
			want: Node{ID: "client-1", Kind: KindProxyless, Namespace: "default", RequestedNetworks: []string{"n1", "n2"}},
			view: View{Kind: KindProxyless, Networks: "n1,n2"},
		},
		{
			name: "proxyless gRPC by user agent, no metadata",
			node: &corev3.Node{Id: "grpc-client", UserAgentName: "gRPC Go"},
			want: Node{ID: "grpc-client", Kind: KindProxyless},
			view: View{Kind: KindProxyless},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ParseNode(tt.node)
			if got.ID != tt.want.ID || got.Kind != tt.want.Kind || got.Network != tt.want.Network || got.ClusterID != tt.want.ClusterID ||
				got.Namespace != tt.want.Namespace || !slices.Equal(got.RequestedNetworks, tt.want.RequestedNetworks) ||
				!slices.Equal(got.IPs, tt.want.IPs) || len(got.Labels) != len(tt.want.Labels) {
				t.Errorf("ParseNode = %+v, want %+v", got, tt.want)
			}
			for k, v := range tt.want.Labels {
				if got.Labels[k] != v {
					t.Errorf("label %s = %q, want %q", k, got.Labels[k], v)
				}
			}
			if v := got.View(); v != tt.view {
				t.Errorf("View = %+v, want %+v", v, tt.view)
			}
		})
	}
}

func TestViewSees(t *testing.T) {
	all := View{}
	if !all.Sees("n1") || !all.Sees("") {
		t.Errorf("a view without REQUESTED_NETWORK_VIEW must see every network")
	}
	v := View{Networks: "n1,n3"}
	for net, want := range map[string]bool{"n1": true, "n3": true, "n2": false, "": true} {
		if v.Sees(net) != want {
			t.Errorf("Sees(%q) = %v, want %v", net, !want, want)
		}
	}
}
