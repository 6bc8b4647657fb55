package xds

import (
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	tlsinspectorv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/tls_inspector/v3"
	tcpproxyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/estuary-mesh/estuary/host/aggregate"
	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/sdk"
)

// East-west gateways. A node whose id starts with "router~" is an Envoy
// east-west gateway (KindRouter); it asks, with REQUESTED_NETWORK_VIEW, to
// see only its own network. It receives:
//
//   - LDS: one listener on 15443 with a TLS inspector, and one filter chain
//     per service port (and subset) matching the SNI
//     outbound_.PORT_._.HOST (outbound_.PORT_.SUBSET_.HOST) that a sidecar on
//     another network sets when it reaches the service through the gateway;
//     each chain passes the TLS stream untouched (tcp_proxy) to the cluster
//     of the same name;
//   - CDS: those clusters, as EDS clusters;
//   - EDS: for each, the service's endpoints that are on the gateway's own
//     network (or of unknown network) and in Istio mTLS mode: the client's
//     mTLS runs end to end through the gateway, so a plain-text endpoint
//     cannot be reached this way. The endpoint pipeline applies that rule
//     (host/pipeline), beside the rules that place endpoints on networks.
//
// The listener depends on every service, so the cache keeps it outside its
// per-hostname bookkeeping and rebuilds it whenever a push rebuilt any
// service's clusters.

// GatewayPort is the port of the east-west gateway's SNI listener.
const GatewayPort = 15443

// GatewayListenerName names the SNI listener.
const GatewayListenerName = "0.0.0.0_15443"

// parseAnyClusterName accepts both outbound|PORT|SUBSET|HOST and
// outbound_.PORT_.SUBSET_.HOST, for the cache's bookkeeping by hostname.
func parseAnyClusterName(name string) (port uint32, subset, host string, ok bool) {
	if port, subset, host, ok = model.ParseClusterName(name); ok {
		return
	}
	return model.ParseSNIClusterName(name)
}

// gatewayClusters builds the SNI clusters of one service for a router.
// Only services whose endpoints are IPs known to the registry have them.
func (g *Generator) gatewayClusters(svc *aggregate.Service) []*Resource {
	if svc.Resolution != sdk.ResolutionStatic {
		return nil
	}
	var out []*Resource
	subsets := g.Subsets(svc.Hostname)
	for _, p := range svc.Ports {
		for _, subset := range append([]string{""}, subsets...) {
			name := model.SNIClusterName(p.Number, subset, svc.Hostname)
			r := marshalResource(name, resourcev3.ClusterType, gatewayCluster(name))
			r.eds = true
			out = append(out, r)
		}
	}
	return out
}

func gatewayCluster(name string) *clusterv3.Cluster { return edsCluster(name) }

// GatewayListener builds the router's SNI listener over every service
// but those hidden from it, or nil when there is no service to route to
// (Envoy refuses a listener without filter chains).
func (g *Generator) GatewayListener(v model.View, hidden func(host string) bool) *Resource {
	if v.Kind != model.KindRouter {
		return nil
	}
	inspector, _ := anypb.New(&tlsinspectorv3.TlsInspector{})
	l := &listenerv3.Listener{
		Name:    GatewayListenerName,
		Address: socketAddress("0.0.0.0", GatewayPort),
		ListenerFilters: []*listenerv3.ListenerFilter{{
			Name:       "envoy.filters.listener.tls_inspector",
			ConfigType: &listenerv3.ListenerFilter_TypedConfig{TypedConfig: inspector},
		}},
	}
	for _, svc := range g.agg.Services() {
		if svc.Resolution != sdk.ResolutionStatic || (hidden != nil && hidden(svc.Hostname)) {
			continue
		}
		subsets := g.Subsets(svc.Hostname)
		for _, p := range svc.Ports {
			for _, subset := range append([]string{""}, subsets...) {
				name := model.SNIClusterName(p.Number, subset, svc.Hostname)
				proxy, _ := anypb.New(&tcpproxyv3.TcpProxy{
					StatPrefix:       name,
					ClusterSpecifier: &tcpproxyv3.TcpProxy_Cluster{Cluster: name},
				})
				l.FilterChains = append(l.FilterChains, &listenerv3.FilterChain{
					Name:             name,
					FilterChainMatch: &listenerv3.FilterChainMatch{ServerNames: []string{name}},
					Filters: []*listenerv3.Filter{{
						Name:       "envoy.filters.network.tcp_proxy",
						ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: proxy},
					}},
				})
			}
		}
	}
	if len(l.FilterChains) == 0 {
		return nil
	}
	return marshalResource(GatewayListenerName, resourcev3.ListenerType, l)
}

// buildGatewayLocked rebuilds a router view's SNI listener and returns its
// name if it changed or went away.
func (c *Cache) buildGatewayLocked(vs *viewState) []string {
	if vs.view.Kind != model.KindRouter {
		return nil
	}
	r := c.gen.GatewayListener(vs.view, nil)
	clear(vs.gateways) // the filtered ones are built again on demand
	prev, had := vs.res[tListener][GatewayListenerName]
	switch {
	case r == nil && had:
		delete(vs.res[tListener], GatewayListenerName)
		vs.touched(tListener)
		return []string{GatewayListenerName}
	case r == nil:
		return nil
	case had && prev.Version() == r.Version():
		return nil
	}
	vs.res[tListener][GatewayListenerName] = r
	vs.touched(tListener)
	return []string{GatewayListenerName}
}
