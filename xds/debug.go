package xds

import (
	"encoding/json"
	"fmt"
	"net/http"

	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
)

// EndpointRow is one endpoint a node receives, as `estuary proxy-config
// endpoints` prints it.
type EndpointRow struct {
	Cluster  string `json:"cluster"`
	Endpoint string `json:"endpoint"`
	Health   string `json:"health"`
	Weight   uint32 `json:"weight"`
	Locality string `json:"locality"`
	Network  string `json:"network,omitempty"`
	// Registry is the cluster of the registry the endpoint came from (or,
	// for a gateway, the gateway's cluster).
	Registry string `json:"registry_cluster,omitempty"`
	TLSMode  string `json:"tls_mode,omitempty"`
}

// EndpointRows decodes the CLAs a view receives (all, or one cluster).
func (s *Server) EndpointRows(v View, cluster string) ([]EndpointRow, error) {
	var rows []EndpointRow
	for _, r := range s.cache.Resources(v, resourcev3.EndpointType) {
		if cluster != "" && r.Name != cluster {
			continue
		}
		var cla endpointv3.ClusterLoadAssignment
		if err := proto.Unmarshal(r.Any.GetValue(), &cla); err != nil {
			return nil, fmt.Errorf("decode %s: %w", r.Name, err)
		}
		for _, le := range cla.GetEndpoints() {
			l := le.GetLocality()
			loc := l.GetRegion() + "/" + l.GetZone() + "/" + l.GetSubZone()
			for _, lb := range le.GetLbEndpoints() {
				sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
				md := lb.GetMetadata().GetFilterMetadata()
				rows = append(rows, EndpointRow{
					Cluster:  cla.GetClusterName(),
					Endpoint: fmt.Sprintf("%s:%d", sa.GetAddress(), sa.GetPortValue()),
					Health:   lb.GetHealthStatus().String(),
					Weight:   lb.GetLoadBalancingWeight().GetValue(),
					Locality: loc,
					Network:  md["istio"].GetFields()["network"].GetStringValue(),
					Registry: md["istio"].GetFields()["cluster"].GetStringValue(),
					TLSMode:  md["envoy.transport_socket_match"].GetFields()["tlsMode"].GetStringValue(),
				})
			}
		}
	}
	return rows, nil
}

// DebugHandlers returns the server's debug pages by path.
func (s *Server) DebugHandlers() map[string]http.Handler {
	return map[string]http.Handler{
		"/debug/adsz": http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, s.Clients())
		}),
		// /debug/proxyendpointz?node=ID[&cluster=NAME]: the endpoints a
		// connected node receives.
		"/debug/proxyendpointz": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			node := r.URL.Query().Get("node")
			v, ok := s.NodeView(node)
			if !ok {
				http.Error(w, fmt.Sprintf("no connected node %q (see /debug/adsz)", node), http.StatusNotFound)
				return
			}
			rows, err := s.EndpointRows(v, r.URL.Query().Get("cluster"))
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			writeJSON(w, rows)
		}),
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
