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

	// sets is the instance set of each plugin's current session.
	sets map[string]*instanceSet

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
	setDone   *prometheus.GaugeVec
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
		setDone: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "estuary_plugin_instance_set_complete",
			Help: "1 once the plugin's current stream has declared every instance (or its sync timeout passed), 0 while the host waits and serves the instances it knew before.",
		}, []string{"plugin"}),
	}
	if reg != nil {
		reg.MustRegister(m.events, m.instances, m.endpoints, m.setDone)
	}
	return &Store{instances: map[InstanceKey]*Instance{}, pluginRank: map[string]int{}, sets: map[string]*instanceSet{}, metrics: m}
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
	delete(s.sets, plugin)
	s.metrics.setDone.DeleteLabelValues(plugin)
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
//
// Instances the plugin had before the session that the session has not
// mentioned yet keep serving, stale, until the plugin's instance set is
// complete: the plugin says so (Batch.InstanceSetComplete, which an older
// plugin's snapshot_done implies) or Expire is called when its sync
// timeout passes. Only then are they removed. So a plugin that restarts
// while a source is down (a remote cluster not yet rediscovered, a Consul
// datacenter list not yet fetched) does not take that source's last-known
// state with it.
type Session struct {
	store  *Store
	plugin string
	// mentioned are the instances the session has added and not removed.
	// Guarded by the store's mu.
	mentioned map[InstanceKey]bool
	done      bool // snapshot complete; read with SnapshotDone
	// known are the plugin's instances when the session began: their new
	// state is built aside until they sync.
	known map[InstanceKey]bool
	set   *instanceSet
	// wire decodes the responses given to Apply.
	wire *protoconv.Stream
}

// instanceSet is the state of one plugin's instance set, for readiness and
// /debug/syncz. Guarded by the store's mu.
type instanceSet struct {
	sess        *Session
	since       time.Time
	timeoutAt   time.Time
	completedAt time.Time
	by          string
	health      *sdk.InstanceHealth
}

// InstanceSetStatus is whether a plugin's current stream has declared every
// instance it will report.
type InstanceSetStatus struct {
	Plugin string `json:"plugin"`
	// Complete is true once the plugin said so, or its sync timeout passed.
	Complete bool `json:"complete"`
	// CompletedBy says how: "plugin" (instance_set_complete, or
	// snapshot_done from a plugin without CAPABILITY_INSTANCE_SET) or
	// "sync timeout".
	CompletedBy string `json:"completed_by,omitempty"`
	// Since is when the stream began; the host has been waiting since then
	// while Complete is false.
	Since       time.Time `json:"since"`
	CompletedAt time.Time `json:"completed_at,omitzero"`
	// TimeoutAt is when the host stops waiting, if a timeout is armed.
	TimeoutAt time.Time `json:"timeout_at,omitzero"`
	// Health is the plugin's connection to the source that lists its
	// instances, as it last reported it (nil: never reported).
	Health *sdk.InstanceHealth `json:"plugin_health,omitempty"`
}

// InstanceSet reports the instance set of plugin's current stream; false if
// the plugin has never connected.
func (s *Store) InstanceSet(plugin string) (InstanceSetStatus, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	set, ok := s.sets[plugin]
	if !ok {
		return InstanceSetStatus{Plugin: plugin}, false
	}
	return InstanceSetStatus{Plugin: plugin, Complete: !set.completedAt.IsZero(), CompletedBy: set.by,
		Since: set.since, CompletedAt: set.completedAt, TimeoutAt: set.timeoutAt, Health: set.health}, true
}

// NewSession starts applying a new stream of plugin.
func (s *Store) NewSession(plugin string) *Session {
	sess := &Session{store: s, plugin: plugin, mentioned: map[InstanceKey]bool{}, known: map[InstanceKey]bool{}}
	s.mu.Lock()
	for k := range s.instances {
		if k.Plugin == plugin {
			sess.known[k] = true
		}
	}
	sess.set = &instanceSet{sess: sess, since: time.Now()}
	s.sets[plugin] = sess.set
	s.metrics.setDone.WithLabelValues(plugin).Set(0)
	s.mu.Unlock()
	return sess
}

// ExpireAfter arms the session's sync timeout, counted from the session's
// start: if the instance set is not complete by then, Expire completes it.
// The returned function disarms it; call it when the session ends.
func (sess *Session) ExpireAfter(d time.Duration) (stop func() bool) {
	sess.store.mu.Lock()
	sess.set.timeoutAt = sess.set.since.Add(d)
	at := sess.set.timeoutAt
	sess.store.mu.Unlock()
	return time.AfterFunc(time.Until(at), sess.Expire).Stop
}

// Expire gives up waiting for the plugin to declare its instance set, as
// when its sync timeout passes: the instances the session has not
// mentioned are removed. It does nothing once the set is complete, or once
// a newer session of the plugin has begun.
func (sess *Session) Expire() {
	s := sess.store
	var change model.Change
	s.mu.Lock()
	if s.sets[sess.plugin] != sess.set || !sess.set.completedAt.IsZero() {
		s.mu.Unlock()
		return
	}
	tx := s.begin()
	sess.completeSet(tx, &change, "sync timeout")
	if tx.reorder {
		s.reorderLocked()
	}
	tx.unlock()
	s.mu.Unlock()
	s.publish(change)
}

// SnapshotDone reports whether the session's snapshot has been applied.
func (sess *Session) SnapshotDone() bool {
	sess.store.mu.RLock()
	defer sess.store.mu.RUnlock()
	return sess.done
}

// InstanceSetComplete reports whether the session's instance set is
// complete: declared by the plugin or given up on by Expire.
func (sess *Session) InstanceSetComplete() bool {
	sess.store.mu.RLock()
	defer sess.store.mu.RUnlock()
	return !sess.set.completedAt.IsZero()
}

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
		sess.finishSnapshot(tx)
	}
	if b.PluginHealth != nil {
		sess.set.health = b.PluginHealth
	}
	if b.InstanceSetComplete && sess.set.completedAt.IsZero() {
		sess.completeSet(tx, &change, "plugin")
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

// finishSnapshot clears the stale mark of instances the snapshot mentioned
// whose new state is live. Instances it did not mention wait for the
// instance set to be complete.
func (sess *Session) finishSnapshot(tx *batchTx) {
	sess.done = true
	s := sess.store
	for k := range sess.mentioned {
		in := s.instances[k]
		tx.lock(in)
		if in.pending == nil {
			in.stale = false
		}
	}
}

// completeSet removes the plugin's instances that the session has not
// mentioned: the plugin has declared every instance it will report, or
// the host stopped waiting. Caller holds s.mu for writing.
func (sess *Session) completeSet(tx *batchTx, change *model.Change, by string) {
	s := sess.store
	sess.set.completedAt, sess.set.by = time.Now(), by
	s.metrics.setDone.WithLabelValues(sess.plugin).Set(1)
	for k := range s.instances {
		if k.Plugin != sess.plugin || sess.mentioned[k] {
			continue
		}
		delete(s.instances, k)
		s.metrics.instances.WithLabelValues(k.Plugin, k.Provider).Dec()
		change.Full = true
		tx.reorder = true
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
		delete(sess.mentioned, key)
		// Added again later, it starts from nothing: no state to keep.
		delete(sess.known, key)
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
	// Only the first mention on the session starts building the instance
	// aside: a second one (new properties) must not throw away what the
	// session has built since.
	first := !sess.mentioned[key]
	sess.mentioned[key] = true
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
	if first && sess.known[key] && in.pending == nil {
		// A reconnect: build the new state aside, keep serving the old,
		// whether the instance comes in the snapshot or is rediscovered
		// after it.
		in.pending = newData()
		in.stale = true
	}
}
