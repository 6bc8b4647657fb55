package sdk

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
)

// The tests here drive State through the same subscribe/take pair the
// Watch stream uses, and read the events back as short strings.

var (
	c1 = InstanceID{Provider: ProviderStatic, Cluster: "c1"}
	c2 = InstanceID{Provider: ProviderStatic, Cluster: "c2"}
)

// sink is one watcher of a State.
type sink struct {
	st  *State
	sub *subscriber
}

func watch(st *State) *sink { return &sink{st: st, sub: st.subscribe()} }

// take returns the queued events rendered, and how many belong to the
// snapshot.
func (k *sink) take() ([]string, int) {
	evs, snap := k.st.take(k.sub)
	out := make([]string, len(evs))
	for i := range evs {
		out[i] = render(&evs[i])
	}
	return out, snap
}

// takeRaw returns the queued events as they are.
func (k *sink) takeRaw() []event {
	evs, _ := k.st.take(k.sub)
	return evs
}

func render(e *event) string {
	id := e.id.Cluster
	switch e.kind {
	case kindInstanceAdded:
		return fmt.Sprintf("added %s scoped=%v net=%s", id, e.props.ClusterScoped, e.props.DefaultNetwork)
	case kindInstanceRemoved:
		return "removed " + id
	case kindServiceUpserted:
		return fmt.Sprintf("upsert %s %s %v", id, e.service.Hostname, e.service.Ports)
	case kindServiceDeleted:
		return fmt.Sprintf("delete %s %s", id, e.hostname)
	case kindEndpointsReplaced:
		addrs := make([]string, len(e.endpoints))
		for i, ep := range e.endpoints {
			addrs[i] = ep.Address
		}
		return fmt.Sprintf("eps %s %s [%s]", id, e.hostname, strings.Join(addrs, " "))
	case kindGatewaysReplaced:
		gws := make([]string, len(e.gateways))
		for i, g := range e.gateways {
			gws[i] = fmt.Sprintf("%s@%s:%d", g.Network, g.Address, g.Port)
		}
		return fmt.Sprintf("gateways %s [%s]", id, strings.Join(gws, " "))
	case kindInstanceSynced:
		return "synced " + id
	case kindInstanceHealth:
		return fmt.Sprintf("health %s %v %q notices=%d", id, e.health.Healthy, e.health.Message, len(e.health.Notices))
	case kindInstanceSetComplete:
		return "instance set complete"
	case kindPluginHealth:
		return fmt.Sprintf("plugin health %v %q", e.health.Healthy, e.health.Message)
	}
	return fmt.Sprintf("kind %d", e.kind)
}

func svc(host string, port uint32) *Service {
	return &Service{Hostname: host, Namespace: "default", Ports: []Port{{Name: "http", Number: port, Protocol: "HTTP"}}}
}

func eps(addrs ...string) []Endpoint {
	out := make([]Endpoint, len(addrs))
	for i, a := range addrs {
		out[i] = Endpoint{Address: a, Labels: map[string]string{"app": "x"}, TargetPorts: map[string]uint32{"http": 8080}}
	}
	return out
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func expectEvents(t *testing.T, k *sink, want ...string) {
	t.Helper()
	got, _ := k.take()
	if !slices.Equal(got, want) {
		t.Errorf("events:\n got %q\nwant %q", got, want)
	}
}

// populated returns a State with one instance holding a service with
// endpoints, gateways, health and sync, and a watcher past its snapshot.
func populated(t *testing.T) (*State, *sink) {
	t.Helper()
	st := NewState()
	st.SetInstance(c1, InstanceProperties{DefaultNetwork: "n1"})
	must(t, st.UpsertService(c1, svc("a.example.com", 80)))
	must(t, st.SetEndpoints(c1, "a.example.com", eps("10.0.0.1", "10.0.0.2")))
	must(t, st.SetGateways(c1, []NetworkGateway{{Network: "n1", Address: "1.1.1.1", Port: 15443}}))
	must(t, st.SetHealth(c1, InstanceHealth{Healthy: true, Message: "ok"}))
	must(t, st.MarkSynced(c1))
	k := watch(st)
	k.take()
	return st, k
}

// TestStateNoOps checks that an update equal to what State holds sends
// nothing, so a plugin can resend its whole state cheaply.
func TestStateNoOps(t *testing.T) {
	tests := []struct {
		name   string
		update func(t *testing.T, st *State)
	}{
		{"same properties", func(t *testing.T, st *State) { st.SetInstance(c1, InstanceProperties{DefaultNetwork: "n1"}) }},
		{"equal service, new pointer", func(t *testing.T, st *State) { must(t, st.UpsertService(c1, svc("a.example.com", 80))) }},
		{"equal endpoints, new slice and maps", func(t *testing.T, st *State) {
			must(t, st.SetEndpoints(c1, "a.example.com", eps("10.0.0.1", "10.0.0.2")))
		}},
		{"no endpoints for a service that never had any", func(t *testing.T, st *State) {
			must(t, st.UpsertService(c1, svc("b.example.com", 80)))
			st.take(watchers(st)[0]) // drop the upsert
			must(t, st.SetEndpoints(c1, "b.example.com", nil))
			must(t, st.SetEndpoints(c1, "b.example.com", []Endpoint{}))
		}},
		{"equal gateways in another order", func(t *testing.T, st *State) {
			must(t, st.SetGateways(c1, []NetworkGateway{{Network: "n1", Address: "1.1.1.1", Port: 15443}}))
		}},
		{"equal health", func(t *testing.T, st *State) { must(t, st.SetHealth(c1, InstanceHealth{Healthy: true, Message: "ok"})) }},
		{"synced again", func(t *testing.T, st *State) { must(t, st.MarkSynced(c1)) }},
		{"delete of a service that is not there", func(t *testing.T, st *State) { must(t, st.DeleteService(c1, "nope.example.com")) }},
		{"remove of an instance that is not there", func(t *testing.T, st *State) { st.RemoveInstance(c2) }},
		{"replace with equal content", func(t *testing.T, st *State) {
			must(t, st.ReplaceInstance(c1, Snapshot{
				Services:  []*Service{svc("a.example.com", 80)},
				Endpoints: map[string][]Endpoint{"a.example.com": eps("10.0.0.1", "10.0.0.2")},
				Gateways:  []NetworkGateway{{Network: "n1", Address: "1.1.1.1", Port: 15443}},
			}))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, k := populated(t)
			tt.update(t, st)
			expectEvents(t, k)
		})
	}

	// Gateways are compared as a set.
	st, k := populated(t)
	gws := []NetworkGateway{{Network: "n2", Address: "2.2.2.2", Port: 1}, {Network: "n1", Address: "1.1.1.1", Port: 15443}}
	must(t, st.SetGateways(c1, gws))
	expectEvents(t, k, "gateways c1 [n1@1.1.1.1:15443 n2@2.2.2.2:1]")
	must(t, st.SetGateways(c1, []NetworkGateway{{Network: "n1", Address: "1.1.1.1", Port: 15443}, {Network: "n2", Address: "2.2.2.2", Port: 1}}))
	must(t, st.SetGateways(c1, []NetworkGateway{{Network: "n2", Address: "2.2.2.2", Port: 1}, {Network: "n1", Address: "1.1.1.1", Port: 15443}}))
	expectEvents(t, k)
}

func watchers(st *State) []*subscriber {
	st.mu.Lock()
	defer st.mu.Unlock()
	return slices.Collect(maps.Keys(st.subs))
}

// TestStateChanges checks that each real change sends exactly its event.
func TestStateChanges(t *testing.T) {
	tests := []struct {
		name   string
		update func(t *testing.T, st *State)
		want   []string
	}{
		{"properties", func(t *testing.T, st *State) {
			st.SetInstance(c1, InstanceProperties{ClusterScoped: true, DefaultNetwork: "n1"})
		},
			[]string{"added c1 scoped=true net=n1"}},
		{"service port", func(t *testing.T, st *State) { must(t, st.UpsertService(c1, svc("a.example.com", 81))) },
			[]string{"upsert c1 a.example.com [{http 81 HTTP}]"}},
		{"endpoint order", func(t *testing.T, st *State) {
			must(t, st.SetEndpoints(c1, "a.example.com", eps("10.0.0.2", "10.0.0.1")))
		},
			[]string{"eps c1 a.example.com [10.0.0.2 10.0.0.1]"}},
		{"endpoint label", func(t *testing.T, st *State) {
			e := eps("10.0.0.1", "10.0.0.2")
			e[1].Labels = map[string]string{"app": "y"}
			must(t, st.SetEndpoints(c1, "a.example.com", e))
		}, []string{"eps c1 a.example.com [10.0.0.1 10.0.0.2]"}},
		{"endpoints emptied", func(t *testing.T, st *State) { must(t, st.SetEndpoints(c1, "a.example.com", nil)) },
			[]string{"eps c1 a.example.com []"}},
		{"gateways cleared", func(t *testing.T, st *State) { must(t, st.SetGateways(c1, nil)) },
			[]string{"gateways c1 []"}},
		{"health notice", func(t *testing.T, st *State) {
			must(t, st.SetHealth(c1, InstanceHealth{Healthy: true, Message: "ok", Notices: []Notice{{Subject: "x", Message: "bad"}}}))
		}, []string{`health c1 true "ok" notices=1`}},
		{"delete service drops its endpoints", func(t *testing.T, st *State) {
			must(t, st.DeleteService(c1, "a.example.com"))
			// Upserted again, the service has no endpoints: an empty set
			// is a no-op and a snapshot carries none.
			must(t, st.UpsertService(c1, svc("a.example.com", 80)))
			must(t, st.SetEndpoints(c1, "a.example.com", nil))
		}, []string{"delete c1 a.example.com", "upsert c1 a.example.com [{http 80 HTTP}]"}},
		{"remove instance", func(t *testing.T, st *State) { st.RemoveInstance(c1) }, []string{"removed c1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, k := populated(t)
			tt.update(t, st)
			expectEvents(t, k, tt.want...)
		})
	}
}

// TestStateSnapshot checks the order a new watcher receives an instance in:
// added, health, services, endpoints, gateways, synced.
func TestStateSnapshot(t *testing.T) {
	st := NewState()
	st.SetInstance(c2, InstanceProperties{ClusterScoped: true, DefaultNetwork: "n2"})
	st.SetInstance(c1, InstanceProperties{DefaultNetwork: "n1"})
	must(t, st.UpsertService(c1, svc("z.example.com", 80)))
	must(t, st.UpsertService(c1, svc("a.example.com", 80)))
	must(t, st.UpsertService(c1, svc("m.example.com", 80)))
	must(t, st.SetEndpoints(c1, "z.example.com", eps("10.0.0.9")))
	must(t, st.SetEndpoints(c1, "a.example.com", eps("10.0.0.1", "10.0.0.2")))
	must(t, st.SetGateways(c1, []NetworkGateway{{Network: "n1", Address: "1.1.1.1", Port: 15443}}))
	must(t, st.MarkSynced(c1))
	must(t, st.SetHealth(c1, InstanceHealth{Healthy: false, Message: "down"}))
	must(t, st.UpsertService(c2, svc("b.example.com", 80)))

	k := watch(st)
	select {
	case <-k.sub.notify:
	default:
		t.Fatalf("subscribe did not signal the new watcher")
	}
	got, snap := k.take()
	want := []string{
		"added c2 scoped=true net=n2",
		"upsert c2 b.example.com [{http 80 HTTP}]",
		"added c1 scoped=false net=n1",
		`health c1 false "down" notices=0`,
		"upsert c1 a.example.com [{http 80 HTTP}]",
		"upsert c1 m.example.com [{http 80 HTTP}]",
		"upsert c1 z.example.com [{http 80 HTTP}]",
		"eps c1 a.example.com [10.0.0.1 10.0.0.2]",
		"eps c1 z.example.com [10.0.0.9]",
		"gateways c1 [n1@1.1.1.1:15443]",
		"synced c1",
	}
	if !slices.Equal(got, want) || snap != len(want) {
		t.Errorf("snapshot (%d events):\n got %q\nwant %q", snap, got, want)
	}
	if ids := st.Instances(); !slices.Equal(ids, []InstanceID{c2, c1}) {
		t.Errorf("Instances() = %v, want first-seen order [c2 c1]", ids)
	}

	// An empty state still signals, so the stream sends an empty snapshot.
	empty := watch(NewState())
	select {
	case <-empty.sub.notify:
	default:
		t.Fatalf("subscribe to an empty state did not signal")
	}
	if got, snap := empty.take(); len(got) != 0 || snap != 0 {
		t.Errorf("empty snapshot = %q (%d)", got, snap)
	}
}

// TestStateSnapshotNotCoalesced checks that an endpoint update right after
// subscribing is queued behind the snapshot, not folded into it.
func TestStateSnapshotNotCoalesced(t *testing.T) {
	st := NewState()
	st.SetInstance(c1, InstanceProperties{})
	must(t, st.UpsertService(c1, svc("a.example.com", 80)))
	must(t, st.SetEndpoints(c1, "a.example.com", eps("10.0.0.1")))
	k := watch(st)
	must(t, st.SetEndpoints(c1, "a.example.com", eps("10.0.0.2")))
	must(t, st.SetEndpoints(c1, "a.example.com", eps("10.0.0.3")))
	got, snap := k.take()
	want := []string{
		"added c1 scoped=false net=",
		"upsert c1 a.example.com [{http 80 HTTP}]",
		"eps c1 a.example.com [10.0.0.1]",
		"eps c1 a.example.com [10.0.0.3]",
	}
	if !slices.Equal(got, want) || snap != 3 {
		t.Errorf("events (snapshot %d):\n got %q\nwant %q", snap, got, want)
	}
}

func TestStateRemoveInstance(t *testing.T) {
	st, k := populated(t)
	st.SetInstance(c2, InstanceProperties{})
	must(t, st.UpsertService(c2, svc("b.example.com", 80)))
	must(t, st.SetEndpoints(c1, "a.example.com", eps("10.0.0.7")))
	st.RemoveInstance(c1)
	expectEvents(t, k,
		"added c2 scoped=false net=",
		"upsert c2 b.example.com [{http 80 HTTP}]",
		"eps c1 a.example.com [10.0.0.7]",
		"removed c1",
	)
	if ids := st.Instances(); !slices.Equal(ids, []InstanceID{c2}) {
		t.Errorf("Instances() = %v, want [c2]", ids)
	}
	if err := st.SetEndpoints(c1, "a.example.com", eps("10.0.0.1")); !errors.Is(err, ErrUnknownInstance) {
		t.Errorf("SetEndpoints after RemoveInstance: err = %v, want ErrUnknownInstance", err)
	}

	// Added again, the instance starts empty and unsynced.
	st.SetInstance(c1, InstanceProperties{DefaultNetwork: "n1"})
	must(t, st.MarkSynced(c1))
	expectEvents(t, k, "added c1 scoped=false net=n1", "synced c1")
	fresh := watch(st)
	got, _ := fresh.take()
	want := []string{"added c2 scoped=false net=", "upsert c2 b.example.com [{http 80 HTTP}]", "added c1 scoped=false net=n1", "synced c1"}
	if !slices.Equal(got, want) {
		t.Errorf("snapshot after re-add:\n got %q\nwant %q", got, want)
	}
}

// TestStateReplaceInstance checks that ReplaceInstance emits exactly the
// changes between the current content and the snapshot.
func TestStateReplaceInstance(t *testing.T) {
	st := NewState()
	st.SetInstance(c1, InstanceProperties{})
	must(t, st.ReplaceInstance(c1, Snapshot{
		Services: []*Service{svc("a.example.com", 80), svc("b.example.com", 80), svc("c.example.com", 80), svc("d.example.com", 80)},
		Endpoints: map[string][]Endpoint{
			"a.example.com": eps("10.0.0.1"),
			"b.example.com": eps("10.0.0.2"),
			"c.example.com": eps("10.0.0.3"),
			"d.example.com": eps("10.0.0.4"),
		},
		Gateways: []NetworkGateway{{Network: "n1", Address: "1.1.1.1", Port: 1}},
	}))
	k := watch(st)
	k.take()

	// a: unchanged; b: deleted; c: new port, same endpoints; d: same
	// service, new endpoints; e: new; gateways unchanged; order of the
	// snapshot's services decides the order of upserts.
	must(t, st.ReplaceInstance(c1, Snapshot{
		Services: []*Service{svc("e.example.com", 80), svc("d.example.com", 80), svc("c.example.com", 8080), svc("a.example.com", 80)},
		Endpoints: map[string][]Endpoint{
			"a.example.com": eps("10.0.0.1"),
			"c.example.com": eps("10.0.0.3"),
			"d.example.com": eps("10.0.0.4", "10.0.0.5"),
			"e.example.com": eps("10.0.0.6"),
		},
		Gateways: []NetworkGateway{{Network: "n1", Address: "1.1.1.1", Port: 1}},
	}))
	expectEvents(t, k,
		"delete c1 b.example.com",
		"upsert c1 e.example.com [{http 80 HTTP}]",
		"eps c1 e.example.com [10.0.0.6]",
		"eps c1 d.example.com [10.0.0.4 10.0.0.5]",
		"upsert c1 c.example.com [{http 8080 HTTP}]",
	)

	// A service kept without endpoints loses them; gateways cleared.
	must(t, st.ReplaceInstance(c1, Snapshot{Services: []*Service{svc("a.example.com", 80)}}))
	expectEvents(t, k,
		"delete c1 c.example.com",
		"delete c1 d.example.com",
		"delete c1 e.example.com",
		"eps c1 a.example.com []",
		"gateways c1 []",
	)

	// Nothing changed: nothing sent.
	must(t, st.ReplaceInstance(c1, Snapshot{Services: []*Service{svc("a.example.com", 80)}, Endpoints: map[string][]Endpoint{"a.example.com": {}}}))
	expectEvents(t, k)

	if err := st.ReplaceInstance(c2, Snapshot{}); !errors.Is(err, ErrUnknownInstance) {
		t.Errorf("ReplaceInstance of an unknown instance: err = %v, want ErrUnknownInstance", err)
	}
}

// TestStateCoalescing checks that endpoint sets a watcher has not taken yet
// collapse into the latest one, without moving them past a delete.
func TestStateCoalescing(t *testing.T) {
	st := NewState()
	st.SetInstance(c1, InstanceProperties{})
	must(t, st.UpsertService(c1, svc("a.example.com", 80)))
	must(t, st.UpsertService(c1, svc("b.example.com", 80)))
	k := watch(st)
	k.take()

	must(t, st.SetEndpoints(c1, "a.example.com", eps("10.0.0.1")))
	must(t, st.SetEndpoints(c1, "b.example.com", eps("10.0.1.1")))
	must(t, st.SetEndpoints(c1, "a.example.com", eps("10.0.0.2")))
	must(t, st.SetEndpoints(c1, "a.example.com", eps("10.0.0.3")))
	expectEvents(t, k, "eps c1 a.example.com [10.0.0.3]", "eps c1 b.example.com [10.0.1.1]")

	// After a take, a new set is a new event.
	must(t, st.SetEndpoints(c1, "a.example.com", eps("10.0.0.4")))
	expectEvents(t, k, "eps c1 a.example.com [10.0.0.4]")

	// upsert A, eps v1, delete A, upsert A, eps v2: the second set must not
	// be folded into the first, or it would be applied before the delete
	// and lost.
	must(t, st.UpsertService(c1, svc("a.example.com", 81)))
	must(t, st.SetEndpoints(c1, "a.example.com", eps("10.0.0.5")))
	must(t, st.DeleteService(c1, "a.example.com"))
	must(t, st.UpsertService(c1, svc("a.example.com", 82)))
	must(t, st.SetEndpoints(c1, "a.example.com", eps("10.0.0.6")))
	evs := k.takeRaw()
	got := make([]string, len(evs))
	for i := range evs {
		got[i] = render(&evs[i])
	}
	want := []string{
		"upsert c1 a.example.com [{http 81 HTTP}]",
		"eps c1 a.example.com [10.0.0.5]",
		"delete c1 a.example.com",
		"upsert c1 a.example.com [{http 82 HTTP}]",
		"eps c1 a.example.com [10.0.0.6]",
	}
	if !slices.Equal(got, want) {
		t.Errorf("events:\n got %q\nwant %q", got, want)
	}
	r := newReplica()
	r.apply(t, evs)
	if s := r.services[c1]["a.example.com"]; s == nil || s.Ports[0].Number != 82 {
		t.Errorf("rebuilt service a = %+v, want port 82", s)
	}
	if got := r.addrs(c1, "a.example.com"); got != "10.0.0.6" {
		t.Errorf("rebuilt endpoints of a = %q, want 10.0.0.6", got)
	}

	// The same across an instance removal.
	must(t, st.SetEndpoints(c1, "b.example.com", eps("10.0.1.8")))
	st.RemoveInstance(c1)
	st.SetInstance(c1, InstanceProperties{})
	must(t, st.UpsertService(c1, svc("b.example.com", 80)))
	must(t, st.SetEndpoints(c1, "b.example.com", eps("10.0.1.9")))
	expectEvents(t, k,
		"eps c1 b.example.com [10.0.1.8]",
		"removed c1",
		"added c1 scoped=false net=",
		"upsert c1 b.example.com [{http 80 HTTP}]",
		"eps c1 b.example.com [10.0.1.9]",
	)
}

func TestStateErrors(t *testing.T) {
	st := NewState()
	st.SetInstance(c1, InstanceProperties{})
	tests := []struct {
		name string
		call func() error
		want error
		msg  string
	}{
		{"upsert", func() error { return st.UpsertService(c2, svc("a", 80)) }, ErrUnknownInstance, "unknown instance Static/c2"},
		{"delete", func() error { return st.DeleteService(c2, "a") }, ErrUnknownInstance, "unknown instance Static/c2"},
		{"endpoints, unknown instance", func() error { return st.SetEndpoints(c2, "a", nil) }, ErrUnknownInstance, "unknown instance Static/c2"},
		{"endpoints, unknown service", func() error { return st.SetEndpoints(c1, "a.example.com", eps("10.0.0.1")) }, ErrUnknownService, `unknown service "a.example.com" in Static/c1`},
		{"gateways", func() error { return st.SetGateways(c2, nil) }, ErrUnknownInstance, "unknown instance Static/c2"},
		{"synced", func() error { return st.MarkSynced(c2) }, ErrUnknownInstance, "unknown instance Static/c2"},
		{"health", func() error { return st.SetHealth(c2, InstanceHealth{}) }, ErrUnknownInstance, "unknown instance Static/c2"},
		{"replace", func() error { return st.ReplaceInstance(c2, Snapshot{}) }, ErrUnknownInstance, "unknown instance Static/c2"},
	}
	k := watch(st)
	k.take()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if !errors.Is(err, tt.want) || err.Error() != tt.msg {
				t.Errorf("err = %v, want %q wrapping %v", err, tt.msg, tt.want)
			}
		})
	}
	expectEvents(t, k) // failed calls send nothing
}

// TestStateConcurrent races writers against a watcher that takes as it goes;
// the events it saw must rebuild the final state (run with -race).
func TestStateConcurrent(t *testing.T) {
	st := NewState()
	st.SetInstance(c1, InstanceProperties{})
	const writers, rounds = 4, 300
	hosts := make([]string, writers)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("s%d.example.com", i)
		must(t, st.UpsertService(c1, svc(hosts[i], 80)))
	}
	k := watch(st)
	r := newReplica()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range rounds {
				if err := st.SetEndpoints(c1, hosts[w], eps(fmt.Sprintf("10.%d.%d.%d", w, i/256, i%256))); err != nil {
					t.Error(err)
					return
				}
				if i%50 == 0 {
					must(t, st.UpsertService(c1, svc(hosts[w], uint32(1000+i))))
				}
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for finished := false; !finished; {
		select {
		case <-done:
			finished = true
		case <-k.sub.notify:
		case <-time.After(10 * time.Millisecond):
		}
		r.apply(t, k.takeRaw())
	}
	r.apply(t, k.takeRaw())
	for w, h := range hosts {
		last := rounds - 1
		if got, want := r.addrs(c1, h), fmt.Sprintf("10.%d.%d.%d", w, last/256, last%256); got != want {
			t.Errorf("%s: rebuilt endpoints %q, want %q", h, got, want)
		}
		if got := r.services[c1][h].Ports[0].Number; got != 1250 {
			t.Errorf("%s: rebuilt port %d, want 1250", h, got)
		}
	}
}

// replica applies events as a host would, to check what they rebuild.
type replica struct {
	services  map[InstanceID]map[string]*Service
	endpoints map[InstanceID]map[string][]Endpoint
}

func newReplica() *replica {
	return &replica{services: map[InstanceID]map[string]*Service{}, endpoints: map[InstanceID]map[string][]Endpoint{}}
}

func (r *replica) apply(t *testing.T, evs []event) {
	t.Helper()
	for _, e := range evs {
		if r.services[e.id] == nil {
			// Tests may start applying after the snapshot.
			r.services[e.id] = map[string]*Service{}
			r.endpoints[e.id] = map[string][]Endpoint{}
		}
		switch e.kind {
		case kindInstanceRemoved:
			delete(r.services, e.id)
			delete(r.endpoints, e.id)
		case kindServiceUpserted:
			r.services[e.id][e.service.Hostname] = e.service
		case kindServiceDeleted:
			delete(r.services[e.id], e.hostname)
			delete(r.endpoints[e.id], e.hostname)
		case kindEndpointsReplaced:
			if r.services[e.id][e.hostname] == nil {
				t.Errorf("endpoints for %s before its service", e.hostname)
			}
			r.endpoints[e.id][e.hostname] = e.endpoints
		}
	}
}

func (r *replica) addrs(id InstanceID, host string) string {
	var out []string
	for _, e := range r.endpoints[id][host] {
		out = append(out, e.Address)
	}
	return strings.Join(out, " ")
}

// TestStateInstanceSetComplete: a watcher hears of the complete instance
// set once, as a delta if it was watching, at the end of its snapshot if it
// came later; and serveWatch turns it into the flag on the snapshot_done
// response, only for a plugin that declared CapabilityInstanceSet.
func TestStateInstanceSetComplete(t *testing.T) {
	st := NewState()
	early := watch(st)
	st.SetInstance(c1, InstanceProperties{})
	st.InstanceSetComplete()
	st.InstanceSetComplete()
	expectEvents(t, early, "added c1 scoped=false net=", "instance set complete")

	late := watch(st)
	if got, snap := late.take(); !slices.Equal(got, []string{"added c1 scoped=false net=", "instance set complete"}) || snap != 2 {
		t.Errorf("late watcher's snapshot: %q (%d snapshot events)", got, snap)
	}

	for _, declared := range []bool{true, false} {
		ctx, cancel := context.WithCancel(context.Background())
		var got []*registryv1.WatchResponse
		err := st.serveWatch(context.Background(), ctx, func(r *registryv1.WatchResponse) error {
			got = append(got, r)
			cancel()
			return nil
		}, declared)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || !got[0].GetSnapshotDone() || got[0].GetInstanceSetComplete() != declared || len(got[0].GetEvents()) != 1 {
			t.Errorf("declared=%v: responses %v", declared, got)
		}
	}
}

// TestStatePluginHealth: the plugin's own health reaches watchers as a
// delta and in a later watcher's snapshot, and rides on the response as
// plugin_health.
func TestStatePluginHealth(t *testing.T) {
	st := NewState()
	early := watch(st)
	st.SetPluginHealth(InstanceHealth{Message: "connection refused"})
	st.SetPluginHealth(InstanceHealth{Message: "connection refused"})
	expectEvents(t, early, `plugin health false "connection refused"`)
	ctx, cancel := context.WithCancel(context.Background())
	var got *registryv1.WatchResponse
	err := st.serveWatch(context.Background(), ctx, func(r *registryv1.WatchResponse) error { got = r; cancel(); return nil }, true)
	cancel()
	if err != nil || got.GetPluginHealth().GetMessage() != "connection refused" || got.GetPluginHealth().GetHealthy() || len(got.GetEvents()) != 0 {
		t.Errorf("snapshot response %v, err %v; want plugin_health unhealthy, connection refused", got, err)
	}
}
