package sdktest

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/protoconv"
)

// Replica is what a host would hold after applying a Watch stream, in SDK
// types, so plugin tests can assert on it.
type Replica struct {
	Instances map[sdk.InstanceID]*Instance
	// SnapshotDone is set once the stream's snapshot is complete.
	SnapshotDone bool
	// Responses counts applied responses.
	Responses int

	seq uint64
	err error
}

// Instance is the replicated state of one instance.
type Instance struct {
	Properties sdk.InstanceProperties
	Services   map[string]*sdk.Service
	Endpoints  map[string][]sdk.Endpoint
	Gateways   []sdk.NetworkGateway
	Synced     bool
	// Health is nil until the plugin reports health.
	Health *sdk.InstanceHealth
}

// NewReplica returns an empty replica.
func NewReplica() *Replica { return &Replica{Instances: map[sdk.InstanceID]*Instance{}} }

// Instance returns the instance with the given identity, or nil.
func (r *Replica) Instance(provider, cluster string) *Instance {
	return r.Instances[sdk.InstanceID{Provider: provider, Cluster: cluster}]
}

// Apply applies one response and reports the first protocol violation.
func (r *Replica) Apply(resp *registryv1.WatchResponse) error {
	r.Responses++
	if resp.GetSequence() != r.seq+1 {
		return r.fail("sequence %d follows %d; want %d", resp.GetSequence(), r.seq, r.seq+1)
	}
	r.seq = resp.GetSequence()
	switch {
	case !r.SnapshotDone && !resp.GetSnapshot():
		return r.fail("response %d is not marked snapshot, but the snapshot is not done", r.seq)
	case r.SnapshotDone && (resp.GetSnapshot() || resp.GetSnapshotDone()):
		return r.fail("response %d is marked snapshot after the snapshot was done", r.seq)
	}
	for i, ev := range resp.GetEvents() {
		if err := r.applyEvent(ev); err != nil {
			return r.fail("response %d event %d: %v", r.seq, i, err)
		}
	}
	if resp.GetSnapshotDone() {
		r.SnapshotDone = true
	}
	return nil
}

func (r *Replica) fail(format string, args ...any) error {
	if r.err == nil {
		r.err = fmt.Errorf(format, args...)
	}
	return r.err
}

func (r *Replica) applyEvent(ev *registryv1.Event) error {
	pid := ev.GetInstance()
	if pid.GetProvider() == "" || pid.GetCluster() == "" {
		return fmt.Errorf("event %T has no instance identity (provider %q, cluster %q)", ev.GetKind(), pid.GetProvider(), pid.GetCluster())
	}
	id := sdk.InstanceID{Provider: pid.GetProvider(), Cluster: pid.GetCluster()}
	in := r.Instances[id]
	if _, added := ev.GetKind().(*registryv1.Event_InstanceAdded); !added && in == nil {
		return fmt.Errorf("%T for instance %s before it was added", ev.GetKind(), id)
	}
	switch k := ev.GetKind().(type) {
	case *registryv1.Event_InstanceAdded:
		if in == nil {
			in = &Instance{Services: map[string]*sdk.Service{}, Endpoints: map[string][]sdk.Endpoint{}}
			r.Instances[id] = in
		}
		in.Properties = protoconv.Properties(k.InstanceAdded.GetProperties())
	case *registryv1.Event_InstanceRemoved:
		delete(r.Instances, id)
	case *registryv1.Event_ServiceUpserted:
		svc := protoconv.Service(k.ServiceUpserted.GetService())
		if svc.Hostname == "" {
			return fmt.Errorf("service without hostname in %s", id)
		}
		in.Services[svc.Hostname] = svc
	case *registryv1.Event_ServiceDeleted:
		delete(in.Services, k.ServiceDeleted.GetHostname())
		delete(in.Endpoints, k.ServiceDeleted.GetHostname())
	case *registryv1.Event_EndpointsReplaced:
		h := k.EndpointsReplaced.GetHostname()
		if _, ok := in.Services[h]; !ok {
			return fmt.Errorf("endpoints for unknown service %q in %s", h, id)
		}
		in.Endpoints[h] = protoconv.Endpoints(k.EndpointsReplaced)
	case *registryv1.Event_GatewaysReplaced:
		in.Gateways = nil
		for _, g := range k.GatewaysReplaced.GetGateways() {
			in.Gateways = append(in.Gateways, protoconv.Gateway(g))
		}
	case *registryv1.Event_InstanceSynced:
		in.Synced = true
	case *registryv1.Event_InstanceHealth:
		in.Health = protoconv.Health(k.InstanceHealth)
	default:
		return fmt.Errorf("event of unknown kind %T", ev.GetKind())
	}
	return nil
}

// Diff describes how two replicas' contents differ ("" if equal). Sync and
// health flags are not compared.
func (r *Replica) Diff(o *Replica) string {
	var b strings.Builder
	for _, id := range sortedIDs(r.Instances, o.Instances) {
		a, c := r.Instances[id], o.Instances[id]
		switch {
		case a == nil:
			fmt.Fprintf(&b, "instance %s only in second\n", id)
			continue
		case c == nil:
			fmt.Fprintf(&b, "instance %s only in first\n", id)
			continue
		}
		for _, h := range unionKeys(a.Services, c.Services) {
			sa, sc := a.Services[h], c.Services[h]
			if sa == nil || sc == nil || !sa.Equal(sc) {
				fmt.Fprintf(&b, "%s: service %s differs: %+v vs %+v\n", id, h, sa, sc)
			}
		}
		for _, h := range unionKeys(a.Endpoints, c.Endpoints) {
			if !slices.EqualFunc(a.Endpoints[h], c.Endpoints[h], func(x, y sdk.Endpoint) bool { return x.Equal(&y) }) {
				fmt.Fprintf(&b, "%s: endpoints of %s differ: %d vs %d endpoints\n", id, h, len(a.Endpoints[h]), len(c.Endpoints[h]))
			}
		}
		if !slices.Equal(a.Gateways, c.Gateways) {
			fmt.Fprintf(&b, "%s: gateways differ: %v vs %v\n", id, a.Gateways, c.Gateways)
		}
	}
	return b.String()
}

// String summarises the replica for failure messages.
func (r *Replica) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "snapshot done: %v, responses: %d\n", r.SnapshotDone, r.Responses)
	for _, id := range sortedIDs(r.Instances, nil) {
		in := r.Instances[id]
		n := 0
		for _, eps := range in.Endpoints {
			n += len(eps)
		}
		health := "unknown"
		if in.Health != nil {
			health = fmt.Sprintf("%v (%s, %d notices)", in.Health.Healthy, in.Health.Message, len(in.Health.Notices))
		}
		fmt.Fprintf(&b, "  %s: %d services, %d endpoints, %d gateways, synced %v, healthy %s\n",
			id, len(in.Services), n, len(in.Gateways), in.Synced, health)
	}
	return b.String()
}

func sortedIDs(a, b map[sdk.InstanceID]*Instance) []sdk.InstanceID {
	ids := slices.Collect(maps.Keys(a))
	for id := range b {
		if _, ok := a[id]; !ok {
			ids = append(ids, id)
		}
	}
	slices.SortFunc(ids, func(x, y sdk.InstanceID) int { return strings.Compare(x.String(), y.String()) })
	return ids
}

func unionKeys[V any](a, b map[string]V) []string {
	keys := slices.Collect(maps.Keys(a))
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}
