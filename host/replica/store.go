package replica

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/estuary-mesh/estuary/host/model"
	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/pluginclient"
	"github.com/estuary-mesh/estuary/sdk/protoconv"
)

// Store holds every instance of every plugin.
type Store struct {
	mu         sync.RWMutex
	instances  map[InstanceKey]*Instance
	ordered    []*Instance
	pluginRank map[string]int
	seq        int    // first-seen counter, for stable order within a plugin
	batchGen   uint64 // numbers applied batches; see batchTx

	subsMu sync.Mutex
	subs   []func(model.Change)

	metrics *metrics
	applied atomic.Uint64
}

// EndpointUpdates counts endpoints applied since the store was made.
func (s *Store) EndpointUpdates() uint64 { return s.applied.Load() }

type metrics struct {
	events    *prometheus.CounterVec
	instances *prometheus.GaugeVec
	endpoints prometheus.Counter
}

// NewStore returns an empty store. Metrics are registered with reg when it
// is not nil.
func NewStore(reg prometheus.Registerer) *Store {
	m := &metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "estuary_registry_events_total", Help: "Registry events applied from plugins, by plugin and kind.",
		}, []string{"plugin", "kind"}),
		instances: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "estuary_registry_instances", Help: "Registry instances held, by plugin and provider.",
		}, []string{"plugin", "provider"}),
		endpoints: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "estuary_registry_endpoint_updates_total", Help: "Endpoints applied from EndpointsReplaced events.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.events, m.instances, m.endpoints)
	}
	return &Store{instances: map[InstanceKey]*Instance{}, pluginRank: map[string]int{}, metrics: m}
}

// Subscribe registers fn to be called after every applied batch that
// changed something. Calls are serialised per plugin session, not globally.
func (s *Store) Subscribe(fn func(model.Change)) {
	s.subsMu.Lock()
	defer s.subsMu.Unlock()
	s.subs = append(s.subs, fn)
}

func (s *Store) publish(c model.Change) {
	if c.Empty() {
		return
	}
	s.subsMu.Lock()
	subs := slices.Clone(s.subs)
	s.subsMu.Unlock()
	for _, fn := range subs {
		fn(c)
	}
}

// SetPluginOrder sets the order of plugins (plugins.hcl order), which
// orders instances: first by plugin, then by when they were first seen.
func (s *Store) SetPluginOrder(plugins []string) {
	s.mu.Lock()
	clear(s.pluginRank)
	for i, p := range plugins {
		s.pluginRank[p] = i
	}
	s.reorderLocked()
	s.mu.Unlock()
	s.publish(model.Change{Full: true})
}

func (s *Store) reorderLocked() {
	// A new slice each time: readers hold the old one without copying it.
	ordered := make([]*Instance, 0, len(s.instances))
	for _, in := range s.instances {
		ordered = append(ordered, in)
	}
	s.ordered = ordered
	slices.SortFunc(s.ordered, func(a, b *Instance) int {
		ra, oka := s.pluginRank[a.Key.Plugin]
		rb, okb := s.pluginRank[b.Key.Plugin]
		if !oka {
			ra = len(s.pluginRank)
		}
		if !okb {
			rb = len(s.pluginRank)
		}
		return cmp.Or(cmp.Compare(ra, rb), cmp.Compare(a.rank, b.rank))
	})
}

// Instances returns every instance in aggregate order. The slice is shared
// and never changes: do not modify it.
func (s *Store) Instances() []*Instance {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.ordered
}

// Instance returns the instance with the given key, or nil.
func (s *Store) Instance(k InstanceKey) *Instance {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.instances[k]
}

// RemovePlugin drops every instance of a plugin, when the operator removes
// its block from plugins.hcl.
func (s *Store) RemovePlugin(plugin string) {
	s.mu.Lock()
	removed := false
	for k := range s.instances {
		if k.Plugin == plugin {
			delete(s.instances, k)
			s.metrics.instances.WithLabelValues(k.Plugin, k.Provider).Dec()
			removed = true
		}
	}
	if removed {
		s.reorderLocked()
	}
	s.mu.Unlock()
	if removed {
		s.publish(model.Change{Full: true})
	}
}

// Disconnected marks every instance of a plugin stale: its stream broke or
// its process died. The instances keep serving their last-known state; a
// half-built resync snapshot is dropped.
func (s *Store) Disconnected(plugin string) {
	for _, in := range s.Instances() {
		if in.Key.Plugin != plugin {
			continue
		}
		in.mu.Lock()
		in.stale = true
		in.pending = nil
		in.mu.Unlock()
	}
}

// Session applies one Watch stream of a plugin. A new session starts for
// every (re)connection; it begins with the plugin's snapshot.
type Session struct {
	store  *Store
	plugin string
	inSnap map[InstanceKey]bool // instances the snapshot mentioned
	done   bool                 // snapshot complete
	// known are the plugin's instances when the session began: their
	// snapshot is built aside until they sync.
	known map[InstanceKey]bool
	// wire decodes the responses given to Apply.
	wire *protoconv.Stream
}

// NewSession starts applying a new stream of plugin.
func (s *Store) NewSession(plugin string) *Session {
	sess := &Session{store: s, plugin: plugin, inSnap: map[InstanceKey]bool{}, known: map[InstanceKey]bool{}}
	for _, in := range s.Instances() {
		if in.Key.Plugin == plugin {
			sess.known[in.Key] = true
		}
	}
	return sess
}

// SnapshotDone reports whether the session's snapshot has been applied.
func (sess *Session) SnapshotDone() bool { return sess.done }

// Apply checks and decodes one wire response with the SDK's stream decoder,
// as the plugin client does, and applies it with ApplyBatch. It serves
// callers that hold wire messages (fixtures, tests and benchmarks that
// build them by hand). Not knowing the plugin's capabilities, it grants
// them all; the supervisor reads plugins through pluginclient, which holds
// each plugin to what it declared. An error means the stream broke the
// protocol and nothing of the response was applied; the session must not
// be used again.
func (sess *Session) Apply(resp *registryv1.WatchResponse) error {
	if sess.wire == nil {
		sess.wire = protoconv.NewStream(sdk.CapabilityMultiInstance, sdk.CapabilityGateways)
	}
	b, err := sess.wire.Decode(resp)
	if err != nil {
		return err
	}
	sess.ApplyBatch(b)
	return nil
}

// ApplyBatch applies one batch of the session's stream, atomically: every
// instance it touches is locked until the whole batch is in, so a reader
// sees each instance before the batch or after it, never half of it, and
// subscribers hear of the batch once. The batch must come from the
// session's own stream, in order, as pluginclient.WatchStream yields it:
// checked against the protocol, so nothing in it can fail.
func (sess *Session) ApplyBatch(b *pluginclient.Batch) {
	s := sess.store
	var change model.Change
	var kinds [pluginclient.NumKinds]int
	s.mu.Lock()
	tx := s.begin()
	for i := range b.Events {
		ev := &b.Events[i]
		kinds[ev.Kind]++
		sess.apply(tx, ev, &change)
	}
	if b.SnapshotDone && !sess.done {
		sess.finishSnapshot(tx, &change)
	}
	if tx.reorder {
		s.reorderLocked()
	}
	tx.unlock()
	s.mu.Unlock()
	for k, n := range kinds {
		if n > 0 {
			s.metrics.events.WithLabelValues(sess.plugin, pluginclient.Kind(k).String()).Add(float64(n))
		}
	}
	s.publish(change)
}

// batchTx is one batch being applied. The store's lock is held for
// writing throughout, which keeps other writers out, so instance locks can
// be taken in any order without deadlock; each is taken once and released
// after the whole batch.
type batchTx struct {
	gen     uint64
	held    []*Instance
	reorder bool // instances were added or removed
}

// begin starts applying a batch. Caller holds s.mu for writing.
func (s *Store) begin() *batchTx {
	s.batchGen++
	return &batchTx{gen: s.batchGen}
}

// lock locks in for the rest of the batch, once.
func (tx *batchTx) lock(in *Instance) {
	if in.batchGen == tx.gen {
		return
	}
	in.mu.Lock()
	in.batchGen = tx.gen
	tx.held = append(tx.held, in)
}

func (tx *batchTx) unlock() {
	for _, in := range tx.held {
		in.mu.Unlock()
	}
}

// finishSnapshot removes instances the snapshot no longer has and clears
// the stale mark of instances whose new state is live.
func (sess *Session) finishSnapshot(tx *batchTx, change *model.Change) {
	sess.done = true
	s := sess.store
	for k, in := range s.instances {
		if k.Plugin != sess.plugin {
			continue
		}
		if !sess.inSnap[k] {
			delete(s.instances, k)
			s.metrics.instances.WithLabelValues(k.Plugin, k.Provider).Dec()
			change.Full = true
			tx.reorder = true
			continue
		}
		tx.lock(in)
		if in.pending == nil {
			in.stale = false
		}
	}
}

// apply applies one event of a checked batch. Caller holds s.mu for
// writing.
func (sess *Session) apply(tx *batchTx, ev *pluginclient.Event, change *model.Change) {
	key := InstanceKey{Plugin: sess.plugin, Provider: ev.Instance.Provider, Cluster: ev.Instance.Cluster}
	s := sess.store
	switch ev.Kind {
	case pluginclient.KindInstanceAdded:
		sess.addInstance(tx, key, ev.Properties, change)
		return
	case pluginclient.KindInstanceRemoved:
		if _, ok := s.instances[key]; ok {
			delete(s.instances, key)
			s.metrics.instances.WithLabelValues(key.Plugin, key.Provider).Dec()
			tx.reorder = true
			change.Full = true
		}
		delete(sess.inSnap, key)
		return
	}

	// The stream was checked: the instance was added on it before.
	in := s.instances[key]
	tx.lock(in)
	in.events++
	target := in.live
	if in.pending != nil {
		target = in.pending
	}
	visible := target == in.live
	switch ev.Kind {
	case pluginclient.KindServiceUpserted:
		target.services[ev.Service.Hostname] = ev.Service
		if visible {
			change.Touch(ev.Service.Hostname, true)
		}
	case pluginclient.KindServiceDeleted:
		h := ev.Hostname
		if _, ok := target.services[h]; ok {
			delete(target.services, h)
			delete(target.endpoints, h)
			if visible {
				change.Touch(h, true)
			}
		}
	case pluginclient.KindEndpointsReplaced:
		target.endpoints[ev.Hostname] = ev.Endpoints
		n := ev.Endpoints.Len()
		s.metrics.endpoints.Add(float64(n))
		s.applied.Add(uint64(n))
		if visible {
			change.Touch(ev.Hostname, false)
		}
	case pluginclient.KindGatewaysReplaced:
		target.gateways = ev.Gateways
		if visible {
			change.Full = true
		}
	case pluginclient.KindInstanceSynced:
		if !in.synced || in.pending != nil {
			in.syncedAt = time.Now()
		}
		in.synced = true
		if in.pending != nil {
			in.live, in.pending = in.pending, nil
			change.Full = true
		}
		if sess.done {
			in.stale = false
		}
	case pluginclient.KindInstanceHealth:
		in.health = ev.Health
	}
}

func (sess *Session) addInstance(tx *batchTx, key InstanceKey, props sdk.InstanceProperties, change *model.Change) {
	s := sess.store
	// Only the first mention in a snapshot starts building the instance
	// aside: a second one (new properties) must not throw away what the
	// snapshot has built since.
	first := !sess.inSnap[key]
	if !sess.done {
		sess.inSnap[key] = true
	}
	in, ok := s.instances[key]
	if !ok {
		s.seq++
		in = &Instance{Key: key, live: newData(), firstSeen: time.Now(), rank: s.seq}
		s.instances[key] = in
		s.metrics.instances.WithLabelValues(key.Plugin, key.Provider).Inc()
		tx.reorder = true
		change.Full = true
	}
	tx.lock(in)
	if in.props != props {
		in.props = props
		change.Full = true
	}
	if !sess.done && first && sess.known[key] && in.pending == nil {
		// A reconnect: build the new snapshot aside, keep serving the old.
		in.pending = newData()
		in.stale = true
	}
}
