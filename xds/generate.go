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
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/estuary-mesh/estuary/host/aggregate"
	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/host/pipeline"
	"github.com/estuary-mesh/estuary/host/visibility"
	"github.com/estuary-mesh/estuary/sdk"
)

// Resource is one built xDS resource, marshaled once and shared by every
// node of a view. It is immutable once built.
type Resource struct {
	Name string
	Any  *anypb.Any
	// host and built are the service a CLA was built for and the version
	// of its inputs then; equal inputs give equal output, so an unchanged
	// CLA is not rebuilt, nor is its name parsed again.
	host  string
	built pipeline.Version
	// eds marks clusters whose endpoints come by EDS.
	eds bool
	// peers is the key of the endpoint identities a cluster's TLS was
	// built from (peers.key), so an endpoint change that moves them
	// rebuilds it.
	peers   string
	any     anypb.Any // Any points here: one allocation per resource
	version [13]byte  // the version's bytes: a base-36 uint64 fits
	nver    uint8
	// delta is the resource as Delta responses carry it, made on first
	// use (under the cache's lock) and shared by every one: cache.go.
	delta *discoveryv3.Resource
}

// Version is the resource's version: a hash of its bytes. It reads the
// receiver's own bytes, so it is right for any copy of a Resource too,
// and costs no allocation.
func (r *Resource) Version() string { return unsafe.String(&r.version[0], int(r.nver)) }

// hashSeed is fixed for the process, so equal bytes always give equal
// versions. It is not state: nothing ever changes it.
var hashSeed = maphash.MakeSeed()

func newResource(name, typeURL string, body []byte) *Resource {
	r := &Resource{Name: name}
	r.nver = uint8(len(strconv.AppendUint(r.version[:0], maphash.Bytes(hashSeed, body), 36)))
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

// Generator builds resources from the aggregate registry, and CLAs from
// the endpoint pipeline.
type Generator struct {
	agg *aggregate.Registry
	eds *pipeline.Pipeline
	enc claEncoder
	// mtls is the mesh's workload mTLS; common caches the TLS contexts
	// built for it.
	mtls   MTLS
	common commonCache
	// vis decides which namespaces see which services (exportTo).
	vis visibility.Rules
	// scratch holds *pipeline.Scratch for reuse between CLA builds: the
	// encoder copies everything out, so the pipeline's groups and their
	// endpoint slices keep their capacity for the next build.
	scratch sync.Pool
}

// NewGenerator returns a generator over agg whose CLAs come from eds; a
// nil eds is the pipeline of a mesh of one network.
func NewGenerator(agg *aggregate.Registry, eds *pipeline.Pipeline) *Generator {
	if eds == nil {
		eds = pipeline.New(agg, nil, nil)
	}
	return &Generator{agg: agg, eds: eds}
}

// Subsets lists the distinct SubsetLabel values of a service's endpoints.
func (g *Generator) Subsets(host string) []string {
	var out []string
	for _, src := range g.agg.EndpointSources(host) {
		for i := range src.Set.Endpoints {
			if v := src.Set.Endpoints[i].Labels[model.SubsetLabel]; v != "" && !slices.Contains(out, v) {
				out = append(out, v)
			}
		}
	}
	slices.Sort(out)
	return out
}

// Clusters builds the CDS resources of one service for a view.
func (g *Generator) Clusters(v model.View, svc *aggregate.Service) []*Resource {
	if v.Kind == model.KindRouter {
		return g.gatewayClusters(svc) // east-west gateway: gateway.go
	}
	var out []*Resource
	subsets := g.Subsets(svc.Hostname)
	tls := g.decideTLS(v.Kind, svc)
	var peers peers
	if g.needsPeers(svc) {
		peers = g.peersOf(svc)
	}
	common := g.tlsCommon(tls, &peers)
	for _, p := range svc.Ports {
		switch svc.Resolution {
		case sdk.ResolutionStatic:
			for _, subset := range append([]string{""}, subsets...) {
				name := model.ClusterName(p.Number, subset, svc.Hostname)
				sni := model.SNIClusterName(p.Number, subset, svc.Hostname)
				body, err := proto.MarshalOptions{Deterministic: true}.MarshalAppend(make([]byte, 0, 256+mtlsSize(tls, common, sni)), edsCluster(name))
				if err != nil {
					panic(err) // built from valid values
				}
				body = appendMTLS(body, tls, common, sni)
				r := newResource(name, resourcev3.ClusterType, body)
				r.eds, r.peers = true, peers.key
				out = append(out, r)
			}
		case sdk.ResolutionDNS, sdk.ResolutionDNSRoundRobin:
			if c := g.dnsCluster(v, svc, p); c != nil {
				out = append(out, marshalResource(c.Name, resourcev3.ClusterType, c))
			}
		case sdk.ResolutionPassthrough:
			if v.Kind == model.KindProxyless {
				continue // gRPC has no original-destination clusters
			}
			name := model.ClusterName(p.Number, "", svc.Hostname)
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

// peersChanged reports whether the endpoint identities that the TLS of
// host's clusters depends on differ from key.
func (g *Generator) peersChanged(host, key string) bool {
	svc := g.agg.GetService(host)
	if svc == nil || !g.needsPeers(svc) {
		return false
	}
	return g.peersOf(svc).key != key
}

// dnsCluster resolves a DNS service's endpoint hostnames in the client:
// STRICT_DNS for DNS, LOGICAL_DNS for DNS_ROUND_ROBIN (and always for
// proxyless gRPC, which supports only LOGICAL_DNS, with one hostname).
func (g *Generator) dnsCluster(v model.View, svc *aggregate.Service, p sdk.Port) *clusterv3.Cluster {
	var lbs []*endpointv3.LbEndpoint
	for _, src := range g.agg.EndpointSources(svc.Hostname) {
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
	if svc.Resolution == sdk.ResolutionDNSRoundRobin || v.Kind == model.KindProxyless {
		kind = clusterv3.Cluster_LOGICAL_DNS
		lbs = lbs[:1]
	}
	name := model.ClusterName(p.Number, "", svc.Hostname)
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

// Listeners builds the proxyless API listeners of one service: one per
// port, named HOST:PORT, routing through RDS.
func (g *Generator) Listeners(v model.View, svc *aggregate.Service) []*Resource {
	if v.Kind != model.KindProxyless || !g.routable(svc) {
		return nil
	}
	router, _ := anypb.New(&routerv3.Router{})
	var out []*Resource
	for _, p := range svc.Ports {
		name := model.ListenerName(svc.Hostname, p.Number)
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
func (g *Generator) Routes(v model.View, svc *aggregate.Service) []*Resource {
	if v.Kind != model.KindProxyless || !g.routable(svc) {
		return nil
	}
	var out []*Resource
	for _, p := range svc.Ports {
		name := model.ListenerName(svc.Hostname, p.Number)
		out = append(out, marshalResource(name, resourcev3.RouteType, &routev3.RouteConfiguration{
			Name: name,
			VirtualHosts: []*routev3.VirtualHost{{
				Name:    name,
				Domains: []string{svc.Hostname, name},
				Routes: []*routev3.Route{{
					Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
					Action: &routev3.Route_Route{Route: &routev3.RouteAction{
						ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: model.ClusterName(p.Number, "", svc.Hostname)},
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

// CLA builds the ClusterLoadAssignment named name for a view, from what
// the endpoint pipeline gives the view. prev, when built from the same
// inputs, is returned as is. It returns nil when the cluster does not
// exist for the view.
func (g *Generator) CLA(v model.View, name string, prev *Resource) *Resource {
	if prev != nil && prev.built == g.eds.Version(prev.host) {
		return prev
	}
	c, ok := pipeline.ParseCluster(v.Kind, name)
	if !ok {
		return nil
	}
	in := g.eds.Version(c.Host)
	sc, _ := g.scratch.Get().(*pipeline.Scratch)
	if sc == nil {
		sc = &pipeline.Scratch{}
	}
	groups, err := g.eds.Build(sc, v, c, nil)
	var r *Resource
	if err == nil { // else the cluster is gone, or never was
		r = newResource(name, resourcev3.EndpointType, g.enc.encode(name, groups))
		r.host, r.built = c.Host, in
	}
	g.scratch.Put(sc) // the groups were copied out by the encoder
	return r
}
