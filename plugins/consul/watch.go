package consul

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/time/rate"

	"github.com/estuary-mesh/estuary/sdk"
)

// maxNotices bounds the notices of one instance.
const maxNotices = 100

// datacenter watches one Consul datacenter, or the services imported
// from one cluster peer, and publishes it as one instance. It holds the
// services of every scope (namespace and partition) of the block: a
// namespace is a part of its datacenter, as a Kubernetes namespace is of
// its cluster, not a cluster of its own.
type datacenter struct {
	r    *run
	name string
	// peer is true when name is a cluster peer's: queries ask the local
	// datacenter for what the peer exports (?peer=NAME).
	peer  bool
	id    sdk.InstanceID
	state *sdk.State
	log   hclog.Logger
	// scopes are watched each with its own catalog query; in block order.
	scopes []*scopeState

	mu sync.Mutex
	// held is the set of hostnames the instance holds in State, shared with
	// the runs before and after this one (never two at a time).
	held    map[string]bool
	watches map[string]*watch // by scope.key of the Consul service name
	// views are the last published views, by the watches' keys.
	views    map[string]view
	gateways map[string][]sdk.NetworkGateway // services that have any
	notices  map[string][]sdk.Notice         // services that have any

	pending    map[string]bool
	synced     bool
	lastHealth string // message of the last logged failure; empty while healthy
}

// scopeState is one scope of a datacenter: its catalog query's outcome.
type scopeState struct {
	scope
	opts       convertOptions
	catalogErr error
	listed     bool     // the catalog has answered once
	overflow   []string // services beyond max_watchers, not watched
	filtered   bool     // Consul filtered the service list by ACLs
}

// watch is the blocking query on one service's health.
type watch struct {
	name   string // Consul's
	key    string // in the datacenter's maps
	sc     *scopeState
	cancel context.CancelFunc
	err    error // last request's error, nil once it succeeds
}

// label names the watch's service in messages: "web", or
// "web (namespace team-a)" outside the default scope.
func (w *watch) label() string { return w.sc.label(w.name) }

func (s *scopeState) label(name string) string {
	if s.scope == defaultScope {
		return name
	}
	return name + " (" + s.String() + ")"
}

func (r *run) newDatacenter(name string, peer bool, scopes []scope) *datacenter {
	id := sdk.InstanceID{Provider: sdk.ProviderConsul, Cluster: name}
	d := &datacenter{
		r: r, name: name, peer: peer, id: id, state: r.p.rt.State,
		log:      r.p.log.With("cluster", name),
		held:     r.p.heldFor(id),
		watches:  map[string]*watch{},
		views:    map[string]view{},
		gateways: map[string][]sdk.NetworkGateway{},
		notices:  map[string][]sdk.Notice{},
		pending:  map[string]bool{},
	}
	for _, sc := range scopes {
		d.scopes = append(d.scopes, &scopeState{scope: sc, opts: convertOptions{
			datacenter: name, domainSuffix: sc.hostSuffix(r.s.domainSuffix), namespace: sc.namespace,
			scope: inScope(sc), warning: r.s.warning,
		}})
	}
	// A datacenter is one cluster: a proxy declaring CLUSTER_ID=dc1 matches
	// the dc1 instance only. Its network is the plugin's setting, else
	// mesh.network only when the datacenter is the host's own cluster.
	d.state.SetInstance(id, sdk.InstanceProperties{ClusterScoped: true, DefaultNetwork: cmp.Or(r.s.network, r.s.mesh.NetworkOf(name))})
	return d
}

// watchCatalog runs the blocking query on the service list, starting and
// stopping the per-service watches. It returns when ctx ends.
func (d *datacenter) watchCatalog(ctx context.Context, sc *scopeState) {
	defer d.stopWatches()
	loop := rate.NewLimiter(rate.Every(loopInterval), 1)
	if d.peer {
		loop = rate.NewLimiter(rate.Every(peerListInterval), 1) // listServices
	}
	bo := newBackoff()
	var index uint64
	// relist makes the next list a consistent read. Right after a restart
	// a server may answer from a state it has not finished restoring; a
	// relist after an error or a reset must not take that for the truth.
	relist := true
	for {
		if err := d.wait(ctx, loop); err != nil {
			return
		}
		rctx, cancel := context.WithTimeout(ctx, d.r.requestTimeout())
		q := d.r.query(rctx, index)
		d.scope(q, sc)
		q.RequireConsistent = relist && index == 0
		services, meta, err := d.listServices(q)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			err = d.r.explain(ctx, err)
			d.setCatalogErr(sc, err)
			d.r.reloadToken(err)
			if bo.Wait(ctx) != nil {
				return
			}
			// Retry with a list, not a blocking query: it answers at once,
			// so the health recovers as soon as Consul does.
			index, relist = 0, true
			continue
		}
		bo.Reset()
		next, reset := nextIndex(index, meta.LastIndex)
		index, relist = next, reset
		if reset {
			d.log.Info("catalog index went backwards; listing afresh", "got", meta.LastIndex)
			continue
		}
		d.applyCatalog(ctx, sc, services, meta.ResultsFilteredByACLs)
	}
}

// scope points a query at the datacenter, or at what the peer exports
// to the local one, in scope sc.
func (d *datacenter) scope(q *api.QueryOptions, sc *scopeState) {
	sc.apply(q)
	if d.peer {
		q.Peer = d.name
		return
	}
	q.Datacenter = d.name
}

// subject names the instance in health messages and notices.
func (d *datacenter) subject() string {
	if d.peer {
		return "peer " + d.name
	}
	return "datacenter " + d.name
}

// listServices lists the datacenter's services, or those imported from
// the peer. Consul's service list ignores ?peer= (it answers with the
// local catalog), and CE's /v1/imported-services lists nothing, so a
// peer's services are the imported services of its peering's stream
// status. That is not a blocking query: it is asked again every
// peerListInterval, while each service's instances are watched with
// blocking queries as a datacenter's. The list carries no tags:
// tag_filter applies to a peer's instances, in the health query.
func (d *datacenter) listServices(q *api.QueryOptions) (map[string][]string, *api.QueryMeta, error) {
	if !d.peer {
		return d.r.client.Catalog().Services(q)
	}
	// A peering belongs to a partition, not to a namespace.
	q.Peer, q.WaitIndex, q.Namespace = "", 0, ""
	peering, meta, err := d.r.client.Peerings().Read(q.Context(), d.name, q)
	if err != nil {
		return nil, nil, err
	}
	if peering == nil {
		return nil, nil, fmt.Errorf("%w: the agent has no peering %q", errNoPeering, d.name)
	}
	out := map[string][]string{}
	for _, s := range peering.StreamStatus.ImportedServices {
		out[s] = d.r.s.tagFilter
	}
	meta.LastIndex = 1 // a constant index: never a reset, and WaitIndex is dropped above
	return out, meta, nil
}

// wait takes a token from the loop's limiter and from the run's.
func (d *datacenter) wait(ctx context.Context, loop *rate.Limiter) error {
	if err := loop.Wait(ctx); err != nil {
		return err
	}
	return d.r.limiter.Wait(ctx)
}

// applyCatalog starts watches for new services and stops those of services
// that are gone, deleting what they reported.
func (d *datacenter) applyCatalog(ctx context.Context, sc *scopeState, services map[string][]string, filtered bool) {
	var names []string
	for name, tags := range services {
		if hasAll(tags, d.r.s.tagFilter) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	var overflow []string
	if len(names) > d.r.s.maxWatchers {
		names, overflow = names[:d.r.s.maxWatchers], names[d.r.s.maxWatchers:]
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	want := make(map[string]bool, len(names))
	for _, name := range names {
		want[sc.key(name)] = true
	}
	for _, key := range keys(d.watches) {
		if d.watches[key].sc == sc && !want[key] {
			d.dropLocked(key)
		}
	}
	for _, name := range names {
		key := sc.key(name)
		if d.watches[key] != nil {
			continue
		}
		wctx, cancel := context.WithCancel(ctx)
		w := &watch{name: name, key: key, sc: sc, cancel: cancel}
		d.watches[key] = w
		if !d.synced {
			d.pending[key] = true
		}
		d.r.wg.Go(func() { d.watchService(wctx, w) })
	}
	if len(overflow) > 0 && len(overflow) != len(sc.overflow) {
		d.log.Warn("more services than max_watchers; the rest are not watched", "max_watchers", d.r.s.maxWatchers, "unwatched", len(overflow), "scope", sc.String())
	}
	sc.overflow, sc.filtered = overflow, filtered
	sc.catalogErr = nil
	sc.listed = true
	d.healthLocked()
	d.syncLocked()
}

func hasAll(tags, want []string) bool {
	for _, w := range want {
		if !slices.Contains(tags, w) {
			return false
		}
	}
	return true
}

// dropLocked stops the watch of a service that left the catalog and
// deletes what it reported.
func (d *datacenter) dropLocked(key string) {
	if w := d.watches[key]; w != nil {
		w.cancel()
		delete(d.watches, key)
	}
	delete(d.pending, key)
	d.deleteLocked(key)
}

func (d *datacenter) deleteLocked(key string) {
	v, ok := d.views[key]
	delete(d.views, key)
	if ok && v.service != nil {
		d.deleteHostLocked(v.service.Hostname)
	}
	if _, ok := d.gateways[key]; ok {
		delete(d.gateways, key)
		d.gatewaysLocked()
	}
	delete(d.notices, key)
}

func (d *datacenter) deleteHostLocked(host string) {
	if err := d.state.DeleteService(d.id, host); err != nil {
		d.log.Error("delete service", "hostname", host, "error", err)
	}
	delete(d.held, host)
}

func (d *datacenter) stopWatches() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, w := range d.watches {
		w.cancel()
	}
	clear(d.watches)
}

// watchService runs the blocking query on one service's health until ctx
// ends (the service left the catalog, or the run stopped).
func (d *datacenter) watchService(ctx context.Context, w *watch) {
	loop := rate.NewLimiter(rate.Every(loopInterval), 1)
	bo := newBackoff()
	var index uint64
	relist := false // as in watchCatalog; a new watch reads as its catalog list did
	for {
		if err := d.wait(ctx, loop); err != nil {
			return
		}
		rctx, cancel := context.WithTimeout(ctx, d.r.requestTimeout())
		q := d.r.query(rctx, index)
		d.scope(q, w.sc)
		q.RequireConsistent = relist && index == 0
		entries, meta, err := d.r.client.Health().ServiceMultipleTags(w.name, d.r.s.tagFilter, false, q)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			d.setWatchErr(w, err)
			d.r.reloadToken(err)
			if bo.Wait(ctx) != nil {
				return
			}
			index, relist = 0, true // as in watchCatalog
			continue
		}
		bo.Reset()
		next, reset := nextIndex(index, meta.LastIndex)
		index, relist = next, reset
		if reset {
			d.log.Info("service index went backwards; listing afresh", "service", w.label())
			continue
		}
		d.publish(w, convert(w.name, entries, w.sc.opts))
	}
}

// publish hands a service's view to State unless it equals the last one.
func (d *datacenter) publish(w *watch, v view) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.watches[w.key] != w {
		return // stopped meanwhile; its service is gone
	}
	healthChanged := w.err != nil
	w.err = nil
	delete(d.pending, w.key)
	old, had := d.views[w.key]
	if !had || !old.equal(&v) {
		d.views[w.key] = v
		switch {
		case v.service != nil:
			if had && old.service != nil && old.service.Hostname != v.service.Hostname {
				d.deleteHostLocked(old.service.Hostname)
			}
			d.upsertLocked(v.service, v.endpoints)
		case had && old.service != nil:
			d.deleteHostLocked(old.service.Hostname)
		}
		if !slices.Equal(old.gateways, v.gateways) {
			if len(v.gateways) > 0 {
				d.gateways[w.key] = v.gateways
			} else {
				delete(d.gateways, w.key)
			}
			d.gatewaysLocked()
		}
		if !slices.Equal(old.notices, v.notices) {
			if len(v.notices) > 0 {
				d.notices[w.key] = v.notices
			} else {
				delete(d.notices, w.key)
			}
			healthChanged = true
		}
	}
	if healthChanged {
		d.healthLocked()
	}
	d.syncLocked()
}

func (d *datacenter) upsertLocked(svc *sdk.Service, eps []sdk.Endpoint) {
	if err := d.state.UpsertService(d.id, svc); err != nil {
		d.log.Error("upsert service", "hostname", svc.Hostname, "error", err)
		return
	}
	d.held[svc.Hostname] = true
	if err := d.state.SetEndpoints(d.id, svc.Hostname, eps); err != nil {
		d.log.Error("set endpoints", "hostname", svc.Hostname, "error", err)
	}
}

func (d *datacenter) gatewaysLocked() {
	var all []sdk.NetworkGateway
	for _, name := range keys(d.gateways) {
		all = append(all, d.gateways[name]...)
	}
	if err := d.state.SetGateways(d.id, all); err != nil {
		d.log.Error("set gateways", "error", err)
	}
}

// syncLocked marks the instance synced once the catalog of a scope has
// been listed, every other scope's has answered (listed or failed), and
// every watched service has answered: a namespace Consul refuses must
// not keep the others' services from being served. Hostnames an earlier
// config reported and this one does not are deleted then, not before, so
// a reconfigure never empties the instance while it catches up; those of
// a scope whose catalog failed are kept, as the last-known state.
func (d *datacenter) syncLocked() {
	if d.synced || len(d.pending) > 0 {
		return
	}
	listed := false
	for _, sc := range d.scopes {
		if !sc.listed && sc.catalogErr == nil {
			return
		}
		listed = listed || sc.listed
	}
	if !listed {
		return
	}
	current := map[string]bool{}
	for _, v := range d.views {
		if v.service != nil {
			current[v.service.Hostname] = true
		}
	}
	for _, host := range keys(d.held) {
		if sc := d.scopeOfHost(host); !current[host] && (sc == nil || sc.listed) {
			d.deleteHostLocked(host)
		}
	}
	if err := d.state.MarkSynced(d.id); err != nil {
		d.log.Error("mark synced", "error", err)
		return
	}
	d.synced = true
	d.log.Info("synced", "services", len(current))
}

// scopeOfHost is the scope whose hostnames end as host does: the one
// with the longest matching suffix, as a namespace's suffix may end with
// the default scope's. Nil when no scope of this config has it.
func (d *datacenter) scopeOfHost(host string) *scopeState {
	var best *scopeState
	for _, sc := range d.scopes {
		if strings.HasSuffix(host, "."+sc.opts.domainSuffix) && (best == nil || len(sc.opts.domainSuffix) > len(best.opts.domainSuffix)) {
			best = sc
		}
	}
	return best
}

func (d *datacenter) setCatalogErr(sc *scopeState, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	sc.catalogErr = err
	d.healthLocked()
	d.syncLocked()
}

func (d *datacenter) setWatchErr(w *watch, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.watches[w.key] != w {
		return
	}
	w.err = err
	d.healthLocked()
}

// healthLocked reports the instance's health: unhealthy while the catalog
// or any service watch fails (the last-known state stays), with notices for
// single services.
func (d *datacenter) healthLocked() {
	h := sdk.InstanceHealth{Healthy: true}
	var failing []*watch
	for _, w := range d.watches {
		if w.err != nil {
			failing = append(failing, w)
		}
	}
	var failingScopes []*scopeState
	listed := false
	for _, sc := range d.scopes {
		if sc.catalogErr != nil {
			failingScopes = append(failingScopes, sc)
		}
		listed = listed || sc.listed
	}
	switch {
	case len(failingScopes) > 0:
		// Each failing scope is named; the others keep being served.
		first := failingScopes[0]
		h.Healthy = false
		what := "list services"
		if len(d.scopes) > 1 {
			what = fmt.Sprintf("list services of %d of %d namespaces failing, first %s", len(failingScopes), len(d.scopes), cmp.Or(first.String(), "the default namespace"))
		} else if first.scope != defaultScope {
			what = "list services of " + first.String()
		}
		h.Message = fmt.Sprintf("%s: %s: %s; serving the last-known state", d.subject(), what, describe(first.catalogErr))
	case len(failing) > 0:
		first := slices.MinFunc(failing, func(a, b *watch) int { return cmp.Compare(a.key, b.key) })
		h.Healthy = false
		h.Message = fmt.Sprintf("%s: watch of %d of %d services failing, first %s: %s; serving the last-known state",
			d.subject(), len(failing), len(d.watches), first.label(), describe(first.err))
	case !listed:
		return // nothing known yet either way
	default:
		h.Message = fmt.Sprintf("%s: watching %d services", d.subject(), len(d.watches))
		if len(d.scopes) > 1 {
			h.Message += fmt.Sprintf(" in %d namespaces", len(d.scopes))
		}
	}
	subject := d.subject()
	for _, sc := range d.scopes {
		if len(sc.overflow) > 0 {
			h.Notices = append(h.Notices, sdk.Notice{Subject: subject, Message: fmt.Sprintf(
				"%d services%s are not watched because max_watchers is %d; first unwatched: %s",
				len(sc.overflow), inScope(sc.scope), d.r.s.maxWatchers, strings.Join(sc.overflow[:min(5, len(sc.overflow))], ", "))})
		}
		if sc.filtered {
			h.Notices = append(h.Notices, sdk.Notice{Subject: subject, Message: "Consul filtered the service list" + inScope(sc.scope) + " by ACLs: the token cannot read every service"})
		}
	}
	capped := sdk.NoticeList{Max: maxNotices, Subject: subject}
	capped.Add(h.Notices...)
	for _, name := range keys(d.notices) {
		capped.Add(d.notices[name]...)
	}
	h.Notices = capped.List()
	if err := d.state.SetHealth(d.id, h); err != nil {
		d.log.Error("set health", "error", err)
	}
	// Log transitions only: during an outage every watch fails in turn.
	switch wasHealthy := d.lastHealth == ""; {
	case h.Healthy && !wasHealthy:
		d.log.Info("healthy again", "message", h.Message)
		d.lastHealth = ""
	case !h.Healthy && wasHealthy:
		d.log.Warn("unhealthy; keeping the last-known state", "error", h.Message)
		d.lastHealth = h.Message
	}
}
