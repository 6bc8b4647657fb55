package network

import (
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/estuary-mesh/estuary/host/aggregate"
	"github.com/estuary-mesh/estuary/host/replica"
	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/xds"
)

// Status is /debug/networkz.
type Status struct {
	Generation   uint64 `json:"generation"`
	MultiNetwork bool   `json:"multi_network"`
	ScaleFactor  uint32 `json:"scale_factor"`
	// Precedence lists the rules that decide an endpoint's network, first
	// match wins.
	Precedence []string        `json:"precedence"`
	Networks   []NetworkStatus `json:"networks"`
	Gateways   []Gateway       `json:"gateways"`
	// Pending are networks whose configured gateways have no address yet.
	Pending    map[string]string `json:"pending,omitempty"`
	DNSServers []string          `json:"dns_servers"`
	DNS        []DNSStatus       `json:"dns"`
	Notes      []string          `json:"notes,omitempty"`
	File       string            `json:"meshnetworks_file,omitempty"`
}

// NetworkStatus is one configured network.
type NetworkStatus struct {
	Name      string   `json:"name"`
	Declared  string   `json:"declared_at"`
	Endpoints []string `json:"endpoints"`
	Gateways  []string `json:"gateways"`
}

// Status reports networks, gateways and DNS names.
func (m *Manager) Status() Status {
	s := m.snap.Load()
	st := Status{
		Generation: s.gen, MultiNetwork: s.multi, ScaleFactor: s.scale,
		Networks: []NetworkStatus{}, Gateways: slices.Clone(s.gateways), Pending: s.pending,
		DNS: m.res.status(), Notes: s.notes, File: s.cfg.File,
	}
	if st.Gateways == nil {
		st.Gateways = []Gateway{}
	}
	for _, r := range []Rule{RuleEndpoint, RuleRegistryDefault, RuleFromRegistry, RuleFromCIDR} {
		st.Precedence = append(st.Precedence, r.String())
	}
	m.res.mu.Lock()
	st.DNSServers = slices.Clone(m.res.servers)
	m.res.mu.Unlock()
	for _, n := range s.cfg.Networks {
		ns := NetworkStatus{Name: n.Name, Declared: position(n.Range), Endpoints: []string{}, Gateways: []string{}}
		for _, r := range n.Endpoints {
			ns.Endpoints = append(ns.Endpoints, r.String())
		}
		for _, g := range n.Gateways {
			ns.Gateways = append(ns.Gateways, g.String())
		}
		st.Networks = append(st.Networks, ns)
	}
	return st
}

// EndpointOrigin is where one endpoint comes from and which rule decided
// its network.
type EndpointOrigin struct {
	Hostname        string              `json:"hostname,omitempty"`
	Instance        replica.InstanceKey `json:"instance"`
	Address         string              `json:"address"`
	OwnNetwork      string              `json:"own_network,omitempty"`
	RegistryDefault string              `json:"registry_default,omitempty"`
	Network         string              `json:"network"`
	Rule            Rule                `json:"rule"`
}

// EndpointNetworks finds every endpoint with the address, in every
// service of every instance, and says which rule decided its network.
func (m *Manager) EndpointNetworks(address string) []EndpointOrigin {
	out := []EndpointOrigin{}
	for _, in := range m.agg.Store().Instances() {
		props := in.Properties()
		hosts := in.Hostnames()
		slices.Sort(hosts)
		for _, h := range hosts {
			set := in.Endpoints(h)
			for i := range set.Len() {
				e := &set.Endpoints[i]
				if e.Address != address {
					continue
				}
				n, rule := m.Resolve(in.Key, props, e.Network, e.Address)
				out = append(out, EndpointOrigin{Hostname: h, Instance: in.Key, Address: e.Address, OwnNetwork: e.Network,
					RegistryDefault: props.DefaultNetwork, Network: n, Rule: rule})
			}
		}
	}
	return out
}

// Explanation is what `estuary explain endpoint` prints: for each endpoint
// of a cluster, where it came from, which rule placed it on its network,
// what the filter did with it for the node's view, and the weights.
type Explanation struct {
	Node         string `json:"node,omitempty"`
	View         string `json:"view"`
	Cluster      string `json:"cluster"`
	Generation   uint64 `json:"generation"`
	MultiNetwork bool   `json:"multi_network"`
	ScaleFactor  uint32 `json:"scale_factor"`
	// Endpoints are the cluster's endpoints before the filter, by locality.
	Endpoints []ExplainedEndpoint `json:"endpoints"`
	// Result is what the node gets, by locality.
	Result []ResultEndpoint `json:"result"`
	// Received is what the xDS server holds for the node, decoded, when
	// the node is connected: it should match Result.
	Received []xds.EndpointRow `json:"received,omitempty"`
	Notes    []string          `json:"notes,omitempty"`
}

// ExplainedEndpoint is one registry endpoint.
type ExplainedEndpoint struct {
	Endpoint string              `json:"endpoint"`
	Locality string              `json:"locality"`
	Instance replica.InstanceKey `json:"instance"`
	Cluster  string              `json:"cluster"`
	Network  string              `json:"network"`
	Rule     Rule                `json:"rule"`
	TLSMode  string              `json:"tls_mode"`
	Weight   uint32              `json:"weight"`
	Scaled   uint32              `json:"scaled_weight"`
	Decision Decision            `json:"decision"`
	// Gateways replaced it, each receiving Share.
	Gateways   []string `json:"gateways,omitempty"`
	Share      uint32   `json:"share,omitempty"`
	Arithmetic string   `json:"arithmetic"`
}

// ResultEndpoint is one endpoint the node receives.
type ResultEndpoint struct {
	Endpoint   string `json:"endpoint"`
	Locality   string `json:"locality"`
	Weight     uint32 `json:"weight"`
	Network    string `json:"network,omitempty"`
	Cluster    string `json:"cluster,omitempty"`
	Gateway    bool   `json:"gateway"`
	Arithmetic string `json:"arithmetic"`
}

// explainFilter runs the manager's filter with a trace, keeping a copy of
// what the generator passed in.
type explainFilter struct {
	m     *Manager
	s     *snapshot
	tr    *trace
	input []xds.LocalityGroup
}

func (f *explainFilter) EndpointNetwork(k replica.InstanceKey, p sdk.InstanceProperties, addr string) string {
	n, _ := f.s.endpointNetwork(k.Cluster, addr)
	return n
}

func (f *explainFilter) Generation() uint64 { return f.s.gen }

func (f *explainFilter) Filter(v xds.View, groups []xds.LocalityGroup) []xds.LocalityGroup {
	f.input = make([]xds.LocalityGroup, len(groups))
	for i, g := range groups {
		f.input[i] = g
		f.input[i].Endpoints = slices.Clone(g.Endpoints)
	}
	if !f.s.multi {
		return groups
	}
	return f.m.filter(f.s, v, groups, f.tr)
}

// Explain works out, for a view, what the filter does with each endpoint
// of an outbound|PORT|SUBSET|HOST cluster. It builds the endpoints with the
// xDS generator itself, so it sees exactly what the server filters.
func (m *Manager) Explain(v xds.View, cluster string) (*Explanation, error) {
	port, subset, host, ok := xds.ParseClusterName(cluster)
	if !ok {
		return nil, fmt.Errorf("%q is not a cluster name of the form outbound|PORT|SUBSET|HOST", cluster)
	}
	svc := m.agg.GetService(host)
	if svc == nil {
		return nil, fmt.Errorf("no service %q", host)
	}
	if svc.Resolution != sdk.ResolutionStatic {
		return nil, fmt.Errorf("service %q has resolution %s: its endpoints are resolved by the client, not filtered by network", host, svc.Resolution)
	}
	var sp sdk.Port
	found := false
	for _, p := range svc.Ports {
		if p.Number == port {
			sp, found = p, true
		}
	}
	if !found {
		return nil, fmt.Errorf("service %q has no port %d", host, port)
	}
	s := m.snap.Load()
	f := &explainFilter{m: m, s: s, tr: &trace{}}
	gen := &xds.Generator{Agg: m.agg, Networks: f}
	sources := m.agg.EndpointSources(host)
	result := gen.LocalityGroups(v, svc, sp, subset, sources)

	ex := &Explanation{View: v.String(), Cluster: cluster, Generation: s.gen, MultiNetwork: s.multi, ScaleFactor: s.scale,
		Endpoints: []ExplainedEndpoint{}, Result: []ResultEndpoint{}}
	origins := m.origins(f.input, sources, subset)
	if !s.multi {
		ex.Notes = append(ex.Notes, "multi-network is off (no gateway): every endpoint passes through unchanged")
		for gi, g := range f.input {
			for i, e := range g.Endpoints {
				f.tr.steps = append(f.tr.steps, step{group: gi, index: i, in: e, decision: KeptLocal, scaled: e.Weight})
			}
		}
	}
	for _, st := range f.tr.steps {
		o := origins[st.group][st.index]
		ee := ExplainedEndpoint{
			Endpoint: hostPort(st.in.Address, st.in.Port), Locality: f.input[st.group].Locality,
			Instance: o.Instance, Cluster: st.in.Cluster, Network: st.in.Network, Rule: o.Rule, TLSMode: st.in.TLSMode.String(),
			Weight: st.in.Weight, Scaled: st.scaled, Decision: st.decision, Share: st.share,
		}
		if o.Network != st.in.Network {
			ex.Notes = append(ex.Notes, fmt.Sprintf("%s: the generator placed it on %q but the rules give %q (changed meanwhile?)", ee.Endpoint, st.in.Network, o.Network))
		}
		var arith []string
		if s.multi && st.decision != DroppedView {
			arith = append(arith, weightArithmetic(st.in.Weight, s.scale))
		}
		if st.decision == Replaced {
			for _, j := range st.gateways {
				ee.Gateways = append(ee.Gateways, s.gateways[j].String())
			}
			sel := "its network's"
			if len(s.byNetCluster[netCluster{st.in.Network, st.in.Cluster}]) > 0 {
				sel = "its network and cluster's"
			}
			arith = append(arith, fmt.Sprintf("%d / %d gateways (%s) = %d to each", st.scaled, len(st.gateways), sel, st.share))
		}
		if st.decision == DroppedPending {
			arith = append(arith, s.pending[st.in.Network])
		}
		ee.Arithmetic = strings.Join(arith, "; ")
		ex.Endpoints = append(ex.Endpoints, ee)
	}
	for _, g := range result {
		for _, e := range g.Endpoints {
			re := ResultEndpoint{Endpoint: hostPort(e.Address, e.Port), Locality: g.Locality, Weight: e.Weight, Network: e.Network, Cluster: e.Cluster}
			re.Arithmetic = "as the endpoint"
			for _, out := range f.tr.out {
				gw := s.gateways[out.gateway]
				if f.input[out.group].Locality != g.Locality || gw.Address != e.Address || gw.Port != e.Port || gw.Network != e.Network || gw.Cluster != e.Cluster {
					continue
				}
				re.Gateway = true
				re.Arithmetic = gatewayArithmetic(f.tr.steps, out)
			}
			ex.Result = append(ex.Result, re)
		}
	}
	return ex, nil
}

// origins maps each endpoint the generator passed to the filter back to
// its instance, in the generator's own order: sources in order, endpoints
// in order, grouped by locality.
func (m *Manager) origins(groups []xds.LocalityGroup, sources []aggregate.EndpointSource, subset string) [][]EndpointOrigin {
	out := make([][]EndpointOrigin, len(groups))
	byLoc := map[string]int{}
	for i, g := range groups {
		byLoc[g.Locality] = i
		out[i] = make([]EndpointOrigin, 0, len(g.Endpoints))
	}
	for _, src := range sources {
		for i := range src.Set.Endpoints {
			e := &src.Set.Endpoints[i]
			if subset != "" && e.Labels[xds.SubsetLabel] != subset {
				continue
			}
			gi, ok := byLoc[e.Locality]
			if !ok {
				continue
			}
			n, rule := m.Resolve(src.Instance.Key, src.Properties, e.Network, e.Address)
			out[gi] = append(out[gi], EndpointOrigin{Instance: src.Instance.Key, Address: e.Address, OwnNetwork: e.Network,
				RegistryDefault: src.Properties.DefaultNetwork, Network: n, Rule: rule})
		}
	}
	for i, g := range groups {
		for len(out[i]) < len(g.Endpoints) {
			out[i] = append(out[i], EndpointOrigin{})
		}
	}
	return out
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

func gatewayArithmetic(steps []step, out emitted) string {
	var parts []string
	for _, st := range steps {
		if st.group == out.group && st.decision == Replaced && slices.Contains(st.gateways, out.gateway) {
			parts = append(parts, fmt.Sprintf("%d (%s)", st.share, hostPort(st.in.Address, st.in.Port)))
		}
	}
	s := strings.Join(parts, " + ") + " = " + strconv.FormatUint(out.sum, 10)
	switch {
	case out.sum > math.MaxUint32:
		s += fmt.Sprintf(", clipped to %d", out.weight)
	case out.sum == 0:
		s += ", sent as 1"
	}
	return s
}

func hostPort(addr string, port uint32) string {
	return net.JoinHostPort(addr, strconv.FormatUint(uint64(port), 10))
}

// Clients is what explain asks of the xDS server about connected nodes.
type Clients interface {
	// NodeView returns the view of a connected node.
	NodeView(node string) (xds.View, bool)
	// EndpointRows decodes what a view receives for a cluster, shown next
	// to the explanation.
	EndpointRows(v xds.View, cluster string) ([]xds.EndpointRow, error)
}

var _ Clients = (*xds.Server)(nil)

// Handler serves /debug/networkz:
//
//	/debug/networkz                          networks, gateways, DNS names
//	/debug/networkz?endpoint=IP              which network each endpoint with the IP is on, and by which rule
//	/debug/networkz?explain=CLUSTER&node=ID  what the filter does for a connected node
//	/debug/networkz?explain=CLUSTER&network=N[&requested=N1,N2]
//	                                         the same for a node that would have that view
//
// clients, the xDS server in the host, finds connected nodes and what they
// receive; with nil, explain answers for views only.
func (m *Manager) Handler(clients Clients) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		switch {
		case q.Has("explain"):
			var v xds.View
			node := q.Get("node")
			if node != "" {
				ok := false
				if clients != nil {
					v, ok = clients.NodeView(node)
				}
				if !ok {
					http.Error(w, fmt.Sprintf("no connected node %q (see /debug/adsz)", node), http.StatusNotFound)
					return
				}
			} else {
				v = xds.View{Kind: xds.KindProxyless, Network: q.Get("network"), Networks: q.Get("requested"), Cluster: q.Get("cluster_id")}
			}
			ex, err := m.Explain(v, q.Get("explain"))
			if err != nil {
				http.Error(w, err.Error(), http.StatusNotFound)
				return
			}
			ex.Node = node
			if node != "" && clients != nil {
				rows, err := clients.EndpointRows(v, ex.Cluster)
				if err != nil {
					ex.Notes = append(ex.Notes, "decoding what the node receives: "+err.Error())
				}
				ex.Received = rows
			}
			writeJSON(w, ex)
		case q.Has("endpoint"):
			writeJSON(w, m.EndpointNetworks(q.Get("endpoint")))
		default:
			writeJSON(w, m.Status())
		}
	})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
