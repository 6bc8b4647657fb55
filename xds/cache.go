package xds

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"
	"weak"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/estuary-mesh/estuary/host/aggregate"
	"github.com/estuary-mesh/estuary/host/model"
)

// typ indexes the resource types Estuary serves, in the order a push
// delivers them: clusters before their endpoints, listeners before routes.
type typ int

const (
	tCluster typ = iota
	tEndpoint
	tListener
	tRoute
	numTypes
)

var typeURLs = [numTypes]string{resourcev3.ClusterType, resourcev3.EndpointType, resourcev3.ListenerType, resourcev3.RouteType}

// fullState types are sent whole in State of the World: a resource missing
// from a response is deleted.
var fullState = [numTypes]bool{tCluster: true, tListener: true}

func typeOf(url string) (typ, bool) {
	for i, u := range typeURLs {
		if u == url {
			return typ(i), true
		}
	}
	return 0, false
}

// Cache is Estuary's implementation of go-control-plane's cache interface.
// It keeps, per view, every resource marshaled once, and indexes watches by
// resource name so a change reaches exactly the watches it affects.
type Cache struct {
	gen *Generator
	// nonce distinguishes this cache's versions from those of another
	// cache, in this process or a previous run of it.
	nonce string

	mu    sync.Mutex
	views map[model.View]*viewState
	// vis is what each client namespace does not see: visibility.go.
	vis visibilityCache
	// localityViews keeps nodes' localities in their views (viewOf).
	localityViews bool
	// maxViews caps the views streams hold (AcquireView); maxNames caps
	// the resource names of a watch. Zero: no cap.
	maxViews, maxNames int
	// onRefuse, if set, is told of every request refused by a limit.
	onRefuse func(limit string)
	version  uint64 // SotW response versions
	serial   uint64 // numbers the views this cache has made
	// mark numbers the collects of watches (collectLocked); scratch is
	// the last push's slice of them, reused. Both guarded by mu.
	mark    uint64
	scratch []*watch

	// onResponse, if set, is called for every response the cache issues.
	onResponse func(v model.View, t typ, n int)
	// onTaken, if set, is told for every response how long it waited
	// between its hand-off to the stream and the stream taking it to
	// send: the wait for the stream's goroutine to run.
	onTaken func(time.Duration)
	// held is true until Release: watches are opened and kept, but none
	// is answered, so no client sees a config the host has not finished
	// loading. Guarded by mu.
	held bool
	// onHold, if set, is called for each watch opened while held, for tests.
	onHold func()

	// onFull, if set, is called when a response could not be handed to
	// its stream because the stream's response channel was full; the
	// watch stays open and is answered again after retry.
	onFull func(v model.View, t typ, retry time.Duration)
}

var _ cache.Cache = (*Cache)(nil)

// NewCache returns a cache that builds resources with gen.
func NewCache(gen *Generator) *Cache {
	return &Cache{gen: gen, views: map[model.View]*viewState{}, nonce: strconv.FormatUint(rand.Uint64(), 36),
		vis: visibilityCache{rules: &gen.vis}}
}

// viewState is everything one view receives.
type viewState struct {
	view model.View
	// streams counts the streams that hold the view (AcquireView); the
	// view is dropped when the last lets go, so views of clients that
	// left cost nothing, however many different ones were claimed.
	streams int
	res     [numTypes]map[string]*Resource
	// hostNames lists, per type, the resource names built for each
	// service hostname; EDS holds only names that were asked for.
	hostNames [numTypes]map[string][]string
	// byName holds, per type, the open watches of each resource name;
	// wildcard the open wildcard watches. watchSet explains the shape.
	byName   [numTypes]map[string]*watchSet
	wildcard [numTypes]*watchSet
	// names caches the sorted wildcard names of each type (nil: stale);
	// setVersion counts changes to each type's set, and is the version of
	// full-state responses, so an ACK of the current set costs nothing.
	names         [numTypes][]string
	setVersion    [numTypes]uint64
	versionPrefix string
	// gateways holds a router view's SNI listener per visibility set
	// (visSet.key) that hides something: visibility.go.
	gateways map[string]*Resource
	// sent holds, per full-state type, the sets streams were sent, by
	// version, weakly; sentSweep is the size at which dead ones are next
	// swept: sent.go.
	sent      [numTypes]map[string]weak.Pointer[sentSet]
	sentSweep [numTypes]int
}

// touched records that type t's resources changed.
func (vs *viewState) touched(t typ) {
	vs.setVersion[t]++
	vs.names[t] = nil
	if t == tCluster {
		vs.names[tEndpoint] = nil // wildcard EDS names come from the clusters
	}
}

// fullVersion is unique to this cache, this view and this set: a client
// reconnecting to a restarted host, or under another view, never matches
// a set it does not have.
func (vs *viewState) fullVersion(t typ) string {
	return vs.versionPrefix + strconv.FormatUint(vs.setVersion[t], 10)
}

func (c *Cache) viewLocked(v model.View) *viewState {
	vs, ok := c.views[v]
	if ok {
		return vs
	}
	vs = c.newViewLocked(v)
	c.views[v] = vs
	return vs
}

// newViewLocked builds a view without keeping it.
func (c *Cache) newViewLocked(v model.View) *viewState {
	c.serial++
	vs := &viewState{view: v, versionPrefix: c.nonce + "." + strconv.FormatUint(c.serial, 36) + "."}
	for t := range numTypes {
		vs.res[t] = map[string]*Resource{}
		vs.hostNames[t] = map[string][]string{}
		vs.byName[t] = map[string]*watchSet{}
		vs.wildcard[t] = &watchSet{}
	}
	for _, svc := range c.gen.agg.Services() {
		c.buildHostLocked(vs, svc.Hostname, svc)
	}
	c.buildGatewayLocked(vs) // east-west gateway listener: gateway.go
	return vs
}

// AcquireView holds view v for a stream until ReleaseView, building it if
// no stream held it. It refuses a new view beyond the cap.
func (c *Cache) AcquireView(v model.View) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	vs, ok := c.views[v]
	if !ok && c.maxViews > 0 && len(c.views) >= c.maxViews {
		if c.onRefuse != nil {
			c.onRefuse(limitViews)
		}
		return errLimit(limitViews, "%d views are live; node claims a new one, %s", len(c.views), v)
	}
	if !ok {
		vs = c.viewLocked(v)
	}
	vs.streams++
	return nil
}

// ReleaseView lets go of a view AcquireView held; the last release drops
// it. The stream's watches must be cancelled first (go-control-plane does
// so before it reports a stream closed).
func (c *Cache) ReleaseView(v model.View) {
	c.mu.Lock()
	defer c.mu.Unlock()
	vs, ok := c.views[v]
	if !ok {
		return
	}
	if vs.streams--; vs.streams <= 0 {
		delete(c.views, v)
	}
}

// LiveViews is the number of views the cache keeps.
func (c *Cache) LiveViews() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.views)
}

// buildHostLocked (re)builds the CDS, LDS and RDS resources of one host;
// a nil svc (the service is gone) removes them.
func (c *Cache) buildHostLocked(vs *viewState, host string, svc *aggregate.Service) (changed [numTypes][]string) {
	var built [numTypes][]*Resource
	if svc != nil {
		built[tCluster] = c.gen.Clusters(vs.view, svc)
		built[tListener] = c.gen.Listeners(vs.view, svc)
		built[tRoute] = c.gen.Routes(vs.view, svc)
	}
	for _, t := range []typ{tCluster, tListener, tRoute} {
		changed[t] = vs.replaceHost(t, host, built[t])
	}
	return changed
}

// replaceHost makes built the resources of host for type t and returns the
// names that were added, changed or removed.
func (vs *viewState) replaceHost(t typ, host string, built []*Resource) []string {
	var changed []string
	old := vs.hostNames[t][host]
	names := make([]string, 0, len(built))
	for _, r := range built {
		r.host = host // what visibility filters on
		names = append(names, r.Name)
		if prev, ok := vs.res[t][r.Name]; !ok || prev.Version() != r.Version() {
			changed = append(changed, r.Name)
		}
		vs.res[t][r.Name] = r
	}
	for _, n := range old {
		if !slices.Contains(names, n) {
			delete(vs.res[t], n)
			changed = append(changed, n)
		}
	}
	if len(names) == 0 {
		delete(vs.hostNames[t], host)
	} else {
		vs.hostNames[t][host] = names
	}
	if len(changed) > 0 {
		vs.touched(t)
	}
	return changed
}

// endpointLocked returns the CLA name for the view, building it on first
// use. Only the EDS clusters the view's CDS holds have one: any other
// name (a subset no endpoint carries, a made-up host) gets no resource
// and leaves nothing behind, so a client cannot grow the cache by asking.
func (c *Cache) endpointLocked(vs *viewState, name string) *Resource {
	if r, ok := vs.res[tEndpoint][name]; ok {
		return r
	}
	if cl, ok := vs.res[tCluster][name]; !ok || !cl.eds {
		return nil
	}
	r := c.gen.CLA(vs.view, name, nil)
	if r == nil {
		return nil
	}
	vs.res[tEndpoint][name] = r
	_, _, host, _ := parseAnyClusterName(name)
	vs.hostNames[tEndpoint][host] = append(vs.hostNames[tEndpoint][host], name)
	return r
}

// resourceLocked returns a resource of the view, or nil.
func (c *Cache) resourceLocked(vs *viewState, t typ, name string) *Resource {
	if t == tEndpoint {
		return c.endpointLocked(vs, name)
	}
	return vs.res[t][name]
}

// wildcardNames lists what a wildcard subscription receives: every
// resource of the type; for endpoints, the CLA of every EDS cluster.
// The list is cached until the type changes; callers must not modify it.
func (c *Cache) wildcardNames(vs *viewState, t typ) []string {
	if vs.names[t] != nil {
		return vs.names[t]
	}
	names := []string{}
	if t != tEndpoint {
		names = slices.AppendSeq(names, maps.Keys(vs.res[t]))
	} else {
		for name, r := range vs.res[tCluster] {
			if _, _, _, ok := parseAnyClusterName(name); ok && isEDS(r) {
				names = append(names, name)
			}
		}
	}
	slices.Sort(names)
	vs.names[t] = names
	return names
}

// isEDS reports whether a cluster resource is an EDS cluster: the
// generator marks those as it builds them, so no cluster is unmarshaled to
// tell.
func isEDS(r *Resource) bool { return r.eds }

// watch is one open watch of a stream for one type.
type watch struct {
	vs       *viewState
	t        typ
	sub      cache.Subscription
	sotwReq  *cache.Request
	sotwCh   chan cache.Response
	deltaReq *cache.DeltaRequest
	deltaCh  chan cache.DeltaResponse
	names    []string
	wildcard bool
	// ns is the client's namespace, which decides what it sees.
	ns string
	// cancelled is set once the server closes the watch; retrying is set
	// while a retry of a full channel is scheduled, backoff is its delay.
	// All three are guarded by Cache.mu.
	cancelled, retrying bool
	backoff             time.Duration
	// in lists the sets w is in while open: in[k] is the set of names[k],
	// and a wildcard watch's last entry is its view's wildcard set.
	in []membership
	// mark is the Cache.mark of the last collect that took w, so a watch
	// in several sets is collected once.
	mark uint64
	// rec is what the stream held when w opened; sent is the set w
	// answered with, if a whole one. w keeps both alive: sent.go.
	rec  record
	sent *sentSet
}

// watchSet is the open watches of one name (or the wildcard watches) of
// one type in one view. At fleet scale one name may be watched by every
// client of a view, 10,000 watches, and a change answers all of them and
// drops each from every set it is in. Maps keyed by *watch made each drop
// a hash delete, 80% of a push's time at 10,000 clients; here a watch
// knows its slot in each of its sets, so a drop is a swap with the set's
// last watch, and collecting the watches of a change is a slice walk.
type watchSet struct {
	refs []watchRef
}

// watchRef is one watch in a set; k is the set's index in w.in, which is
// what a swap updates when it moves the watch.
type watchRef struct {
	w *watch
	k int
}

// membership is a set a watch is in and its slot there.
type membership struct {
	set  *watchSet
	slot int
}

func (s *watchSet) len() int {
	if s == nil {
		return 0
	}
	return len(s.refs)
}

// add puts w in s as w.in's next entry.
func (s *watchSet) add(w *watch) {
	w.in = append(w.in, membership{set: s, slot: len(s.refs)})
	s.refs = append(s.refs, watchRef{w: w, k: len(w.in) - 1})
}

// remove takes the watch at slot i out of s, moving the last one there.
func (s *watchSet) remove(i int) {
	last := len(s.refs) - 1
	if i != last {
		moved := s.refs[last]
		s.refs[i] = moved
		moved.w.in[moved.k].slot = i
	}
	s.refs[last] = watchRef{} // no stale pointer keeps a watch alive
	s.refs = s.refs[:last]
	// A set that held a fleet and holds few now gives the memory back.
	if c := cap(s.refs); c > 1024 && len(s.refs) < c/4 {
		s.refs = slices.Clip(slices.Clone(s.refs))
	}
}

// CreateWatch opens a State of the World watch.
func (c *Cache) CreateWatch(req *cache.Request, sub cache.Subscription, ch chan cache.Response) (func(), error) {
	t, ok := typeOf(req.GetTypeUrl())
	if !ok {
		return func() {}, nil // a type Estuary does not serve: never answered
	}
	if err := c.checkNames(len(req.GetResourceNames())); err != nil {
		return nil, err
	}
	node := ParseNode(req.GetNode())
	w := &watch{t: t, sub: sub, sotwReq: req, sotwCh: ch, wildcard: sub.IsWildcard(), names: slices.Sorted(maps.Keys(sub.SubscribedResources())), ns: node.Namespace}
	return c.open(c.viewOf(&node), w)
}

// CreateDeltaWatch opens an incremental watch.
func (c *Cache) CreateDeltaWatch(req *cache.DeltaRequest, sub cache.Subscription, ch chan cache.DeltaResponse) (func(), error) {
	t, ok := typeOf(req.GetTypeUrl())
	if !ok {
		return func() {}, nil
	}
	// A Delta subscription grows request by request, and the versions a
	// client says it has are kept too: both are capped.
	if err := c.checkNames(max(len(sub.SubscribedResources()), len(sub.ReturnedResources()))); err != nil {
		return nil, err
	}
	node := ParseNode(req.GetNode())
	w := &watch{t: t, sub: sub, deltaReq: req, deltaCh: ch, wildcard: sub.IsWildcard(), names: slices.Sorted(maps.Keys(sub.SubscribedResources())), ns: node.Namespace}
	return c.open(c.viewOf(&node), w)
}

// viewOf is the view of a node: its locality counts only with locality
// views on, and never for an east-west gateway, which forwards to its
// own network whatever its locality.
func (c *Cache) viewOf(n *model.Node) model.View {
	v := n.View()
	if !c.localityViews || v.Kind == model.KindRouter {
		v.Locality = ""
	}
	return v
}

// checkNames refuses a watch of more names than the cap.
func (c *Cache) checkNames(n int) error {
	if c.maxNames <= 0 || n <= c.maxNames {
		return nil
	}
	if c.onRefuse != nil {
		c.onRefuse(limitResourceNames)
	}
	return errLimit(limitResourceNames, "a request names %d resources, more than %d", n, c.maxNames)
}

func (c *Cache) open(v model.View, w *watch) (func(), error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	vs := c.viewLocked(v)
	w.vs = vs
	rec, err := c.recordLocked(w)
	if err != nil {
		return nil, err
	}
	if w.deltaCh != nil {
		materializeUnsubscribed(&rec, w.deltaReq, w.wildcard && len(w.names) == 0)
	}
	w.rec = rec
	// The cancel func holds w, and so what its stream was sent, until the
	// server has opened the stream's next watch of the type: sent.go.
	cancel := func() { c.cancel(w) }
	if c.respondLocked(w) {
		return cancel, nil
	}
	if c.held && c.onHold != nil {
		c.onHold()
	}
	w.in = make([]membership, 0, len(w.names)+1)
	for _, n := range w.names {
		set := vs.byName[w.t][n]
		if set == nil {
			set = &watchSet{}
			vs.byName[w.t][n] = set
		}
		set.add(w)
	}
	if w.wildcard {
		vs.wildcard[w.t].add(w) // last, as watch.in says
	}
	return cancel, nil
}

func (c *Cache) cancel(w *watch) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forgetLocked(w)
}

// forgetLocked closes w and drops it from every set it is in; it costs
// one swap per set, whatever the sets' sizes.
func (c *Cache) forgetLocked(w *watch) {
	w.cancelled = true
	for k, m := range w.in {
		m.set.remove(m.slot)
		if k < len(w.names) && len(m.set.refs) == 0 {
			delete(w.vs.byName[w.t], w.names[k])
		}
	}
	w.in = nil
}

// collectLocked appends to out each watch of the sets that is not in out
// yet, and returns out.
func (c *Cache) collectLocked(out []*watch, sets ...*watchSet) []*watch {
	for _, s := range sets {
		if s == nil {
			continue
		}
		for _, r := range s.refs {
			if r.w.mark != c.mark {
				r.w.mark = c.mark
				out = append(out, r.w)
			}
		}
	}
	return out
}

// answerLocked answers each of ws that lacks something and closes those
// it answered; it returns how many.
func (c *Cache) answerLocked(ws []*watch) int {
	n := 0
	for _, w := range ws {
		if c.respondLocked(w) {
			c.forgetLocked(w)
			n++
		}
	}
	return n
}

// outgoing is a response built for a watch: exactly one of sotw and
// delta is set; n counts its resources (and removals) for onResponse.
type outgoing struct {
	w     *watch
	sotw  *sotwResponse
	delta *deltaResponse
	n     int
}

// handLocked puts p in its stream's channel without blocking, and reports
// whether it did; if the channel had no room, the watch stays open and is
// retried (fullLocked).
func (c *Cache) handLocked(p *outgoing) bool {
	w := p.w
	if p.sotw != nil {
		p.sotw.issued, p.sotw.taken = time.Now(), c.onTaken
		select {
		case w.sotwCh <- p.sotw:
		default:
			return c.fullLocked(w)
		}
	} else {
		p.delta.issued, p.delta.taken = time.Now(), c.onTaken
		select {
		case w.deltaCh <- p.delta:
		default:
			return c.fullLocked(w)
		}
	}
	if c.onResponse != nil {
		c.onResponse(w.vs.view, w.t, p.n)
	}
	return true
}

// respondLocked answers w if the client lacks anything it should have, and
// reports whether it did. A watch answers at most once: the server opens a
// new one with the client's next request. If the stream's channel had no
// room, w is not answered: it stays open and a retry is scheduled. The
// stream's record (sent.go) says what it was sent when it was sent, so a
// NACKed version is never sent again: only a new version of the resource
// is.
func (c *Cache) respondLocked(w *watch) bool {
	if c.held {
		return false
	}
	vs := w.vs
	names := w.names
	if w.wildcard {
		names = c.wildcardNames(vs, w.t)
	}
	rec := &w.rec
	// A wildcard watch of a full-state type is sent, and recorded as,
	// the whole set of its version.
	whole := fullState[w.t] && w.wildcard
	var cur string
	if whole {
		cur = c.fullVersionFor(w)
		if rec.baseVersion == cur {
			return false // the stream holds this set, or rejected it
		}
		if w.sotwCh != nil && w.sotwReq.GetErrorDetail() == nil && w.sotwReq.GetVersionInfo() == cur {
			return false // the client acknowledged the current set
		}
	}
	var send []*Resource
	if w.sotwCh != nil && fullState[w.t] {
		// The whole set goes, if anything in it changed or went away.
		changed := false
		present := 0
		for _, n := range names {
			r := c.visibleLocked(w, n)
			if r == nil {
				continue
			}
			present++
			send = append(send, r)
			if v, ok := rec.version(n); !ok || v != r.Version() {
				changed = true
			}
		}
		if !changed {
			rec.each(func(n string) {
				if c.visibleLocked(w, n) == nil || (!w.wildcard && !slices.Contains(w.names, n)) {
					changed = true
				}
			})
		}
		if !changed && present == rec.len() {
			return false
		}
		if whole {
			w.sent = c.sentSetLocked(w, cur, names)
			return c.sendSotW(w, send, map[string]string{baseKey: cur}, cur)
		}
		next := make(map[string]string, len(send))
		for _, r := range send {
			next[r.Name] = r.Version()
		}
		return c.sendSotW(w, send, next, "")
	}
	for _, n := range names {
		if r := c.visibleLocked(w, n); r != nil {
			if v, ok := rec.version(n); !ok || v != r.Version() {
				send = append(send, r)
			}
		}
	}
	var removed []string
	if w.deltaCh != nil {
		rec.each(func(n string) {
			if c.visibleLocked(w, n) == nil {
				removed = append(removed, n)
			}
		})
	}
	if len(send) == 0 && len(removed) == 0 {
		return false
	}
	slices.Sort(removed)
	if w.deltaCh != nil && whole {
		// Sent what differs and removed what is gone, the stream holds
		// the current set.
		w.sent = c.sentSetLocked(w, cur, names)
		return c.sendDelta(w, send, removed, map[string]string{baseKey: cur})
	}
	next := rec.plain()
	for _, r := range send {
		next[r.Name] = r.Version()
	}
	for _, n := range removed {
		delete(next, n)
	}
	if w.deltaCh != nil {
		return c.sendDelta(w, send, removed, next)
	}
	return c.sendSotW(w, send, next, "")
}

// sendSotW answers a State of the World watch; version, if empty, is a new
// number. It reports whether the response was handed to the stream.
func (c *Cache) sendSotW(w *watch, rs []*Resource, returned map[string]string, version string) bool {
	c.version++
	if version == "" {
		version = strconv.FormatUint(c.version, 10)
	}
	anys := make([]*anypb.Any, len(rs))
	for i, r := range rs {
		anys[i] = r.Any
	}
	resp := &sotwResponse{req: w.sotwReq, version: version, resources: anys, returned: returned}
	return c.handLocked(&outgoing{w: w, sotw: resp, n: len(rs)})
}

func (c *Cache) sendDelta(w *watch, rs []*Resource, removed []string, next map[string]string) bool {
	c.version++
	out := make([]*discoveryv3.Resource, len(rs))
	for i, r := range rs {
		// One wrapper per resource, not per response: a Delta client's
		// initial CDS would otherwise allocate one per cluster, held
		// until the client has read it, a fleet connecting at once
		// holding them all. Nothing writes to a response's resources.
		if r.delta == nil {
			r.delta = &discoveryv3.Resource{Name: r.Name, Version: r.Version(), Resource: r.Any}
		}
		out[i] = r.delta
	}
	resp := &deltaResponse{req: w.deltaReq, version: strconv.FormatUint(c.version, 10), resources: out, removed: removed, next: next}
	return c.handLocked(&outgoing{w: w, delta: resp, n: len(rs) + len(removed)})
}

// Why a send cannot block, and why it should never find a full channel:
// every send happens under c.mu, and the stream's goroutine takes c.mu to
// cancel a watch before it drains its channel, so a blocking send could
// deadlock. go-control-plane gives a stream one channel for all its types
// (ordered SotW ADS: capacity types.UnknownType; Delta: twice that). A watch
// here is answered at most once, and the server cancels a type's watch, and
// drains (SotW) or sends (Delta) what is queued, before it opens the next.
// So a SotW channel holds at most one response per type, a Delta channel at
// most two, and Estuary serves four types: a send always finds room, even
// when the client has stopped reading and its stream is blocked in Send.
//
// If that ever stops holding (a go-control-plane change), the response is
// not dropped silently: fullLocked counts and logs it through onFull, keeps
// the watch open and answers it again after a backoff, with whatever is
// current then. Nothing else is lost: the subscription records what was
// returned only when a response is actually sent.
const (
	retryMin = 10 * time.Millisecond
	retryMax = time.Second
)

// fullLocked handles a response the stream had no room for; it reports
// false, as the watch was not answered.
func (c *Cache) fullLocked(w *watch) bool {
	if w.retrying {
		return false
	}
	w.backoff = min(max(2*w.backoff, retryMin), retryMax)
	w.retrying = true
	if c.onFull != nil {
		c.onFull(w.vs.view, w.t, w.backoff)
	}
	time.AfterFunc(w.backoff, func() { c.retry(w) })
	return false
}

// retry answers a watch whose last response found its channel full, unless
// the server has closed it since.
func (c *Cache) retry(w *watch) {
	c.mu.Lock()
	defer c.mu.Unlock()
	w.retrying = false
	if w.cancelled {
		return
	}
	if c.respondLocked(w) {
		c.forgetLocked(w)
	}
}

// Hold makes the cache keep every watch unanswered until Release.
func (c *Cache) Hold() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.held = true
}

// Release ends Hold: every watch opened meanwhile is answered with the
// current state, and watches are answered as they come from then on. It
// returns how many watches it answered.
func (c *Cache) Release() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.held {
		return 0
	}
	c.held = false
	n := 0
	for _, vs := range c.views {
		for t := range numTypes {
			c.mark++
			waiting := c.collectLocked(nil, vs.wildcard[t])
			for _, set := range vs.byName[t] {
				waiting = c.collectLocked(waiting, set)
			}
			n += c.answerLocked(waiting)
		}
	}
	return n
}

// Fetch is the REST polling API, which Estuary does not serve.
func (c *Cache) Fetch(context.Context, *cache.Request) (cache.Response, error) {
	return nil, fmt.Errorf("xds: REST fetch is not supported; use ADS")
}

// Push applies a registry change: it rebuilds what the change touches in
// every view and answers exactly the watches whose resources changed.
// Endpoint-only changes rebuild CLAs of the affected services; service
// changes also rebuild their clusters, listeners and routes; a full change
// rebuilds everything.
func (c *Cache) Push(change model.Change) PushStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	var st PushStats
	// A change of services may change what namespaces see (exportTo).
	var moved map[string]bool
	if change.Full || attrsChanged(change) {
		moved = c.refreshVisibilityLocked()
	}
	for _, vs := range c.views {
		changed := vs.visibilityChangedLocked(moved)
		rebuilt := change.Full // some host's clusters were rebuilt
		if change.Full {
			for t, names := range c.rebuildAllLocked(vs) {
				changed[t] = append(changed[t], names...)
			}
		} else {
			for _, host := range slices.Sorted(maps.Keys(change.Services)) {
				attrs := change.Services[host]
				if attrs || c.subsetsChangedLocked(vs, host) || c.peersChangedLocked(vs, host) {
					rebuilt = true
					for t, names := range c.buildHostLocked(vs, host, c.gen.agg.GetService(host)) {
						changed[t] = append(changed[t], names...)
					}
				}
				changed[tEndpoint] = append(changed[tEndpoint], c.rebuildEndpointsLocked(vs, host)...)
			}
		}
		if rebuilt {
			// The east-west gateway's listener spans every host: gateway.go.
			changed[tListener] = append(changed[tListener], c.buildGatewayLocked(vs)...)
			// A cluster that appeared may have been asked for by EDS
			// before: its watchers are answered now.
			for _, n := range changed[tCluster] {
				if _, held := vs.res[tEndpoint][n]; !held && vs.byName[tEndpoint][n].len() > 0 {
					changed[tEndpoint] = append(changed[tEndpoint], n)
				}
			}
		}
		for t := range numTypes {
			if len(changed[t]) == 0 {
				continue
			}
			st.Changed[t] += len(changed[t])
			st.Responses[t] += c.notifyLocked(vs, t, changed[t])
		}
	}
	return st
}

// attrsChanged reports whether a change touched any service's attributes,
// beyond its endpoints.
func attrsChanged(change model.Change) bool {
	for _, attrs := range change.Services {
		if attrs {
			return true
		}
	}
	return false
}

// PushStats counts what a push changed and how many watches it answered,
// by type.
type PushStats struct {
	Changed   [numTypes]int
	Responses [numTypes]int
}

// Total is the number of responses a push sent.
func (s PushStats) Total() int {
	n := 0
	for _, r := range s.Responses {
		n += r
	}
	return n
}

func (c *Cache) rebuildAllLocked(vs *viewState) (changed [numTypes][]string) {
	hosts := map[string]bool{}
	for _, t := range []typ{tCluster, tListener, tRoute, tEndpoint} {
		for h := range vs.hostNames[t] {
			hosts[h] = true
		}
	}
	for _, svc := range c.gen.agg.Services() {
		hosts[svc.Hostname] = true
	}
	for _, h := range slices.Sorted(maps.Keys(hosts)) {
		for t, names := range c.buildHostLocked(vs, h, c.gen.agg.GetService(h)) {
			changed[t] = append(changed[t], names...)
		}
		changed[tEndpoint] = append(changed[tEndpoint], c.rebuildEndpointsLocked(vs, h)...)
	}
	return changed
}

// subsetsChangedLocked reports whether the subset clusters of host differ
// from what the view's CDS holds, which an endpoint change can cause.
func (c *Cache) subsetsChangedLocked(vs *viewState, host string) bool {
	want := c.gen.Subsets(host)
	have := 0
	for _, n := range vs.hostNames[tCluster][host] {
		if _, subset, _, ok := parseAnyClusterName(n); ok && subset != "" {
			have++
			if !slices.Contains(want, subset) {
				return true
			}
		}
	}
	svc := c.gen.agg.GetService(host)
	if svc == nil {
		return have > 0
	}
	return have != len(want)*len(svc.Ports)
}

// peersChangedLocked reports whether the endpoint identities that the TLS
// of host's clusters was built from changed: an endpoint change can move
// them (a new service account, a workload that gained its sidecar).
func (c *Cache) peersChangedLocked(vs *viewState, host string) bool {
	if vs.view.Kind == model.KindRouter {
		return false // SNI passthrough: a gateway's clusters carry no TLS
	}
	for _, n := range vs.hostNames[tCluster][host] {
		if r := vs.res[tCluster][n]; r != nil && r.eds {
			return c.gen.peersChanged(host, r.peers)
		}
	}
	return false
}

// rebuildEndpointsLocked rebuilds the CLAs of host the view holds, and
// returns those whose content changed or that are gone.
func (c *Cache) rebuildEndpointsLocked(vs *viewState, host string) []string {
	var changed []string
	var keep []string
	for _, name := range vs.hostNames[tEndpoint][host] {
		prev := vs.res[tEndpoint][name]
		var r *Resource
		if cl, ok := vs.res[tCluster][name]; ok && cl.eds { // else its cluster went away
			r = c.gen.CLA(vs.view, name, prev)
		}
		switch {
		case r == nil:
			delete(vs.res[tEndpoint], name)
			changed = append(changed, name)
			continue
		case prev == nil || r.Version() != prev.Version():
			changed = append(changed, name)
		}
		vs.res[tEndpoint][name] = r
		keep = append(keep, name)
	}
	if len(keep) == 0 {
		delete(vs.hostNames[tEndpoint], host)
	} else {
		vs.hostNames[tEndpoint][host] = keep
	}
	return changed
}

// notifyLocked answers the watches of t that cover a changed name.
func (c *Cache) notifyLocked(vs *viewState, t typ, changed []string) int {
	c.mark++
	affected := c.collectLocked(c.scratch[:0], vs.wildcard[t])
	for _, n := range changed {
		affected = c.collectLocked(affected, vs.byName[t][n])
	}
	n := c.answerLocked(affected)
	// The slice is kept for the next push, without the watches in it.
	clear(affected)
	c.scratch = affected[:0]
	return n
}

// Resources returns a copy of a view's current resources of a type, for
// debugging.
func (c *Cache) Resources(v model.View, typeURL string) []*Resource {
	t, ok := typeOf(typeURL)
	if !ok {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	// A view no stream holds is built for the question and not kept: a
	// debug page must not grow the cache either.
	vs, ok := c.views[v]
	if !ok {
		vs = c.newViewLocked(v)
	}
	if t == tEndpoint {
		for _, n := range c.wildcardNames(vs, t) {
			c.endpointLocked(vs, n)
		}
	}
	out := make([]*Resource, 0, len(vs.res[t]))
	for _, n := range slices.Sorted(maps.Keys(vs.res[t])) {
		out = append(out, vs.res[t][n])
	}
	return out
}

// sotwResponse is a State of the World response with resources marshaled in
// advance.
type sotwResponse struct {
	req       *cache.Request
	version   string
	resources []*anypb.Any
	returned  map[string]string
	// issued is when the response was handed to the stream, and taken
	// is told how long it waited there (Cache.onTaken).
	issued time.Time
	taken  func(time.Duration)
}

var _ cache.Response = (*sotwResponse)(nil)

func (r *sotwResponse) GetDiscoveryResponse() (*discoveryv3.DiscoveryResponse, error) {
	observeTaken(r.taken, r.issued)
	return &discoveryv3.DiscoveryResponse{VersionInfo: r.version, Resources: r.resources, TypeUrl: r.req.GetTypeUrl()}, nil
}
func (r *sotwResponse) GetRequest() *discoveryv3.DiscoveryRequest { return r.req }
func (r *sotwResponse) GetVersion() (string, error)               { return r.version, nil }
func (r *sotwResponse) GetResponseVersion() string                { return r.version }
func (r *sotwResponse) GetReturnedResources() map[string]string   { return r.returned }
func (r *sotwResponse) GetContext() context.Context               { return context.Background() }

// deltaResponse is an incremental response.
type deltaResponse struct {
	req       *cache.DeltaRequest
	version   string
	resources []*discoveryv3.Resource
	removed   []string
	next      map[string]string
	issued    time.Time // as sotwResponse's
	taken     func(time.Duration)
}

var _ cache.DeltaResponse = (*deltaResponse)(nil)

func (r *deltaResponse) GetDeltaDiscoveryResponse() (*discoveryv3.DeltaDiscoveryResponse, error) {
	observeTaken(r.taken, r.issued)
	return &discoveryv3.DeltaDiscoveryResponse{
		SystemVersionInfo: r.version, Resources: r.resources, RemovedResources: r.removed, TypeUrl: r.req.GetTypeUrl(),
	}, nil
}
func (r *deltaResponse) GetDeltaRequest() *discoveryv3.DeltaDiscoveryRequest { return r.req }
func (r *deltaResponse) GetSystemVersion() (string, error)                   { return r.version, nil }
func (r *deltaResponse) GetResponseVersion() string                          { return r.version }
func (r *deltaResponse) GetNextVersionMap() map[string]string                { return r.next }
func (r *deltaResponse) GetReturnedResources() map[string]string             { return r.next }
func (r *deltaResponse) GetContext() context.Context                         { return context.Background() }

// observeTaken reports how long a response waited for its stream, once:
// go-control-plane takes a response's message once, as it sends it.
func observeTaken(taken func(time.Duration), issued time.Time) {
	if taken != nil && !issued.IsZero() {
		taken(time.Since(issued))
	}
}
