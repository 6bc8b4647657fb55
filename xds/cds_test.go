package xds

import (
	"github.com/estuary-mesh/estuary/host/model"
	"slices"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
)

// TestClusterKinds: the CDS a view receives per resolution, and subset
// clusters from endpoint versions.
func TestClusterKinds(t *testing.T) {
	f := newFixture(t)
	add := func(host string, res registryv1.Resolution, eps ...*registryv1.Endpoint) {
		f.apply(false, &registryv1.Event{Instance: f.id, Kind: &registryv1.Event_ServiceUpserted{ServiceUpserted: &registryv1.ServiceUpserted{Service: &registryv1.Service{
			Hostname: host, Namespace: "default", Resolution: res, Ports: []*registryv1.Port{{Name: "http", Number: 80, Protocol: "HTTP"}},
		}}}})
		f.endpoints(host, eps)
	}
	add("dns.example.com", registryv1.Resolution_RESOLUTION_DNS, &registryv1.Endpoint{Address: "a.example.com"}, &registryv1.Endpoint{Address: "b.example.com"})
	add("rr.example.com", registryv1.Resolution_RESOLUTION_DNS_ROUND_ROBIN, &registryv1.Endpoint{Address: "c.example.com"})
	add("passthrough.example.com", registryv1.Resolution_RESOLUTION_PASSTHROUGH)
	add("versions.example.com", registryv1.Resolution_RESOLUTION_STATIC,
		&registryv1.Endpoint{Address: "10.0.0.1", Labels: map[string]string{"version": "v1"}},
		&registryv1.Endpoint{Address: "10.0.0.2", Labels: map[string]string{"version": "v2"}})
	gen := NewGenerator(f.agg, nil)

	type want struct {
		kind  clusterv3.Cluster_DiscoveryType
		hosts int // endpoints in the inline load assignment
	}
	tests := []struct {
		view model.Kind
		host string
		want map[string]want
	}{
		{model.KindEnvoy, "dns.example.com", map[string]want{"outbound|80||dns.example.com": {clusterv3.Cluster_STRICT_DNS, 2}}},
		{model.KindProxyless, "dns.example.com", map[string]want{"outbound|80||dns.example.com": {clusterv3.Cluster_LOGICAL_DNS, 1}}},
		{model.KindEnvoy, "rr.example.com", map[string]want{"outbound|80||rr.example.com": {clusterv3.Cluster_LOGICAL_DNS, 1}}},
		{model.KindEnvoy, "passthrough.example.com", map[string]want{"outbound|80||passthrough.example.com": {clusterv3.Cluster_ORIGINAL_DST, 0}}},
		{model.KindProxyless, "passthrough.example.com", map[string]want{}},
		{model.KindProxyless, "versions.example.com", map[string]want{
			"outbound|80||versions.example.com":   {clusterv3.Cluster_EDS, 0},
			"outbound|80|v1|versions.example.com": {clusterv3.Cluster_EDS, 0},
			"outbound|80|v2|versions.example.com": {clusterv3.Cluster_EDS, 0},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.view.String()+"/"+tt.host, func(t *testing.T) {
			got := map[string]want{}
			for _, r := range gen.Clusters(model.View{Kind: tt.view}, f.agg.GetService(tt.host)) {
				var c clusterv3.Cluster
				if err := proto.Unmarshal(r.Any.GetValue(), &c); err != nil {
					t.Fatal(err)
				}
				n := 0
				for _, le := range c.GetLoadAssignment().GetEndpoints() {
					n += len(le.GetLbEndpoints())
				}
				got[c.GetName()] = want{c.GetType(), n}
			}
			if len(got) != len(tt.want) {
				t.Fatalf("clusters = %v, want %v", got, tt.want)
			}
			for name, w := range tt.want {
				if got[name] != w {
					t.Errorf("%s = %+v, want %+v", name, got[name], w)
				}
			}
		})
	}
	// The subset CLA holds only its version's endpoints.
	cla := decodeCLAs(t, []*anypb.Any{gen.CLA(proxylessView, "outbound|80|v2|versions.example.com", nil).Any})["outbound|80|v2|versions.example.com"]
	if got := claAddresses(cla); !slices.Equal(got, []string{"10.0.0.2"}) {
		t.Errorf("subset v2 endpoints = %v", got)
	}
}
