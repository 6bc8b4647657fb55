package network_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/estuary-mesh/estuary/host/network"
	"github.com/estuary-mesh/estuary/host/replica"
	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/xds"
)

const echo = "echo.default.svc.cluster.local"

func echoService(cluster string, vips ...string) *registryv1.Service {
	s := &registryv1.Service{Hostname: echo, Namespace: "default", Ports: []*registryv1.Port{{Name: "grpc", Number: 8080, Protocol: "GRPC"}}}
	if len(vips) > 0 {
		s.Vips = []*registryv1.ClusterAddresses{{Cluster: cluster, Addresses: vips}}
	}
	return s
}

func ep(addr, network string, tls bool) *registryv1.Endpoint {
	e := &registryv1.Endpoint{Address: addr, Network: network, Locality: "us-east1/us-east1-b"}
	if tls {
		e.TlsMode = registryv1.TLSMode_TLS_MODE_ISTIO
	}
	return e
}

// meshWorld is a small mesh on three networks, each endpoint placed on its
// network by a different rule:
//
//	east (cluster1, no default network): 10.1.0.1 by from_registry (3),
//	    10.1.0.9 by its own network label "network2" (1)
//	west (cluster2, default network2): 10.2.0.1, 10.2.0.2 (mTLS) and
//	    10.2.0.3 (plain text) by the registry default (2); it reports the
//	    gateway 192.168.2.1:15443 of network2 in cluster2
//	vms  (cluster vms): 10.3.0.1 by from_cidr (4), network3 has no gateway
//	     10.7.0.1 matches nothing: unknown network
func meshWorld(t *testing.T) (*world, *network.Manager) {
	w := newWorld(t)
	w.add(instance{plugin: "east", cluster: "cluster1", services: []*registryv1.Service{echoService("cluster1")},
		endpoints: map[string][]*registryv1.Endpoint{echo: {ep("10.1.0.1", "", true), ep("10.1.0.9", "network2", true)}}})
	w.add(instance{plugin: "west", cluster: "cluster2", defaultNetwork: "network2", services: []*registryv1.Service{echoService("cluster2")},
		endpoints: map[string][]*registryv1.Endpoint{echo: {ep("10.2.0.1", "", true), ep("10.2.0.2", "", true), ep("10.2.0.3", "", false)}},
		gateways:  []*registryv1.NetworkGateway{gw("network2", "cluster2", "192.168.2.1", 15443)}})
	w.add(instance{plugin: "vms", cluster: "vms", services: []*registryv1.Service{echoService("vms")},
		endpoints: map[string][]*registryv1.Endpoint{echo: {ep("10.3.0.1", "", true), ep("10.7.0.1", "", true)}}})
	m := w.manager(`
  network "network1" {
    endpoints { from_registry = "cluster1" }
    gateway {
      address = "192.168.1.1"
      port    = 15443
    }
  }
  network "network3" {
    endpoints { from_cidr = "10.3.0.0/16" }
    endpoints { from_registry = "cluster3" }
  }
`)
	return w, m
}

// TestEndpointNetworkPrecedence: the four rules in order, first match wins,
// and the generator applies the same order as Resolve.
func TestEndpointNetworkPrecedence(t *testing.T) {
	w, m := meshWorld(t)
	// A second config makes every rule able to answer, to see which wins.
	m.Apply(decodeHCL(t, `
  network "by-registry" {
    endpoints { from_registry = "cluster2" }
    endpoints { from_registry = "vms" }
  }
  network "by-cidr" {
    endpoints { from_cidr = "10.0.0.0/8" }
  }
`))
	key := func(plugin, cluster string) replica.InstanceKey {
		return replica.InstanceKey{Plugin: plugin, Provider: "Static", Cluster: cluster}
	}
	tests := []struct {
		name              string
		key               replica.InstanceKey
		def, own, address string
		want              string
		rule              network.Rule
	}{
		{"own network beats everything", key("west", "cluster2"), "network2", "mine", "10.2.0.1", "mine", network.RuleEndpoint},
		{"registry default beats from_registry", key("west", "cluster2"), "network2", "", "10.2.0.1", "network2", network.RuleRegistryDefault},
		{"from_registry beats from_cidr", key("vms", "vms"), "", "", "10.3.0.1", "by-registry", network.RuleFromRegistry},
		{"from_cidr", key("east", "cluster1"), "", "", "10.1.0.1", "by-cidr", network.RuleFromCIDR},
		{"nothing matches", key("east", "cluster1"), "", "", "192.0.2.1", "", network.RuleNone},
		{"a DNS name matches no range", key("east", "cluster1"), "", "", "db.example.com", "", network.RuleNone},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, rule := m.Resolve(tt.key, sdk.InstanceProperties{DefaultNetwork: tt.def}, tt.own, tt.address)
			if n != tt.want || rule != tt.rule {
				t.Errorf("Resolve = %q by %v, want %q by %v", n, rule, tt.want, tt.rule)
			}
			if tt.own == "" && tt.def == "" {
				if got := m.EndpointNetwork(tt.key, sdk.InstanceProperties{}, tt.address); got != tt.want {
					t.Errorf("EndpointNetwork = %q, want %q", got, tt.want)
				}
			}
		})
	}

	// The generator places endpoints by the same rules.
	svc := w.agg.GetService(echo)
	gen := &xds.Generator{Agg: w.agg, Networks: m}
	groups := gen.LocalityGroups(xds.View{}, svc, svc.Ports[0], "", w.agg.EndpointSources(echo))
	var got []string
	for _, g := range groups {
		for _, e := range g.Endpoints {
			got = append(got, e.Address+"="+e.Network)
		}
	}
	want := []string{"10.1.0.1=by-cidr", "10.1.0.9=network2", "10.2.0.1=network2", "10.2.0.2=network2", "10.2.0.3=network2", "10.3.0.1=by-registry", "10.7.0.1=by-registry"}
	if !slices.Equal(got, want) {
		t.Errorf("generator placed:\n%v\nwant:\n%v", got, want)
	}
}

// TestGatewaysForNetworkAndCluster: the gateways of (network, cluster),
// else of the network, sorted by address then port.
func TestGatewaysForNetworkAndCluster(t *testing.T) {
	w := newWorld(t)
	w.add(instance{plugin: "a", cluster: "c2a", gateways: []*registryv1.NetworkGateway{
		gw("n2", "c2a", "10.0.0.10", 15443), gw("n2", "c2a", "10.0.0.9", 15443), gw("n2", "c2a", "10.0.0.9", 443)}})
	w.add(instance{plugin: "b", cluster: "c2b", gateways: []*registryv1.NetworkGateway{gw("n2", "c2b", "10.0.0.1", 15443)}})
	m := w.manager("")
	str := func(gws []network.Gateway) string {
		var out []string
		for _, g := range gws {
			out = append(out, g.String()+"@"+g.Cluster)
		}
		return strings.Join(out, " ")
	}
	for _, tc := range []struct{ network, cluster, want string }{
		{"n2", "c2a", "10.0.0.10:15443@c2a 10.0.0.9:443@c2a 10.0.0.9:15443@c2a"},
		{"n2", "c2b", "10.0.0.1:15443@c2b"},
		{"n2", "other", "10.0.0.1:15443@c2b 10.0.0.10:15443@c2a 10.0.0.9:443@c2a 10.0.0.9:15443@c2a"},
		{"n3", "c2a", ""},
	} {
		if got := str(m.Gateways(tc.network, tc.cluster)); got != tc.want {
			t.Errorf("Gateways(%s, %s) = %s, want %s", tc.network, tc.cluster, got, tc.want)
		}
	}
	// Groups of 4 (n2), 3 (n2/c2a), 1 (n2/c2b): lcm 12.
	if m.ScaleFactor() != 12 {
		t.Errorf("scale factor = %d, want 12", m.ScaleFactor())
	}
}

// TestRegistryServiceNameGateway: the gateway is the service's external
// address in the from_registry cluster (its VIP when it has none), and
// follows the service as it changes.
func TestRegistryServiceNameGateway(t *testing.T) {
	const ew = "istio-eastwestgateway.istio-system.svc.cluster.local"
	w := newWorld(t)
	gwService := func(cluster string, external []string, vips []string) *registryv1.Service {
		s := &registryv1.Service{Hostname: ew, Namespace: "istio-system", Ports: []*registryv1.Port{{Name: "tls", Number: 15443}}}
		if len(external) > 0 {
			s.ExternalAddresses = []*registryv1.ClusterAddresses{{Cluster: cluster, Addresses: external}}
		}
		if len(vips) > 0 {
			s.Vips = []*registryv1.ClusterAddresses{{Cluster: cluster, Addresses: vips}}
		}
		return s
	}
	w.add(instance{plugin: "kube1", cluster: "cluster1", services: []*registryv1.Service{gwService("cluster1", []string{"34.1.1.1"}, []string{"10.96.0.20"})}})
	// The same name in a cluster of another network is not network1's.
	w.add(instance{plugin: "kube2", cluster: "cluster2", services: []*registryv1.Service{gwService("cluster2", []string{"35.2.2.2"}, nil)}})
	m := w.manager(fmt.Sprintf(`
  network "network1" {
    endpoints { from_registry = "cluster1" }
    gateway {
      registry_service_name = %q
      port                  = 15443
    }
  }
`, ew))
	var pushes atomic.Int64
	m.Subscribe(func(c replica.Change) {
		if c.Full {
			pushes.Add(1)
		}
	})
	want := func(what string, addrs ...string) {
		t.Helper()
		var got []string
		for _, g := range m.AllGateways() {
			if g.Network != "network1" || g.Cluster != "cluster1" {
				t.Errorf("%s: gateway %+v is not network1/cluster1", what, g)
			}
			got = append(got, g.String())
		}
		if !slices.Equal(got, addrs) {
			t.Errorf("%s: gateways %v, want %v", what, got, addrs)
		}
	}
	want("external address", "34.1.1.1:15443")

	gen := m.Generation()
	w.upsert("kube1", "cluster1", gwService("cluster1", []string{"34.1.1.5", "34.1.1.4"}, []string{"10.96.0.20"}))
	want("new external addresses", "34.1.1.4:15443", "34.1.1.5:15443")
	if m.Generation() == gen || pushes.Load() != 1 {
		t.Errorf("a changed gateway service: generation %d -> %d, %d pushes, want a new generation and 1 push", gen, m.Generation(), pushes.Load())
	}

	w.upsert("kube1", "cluster1", gwService("cluster1", nil, []string{"10.96.0.20"}))
	want("no external address: the VIP", "10.96.0.20:15443")

	// An unrelated service change is not a gateway change.
	gen = m.Generation()
	w.upsert("kube1", "cluster1", echoService("cluster1"))
	if m.Generation() != gen {
		t.Error("an unrelated service moved the generation")
	}

	// Without any address the network's gateway is pending: its endpoints
	// are dropped for other networks rather than sent directly.
	w.upsert("kube1", "cluster1", gwService("cluster1", nil, nil))
	want("no address at all")
	if st := m.Status(); !st.MultiNetwork || st.Pending["network1"] == "" {
		t.Errorf("network1 should be pending: multi %v pending %v", st.MultiNetwork, st.Pending)
	}
	got := render(m.Filter(xds.View{Network: "network2"}, []xds.LocalityGroup{{Locality: "r", Endpoints: []xds.LbEndpoint{
		lb("10.1.0.1", "network1", "cluster1", 0, istio), lb("10.2.0.1", "network2", "cluster2", 0, istio)}}}))
	if want := "locality=r priority=0 weight=1\n  10.2.0.1:80 w=1 net=network2 cluster=cluster2 tls=istio\n"; got != want {
		t.Errorf("node on network2 got:\n%s\nwant:\n%s", got, want)
	}
}

// TestRegistryGatewayChange: gateways a registry reports are part of the
// union; a change of them moves the generation on and requests a push.
func TestRegistryGatewayChange(t *testing.T) {
	w, m := meshWorld(t)
	var pushes atomic.Int64
	m.Subscribe(func(c replica.Change) {
		if c.Full {
			pushes.Add(1)
		}
	})
	gen := m.Generation()
	got := func() string {
		var out []string
		for _, g := range m.AllGateways() {
			out = append(out, g.Network+"/"+g.Cluster+"/"+g.String()+" from "+g.Source)
		}
		return strings.Join(out, "\n")
	}
	if want := "network1//192.168.1.1:15443 from config plugins.hcl:5:5\nnetwork2/cluster2/192.168.2.1:15443 from registry west:Static/cluster2"; got() != want {
		t.Errorf("gateways:\n%s\nwant:\n%s", got(), want)
	}
	w.setGateways("west", "cluster2", gw("network2", "cluster2", "192.168.2.7", 15443))
	if !strings.Contains(got(), "192.168.2.7:15443") || m.Generation() == gen || pushes.Load() != 1 {
		t.Errorf("after the registry's change: gateways\n%s\ngeneration %d (was %d), %d pushes", got(), m.Generation(), gen, pushes.Load())
	}
	// Re-applying an equal config is no change.
	gen = m.Generation()
	m.Apply(m.Config())
	if m.Generation() != gen || pushes.Load() != 1 {
		t.Error("re-applying the same config moved the generation or pushed")
	}
}

// TestNetworkz checks /debug/networkz: the overview, which rule placed an
// endpoint, and the explanation of a cluster for a view.
func TestNetworkz(t *testing.T) {
	_, m := meshWorld(t)
	srv := httptest.NewServer(m.Handler(nil))
	defer srv.Close()
	get := func(path string, v any) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s", path, resp.Status)
		}
		if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
			t.Fatal(err)
		}
	}
	var st struct {
		MultiNetwork bool     `json:"multi_network"`
		ScaleFactor  uint32   `json:"scale_factor"`
		Precedence   []string `json:"precedence"`
		Gateways     []struct{ Address, Source string }
		Networks     []struct{ Name string }
	}
	get("/debug/networkz", &st)
	if !st.MultiNetwork || st.ScaleFactor != 1 || len(st.Gateways) != 2 || len(st.Networks) != 2 || len(st.Precedence) != 4 {
		t.Errorf("networkz = %+v", st)
	}

	var origins []struct {
		Hostname string
		Network  string
		Rule     string
	}
	for addr, want := range map[string]string{
		"10.1.0.1": "network1 3: from_registry",
		"10.1.0.9": "network2 1: the endpoint's own network",
		"10.2.0.3": "network2 2: the registry's default network",
		"10.3.0.1": "network3 4: from_cidr",
		"10.7.0.1": " none: no rule matched, the network is unknown",
	} {
		get("/debug/networkz?endpoint="+addr, &origins)
		if len(origins) != 1 || origins[0].Network+" "+origins[0].Rule != want || origins[0].Hostname != echo {
			t.Errorf("endpoint %s: %+v, want %q", addr, origins, want)
		}
	}

	var ex network.Explanation
	get("/debug/networkz?explain="+xds.ClusterName(8080, "", echo)+"&network=network1", &ex)
	var got []string
	for _, e := range ex.Endpoints {
		got = append(got, fmt.Sprintf("%s %s/%s %s [%s] %s", e.Endpoint, e.Instance.Cluster, e.Network, e.Rule, e.Arithmetic, e.Decision))
	}
	want := []string{
		"10.1.0.1:8080 cluster1/network1 3: from_registry [weight unset → scale factor 1] kept: on the node's network",
		"10.1.0.9:8080 cluster1/network2 1: the endpoint's own network [weight unset → scale factor 1; 1 / 1 gateways (its network's) = 1 to each] replaced by gateways",
		"10.2.0.1:8080 cluster2/network2 2: the registry's default network [weight unset → scale factor 1; 1 / 1 gateways (its network and cluster's) = 1 to each] replaced by gateways",
		"10.2.0.2:8080 cluster2/network2 2: the registry's default network [weight unset → scale factor 1; 1 / 1 gateways (its network and cluster's) = 1 to each] replaced by gateways",
		"10.2.0.3:8080 cluster2/network2 2: the registry's default network [weight unset → scale factor 1] dropped: on another network and not in Istio mTLS mode, which a gateway requires",
		"10.3.0.1:8080 vms/network3 4: from_cidr [weight unset → scale factor 1] kept: its network has no gateway",
		"10.7.0.1:8080 vms/ none: no rule matched, the network is unknown [weight unset → scale factor 1] kept: on the node's network",
	}
	if !slices.Equal(got, want) {
		t.Errorf("explained endpoints:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	got = nil
	for _, r := range ex.Result {
		got = append(got, fmt.Sprintf("%s w=%d gateway=%v %s", r.Endpoint, r.Weight, r.Gateway, r.Arithmetic))
	}
	want = []string{
		"10.1.0.1:8080 w=1 gateway=false as the endpoint",
		"10.3.0.1:8080 w=1 gateway=false as the endpoint",
		"10.7.0.1:8080 w=1 gateway=false as the endpoint",
		"192.168.2.1:15443 w=3 gateway=true 1 (10.1.0.9:8080) + 1 (10.2.0.1:8080) + 1 (10.2.0.2:8080) = 3",
	}
	if !slices.Equal(got, want) {
		t.Errorf("explained result:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	resp, err := http.Get(srv.URL + "/debug/networkz?explain=outbound|9999||" + echo)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("explain of a missing port: %s", resp.Status)
	}
}

// TestChangesGoOnAfterRecomputation: the manager is the stage between the
// aggregate and the xDS server. Its subscriber gets every registry change
// only once the gateways are recomputed for it, widened to Full when they
// moved and as it was when they did not; its own changes go on as Full.
func TestChangesGoOnAfterRecomputation(t *testing.T) {
	const ew = "istio-eastwestgateway.istio-system.svc.cluster.local"
	gwService := func(port uint32, external string) *registryv1.Service {
		return &registryv1.Service{Hostname: ew, Namespace: "istio-system", Ports: []*registryv1.Port{{Name: "tls", Number: port}},
			ExternalAddresses: []*registryv1.ClusterAddresses{{Cluster: "cluster1", Addresses: []string{external}}}}
	}
	w := newWorld(t)
	w.add(instance{plugin: "kube1", cluster: "cluster1", services: []*registryv1.Service{gwService(15443, "34.1.1.1"), echoService("cluster1")}})
	withGateway := fmt.Sprintf(`
  network "network1" {
    endpoints { from_registry = "cluster1" }
    gateway {
      registry_service_name = %q
      port                  = 15443
    }
  }
`, ew)
	m := w.manager(withGateway)

	// What the subscriber saw: the change, and the gateways at that moment.
	var seen []string
	m.Subscribe(func(c replica.Change) {
		seen = append(seen, fmt.Sprintf("full=%v services=%v gateways=%v", c.Full, slices.Sorted(maps.Keys(c.Services)), gatewayAddrs(m)))
	})
	step := func(what, want string, do func()) {
		t.Helper()
		seen = nil
		do()
		if got := strings.Join(seen, "\n"); got != want {
			t.Errorf("%s: the subscriber saw\n%s\nwant\n%s", what, got, want)
		}
	}
	step("the gateway service moved", "full=true services=["+ew+"] gateways=[34.1.1.2:15443]", func() {
		w.upsert("kube1", "cluster1", gwService(15443, "34.1.1.2"))
	})
	step("the gateway service changed, its gateway did not", "full=false services=["+ew+"] gateways=[34.1.1.2:15443]", func() {
		w.upsert("kube1", "cluster1", gwService(15444, "34.1.1.2"))
	})
	step("an unrelated service changed", "full=false services=["+echo+"] gateways=[34.1.1.2:15443]", func() {
		w.upsert("kube1", "cluster1", echoService("cluster1", "10.96.0.1"))
	})
	step("the config dropped the gateway", "full=true services=[] gateways=[]", func() {
		m.Apply(decodeHCL(t, `
  network "network1" {
    endpoints { from_registry = "cluster1" }
  }
`))
	})
	step("the same config again", "", func() {
		m.Apply(m.Config())
	})
}
