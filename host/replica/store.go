package replica

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/estuary-mesh/estuary/host/model"
	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/protoconv"
)

// Store holds every instance of every plugin.
type Store struct {
	mu         sync.RWMutex
	instances  map[InstanceKey]*Instance
	ordered    []*Instance
	pluginRank map[string]int
	seq        int // first-seen counter, for stable order within a plugin

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
	seq    uint64
	inSnap map[InstanceKey]bool // instances the snapshot mentioned
	done   bool                 // snapshot complete
	// known are the plugin's instances when the session began: their
	// snapshot is built aside until they sync.
	known map[InstanceKey]bool
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

// Apply applies one response. An error means the stream broke the protocol
// (a sequence gap, an event for an unknown instance); the caller drops the
// stream and reconnects, which starts over with a snapshot.
func (sess *Session) Apply(resp *registryv1.WatchResponse) error {
	if resp.GetSequence() != sess.seq+1 {
		return fmt.Errorf("sequence %d after %d", resp.GetSequence(), sess.seq)
	}
	sess.seq = resp.GetSequence()
	if !sess.done && !resp.GetSnapshot() {
		return fmt.Errorf("response %d is a delta before the snapshot was done", sess.seq)
	}
	if sess.done && (resp.GetSnapshot() || resp.GetSnapshotDone()) {
		return fmt.Errorf("response %d is marked snapshot after the snapshot was done", sess.seq)
	}
	var change model.Change
	for i, ev := range resp.GetEvents() {
		if err := sess.applyEvent(ev, &change); err != nil {
			sess.store.publish(change)
			return fmt.Errorf("response %d event %d: %w", sess.seq, i, err)
		}
	}
	if resp.GetSnapshotDone() && !sess.done {
		sess.finishSnapshot(&change)
	}
	sess.store.publish(change)
	return nil
}

// finishSnapshot removes instances the snapshot no longer has and clears
// the stale mark of instances whose new state is live.
func (sess *Session) finishSnapshot(change *model.Change) {
	sess.done = true
	s := sess.store
	s.mu.Lock()
	for k, in := range s.instances {
		if k.Plugin != sess.plugin {
			continue
		}
		if !sess.inSnap[k] {
			delete(s.instances, k)
			s.metrics.instances.WithLabelValues(k.Plugin, k.Provider).Dec()
			change.Full = true
			continue
		}
		in.mu.Lock()
		if in.pending == nil {
			in.stale = false
		}
		in.mu.Unlock()
	}
	if change.Full {
		s.reorderLocked()
	}
	s.mu.Unlock()
}

func (sess *Session) applyEvent(ev *registryv1.Event, change *model.Change) error {
	id := ev.GetInstance()
	if id.GetProvider() == "" || id.GetCluster() == "" {
		return fmt.Errorf("event without instance identity")
	}
	key := InstanceKey{Plugin: sess.plugin, Provider: id.GetProvider(), Cluster: id.GetCluster()}
	s := sess.store
	s.metrics.events.WithLabelValues(sess.plugin, eventKind(ev)).Inc()

	if added, ok := ev.GetKind().(*registryv1.Event_InstanceAdded); ok {
		sess.addInstance(key, protoconv.Properties(added.InstanceAdded.GetProperties()), change)
		return nil
	}
	if _, ok := ev.GetKind().(*registryv1.Event_InstanceRemoved); ok {
		s.mu.Lock()
		if _, ok := s.instances[key]; ok {
			delete(s.instances, key)
			s.metrics.instances.WithLabelValues(key.Plugin, key.Provider).Dec()
			s.reorderLocked()
			change.Full = true
		}
		delete(sess.inSnap, key)
		s.mu.Unlock()
		return nil
	}

	in := s.Instance(key)
	if in == nil {
		return fmt.Errorf("%T for instance %s that was never added", ev.GetKind(), key)
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	in.events++
	target := in.live
	if in.pending != nil {
		target = in.pending
	}
	visible := target == in.live
	switch k := ev.GetKind().(type) {
	case *registryv1.Event_ServiceUpserted:
		svc := protoconv.Service(k.ServiceUpserted.GetService())
		if svc.Hostname == "" {
			return fmt.Errorf("service without hostname")
		}
		target.services[svc.Hostname] = svc
		if visible {
			change.Touch(svc.Hostname, true)
		}
	case *registryv1.Event_ServiceDeleted:
		h := k.ServiceDeleted.GetHostname()
		if _, ok := target.services[h]; ok {
			delete(target.services, h)
			delete(target.endpoints, h)
			if visible {
				change.Touch(h, true)
			}
		}
	case *registryv1.Event_EndpointsReplaced:
		h := k.EndpointsReplaced.GetHostname()
		if _, ok := target.services[h]; !ok {
			return fmt.Errorf("endpoints for unknown service %q", h)
		}
		set := decodeEndpoints(k.EndpointsReplaced)
		target.endpoints[h] = set
		s.metrics.endpoints.Add(float64(set.Len()))
		s.applied.Add(uint64(set.Len()))
		if visible {
			change.Touch(h, false)
		}
	case *registryv1.Event_GatewaysReplaced:
		gws := make([]sdk.NetworkGateway, len(k.GatewaysReplaced.GetGateways()))
		for i, g := range k.GatewaysReplaced.GetGateways() {
			gws[i] = protoconv.Gateway(g)
		}
		target.gateways = gws
		if visible {
			change.Full = true
		}
	case *registryv1.Event_InstanceSynced:
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
	case *registryv1.Event_InstanceHealth:
		in.health = protoconv.Health(k.InstanceHealth)
	default:
		return fmt.Errorf("event of unknown kind %T", ev.GetKind())
	}
	return nil
}

func (sess *Session) addInstance(key InstanceKey, props sdk.InstanceProperties, change *model.Change) {
	s := sess.store
	s.mu.Lock()
	defer s.mu.Unlock()
	if !sess.done {
		sess.inSnap[key] = true
	}
	in, ok := s.instances[key]
	if !ok {
		s.seq++
		in = &Instance{Key: key, live: newData(), firstSeen: time.Now(), rank: s.seq}
		s.instances[key] = in
		s.metrics.instances.WithLabelValues(key.Plugin, key.Provider).Inc()
		s.reorderLocked()
		change.Full = true
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.props != props {
		in.props = props
		change.Full = true
	}
	if !sess.done && sess.known[key] && in.pending == nil {
		// A reconnect: build the new snapshot aside, keep serving the old.
		in.pending = newData()
		in.stale = true
	}
}

// decodeEndpoints converts wire endpoints into the compact form. Shared
// label and port sets are decoded once; strings that many endpoints repeat
// are interned.
func decodeEndpoints(m *registryv1.EndpointsReplaced) *EndpointSet {
	in := m.GetEndpoints()
	set := &EndpointSet{Endpoints: make([]Endpoint, len(in))}
	var cache labelCache
	var network, locality, account stringCache
	labelSets, portSets := m.GetLabelSets(), m.GetPortSets()
	strs := make([]string, len(m.GetStrings()))
	for i, s := range m.GetStrings() {
		strs[i] = intern(s)
	}
	ref := func(n uint32, direct string, c *stringCache) string {
		if n > 0 && int(n) <= len(strs) {
			return strs[n-1]
		}
		return c.intern(direct)
	}
	for i, p := range in {
		e := &set.Endpoints[i]
		e.Address = p.GetAddress()
		if n := p.GetLabelSet(); n > 0 && int(n) <= len(labelSets) {
			e.Labels = labelSets[n-1].GetEntries()
		} else {
			e.Labels = cache.labelsFor(p.GetLabels())
		}
		if n := p.GetPortSet(); n > 0 && int(n) <= len(portSets) {
			e.TargetPorts = portSets[n-1].GetEntries()
		} else {
			e.TargetPorts = cache.portsFor(p.GetTargetPorts())
		}
		e.Network = ref(p.GetNetworkRef(), p.GetNetwork(), &network)
		e.Locality = ref(p.GetLocalityRef(), p.GetLocality(), &locality)
		e.ServiceAccount = ref(p.GetServiceAccountRef(), p.GetServiceAccount(), &account)
		e.WorkloadName = p.GetWorkloadName()
		e.Weight = p.GetWeight()
		e.TLSMode = sdk.TLSMode(p.GetTlsMode())
		e.Health = sdk.Health(p.GetHealth())
	}
	return set
}

func eventKind(ev *registryv1.Event) string {
	switch ev.GetKind().(type) {
	case *registryv1.Event_InstanceAdded:
		return "instance_added"
	case *registryv1.Event_InstanceRemoved:
		return "instance_removed"
	case *registryv1.Event_ServiceUpserted:
		return "service_upserted"
	case *registryv1.Event_ServiceDeleted:
		return "service_deleted"
	case *registryv1.Event_EndpointsReplaced:
		return "endpoints_replaced"
	case *registryv1.Event_GatewaysReplaced:
		return "gateways_replaced"
	case *registryv1.Event_InstanceSynced:
		return "instance_synced"
	case *registryv1.Event_InstanceHealth:
		return "instance_health"
	}
	return "unknown"
}
