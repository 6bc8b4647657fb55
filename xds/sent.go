package xds

import (
	"errors"
	"maps"
	"weak"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
)

// What each stream was sent, at fleet scale.
//
// go-control-plane keeps, per stream and type, a map of the names the
// stream was sent and their versions (Subscription.ReturnedResources),
// which the cache hands it with each response and reads back to decide
// what the client lacks. A wildcard CDS client of a 1,000-service mesh
// holds a 1,000-entry map, about 80 KB: 80% of the host's heap at 10,000
// clients, though every client of a view is sent the same set.
//
// The map cannot simply be shared between streams: go-control-plane edits
// it in place, without the cache's lock, when a request changes the
// subscription (SotW drops the names a request no longer lists, Delta
// those it unsubscribes), so a shared map would be corrupted and raced.
// Instead the map handed for a full set holds one entry, baseKey, whose
// value is the set's full version (fullVersionFor); the names and
// versions of that set are a sentSet the cache builds once per version
// and visibility set, shared by every stream it was sent to. Other
// entries of the map, which go-control-plane's edits add, override the
// base. So a stream costs one small map whatever the mesh's size, and
// go-control-plane's edits land on a map no other stream reads.
//
// Only full-state types (clusters, listeners) of wildcard watches are
// recorded this way: their full version changes whenever their set does,
// so the version names the content. Named watches (EDS, RDS, proxyless
// clients) hold the few names they asked for, as before.
//
// A sentSet lives as long as a stream may still refer to it: the cache
// keeps it weakly, by version, and each watch holds strongly the set its
// stream held when the watch opened and the set it answered with. The
// server keeps a stream's last watch (through its cancel func) until the
// watch of the stream's next request of the type is open, which is when
// the base is looked up again, so the set a stream's map names is always
// found; sets no stream can name any more are collected.

// baseKey is the entry of a returned-resources map naming the sentSet
// that holds the rest. It is no resource name a client would ask for; one
// that did would only make its own stream be sent its set again.
const baseKey = "\x00estuary.sent"

// sentSet is one full set of a type as sent to the streams of a view and
// visibility set: names and versions. Never modified once built.
type sentSet struct {
	version string
	vers    map[string]string
}

// record is what a watch's stream holds of the watch's type: the map
// go-control-plane keeps, and the sentSet it names, if any.
type record struct {
	m map[string]string
	// baseVersion is m[baseKey]; base is its set, nil when m names none
	// or (SotW only) the set is gone.
	baseVersion string
	base        *sentSet
}

// version returns the version of name the stream holds.
func (r *record) version(name string) (string, bool) {
	if v, ok := r.m[name]; ok {
		return v, true
	}
	if r.base != nil {
		v, ok := r.base.vers[name]
		return v, ok
	}
	return "", false
}

// each calls fn with every name the stream holds.
func (r *record) each(fn func(name string)) {
	for n := range r.m {
		if n != baseKey {
			fn(n)
		}
	}
	if r.base != nil {
		for n := range r.base.vers {
			if _, over := r.m[n]; !over {
				fn(n)
			}
		}
	}
}

// len is the number of names the stream holds.
func (r *record) len() int {
	n := 0
	r.each(func(string) { n++ })
	return n
}

// plain returns the names and versions the stream holds as a new map.
func (r *record) plain() map[string]string {
	if r.base == nil {
		if r.m == nil {
			return map[string]string{}
		}
		return maps.Clone(r.m) // copies the table whole: the common case, EDS
	}
	out := make(map[string]string, len(r.m)+len(r.base.vers))
	if r.base != nil {
		maps.Copy(out, r.base.vers)
	}
	maps.Copy(out, r.m)
	delete(out, baseKey)
	return out
}

// errSentGone ends a Delta stream whose record names a set the cache no
// longer has. The server keeps what makes that impossible (see above);
// should it stop doing so, the client reconnects and says what it holds
// (initial_resource_versions) rather than being sent a wrong diff.
var errSentGone = errors.New("xds: the record of what this stream was sent is gone; reconnect")

// recordLocked reads what w's stream holds of w's type. Only a Delta
// stream can fail: a SotW stream is sent whole sets, and one whose set is
// gone is sent the current set again, unless it has that version.
func (c *Cache) recordLocked(w *watch) (record, error) {
	rec := record{m: w.sub.ReturnedResources()}
	v, ok := rec.m[baseKey]
	if !ok {
		return rec, nil
	}
	rec.baseVersion = v
	if p, ok := w.vs.sent[w.t][v]; ok {
		rec.base = p.Value()
	}
	if rec.base == nil && w.deltaCh != nil {
		return rec, errSentGone
	}
	return rec, nil
}

// sentSetLocked returns the sentSet of version, the full set of w's type
// that w's client sees, building it if no stream holds it.
func (c *Cache) sentSetLocked(w *watch, version string, names []string) *sentSet {
	vs := w.vs
	if p, ok := vs.sent[w.t][version]; ok {
		if s := p.Value(); s != nil {
			return s
		}
	}
	s := &sentSet{version: version, vers: make(map[string]string, len(names))}
	for _, n := range names {
		if r := c.visibleLocked(w, n); r != nil {
			s.vers[n] = r.Version()
		}
	}
	if vs.sent[w.t] == nil {
		vs.sent[w.t] = map[string]weak.Pointer[sentSet]{}
	}
	// Forget the versions no stream holds any more, once they are as many
	// as those that were live at the last sweep.
	if len(vs.sent[w.t]) >= vs.sentSweep[w.t] {
		for k, p := range vs.sent[w.t] {
			if p.Value() == nil {
				delete(vs.sent[w.t], k)
			}
		}
		vs.sentSweep[w.t] = 2*len(vs.sent[w.t]) + 16
	}
	vs.sent[w.t][version] = weak.Make(s)
	return s
}

// materializeUnsubscribed turns the record of a Delta stream whose request
// unsubscribed names back into a plain map, in place, as go-control-plane
// would have kept it: it deleted those names from the map (or set them to
// "", which stays), but a name only the base held was not in the map to
// delete. The server calls CreateDeltaWatch with no watch of the stream's
// type open, so nothing else reads the map meanwhile.
func materializeUnsubscribed(rec *record, req *discoveryv3.DeltaDiscoveryRequest, legacyWildcard bool) {
	unsub := req.GetResourceNamesUnsubscribe()
	if rec.base == nil || len(unsub) == 0 {
		return
	}
	full := rec.plain()
	// go-control-plane ignores unsubscriptions while a stream is still in
	// legacy wildcard mode and subscribes nothing new; it cannot be told
	// apart from an explicit wildcard here, so those keep their names.
	if !legacyWildcard || len(req.GetResourceNamesSubscribe()) > 0 {
		for _, n := range unsub {
			if _, kept := rec.m[n]; !kept {
				delete(full, n)
			}
		}
	}
	clear(rec.m)
	maps.Copy(rec.m, full)
	rec.baseVersion, rec.base = "", nil
}
