package xds

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/estuary-mesh/estuary/sdk"
)

// LbEndpoint is one endpoint of a ClusterLoadAssignment before encoding.
type LbEndpoint struct {
	Address string
	Port    uint32
	// Weight is the load-balancing weight; 0 is sent as 1.
	Weight  uint32
	Health  sdk.Health
	Network string
	Cluster string
	TLSMode sdk.TLSMode
}

// LocalityGroup is the endpoints of one locality.
type LocalityGroup struct {
	Locality string // "region/zone/subzone"
	// Weight of the locality; 0 means the sum of its endpoints' weights.
	Weight    uint32
	Priority  uint32
	Endpoints []LbEndpoint
}

// Field numbers of the envoy messages a ClusterLoadAssignment is made of
// (envoy/config/endpoint/v3, envoy/config/core/v3, google/protobuf
// wrappers). TestEncodeCLAMatchesEnvoyTypes holds them against the
// generated types.
const (
	claClusterName        = 1 // ClusterLoadAssignment.cluster_name
	claEndpoints          = 2 // ClusterLoadAssignment.endpoints
	lleLocality           = 1 // LocalityLbEndpoints.locality
	lleLbEndpoints        = 2 // LocalityLbEndpoints.lb_endpoints
	lleWeight             = 3 // LocalityLbEndpoints.load_balancing_weight
	llePriority           = 5 // LocalityLbEndpoints.priority
	locRegion             = 1 // Locality.region
	locZone               = 2 // Locality.zone
	locSubZone            = 3 // Locality.sub_zone
	lbeEndpoint           = 1 // LbEndpoint.endpoint
	lbeHealthStatus       = 2 // LbEndpoint.health_status
	lbeMetadata           = 3 // LbEndpoint.metadata
	lbeWeight             = 4 // LbEndpoint.load_balancing_weight
	epAddress             = 1 // Endpoint.address
	addrSocketAddress     = 1 // Address.socket_address
	saAddress             = 2 // SocketAddress.address
	saPortValue           = 3 // SocketAddress.port_value
	uint32ValueValue      = 1 // UInt32Value.value
	healthStatusHealthy   = 1 // core.HealthStatus HEALTHY
	healthStatusUnhealthy = 2 // core.HealthStatus UNHEALTHY
	healthStatusDraining  = 3 // core.HealthStatus DRAINING
)

// metaKey identifies the metadata of an endpoint: Istio puts the network
// and cluster under "istio" and the TLS mode under
// "envoy.transport_socket_match".
type metaKey struct {
	network, cluster string
	tls              sdk.TLSMode
}

// metadataCache holds each distinct endpoint metadata marshaled once, so
// that no endpoint pays for structpb. It grows with networks × clusters.
var metadataCache = struct {
	sync.RWMutex
	m map[metaKey][]byte
}{m: map[metaKey][]byte{}}

func metadataBytes(k metaKey) []byte {
	metadataCache.RLock()
	b, ok := metadataCache.m[k]
	metadataCache.RUnlock()
	if ok {
		return b
	}
	md := EndpointMetadata(k.network, k.cluster, k.tls)
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(md)
	if err != nil {
		panic(err) // a Metadata of strings always marshals
	}
	metadataCache.Lock()
	metadataCache.m[k] = b
	metadataCache.Unlock()
	return b
}

// EndpointMetadata is the metadata Istio attaches to an endpoint.
func EndpointMetadata(network, cluster string, tls sdk.TLSMode) *corev3.Metadata {
	istio := map[string]any{}
	if network != "" {
		istio["network"] = network
	}
	if cluster != "" {
		istio["cluster"] = cluster
	}
	md := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{}}
	if len(istio) > 0 {
		s, _ := structpb.NewStruct(istio)
		md.FilterMetadata["istio"] = s
	}
	if tls == sdk.TLSModeIstio {
		s, _ := structpb.NewStruct(map[string]any{"tlsMode": "istio"})
		md.FilterMetadata["envoy.transport_socket_match"] = s
	}
	return md
}

// encoder turns locality groups into ClusterLoadAssignment bytes with
// protowire: no intermediate envoy objects, metadata spliced in from the
// cache, deterministic output. Its buffers are reused between calls.
type encoder struct {
	grp []byte // the LbEndpoints of one group
}

var encoderPool = sync.Pool{New: func() any { return &encoder{} }}

// EncodeCLA encodes a ClusterLoadAssignment for cluster.
func EncodeCLA(cluster string, groups []LocalityGroup) []byte {
	e := encoderPool.Get().(*encoder)
	defer encoderPool.Put(e)
	out := make([]byte, 0, 64+len(cluster)+estimateSize(groups))
	out = protowire.AppendTag(out, claClusterName, protowire.BytesType)
	out = protowire.AppendString(out, cluster)
	for i := range groups {
		out = e.appendGroup(out, &groups[i])
	}
	return out
}

func estimateSize(groups []LocalityGroup) int {
	n := 0
	for i := range groups {
		n += 40 + 120*len(groups[i].Endpoints)
	}
	return n
}

func (e *encoder) appendGroup(out []byte, g *LocalityGroup) []byte {
	e.grp = e.grp[:0]
	var sum uint64
	var lastKey metaKey
	var lastMeta []byte
	for i := range g.Endpoints {
		ep := &g.Endpoints[i]
		w := ep.Weight
		if w == 0 {
			w = 1
		}
		sum += uint64(w)
		k := metaKey{ep.Network, ep.Cluster, ep.TLSMode}
		if lastMeta == nil || k != lastKey {
			lastKey, lastMeta = k, metadataBytes(k)
		}
		e.grp = protowire.AppendTag(e.grp, lleLbEndpoints, protowire.BytesType)
		e.grp = e.appendLbEndpoint(e.grp, ep, w, lastMeta)
	}
	weight := uint64(g.Weight)
	if weight == 0 {
		weight = min(sum, 1<<32-1)
	}
	if weight == 0 {
		weight = 1
	}
	region, zone, subzone := splitLocality(g.Locality)
	locSize := stringFieldSize(locRegion, region) + stringFieldSize(locZone, zone) + stringFieldSize(locSubZone, subzone)
	wSize := 1 + protowire.SizeVarint(weight)
	size := 1 + protowire.SizeBytes(locSize) + len(e.grp) + 1 + protowire.SizeBytes(wSize)
	if g.Priority != 0 {
		size += 1 + protowire.SizeVarint(uint64(g.Priority))
	}
	out = protowire.AppendTag(out, claEndpoints, protowire.BytesType)
	out = protowire.AppendVarint(out, uint64(size))
	out = protowire.AppendTag(out, lleLocality, protowire.BytesType)
	out = protowire.AppendVarint(out, uint64(locSize))
	out = appendStringField(out, locRegion, region)
	out = appendStringField(out, locZone, zone)
	out = appendStringField(out, locSubZone, subzone)
	out = append(out, e.grp...)
	out = protowire.AppendTag(out, lleWeight, protowire.BytesType)
	out = protowire.AppendVarint(out, uint64(wSize))
	out = protowire.AppendTag(out, uint32ValueValue, protowire.VarintType)
	out = protowire.AppendVarint(out, weight)
	if g.Priority != 0 {
		out = protowire.AppendTag(out, llePriority, protowire.VarintType)
		out = protowire.AppendVarint(out, uint64(g.Priority))
	}
	return out
}

// appendLbEndpoint appends a length-prefixed LbEndpoint.
func (e *encoder) appendLbEndpoint(out []byte, ep *LbEndpoint, weight uint32, meta []byte) []byte {
	saSize := stringFieldSize(saAddress, ep.Address) + 1 + protowire.SizeVarint(uint64(ep.Port))
	addrSize := 1 + protowire.SizeBytes(saSize)
	endpointSize := 1 + protowire.SizeBytes(addrSize)
	wSize := 1 + protowire.SizeVarint(uint64(weight))
	size := 1 + protowire.SizeBytes(endpointSize) + 2 + 1 + protowire.SizeBytes(len(meta)) + 1 + protowire.SizeBytes(wSize)
	out = protowire.AppendVarint(out, uint64(size))
	out = protowire.AppendTag(out, lbeEndpoint, protowire.BytesType)
	out = protowire.AppendVarint(out, uint64(endpointSize))
	out = protowire.AppendTag(out, epAddress, protowire.BytesType)
	out = protowire.AppendVarint(out, uint64(addrSize))
	out = protowire.AppendTag(out, addrSocketAddress, protowire.BytesType)
	out = protowire.AppendVarint(out, uint64(saSize))
	out = appendStringField(out, saAddress, ep.Address)
	out = protowire.AppendTag(out, saPortValue, protowire.VarintType)
	out = protowire.AppendVarint(out, uint64(ep.Port))
	out = protowire.AppendTag(out, lbeHealthStatus, protowire.VarintType)
	out = protowire.AppendVarint(out, healthStatus(ep.Health))
	out = protowire.AppendTag(out, lbeMetadata, protowire.BytesType)
	out = protowire.AppendBytes(out, meta)
	out = protowire.AppendTag(out, lbeWeight, protowire.BytesType)
	out = protowire.AppendVarint(out, uint64(wSize))
	out = protowire.AppendTag(out, uint32ValueValue, protowire.VarintType)
	out = protowire.AppendVarint(out, uint64(weight))
	return out
}

func healthStatus(h sdk.Health) uint64 {
	switch h {
	case sdk.HealthUnhealthy:
		return healthStatusUnhealthy
	case sdk.HealthDraining:
		return healthStatusDraining
	}
	return healthStatusHealthy
}

func stringFieldSize(num protowire.Number, s string) int {
	if s == "" {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(len(s))
}

func appendStringField(out []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return out
	}
	out = protowire.AppendTag(out, num, protowire.BytesType)
	return protowire.AppendString(out, s)
}

func splitLocality(l string) (region, zone, subzone string) {
	region, rest, _ := strings.Cut(l, "/")
	zone, subzone, _ = strings.Cut(rest, "/")
	return
}

// GroupByLocality sorts endpoints into locality groups, in locality order,
// keeping the endpoints' order within a group.
func GroupByLocality(eps []LbEndpoint, localities []string) []LocalityGroup {
	idx := map[string]int{}
	var groups []LocalityGroup
	for i := range eps {
		l := localities[i]
		j, ok := idx[l]
		if !ok {
			j = len(groups)
			idx[l] = j
			groups = append(groups, LocalityGroup{Locality: l})
		}
		groups[j].Endpoints = append(groups[j].Endpoints, eps[i])
	}
	slices.SortFunc(groups, func(a, b LocalityGroup) int { return cmp.Compare(a.Locality, b.Locality) })
	return groups
}

// ClusterName is Istio's outbound cluster name: outbound|PORT|SUBSET|HOST.
func ClusterName(port uint32, subset, host string) string {
	return "outbound|" + strconv.FormatUint(uint64(port), 10) + "|" + subset + "|" + host
}

// ParseClusterName splits an outbound cluster name.
func ParseClusterName(name string) (port uint32, subset, host string, ok bool) {
	rest, found := strings.CutPrefix(name, "outbound|")
	if !found {
		return 0, "", "", false
	}
	ps, rest, found1 := strings.Cut(rest, "|")
	subset, host, found2 := strings.Cut(rest, "|")
	if !found1 || !found2 {
		return 0, "", "", false
	}
	p, err := strconv.ParseUint(ps, 10, 32)
	if err != nil {
		return 0, "", "", false
	}
	return uint32(p), subset, host, true
}
