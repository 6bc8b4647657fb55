package xds

import (
	"strings"
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/sdk"
)

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
	epAdditionalAddresses = 4 // Endpoint.additional_addresses
	addlAddress           = 1 // Endpoint.AdditionalAddress.address
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

// endpointMetadata is the metadata Istio attaches to an endpoint.
func endpointMetadata(network, cluster string, tls sdk.TLSMode) *corev3.Metadata {
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

// claEncoder turns locality groups into ClusterLoadAssignment bytes with
// protowire: no intermediate envoy objects, metadata spliced in from its
// cache, deterministic output. A Generator owns one.
type claEncoder struct {
	// meta holds each distinct endpoint metadata marshaled once, so that
	// no endpoint pays for structpb. It grows with networks × clusters.
	mu   sync.RWMutex
	meta map[metaKey][]byte
	// bufs holds *encodeBuf, reused between calls.
	bufs sync.Pool
}

// encodeBuf is one encoding's working memory.
type encodeBuf struct {
	grp []byte // the LbEndpoints of one group
}

func (c *claEncoder) metadataBytes(k metaKey) []byte {
	c.mu.RLock()
	b, ok := c.meta[k]
	c.mu.RUnlock()
	if ok {
		return b
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(endpointMetadata(k.network, k.cluster, k.tls))
	if err != nil {
		panic(err) // a Metadata of strings always marshals
	}
	c.mu.Lock()
	if c.meta == nil {
		c.meta = map[metaKey][]byte{}
	}
	c.meta[k] = b
	c.mu.Unlock()
	return b
}

// encode encodes a ClusterLoadAssignment for cluster.
func (c *claEncoder) encode(cluster string, groups []model.LocalityGroup) []byte {
	e, _ := c.bufs.Get().(*encodeBuf)
	if e == nil {
		e = &encodeBuf{}
	}
	defer c.bufs.Put(e)
	out := make([]byte, 0, 64+len(cluster)+estimateSize(groups))
	out = protowire.AppendTag(out, claClusterName, protowire.BytesType)
	out = protowire.AppendString(out, cluster)
	for i := range groups {
		out = c.appendGroup(e, out, &groups[i])
	}
	return out
}

func estimateSize(groups []model.LocalityGroup) int {
	n := 0
	for i := range groups {
		n += 40 + 120*len(groups[i].Endpoints)
	}
	return n
}

func (c *claEncoder) appendGroup(e *encodeBuf, out []byte, g *model.LocalityGroup) []byte {
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
			lastKey, lastMeta = k, c.metadataBytes(k)
		}
		e.grp = protowire.AppendTag(e.grp, lleLbEndpoints, protowire.BytesType)
		e.grp = appendLbEndpoint(e.grp, ep, w, lastMeta)
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

// socketAddressSize is the size of an Address holding a SocketAddress.
func socketAddressSize(addr string, port uint32) (addrSize, saSize int) {
	saSize = stringFieldSize(saAddress, addr) + 1 + protowire.SizeVarint(uint64(port))
	return 1 + protowire.SizeBytes(saSize), saSize
}

// appendSocketAddress appends an Address's fields (not its length).
func appendSocketAddress(out []byte, addr string, port uint32, saSize int) []byte {
	out = protowire.AppendTag(out, addrSocketAddress, protowire.BytesType)
	out = protowire.AppendVarint(out, uint64(saSize))
	out = appendStringField(out, saAddress, addr)
	out = protowire.AppendTag(out, saPortValue, protowire.VarintType)
	return protowire.AppendVarint(out, uint64(port))
}

// appendLbEndpoint appends a length-prefixed LbEndpoint. A dual-stack
// endpoint's other addresses go into Endpoint.additional_addresses, on the
// same port: Envoy counts the endpoint once and connects to whichever
// address family works (happy eyeballs).
func appendLbEndpoint(out []byte, ep *model.LbEndpoint, weight uint32, meta []byte) []byte {
	addrSize, saSize := socketAddressSize(ep.Address, ep.Port)
	endpointSize := 1 + protowire.SizeBytes(addrSize)
	for _, a := range ep.AdditionalAddresses {
		n, _ := socketAddressSize(a, ep.Port)
		endpointSize += 1 + protowire.SizeBytes(1+protowire.SizeBytes(n))
	}
	wSize := 1 + protowire.SizeVarint(uint64(weight))
	size := 1 + protowire.SizeBytes(endpointSize) + 2 + 1 + protowire.SizeBytes(len(meta)) + 1 + protowire.SizeBytes(wSize)
	out = protowire.AppendVarint(out, uint64(size))
	out = protowire.AppendTag(out, lbeEndpoint, protowire.BytesType)
	out = protowire.AppendVarint(out, uint64(endpointSize))
	out = protowire.AppendTag(out, epAddress, protowire.BytesType)
	out = protowire.AppendVarint(out, uint64(addrSize))
	out = appendSocketAddress(out, ep.Address, ep.Port, saSize)
	for _, a := range ep.AdditionalAddresses {
		n, sa := socketAddressSize(a, ep.Port)
		out = protowire.AppendTag(out, epAdditionalAddresses, protowire.BytesType)
		out = protowire.AppendVarint(out, uint64(1+protowire.SizeBytes(n)))
		out = protowire.AppendTag(out, addlAddress, protowire.BytesType)
		out = protowire.AppendVarint(out, uint64(n))
		out = appendSocketAddress(out, a, ep.Port, sa)
	}
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
