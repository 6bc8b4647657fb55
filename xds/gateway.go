package xds

import (
	"strconv"
	"strings"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	tlsinspectorv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/tls_inspector/v3"
	tcpproxyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/estuary-mesh/estuary/host/aggregate"
	"github.com/estuary-mesh/estuary/host/replica"
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
//     cannot be reached this way.
//
// The listener depends on every service, so the cache keeps it outside its
// per-hostname bookkeeping and rebuilds it whenever a push rebuilt any
// service's clusters.

// GatewayPort is the port of the east-west gateway's SNI listener.
const GatewayPort = 15443

// GatewayListenerName names the SNI listener.
const GatewayListenerName = "0.0.0.0_15443"

// SNIClusterName is the name of an east-west gateway cluster, which is
// also the SNI it matches: outbound_.PORT_.SUBSET_.HOST, which is
// outbound_.PORT_._.HOST without a subset (Istio's form).
func SNIClusterName(port uint32, subset, host string) string {
	return "outbound_." + strconv.FormatUint(uint64(port), 10) + "_." + subset + "_." + host
}

// ParseSNIClusterName splits an SNI cluster name.
func ParseSNIClusterName(name string) (port uint32, subset, host string, ok bool) {
	rest, found := strings.CutPrefix(name, "outbound_.")
	if !found {
		return 0, "", "", false
	}
	ps, rest, found1 := strings.Cut(rest, "_.")
	subset, host, found2 := strings.Cut(rest, "_.")
	if !found1 || !found2 || host == "" {
		return 0, "", "", false
	}
	p, err := strconv.ParseUint(ps, 10, 32)
	if err != nil {
		return 0, "", "", false
	}
	return uint32(p), subset, host, true
}

// parseAnyClusterName accepts both outbound|PORT|SUBSET|HOST and
// outbound_.PORT_.SUBSET_.HOST, for the cache's bookkeeping by hostname.
func parseAnyClusterName(name string) (port uint32, subset, host string, ok bool) {
	if port, subset, host, ok = ParseClusterName(name); ok {
		return
	}
	return ParseSNIClusterName(name)
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
			name := SNIClusterName(p.Number, subset, svc.Hostname)
			r := marshalResource(name, resourcev3.ClusterType, gatewayCluster(name))
			r.eds = true
			out = append(out, r)
		}
	}
	return out
}

func gatewayCluster(name string) *clusterv3.Cluster { return edsCluster(name) }

// GatewayListener builds the router's SNI listener over every service, or
// nil when there is no service to route to (Envoy refuses a listener
// without filter chains).
func (g *Generator) GatewayListener(v View) *Resource {
	if v.Kind != KindRouter {
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
	for _, svc := range g.Agg.Services() {
		if svc.Resolution != sdk.ResolutionStatic {
			continue
		}
		subsets := g.Subsets(svc.Hostname)
		for _, p := range svc.Ports {
			for _, subset := range append([]string{""}, subsets...) {
				name := SNIClusterName(p.Number, subset, svc.Hostname)
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

// GatewayForwards reports whether an east-west gateway with view v
// forwards to an endpoint: the view sees its network, the network is the
// gateway's own (or unknown, or the gateway has none), and the endpoint
// accepts Istio mTLS.
func GatewayForwards(v View, e *LbEndpoint) bool {
	return v.Sees(e.Network) && (e.Network == "" || v.Network == "" || e.Network == v.Network) && e.TLSMode == sdk.TLSModeIstio
}

// gatewayLocal is the network filter of SNI clusters: it places endpoints
// on networks as the real filter does and keeps those GatewayForwards
// accepts, with their weights as they are (no gateway is substituted).
type gatewayLocal struct{ inner NetworkFilter }

func (f gatewayLocal) EndpointNetwork(k replica.InstanceKey, p sdk.InstanceProperties, addr string) string {
	if f.inner == nil {
		return ""
	}
	return f.inner.EndpointNetwork(k, p, addr)
}

func (f gatewayLocal) Generation() uint64 {
	if f.inner == nil {
		return 0
	}
	return f.inner.Generation()
}

func (f gatewayLocal) Filter(v View, groups []LocalityGroup) []LocalityGroup {
	out := groups[:0]
	for _, g := range groups {
		kept := g.Endpoints[:0]
		for i := range g.Endpoints {
			if GatewayForwards(v, &g.Endpoints[i]) {
				kept = append(kept, g.Endpoints[i])
			}
		}
		if len(kept) > 0 {
			g.Endpoints = kept
			out = append(out, g)
		}
	}
	return out
}

// buildGatewayLocked rebuilds a router view's SNI listener and returns its
// name if it changed or went away.
func (c *Cache) buildGatewayLocked(vs *viewState) []string {
	if vs.view.Kind != KindRouter {
		return nil
	}
	r := c.gen.GatewayListener(vs.view)
	prev, had := vs.res[tListener][GatewayListenerName]
	switch {
	case r == nil && had:
		delete(vs.res[tListener], GatewayListenerName)
		vs.touched(tListener)
		return []string{GatewayListenerName}
	case r == nil:
		return nil
	case had && prev.Version == r.Version:
		return nil
	}
	vs.res[tListener][GatewayListenerName] = r
	vs.touched(tListener)
	return []string{GatewayListenerName}
}
