package xds

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
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
				var also []string
				for _, a := range lb.GetEndpoint().GetAdditionalAddresses() {
					x := a.GetAddress().GetSocketAddress()
					also = append(also, net.JoinHostPort(x.GetAddress(), strconv.FormatUint(uint64(x.GetPortValue()), 10)))
				}
				rows = append(rows, model.EndpointRow{
					AdditionalAddresses: also,
					Cluster:             cla.GetClusterName(),
					Endpoint:            fmt.Sprintf("%s:%d", sa.GetAddress(), sa.GetPortValue()),
					Health:              lb.GetHealthStatus().String(),
					Weight:              lb.GetLoadBalancingWeight().GetValue(),
					Locality:            loc,
					Priority:            le.GetPriority(),
					Network:             md["istio"].GetFields()["network"].GetStringValue(),
					Registry:            md["istio"].GetFields()["cluster"].GetStringValue(),
					TLSMode:             md["envoy.transport_socket_match"].GetFields()["tlsMode"].GetStringValue(),
				})
			}
		}
	}
	return rows, nil
}

// ClustersTLS explains the TLS of the clusters a view receives (all, or
// the one named cluster): the decision each was built from, and what the
// cluster the server holds carries, decoded, which must agree with it.
func (s *Server) ClustersTLS(v model.View, cluster string) ([]model.ClusterTLS, error) {
	rows := []model.ClusterTLS{}
	for _, r := range s.cache.Resources(v, resourcev3.ClusterType) {
		if cluster != "" && r.Name != cluster {
			continue
		}
		var c clusterv3.Cluster
		if err := proto.Unmarshal(r.Any.GetValue(), &c); err != nil {
			return nil, fmt.Errorf("decode %s: %w", r.Name, err)
		}
		served, err := servedTLS(&c)
		if err != nil {
			return nil, fmt.Errorf("decode %s: %w", r.Name, err)
		}
		row, ok := s.gen.ClusterTLS(v, r.Name)
		if !ok {
			row = model.ClusterTLS{Cluster: r.Name, Reason: "its service is gone; a push is pending"}
		}
		row.Served = &served
		rows = append(rows, row)
	}
	return rows, nil
}

// servedTLS reads what a built cluster carries for TLS, and its SNI.
func servedTLS(c *clusterv3.Cluster) (model.ServedTLS, error) {
	var ts *corev3.TransportSocket
	out := model.ServedTLS{TLS: model.ClusterTLSNone}
	switch {
	case c.GetTransportSocket() != nil:
		out.TLS, ts = model.ClusterTLSMutual, c.GetTransportSocket()
	case len(c.GetTransportSocketMatches()) > 0:
		out.TLS = model.ClusterTLSAuto
		for _, m := range c.GetTransportSocketMatches() {
			if m.GetTransportSocket().GetName() == transportSocketTLS {
				ts = m.GetTransportSocket()
			}
		}
	}
	if ts == nil {
		// An east-west gateway's cluster is named after the SNI its
		// filter chain matches.
		if _, _, _, ok := model.ParseSNIClusterName(c.GetName()); ok {
			out.SNI = c.GetName()
		}
		return out, nil
	}
	var u tlsv3.UpstreamTlsContext
	if err := ts.GetTypedConfig().UnmarshalTo(&u); err != nil {
		return out, err
	}
	out.SNI = u.GetSni()
	return out, nil
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
			writeJSON(w, s.visibleRows(node, rows))
		}),
		// /debug/proxyclusterz?node=ID[&cluster=NAME]: the TLS of the
		// clusters a connected node receives, and why.
		"/debug/proxyclusterz": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			node := r.URL.Query().Get("node")
			v, ok := s.NodeView(node)
			if !ok {
				http.Error(w, fmt.Sprintf("no connected node %q (see /debug/adsz)", node), http.StatusNotFound)
				return
			}
			rows, err := s.ClustersTLS(v, r.URL.Query().Get("cluster"))
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
