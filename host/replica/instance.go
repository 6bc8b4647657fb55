package replica

import (
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/estuary-mesh/estuary/sdk"
)

// Instance is the replica of one plugin instance.
//
// While its plugin is connected and synced, the instance applies deltas as
// they come. When the plugin disconnects the instance turns stale and keeps
// serving its last-known state. A reconnected plugin's snapshot is built
// aside, in pending, and replaces the last-known state only once the
// instance reports synced: a plugin that restarts never empties its
// instances, and whatever the new snapshot lacks is gone after the swap.
type Instance struct {
	Key InstanceKey

	mu        sync.RWMutex
	props     sdk.InstanceProperties
	live      *data
	pending   *data
	synced    bool
	stale     bool
	health    *sdk.InstanceHealth
	firstSeen time.Time
	syncedAt  time.Time
	events    uint64
	rank      int // position in the aggregate's order
	// batchGen is the batch that holds mu, so a batch that touches the
	// instance many times locks it once. Guarded by the store's mu.
	batchGen uint64
}

// data is the content of an instance.
type data struct {
	services  map[string]*Service
	endpoints map[string]*EndpointSet
	gateways  []sdk.NetworkGateway
}

func newData() *data {
	return &data{services: map[string]*Service{}, endpoints: map[string]*EndpointSet{}}
}

// Properties returns the instance's properties.
func (in *Instance) Properties() sdk.InstanceProperties {
	in.mu.RLock()
	defer in.mu.RUnlock()
	return in.props
}

// Service returns the service with the given hostname, or nil.
func (in *Instance) Service(hostname string) *Service {
	in.mu.RLock()
	defer in.mu.RUnlock()
	return in.live.services[hostname]
}

// Services returns the instance's services sorted by hostname.
func (in *Instance) Services() []*Service {
	in.mu.RLock()
	defer in.mu.RUnlock()
	out := slices.Collect(maps.Values(in.live.services))
	slices.SortFunc(out, func(a, b *Service) int { return compareStrings(a.Hostname, b.Hostname) })
	return out
}

// Hostnames returns the hostnames the instance holds, unsorted.
func (in *Instance) Hostnames() []string {
	in.mu.RLock()
	defer in.mu.RUnlock()
	return slices.Collect(maps.Keys(in.live.services))
}

// Endpoints returns the endpoints of a service; the set is immutable and
// may be nil.
func (in *Instance) Endpoints(hostname string) *EndpointSet {
	in.mu.RLock()
	defer in.mu.RUnlock()
	return in.live.endpoints[hostname]
}

// Gateways returns the network gateways the instance reports.
func (in *Instance) Gateways() []sdk.NetworkGateway {
	in.mu.RLock()
	defer in.mu.RUnlock()
	return in.live.gateways
}

// Status is what /debug/syncz and readiness need to know of an instance.
type Status struct {
	Key InstanceKey `json:"key"`
	// Synced is true once the instance has caught up with its source.
	Synced bool `json:"synced"`
	// Stale is true while the plugin is down or resyncing: the instance
	// serves its last-known state.
	Stale bool `json:"stale"`
	// Resyncing is true while a reconnected plugin's snapshot waits for sync.
	Resyncing   bool                   `json:"resyncing"`
	Health      *sdk.InstanceHealth    `json:"health,omitempty"`
	FirstSeen   time.Time              `json:"first_seen"`
	SyncedAt    time.Time              `json:"synced_at,omitzero"`
	SyncTimeout time.Duration          `json:"sync_timeout"`
	Events      uint64                 `json:"events"`
	Services    int                    `json:"services"`
	Endpoints   int                    `json:"endpoints"`
	Gateways    int                    `json:"gateways"`
	Properties  sdk.InstanceProperties `json:"properties"`
}

// Status reports the instance's sync state and size.
func (in *Instance) Status() Status {
	in.mu.RLock()
	defer in.mu.RUnlock()
	st := Status{
		Key: in.Key, Synced: in.synced, Stale: in.stale, Resyncing: in.pending != nil,
		Health: in.health, FirstSeen: in.firstSeen, SyncedAt: in.syncedAt, Events: in.events,
		Services: len(in.live.services), Gateways: len(in.live.gateways), Properties: in.props,
		SyncTimeout: in.props.SyncTimeout,
	}
	for _, s := range in.live.endpoints {
		st.Endpoints += s.Len()
	}
	return st
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
