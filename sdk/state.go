package sdk

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/estuary-mesh/estuary/sdk/redact"
)

// State holds everything a plugin currently reports and turns changes into
// the event stream the host consumes. A plugin only says what is true now;
// State drops no-op updates, sends a full snapshot to every new watcher and
// coalesces endpoint updates that a slow watcher has not yet taken.
//
// Values passed in are owned by State afterwards: do not modify a Service,
// an endpoint slice or a gateway slice after handing it over.
//
// All methods are safe for concurrent use.
type State struct {
	mu        sync.Mutex
	instances map[InstanceID]*instanceState
	order     []InstanceID // first-seen order, for deterministic snapshots
	subs      map[*subscriber]struct{}
	// setComplete: every instance the plugin will report is declared.
	setComplete bool
	// pluginHealth is the connection to the source that lists instances.
	pluginHealth *InstanceHealth
	// secrets are the plugin's sensitive config values; health messages
	// and notices are redacted with them (and lose URL credentials) before
	// they leave the plugin.
	secrets *redact.Secrets
}

type instanceState struct {
	props     InstanceProperties
	services  map[string]*Service
	endpoints map[string][]Endpoint
	gateways  []NetworkGateway
	synced    bool
	health    *InstanceHealth
}

// NewState returns an empty State. Serve creates one for each plugin; tests
// and in-process hosts may create their own.
func NewState() *State {
	return &State{instances: map[InstanceID]*instanceState{}, subs: map[*subscriber]struct{}{}, secrets: &redact.Secrets{}}
}

// redacted returns h with credentials removed from its message and
// notices: the sensitive values of the plugin's config, and the user
// information of any URL (an error from an HTTP client quotes the URL).
func (s *State) redacted(h InstanceHealth) InstanceHealth {
	h.Message = s.secrets.String(h.Message)
	if len(h.Notices) > 0 {
		ns := make([]Notice, len(h.Notices))
		for i, n := range h.Notices {
			ns[i] = Notice{Subject: s.secrets.String(n.Subject), Message: s.secrets.String(n.Message)}
		}
		h.Notices = ns
	}
	return h
}

// Snapshot is the complete content of one instance, for ReplaceInstance.
type Snapshot struct {
	Services []*Service
	// Endpoints by service hostname. A service absent here has none.
	Endpoints map[string][]Endpoint
	Gateways  []NetworkGateway
}

// SetInstance announces an instance or updates its properties.
func (s *State) SetInstance(id InstanceID, props InstanceProperties) {
	s.mu.Lock()
	defer s.mu.Unlock()
	in, ok := s.instances[id]
	if ok && in.props == props {
		return
	}
	if !ok {
		in = &instanceState{services: map[string]*Service{}, endpoints: map[string][]Endpoint{}}
		s.instances[id] = in
		s.order = append(s.order, id)
	}
	in.props = props
	s.emit(event{id: id, kind: kindInstanceAdded, props: props})
}

// RemoveInstance removes an instance and everything it reported.
func (s *State) RemoveInstance(id InstanceID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.instances[id]; !ok {
		return
	}
	delete(s.instances, id)
	s.order = slices.DeleteFunc(s.order, func(x InstanceID) bool { return x == id })
	s.emit(event{id: id, kind: kindInstanceRemoved})
}

// UpsertService creates a service or replaces its attributes.
func (s *State) UpsertService(id InstanceID, svc *Service) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	in, err := s.instance(id)
	if err != nil {
		return err
	}
	s.upsertLocked(id, in, svc)
	return nil
}

func (s *State) upsertLocked(id InstanceID, in *instanceState, svc *Service) {
	if old, ok := in.services[svc.Hostname]; ok && old.Equal(svc) {
		return
	}
	cp := *svc
	in.services[svc.Hostname] = &cp
	s.emit(event{id: id, kind: kindServiceUpserted, service: &cp})
}

// DeleteService removes a service and its endpoints.
func (s *State) DeleteService(id InstanceID, hostname string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	in, err := s.instance(id)
	if err != nil {
		return err
	}
	s.deleteLocked(id, in, hostname)
	return nil
}

func (s *State) deleteLocked(id InstanceID, in *instanceState, hostname string) {
	if _, ok := in.services[hostname]; !ok {
		return
	}
	delete(in.services, hostname)
	delete(in.endpoints, hostname)
	s.emit(event{id: id, kind: kindServiceDeleted, hostname: hostname})
}

// SetEndpoints replaces the endpoints of a service. The slice is kept. A set
// equal to the current one, in the same order, sends nothing.
func (s *State) SetEndpoints(id InstanceID, hostname string, eps []Endpoint) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	in, err := s.instance(id)
	if err != nil {
		return err
	}
	if _, ok := in.services[hostname]; !ok {
		return fmt.Errorf("%w %q in %s", ErrUnknownService, hostname, id)
	}
	s.setEndpointsLocked(id, in, hostname, eps)
	return nil
}

func (s *State) setEndpointsLocked(id InstanceID, in *instanceState, hostname string, eps []Endpoint) {
	old, had := in.endpoints[hostname]
	if (had || len(eps) == 0) && endpointsEqual(old, eps) {
		return
	}
	in.endpoints[hostname] = eps
	s.emit(event{id: id, kind: kindEndpointsReplaced, hostname: hostname, endpoints: eps})
}

// SetGateways replaces the network gateways of an instance.
func (s *State) SetGateways(id InstanceID, gws []NetworkGateway) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	in, err := s.instance(id)
	if err != nil {
		return err
	}
	s.setGatewaysLocked(id, in, gws)
	return nil
}

func (s *State) setGatewaysLocked(id InstanceID, in *instanceState, gws []NetworkGateway) {
	sortGateways(gws)
	if slices.Equal(in.gateways, gws) {
		return
	}
	in.gateways = gws
	s.emit(event{id: id, kind: kindGatewaysReplaced, gateways: gws})
}

// MarkSynced says the instance has caught up with its source. Until an
// instance is synced the host keeps serving what it had before.
func (s *State) MarkSynced(id InstanceID) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	in, err := s.instance(id)
	if err != nil {
		return err
	}
	if in.synced {
		return nil
	}
	in.synced = true
	s.emit(event{id: id, kind: kindInstanceSynced})
	return nil
}

// InstanceSetComplete says that every instance the plugin will report has
// been declared with SetInstance: a plugin that discovers instances at run
// time (clusters from Secrets, Consul datacenters) calls it once discovery
// has listed them all, a plugin with a fixed set right after declaring it.
// Until then a host that restarted the plugin keeps serving the instances
// it knew before that the plugin has not declared again, and readiness
// waits. Every watcher gets it once, after its snapshot. Calls after the
// first do nothing.
//
// It is sent only if the plugin declares CapabilityInstanceSet; a plugin
// that declares it and never calls this waits out its sync timeout on
// every restart.
func (s *State) InstanceSetComplete() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.setComplete {
		return
	}
	s.setComplete = true
	s.emit(event{kind: kindInstanceSetComplete})
}

// SetPluginHealth reports whether the plugin can reach the source that
// lists its instances (the Consul agent that names its datacenters, the
// API server that holds remote secrets), for problems no instance can
// report because none is known yet. It is shown to operators: the SDK
// removes URL credentials and the config's sensitive values from it.
func (s *State) SetPluginHealth(h InstanceHealth) {
	h = s.redacted(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pluginHealth != nil && s.pluginHealth.Equal(&h) {
		return
	}
	s.pluginHealth = &h
	s.emit(event{kind: kindPluginHealth, health: &h})
}

// SetHealth reports whether the instance can reach its source, and the
// problems with single objects. It is shown to operators: the SDK removes
// URL credentials and the config's sensitive values from it.
func (s *State) SetHealth(id InstanceID, h InstanceHealth) error {
	h = s.redacted(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	in, err := s.instance(id)
	if err != nil {
		return err
	}
	if in.health != nil && in.health.Equal(&h) {
		return nil
	}
	in.health = &h
	s.emit(event{id: id, kind: kindInstanceHealth, health: &h})
	return nil
}

// ReplaceInstance makes the instance hold exactly snap: services and
// endpoints it no longer lists are deleted, changed ones updated, equal ones
// left alone. The instance must have been set with SetInstance.
func (s *State) ReplaceInstance(id InstanceID, snap Snapshot) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	in, err := s.instance(id)
	if err != nil {
		return err
	}
	keep := make(map[string]bool, len(snap.Services))
	for _, svc := range snap.Services {
		keep[svc.Hostname] = true
	}
	for _, h := range slices.Sorted(maps.Keys(in.services)) {
		if !keep[h] {
			s.deleteLocked(id, in, h)
		}
	}
	for _, svc := range snap.Services {
		s.upsertLocked(id, in, svc)
		s.setEndpointsLocked(id, in, svc.Hostname, snap.Endpoints[svc.Hostname])
	}
	s.setGatewaysLocked(id, in, snap.Gateways)
	return nil
}

// Instances lists the IDs of the current instances, in first-seen order.
func (s *State) Instances() []InstanceID {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.order)
}

func (s *State) instance(id InstanceID) (*instanceState, error) {
	in, ok := s.instances[id]
	if !ok {
		return nil, fmt.Errorf("%w %s", ErrUnknownInstance, id)
	}
	return in, nil
}

func sortGateways(gws []NetworkGateway) {
	slices.SortFunc(gws, func(a, b NetworkGateway) int {
		return cmp.Or(cmp.Compare(a.Network, b.Network), cmp.Compare(a.Cluster, b.Cluster),
			cmp.Compare(a.Address, b.Address), cmp.Compare(a.Port, b.Port))
	})
}

func endpointsEqual(a, b []Endpoint) bool {
	return slices.EqualFunc(a, b, func(x, y Endpoint) bool { return x.Equal(&y) })
}

// --- event fan-out ---

type eventKind uint8

const (
	kindInstanceAdded eventKind = iota + 1
	kindInstanceRemoved
	kindServiceUpserted
	kindServiceDeleted
	kindEndpointsReplaced
	kindGatewaysReplaced
	kindInstanceSynced
	kindInstanceHealth
	// kindInstanceSetComplete belongs to the plugin, not to an instance: it
	// is sent as WatchResponse.instance_set_complete.
	kindInstanceSetComplete
	// kindPluginHealth belongs to the plugin too: WatchResponse.plugin_health.
	kindPluginHealth
)

// event is one change, kept in SDK types until a watcher sends it.
type event struct {
	id        InstanceID
	kind      eventKind
	props     InstanceProperties
	service   *Service
	hostname  string
	endpoints []Endpoint
	gateways  []NetworkGateway
	health    *InstanceHealth
}

// cost approximates the size of an event, for batching.
func (e *event) cost() int { return 1 + len(e.endpoints) + len(e.gateways) }

type endpointsKey struct {
	id       InstanceID
	hostname string
}

// subscriber is one watch stream's queue.
type subscriber struct {
	pending  []event
	snapshot int // how many leading pending events belong to the snapshot
	// latest indexes the pending EndpointsReplaced of each service, so a
	// newer set replaces one the watcher has not yet taken.
	latest map[endpointsKey]int
	notify chan struct{}
}

// emit queues e for every subscriber. Caller holds s.mu.
func (s *State) emit(e event) {
	for sub := range s.subs {
		sub.add(e)
	}
}

func (sub *subscriber) add(e event) {
	switch e.kind {
	case kindEndpointsReplaced:
		k := endpointsKey{e.id, e.hostname}
		if i, ok := sub.latest[k]; ok && i >= sub.snapshot {
			sub.pending[i] = e
			return
		}
		sub.latest[k] = len(sub.pending)
	case kindServiceDeleted:
		delete(sub.latest, endpointsKey{e.id, e.hostname})
	case kindInstanceRemoved:
		for k := range sub.latest {
			if k.id == e.id {
				delete(sub.latest, k)
			}
		}
	}
	sub.pending = append(sub.pending, e)
	select {
	case sub.notify <- struct{}{}:
	default:
	}
}

// subscribe registers a watcher and queues a snapshot of the current state.
func (s *State) subscribe() *subscriber {
	s.mu.Lock()
	defer s.mu.Unlock()
	sub := &subscriber{latest: map[endpointsKey]int{}, notify: make(chan struct{}, 1)}
	for _, id := range s.order {
		in := s.instances[id]
		sub.add(event{id: id, kind: kindInstanceAdded, props: in.props})
		if in.health != nil {
			sub.add(event{id: id, kind: kindInstanceHealth, health: in.health})
		}
		hosts := slices.Sorted(maps.Keys(in.services))
		for _, h := range hosts {
			sub.add(event{id: id, kind: kindServiceUpserted, service: in.services[h]})
		}
		for _, h := range hosts {
			if eps, ok := in.endpoints[h]; ok {
				sub.add(event{id: id, kind: kindEndpointsReplaced, hostname: h, endpoints: eps})
			}
		}
		if len(in.gateways) > 0 {
			sub.add(event{id: id, kind: kindGatewaysReplaced, gateways: in.gateways})
		}
		if in.synced {
			sub.add(event{id: id, kind: kindInstanceSynced})
		}
	}
	if s.pluginHealth != nil {
		sub.add(event{kind: kindPluginHealth, health: s.pluginHealth})
	}
	if s.setComplete {
		// Last, so it rides on the snapshot_done response.
		sub.add(event{kind: kindInstanceSetComplete})
	}
	sub.snapshot = len(sub.pending)
	// The snapshot must be sent even when empty.
	select {
	case sub.notify <- struct{}{}:
	default:
	}
	s.subs[sub] = struct{}{}
	return sub
}

func (s *State) unsubscribe(sub *subscriber) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.subs, sub)
}

// take returns the queued events and how many of them are snapshot events.
func (s *State) take(sub *subscriber) (events []event, snapshot int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	events, snapshot = sub.pending, sub.snapshot
	sub.pending, sub.snapshot = nil, 0
	clear(sub.latest)
	return events, snapshot
}
