package network_test

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/estuary-mesh/estuary/host/meshtest"
	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/host/network"
	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
)

const echo = meshtest.Echo

var (
	echoService = meshtest.EchoService
	ep          = meshtest.Endpoint
	meshWorld   = meshtest.ThreeNetworks
)

// TestGatewaysForNetworkAndCluster: the gateways of (network, cluster),
// else of the network, sorted by address then port.
func TestGatewaysForNetworkAndCluster(t *testing.T) {
	w := meshtest.New(t)
	w.Add(meshtest.Instance{Plugin: "a", Cluster: "c2a", Gateways: []*registryv1.NetworkGateway{
		meshtest.Gateway("n2", "c2a", "10.0.0.10", 15443), meshtest.Gateway("n2", "c2a", "10.0.0.9", 15443), meshtest.Gateway("n2", "c2a", "10.0.0.9", 443)}})
	w.Add(meshtest.Instance{Plugin: "b", Cluster: "c2b", Gateways: []*registryv1.NetworkGateway{meshtest.Gateway("n2", "c2b", "10.0.0.1", 15443)}})
	m := w.Manager("")
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
	w := meshtest.New(t)
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
	w.Add(meshtest.Instance{Plugin: "kube1", Cluster: "cluster1", Services: []*registryv1.Service{gwService("cluster1", []string{"34.1.1.1"}, []string{"10.96.0.20"})}})
	// The same name in a cluster of another network is not network1's.
	w.Add(meshtest.Instance{Plugin: "kube2", Cluster: "cluster2", Services: []*registryv1.Service{gwService("cluster2", []string{"35.2.2.2"}, nil)}})
	m := w.Manager(fmt.Sprintf(`
  network "network1" {
    endpoints { from_registry = "cluster1" }
    gateway {
      registry_service_name = %q
      port                  = 15443
    }
  }
`, ew))
	var pushes atomic.Int64
	m.Subscribe(func(c model.Change) {
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
	w.Upsert("kube1", "cluster1", gwService("cluster1", []string{"34.1.1.5", "34.1.1.4"}, []string{"10.96.0.20"}))
	want("new external addresses", "34.1.1.4:15443", "34.1.1.5:15443")
	if m.Generation() == gen || pushes.Load() != 1 {
		t.Errorf("a changed gateway service: generation %d -> %d, %d pushes, want a new generation and 1 push", gen, m.Generation(), pushes.Load())
	}

	w.Upsert("kube1", "cluster1", gwService("cluster1", nil, []string{"10.96.0.20"}))
	want("no external address: the VIP", "10.96.0.20:15443")

	// An unrelated service change is not a gateway change.
	gen = m.Generation()
	w.Upsert("kube1", "cluster1", echoService("cluster1"))
	if m.Generation() != gen {
		t.Error("an unrelated service moved the generation")
	}

	// Without any address the network's gateway is pending: its endpoints
	// are dropped for other networks rather than sent directly.
	w.Upsert("kube1", "cluster1", gwService("cluster1", nil, nil))
	want("no address at all")
	if st := m.Status(); !st.MultiNetwork || st.Pending["network1"] == "" {
		t.Errorf("network1 should be pending: multi %v pending %v", st.MultiNetwork, st.Pending)
	}
	w.SetEndpoints("kube1", "cluster1", echo, ep("10.1.0.1", "", true))
	w.Upsert("kube2", "cluster2", echoService("cluster2"))
	w.SetEndpoints("kube2", "cluster2", echo, ep("10.2.0.1", "network2", true))
	got := received(t, w, m, model.View{Network: "network2"})
	if want := "locality=us-east1/us-east1-b priority=0 weight=1\n  10.2.0.1:8080 w=1 net=network2 cluster=cluster2 tls=istio\n"; got != want {
		t.Errorf("node on network2 got:\n%s\nwant:\n%s", got, want)
	}
}

// TestRegistryGatewayChange: gateways a registry reports are part of the
// union; a change of them moves the generation on and requests a push.
func TestRegistryGatewayChange(t *testing.T) {
	w, m := meshWorld(t)
	var pushes atomic.Int64
	m.Subscribe(func(c model.Change) {
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
	w.SetGateways("west", "cluster2", meshtest.Gateway("network2", "cluster2", "192.168.2.7", 15443))
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
