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
// when a watch is answered. Only services not exported to every
// namespace ("restricted") can be hidden; a namespace's filter is the set
// of restricted services it does see, so it costs memory in proportion to
// that, and namespaces that see the same ones share one set (and one
// version suffix): a thousand namespaces that see the same services cost
// one set, not a thousand copies of the resources. When no service is
// restricted, the filter is one map lookup.
//
// When a service's attributes change (its exportTo among them) the sets
// of the namespaces in use are computed again, and every resource of a
// host whose visibility changed for some namespace is treated as changed,
// so the watches that cover it are answered: the service appears or
// disappears for exactly the namespaces whose view of it moved.

// visSet is what the namespaces that share it see of the restricted
// services.
type visSet struct {
	seen map[string]bool // restricted hostnames the namespaces see
	// key is the sorted seen hostnames, joined; suffix is a short hash
	// of it and of the restricted set's generation, which full-state
	// versions carry, so a client whose visibility changed never matches
	// the version of what it saw before.
	key, suffix string
}

// maxNamespaces bounds the namespaces whose sets are kept between
// registry changes; beyond it the cache starts over (sets are recomputed
// on demand), so clients naming ever new namespaces cannot grow it.
const maxNamespaces = 100_000

// visibilityCache holds the per-namespace sets; guarded by Cache.mu.
type visibilityCache struct {
	rules *visibility.Rules
	// restricted are the services not exported to every namespace, the
	// only ones a namespace may not see, and hosts their names; valid
	// while fresh. gen counts changes of hosts.
	restricted []*aggregate.Service
	hosts      map[string]bool
	fresh      bool
	gen        uint64
	byNS       map[string]*visSet
	byKey      map[string]*visSet
	// last is the set of namespace lastNS: answering a watch looks it up
	// once per resource, always for the same namespace.
	lastNS string
	last   *visSet
}

func (vc *visibilityCache) refreshRestricted(agg *aggregate.Registry) {
	if vc.fresh {
		return
	}
	vc.restricted = vc.restricted[:0]
	hosts := map[string]bool{}
	for _, svc := range agg.Services() {
		if !vc.rules.Exported(svc) {
			vc.restricted = append(vc.restricted, svc)
			hosts[svc.Hostname] = true
		}
	}
	if !maps.Equal(hosts, vc.hosts) {
		vc.gen++
	}
	vc.hosts, vc.fresh = hosts, true
}

// hidden reports whether namespaces of s miss host.
func (vc *visibilityCache) hidden(s *visSet, host string) bool {
	return vc.hosts[host] && !s.seen[host]
}

// visSetLocked returns namespace ns's set, computing it on first use.
func (c *Cache) visSetLocked(ns string) *visSet {
	vc := &c.vis
	if vc.last != nil && vc.lastNS == ns {
		return vc.last
	}
	if s, ok := vc.byNS[ns]; ok {
		vc.lastNS, vc.last = ns, s
		return s
	}
	vc.refreshRestricted(c.gen.agg)
	if vc.byNS == nil || len(vc.byNS) >= maxNamespaces {
		vc.byNS, vc.byKey = map[string]*visSet{}, map[string]*visSet{}
	}
	vc.last = nil
	var seen []string
	for _, svc := range vc.restricted {
		if vc.rules.Visible(svc, ns) {
			seen = append(seen, svc.Hostname)
		}
	}
	slices.Sort(seen)
	key := strings.Join(seen, "\x00")
	s, ok := vc.byKey[key]
	if !ok {
		s = &visSet{key: key, seen: make(map[string]bool, len(seen))}
		for _, h := range seen {
			s.seen[h] = true
		}
		if len(vc.hosts) > 0 {
			s.suffix = "." + strconv.FormatUint(vc.gen, 36) + "." + strconv.FormatUint(maphash.String(hashSeed, key), 36)
		}
		vc.byKey[key] = s
	}
	vc.byNS[ns] = s
	vc.lastNS, vc.last = ns, s
	return s
}

// refreshVisibilityLocked computes the sets of the namespaces in use
// again, after a change of services, and returns the hostnames whose
// visibility changed for any of them.
func (c *Cache) refreshVisibilityLocked() map[string]bool {
	vc := &c.vis
	oldHosts, old := vc.hosts, vc.byNS
	vc.fresh, vc.last = false, nil
	vc.byNS, vc.byKey = map[string]*visSet{}, map[string]*visSet{}
	vc.refreshRestricted(c.gen.agg)
	// A host that became restricted, or stopped being, may have moved for
	// namespaces whose sets were never asked for while nothing was
	// restricted (the filter is skipped then): its watches are answered,
	// and each decides by what it holds.
	moved := map[string]bool{}
	candidates := maps.Clone(vc.hosts)
	maps.Copy(candidates, oldHosts)
	for h := range candidates {
		if oldHosts[h] != vc.hosts[h] {
			moved[h] = true
		}
	}
	sameHosts := maps.Equal(oldHosts, vc.hosts)
	for ns, was := range old {
		now := c.visSetLocked(ns)
		if sameHosts && now.key == was.key {
			continue // sees the same restricted services as before
		}
		for h := range candidates {
			if !moved[h] && (oldHosts[h] && !was.seen[h]) != vc.hidden(now, h) {
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
	if len(c.vis.hosts) == 0 && c.vis.fresh {
		return r // no service is restricted
	}
	s := c.visSetLocked(w.ns)
	if w.t == tListener && name == GatewayListenerName && w.vs.view.Kind == model.KindRouter {
		return c.gatewayForLocked(w.vs, s)
	}
	if c.vis.hidden(s, r.host) {
		return nil
	}
	return r
}

// gatewayForLocked is the router's SNI listener without the chains of the
// services hidden from s, built once per view and set.
func (c *Cache) gatewayForLocked(vs *viewState, s *visSet) *Resource {
	if r, ok := vs.gateways[s.suffix]; ok {
		return r
	}
	r := c.gen.GatewayListener(vs.view, func(host string) bool { return c.vis.hidden(s, host) })
	if vs.gateways == nil {
		vs.gateways = map[string]*Resource{}
	}
	vs.gateways[s.suffix] = r
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
	v, ns, ok := s.nodeOf(nodeID)
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
	if c.vis.hidden(c.visSetLocked(ns), host) {
		return out
	}
	out = append(out, vs.hostNames[tCluster][host]...)
	slices.Sort(out)
	return out
}

// visibleRows keeps the endpoint rows of the clusters a connected node
// sees: its view holds every service's, its namespace only some.
func (s *Server) visibleRows(nodeID string, rows []model.EndpointRow) []model.EndpointRow {
	_, ns, _ := s.nodeOf(nodeID)
	c := s.cache
	c.mu.Lock()
	defer c.mu.Unlock()
	set := c.visSetLocked(ns)
	return slices.DeleteFunc(rows, func(r model.EndpointRow) bool {
		_, _, host, _ := parseAnyClusterName(r.Cluster)
		return c.vis.hidden(set, host)
	})
}

// nodeOf returns the view and namespace of a connected node.
func (s *Server) nodeOf(nodeID string) (model.View, string, bool) {
	s.nodesMu.Lock()
	defer s.nodesMu.Unlock()
	for _, si := range s.streams {
		if si.parsed && si.Node == nodeID {
			return si.view, si.Namespace, true
		}
	}
	return model.View{}, "", false
}
