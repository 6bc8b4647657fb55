package pipeline

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"

	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/host/network"
	"github.com/estuary-mesh/estuary/host/replica"
)

// Explanation is what `estuary explain endpoint` prints: the trace of one
// cluster for a node's view and, for a connected node, what the xDS server
// holds for it, which should be the trace's result.
type Explanation struct {
	Node string `json:"node,omitempty"`
	Trace
	// Received is what the xDS server holds for the node, decoded.
	Received []model.EndpointRow `json:"received,omitempty"`
	// TLS is the cluster's TLS and why, from the xDS server's cluster
	// builder, with what the cluster it holds carries.
	TLS *model.ClusterTLS `json:"tls,omitempty"`
}

// TLSExplainer is what an xDS server adds to an explanation when it has
// it: the TLS of a view's cluster, from the decision the cluster was
// built from (the pipeline decides endpoints, not TLS).
type TLSExplainer interface {
	ClustersTLS(v model.View, cluster string) ([]model.ClusterTLS, error)
}

// Explain runs the pipeline for view v and the cluster named cluster with
// a trace, and returns the trace.
func (p *Pipeline) Explain(v model.View, cluster string) (*Trace, error) {
	tr := &Trace{}
	if _, err := p.Endpoints(v, cluster, tr); err != nil {
		return nil, err
	}
	return tr, nil
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
// service of every instance, and says which rule placed it on its network.
func (p *Pipeline) EndpointNetworks(address string) []EndpointOrigin {
	snap := p.snapshot()
	out := []EndpointOrigin{}
	for _, in := range p.agg.Store().Instances() {
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
				n, rule := placeEndpoint(snap, e.Network, props.DefaultNetwork, in.Key.Cluster, e.Address)
				out = append(out, EndpointOrigin{Hostname: h, Instance: in.Key, Address: e.Address, OwnNetwork: e.Network,
					RegistryDefault: props.DefaultNetwork, Network: n, Rule: rule})
			}
		}
	}
	return out
}

// Nodes is what the debug handler needs from the xDS server: the view of
// a connected node, and what the server holds for a view's cluster.
type Nodes interface {
	NodeView(node string) (model.View, bool)
	EndpointRows(v model.View, cluster string) ([]model.EndpointRow, error)
}

// Handler serves /debug/networkz; nodes may be nil (no xDS server):
//
//	/debug/networkz                          networks, gateways, DNS names
//	/debug/networkz?endpoint=IP              which network each endpoint with the IP is on, and by which rule
//	/debug/networkz?explain=CLUSTER&node=ID  the trace of a cluster for a connected node
//	/debug/networkz?explain=CLUSTER&network=N[&requested=N1,N2][&cluster_id=C][&locality=R/Z/S][&kind=router]
//	                                         the same for a node that would have that view
func (p *Pipeline) Handler(nodes Nodes) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		switch {
		case q.Has("explain"):
			var v model.View
			node := q.Get("node")
			if node != "" {
				ok := false
				if nodes != nil {
					v, ok = nodes.NodeView(node)
				}
				if !ok {
					http.Error(w, fmt.Sprintf("no connected node %q (see /debug/adsz)", node), http.StatusNotFound)
					return
				}
			} else {
				v = model.View{Kind: model.KindProxyless, Network: q.Get("network"), Networks: q.Get("requested"), Cluster: q.Get("cluster_id"), Locality: q.Get("locality")}
				switch q.Get("kind") {
				case "", "proxyless":
				case "envoy":
					v.Kind = model.KindEnvoy
				case "router":
					v.Kind = model.KindRouter
				default:
					http.Error(w, fmt.Sprintf("kind %q is none of proxyless, envoy, router", q.Get("kind")), http.StatusBadRequest)
					return
				}
			}
			tr, err := p.Explain(v, q.Get("explain"))
			if err != nil {
				http.Error(w, err.Error(), http.StatusNotFound)
				return
			}
			ex := &Explanation{Node: node, Trace: *tr}
			if node != "" {
				rows, err := nodes.EndpointRows(v, tr.Cluster)
				if err != nil {
					ex.Notes = append(ex.Notes, "decoding what the node receives: "+err.Error())
				}
				ex.Received = rows
			}
			if te, ok := nodes.(TLSExplainer); ok {
				rows, err := te.ClustersTLS(v, tr.Cluster)
				switch {
				case err != nil:
					ex.Notes = append(ex.Notes, "explaining the cluster's TLS: "+err.Error())
				case len(rows) == 1:
					ex.TLS = &rows[0]
				}
			}
			writeJSON(w, ex)
		case q.Has("endpoint"):
			writeJSON(w, p.EndpointNetworks(q.Get("endpoint")))
		default:
			st := network.Status{}
			if p.nets != nil {
				st = p.nets.Status()
			}
			for _, r := range Precedence() {
				st.Precedence = append(st.Precedence, r.String())
			}
			writeJSON(w, st)
		}
	})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
