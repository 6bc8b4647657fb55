package xds

import (
	"hash/maphash"
	"slices"
	"strconv"
	"sync"
	"time"
	"unsafe"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/estuary-mesh/estuary/host/aggregate"
	"github.com/estuary-mesh/estuary/host/replica"
	"github.com/estuary-mesh/estuary/sdk"
)

// Resource is one built xDS resource, marshaled once and shared by every
// node of a view.
type Resource struct {
	Name    string
	Version string
	Any     *anypb.Any
	// hostVersion and netGen are what a CLA was built from: the
	// aggregate's version of its hostname and the network generation.
	// Equal inputs give equal output, so an unchanged CLA is not rebuilt.
	hostVersion, netGen uint64
	// eds marks clusters whose endpoints come by EDS.
	eds     bool
	any     anypb.Any // Any points here: one allocation per resource
	version [13]byte  // Version's bytes: a base-36 uint64 fits
}

var hashSeed = maphash.MakeSeed()

func newResource(name, typeURL string, body []byte) *Resource {
	r := &Resource{Name: name}
	// The version's bytes live in the resource: one allocation for both.
	v := strconv.AppendUint(r.version[:0], maphash.Bytes(hashSeed, body), 36)
	r.Version = unsafe.String(&v[0], len(v))
	r.any.TypeUrl, r.any.Value = typeURL, body
	r.Any = &r.any
	return r
}

func marshalResource(name, typeURL string, m proto.Message) *Resource {
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		panic(err) // resources are built from valid values
	}
	return newResource(name, typeURL, body)
}

// NetworkFilter rewrites a view's endpoints for multi-network meshes:
// endpoints on networks the node cannot reach are replaced by their
// network's gateways. host/network implements it.
type NetworkFilter interface {
	// EndpointNetwork returns the network of an endpoint that carries none
	// of its own.
	EndpointNetwork(instance replica.InstanceKey, props sdk.InstanceProperties, address string) string
	// Filter rewrites the locality groups of one CLA for a view.
	Filter(v View, groups []LocalityGroup) []LocalityGroup
	// Generation changes whenever networks or gateways change.
	Generation() uint64
}

// Generator builds resources from the aggregate registry.
type Generator struct {
	Agg      *aggregate.Registry
	Networks NetworkFilter // nil: single network
}

// SubsetLabel is the endpoint label whose values name a service's subsets:
// each distinct value V gets a cluster outbound|PORT|V|HOST.
const SubsetLabel = "version"

// Subsets lists the distinct SubsetLabel values of a service's endpoints.
func (g *Generator) Subsets(host string) []string {
	var out []string
	for _, src := range g.Agg.EndpointSources(host) {
		for i := range src.Set.Endpoints {
			if v := src.Set.Endpoints[i].Labels[SubsetLabel]; v != "" && !slices.Contains(out, v) {
				out = append(out, v)
			}
		}
	}
	slices.Sort(out)
	return out
}

// Clusters builds the CDS resources of one service for a view.
func (g *Generator) Clusters(v View, svc *aggregate.Service) []*Resource {
	if v.Kind == KindRouter {
		return g.gatewayClusters(svc) // east-west gateway: gateway.go
	}
	var out []*Resource
	subsets := g.Subsets(svc.Hostname)
	for _, p := range svc.Ports {
		switch svc.Resolution {
		case sdk.ResolutionStatic:
			for _, subset := range append([]string{""}, subsets...) {
				name := ClusterName(p.Number, subset, svc.Hostname)
				r := marshalResource(name, resourcev3.ClusterType, edsCluster(name))
				r.eds = true
				out = append(out, r)
			}
		case sdk.ResolutionDNS, sdk.ResolutionDNSRoundRobin:
			if c := g.dnsCluster(v, svc, p); c != nil {
				out = append(out, marshalResource(c.Name, resourcev3.ClusterType, c))
			}
		case sdk.ResolutionPassthrough:
			if v.Kind == KindProxyless {
				continue // gRPC has no original-destination clusters
			}
			name := ClusterName(p.Number, "", svc.Hostname)
			out = append(out, marshalResource(name, resourcev3.ClusterType, &clusterv3.Cluster{
				Name:                 name,
				ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_ORIGINAL_DST},
				LbPolicy:             clusterv3.Cluster_CLUSTER_PROVIDED,
				ConnectTimeout:       durationpb.New(connectTimeout),
			}))
		}
	}
	return out
}

const connectTimeout = 10 * time.Second

func adsSource() *corev3.ConfigSource {
	return &corev3.ConfigSource{
		ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
		ResourceApiVersion:    corev3.ApiVersion_V3,
	}
}

func edsCluster(name string) *clusterv3.Cluster {
	return &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig:     &clusterv3.Cluster_EdsClusterConfig{EdsConfig: adsSource(), ServiceName: name},
		ConnectTimeout:       durationpb.New(connectTimeout),
		LbPolicy:             clusterv3.Cluster_ROUND_ROBIN,
	}
}

// dnsCluster resolves a DNS service's endpoint hostnames in the client:
// STRICT_DNS for DNS, LOGICAL_DNS for DNS_ROUND_ROBIN (and always for
// proxyless gRPC, which supports only LOGICAL_DNS, with one hostname).
func (g *Generator) dnsCluster(v View, svc *aggregate.Service, p sdk.Port) *clusterv3.Cluster {
	var lbs []*endpointv3.LbEndpoint
	for _, src := range g.Agg.EndpointSources(svc.Hostname) {
		for i := range src.Set.Endpoints {
			e := &src.Set.Endpoints[i]
			lbs = append(lbs, &endpointv3.LbEndpoint{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Address: socketAddress(e.Address, e.TargetPort(p)),
			}}})
		}
	}
	if len(lbs) == 0 {
		return nil
	}
	kind := clusterv3.Cluster_STRICT_DNS
	if svc.Resolution == sdk.ResolutionDNSRoundRobin || v.Kind == KindProxyless {
		kind = clusterv3.Cluster_LOGICAL_DNS
		lbs = lbs[:1]
	}
	name := ClusterName(p.Number, "", svc.Hostname)
	return &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: kind},
		ConnectTimeout:       durationpb.New(connectTimeout),
		LbPolicy:             clusterv3.Cluster_ROUND_ROBIN,
		DnsLookupFamily:      clusterv3.Cluster_V4_PREFERRED,
		LoadAssignment: &endpointv3.ClusterLoadAssignment{
			ClusterName: name,
			Endpoints:   []*endpointv3.LocalityLbEndpoints{{LbEndpoints: lbs}},
		},
	}
}

func socketAddress(addr string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address: addr, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
	}}}
}

// ListenerName is the proxyless gRPC listener of a service port: the target
// a client dials as xds:///HOST:PORT.
func ListenerName(host string, port uint32) string {
	return host + ":" + strconv.FormatUint(uint64(port), 10)
}

// Listeners builds the proxyless API listeners of one service: one per
// port, named HOST:PORT, routing through RDS.
func (g *Generator) Listeners(v View, svc *aggregate.Service) []*Resource {
	if v.Kind != KindProxyless || !g.routable(svc) {
		return nil
	}
	router, _ := anypb.New(&routerv3.Router{})
	var out []*Resource
	for _, p := range svc.Ports {
		name := ListenerName(svc.Hostname, p.Number)
		hcm := &hcmv3.HttpConnectionManager{
			RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{ConfigSource: adsSource(), RouteConfigName: name}},
			HttpFilters:    []*hcmv3.HttpFilter{{Name: "envoy.filters.http.router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: router}}},
		}
		api, _ := anypb.New(hcm)
		out = append(out, marshalResource(name, resourcev3.ListenerType, &listenerv3.Listener{
			Name:        name,
			ApiListener: &listenerv3.ApiListener{ApiListener: api},
		}))
	}
	return out
}

// Routes builds the route configurations the proxyless listeners name.
func (g *Generator) Routes(v View, svc *aggregate.Service) []*Resource {
	if v.Kind != KindProxyless || !g.routable(svc) {
		return nil
	}
	var out []*Resource
	for _, p := range svc.Ports {
		name := ListenerName(svc.Hostname, p.Number)
		out = append(out, marshalResource(name, resourcev3.RouteType, &routev3.RouteConfiguration{
			Name: name,
			VirtualHosts: []*routev3.VirtualHost{{
				Name:    name,
				Domains: []string{svc.Hostname, name},
				Routes: []*routev3.Route{{
					Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
					Action: &routev3.Route_Route{Route: &routev3.RouteAction{
						ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: ClusterName(p.Number, "", svc.Hostname)},
					}},
				}},
			}},
		}))
	}
	return out
}

// routable: a listener must never name a cluster the client cannot have.
func (g *Generator) routable(svc *aggregate.Service) bool {
	return svc.Resolution != sdk.ResolutionPassthrough
}

// CLA builds the ClusterLoadAssignment named name for a view. prev, when
// built from the same inputs, is returned as is. It returns nil when the
// cluster does not exist.
func (g *Generator) CLA(v View, name string, prev *Resource) *Resource {
	if v.Kind == KindRouter {
		// East-west gateway: SNI clusters of local mTLS endpoints (gateway.go).
		port, subset, host, ok := ParseSNIClusterName(name)
		if !ok {
			return nil
		}
		return g.cla(v, name, prev, port, subset, host, gatewayLocal{g.Networks})
	}
	port, subset, host, ok := ParseClusterName(name)
	if !ok {
		return nil
	}
	return g.cla(v, name, prev, port, subset, host, g.Networks)
}

// cla builds a CLA through filter (nil: no network filtering).
func (g *Generator) cla(v View, name string, prev *Resource, port uint32, subset, host string, filter NetworkFilter) *Resource {
	var netGen uint64
	if g.Networks != nil {
		netGen = g.Networks.Generation()
	}
	hostVersion := g.Agg.HostVersion(host)
	if prev != nil && prev.hostVersion == hostVersion && prev.netGen == netGen {
		return prev
	}
	svc := g.Agg.GetService(host)
	if svc == nil || svc.Resolution != sdk.ResolutionStatic {
		return nil
	}
	p, ok := findPort(svc.Ports, port)
	if !ok {
		return nil
	}
	scratch := groupPool.Get().(*[]LocalityGroup)
	var buf [4]aggregate.EndpointSource // a service is rarely in more instances
	groups := g.collectGroups(*scratch, svc, p, subset, g.Agg.AppendEndpointSources(buf[:0], host), filter)
	*scratch = groups
	if filter != nil {
		// A filter may rearrange the slice it gets; the pooled groups must
		// keep their own endpoint arrays.
		groups = filter.Filter(v, slices.Clone(groups))
	}
	r := newResource(name, resourcev3.EndpointType, EncodeCLA(name, groups))
	groupPool.Put(scratch)
	r.hostVersion, r.netGen = hostVersion, netGen
	return r
}

// groupPool holds locality groups for reuse between CLA builds: EncodeCLA
// copies everything out, so the groups and their endpoint slices keep
// their capacity for the next build instead of being allocated again.
var groupPool = sync.Pool{New: func() any { return new([]LocalityGroup) }}

// LocalityGroups computes the endpoints a view receives for one cluster,
// grouped by locality, after the network filter.
func (g *Generator) LocalityGroups(v View, svc *aggregate.Service, p sdk.Port, subset string, sources []aggregate.EndpointSource) []LocalityGroup {
	groups := g.collectGroups(nil, svc, p, subset, sources, g.Networks)
	if g.Networks != nil {
		groups = g.Networks.Filter(v, groups)
	}
	return groups
}

// collectGroups groups the endpoints of one cluster by locality, before the
// network filter, reusing the groups in scratch.
func (g *Generator) collectGroups(scratch []LocalityGroup, svc *aggregate.Service, p sdk.Port, subset string, sources []aggregate.EndpointSource, nets NetworkFilter) []LocalityGroup {
	groups := scratch[:0]
	for _, src := range sources {
		cluster := src.Instance.Key.Cluster
		for i := range src.Set.Endpoints {
			e := &src.Set.Endpoints[i]
			if subset != "" && e.Labels[SubsetLabel] != subset {
				continue
			}
			network := e.Network
			if network == "" {
				network = src.Properties.DefaultNetwork
			}
			if network == "" && nets != nil {
				network = nets.EndpointNetwork(src.Instance.Key, src.Properties, e.Address)
			}
			j := localityIndex(groups, e.Locality)
			if j < 0 {
				j = len(groups)
				if j < cap(groups) {
					groups = groups[:j+1]
					groups[j] = LocalityGroup{Locality: e.Locality, Endpoints: groups[j].Endpoints[:0]}
				} else {
					groups = append(groups, LocalityGroup{Locality: e.Locality})
				}
			}
			groups[j].Endpoints = append(groups[j].Endpoints, LbEndpoint{
				Address: e.Address, Port: e.TargetPort(p), Weight: e.Weight, Health: e.Health,
				Network: network, Cluster: cluster, TLSMode: e.TLSMode,
			})
		}
	}
	slices.SortFunc(groups, func(a, b LocalityGroup) int {
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
func localityIndex(groups []LocalityGroup, l string) int {
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

func findPort(ports []sdk.Port, number uint32) (sdk.Port, bool) {
	for _, p := range ports {
		if p.Number == number {
			return p, true
		}
	}
	return sdk.Port{}, false
}
