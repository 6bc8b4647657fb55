package pipeline

import (
	"testing"

	"github.com/estuary-mesh/estuary/host/meshtest"
	"github.com/estuary-mesh/estuary/host/model"
	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
	"github.com/estuary-mesh/estuary/sdk"
)

// filterWorld has, by hand:
//
//	network1: one gateway, 1.1.1.1:15443, reported by cluster1's registry
//	network2: three gateways, reported by registries:
//	          2.2.2.1:15443 and 2.2.2.2:15443 in cluster2a,
//	          2.2.2.3:15443 in cluster2b
//	network3: one gateway from the config (no cluster), 3.3.3.1:15443, and
//	          no endpoints anywhere
//	network4: endpoints, no gateway
//
// Gateway groups: by network 1, 3, 1; by network and cluster
// (network1,cluster1) 1, (network2,cluster2a) 2, (network2,cluster2b) 1,
// (network3,"") 1. Scale factor = lcm(1,3,1,1,2,1,1) = 6, which is neither
// 1 nor 3.
func filterWorld(t *testing.T) *Pipeline {
	w := meshtest.New(t)
	w.Add(meshtest.Instance{Plugin: "east", Cluster: "cluster1", Gateways: []*registryv1.NetworkGateway{meshtest.Gateway("network1", "cluster1", "1.1.1.1", 15443)}})
	w.Add(meshtest.Instance{Plugin: "west-a", Cluster: "cluster2a", Gateways: []*registryv1.NetworkGateway{
		meshtest.Gateway("network2", "cluster2a", "2.2.2.2", 15443), meshtest.Gateway("network2", "cluster2a", "2.2.2.1", 15443)}})
	w.Add(meshtest.Instance{Plugin: "west-b", Cluster: "cluster2b", Gateways: []*registryv1.NetworkGateway{meshtest.Gateway("network2", "cluster2b", "2.2.2.3", 15443)}})
	return New(w.Agg, w.Manager(`
  network "network3" {
    gateway {
      address = "3.3.3.1"
      port    = 15443
    }
  }
`), nil)
}

func lb(addr, network, cluster string, weight uint32, tls sdk.TLSMode) model.LbEndpoint {
	return model.LbEndpoint{Address: addr, Port: 80, Weight: weight, Network: network, Cluster: cluster, TLSMode: tls}
}

func dual(ep model.LbEndpoint, extra ...string) model.LbEndpoint {
	ep.AdditionalAddresses = extra
	return ep
}

func withHealth(ep model.LbEndpoint, h sdk.Health) model.LbEndpoint {
	ep.Health = h
	return ep
}

const (
	istio    = sdk.TLSModeIstio
	disabled = sdk.TLSModeDisabled
)

// filterGroups runs the multi-network decisions of Build on groups made
// by hand, as Build runs them on the groups it collects.
func filterGroups(p *Pipeline, v model.View, groups []model.LocalityGroup) []model.LocalityGroup {
	return p.filter(&Scratch{}, p.snapshot(), v, groups, nil)
}

// TestFilter checks the multi-network decisions against results worked out by
// hand (the arithmetic is in each case's comments).
func TestFilter(t *testing.T) {
	p := filterWorld(t)
	m := p.nets
	if got := m.ScaleFactor(); got != 6 {
		t.Fatalf("scale factor = %d, want lcm(1,3,1,1,2,1,1) = 6", got)
	}
	if !m.MultiNetwork() {
		t.Fatal("multi-network is off with 5 gateways")
	}
	mixed := func() []model.LocalityGroup {
		return []model.LocalityGroup{{
			Locality: "us-east1/us-east1-b",
			Endpoints: []model.LbEndpoint{
				lb("10.1.0.1", "network1", "cluster1", 0, istio),     // local: unset -> 6
				lb("10.2.0.1", "network2", "cluster2a", 0, istio),    // 6 / 2 gateways of (network2,cluster2a) = 3 each
				lb("10.2.0.2", "network2", "cluster2a", 2, istio),    // 2*6 = 12 / 2 = 6 each
				lb("10.2.1.1", "network2", "cluster2b", 1, istio),    // 6 / 1 gateway of (network2,cluster2b) = 6
				lb("10.2.2.1", "network2", "cluster2c", 0, istio),    // no gateway in cluster2c: 6 / 3 of network2 = 2 each
				lb("10.2.0.3", "network2", "cluster2a", 5, disabled), // remote, plain text: dropped
				lb("10.4.0.1", "network4", "cluster4", 3, disabled),  // network4 has no gateway: kept, 3*6 = 18
				lb("10.9.0.1", "", "cluster9", 0, disabled),          // unknown network: kept, 6
			},
		}, {
			Locality: "us-west1/us-west1-a", Priority: 1,
			Endpoints: []model.LbEndpoint{
				lb("10.2.0.9", "network2", "cluster2a", 0, disabled), // dropped: the group ends up empty and goes
			},
		}}
	}
	tests := []struct {
		name string
		view model.View
		in   []model.LocalityGroup
		want string
	}{{
		name: "node on network1: network2 replaced by its gateways, per cluster or per network",
		view: model.View{Network: "network1", Cluster: "cluster1"},
		in:   mixed(),
		// 2.2.2.1: 3 + 6 + 2 = 11; 2.2.2.2: 3 + 6 + 2 = 11; 2.2.2.3: 6 + 2 = 8.
		// Group: 6 + 18 + 6 + 11 + 11 + 8 = 60.
		want: `locality=us-east1/us-east1-b priority=0 weight=60
  10.1.0.1:80 w=6 net=network1 cluster=cluster1 tls=istio
  10.4.0.1:80 w=18 net=network4 cluster=cluster4 tls=disabled
  10.9.0.1:80 w=6 net= cluster=cluster9 tls=disabled
  2.2.2.1:15443 w=11 net=network2 cluster=cluster2a tls=istio
  2.2.2.2:15443 w=11 net=network2 cluster=cluster2a tls=istio
  2.2.2.3:15443 w=8 net=network2 cluster=cluster2b tls=istio
`,
	}, {
		name: "node on network2: network1 replaced by its one gateway, network2 kept",
		view: model.View{Network: "network2", Cluster: "cluster2a"},
		in:   mixed(),
		// 1.1.1.1: 6. Kept: 6, 12, 6, 6, 5*6 = 30 (plain text is fine
		// locally), 18, 6. Group: 6+12+6+6+30+18+6+6 = 90. The second
		// group's endpoint is local now: 6.
		want: `locality=us-east1/us-east1-b priority=0 weight=90
  10.2.0.1:80 w=6 net=network2 cluster=cluster2a tls=istio
  10.2.0.2:80 w=12 net=network2 cluster=cluster2a tls=istio
  10.2.1.1:80 w=6 net=network2 cluster=cluster2b tls=istio
  10.2.2.1:80 w=6 net=network2 cluster=cluster2c tls=istio
  10.2.0.3:80 w=30 net=network2 cluster=cluster2a tls=disabled
  10.4.0.1:80 w=18 net=network4 cluster=cluster4 tls=disabled
  10.9.0.1:80 w=6 net= cluster=cluster9 tls=disabled
  1.1.1.1:15443 w=6 net=network1 cluster=cluster1 tls=istio
locality=us-west1/us-west1-a priority=1 weight=6
  10.2.0.9:80 w=6 net=network2 cluster=cluster2a tls=disabled
`,
	}, {
		name: "node with no network: every endpoint is reachable, weights scaled",
		view: model.View{},
		in:   mixed(),
		// 6 + 6 + 12 + 6 + 6 + 30 + 18 + 6 = 90.
		want: `locality=us-east1/us-east1-b priority=0 weight=90
  10.1.0.1:80 w=6 net=network1 cluster=cluster1 tls=istio
  10.2.0.1:80 w=6 net=network2 cluster=cluster2a tls=istio
  10.2.0.2:80 w=12 net=network2 cluster=cluster2a tls=istio
  10.2.1.1:80 w=6 net=network2 cluster=cluster2b tls=istio
  10.2.2.1:80 w=6 net=network2 cluster=cluster2c tls=istio
  10.2.0.3:80 w=30 net=network2 cluster=cluster2a tls=disabled
  10.4.0.1:80 w=18 net=network4 cluster=cluster4 tls=disabled
  10.9.0.1:80 w=6 net= cluster=cluster9 tls=disabled
locality=us-west1/us-west1-a priority=1 weight=6
  10.2.0.9:80 w=6 net=network2 cluster=cluster2a tls=disabled
`,
	}, {
		name: "REQUESTED_NETWORK_VIEW network2 on network2: only network2 and unknown-network endpoints",
		view: model.View{Kind: model.KindEnvoy, Network: "network2", Networks: "network2", Cluster: "cluster2a"},
		in:   mixed(),
		// 6 + 12 + 6 + 6 + 30 + 6 = 66.
		want: `locality=us-east1/us-east1-b priority=0 weight=66
  10.2.0.1:80 w=6 net=network2 cluster=cluster2a tls=istio
  10.2.0.2:80 w=12 net=network2 cluster=cluster2a tls=istio
  10.2.1.1:80 w=6 net=network2 cluster=cluster2b tls=istio
  10.2.2.1:80 w=6 net=network2 cluster=cluster2c tls=istio
  10.2.0.3:80 w=30 net=network2 cluster=cluster2a tls=disabled
  10.9.0.1:80 w=6 net= cluster=cluster9 tls=disabled
locality=us-west1/us-west1-a priority=1 weight=6
  10.2.0.9:80 w=6 net=network2 cluster=cluster2a tls=disabled
`,
	}, {
		name: "REQUESTED_NETWORK_VIEW of two networks on network1: network4 is dropped, network2 replaced",
		view: model.View{Network: "network1", Networks: "network1,network2"},
		in:   mixed(),
		// As on network1 without 10.4.0.1: 60 - 18 = 42.
		want: `locality=us-east1/us-east1-b priority=0 weight=42
  10.1.0.1:80 w=6 net=network1 cluster=cluster1 tls=istio
  10.9.0.1:80 w=6 net= cluster=cluster9 tls=disabled
  2.2.2.1:15443 w=11 net=network2 cluster=cluster2a tls=istio
  2.2.2.2:15443 w=11 net=network2 cluster=cluster2a tls=istio
  2.2.2.3:15443 w=8 net=network2 cluster=cluster2b tls=istio
`,
	}, {
		name: "TLS disabled: remote plain-text endpoints are dropped, the gateway gets only the mTLS ones",
		view: model.View{Network: "network1"},
		in: []model.LocalityGroup{{Locality: "r/z", Endpoints: []model.LbEndpoint{
			lb("10.2.1.1", "network2", "cluster2b", 0, disabled),
			lb("10.2.1.2", "network2", "cluster2b", 0, istio), // 6 -> 2.2.2.3
			lb("10.2.1.3", "network2", "cluster2b", 0, disabled),
		}}},
		want: `locality=r/z priority=0 weight=6
  2.2.2.3:15443 w=6 net=network2 cluster=cluster2b tls=istio
`,
	}, {
		name: "draining or unhealthy remote endpoints add nothing to their gateway; local ones are kept as they are",
		view: model.View{Network: "network1"},
		in: []model.LocalityGroup{{Locality: "r/z", Endpoints: []model.LbEndpoint{
			withHealth(lb("10.1.0.1", "network1", "cluster1", 0, istio), sdk.HealthDraining), // local: kept, 6
			lb("10.2.1.1", "network2", "cluster2b", 0, istio),                                // 6 -> 2.2.2.3
			withHealth(lb("10.2.1.2", "network2", "cluster2b", 0, istio), sdk.HealthDraining),
			withHealth(lb("10.2.1.3", "network2", "cluster2b", 0, istio), sdk.HealthUnhealthy),
			withHealth(lb("10.2.0.1", "network2", "cluster2a", 0, istio), sdk.HealthDraining), // its gateways get nothing
		}}},
		want: `locality=r/z priority=0 weight=12
  10.1.0.1:80 w=6 net=network1 cluster=cluster1 tls=istio health=DRAINING
  2.2.2.3:15443 w=6 net=network2 cluster=cluster2b tls=istio
`,
	}, {
		name: "dual stack: a local endpoint keeps its other addresses, a remote one's gateway has none; the primary address decides the network",
		view: model.View{Network: "network1"},
		in: []model.LocalityGroup{{Locality: "r/z", Endpoints: []model.LbEndpoint{
			dual(lb("10.1.0.1", "network1", "cluster1", 0, istio), "fd00:1::1"),  // local: kept with both, 6
			dual(lb("10.2.1.1", "network2", "cluster2b", 0, istio), "fd00:2::1"), // 6 -> 2.2.2.3, which has no other address
		}}},
		want: `locality=r/z priority=0 weight=12
  10.1.0.1:80 w=6 net=network1 cluster=cluster1 tls=istio also=fd00:1::1
  2.2.2.3:15443 w=6 net=network2 cluster=cluster2b tls=istio
`,
	}, {
		name: "weights that overflow are clipped at 4294967295, sums too",
		view: model.View{Network: "network1"},
		in: []model.LocalityGroup{{Locality: "r/z", Endpoints: []model.LbEndpoint{
			lb("10.1.0.1", "network1", "cluster1", 1000000000, istio),  // 6e9 > max: 4294967295
			lb("10.1.0.2", "network1", "cluster1", 715827882, istio),   // 715827882*6 = 4294967292 fits
			lb("10.2.1.1", "network2", "cluster2b", 4000000000, istio), // clipped: 4294967295 to 2.2.2.3
			lb("10.2.1.2", "network2", "cluster2b", 3000000000, istio), // clipped: 4294967295 to 2.2.2.3
			lb("10.2.0.1", "network2", "cluster2a", 4294967295, istio), // clipped: 4294967295 / 2 = 2147483647 each
		}}},
		// 2.2.2.3: 2*4294967295 = 8589934590, clipped. Group: clipped.
		want: `locality=r/z priority=0 weight=4294967295
  10.1.0.1:80 w=4294967295 net=network1 cluster=cluster1 tls=istio
  10.1.0.2:80 w=4294967292 net=network1 cluster=cluster1 tls=istio
  2.2.2.1:15443 w=2147483647 net=network2 cluster=cluster2a tls=istio
  2.2.2.2:15443 w=2147483647 net=network2 cluster=cluster2a tls=istio
  2.2.2.3:15443 w=4294967295 net=network2 cluster=cluster2b tls=istio
`,
	}, {
		name: "per-cluster versus per-network gateway selection",
		view: model.View{Network: "network1"},
		in: []model.LocalityGroup{{Locality: "r/z", Endpoints: []model.LbEndpoint{
			lb("10.2.0.1", "network2", "cluster2a", 1, istio), // cluster2a has 2 gateways: 6/2 = 3 to 2.2.2.1, 2.2.2.2
			lb("10.2.1.1", "network2", "cluster2b", 1, istio), // cluster2b has 1: 6 to 2.2.2.3
			lb("10.2.2.1", "network2", "", 1, istio),          // no cluster: the network's 3, 2 each
		}}},
		// 2.2.2.1: 3 + 2 = 5; 2.2.2.2: 5; 2.2.2.3: 6 + 2 = 8. Group 18.
		want: `locality=r/z priority=0 weight=18
  2.2.2.1:15443 w=5 net=network2 cluster=cluster2a tls=istio
  2.2.2.2:15443 w=5 net=network2 cluster=cluster2a tls=istio
  2.2.2.3:15443 w=8 net=network2 cluster=cluster2b tls=istio
`,
	}, {
		name: "a network with a gateway and no endpoints adds nothing; a network with endpoints and no gateway is kept",
		view: model.View{Network: "network3"},
		in: []model.LocalityGroup{{Locality: "r/z", Endpoints: []model.LbEndpoint{
			lb("10.4.0.1", "network4", "cluster4", 0, istio), // no gateway into network4: kept
			lb("10.4.0.2", "network4", "cluster4", 2, istio),
		}}},
		want: `locality=r/z priority=0 weight=18
  10.4.0.1:80 w=6 net=network4 cluster=cluster4 tls=istio
  10.4.0.2:80 w=12 net=network4 cluster=cluster4 tls=istio
`,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := meshtest.Render(filterGroups(p, tt.view, tt.in))
			if got != tt.want {
				t.Errorf("got:\n%s\nwant:\n%s", got, tt.want)
			}
		})
	}
}

// TestOneNetwork: without any gateway the pipeline changes nothing, not
// even weights (an unset one leaves as 1, which is what Envoy takes it
// for), and places endpoints all the same.
func TestOneNetwork(t *testing.T) {
	w := meshtest.New(t)
	w.Add(meshtest.Instance{Plugin: "east", Cluster: "cluster1", Services: []*registryv1.Service{meshtest.EchoService("cluster1")},
		Endpoints: map[string][]*registryv1.Endpoint{meshtest.Echo: {
			meshtest.Endpoint("10.1.0.1", "", true),
			{Address: "10.2.0.1", Network: "network2", Weight: 3, Locality: "us-east1/us-east1-b"},
		}}})
	m := w.Manager(`
  network "network1" {
    endpoints {
      from_registry = "cluster1"
    }
  }
`)
	if m.MultiNetwork() || m.ScaleFactor() != 1 {
		t.Fatalf("multi-network %v, scale %d with no gateway", m.MultiNetwork(), m.ScaleFactor())
	}
	groups, err := New(w.Agg, m, nil).Endpoints(model.View{Network: "network1"}, model.ClusterName(8080, "", meshtest.Echo), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := `locality=us-east1/us-east1-b priority=0 weight=0
  10.1.0.1:8080 w=1 net=network1 cluster=cluster1 tls=istio
  10.2.0.1:8080 w=3 net=network2 cluster=cluster1 tls=disabled
`
	if got := meshtest.Render(groups); got != want {
		t.Errorf("got:\n%s\nwant unchanged:\n%s", got, want)
	}
}

// TestNetworkOnlyEndpoints: an endpoint with a network and no address (as
// Istio accepts in a ServiceEntry or WorkloadEntry) reaches a node on
// another network as its gateway, weighted like any remote endpoint, and
// nowhere else; explain says why it was dropped.
func TestNetworkOnlyEndpoints(t *testing.T) {
	w := meshtest.New(t)
	w.Add(meshtest.Instance{Plugin: "east", Cluster: "cluster1", Services: []*registryv1.Service{meshtest.EchoService("cluster1")},
		Gateways: []*registryv1.NetworkGateway{meshtest.Gateway("network1", "cluster1", "1.1.1.1", 15443)},
		Endpoints: map[string][]*registryv1.Endpoint{meshtest.Echo: {
			meshtest.Endpoint("10.1.0.1", "network1", true),
			meshtest.Endpoint("", "network2", true),
			meshtest.Endpoint("", "network2", true),
			meshtest.Endpoint("", "network4", true), // no gateway into network4: unreachable
		}}})
	w.Add(meshtest.Instance{Plugin: "west", Cluster: "cluster2",
		Gateways: []*registryv1.NetworkGateway{meshtest.Gateway("network2", "cluster2", "2.2.2.1", 15443)}})
	p := New(w.Agg, w.Manager(""), nil)
	cluster := model.ClusterName(8080, "", meshtest.Echo)
	for _, tt := range []struct {
		name string
		view model.View
		want string
	}{{
		name: "a node on network1 gets network2's gateway for both",
		view: model.View{Network: "network1", Cluster: "cluster1"},
		// Scale factor 1: 10.1.0.1 sent as 1; the gateway as 1 + 1.
		want: `locality=us-east1/us-east1-b priority=0 weight=3
  10.1.0.1:8080 w=1 net=network1 cluster=cluster1 tls=istio
  2.2.2.1:15443 w=2 net=network2 cluster=cluster2 tls=istio
`,
	}, {
		name: "a node on network2 gets nothing for them",
		view: model.View{Network: "network2", Cluster: "cluster2"},
		want: `locality=us-east1/us-east1-b priority=0 weight=1
  1.1.1.1:15443 w=1 net=network1 cluster=cluster1 tls=istio
`,
	}, {
		name: "network2's east-west gateway does not forward to them",
		view: model.View{Kind: model.KindRouter, Network: "network2", Networks: "network2"},
		want: ``,
	}} {
		t.Run(tt.name, func(t *testing.T) {
			c := cluster
			if tt.view.Kind == model.KindRouter {
				c = model.SNIClusterName(8080, "", meshtest.Echo)
			}
			groups, err := p.Endpoints(tt.view, c, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := meshtest.Render(groups); got != tt.want {
				t.Errorf("got:\n%s\nwant:\n%s", got, tt.want)
			}
		})
	}
	tr, err := p.Explain(model.View{Network: "network2", Cluster: "cluster2"}, cluster)
	if err != nil {
		t.Fatal(err)
	}
	dropped := 0
	for _, e := range tr.Endpoints {
		if e.Decision == DroppedNoAddress {
			dropped++
		}
	}
	if dropped != 3 {
		t.Errorf("explain: %d endpoints dropped as network-only, want 3 (two on the node's network, one without a gateway): %+v", dropped, tr.Endpoints)
	}
}
