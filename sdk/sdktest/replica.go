package sdktest

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/internal/stream"
)

// Replica is what a host would hold after applying a Watch stream, in SDK
// types, so plugin tests can assert on it. It checks the stream with the
// same validator the host's plugin client runs.
type Replica struct {
	Instances map[sdk.InstanceID]*Instance
	// SnapshotDone is set once the stream's snapshot is complete.
	SnapshotDone bool
	// InstanceSetComplete is set once the plugin has said every instance
	// it will report is declared (for a plugin without
	// CAPABILITY_INSTANCE_SET, with snapshot_done); DeclaredAtComplete are
	// the instances the replica held then.
	InstanceSetComplete bool
	DeclaredAtComplete  []sdk.InstanceID
	// PluginHealth is the plugin's own health as last reported, or nil.
	PluginHealth *sdk.InstanceHealth
	// Responses counts applied responses.
	Responses int

	// decoder checks the responses given to Apply; a Watcher's replica has
	// none, because the plugin client checks its stream.
	decoder *stream.Decoder
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

// NewReplica returns an empty replica for the responses of one raw Watch
// stream, given to Apply. Not knowing the plugin's capabilities, it checks
// every rule of the protocol but those that depend on them; the conformance
// suite's watchers (Harness.Watch) check those too.
func NewReplica() *Replica {
	r := newReplica()
	r.decoder = stream.NewDecoder([]sdk.Capability{sdk.CapabilityMultiInstance, sdk.CapabilityGateways, sdk.CapabilityInstanceSet})
	return r
}

func newReplica() *Replica { return &Replica{Instances: map[sdk.InstanceID]*Instance{}} }

// Instance returns the instance with the given identity, or nil.
func (r *Replica) Instance(provider, cluster string) *Instance {
	return r.Instances[sdk.InstanceID{Provider: provider, Cluster: cluster}]
}

// Apply applies one response, all or nothing. It returns the first
// protocol violation of the stream (a *pluginclient.ProtocolError naming
// the batch and event), on this response and every later one.
func (r *Replica) Apply(resp *registryv1.WatchResponse) error {
	r.Responses++
	b, err := r.decoder.Decode(resp)
	if err != nil {
		return err
	}
	r.apply(b)
	return nil
}

// apply applies a batch the decoder has checked, so nothing in it can fail.
func (r *Replica) apply(b *stream.Batch) {
	for i := range b.Events {
		ev := &b.Events[i]
		in := r.Instances[ev.Instance]
		switch ev.Kind {
		case stream.KindInstanceAdded:
			if in == nil {
				in = &Instance{Services: map[string]*sdk.Service{}, Endpoints: map[string][]sdk.Endpoint{}}
				r.Instances[ev.Instance] = in
			}
			in.Properties = ev.Properties
		case stream.KindInstanceRemoved:
			delete(r.Instances, ev.Instance)
		case stream.KindServiceUpserted:
			in.Services[ev.Service.Hostname] = ev.Service
		case stream.KindServiceDeleted:
			delete(in.Services, ev.Hostname)
			delete(in.Endpoints, ev.Hostname)
		case stream.KindEndpointsReplaced:
			in.Endpoints[ev.Hostname] = sdkEndpoints(ev.Endpoints)
		case stream.KindGatewaysReplaced:
			in.Gateways = ev.Gateways
		case stream.KindInstanceSynced:
			in.Synced = true
		case stream.KindInstanceHealth:
			in.Health = ev.Health
		}
	}
	if b.SnapshotDone {
		r.SnapshotDone = true
	}
	if b.PluginHealth != nil {
		r.PluginHealth = b.PluginHealth
	}
	if b.InstanceSetComplete {
		r.InstanceSetComplete = true
		r.DeclaredAtComplete = slices.SortedFunc(maps.Keys(r.Instances), func(a, b sdk.InstanceID) int { return strings.Compare(a.String(), b.String()) })
	}
}

// sdkEndpoints expands the decoder's compact endpoints into the SDK's type,
// which plugin tests compare with what they published.
func sdkEndpoints(set *stream.EndpointSet) []sdk.Endpoint {
	out := make([]sdk.Endpoint, set.Len())
	for i := range out {
		e := &set.Endpoints[i]
		out[i] = sdk.Endpoint{
			Address:             e.Address,
			AdditionalAddresses: e.AdditionalAddresses(),
			TargetPorts:         e.TargetPorts,
			Labels:              e.Labels,
			Network:             e.Network,
			Locality:            sdk.ParseLocality(e.Locality),
			Weight:              e.Weight,
			TLSMode:             e.TLSMode,
			ServiceAccount:      e.ServiceAccount,
			Health:              e.Health,
			WorkloadName:        e.WorkloadName,
		}
	}
	return out
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
