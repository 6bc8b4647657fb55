package pipeline

import (
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/host/network"
	"github.com/estuary-mesh/estuary/host/replica"
)

// Trace is what Build did for one view and one cluster, recorded as it
// did it: every endpoint of the cluster with its origin, its network and
// the rule that decided it, and its fate; and every endpoint the node
// gets, with where its weight comes from. A Trace is filled by one Build
// and read afterwards; it is not safe for concurrent use.
type Trace struct {
	View         string `json:"view"`
	Cluster      string `json:"cluster"`
	Generation   uint64 `json:"generation"`
	MultiNetwork bool   `json:"multi_network"`
	ScaleFactor  uint32 `json:"scale_factor"`
	// Endpoints are the cluster's endpoints in the registries, by
	// locality, in the aggregate's order within one.
	Endpoints []TracedEndpoint `json:"endpoints"`
	// Result is what the node gets, in the order it is sent.
	Result []SentEndpoint `json:"result"`
	Notes  []string       `json:"notes,omitempty"`
	// ClientLocality is the view's locality, and Priorities how each
	// locality of the result was prioritized relative to it; none when
	// locality failover did not apply.
	ClientLocality string             `json:"client_locality,omitempty"`
	Priorities     []LocalityPriority `json:"priorities,omitempty"`

	snap *network.Snapshot
	// collecting holds the endpoints as they were collected, before any
	// decision; byLocality indexes them by locality, in group order.
	collecting []TracedEndpoint
	byLocality map[string][]int
	// cur is the group being decided: its locality, the collecting
	// indexes of its endpoints, and, by gateway index, the Endpoints
	// indexes each gateway replaced.
	locality string
	cur      []int
	contrib  map[int32][]int
}

// LocalityPriority is the priority of one locality's group.
type LocalityPriority struct {
	Locality string `json:"locality"`
	// Raw is Istio's priority (0 same subzone, 1 same zone, 2 same region,
	// 3 another region, 4 another region than the failover rule's);
	// Priority is what is sent, the raw ones in use made consecutive.
	Raw      int    `json:"raw"`
	Priority uint32 `json:"priority"`
	Match    string `json:"match"`
}

// TracedEndpoint is one registry endpoint of the cluster and what became
// of it.
type TracedEndpoint struct {
	Endpoint string `json:"endpoint"`
	Locality string `json:"locality"`
	// Origin: the service and the instance that reported the endpoint.
	Service  string              `json:"service"`
	Instance replica.InstanceKey `json:"instance"`
	Cluster  string              `json:"cluster"`
	// Network is where Rule placed it; OwnNetwork and RegistryDefault are
	// what rules 1 and 2 read.
	Network         string `json:"network"`
	Rule            Rule   `json:"rule"`
	OwnNetwork      string `json:"own_network,omitempty"`
	RegistryDefault string `json:"registry_default,omitempty"`
	TLSMode         string `json:"tls_mode"`
	// Weight is the registry's (0: unset); Scaled is what it became.
	Weight   uint32   `json:"weight"`
	Scaled   uint32   `json:"scaled_weight"`
	Decision Decision `json:"decision"`
	// Gateways replaced it, each receiving Share.
	Gateways   []string `json:"gateways,omitempty"`
	Share      uint32   `json:"share,omitempty"`
	Arithmetic string   `json:"arithmetic"`
}

// SentEndpoint is one endpoint the node gets.
type SentEndpoint struct {
	Endpoint string `json:"endpoint"`
	Locality string `json:"locality"`
	Weight   uint32 `json:"weight"`
	Network  string `json:"network,omitempty"`
	Cluster  string `json:"cluster,omitempty"`
	Gateway  bool   `json:"gateway"`
	Priority uint32 `json:"priority"`
	// From lists, by index in Endpoints, the registry endpoints behind it:
	// the endpoint itself, or those a gateway stands in for.
	From       []int  `json:"from"`
	Arithmetic string `json:"arithmetic"`
}

// begin starts a trace of one Build.
func (tr *Trace) begin(v model.View, c Cluster, snap *network.Snapshot) {
	tr.View, tr.snap = v.String(), snap
	tr.Cluster = model.ClusterName(c.Port, c.Subset, c.Host)
	if v.Kind == model.KindRouter {
		tr.Cluster = model.SNIClusterName(c.Port, c.Subset, c.Host)
	}
	tr.Generation, tr.MultiNetwork, tr.ScaleFactor = snap.Generation(), snap.MultiNetwork(), snap.ScaleFactor()
	tr.Endpoints, tr.Result, tr.Notes = []TracedEndpoint{}, []SentEndpoint{}, nil
	tr.collecting, tr.byLocality, tr.contrib = nil, map[string][]int{}, map[int32][]int{}
	tr.ClientLocality, tr.Priorities = v.Locality, nil
	switch {
	case v.Kind == model.KindRouter:
		tr.Notes = append(tr.Notes, "an east-west gateway: it forwards to endpoints on its own network in Istio mTLS mode, weights unchanged")
	case !tr.MultiNetwork:
		tr.Notes = append(tr.Notes, "multi-network is off (no gateway): every endpoint passes through unchanged")
	}
}

// collected records an endpoint as collect placed it.
func (tr *Trace) collected(key replica.InstanceKey, registryDefault, host string, e *replica.Endpoint, lb model.LbEndpoint, rule Rule) {
	tr.byLocality[e.Locality] = append(tr.byLocality[e.Locality], len(tr.collecting))
	tr.collecting = append(tr.collecting, TracedEndpoint{
		Endpoint: hostPort(lb.Address, lb.Port), Locality: e.Locality, Service: host, Instance: key, Cluster: key.Cluster,
		Network: lb.Network, Rule: rule, OwnNetwork: e.Network, RegistryDefault: registryDefault,
		TLSMode: lb.TLSMode.String(), Weight: e.Weight,
	})
}

// group starts deciding the endpoints of a locality group.
func (tr *Trace) group(g *model.LocalityGroup) {
	tr.locality, tr.cur = g.Locality, tr.byLocality[g.Locality]
	clear(tr.contrib)
}

// fate is what the pipeline decided for one endpoint.
type fate struct {
	decision Decision
	// weight is what the endpoint's weight became (scaled, or as sent).
	weight uint32
	// gateways replaced it, byCluster when they are its network and
	// cluster's rather than its network's, each receiving share.
	gateways  []int32
	byCluster bool
	share     uint32
	// why the endpoint's network has no gateway address yet.
	why string
}

// decided records the fate of endpoint i of the current group.
func (tr *Trace) decided(i int, f fate) {
	te := tr.collecting[tr.cur[i]]
	te.Decision, te.Scaled = f.decision, f.weight
	var arith []string
	switch {
	case f.decision == KeptOneNetwork || f.decision == Forwarded:
		if te.Weight == 0 {
			arith = append(arith, "weight unset, sent as 1")
		}
	case f.decision != DroppedView && tr.MultiNetwork:
		arith = append(arith, weightArithmetic(te.Weight, tr.ScaleFactor))
	}
	k := len(tr.Endpoints)
	switch f.decision {
	case Replaced:
		for _, j := range f.gateways {
			te.Gateways = append(te.Gateways, tr.snap.Gateway(j).String())
			tr.contrib[j] = append(tr.contrib[j], k)
		}
		te.Share = f.share
		sel := "its network's"
		if f.byCluster {
			sel = "its network and cluster's"
		}
		arith = append(arith, fmt.Sprintf("%d / %d gateways (%s) = %d to each", f.weight, len(f.gateways), sel, f.share))
	case DroppedPending:
		arith = append(arith, f.why)
	}
	te.Arithmetic = strings.Join(arith, "; ")
	tr.Endpoints = append(tr.Endpoints, te)
	if f.decision.Sent() {
		tr.Result = append(tr.Result, SentEndpoint{
			Endpoint: te.Endpoint, Locality: te.Locality, Weight: f.weight, Network: te.Network, Cluster: te.Cluster,
			From: []int{k}, Arithmetic: "as the endpoint",
		})
	}
}

// gateway records gateway j sent for the current group with weight w, the
// clipped sum of the shares of the endpoints it replaced.
func (tr *Trace) gateway(j int32, gw *network.Gateway, sum uint64, w uint32) {
	from := tr.contrib[j]
	parts := make([]string, 0, len(from))
	for _, k := range from {
		parts = append(parts, fmt.Sprintf("%d (%s)", tr.Endpoints[k].Share, tr.Endpoints[k].Endpoint))
	}
	arith := strings.Join(parts, " + ") + " = " + strconv.FormatUint(sum, 10)
	switch {
	case sum > math.MaxUint32:
		arith += fmt.Sprintf(", clipped to %d", w)
	case sum == 0:
		arith += ", sent as 1"
	}
	tr.Result = append(tr.Result, SentEndpoint{
		Endpoint: gw.String(), Locality: tr.locality, Weight: w, Network: gw.Network, Cluster: gw.Cluster,
		Gateway: true, From: from, Arithmetic: arith,
	})
}

// prioritized records the priority of a locality's group.
func (tr *Trace) prioritized(locality string, raw int, prio uint32, why string) {
	tr.Priorities = append(tr.Priorities, LocalityPriority{Locality: locality, Raw: raw, Priority: prio, Match: why})
	for i := range tr.Result {
		if tr.Result[i].Locality == locality {
			tr.Result[i].Priority = prio
		}
	}
}

// sortResultByPriority puts the result in the order it is sent once
// groups are ordered by priority.
func (tr *Trace) sortResultByPriority() {
	slices.SortStableFunc(tr.Result, func(a, b SentEndpoint) int { return int(a.Priority) - int(b.Priority) })
	slices.SortStableFunc(tr.Priorities, func(a, b LocalityPriority) int { return int(a.Priority) - int(b.Priority) })
}

func weightArithmetic(w, scale uint32) string {
	if w == 0 {
		return fmt.Sprintf("weight unset → scale factor %d", scale)
	}
	p := uint64(w) * uint64(scale)
	if p > math.MaxUint32 {
		return fmt.Sprintf("weight %d × scale factor %d = %d, clipped to %d", w, scale, p, uint32(math.MaxUint32))
	}
	return fmt.Sprintf("weight %d × scale factor %d = %d", w, scale, p)
}

func hostPort(addr string, port uint32) string {
	return net.JoinHostPort(addr, strconv.FormatUint(uint64(port), 10))
}
