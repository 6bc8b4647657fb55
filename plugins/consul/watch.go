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
// from one cluster peer, and publishes it as one instance.
type datacenter struct {
	r    *run
	name string
	// peer is true when name is a cluster peer's: queries ask the local
	// datacenter for what the peer exports (?peer=NAME).
	peer  bool
	id    sdk.InstanceID
	state *sdk.State
	log   hclog.Logger
	opts  convertOptions

	mu sync.Mutex
	// held is the set of hostnames the instance holds in State, shared with
	// the runs before and after this one (never two at a time).
	held    map[string]bool
	watches map[string]*watch // by Consul service name
	// views are the last published views, by Consul service name.
	views    map[string]view
	gateways map[string][]sdk.NetworkGateway // services that have any
	notices  map[string][]sdk.Notice         // services that have any

	catalogErr error
	listed     bool     // the catalog has answered once
	overflow   []string // services beyond max_watchers, not watched
	filtered   bool     // Consul filtered the service list by ACLs
	pending    map[string]bool
	synced     bool
	lastHealth string // message of the last logged failure; empty while healthy
}

// watch is the blocking query on one service's health.
type watch struct {
	name   string
	cancel context.CancelFunc
	err    error // last request's error, nil once it succeeds
}

func (r *run) newDatacenter(name string, peer bool) *datacenter {
	id := sdk.InstanceID{Provider: sdk.ProviderConsul, Cluster: name}
	d := &datacenter{
		r: r, name: name, peer: peer, id: id, state: r.p.rt.State,
		log: r.p.log.With("cluster", name),
		opts: convertOptions{
			datacenter: name, domainSuffix: r.s.domainSuffix, namespace: r.s.namespace, warning: r.s.warning,
		},
		held:     r.p.heldFor(id),
		watches:  map[string]*watch{},
		views:    map[string]view{},
		gateways: map[string][]sdk.NetworkGateway{},
		notices:  map[string][]sdk.Notice{},
		pending:  map[string]bool{},
	}
	// A datacenter is one cluster: a proxy declaring CLUSTER_ID=dc1 matches
	// the dc1 instance only. Its network is the plugin's setting, else
	// mesh.network only when the datacenter is the host's own cluster.
	d.state.SetInstance(id, sdk.InstanceProperties{ClusterScoped: true, DefaultNetwork: cmp.Or(r.s.network, r.s.mesh.NetworkOf(name))})
	return d
}

// watchCatalog runs the blocking query on the service list, starting and
// stopping the per-service watches. It returns when ctx ends.
func (d *datacenter) watchCatalog(ctx context.Context) {
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
		d.scope(q)
		q.RequireConsistent = relist && index == 0
		services, meta, err := d.listServices(q)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			err = d.r.explain(ctx, err)
			d.setCatalogErr(err)
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
		d.applyCatalog(ctx, services, meta.ResultsFilteredByACLs)
	}
}

// scope points a query at the datacenter, or at what the peer exports
// to the local one.
func (d *datacenter) scope(q *api.QueryOptions) {
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
	q.Peer, q.WaitIndex = "", 0
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
func (d *datacenter) applyCatalog(ctx context.Context, services map[string][]string, filtered bool) {
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
		want[name] = true
	}
	for _, name := range keys(d.watches) {
		if !want[name] {
			d.dropLocked(name)
		}
	}
	for _, name := range names {
		if d.watches[name] != nil {
			continue
		}
		wctx, cancel := context.WithCancel(ctx)
		w := &watch{name: name, cancel: cancel}
		d.watches[name] = w
		if !d.synced {
			d.pending[name] = true
		}
		d.r.wg.Go(func() { d.watchService(wctx, w) })
	}
	if len(overflow) > 0 && len(overflow) != len(d.overflow) {
		d.log.Warn("more services than max_watchers; the rest are not watched", "max_watchers", d.r.s.maxWatchers, "unwatched", len(overflow))
	}
	d.overflow, d.filtered = overflow, filtered
	d.catalogErr = nil
	d.listed = true
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
func (d *datacenter) dropLocked(name string) {
	if w := d.watches[name]; w != nil {
		w.cancel()
		delete(d.watches, name)
	}
	delete(d.pending, name)
	d.deleteLocked(name)
}

func (d *datacenter) deleteLocked(name string) {
	v, ok := d.views[name]
	delete(d.views, name)
	if ok && v.service != nil {
		d.deleteHostLocked(v.service.Hostname)
	}
	if _, ok := d.gateways[name]; ok {
		delete(d.gateways, name)
		d.gatewaysLocked()
	}
	delete(d.notices, name)
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
		d.scope(q)
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
			d.log.Info("service index went backwards; listing afresh", "service", w.name)
			continue
		}
		d.publish(w, convert(w.name, entries, d.opts))
	}
}

// publish hands a service's view to State unless it equals the last one.
func (d *datacenter) publish(w *watch, v view) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.watches[w.name] != w {
		return // stopped meanwhile; its service is gone
	}
	healthChanged := w.err != nil
	w.err = nil
	delete(d.pending, w.name)
	old, had := d.views[w.name]
	if !had || !old.equal(&v) {
		d.views[w.name] = v
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
				d.gateways[w.name] = v.gateways
			} else {
				delete(d.gateways, w.name)
			}
			d.gatewaysLocked()
		}
		if !slices.Equal(old.notices, v.notices) {
			if len(v.notices) > 0 {
				d.notices[w.name] = v.notices
			} else {
				delete(d.notices, w.name)
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

// syncLocked marks the instance synced once the catalog has been listed and
// every watched service has answered. Hostnames an earlier config reported
// and this one does not are deleted then, not before, so a reconfigure
// never empties the instance while it catches up.
func (d *datacenter) syncLocked() {
	if d.synced || !d.listed || len(d.pending) > 0 {
		return
	}
	current := map[string]bool{}
	for _, v := range d.views {
		if v.service != nil {
			current[v.service.Hostname] = true
		}
	}
	for _, host := range keys(d.held) {
		if !current[host] {
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

func (d *datacenter) setCatalogErr(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.catalogErr = err
	d.healthLocked()
}

func (d *datacenter) setWatchErr(w *watch, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.watches[w.name] != w {
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
	switch {
	case d.catalogErr != nil:
		h.Healthy = false
		h.Message = fmt.Sprintf("%s: list services: %s; serving the last-known state", d.subject(), describe(d.catalogErr))
	case len(failing) > 0:
		first := slices.MinFunc(failing, func(a, b *watch) int { return cmp.Compare(a.name, b.name) })
		h.Healthy = false
		h.Message = fmt.Sprintf("%s: watch of %d of %d services failing, first %s: %s; serving the last-known state",
			d.subject(), len(failing), len(d.watches), first.name, describe(first.err))
	case !d.listed:
		return // nothing known yet either way
	default:
		h.Message = fmt.Sprintf("%s: watching %d services", d.subject(), len(d.watches))
	}
	subject := d.subject()
	if len(d.overflow) > 0 {
		h.Notices = append(h.Notices, sdk.Notice{Subject: subject, Message: fmt.Sprintf(
			"%d services are not watched because max_watchers is %d; first unwatched: %s",
			len(d.overflow), d.r.s.maxWatchers, strings.Join(d.overflow[:min(5, len(d.overflow))], ", "))})
	}
	if d.filtered {
		h.Notices = append(h.Notices, sdk.Notice{Subject: subject, Message: "Consul filtered the service list by ACLs: the token cannot read every service"})
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
