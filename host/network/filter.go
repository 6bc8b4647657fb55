package network

import (
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/xds"
)

// Filter rewrites the locality groups of one ClusterLoadAssignment for a
// view. With multi-network off, groups pass through unchanged. Otherwise,
// group by group (locality and priority kept):
//
//   - endpoints on networks the view cannot see are dropped
//     (REQUESTED_NETWORK_VIEW; endpoints of unknown network are seen);
//   - every weight is scaled: unset becomes the scale factor, otherwise
//     weight × factor, clipped at the uint32 maximum;
//   - endpoints on the node's network, on an unknown network, seen by a
//     node without a network (Istio treats both as "same network"), or on
//     a network without gateways are kept as they are;
//   - of the others, those not in Istio mTLS mode are dropped (the gateway
//     routes by SNI, which only mTLS carries); each remaining one's weight
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
// Filter reuses the storage of groups; it allocates only when gateway
// endpoints outgrow a group's slice.
func (m *Manager) Filter(v xds.View, groups []xds.LocalityGroup) []xds.LocalityGroup {
	s := m.snap.Load()
	if !s.multi {
		return groups
	}
	return m.filter(s, v, groups, nil)
}

// Decision is what the filter did with one endpoint.
type Decision uint8

// Decisions.
const (
	KeptLocal      Decision = iota // on the node's network, or either network unknown
	KeptNoGateway                  // its network has no gateway
	Replaced                       // replaced by its network's gateways
	DroppedView                    // outside REQUESTED_NETWORK_VIEW
	DroppedTLS                     // remote and not in Istio mTLS mode
	DroppedPending                 // its network's gateways have no address yet
)

func (d Decision) String() string {
	switch d {
	case KeptLocal:
		return "kept: on the node's network"
	case KeptNoGateway:
		return "kept: its network has no gateway"
	case Replaced:
		return "replaced by gateways"
	case DroppedView:
		return "dropped: the node's REQUESTED_NETWORK_VIEW does not include its network"
	case DroppedTLS:
		return "dropped: on another network and not in Istio mTLS mode, which a gateway requires"
	case DroppedPending:
		return "dropped: its network's gateways have no address yet"
	}
	return "unknown"
}

// MarshalText makes decisions readable in JSON.
func (d Decision) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText reads what MarshalText wrote.
func (d *Decision) UnmarshalText(b []byte) error {
	for x := KeptLocal; x <= DroppedPending; x++ {
		if x.String() == string(b) {
			*d = x
			return nil
		}
	}
	return fmt.Errorf("network: unknown decision %q", b)
}

// step records one input endpoint's fate, for explain.
type step struct {
	group, index int
	in           xds.LbEndpoint
	decision     Decision
	scaled       uint32
	gateways     []int32
	share        uint32
}

// emitted records one gateway endpoint, for explain.
type emitted struct {
	group   int
	gateway int32
	sum     uint64
	weight  uint32
}

// trace collects what the filter did; nil on the hot path.
type trace struct {
	steps []step
	out   []emitted
}

// scratch is per-call working memory, pooled.
type scratch struct {
	acc  []uint64 // summed weight per gateway index
	mark []bool   // gateway index used in the current group
	used []int32
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

func (sc *scratch) reset(n int) {
	if cap(sc.acc) < n {
		sc.acc = make([]uint64, n)
		sc.mark = make([]bool, n)
	}
	sc.acc, sc.mark, sc.used = sc.acc[:n], sc.mark[:n], sc.used[:0]
}

// scaleWeight applies the scale factor: unset becomes the factor itself,
// anything else is multiplied and clipped at the uint32 maximum.
func scaleWeight(w, factor uint32) uint32 {
	if w == 0 {
		return factor
	}
	return uint32(min(uint64(w)*uint64(factor), math.MaxUint32))
}

func (m *Manager) filter(s *snapshot, v xds.View, groups []xds.LocalityGroup, tr *trace) []xds.LocalityGroup {
	sc := scratchPool.Get().(*scratch)
	defer scratchPool.Put(sc)
	sc.reset(len(s.gateways))
	scale := s.scale
	out := groups[:0]
	// Endpoints come in runs from one instance, so the last answers for a
	// network (seen?) and a network and cluster (which gateways?) are kept.
	var seenNet string
	seen, seenValid := true, false
	var selNet, selCluster string
	var sel []int32
	selValid := false
	for gi := range groups {
		g := groups[gi]
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
					tr.steps = append(tr.steps, step{group: gi, index: i, in: ep, decision: DroppedView})
				}
				continue
			}
			w := scaleWeight(ep.Weight, scale)
			if ep.Network == "" || v.Network == "" || ep.Network == v.Network {
				if tr != nil {
					tr.steps = append(tr.steps, step{group: gi, index: i, in: ep, decision: KeptLocal, scaled: w})
				}
				ep.Weight = w
				kept = append(kept, ep)
				continue
			}
			if !selValid || ep.Network != selNet || ep.Cluster != selCluster {
				sel, selNet, selCluster, selValid = s.selectGateways(ep.Network, ep.Cluster), ep.Network, ep.Cluster, true
			}
			if len(sel) == 0 {
				if _, pending := s.pending[ep.Network]; pending {
					if tr != nil {
						tr.steps = append(tr.steps, step{group: gi, index: i, in: ep, decision: DroppedPending, scaled: w})
					}
					continue
				}
				if tr != nil {
					tr.steps = append(tr.steps, step{group: gi, index: i, in: ep, decision: KeptNoGateway, scaled: w})
				}
				ep.Weight = w
				kept = append(kept, ep)
				continue
			}
			if ep.TLSMode != sdk.TLSModeIstio {
				if tr != nil {
					tr.steps = append(tr.steps, step{group: gi, index: i, in: ep, decision: DroppedTLS, scaled: w})
				}
				continue
			}
			share := w / uint32(len(sel))
			if tr != nil {
				tr.steps = append(tr.steps, step{group: gi, index: i, in: ep, decision: Replaced, scaled: w, gateways: sel, share: share})
			}
			for _, j := range sel {
				if !sc.mark[j] {
					sc.mark[j] = true
					sc.used = append(sc.used, j)
				}
				sc.acc[j] += uint64(share)
			}
		}
		if len(sc.used) > 1 {
			slices.Sort(sc.used)
		}
		for _, j := range sc.used {
			sum := sc.acc[j]
			sc.acc[j], sc.mark[j] = 0, false
			w := uint32(min(sum, math.MaxUint32))
			gw := &s.gateways[j]
			if w == 0 {
				m.logger.Warn("gateway weight is 0; sending 1", "gateway", gw.String(), "network", gw.Network, "scale_factor", scale)
				w = 1
			}
			if tr != nil {
				tr.out = append(tr.out, emitted{group: gi, gateway: j, sum: sum, weight: w})
			}
			kept = append(kept, xds.LbEndpoint{
				Address: gw.Address, Port: gw.Port, Weight: w, Health: sdk.HealthHealthy,
				Network: gw.Network, Cluster: gw.Cluster, TLSMode: sdk.TLSModeIstio,
			})
		}
		if len(kept) == 0 {
			continue
		}
		var total uint64
		for k := range kept {
			total += uint64(kept[k].Weight)
		}
		g.Endpoints = kept
		g.Weight = uint32(min(total, math.MaxUint32))
		out = append(out, g)
	}
	return out
}
