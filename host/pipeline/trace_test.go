package pipeline

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/estuary-mesh/estuary/host/meshtest"
	"github.com/estuary-mesh/estuary/host/model"
	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
)

// richWorld has every case the pipeline distinguishes: three localities,
// subsets, weights set and unset, plain text and mTLS, endpoints placed by
// each rule, a network with two gateways in one cluster and one in
// another, a network whose gateway has no address yet, one with no
// gateway, and an unknown network.
func richWorld(t *testing.T) *Pipeline {
	w := meshtest.New(t)
	e := func(addr, network, locality, version string, weight uint32, mtls bool) *registryv1.Endpoint {
		ep := meshtest.Endpoint(addr, network, mtls)
		ep.Locality, ep.Weight = locality, weight
		if version != "" {
			ep.Labels = map[string]string{model.SubsetLabel: version}
		}
		return ep
	}
	const a, b = "us-east1/us-east1-b", "us-west1/us-west1-a"
	svc := meshtest.EchoService
	w.Add(meshtest.Instance{Plugin: "east", Cluster: "cluster1", DefaultNetwork: "network1", Services: []*registryv1.Service{svc("cluster1")},
		Endpoints: map[string][]*registryv1.Endpoint{meshtest.Echo: {
			e("10.1.0.1", "", a, "v1", 0, true), e("10.1.0.2", "", b, "v2", 5, false), e("10.1.0.3", "", a, "", 2, true),
		}},
		Gateways: []*registryv1.NetworkGateway{meshtest.Gateway("network1", "cluster1", "1.1.1.1", 15443)}})
	w.Add(meshtest.Instance{Plugin: "west-a", Cluster: "cluster2a", Services: []*registryv1.Service{svc("cluster2a")},
		Endpoints: map[string][]*registryv1.Endpoint{meshtest.Echo: {
			e("10.2.0.1", "", a, "v1", 0, true), e("10.2.0.2", "", b, "v2", 3, true), e("10.2.0.3", "", a, "v1", 1, false),
			// The first locality in order, which every view but a local
			// one drops: the groups after it move up.
			e("10.2.0.9", "", "af-south1/af-south1-a", "v1", 1, false),
		}},
		Gateways: []*registryv1.NetworkGateway{
			meshtest.Gateway("network2", "cluster2a", "2.2.2.2", 15443), meshtest.Gateway("network2", "cluster2a", "2.2.2.1", 15443)}})
	w.Add(meshtest.Instance{Plugin: "west-b", Cluster: "cluster2b", Services: []*registryv1.Service{svc("cluster2b")},
		Endpoints: map[string][]*registryv1.Endpoint{meshtest.Echo: {
			e("10.2.1.1", "network2", a, "", 4000000000, true), e("10.4.0.1", "network4", b, "v2", 7, true),
			e("10.5.0.1", "", a, "v1", 1, true), e("192.0.2.1", "", b, "", 0, false),
		}},
		Gateways: []*registryv1.NetworkGateway{meshtest.Gateway("network2", "cluster2b", "2.2.2.3", 15443)}})
	m := w.Manager(`
  network "network2" {
    endpoints { from_registry = "cluster2a" }
  }
  network "network5" {
    endpoints { from_cidr = "10.5.0.0/16" }
    gateway {
      address = "gw.network5.example.com"
      port    = 15443
    }
  }
`)
	return New(w.Agg, m, nil)
}

// traceViews are the views the trace is checked for: every kind, on each
// network, with and without REQUESTED_NETWORK_VIEW.
var traceViews = []model.View{
	{Kind: model.KindProxyless, Network: "network1", Cluster: "cluster1"},
	{Kind: model.KindEnvoy, Network: "network2", Cluster: "cluster2a"},
	{Kind: model.KindProxyless},
	{Kind: model.KindProxyless, Network: "network1", Networks: "network1,network2"},
	{Kind: model.KindRouter, Network: "network1", Networks: "network1"},
	{Kind: model.KindRouter, Network: "network2", Networks: "network2"},
	{Kind: model.KindRouter},
}

// TestTraceIsTheResult: for every view and every cluster, the trace's
// result is exactly what Build returns, endpoint by endpoint and weight by
// weight, and every registry endpoint is accounted for: sent itself,
// behind the gateways that replaced it, or dropped.
func TestTraceIsTheResult(t *testing.T) {
	worlds := map[string]func(*testing.T) *Pipeline{
		"rich": richWorld,
		"three networks": func(t *testing.T) *Pipeline {
			w, m := meshtest.ThreeNetworks(t)
			return New(w.Agg, m, nil)
		},
		"one network": func(t *testing.T) *Pipeline {
			w, _ := meshtest.ThreeNetworks(t)
			return New(w.Agg, nil, nil)
		},
	}
	for wn, world := range worlds {
		p := world(t)
		for _, v := range traceViews {
			for _, subset := range []string{"", "v1", "v2"} {
				name := model.ClusterName(8080, subset, meshtest.Echo)
				if v.Kind == model.KindRouter {
					name = model.SNIClusterName(8080, subset, meshtest.Echo)
				}
				t.Run(fmt.Sprintf("%s/%s/%s", wn, v, name), func(t *testing.T) {
					checkTrace(t, p, v, name)
				})
			}
		}
	}
}

func checkTrace(t *testing.T, p *Pipeline, v model.View, name string) {
	t.Helper()
	plain, err := p.Endpoints(v, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	tr := &Trace{}
	traced, err := p.Endpoints(v, name, tr)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := meshtest.Render(traced), meshtest.Render(plain); got != want {
		t.Fatalf("tracing changed the result:\n%s\nwithout a trace:\n%s", got, want)
	}
	var sent []string
	for _, g := range plain {
		for _, e := range g.Endpoints {
			sent = append(sent, fmt.Sprintf("%s %s w=%d net=%s cluster=%s", g.Locality, hostPort(e.Address, e.Port), e.Weight, e.Network, e.Cluster))
		}
	}
	var result []string
	for _, r := range tr.Result {
		result = append(result, fmt.Sprintf("%s %s w=%d net=%s cluster=%s", r.Locality, r.Endpoint, r.Weight, r.Network, r.Cluster))
	}
	if !slices.Equal(result, sent) {
		t.Fatalf("trace result:\n%q\nBuild returned:\n%q", result, sent)
	}
	// Every endpoint is accounted for, once.
	behind := map[int][]int{} // endpoint -> results that carry it
	for ri, r := range tr.Result {
		var shares uint64
		for _, k := range r.From {
			behind[k] = append(behind[k], ri)
			shares += uint64(tr.Endpoints[k].Share)
		}
		if r.Gateway && uint32(min(max(shares, 1), math.MaxUint32)) != r.Weight {
			t.Errorf("gateway %s: weight %d, shares of %v sum to %d", r.Endpoint, r.Weight, r.From, shares)
		}
	}
	for k, e := range tr.Endpoints {
		switch {
		case e.Decision.Sent():
			if len(behind[k]) != 1 || tr.Result[behind[k][0]].Gateway || tr.Result[behind[k][0]].Endpoint != e.Endpoint {
				t.Errorf("%s is %v but sent as %v", e.Endpoint, e.Decision, behind[k])
			}
		case e.Decision == Replaced:
			var via []string
			for _, ri := range behind[k] {
				via = append(via, tr.Result[ri].Endpoint)
			}
			if !slices.Equal(via, e.Gateways) {
				t.Errorf("%s is replaced by %v but sent through %v", e.Endpoint, e.Gateways, via)
			}
		default:
			if len(behind[k]) != 0 {
				t.Errorf("%s is %v but sent through %v", e.Endpoint, e.Decision, behind[k])
			}
		}
	}
}

// TestBuildAllocations: Build runs for every CLA the xDS server builds;
// with a warm Scratch and no trace it allocates nothing, whatever the
// view.
func TestBuildAllocations(t *testing.T) {
	p := richWorld(t)
	p.SetLocality(LocalityPolicy{Enabled: true, Failover: []FailoverRule{{From: "us-east1", To: "us-west1"}}})
	views := slices.Clone(traceViews)
	for _, v := range traceViews {
		v.Locality = "us-east1/us-east1-b/s1" // priorities too
		views = append(views, v)
	}
	for _, v := range views {
		name := model.ClusterName(8080, "", meshtest.Echo)
		if v.Kind == model.KindRouter {
			name = model.SNIClusterName(8080, "", meshtest.Echo)
		}
		c, _ := ParseCluster(v.Kind, name)
		sc := &Scratch{}
		allocs := testing.AllocsPerRun(100, func() {
			if _, err := p.Build(sc, v, c, nil); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("%s: Build allocates %.1f times per call", v, allocs)
		}
	}
}

// TestScratchReuse: one Scratch serves builds of every view and cluster in
// turn, as a pooled one does in the xDS server, and each gives what fresh
// memory gives: dropping a group, or outgrowing one with gateways, never
// leaves a slot sharing another's endpoints.
func TestScratchReuse(t *testing.T) {
	p := richWorld(t)
	sc := &Scratch{}
	for round := range 3 {
		for _, v := range traceViews {
			for _, subset := range []string{"", "v1", "v2"} {
				name := model.ClusterName(8080, subset, meshtest.Echo)
				if v.Kind == model.KindRouter {
					name = model.SNIClusterName(8080, subset, meshtest.Echo)
				}
				c, _ := ParseCluster(v.Kind, name)
				reused, err := p.Build(sc, v, c, nil)
				if err != nil {
					t.Fatal(err)
				}
				fresh, _ := p.Endpoints(v, name, nil)
				if got, want := meshtest.Render(reused), meshtest.Render(fresh); got != want {
					t.Fatalf("round %d, %s, %s, with a reused Scratch:\n%s\nin fresh memory:\n%s", round, v, name, got, want)
				}
			}
		}
	}
}
