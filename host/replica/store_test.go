package replica_test

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/host/replica"
	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/pluginclient"
	"github.com/estuary-mesh/estuary/sdk/protoconv"
)

// --- hand-built protocol messages ---

func id(cluster string) *registryv1.InstanceID {
	return &registryv1.InstanceID{Provider: "Static", Cluster: cluster}
}

func added(cluster string, props *registryv1.InstanceProperties) *registryv1.Event {
	return &registryv1.Event{Instance: id(cluster), Kind: &registryv1.Event_InstanceAdded{InstanceAdded: &registryv1.InstanceAdded{Properties: props}}}
}

func removed(cluster string) *registryv1.Event {
	return &registryv1.Event{Instance: id(cluster), Kind: &registryv1.Event_InstanceRemoved{InstanceRemoved: &registryv1.InstanceRemoved{}}}
}

func upsert(cluster, host string, port uint32) *registryv1.Event {
	return &registryv1.Event{Instance: id(cluster), Kind: &registryv1.Event_ServiceUpserted{ServiceUpserted: &registryv1.ServiceUpserted{
		Service: &registryv1.Service{Hostname: host, Namespace: "default", Ports: []*registryv1.Port{{Name: "http", Number: port, Protocol: "HTTP"}}},
	}}}
}

func deleted(cluster, host string) *registryv1.Event {
	return &registryv1.Event{Instance: id(cluster), Kind: &registryv1.Event_ServiceDeleted{ServiceDeleted: &registryv1.ServiceDeleted{Hostname: host}}}
}

func endpoints(cluster, host string, addrs ...string) *registryv1.Event {
	m := &registryv1.EndpointsReplaced{Hostname: host}
	for _, a := range addrs {
		m.Endpoints = append(m.Endpoints, &registryv1.Endpoint{Address: a})
	}
	return replaced(cluster, m)
}

func replaced(cluster string, m *registryv1.EndpointsReplaced) *registryv1.Event {
	return &registryv1.Event{Instance: id(cluster), Kind: &registryv1.Event_EndpointsReplaced{EndpointsReplaced: m}}
}

func gateways(cluster string, addrs ...string) *registryv1.Event {
	g := &registryv1.GatewaysReplaced{}
	for _, a := range addrs {
		g.Gateways = append(g.Gateways, &registryv1.NetworkGateway{Network: "n1", Cluster: cluster, Address: a, Port: 15443})
	}
	return &registryv1.Event{Instance: id(cluster), Kind: &registryv1.Event_GatewaysReplaced{GatewaysReplaced: g}}
}

func synced(cluster string) *registryv1.Event {
	return &registryv1.Event{Instance: id(cluster), Kind: &registryv1.Event_InstanceSynced{InstanceSynced: &registryv1.InstanceSynced{}}}
}

func health(cluster string, ok bool, msg string) *registryv1.Event {
	return &registryv1.Event{Instance: id(cluster), Kind: &registryv1.Event_InstanceHealth{InstanceHealth: &registryv1.InstanceHealth{Healthy: ok, Message: msg}}}
}

// stream numbers responses and applies them to one session.
type stream struct {
	sess *replica.Session
	seq  uint64
}

func connect(s *replica.Store, plugin string) *stream { return &stream{sess: s.NewSession(plugin)} }

func (st *stream) send(snapshot, done bool, evs ...*registryv1.Event) error {
	st.seq++
	return st.sess.Apply(&registryv1.WatchResponse{Sequence: st.seq, Snapshot: snapshot, SnapshotDone: done, Events: evs})
}

// snapshot sends one snapshot response; done closes the snapshot.
func (st *stream) snapshot(t *testing.T, done bool, evs ...*registryv1.Event) {
	t.Helper()
	if err := st.send(true, done, evs...); err != nil {
		t.Fatalf("snapshot response %d: %v", st.seq, err)
	}
}

func (st *stream) delta(t *testing.T, evs ...*registryv1.Event) {
	t.Helper()
	if err := st.send(false, false, evs...); err != nil {
		t.Fatalf("delta response %d: %v", st.seq, err)
	}
}

func key(plugin, cluster string) replica.InstanceKey {
	return replica.InstanceKey{Plugin: plugin, Provider: "Static", Cluster: cluster}
}

func addrs(set *replica.EndpointSet) string {
	if set == nil {
		return "<nil>"
	}
	var out []string
	for _, e := range set.Endpoints {
		out = append(out, e.Address)
	}
	return strings.Join(out, " ")
}

func hostnames(in *replica.Instance) []string {
	var out []string
	for _, s := range in.Services() {
		out = append(out, s.Hostname)
	}
	return out
}

func TestSnapshotBuildsInstances(t *testing.T) {
	s := replica.NewStore(nil)
	st := connect(s, "static")
	st.snapshot(t, false,
		added("c1", &registryv1.InstanceProperties{ClusterScoped: true, DefaultNetwork: "n1", SyncTimeoutMillis: 1500}),
		health("c1", true, "connected"),
		upsert("c1", "b.example.com", 80),
		upsert("c1", "a.example.com", 8080),
	)
	if st.sess.SnapshotDone() {
		t.Fatalf("snapshot done before snapshot_done")
	}
	st.snapshot(t, true,
		endpoints("c1", "a.example.com", "10.0.0.1", "10.0.0.2"),
		gateways("c1", "1.1.1.1"),
		synced("c1"),
		added("c2", nil),
	)
	if !st.sess.SnapshotDone() {
		t.Fatalf("snapshot not done after snapshot_done")
	}

	in := s.Instance(key("static", "c1"))
	if in == nil {
		t.Fatalf("instance c1 missing")
	}
	if want := (sdk.InstanceProperties{ClusterScoped: true, DefaultNetwork: "n1", SyncTimeout: 1500 * time.Millisecond}); in.Properties() != want {
		t.Errorf("properties = %+v, want %+v", in.Properties(), want)
	}
	if got := hostnames(in); !slices.Equal(got, []string{"a.example.com", "b.example.com"}) {
		t.Errorf("services = %v", got)
	}
	if svc := in.Service("a.example.com"); svc == nil || !slices.Equal(svc.Ports, []sdk.Port{{Name: "http", Number: 8080, Protocol: "HTTP"}}) {
		t.Errorf("service a = %+v", svc)
	}
	if got := addrs(in.Endpoints("a.example.com")); got != "10.0.0.1 10.0.0.2" {
		t.Errorf("endpoints of a = %s", got)
	}
	if got := in.Endpoints("b.example.com"); got != nil {
		t.Errorf("endpoints of b = %v, want none", got)
	}
	if got := in.Gateways(); len(got) != 1 || got[0] != (sdk.NetworkGateway{Network: "n1", Cluster: "c1", Address: "1.1.1.1", Port: 15443}) {
		t.Errorf("gateways = %+v", got)
	}
	st1 := in.Status()
	if !st1.Synced || st1.Stale || st1.Resyncing || st1.Services != 2 || st1.Endpoints != 2 || st1.Gateways != 1 ||
		st1.Events != 6 || st1.Health == nil || st1.Health.Message != "connected" || st1.SyncedAt.IsZero() || st1.SyncTimeout != 1500*time.Millisecond {
		t.Errorf("status = %+v", st1)
	}
	c2 := s.Instance(key("static", "c2"))
	if c2 == nil || c2.Status().Synced {
		t.Errorf("c2 = %v, want present and not synced", c2)
	}
	var keys []replica.InstanceKey
	for _, in := range s.Instances() {
		keys = append(keys, in.Key)
	}
	if !slices.Equal(keys, []replica.InstanceKey{key("static", "c1"), key("static", "c2")}) {
		t.Errorf("instances = %v", keys)
	}
}

// TestBadBatchAppliesNothing: a batch that breaks the protocol anywhere
// is refused whole. Its good events before the bad one change nothing and
// publish nothing, and the error names the offending event.
func TestBadBatchAppliesNothing(t *testing.T) {
	outOfRange := replaced("c1", &registryv1.EndpointsReplaced{Hostname: "a.example.com", Strings: []string{"n1"},
		Endpoints: []*registryv1.Endpoint{{Address: "10.0.0.7", NetworkRef: 2}}})
	tests := []struct {
		name string
		bad  *registryv1.Event
		want string
	}{
		{"string reference out of range", outOfRange,
			`protocol error in batch 2, event 5 (endpoints_replaced, instance "Static/c1"): endpoint 0 (10.0.0.7): network_ref 2 is out of range: the event has 1 strings`},
		{"endpoints of an unknown service", endpoints("c1", "z.example.com", "10.0.0.8"),
			`protocol error in batch 2, event 5 (endpoints_replaced, instance "Static/c1"): endpoints for service "z.example.com", which the instance has not upserted`},
		{"event of an instance never added", synced("c9"),
			`protocol error in batch 2, event 5 (instance_synced, instance "Static/c9"): the instance was never added, or was removed`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := replica.NewStore(nil)
			st := connect(s, "static")
			st.snapshot(t, true, added("c1", nil), upsert("c1", "a.example.com", 80), endpoints("c1", "a.example.com", "10.0.0.1"),
				gateways("c1", "1.1.1.1"), synced("c1"))
			in := s.Instance(key("static", "c1"))
			before := in.Status()
			var published []model.Change
			s.Subscribe(func(c model.Change) { published = append(published, c) })

			err := st.send(false, false,
				upsert("c1", "b.example.com", 80), endpoints("c1", "a.example.com", "10.0.0.2"), gateways("c1", "2.2.2.2"),
				added("c2", nil), health("c1", false, "down"), tt.bad)
			var perr *pluginclient.ProtocolError
			if err == nil || err.Error() != tt.want || !errors.As(err, &perr) {
				t.Fatalf("error:\n got %v\nwant %s", err, tt.want)
			}
			if len(published) != 0 {
				t.Errorf("the refused batch published %+v", published)
			}
			if got := hostnames(in); !slices.Equal(got, []string{"a.example.com"}) {
				t.Errorf("services %v, want only a: b came from the refused batch", got)
			}
			if got := addrs(in.Endpoints("a.example.com")); got != "10.0.0.1" {
				t.Errorf("endpoints of a = %s, want 10.0.0.1 from before the refused batch", got)
			}
			if gws := in.Gateways(); len(gws) != 1 || gws[0].Address != "1.1.1.1" {
				t.Errorf("gateways %+v, want 1.1.1.1 from before the refused batch", gws)
			}
			if s.Instance(key("static", "c2")) != nil {
				t.Errorf("instance c2 of the refused batch was added")
			}
			if after := in.Status(); after.Events != before.Events || after.Health != nil {
				t.Errorf("status changed by the refused batch: %+v, was %+v", after, before)
			}
		})
	}
}

// TestBatchIsAtomicForReaders: a reader never sees half of a batch. Each
// batch moves both services of an instance to a new port; a reader that
// lists the services (under the instance's lock) must always find them on
// the same port.
func TestBatchIsAtomicForReaders(t *testing.T) {
	s := replica.NewStore(nil)
	st := connect(s, "static")
	st.snapshot(t, true, added("c1", nil), upsert("c1", "a.example.com", 1), upsert("c1", "b.example.com", 1), synced("c1"))
	in := s.Instance(key("static", "c1"))

	stop := make(chan struct{})
	torn := make(chan string, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			svcs := in.Services()
			if p, q := svcs[0].Ports[0].Number, svcs[1].Ports[0].Number; p != q {
				select {
				case torn <- fmt.Sprintf("a on port %d, b on port %d", p, q):
				default:
				}
				return
			}
		}
	})
	for port := uint32(2); port < 5000; port++ {
		st.delta(t, upsert("c1", "a.example.com", port), upsert("c1", "b.example.com", port))
	}
	close(stop)
	wg.Wait()
	select {
	case msg := <-torn:
		t.Errorf("a reader saw half a batch: %s", msg)
	default:
	}
}

// TestReconnectKeepsServing checks what a restarted plugin's new stream
// does: the old state is served, marked stale, until the instance syncs;
// then the new snapshot replaces it wholesale.
func TestReconnectKeepsServing(t *testing.T) {
	s := replica.NewStore(nil)
	var changes []model.Change
	var mu sync.Mutex
	s.Subscribe(func(c model.Change) { mu.Lock(); changes = append(changes, c); mu.Unlock() })
	takeChanges := func() []model.Change {
		mu.Lock()
		defer mu.Unlock()
		out := changes
		changes = nil
		return out
	}

	st := connect(s, "static")
	st.snapshot(t, true,
		added("c1", nil), added("c2", nil),
		upsert("c1", "a.example.com", 80), upsert("c1", "b.example.com", 80),
		endpoints("c1", "a.example.com", "10.0.0.1"),
		synced("c1"), synced("c2"),
	)
	k1, k2 := key("static", "c1"), key("static", "c2")
	in := s.Instance(k1)

	s.Disconnected("static")
	if st := in.Status(); !st.Stale || st.Resyncing || !st.Synced {
		t.Errorf("after disconnect: status %+v, want stale, synced, not resyncing", st)
	}
	if got := hostnames(in); !slices.Equal(got, []string{"a.example.com", "b.example.com"}) {
		t.Errorf("after disconnect: services %v, want both kept", got)
	}
	takeChanges()

	// The plugin restarts: c1 has a changed a, no b; c2 is gone.
	st2 := connect(s, "static")
	st2.snapshot(t, false, added("c1", nil), upsert("c1", "a.example.com", 81))
	st2.snapshot(t, true, endpoints("c1", "a.example.com", "10.0.0.9"))

	if s.Instance(k2) != nil {
		t.Errorf("instance c2, absent from the new snapshot, still there after snapshot_done")
	}
	if s.Instance(k1) != in {
		t.Fatalf("instance c1 was replaced, not kept")
	}
	if svc := in.Service("a.example.com"); svc == nil || svc.Ports[0].Number != 80 {
		t.Errorf("before sync: service a = %+v, want the old one (port 80)", svc)
	}
	if in.Service("b.example.com") == nil {
		t.Errorf("before sync: service b gone; want the old state served until sync")
	}
	if got := addrs(in.Endpoints("a.example.com")); got != "10.0.0.1" {
		t.Errorf("before sync: endpoints of a = %s, want the old 10.0.0.1", got)
	}
	if st := in.Status(); !st.Stale || !st.Resyncing {
		t.Errorf("before sync: status %+v, want stale and resyncing", st)
	}
	got := takeChanges()
	if len(got) != 1 || !got[0].Full || len(got[0].Services) != 0 {
		t.Errorf("before sync: changes %+v, want one Full (c2 removed) and nothing for c1's hidden state", got)
	}

	// A delta while resyncing also goes to the new state.
	st2.delta(t, upsert("c1", "c.example.com", 80))
	if in.Service("c.example.com") != nil {
		t.Errorf("delta during resync is visible before sync")
	}
	if got := takeChanges(); len(got) != 0 {
		t.Errorf("delta during resync published %+v", got)
	}

	st2.delta(t, synced("c1"))
	if svc := in.Service("a.example.com"); svc == nil || svc.Ports[0].Number != 81 {
		t.Errorf("after sync: service a = %+v, want the new one (port 81)", svc)
	}
	if got := hostnames(in); !slices.Equal(got, []string{"a.example.com", "c.example.com"}) {
		t.Errorf("after sync: services %v, want [a c]: b, absent from the new snapshot, gone", got)
	}
	if got := addrs(in.Endpoints("a.example.com")); got != "10.0.0.9" {
		t.Errorf("after sync: endpoints of a = %s", got)
	}
	if st := in.Status(); st.Stale || st.Resyncing || !st.Synced {
		t.Errorf("after sync: status %+v", st)
	}
	if got := takeChanges(); len(got) != 1 || !got[0].Full {
		t.Errorf("after sync: changes %+v, want one Full", got)
	}
}

// TestReconnectSyncedInSnapshot: a plugin whose instance is already synced
// says so inside the snapshot (as sdk.State does); the swap happens there.
func TestReconnectSyncedInSnapshot(t *testing.T) {
	s := replica.NewStore(nil)
	connect(s, "static").snapshot(t, true, added("c1", nil), upsert("c1", "a.example.com", 80), synced("c1"))
	s.Disconnected("static")
	st := connect(s, "static")
	st.snapshot(t, true, added("c1", nil), upsert("c1", "b.example.com", 80), synced("c1"))
	in := s.Instance(key("static", "c1"))
	if got := hostnames(in); !slices.Equal(got, []string{"b.example.com"}) {
		t.Errorf("services %v, want [b]", got)
	}
	if st := in.Status(); st.Stale || st.Resyncing {
		t.Errorf("status %+v, want fresh", st)
	}
}

// TestDisconnectDropsHalfSnapshot: a stream that breaks mid-resync leaves
// the last-known state in place, and the next stream starts over.
func TestDisconnectDropsHalfSnapshot(t *testing.T) {
	s := replica.NewStore(nil)
	connect(s, "static").snapshot(t, true, added("c1", nil), upsert("c1", "a.example.com", 80), synced("c1"))
	s.Disconnected("static")
	connect(s, "static").snapshot(t, false, added("c1", nil), upsert("c1", "z.example.com", 80))
	s.Disconnected("static")
	in := s.Instance(key("static", "c1"))
	if st := in.Status(); !st.Stale || st.Resyncing {
		t.Errorf("status %+v, want stale, not resyncing", st)
	}
	st := connect(s, "static")
	st.snapshot(t, true, added("c1", nil), upsert("c1", "b.example.com", 80))
	st.delta(t, synced("c1"))
	if got := hostnames(in); !slices.Equal(got, []string{"b.example.com"}) {
		t.Errorf("services %v, want [b] (z came from the dropped stream)", got)
	}
}

// TestPluginsDoNotOverwrite: two plugins reporting the same Provider and
// Cluster are two instances; one plugin's snapshot leaves the other alone.
func TestPluginsDoNotOverwrite(t *testing.T) {
	s := replica.NewStore(nil)
	connect(s, "east").snapshot(t, true, added("c1", nil), upsert("c1", "a.example.com", 80), synced("c1"))
	connect(s, "west").snapshot(t, true, added("c1", nil), upsert("c1", "b.example.com", 80), synced("c1"))
	connect(s, "west").snapshot(t, true) // west restarts with nothing
	if in := s.Instance(key("east", "c1")); in == nil || in.Service("a.example.com") == nil {
		t.Errorf("east's instance lost when west resynced")
	}
	if s.Instance(key("west", "c1")) != nil {
		t.Errorf("west's instance kept after an empty snapshot")
	}
	s.RemovePlugin("east")
	if len(s.Instances()) != 0 {
		t.Errorf("instances after RemovePlugin: %d", len(s.Instances()))
	}
}

func TestInstanceOrder(t *testing.T) {
	s := replica.NewStore(nil)
	connect(s, "b").snapshot(t, true, added("c2", nil), added("c1", nil))
	connect(s, "a").snapshot(t, true, added("c3", nil))
	connect(s, "z").snapshot(t, true, added("c4", nil))
	order := func() []string {
		var out []string
		for _, in := range s.Instances() {
			out = append(out, in.Key.Plugin+"/"+in.Key.Cluster)
		}
		return out
	}
	// Without a plugin order: first seen.
	if got := order(); !slices.Equal(got, []string{"b/c2", "b/c1", "a/c3", "z/c4"}) {
		t.Errorf("order = %v", got)
	}
	// Plugins in file order, unknown ones last; first seen within a plugin.
	s.SetPluginOrder([]string{"a", "b"})
	if got := order(); !slices.Equal(got, []string{"a/c3", "b/c2", "b/c1", "z/c4"}) {
		t.Errorf("order = %v", got)
	}
}

// TestSharedSets checks that label and port sets sent once per message are
// resolved for each endpoint that refers to them, and shared.
func TestSharedSets(t *testing.T) {
	s := replica.NewStore(nil)
	m := &registryv1.EndpointsReplaced{
		Hostname: "a.example.com",
		LabelSets: []*registryv1.StringMap{
			{Entries: map[string]string{"app": "a", "version": "v1"}},
			{Entries: map[string]string{"app": "a", "version": "v2"}},
		},
		PortSets: []*registryv1.PortMap{{Entries: map[string]uint32{"http": 8080}}},
		Endpoints: []*registryv1.Endpoint{
			{Address: "10.0.0.1", LabelSet: 1, PortSet: 1},
			{Address: "10.0.0.2", LabelSet: 2, PortSet: 1},
			{Address: "10.0.0.3", LabelSet: 1},
			{Address: "10.0.0.4", Labels: map[string]string{"inline": "yes"}, TargetPorts: map[string]uint32{"http": 9090}},
			{Address: "10.0.0.5"},
		},
	}
	connect(s, "static").snapshot(t, true, added("c1", nil), upsert("c1", "a.example.com", 80), replaced("c1", m))
	eps := s.Instance(key("static", "c1")).Endpoints("a.example.com").Endpoints
	type row struct {
		labels map[string]string
		ports  map[string]uint32
		port   uint32
	}
	want := []row{
		{map[string]string{"app": "a", "version": "v1"}, map[string]uint32{"http": 8080}, 8080},
		{map[string]string{"app": "a", "version": "v2"}, map[string]uint32{"http": 8080}, 8080},
		{map[string]string{"app": "a", "version": "v1"}, nil, 80},
		{map[string]string{"inline": "yes"}, map[string]uint32{"http": 9090}, 9090},
		{nil, nil, 80},
	}
	if len(eps) != len(want) {
		t.Fatalf("%d endpoints, want %d", len(eps), len(want))
	}
	port := sdk.Port{Name: "http", Number: 80}
	for i, w := range want {
		e := &eps[i]
		if !maps.Equal(e.Labels, w.labels) || !maps.Equal(e.TargetPorts, w.ports) || e.TargetPort(port) != w.port {
			t.Errorf("endpoint %d: labels %v ports %v target %d; want %v %v %d", i, e.Labels, e.TargetPorts, e.TargetPort(port), w.labels, w.ports, w.port)
		}
	}
	if !sameMap(eps[0].Labels, eps[2].Labels) || !sameMap(eps[0].TargetPorts, eps[1].TargetPorts) {
		t.Errorf("endpoints referring to the same set do not share its map")
	}
}

func sameMap[V any](a, b map[string]V) bool {
	return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

// TestStringsInterned checks that network, locality and service account
// strings that many endpoints repeat are stored once.
func TestStringsInterned(t *testing.T) {
	// Interning keeps a canonical copy only while something holds it: a
	// collection between two sets may give the second a fresh copy (equal,
	// and itself shared from then on). Keep the collector out of the way.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))

	// Each string is its own allocation, as after unmarshalling.
	ep := func(addr, network, locality string) *registryv1.Endpoint {
		return &registryv1.Endpoint{Address: addr, Network: strings.Clone(network), Locality: strings.Clone(locality),
			ServiceAccount: strings.Clone("spiffe://cluster.local/ns/default/sa/echo")}
	}
	a := &registryv1.EndpointsReplaced{Hostname: "a.example.com", Endpoints: []*registryv1.Endpoint{
		ep("10.0.0.1", "network1", "r/z1"), ep("10.0.0.2", "network1", "r/z1"),
		ep("10.0.0.3", "network2", "r/z2"), ep("10.0.0.4", "network1", "r/z1"),
	}}
	b := &registryv1.EndpointsReplaced{Hostname: "b.example.com", Endpoints: []*registryv1.Endpoint{ep("10.0.1.1", "network1", "r/z2")}}
	s := replica.NewStore(nil)
	connect(s, "static").snapshot(t, true, added("c1", nil), upsert("c1", "a.example.com", 80), upsert("c1", "b.example.com", 80), replaced("c1", a))
	connect(s, "other").snapshot(t, true, added("c1", nil), upsert("c1", "b.example.com", 80), replaced("c1", b))
	ea := s.Instance(key("static", "c1")).Endpoints("a.example.com").Endpoints
	eb := s.Instance(key("other", "c1")).Endpoints("b.example.com").Endpoints
	same := func(x, y string) bool { return x == y && unsafe.StringData(x) == unsafe.StringData(y) }
	tests := []struct {
		what string
		x, y string
	}{
		{"network of neighbours", ea[0].Network, ea[1].Network},
		{"network across a different value", ea[0].Network, ea[3].Network},
		{"network across plugins", ea[0].Network, eb[0].Network},
		{"locality across services", ea[2].Locality, eb[0].Locality},
		{"service account", ea[0].ServiceAccount, eb[0].ServiceAccount},
	}
	for _, tt := range tests {
		if !same(tt.x, tt.y) {
			t.Errorf("%s: %q and %q are separate copies", tt.what, tt.x, tt.y)
		}
	}
}

// TestChanges checks what each event tells the store's subscribers.
func TestChanges(t *testing.T) {
	svcOnly := func(h string, attrs bool) model.Change {
		return model.Change{Services: map[string]bool{h: attrs}}
	}
	tests := []struct {
		name string
		evs  []*registryv1.Event
		want *model.Change // nil: nothing published
	}{
		{"endpoints only", []*registryv1.Event{endpoints("c1", "a.example.com", "10.0.0.2")}, new(svcOnly("a.example.com", false))},
		{"service upserted", []*registryv1.Event{upsert("c1", "a.example.com", 81)}, new(svcOnly("a.example.com", true))},
		{"upsert and endpoints in one batch", []*registryv1.Event{endpoints("c1", "a.example.com", "10.0.0.2"), upsert("c1", "a.example.com", 81)},
			new(svcOnly("a.example.com", true))},
		{"new service", []*registryv1.Event{upsert("c1", "n.example.com", 80)}, new(svcOnly("n.example.com", true))},
		{"service deleted", []*registryv1.Event{deleted("c1", "a.example.com")}, new(svcOnly("a.example.com", true))},
		{"unknown service deleted", []*registryv1.Event{deleted("c1", "nope.example.com")}, nil},
		{"gateways", []*registryv1.Event{gateways("c1", "2.2.2.2")}, &model.Change{Full: true}},
		{"new instance", []*registryv1.Event{added("c2", nil)}, &model.Change{Full: true}},
		{"properties changed", []*registryv1.Event{added("c1", &registryv1.InstanceProperties{ClusterScoped: true})}, &model.Change{Full: true}},
		{"same properties", []*registryv1.Event{added("c1", nil)}, nil},
		{"instance removed", []*registryv1.Event{removed("c1")}, &model.Change{Full: true}},
		{"health", []*registryv1.Event{health("c1", false, "down")}, nil},
		{"synced again", []*registryv1.Event{synced("c1")}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := replica.NewStore(nil)
			st := connect(s, "static")
			st.snapshot(t, true, added("c1", nil), upsert("c1", "a.example.com", 80), endpoints("c1", "a.example.com", "10.0.0.1"), synced("c1"))
			var got []model.Change
			s.Subscribe(func(c model.Change) { got = append(got, c) })
			st.delta(t, tt.evs...)
			switch {
			case tt.want == nil && len(got) != 0:
				t.Errorf("published %+v, want nothing", got)
			case tt.want != nil && (len(got) != 1 || !reflect.DeepEqual(got[0], *tt.want)):
				t.Errorf("published %+v, want [%+v]", got, *tt.want)
			}
		})
	}
}

func TestChangeMerge(t *testing.T) {
	var c model.Change
	if !c.Empty() {
		t.Errorf("zero Change not empty")
	}
	c.Merge(model.Change{Services: map[string]bool{"a": false, "b": true}})
	c.Merge(model.Change{Services: map[string]bool{"a": true, "b": false, "c": false}})
	if want := map[string]bool{"a": true, "b": true, "c": false}; !maps.Equal(c.Services, want) || c.Full {
		t.Errorf("merged = %+v, want %v", c, want)
	}
	c.Merge(model.Change{Full: true})
	if !c.Full || c.Empty() {
		t.Errorf("Full lost in merge: %+v", c)
	}
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := replica.NewStore(reg)
	st := connect(s, "static")
	st.snapshot(t, true, added("c1", nil), added("c2", nil), upsert("c1", "a.example.com", 80),
		endpoints("c1", "a.example.com", "10.0.0.1", "10.0.0.2", "10.0.0.3"))
	st.delta(t, removed("c2"))
	connectSet(s, "k8s").send(t, true, false, added("c1", nil)) // waits for its instance set
	values := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range m.GetLabel() {
				name += "," + l.GetName() + "=" + l.GetValue()
			}
			values[name] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	want := map[string]float64{
		"estuary_registry_instances,plugin=static,provider=Static":            1,
		"estuary_registry_endpoint_updates_total":                             3,
		"estuary_registry_events_total,kind=instance_added,plugin=static":     2,
		"estuary_registry_events_total,kind=instance_removed,plugin=static":   1,
		"estuary_registry_events_total,kind=service_upserted,plugin=static":   1,
		"estuary_registry_events_total,kind=endpoints_replaced,plugin=static": 1,
		"estuary_plugin_instance_set_complete,plugin=static":                  1,
		"estuary_plugin_instance_set_complete,plugin=k8s":                     0,
	}
	for k, v := range want {
		if got, ok := values[k]; !ok || got != v {
			t.Errorf("%s = %v, want %v", k, values[k], v)
		}
	}
	if s.EndpointUpdates() != 3 {
		t.Errorf("EndpointUpdates() = %d, want 3", s.EndpointUpdates())
	}
}

// setStream is a stream from a plugin that declared INSTANCE_SET: its
// snapshot_done does not complete the instance set, instance_set_complete
// does.
type setStream struct {
	sess *replica.Session
	wire *protoconv.Stream
	seq  uint64
}

func connectSet(s *replica.Store, plugin string) *setStream {
	return &setStream{sess: s.NewSession(plugin),
		wire: protoconv.NewStream(sdk.CapabilityMultiInstance, sdk.CapabilityGateways, sdk.CapabilityInstanceSet)}
}

func (st *setStream) send(t *testing.T, snapshot, complete bool, evs ...*registryv1.Event) {
	t.Helper()
	st.seq++
	b, err := st.wire.Decode(&registryv1.WatchResponse{Sequence: st.seq, Snapshot: snapshot, SnapshotDone: snapshot,
		InstanceSetComplete: complete, Events: evs})
	if err != nil {
		t.Fatalf("response %d: %v", st.seq, err)
	}
	st.sess.ApplyBatch(b)
}

// restarted is a store holding plugin "k8s" with clusters c1 (service a)
// and c2 (service b, endpoint 10.0.0.2), whose plugin then died and came
// back with a snapshot of c1 only: c2 is not rediscovered yet.
func restarted(t *testing.T) (*replica.Store, *setStream) {
	s := replica.NewStore(nil)
	first := connectSet(s, "k8s")
	first.send(t, true, true, added("c1", nil), upsert("c1", "a.example.com", 80), synced("c1"),
		added("c2", nil), upsert("c2", "b.example.com", 80), endpoints("c2", "b.example.com", "10.0.0.2"), synced("c2"))
	s.Disconnected("k8s")
	st := connectSet(s, "k8s")
	st.send(t, true, false, added("c1", nil), upsert("c1", "a.example.com", 80), synced("c1"))
	return s, st
}

// TestInstanceSetKeepsUnmentioned: until the restarted plugin declares its
// instance set complete, an instance it has not mentioned yet keeps
// serving its last-known state, stale; rediscovered, it swaps in its new
// state at its own sync.
func TestInstanceSetKeepsUnmentioned(t *testing.T) {
	s, st := restarted(t)
	k2 := key("k8s", "c2")
	in := s.Instance(k2)
	if in == nil {
		t.Fatal("c2, not yet rediscovered, was removed at snapshot_done")
	}
	if got := addrs(in.Endpoints("b.example.com")); got != "10.0.0.2" || !in.Status().Stale {
		t.Errorf("c2 before the instance set is complete: endpoints %q, status %+v; want 10.0.0.2, stale", got, in.Status())
	}
	if set, _ := s.InstanceSet("k8s"); set.Complete {
		t.Errorf("instance set %+v, want waiting", set)
	}
	if c1 := s.Instance(key("k8s", "c1")).Status(); c1.Stale {
		t.Errorf("c1, resynced in the snapshot, still stale: %+v", c1)
	}

	// Rediscovered after the snapshot: the new state (service c, no b) is
	// built aside.
	st.send(t, false, false, added("c2", nil), upsert("c2", "c.example.com", 80))
	if got := hostnames(in); !slices.Equal(got, []string{"b.example.com"}) {
		t.Errorf("c2 rediscovered, not synced: services %v, want the old [b] until sync", got)
	}
	st.send(t, false, true, endpoints("c2", "c.example.com", "10.0.0.3"), synced("c2"))
	if got := hostnames(in); s.Instance(k2) != in || !slices.Equal(got, []string{"c.example.com"}) || addrs(in.Endpoints("c.example.com")) != "10.0.0.3" || in.Status().Stale {
		t.Errorf("c2 after sync and the complete set: services %v, endpoints %q, status %+v", got, addrs(in.Endpoints("c.example.com")), in.Status())
	}
	if set, _ := s.InstanceSet("k8s"); !set.Complete || set.CompletedBy != "plugin" {
		t.Errorf("instance set %+v, want complete by the plugin", set)
	}
}

// TestInstanceSetRemovesWhatItLacks: once the plugin declares its set
// complete, what it did not mention is gone.
func TestInstanceSetRemovesWhatItLacks(t *testing.T) {
	s, st := restarted(t)
	var changes []model.Change
	s.Subscribe(func(c model.Change) { changes = append(changes, c) })
	st.send(t, false, true)
	if s.Instance(key("k8s", "c2")) != nil {
		t.Errorf("c2, absent from the complete instance set, still there")
	}
	if s.Instance(key("k8s", "c1")) == nil {
		t.Errorf("c1 removed")
	}
	if len(changes) != 1 || !changes[0].Full {
		t.Errorf("changes %+v, want one Full", changes)
	}
}

// TestInstanceSetTimeout: a plugin that never declares its set complete
// loses what it did not mention when its sync timeout passes, and only
// then; a stale session's timer does nothing.
func TestInstanceSetTimeout(t *testing.T) {
	s, st := restarted(t)
	stop := st.sess.ExpireAfter(time.Hour)
	defer stop()
	if set, _ := s.InstanceSet("k8s"); set.Complete || set.TimeoutAt.IsZero() || set.Since.IsZero() {
		t.Errorf("instance set %+v, want waiting with a timeout", set)
	}
	old := connectSet(replica.NewStore(nil), "k8s")
	old.sess.Expire() // another store's session: nothing here changes
	if s.Instance(key("k8s", "c2")) == nil {
		t.Fatal("c2 removed before the timeout")
	}

	st.sess.Expire() // what the timer does when the hour has passed
	if s.Instance(key("k8s", "c2")) != nil {
		t.Errorf("c2 still there after the sync timeout")
	}
	if set, _ := s.InstanceSet("k8s"); !set.Complete || set.CompletedBy != "sync timeout" || !st.sess.InstanceSetComplete() {
		t.Errorf("instance set %+v, want complete by the sync timeout", set)
	}

	// A session replaced by a newer one expires nothing.
	s2, st2 := restarted(t)
	s2.Disconnected("k8s")
	connectSet(s2, "k8s")
	st2.sess.Expire()
	if s2.Instance(key("k8s", "c2")) == nil {
		t.Errorf("an old session's timeout removed c2 from the new session's store")
	}
}

// TestSnapshotDoneCompletesOldPlugins: a plugin without INSTANCE_SET keeps
// the old rule, its snapshot is its instance set.
func TestSnapshotDoneCompletesOldPlugins(t *testing.T) {
	s := replica.NewStore(nil)
	connect(s, "static").snapshot(t, true, added("c1", nil), added("c2", nil), synced("c1"), synced("c2"))
	s.Disconnected("static")
	connect(s, "static").snapshot(t, true, added("c1", nil), synced("c1"))
	if s.Instance(key("static", "c2")) != nil {
		t.Errorf("c2 kept; an old plugin's snapshot_done completes its instance set")
	}
	if set, _ := s.InstanceSet("static"); !set.Complete || set.CompletedBy != "plugin" {
		t.Errorf("instance set %+v", set)
	}
}
