// Package pipeline is the endpoint pipeline: the one place that decides
// which endpoints a client receives for an EDS cluster.
//
// For a view (what a client is: its kind, network, requested networks and
// cluster) and a cluster name, Build takes the service's endpoints from
// every registry instance, in the aggregate's order, and:
//
//  1. keeps those of the cluster's subset (the SubsetLabel value);
//  2. places each on a network, by the four rules of Rule, in
//     placeEndpoint and nowhere else;
//  3. groups them by locality, in locality order;
//  4. decides, for an east-west gateway, which endpoints it forwards to
//     (routerDecision), and otherwise, in a multi-network mesh, which are
//     kept and which are replaced by their network's gateways, scaling
//     weights so that traffic splits as if the client reached every
//     endpoint directly (see Build).
//
// With locality failover on for the service and a view that carries the
// client's locality, it then gives every group a priority relative to
// that locality (prioritize: Istio's locality failover).
//
// Given a Trace, it records every step of that for every endpoint as it
// takes it: `estuary explain` and /debug/networkz print the trace, so they
// show what the xDS server sends because they ran the same code, not a
// reconstruction of it.
//
// The xDS server calls Build for every ClusterLoadAssignment it encodes;
// with a nil trace and a reused Scratch, Build allocates nothing.
package pipeline

import (
	"fmt"
	"math"
	"slices"

	"github.com/hashicorp/go-hclog"

	"github.com/estuary-mesh/estuary/host/aggregate"
	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/host/network"
	"github.com/estuary-mesh/estuary/sdk"
)

// Pipeline computes the endpoints of EDS clusters from the aggregate
// registry and the network manager.
type Pipeline struct {
	agg    *aggregate.Registry
	nets   *network.Manager // nil: one network, no gateway
	logger hclog.Logger
	// locality is the mesh's locality failover, set before serving.
	locality LocalityPolicy
}

// New returns the pipeline over agg. nets may be nil: a mesh of one
// network, where only the endpoints' own networks and their registries'
// defaults place them.
func New(agg *aggregate.Registry, nets *network.Manager, logger hclog.Logger) *Pipeline {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &Pipeline{agg: agg, nets: nets, logger: logger.Named("pipeline")}
}

func (p *Pipeline) snapshot() *network.Snapshot {
	if p.nets == nil {
		return nil
	}
	return p.nets.Snapshot()
}

// Cluster is a parsed EDS cluster name.
type Cluster struct {
	Port   uint32
	Subset string
	Host   string
}

// ParseCluster reads an EDS cluster name as a client of the kind names
// clusters: an east-west gateway (KindRouter) has only SNI clusters,
// outbound_.PORT_.SUBSET_.HOST; every other kind only
// outbound|PORT|SUBSET|HOST. It takes the kind, not the whole view, as the
// xDS server calls it for every CLA it is asked for.
func ParseCluster(kind model.Kind, name string) (c Cluster, ok bool) {
	if kind == model.KindRouter {
		c.Port, c.Subset, c.Host, ok = model.ParseSNIClusterName(name)
	} else {
		c.Port, c.Subset, c.Host, ok = model.ParseClusterName(name)
	}
	return c, ok
}

// Version identifies what a host's clusters are computed from: the
// aggregate's version of the hostname and the networks generation. Equal
// versions give equal endpoints, so a caller may keep what it built.
type Version struct{ Host, Networks uint64 }

// Version returns the current version of host's inputs. Read it before
// Build: a change in between only causes a needless rebuild later, never a
// stale result.
func (p *Pipeline) Version(host string) Version {
	return Version{Networks: p.snapshot().Generation(), Host: p.agg.HostVersion(host)}
}

// Scratch is Build's working memory. A caller that builds often keeps
// Scratches in a pool: their locality groups, endpoint arrays and gateway
// tallies are reused, so Build allocates nothing once they are warm. The
// groups Build returns live in the Scratch until its next use.
type Scratch struct {
	// groups holds every locality group slot used so far; each slot owns
	// its own endpoint array, which Build never shares between slots.
	groups []model.LocalityGroup
	// tally is, by gateway index, the weight summed for the gateway in the
	// current group; used lists the gateways that have one.
	tally []gatewayTally
	used  []int32
}

type gatewayTally struct {
	sum  uint64
	used bool
}

func (sc *Scratch) resetGateways(n int) {
	if cap(sc.tally) < n {
		sc.tally = make([]gatewayTally, n)
	}
	sc.tally, sc.used = sc.tally[:n], sc.used[:0]
}

// Endpoints returns the locality groups view v receives for the EDS
// cluster named name, in fresh memory. With a non-nil trace it records
// what happened to every endpoint. It is Build for callers that run it
// rarely: explain, debug pages and tests.
func (p *Pipeline) Endpoints(v model.View, name string, tr *Trace) ([]model.LocalityGroup, error) {
	c, ok := ParseCluster(v.Kind, name)
	if !ok {
		form := "outbound|PORT|SUBSET|HOST"
		if v.Kind == model.KindRouter {
			form = "outbound_.PORT_.SUBSET_.HOST (an east-west gateway's SNI cluster)"
		}
		return nil, fmt.Errorf("%w: %q is not of the form %s", ErrClusterName, name, form)
	}
	return p.Build(&Scratch{}, v, c, tr)
}

// Build computes the locality groups view v receives for cluster c, in
// sc's memory; see the package documentation for the steps. The result
// is valid until sc is used again.
//
// For a sidecar or proxyless client in a multi-network mesh, group by
// group (locality and priority kept):
//
//   - endpoints on networks the view cannot see are dropped
//     (REQUESTED_NETWORK_VIEW; endpoints of unknown network are seen);
//   - every weight is scaled: unset becomes the scale factor, otherwise
//     weight × factor, clipped at the uint32 maximum;
//   - endpoints on the node's network, on an unknown network, seen by a
//     node without a network (Istio treats both as "same network"), or on
//     a network without gateways are kept as they are;
//   - of the others, those not in Istio mTLS mode are dropped (the gateway
//     routes by SNI, which only mTLS carries), and so are those not
//     HEALTHY (a draining endpoint takes no new requests, so it must not
//     draw them to its gateway); each remaining one's weight
//     is split evenly among its gateways (those of its network and cluster,
//     else of its network) by integer division, summed per gateway;
//   - one endpoint per gateway follows the kept ones, in address then port
//     order, with the summed weight (clipped; 0 becomes 1 with a warning),
//     carrying the gateway's network and cluster and tlsMode istio;
//   - the group's weight becomes the sum of its endpoints' weights; a
//     group left empty is dropped.
//
// Where Istio sends the endpoints of a network whose gateways are
// configured but have no address yet (an unresolved DNS name, a
// LoadBalancer not provisioned), Estuary drops them: a client never
// receives an address on another network.
//
// A network-only endpoint (a network and no address, as Istio accepts in
// a ServiceEntry or WorkloadEntry) is reached only through its network's
// gateway: it is replaced like any remote endpoint, and dropped wherever
// the node would get it directly (on its network, with no gateway, at an
// east-west gateway, with multi-network off).
//
// With multi-network off, every endpoint is sent as it is. An east-west
// gateway gets what routerDecision lets through, weights unchanged.
// Weights of 0 (unset) leave Build as 1, which is what Envoy takes them
// for.
func (p *Pipeline) Build(sc *Scratch, v model.View, c Cluster, tr *Trace) ([]model.LocalityGroup, error) {
	snap := p.snapshot()
	if tr != nil {
		tr.begin(v, c, snap)
	}
	svc := p.agg.GetService(c.Host)
	if svc == nil {
		return nil, fmt.Errorf("%w %q", ErrNoService, c.Host)
	}
	if svc.Resolution != sdk.ResolutionStatic {
		return nil, fmt.Errorf("%w: service %q has resolution %s", ErrNotStatic, c.Host, svc.Resolution)
	}
	port, ok := findPort(svc.Ports, c.Port)
	if !ok {
		return nil, fmt.Errorf("%w: service %q has no port %d", ErrNoPort, c.Host, c.Port)
	}
	var buf [4]aggregate.EndpointSource // a service is rarely in more instances
	groups := p.collect(sc, snap, port, c, visibleSources(v, c.Host, p.agg.AppendEndpointSources(buf[:0], c.Host)), tr)
	switch {
	case v.Kind == model.KindRouter:
		groups = forward(groups, v, tr)
	case snap.MultiNetwork():
		groups = p.filter(sc, snap, v, groups, tr)
	default:
		groups = oneNetwork(groups, tr)
	}
	// Last, once gateways have replaced remote endpoints within their
	// locality group, so that they keep its priority.
	switch {
	case v.Kind == model.KindRouter || v.Locality == "":
	case !svc.LocalityFailover.Enabled(p.locality.Enabled):
		if tr != nil {
			tr.Notes = append(tr.Notes, fmt.Sprintf("locality failover is off for this service (service: %s, mesh: %v): one priority", svc.LocalityFailover, p.locality.Enabled))
		}
	default:
		groups = p.prioritize(groups, v.Locality, tr)
	}
	return groups, nil
}

// visibleSources drops, in place, the sources whose instance marks the
// service cluster-local when the view declares another cluster. A view
// with no cluster (a client that sends no CLUSTER_ID) is in none and is
// confined nowhere.
func visibleSources(v model.View, host string, sources []aggregate.EndpointSource) []aggregate.EndpointSource {
	if v.Cluster == "" {
		return sources
	}
	return slices.DeleteFunc(sources, func(src aggregate.EndpointSource) bool {
		if src.Instance.Key.Cluster == v.Cluster {
			return false
		}
		s := src.Instance.Service(host)
		return s != nil && s.ClusterLocal
	})
}

// collect groups the endpoints of one cluster by locality, in locality
// order, each placed on its network, reusing the groups of sc.
func (p *Pipeline) collect(sc *Scratch, snap *network.Snapshot, port sdk.Port, c Cluster, sources []aggregate.EndpointSource, tr *Trace) []model.LocalityGroup {
	groups := sc.groups[:0]
	for _, src := range sources {
		cluster := src.Instance.Key.Cluster
		for i := range src.Set.Endpoints {
			e := &src.Set.Endpoints[i]
			if c.Subset != "" && e.Labels[model.SubsetLabel] != c.Subset {
				continue
			}
			network, rule := placeEndpoint(snap, e.Network, src.Properties.DefaultNetwork, cluster, e.Address)
			j := localityIndex(groups, e.Locality)
			if j < 0 {
				j = len(groups)
				if j < cap(groups) {
					groups = groups[:j+1]
					groups[j] = model.LocalityGroup{Locality: e.Locality, Endpoints: groups[j].Endpoints[:0]}
				} else {
					groups = append(groups, model.LocalityGroup{Locality: e.Locality})
				}
			}
			lb := model.LbEndpoint{
				Address: e.Address, AdditionalAddresses: e.AdditionalAddresses(), Port: e.TargetPort(port), Weight: max(e.Weight, 1), Health: e.Health,
				Network: network, Cluster: cluster, TLSMode: e.TLSMode,
			}
			groups[j].Endpoints = append(groups[j].Endpoints, lb)
			if tr != nil {
				tr.collected(src.Instance.Key, src.Properties.DefaultNetwork, c.Host, e, lb, rule)
			}
		}
	}
	sc.groups = groups
	slices.SortFunc(groups, func(a, b model.LocalityGroup) int {
		switch {
		case a.Locality < b.Locality:
			return -1
		case a.Locality > b.Locality:
			return 1
		}
		return 0
	})
	return groups
}

// localityIndex finds a locality's group. Services span few localities,
// so a scan beats a map; the last group is checked first since endpoints
// of one locality tend to come together.
func localityIndex(groups []model.LocalityGroup, l string) int {
	if n := len(groups); n > 0 && groups[n-1].Locality == l {
		return n - 1
	}
	for i := range groups {
		if groups[i].Locality == l {
			return i
		}
	}
	return -1
}

// keepGroup moves group gi to the end of out, which is a prefix of groups.
// It swaps rather than copies, so that every slot keeps an endpoint array
// of its own for the Scratch's next use.
func keepGroup(groups []model.LocalityGroup, out, gi int) int {
	if out != gi {
		groups[out], groups[gi] = groups[gi], groups[out]
	}
	return out + 1
}

// forward keeps what an east-west gateway forwards to, weights unchanged.
func forward(groups []model.LocalityGroup, v model.View, tr *Trace) []model.LocalityGroup {
	return keepSent(groups, tr, func(ep *model.LbEndpoint) Decision {
		return routerDecision(v, ep.Network, ep.Address, ep.TLSMode)
	})
}

// oneNetwork sends every endpoint as it is, but network-only ones: with
// no gateway in the mesh, nothing reaches them.
func oneNetwork(groups []model.LocalityGroup, tr *Trace) []model.LocalityGroup {
	return keepSent(groups, tr, func(ep *model.LbEndpoint) Decision {
		if ep.Address == "" {
			return DroppedNoAddress
		}
		return KeptOneNetwork
	})
}

// keepSent keeps, weights unchanged, the endpoints whose decision sends
// them, and the groups left with any.
func keepSent(groups []model.LocalityGroup, tr *Trace, decide func(*model.LbEndpoint) Decision) []model.LocalityGroup {
	out := 0
	for gi := range groups {
		g := &groups[gi]
		if tr != nil {
			tr.group(g)
		}
		kept := g.Endpoints[:0]
		for i := range g.Endpoints {
			ep := &g.Endpoints[i]
			d := decide(ep)
			if tr != nil {
				tr.decided(i, fate{decision: d, weight: ep.Weight})
			}
			if d.Sent() {
				kept = append(kept, *ep)
			}
		}
		g.Endpoints = kept
		if len(kept) > 0 {
			out = keepGroup(groups, out, gi)
		}
	}
	return groups[:out]
}

// filter decides, group by group, what a client in a multi-network mesh
// receives: see Build.
func (p *Pipeline) filter(sc *Scratch, s *network.Snapshot, v model.View, groups []model.LocalityGroup, tr *Trace) []model.LocalityGroup {
	sc.resetGateways(s.NumGateways())
	scale := s.ScaleFactor()
	out := 0
	// Endpoints come in runs from one instance, so the last answers for a
	// network (seen?) and a network and cluster (which gateways?) are kept.
	var seenNet string
	seen, seenValid := true, false
	var selNet, selCluster string
	var sel []int32
	selValid, selByCluster := false, false
	for gi := range groups {
		g := &groups[gi]
		if tr != nil {
			tr.group(g)
		}
		eps := g.Endpoints
		kept := eps[:0]
		sc.used = sc.used[:0]
		for i := range eps {
			ep := eps[i]
			if !seenValid || ep.Network != seenNet {
				seen, seenNet, seenValid = v.Sees(ep.Network), ep.Network, true
			}
			if !seen {
				if tr != nil {
					tr.decided(i, fate{decision: DroppedView})
				}
				continue
			}
			w := scaleWeight(ep.Weight, scale)
			if ep.Network == "" || v.Network == "" || ep.Network == v.Network {
				if ep.Address == "" {
					// Network-only, and the node is on its network:
					// nothing it can dial (Istio sends nothing either).
					if tr != nil {
						tr.decided(i, fate{decision: DroppedNoAddress, weight: w})
					}
					continue
				}
				if tr != nil {
					tr.decided(i, fate{decision: KeptLocal, weight: w})
				}
				ep.Weight = w
				kept = append(kept, ep)
				continue
			}
			if !selValid || ep.Network != selNet || ep.Cluster != selCluster {
				sel, selByCluster = s.SelectGateways(ep.Network, ep.Cluster)
				selNet, selCluster, selValid = ep.Network, ep.Cluster, true
			}
			if len(sel) == 0 {
				if why, pending := s.Pending(ep.Network); pending {
					if tr != nil {
						tr.decided(i, fate{decision: DroppedPending, weight: w, why: why})
					}
					continue
				}
				if ep.Address == "" {
					if tr != nil {
						tr.decided(i, fate{decision: DroppedNoAddress, weight: w})
					}
					continue
				}
				if tr != nil {
					tr.decided(i, fate{decision: KeptNoGateway, weight: w})
				}
				ep.Weight = w
				kept = append(kept, ep)
				continue
			}
			if ep.TLSMode != sdk.TLSModeIstio {
				if tr != nil {
					tr.decided(i, fate{decision: DroppedTLS, weight: w})
				}
				continue
			}
			if ep.Health != sdk.HealthHealthy {
				// The gateway is sent HEALTHY: a draining endpoint's
				// weight would draw new requests to the gateway that
				// the endpoint itself must no longer get.
				if tr != nil {
					tr.decided(i, fate{decision: DroppedNotHealthy, weight: w})
				}
				continue
			}
			share := w / uint32(len(sel))
			if tr != nil {
				tr.decided(i, fate{decision: Replaced, weight: w, gateways: sel, byCluster: selByCluster, share: share})
			}
			for _, j := range sel {
				t := &sc.tally[j]
				if !t.used {
					t.used = true
					sc.used = append(sc.used, j)
				}
				t.sum += uint64(share)
			}
		}
		if len(sc.used) > 1 {
			slices.Sort(sc.used)
		}
		for _, j := range sc.used {
			sum := sc.tally[j].sum
			sc.tally[j] = gatewayTally{}
			w := uint32(min(sum, math.MaxUint32))
			gw := s.Gateway(j)
			if w == 0 {
				p.logger.Warn("gateway weight is 0; sending 1", "gateway", gw.String(), "network", gw.Network, "scale_factor", scale)
				w = 1
			}
			if tr != nil {
				tr.gateway(j, gw, sum, w)
			}
			kept = append(kept, model.LbEndpoint{
				Address: gw.Address, Port: gw.Port, Weight: w, Health: sdk.HealthHealthy,
				Network: gw.Network, Cluster: gw.Cluster, TLSMode: sdk.TLSModeIstio,
			})
		}
		// kept may have outgrown eps: the slot keeps the larger array.
		g.Endpoints = kept
		if len(kept) == 0 {
			continue
		}
		var total uint64
		for k := range kept {
			total += uint64(kept[k].Weight)
		}
		g.Weight = uint32(min(total, math.MaxUint32))
		out = keepGroup(groups, out, gi)
	}
	return groups[:out]
}

func findPort(ports []sdk.Port, number uint32) (sdk.Port, bool) {
	for _, p := range ports {
		if p.Number == number {
			return p, true
		}
	}
	return sdk.Port{}, false
}
