package xds

import (
	"encoding/json"
	"fmt"
	"net/http"

	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"

	"github.com/estuary-mesh/estuary/host/model"
)

// EndpointRows decodes the CLAs a view receives (all, or one cluster).
func (s *Server) EndpointRows(v model.View, cluster string) ([]model.EndpointRow, error) {
	var rows []model.EndpointRow
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
				rows = append(rows, model.EndpointRow{
					Cluster:  cla.GetClusterName(),
					Endpoint: fmt.Sprintf("%s:%d", sa.GetAddress(), sa.GetPortValue()),
					Health:   lb.GetHealthStatus().String(),
					Weight:   lb.GetLoadBalancingWeight().GetValue(),
					Locality: loc,
					Priority: le.GetPriority(),
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
