package xds

import (
	"hash/maphash"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/estuary-mesh/estuary/host/aggregate"
	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/host/visibility"
)

// Visibility: exportTo, applied per client namespace (host/visibility
// decides; this file caches and applies its answers).
//
// Resources stay built once per view, whatever the namespace: what a
// namespace does not see is a filter over the view's resources, applied
// when a watch is answered. A namespace's filter is the set of hostnames
// not exported to it; namespaces that miss the same services share one
// set (and one version suffix), so a thousand namespaces that see the
// same services cost one set, not a thousand copies of the resources. In
// the common case nothing is hidden and the filter costs one map lookup.
//
// When a service's attributes change (its exportTo among them) the sets
// of the namespaces in use are computed again, and every resource of a
// host whose visibility changed for some namespace is treated as changed,
// so the watches that cover it are answered: the service appears or
// disappears for exactly the namespaces whose set moved.

// visSet is what the namespaces that share it do not see.
type visSet struct {
	hidden map[string]bool // hostnames; nil: every service is seen
	// key is the sorted hidden hostnames, joined; suffix is a short
	// hash of it that full-state versions carry, so a client whose set
	// changed never matches the version of its old set.
	key, suffix string
}

// allVisible is the set of a namespace that sees every service.
var allVisible = &visSet{}

// maxNamespaces bounds the namespaces whose sets are kept between
// registry changes; beyond it the cache starts over (sets are recomputed
// on demand), so clients naming ever new namespaces cannot grow it.
const maxNamespaces = 100_000

// visibility holds the per-namespace sets; guarded by Cache.mu.
type visibilityCache struct {
	rules *visibility.Rules
	// restricted are the services not exported to every namespace, the
	// only ones a set can hide; nil until computed after a change.
	restricted []*aggregate.Service
	fresh      bool
	byNS       map[string]*visSet
	byKey      map[string]*visSet
}

func (vc *visibilityCache) restrictedLocked(agg *aggregate.Registry) []*aggregate.Service {
	if vc.fresh {
		return vc.restricted
	}
	vc.restricted = vc.restricted[:0]
	for _, svc := range agg.Services() {
		if !vc.rules.Exported(svc) {
			vc.restricted = append(vc.restricted, svc)
		}
	}
	vc.fresh = true
	return vc.restricted
}

// setLocked returns namespace ns's set, computing it on first use.
func (c *Cache) visSetLocked(ns string) *visSet {
	vc := &c.vis
	if s, ok := vc.byNS[ns]; ok {
		return s
	}
	s := c.computeVisSetLocked(ns)
	if vc.byNS == nil || len(vc.byNS) >= maxNamespaces {
		vc.byNS, vc.byKey = map[string]*visSet{}, map[string]*visSet{}
	}
	vc.byNS[ns] = s
	return s
}

func (c *Cache) computeVisSetLocked(ns string) *visSet {
	vc := &c.vis
	var hidden []string
	for _, svc := range vc.restrictedLocked(c.gen.agg) {
		if !vc.rules.Visible(svc, ns) {
			hidden = append(hidden, svc.Hostname)
		}
	}
	if len(hidden) == 0 {
		return allVisible
	}
	slices.Sort(hidden)
	key := strings.Join(hidden, "\x00")
	if s, ok := vc.byKey[key]; ok {
		return s
	}
	s := &visSet{hidden: make(map[string]bool, len(hidden)), key: key,
		suffix: "." + strconv.FormatUint(maphash.String(hashSeed, key), 36)}
	for _, h := range hidden {
		s.hidden[h] = true
	}
	if vc.byKey == nil {
		vc.byKey = map[string]*visSet{}
	}
	vc.byKey[key] = s
	return s
}

// refreshVisibilityLocked computes the sets of the namespaces in use
// again, after a change of services, and returns the hostnames whose
// visibility changed for any of them.
func (c *Cache) refreshVisibilityLocked() map[string]bool {
	vc := &c.vis
	vc.fresh = false
	old := vc.byNS
	vc.byNS, vc.byKey = map[string]*visSet{}, map[string]*visSet{}
	moved := map[string]bool{}
	for _, ns := range slices.Sorted(maps.Keys(old)) {
		was, now := old[ns], c.visSetLocked(ns)
		if was.key == now.key {
			continue
		}
		for h := range was.hidden {
			if !now.hidden[h] {
				moved[h] = true
			}
		}
		for h := range now.hidden {
			if !was.hidden[h] {
				moved[h] = true
			}
		}
	}
	return moved
}

// visibleLocked returns the resource name of type t the watch's client
// sees, or nil: the view's resource, unless its service is hidden from
// the client's namespace.
func (c *Cache) visibleLocked(w *watch, name string) *Resource {
	r := c.resourceLocked(w.vs, w.t, name)
	if r == nil {
		return nil
	}
	s := c.visSetLocked(w.ns)
	if s.hidden == nil {
		return r
	}
	if w.t == tListener && name == GatewayListenerName && w.vs.view.Kind == model.KindRouter {
		return c.gatewayForLocked(w.vs, s)
	}
	if s.hidden[r.host] {
		return nil
	}
	return r
}

// gatewayForLocked is the router's SNI listener without the chains of the
// services hidden from s, built once per view and set.
func (c *Cache) gatewayForLocked(vs *viewState, s *visSet) *Resource {
	if r, ok := vs.gateways[s.key]; ok {
		return r
	}
	r := c.gen.GatewayListener(vs.view, s.hidden)
	if vs.gateways == nil {
		vs.gateways = map[string]*Resource{}
	}
	vs.gateways[s.key] = r
	return r
}

// fullVersionFor is the full-state version of type t for a watch: the
// view's, plus the suffix of the client's set.
func (c *Cache) fullVersionFor(w *watch) string {
	return w.vs.fullVersion(w.t) + c.visSetLocked(w.ns).suffix
}

// visibilityChangedLocked lists, per type, the names of the view's
// resources of the hosts in moved, which a push treats as changed.
func (vs *viewState) visibilityChangedLocked(moved map[string]bool) (changed [numTypes][]string) {
	if len(moved) == 0 {
		return changed
	}
	for t := range numTypes {
		for h := range moved {
			changed[t] = append(changed[t], vs.hostNames[t][h]...)
		}
	}
	// A CLA asked for while its service was hidden is answered now: its
	// name is its cluster's.
	for h := range moved {
		changed[tEndpoint] = append(changed[tEndpoint], vs.hostNames[tCluster][h]...)
	}
	if vs.view.Kind == model.KindRouter {
		clear(vs.gateways)
		changed[tListener] = append(changed[tListener], GatewayListenerName)
	}
	return changed
}

// NodeClusters returns a connected node's namespace and the clusters of
// host the server holds for it, after visibility: what explain compares
// its decision with.
func (s *Server) NodeClusters(nodeID, host string) (string, []string, bool) {
	s.nodesMu.Lock()
	var v model.View
	ns, ok := "", false
	for _, si := range s.streams {
		if si.parsed && si.Node == nodeID {
			v, ns, ok = si.view, si.Namespace, true
			break
		}
	}
	s.nodesMu.Unlock()
	if !ok {
		return "", nil, false
	}
	return ns, s.cache.clustersFor(v, ns, host), true
}

// clustersFor lists the clusters of host a client of view v in namespace
// ns receives.
func (c *Cache) clustersFor(v model.View, ns, host string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	vs, ok := c.views[v]
	if !ok {
		vs = c.newViewLocked(v) // not kept: see Resources
	}
	out := []string{}
	if c.visSetLocked(ns).hidden[host] {
		return out
	}
	out = append(out, vs.hostNames[tCluster][host]...)
	slices.Sort(out)
	return out
}
