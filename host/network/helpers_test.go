package network_test

import (
	"slices"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
	"go.uber.org/goleak"

	"github.com/estuary-mesh/estuary/host/aggregate"
	"github.com/estuary-mesh/estuary/host/config"
	"github.com/estuary-mesh/estuary/host/network"
	"github.com/estuary-mesh/estuary/host/replica"
	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// world is a replica fed the way plugins feed it: one session per plugin,
// protocol messages in.
type world struct {
	tb    testing.TB
	store *replica.Store
	agg   *aggregate.Registry
	sess  map[string]*replica.Session
	seq   map[string]uint64
}

func newWorld(tb testing.TB) *world {
	store := replica.NewStore(nil)
	return &world{tb: tb, store: store, agg: aggregate.New(store, nil), sess: map[string]*replica.Session{}, seq: map[string]uint64{}}
}

// instance describes one instance of a plugin.
type instance struct {
	plugin, cluster string
	defaultNetwork  string
	services        []*registryv1.Service
	endpoints       map[string][]*registryv1.Endpoint
	gateways        []*registryv1.NetworkGateway
}

func (w *world) apply(plugin string, events ...*registryv1.Event) {
	w.tb.Helper()
	sess := w.sess[plugin]
	snapshot := sess == nil
	if snapshot {
		sess = w.store.NewSession(plugin)
		w.sess[plugin] = sess
	}
	w.seq[plugin]++
	resp := &registryv1.WatchResponse{Sequence: w.seq[plugin], Snapshot: snapshot, SnapshotDone: snapshot, Events: events}
	if err := sess.Apply(resp); err != nil {
		w.tb.Fatal(err)
	}
}

// add starts a plugin with one instance.
func (w *world) add(in instance) {
	w.tb.Helper()
	id := &registryv1.InstanceID{Provider: "Static", Cluster: in.cluster}
	ev := func(k any) *registryv1.Event {
		e := &registryv1.Event{Instance: id}
		switch k := k.(type) {
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
		}
		return e
	}
	evs := []*registryv1.Event{ev(&registryv1.InstanceAdded{Properties: &registryv1.InstanceProperties{DefaultNetwork: in.defaultNetwork}})}
	for _, s := range in.services {
		evs = append(evs, ev(&registryv1.ServiceUpserted{Service: s}))
	}
	hosts := make([]string, 0, len(in.endpoints))
	for h := range in.endpoints {
		hosts = append(hosts, h)
	}
	slices.Sort(hosts)
	for _, h := range hosts {
		evs = append(evs, ev(&registryv1.EndpointsReplaced{Hostname: h, Endpoints: in.endpoints[h]}))
	}
	if len(in.gateways) > 0 {
		evs = append(evs, ev(&registryv1.GatewaysReplaced{Gateways: in.gateways}))
	}
	evs = append(evs, ev(&registryv1.InstanceSynced{}))
	w.apply(in.plugin, evs...)
}

// setGateways replaces the gateways a plugin's instance reports.
func (w *world) setGateways(plugin, cluster string, gws ...*registryv1.NetworkGateway) {
	w.tb.Helper()
	w.apply(plugin, &registryv1.Event{Instance: &registryv1.InstanceID{Provider: "Static", Cluster: cluster},
		Kind: &registryv1.Event_GatewaysReplaced{GatewaysReplaced: &registryv1.GatewaysReplaced{Gateways: gws}}})
}

// upsert replaces a service of a plugin's instance.
func (w *world) upsert(plugin, cluster string, svc *registryv1.Service) {
	w.tb.Helper()
	w.apply(plugin, &registryv1.Event{Instance: &registryv1.InstanceID{Provider: "Static", Cluster: cluster},
		Kind: &registryv1.Event_ServiceUpserted{ServiceUpserted: &registryv1.ServiceUpserted{Service: svc}}})
}

func gw(network, cluster, addr string, port uint32) *registryv1.NetworkGateway {
	return &registryv1.NetworkGateway{Network: network, Cluster: cluster, Address: addr, Port: port}
}

// manager starts a network manager over the world with a networks block.
func (w *world) manager(networksHCL string) *network.Manager {
	w.tb.Helper()
	m := network.New(w.agg, hclog.NewNullLogger(), network.Options{ResolvConf: "/nonexistent"})
	m.Apply(decodeHCL(w.tb, networksHCL))
	return m
}

// decodeHCL decodes the body of a networks block and fails on any error.
func decodeHCL(tb testing.TB, body string) *network.Config {
	tb.Helper()
	cfg, diags := parseNetworks(body)
	if diags.HasErrors() {
		tb.Fatalf("networks config:\n%s", config.Format(diags))
	}
	return cfg
}

// parseNetworks decodes `networks { BODY }` written in plugins.hcl.
func parseNetworks(body string) (*network.Config, hcl.Diagnostics) {
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
