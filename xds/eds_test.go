package xds

import (
	"fmt"
	"slices"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/google/go-cmp/cmp"

	"github.com/estuary-mesh/estuary/host/meshtest"
	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/host/pipeline"
	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
	"github.com/estuary-mesh/estuary/sdk"
)

// TestEncodeCLAMatchesEnvoyTypes holds the hand-written encoder to envoy's
// generated types: what it writes must decode into exactly the message one
// would build with them.
func TestEncodeCLAMatchesEnvoyTypes(t *testing.T) {
	groups := []model.LocalityGroup{
		{Locality: "us-east1/us-east1-b", Endpoints: []model.LbEndpoint{
			{Address: "10.0.0.1", Port: 8080, Weight: 3, Network: "network1", Cluster: "cluster1", TLSMode: sdk.TLSModeIstio},
			{Address: "10.0.0.2", Port: 9090, Health: sdk.HealthUnhealthy, Cluster: "cluster1"},
			{Address: "10.0.0.3", AdditionalAddresses: []string{"fd00:10:244::3", "192.168.0.3"}, Port: 8080, Cluster: "cluster1"},
		}},
		{Locality: "us-west1/us-west1-a/rack7", Priority: 1, Weight: 70000, Endpoints: []model.LbEndpoint{
			{Address: "2001:db8::1", Port: 443, Weight: 1 << 31, Health: sdk.HealthDraining, Network: "network2"},
		}},
		{Locality: "", Endpoints: []model.LbEndpoint{{Address: "10.0.0.9", Port: 1}}},
	}
	var got endpointv3.ClusterLoadAssignment
	if err := proto.Unmarshal(new(claEncoder).encode("outbound|8080||echo.default.svc.cluster.local", groups), &got); err != nil {
		t.Fatal(err)
	}
	lb := func(addr string, port, weight uint32, health corev3.HealthStatus, md *corev3.Metadata) *endpointv3.LbEndpoint {
		return &endpointv3.LbEndpoint{
			HostIdentifier:      &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: socketAddress(addr, port)}},
			HealthStatus:        health,
			Metadata:            md,
			LoadBalancingWeight: wrapperspb.UInt32(weight),
		}
	}
	// A dual-stack endpoint: its other addresses on the same port.
	dualStack := func(e *endpointv3.LbEndpoint, extra ...string) *endpointv3.LbEndpoint {
		ep := e.GetEndpoint()
		for _, a := range extra {
			ep.AdditionalAddresses = append(ep.AdditionalAddresses, &endpointv3.Endpoint_AdditionalAddress{
				Address: socketAddress(a, ep.GetAddress().GetSocketAddress().GetPortValue()),
			})
		}
		return e
	}
	want := &endpointv3.ClusterLoadAssignment{
		ClusterName: "outbound|8080||echo.default.svc.cluster.local",
		Endpoints: []*endpointv3.LocalityLbEndpoints{
			{
				Locality: &corev3.Locality{Region: "us-east1", Zone: "us-east1-b"},
				LbEndpoints: []*endpointv3.LbEndpoint{
					lb("10.0.0.1", 8080, 3, corev3.HealthStatus_HEALTHY, endpointMetadata("network1", "cluster1", sdk.TLSModeIstio)),
					lb("10.0.0.2", 9090, 1, corev3.HealthStatus_UNHEALTHY, endpointMetadata("", "cluster1", sdk.TLSModeDisabled)),
					dualStack(lb("10.0.0.3", 8080, 1, corev3.HealthStatus_HEALTHY, endpointMetadata("", "cluster1", sdk.TLSModeDisabled)), "fd00:10:244::3", "192.168.0.3"),
				},
				LoadBalancingWeight: wrapperspb.UInt32(5),
			},
			{
				Locality:            &corev3.Locality{Region: "us-west1", Zone: "us-west1-a", SubZone: "rack7"},
				LbEndpoints:         []*endpointv3.LbEndpoint{lb("2001:db8::1", 443, 1<<31, corev3.HealthStatus_DRAINING, endpointMetadata("network2", "", sdk.TLSModeDisabled))},
				LoadBalancingWeight: wrapperspb.UInt32(70000),
				Priority:            1,
			},
			{
				Locality:            &corev3.Locality{},
				LbEndpoints:         []*endpointv3.LbEndpoint{lb("10.0.0.9", 1, 1, corev3.HealthStatus_HEALTHY, endpointMetadata("", "", sdk.TLSModeDisabled))},
				LoadBalancingWeight: wrapperspb.UInt32(1),
			},
		},
	}
	if diff := cmp.Diff(want, &got, protocmp.Transform()); diff != "" {
		t.Errorf("encoded CLA differs from envoy's types (-want +got):\n%s", diff)
	}
	// Deterministic: the same input encodes to the same bytes.
	if a, b := new(claEncoder).encode("c", groups), new(claEncoder).encode("c", groups); string(a) != string(b) {
		t.Errorf("encoding is not deterministic")
	}
}

// TestPooledGroupsSurviveFilters: a filter that drops a locality group
// rearranges the slice it is given; the next CLA built with the pooled
// groups must still get every endpoint in its own group.
func TestPooledGroupsSurviveFilters(t *testing.T) {
	f := newFixture(t)
	two := func(seed int, tls registryv1.TLSMode) []*registryv1.Endpoint {
		return []*registryv1.Endpoint{
			{Address: fmt.Sprintf("10.%d.0.1", seed), Locality: "r/a", TlsMode: registryv1.TLSMode_TLS_MODE_DISABLED},
			{Address: fmt.Sprintf("10.%d.0.2", seed), Locality: "r/b", TlsMode: tls},
		}
	}
	f.service(svcHost(0), 8080)
	f.endpoints(svcHost(0), two(1, registryv1.TLSMode_TLS_MODE_ISTIO))
	f.service(svcHost(1), 8080)
	f.endpoints(svcHost(1), two(2, registryv1.TLSMode_TLS_MODE_ISTIO))
	gen := NewGenerator(f.agg, nil)
	router := model.View{Kind: model.KindRouter, Network: "network1", Networks: "network1"}
	for range 3 {
		// The router keeps only the mTLS endpoint: the first group goes.
		r := gen.CLA(router, model.SNIClusterName(8080, "", svcHost(0)), nil)
		if got := claAddresses(decodeCLAs(t, []*anypb.Any{r.Any})[model.SNIClusterName(8080, "", svcHost(0))]); !slices.Equal(got, []string{"10.1.0.2"}) {
			t.Fatalf("router CLA = %v", got)
		}
		name := model.ClusterName(8080, "", svcHost(1))
		cla := decodeCLAs(t, []*anypb.Any{gen.CLA(proxylessView, name, nil).Any})[name]
		if len(cla.GetEndpoints()) != 2 || !slices.Equal(claAddresses(cla), []string{"10.2.0.1", "10.2.0.2"}) {
			t.Fatalf("CLA after a filtered build = %v", cla)
		}
		for _, le := range cla.GetEndpoints() {
			if len(le.GetLbEndpoints()) != 1 {
				t.Fatalf("locality %v has %d endpoints, want 1", le.GetLocality(), len(le.GetLbEndpoints()))
			}
		}
	}
}

// TestCLAReuse: a CLA whose inputs did not change comes back as it was;
// a change of the service's endpoints, or of networks, rebuilds it.
func TestCLAReuse(t *testing.T) {
	w, m := meshtest.ThreeNetworks(t)
	gen := NewGenerator(w.Agg, pipeline.New(w.Agg, m, nil))
	v := model.View{Kind: model.KindProxyless, Network: "network1", Cluster: "cluster1"}
	name := model.ClusterName(8080, "", meshtest.Echo)
	first := gen.CLA(v, name, nil)
	if again := gen.CLA(v, name, first); again != first {
		t.Fatal("an unchanged CLA was rebuilt")
	}
	w.SetEndpoints("east", "cluster1", meshtest.Echo, meshtest.Endpoint("10.1.0.2", "", true))
	changed := gen.CLA(v, name, first)
	if changed == first || changed.Version() == first.Version() {
		t.Fatal("a CLA whose endpoints changed was not rebuilt")
	}
	m.Apply(meshtest.Networks(t, `
  network "network1" {
    endpoints { from_registry = "cluster1" }
  }
`))
	if gen.CLA(v, name, changed) == changed {
		t.Fatal("a CLA was not rebuilt after networks changed")
	}
}
