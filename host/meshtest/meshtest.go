// Package meshtest builds a mesh for tests the way the host builds one: a
// replica fed with protocol messages as plugins feed it, the aggregate
// registry over it, and networks decoded from plugins.hcl text. Tests of
// the network manager, the endpoint pipeline and xDS share it, so each of
// them sees the data the others see.
package meshtest

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"

	"github.com/estuary-mesh/estuary/host/aggregate"
	"github.com/estuary-mesh/estuary/host/config"
	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/host/network"
	"github.com/estuary-mesh/estuary/host/replica"
	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
	"github.com/estuary-mesh/estuary/sdk"
)

// World is a replica and its aggregate, fed one session per plugin.
type World struct {
	Store *replica.Store
	Agg   *aggregate.Registry

	tb   testing.TB
	sess map[string]*replica.Session
	seq  map[string]uint64
}

// New returns an empty world.
func New(tb testing.TB) *World {
	store := replica.NewStore(nil)
	return &World{tb: tb, Store: store, Agg: aggregate.New(store, nil), sess: map[string]*replica.Session{}, seq: map[string]uint64{}}
}

// Instance describes one instance of a plugin, of provider Static.
type Instance struct {
	Plugin, Cluster string
	DefaultNetwork  string
	Services        []*registryv1.Service
	Endpoints       map[string][]*registryv1.Endpoint // by hostname
	Gateways        []*registryv1.NetworkGateway
}

// Apply sends events as one response of plugin's stream: the first is
// its snapshot.
func (w *World) Apply(plugin string, events ...*registryv1.Event) {
	w.tb.Helper()
	sess := w.sess[plugin]
	snapshot := sess == nil
	if snapshot {
		sess = w.Store.NewSession(plugin)
		w.sess[plugin] = sess
	}
	w.seq[plugin]++
	resp := &registryv1.WatchResponse{Sequence: w.seq[plugin], Snapshot: snapshot, SnapshotDone: snapshot, Events: events}
	if err := sess.Apply(resp); err != nil {
		w.tb.Fatal(err)
	}
}

// Add starts a plugin with one instance.
func (w *World) Add(in Instance) {
	w.tb.Helper()
	id := &registryv1.InstanceID{Provider: "Static", Cluster: in.Cluster}
	ev := func(k any) *registryv1.Event { return Event(id, k) }
	evs := []*registryv1.Event{ev(&registryv1.InstanceAdded{Properties: &registryv1.InstanceProperties{DefaultNetwork: in.DefaultNetwork}})}
	for _, s := range in.Services {
		evs = append(evs, ev(&registryv1.ServiceUpserted{Service: s}))
	}
	hosts := make([]string, 0, len(in.Endpoints))
	for h := range in.Endpoints {
		hosts = append(hosts, h)
	}
	slices.Sort(hosts)
	for _, h := range hosts {
		evs = append(evs, ev(&registryv1.EndpointsReplaced{Hostname: h, Endpoints: in.Endpoints[h]}))
	}
	if len(in.Gateways) > 0 {
		evs = append(evs, ev(&registryv1.GatewaysReplaced{Gateways: in.Gateways}))
	}
	evs = append(evs, ev(&registryv1.InstanceSynced{}))
	w.Apply(in.Plugin, evs...)
}

// SetGateways replaces the gateways a plugin's instance reports.
func (w *World) SetGateways(plugin, cluster string, gws ...*registryv1.NetworkGateway) {
	w.tb.Helper()
	w.Apply(plugin, &registryv1.Event{Instance: &registryv1.InstanceID{Provider: "Static", Cluster: cluster},
		Kind: &registryv1.Event_GatewaysReplaced{GatewaysReplaced: &registryv1.GatewaysReplaced{Gateways: gws}}})
}

// Upsert replaces a service of a plugin's instance.
func (w *World) Upsert(plugin, cluster string, svc *registryv1.Service) {
	w.tb.Helper()
	w.Apply(plugin, &registryv1.Event{Instance: &registryv1.InstanceID{Provider: "Static", Cluster: cluster},
		Kind: &registryv1.Event_ServiceUpserted{ServiceUpserted: &registryv1.ServiceUpserted{Service: svc}}})
}

// SetEndpoints replaces the endpoints of a service of a plugin's instance.
func (w *World) SetEndpoints(plugin, cluster, hostname string, eps ...*registryv1.Endpoint) {
	w.tb.Helper()
	w.Apply(plugin, &registryv1.Event{Instance: &registryv1.InstanceID{Provider: "Static", Cluster: cluster},
		Kind: &registryv1.Event_EndpointsReplaced{EndpointsReplaced: &registryv1.EndpointsReplaced{Hostname: hostname, Endpoints: eps}}})
}

// Event wraps one event message (InstanceAdded, ServiceUpserted,
// EndpointsReplaced, GatewaysReplaced or InstanceSynced) for instance id.
func Event(id *registryv1.InstanceID, kind any) *registryv1.Event {
	e := &registryv1.Event{Instance: id}
	switch k := kind.(type) {
	case *registryv1.InstanceAdded:
		e.Kind = &registryv1.Event_InstanceAdded{InstanceAdded: k}
	case *registryv1.ServiceUpserted:
		e.Kind = &registryv1.Event_ServiceUpserted{ServiceUpserted: k}
	case *registryv1.EndpointsReplaced:
		e.Kind = &registryv1.Event_EndpointsReplaced{EndpointsReplaced: k}
	case *registryv1.GatewaysReplaced:
		e.Kind = &registryv1.Event_GatewaysReplaced{GatewaysReplaced: k}
	case *registryv1.InstanceSynced:
		e.Kind = &registryv1.Event_InstanceSynced{InstanceSynced: k}
	default:
		panic(fmt.Sprintf("meshtest: no event for %T", kind))
	}
	return e
}

// Gateway is a gateway as a registry reports it.
func Gateway(network, cluster, addr string, port uint32) *registryv1.NetworkGateway {
	return &registryv1.NetworkGateway{Network: network, Cluster: cluster, Address: addr, Port: port}
}

// Manager starts a network manager over the world with the body of a
// networks block. It resolves no DNS name until a test runs it.
func (w *World) Manager(networksHCL string) *network.Manager {
	w.tb.Helper()
	m := network.New(w.Agg, hclog.NewNullLogger(), network.Options{ResolvConf: "/nonexistent"})
	m.Apply(Networks(w.tb, networksHCL))
	return m
}

// Networks decodes the body of a networks block and fails on any error.
func Networks(tb testing.TB, body string) *network.Config {
	tb.Helper()
	cfg, diags := ParseNetworks(body)
	if diags.HasErrors() {
		tb.Fatalf("networks config:\n%s", config.Format(diags))
	}
	return cfg
}

// ParseNetworks decodes `networks { BODY }` written in plugins.hcl.
func ParseNetworks(body string) (*network.Config, hcl.Diagnostics) {
	src := "networks {\n" + body + "\n}\n"
	f, diags := hclparse.NewParser().ParseHCL([]byte(src), "plugins.hcl")
	if diags.HasErrors() {
		return nil, diags
	}
	content, diags := f.Body.Content(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{{Type: "networks"}}})
	if diags.HasErrors() {
		return nil, diags
	}
	return network.Decode(content.Blocks[0].Body, "plugins.hcl")
}

// Render prints locality groups one line per group and per endpoint, for
// comparing what a view receives with what a test worked out by hand.
func Render(groups []model.LocalityGroup) string {
	var b strings.Builder
	for _, g := range groups {
		fmt.Fprintf(&b, "locality=%s priority=%d weight=%d\n", g.Locality, g.Priority, g.Weight)
		for _, e := range g.Endpoints {
			fmt.Fprintf(&b, "  %s:%d w=%d net=%s cluster=%s tls=%s", e.Address, e.Port, e.Weight, e.Network, e.Cluster, e.TLSMode)
			if e.Health != sdk.HealthHealthy {
				fmt.Fprintf(&b, " health=%s", e.Health)
			}
			if len(e.AdditionalAddresses) > 0 {
				fmt.Fprintf(&b, " also=%s", strings.Join(e.AdditionalAddresses, ","))
			}
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// Echo is the service the fixtures serve.
const Echo = "echo.default.svc.cluster.local"

// EchoService is Echo with one port, grpc 8080, and VIPs in cluster.
func EchoService(cluster string, vips ...string) *registryv1.Service {
	s := &registryv1.Service{Hostname: Echo, Namespace: "default", Ports: []*registryv1.Port{{Name: "grpc", Number: 8080, Protocol: "GRPC"}}}
	if len(vips) > 0 {
		s.Vips = []*registryv1.ClusterAddresses{{Cluster: cluster, Addresses: vips}}
	}
	return s
}

// Endpoint is an endpoint in us-east1/us-east1-b with its own network, if
// any, in Istio mTLS mode if tls.
func Endpoint(addr, network string, tls bool) *registryv1.Endpoint {
	e := &registryv1.Endpoint{Address: addr, Network: network, Locality: "us-east1/us-east1-b"}
	if tls {
		e.TlsMode = registryv1.TLSMode_TLS_MODE_ISTIO
	}
	return e
}

// ThreeNetworks is a small mesh on three networks, each endpoint placed on its
// network by a different rule:
//
//	east (cluster1, no default network): 10.1.0.1 by from_registry (3),
//	    10.1.0.9 by its own network label "network2" (1)
//	west (cluster2, default network2): 10.2.0.1, 10.2.0.2 (mTLS) and
//	    10.2.0.3 (plain text) by the registry default (2); it reports the
//	    gateway 192.168.2.1:15443 of network2 in cluster2
//	vms  (cluster vms): 10.3.0.1 by from_cidr (4), network3 has no gateway
//	     10.7.0.1 matches nothing: unknown network
func ThreeNetworks(tb testing.TB) (*World, *network.Manager) {
	w := New(tb)
	w.Add(Instance{Plugin: "east", Cluster: "cluster1", Services: []*registryv1.Service{EchoService("cluster1")},
		Endpoints: map[string][]*registryv1.Endpoint{Echo: {Endpoint("10.1.0.1", "", true), Endpoint("10.1.0.9", "network2", true)}}})
	w.Add(Instance{Plugin: "west", Cluster: "cluster2", DefaultNetwork: "network2", Services: []*registryv1.Service{EchoService("cluster2")},
		Endpoints: map[string][]*registryv1.Endpoint{Echo: {Endpoint("10.2.0.1", "", true), Endpoint("10.2.0.2", "", true), Endpoint("10.2.0.3", "", false)}},
		Gateways:  []*registryv1.NetworkGateway{Gateway("network2", "cluster2", "192.168.2.1", 15443)}})
	w.Add(Instance{Plugin: "vms", Cluster: "vms", Services: []*registryv1.Service{EchoService("vms")},
		Endpoints: map[string][]*registryv1.Endpoint{Echo: {Endpoint("10.3.0.1", "", true), Endpoint("10.7.0.1", "", true)}}})
	m := w.Manager(`
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
