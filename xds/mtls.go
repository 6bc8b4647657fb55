package xds

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rawbufferv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/raw_buffer/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/estuary-mesh/estuary/host/aggregate"
	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/sdk"
)

// MTLSMode is the mesh-wide mode of workload mTLS: what the clusters a
// client receives do about TLS towards the endpoints of a service.
type MTLSMode uint8

const (
	// MTLSPermissive is Istio's auto mTLS, and the default: endpoints
	// whose workload speaks Istio mTLS (tlsMode: istio) are reached over
	// mTLS, the others in plain text.
	MTLSPermissive MTLSMode = iota
	// MTLSStrict reaches every endpoint over mTLS.
	MTLSStrict
	// MTLSDisable reaches every endpoint in plain text.
	MTLSDisable
)

var mtlsModeNames = [...]string{MTLSPermissive: "PERMISSIVE", MTLSStrict: "STRICT", MTLSDisable: "DISABLE"}

func (m MTLSMode) String() string {
	if int(m) < len(mtlsModeNames) {
		return mtlsModeNames[m]
	}
	return fmt.Sprintf("MTLSMode(%d)", m)
}

// ParseMTLSMode reads a mode as plugins.hcl spells it.
func ParseMTLSMode(s string) (MTLSMode, error) {
	for i, n := range mtlsModeNames {
		if s == n {
			return MTLSMode(i), nil
		}
	}
	return 0, fmt.Errorf("mtls mode %q is not one of %s", s, strings.Join(mtlsModeNames[:], ", "))
}

// MTLS is the workload mTLS settings of the mesh.
type MTLS struct {
	Mode MTLSMode
	// TrustDomain completes a bare service account name into a SPIFFE ID;
	// "cluster.local" when empty.
	TrustDomain string
}

// DefaultTrustDomain is Istio's default trust domain.
const DefaultTrustDomain = "cluster.local"

// Names shared with the workload's agent, as Istio sets them: the SDS
// secrets of the workload certificate and of the root, the cluster of the
// istio-agent's SDS socket in an Envoy bootstrap, and the certificate
// provider instance of a proxyless gRPC bootstrap (gRFC A29).
const (
	sdsDefaultSecret      = "default"
	sdsRootSecret         = "ROOTCA"
	sdsClusterName        = "sds-grpc"
	certProviderInstance  = "default"
	transportSocketTLS    = "envoy.transport_sockets.tls"
	transportSocketRaw    = "envoy.transport_sockets.raw_buffer"
	tlsModeMatchName      = "tlsMode-istio"
	plaintextMatchName    = "tlsMode-disabled"
	upstreamTLSContextURL = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
)

// alpnInMesh is what Istio's sidecars offer to an in-mesh peer: metadata
// exchange, then "istio", which the peer's inbound listener and the
// east-west gateway's filter chains match on.
var alpnInMesh = []string{"istio-peer-exchange", "istio"}

// peers is what the TLS of a service's clusters depends on beyond the
// mode and SNI: the SPIFFE IDs of its endpoints in Istio mTLS.
type peers struct {
	sans []string
	key  string // sans joined: what the cache and the contexts are keyed by
}

// peersOf reads a service's endpoints; the result is the same for every
// view, as subset clusters share their service's identities (as Istio's
// do).
func (g *Generator) peersOf(svc *aggregate.Service) peers {
	var p peers
	for _, src := range g.agg.EndpointSources(svc.Hostname) {
		for i := range src.Set.Endpoints {
			e := &src.Set.Endpoints[i]
			if e.TLSMode != sdk.TLSModeIstio || e.ServiceAccount == "" {
				continue
			}
			id := g.spiffeID(svc.Namespace, e.ServiceAccount)
			if !slices.Contains(p.sans, id) {
				p.sans = append(p.sans, id)
			}
		}
	}
	// A ServiceEntry's subjectAltNames are identities too, as Istio
	// adds them to the service's accounts.
	for _, id := range svc.SubjectAltNames {
		if !slices.Contains(p.sans, id) {
			p.sans = append(p.sans, id)
		}
	}
	slices.Sort(p.sans)
	p.key = strings.Join(p.sans, ",")
	return p
}

// spiffeID is an endpoint's identity: its service account when it is a
// SPIFFE ID already (Kubernetes), else a bare account name in the
// service's namespace (a WorkloadEntry, a static endpoint).
func (g *Generator) spiffeID(namespace, account string) string {
	if strings.HasPrefix(account, "spiffe://") {
		return account
	}
	td := g.mtls.TrustDomain
	if td == "" {
		td = DefaultTrustDomain
	}
	return model.Identity{TrustDomain: td, Namespace: namespace, ServiceAccount: account}.String()
}

// The parts of Istio's transport socket matches that never change,
// marshaled once: the match on tlsMode: istio, and the plain-text match
// of every other endpoint.
var (
	tlsModeIstioMatchBytes = mustMarshal(&structpb.Struct{Fields: map[string]*structpb.Value{"tlsMode": structpb.NewStringValue("istio")}})
	plaintextMatchBytes    = mustMarshal(&clusterv3.Cluster_TransportSocketMatch{
		Name:  plaintextMatchName,
		Match: &structpb.Struct{},
		TransportSocket: &corev3.TransportSocket{
			Name:       transportSocketRaw,
			ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: mustAny(&rawbufferv3.RawBuffer{})},
		},
	})
)

func mustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic(err)
	}
	return a
}

func mustMarshal(m proto.Message) []byte {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

// tlsCarry is what a service's clusters carry for TLS.
type tlsCarry uint8

const (
	carryNone   tlsCarry = iota
	carryAuto            // transport_socket_matches on tlsMode (Envoy only)
	carryMutual          // Istio mTLS for every endpoint
)

var carryNames = [...]string{carryNone: model.ClusterTLSNone, carryAuto: model.ClusterTLSAuto, carryMutual: model.ClusterTLSMutual}

// tlsCause is why the mode that applies to a service is what it is, or
// why its clusters carry no TLS whatever the mode.
type tlsCause uint8

const (
	causeMesh         tlsCause = iota // the mesh's mode
	causeOverride                     // the service's own mode
	causeMeshExternal                 // mesh-external: no auto mTLS, as Istio
	causeGateway                      // an east-west gateway passes TLS through
	causeDNS                          // DNS clusters carry no TLS
	causePassthrough                  // original-destination clusters carry no TLS
)

// tlsDecision is what the clusters of one service carry for TLS in one
// view, and why. Clusters builds them from it and ClusterTLS explains it:
// one decision, so explain cannot drift from CDS.
type tlsDecision struct {
	kind  model.Kind
	carry tlsCarry
	mode  MTLSMode
	cause tlsCause
}

// serviceMode is the mode that applies to a static service: its own when
// its registry set one (Istio: a DestinationRule's tls mode), else none
// for a mesh-external service (Istio never applies auto mTLS to one),
// else the mesh's.
func (g *Generator) serviceMode(svc *aggregate.Service) (MTLSMode, tlsCause) {
	switch svc.MTLSMode {
	case sdk.MTLSModeStrict:
		return MTLSStrict, causeOverride
	case sdk.MTLSModePermissive:
		return MTLSPermissive, causeOverride
	case sdk.MTLSModeDisable:
		return MTLSDisable, causeOverride
	}
	if svc.MeshExternal {
		return MTLSDisable, causeMeshExternal
	}
	return g.mtls.Mode, causeMesh
}

// decideTLS is the TLS decision of svc's clusters for a view of kind k.
func (g *Generator) decideTLS(k model.Kind, svc *aggregate.Service) tlsDecision {
	d := tlsDecision{kind: k, mode: g.mtls.Mode}
	switch {
	case k == model.KindRouter:
		d.cause = causeGateway
		return d
	case svc.Resolution == sdk.ResolutionDNS || svc.Resolution == sdk.ResolutionDNSRoundRobin:
		d.cause = causeDNS
		return d
	case svc.Resolution == sdk.ResolutionPassthrough:
		d.cause = causePassthrough
		return d
	}
	d.mode, d.cause = g.serviceMode(svc)
	switch d.mode {
	case MTLSStrict:
		d.carry = carryMutual
	case MTLSPermissive:
		// gRPC has no transport_socket_matches (it NACKs them): a cluster
		// is TLS or not. And grpc-go NACKs a cluster that names a
		// certificate provider its bootstrap lacks, whether or not it
		// uses xDS credentials: so, as istiod, proxyless gRPC gets mTLS
		// only when asked for (STRICT), never by default.
		if k == model.KindEnvoy {
			d.carry = carryAuto
		}
	}
	return d
}

// needsPeers reports whether svc's clusters may carry TLS in some view,
// so that the SANs of its endpoints matter to them.
func (g *Generator) needsPeers(svc *aggregate.Service) bool {
	if svc.Resolution != sdk.ResolutionStatic {
		return false
	}
	m, _ := g.serviceMode(svc)
	return m != MTLSDisable
}

// explain turns the decision into what explain and proxy-config print.
func (d tlsDecision) explain(svc *aggregate.Service, mesh MTLSMode) model.ClusterTLS {
	out := model.ClusterTLS{TLS: carryNames[d.carry], MeshMode: mesh.String(), Mode: d.mode.String()}
	if svc.MTLSMode != sdk.MTLSModeUnset {
		out.Override = svc.MTLSMode.String()
		out.OverrideSource = svc.Instances[0].String()
		if svc.MTLSModeSource != "" {
			out.OverrideSource += ", " + svc.MTLSModeSource
		}
	}
	var why string
	switch d.cause {
	case causeGateway:
		out.Mode = ""
		out.Reason = "east-west gateway: SNI passthrough, the client's mTLS goes through untouched (the SNI is the filter chain's)"
		return out
	case causeDNS:
		out.Mode = ""
		out.Reason = "DNS-resolved service: Estuary's DNS clusters carry no TLS"
		return out
	case causePassthrough:
		out.Mode = ""
		out.Reason = "passthrough (original destination) cluster: no TLS, as Istio"
		return out
	case causeMesh:
		why = "mesh mode " + mesh.String()
	case causeOverride:
		why = "service override " + out.Override + " (from " + out.OverrideSource + ") over mesh mode " + mesh.String()
	case causeMeshExternal:
		why = "mesh-external service: no auto mTLS, as Istio (mesh mode " + mesh.String() + " does not apply; a service override would)"
	}
	switch d.carry {
	case carryMutual:
		out.Reason = why + ": every endpoint over Istio mTLS, whatever its tlsMode"
	case carryAuto:
		out.Reason = why + ": transport_socket_matches, endpoints whose tlsMode is istio over Istio mTLS (match tlsMode-istio), the rest plain text (tlsMode-disabled)"
	default:
		if d.mode == MTLSPermissive && d.kind == model.KindProxyless {
			out.Reason = why + ": plain text, as from istiod: proxyless gRPC has no transport_socket_matches, so it gets mTLS only in STRICT"
		} else {
			out.Reason = why + ": plain text"
		}
	}
	return out
}

// ClusterTLS explains the TLS of the cluster named name in view v, from
// the decision its cluster is built from; false when no such cluster.
func (g *Generator) ClusterTLS(v model.View, name string) (model.ClusterTLS, bool) {
	port, subset, host, ok := parseAnyClusterName(name)
	if !ok {
		return model.ClusterTLS{}, false
	}
	svc := g.agg.GetService(host)
	if svc == nil {
		return model.ClusterTLS{}, false
	}
	d := g.decideTLS(v.Kind, svc)
	out := d.explain(svc, g.mtls.Mode)
	out.Cluster = name
	switch {
	case d.cause == causeGateway:
		out.SNI = model.SNIClusterName(port, subset, host)
	case d.carry != carryNone:
		out.SNI = model.SNIClusterName(port, subset, host)
		out.SANs = g.peersOf(svc).sans
	}
	return out, true
}

// tlsCommon is the marshaled CommonTlsContext of a service's clusters
// under decision d, the same for all of them; nil when they carry no TLS.
func (g *Generator) tlsCommon(d tlsDecision, p *peers) []byte {
	switch {
	case d.carry == carryNone:
		return nil
	case d.kind == model.KindProxyless:
		return g.grpcContext(p)
	}
	return g.envoyContext(p)
}

// appendMTLS appends to a marshaled cluster whose SNI is sni what it
// carries for mTLS by decision d (see README "Workload mTLS"), as Cluster
// fields, around common, the context tlsCommon gave. The contexts are
// marshaled once per identity set and spliced per SNI, with sizes
// computed ahead, so TLS costs little more than its bytes.
func appendMTLS(b []byte, d tlsDecision, common []byte, sni string) []byte {
	switch d.carry {
	case carryNone:
		return b
	case carryMutual:
		b = protowire.AppendTag(b, clusterTransportSocket, protowire.BytesType)
		return appendTLSSocket(b, common, sni)
	}
	b = protowire.AppendTag(b, clusterTransportSocketMatches, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(tlsMatchSize(common, sni)))
	b = appendStringField(b, tsmName, tlsModeMatchName)
	b = appendBytesField(b, tsmMatch, tlsModeIstioMatchBytes)
	b = protowire.AppendTag(b, tsmTransportSocket, protowire.BytesType)
	b = appendTLSSocket(b, common, sni)
	return appendBytesField(b, clusterTransportSocketMatches, plaintextMatchBytes)
}

// tlsMatchSize is the size of the tlsMode-istio TransportSocketMatch.
func tlsMatchSize(common []byte, sni string) int {
	return 1 + protowire.SizeBytes(len(tlsModeMatchName)) + 1 + protowire.SizeBytes(len(tlsModeIstioMatchBytes)) +
		1 + protowire.SizeBytes(tlsSocketSize(common, sni))
}

// mtlsSize is what appendMTLS adds, so the cluster is marshaled into a
// buffer that has room for it exactly.
func mtlsSize(d tlsDecision, common []byte, sni string) int {
	switch d.carry {
	case carryMutual:
		return protowire.SizeTag(clusterTransportSocket) + protowire.SizeBytes(tlsSocketSize(common, sni))
	case carryAuto:
		return protowire.SizeTag(clusterTransportSocketMatches) + protowire.SizeBytes(tlsMatchSize(common, sni)) +
			protowire.SizeTag(clusterTransportSocketMatches) + protowire.SizeBytes(len(plaintextMatchBytes))
	}
	return 0
}

// Field numbers of the messages mtlsSuffix splices;
// TestTLSSocketMatchesEnvoyTypes holds them against the generated types.
const (
	clusterTransportSocket        = 24 // Cluster.transport_socket
	clusterTransportSocketMatches = 43 // Cluster.transport_socket_matches
	tsmName                       = 1  // TransportSocketMatch.name
	tsmMatch                      = 2  // TransportSocketMatch.match
	tsmTransportSocket            = 3  // TransportSocketMatch.transport_socket
	tsName                        = 1  // TransportSocket.name
	tsTypedConfig                 = 3  // TransportSocket.typed_config
	anyTypeURL                    = 1  // Any.type_url
	anyValue                      = 2  // Any.value
)

func appendBytesField(b []byte, num protowire.Number, v []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

// tlsSocketSize is the size of a TransportSocket holding an
// UpstreamTlsContext of common and sni; appendTLSSocket appends it,
// length first.
func tlsSocketSize(common []byte, sni string) int {
	u := 1 + protowire.SizeBytes(len(common)) + 1 + protowire.SizeBytes(len(sni))
	a := 1 + protowire.SizeBytes(len(upstreamTLSContextURL)) + 1 + protowire.SizeBytes(u)
	return 1 + protowire.SizeBytes(len(transportSocketTLS)) + 1 + protowire.SizeBytes(a)
}

func appendTLSSocket(b, common []byte, sni string) []byte {
	u := 1 + protowire.SizeBytes(len(common)) + 1 + protowire.SizeBytes(len(sni))
	a := 1 + protowire.SizeBytes(len(upstreamTLSContextURL)) + 1 + protowire.SizeBytes(u)
	b = protowire.AppendVarint(b, uint64(tlsSocketSize(common, sni)))
	b = appendStringField(b, tsName, transportSocketTLS)
	b = protowire.AppendTag(b, tsTypedConfig, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(a))
	b = appendStringField(b, anyTypeURL, upstreamTLSContextURL)
	b = protowire.AppendTag(b, anyValue, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(u))
	b = appendBytesField(b, upstreamCommonTLSContext, common)
	return protowire.AppendString(protowire.AppendTag(b, upstreamSNI, protowire.BytesType), sni)
}

// Field numbers of UpstreamTlsContext; TestTLSSocketMatchesEnvoyTypes
// holds them against the generated type.
const (
	upstreamCommonTLSContext = 1
	upstreamSNI              = 2
)

// commonCache holds marshaled CommonTlsContexts by view kind and
// identity set. It grows with the distinct identity sets of the mesh.
type commonCache struct {
	mu sync.RWMutex
	m  map[commonKey][]byte
}

type commonKey struct {
	kind model.Kind
	sans string
}

func (c *commonCache) get(k commonKey, build func() *tlsv3.CommonTlsContext) []byte {
	c.mu.RLock()
	b, ok := c.m[k]
	c.mu.RUnlock()
	if ok {
		return b
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(build())
	if err != nil {
		panic(err) // built from strings
	}
	c.mu.Lock()
	if c.m == nil {
		c.m = map[commonKey][]byte{}
	}
	c.m[k] = b
	c.mu.Unlock()
	return b
}

func sanMatchers(sans []string) []*matcherv3.StringMatcher {
	out := make([]*matcherv3.StringMatcher, len(sans))
	for i, s := range sans {
		out[i] = &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: s}}
	}
	return out
}

// envoyContext is Istio's ISTIO_MUTUAL context: certificate and root from
// the workload agent's SDS, peers checked against the service's
// identities, Istio's ALPN.
func (g *Generator) envoyContext(p *peers) []byte {
	sans := p.sans
	return g.common.get(commonKey{model.KindEnvoy, p.key}, func() *tlsv3.CommonTlsContext {
		return &tlsv3.CommonTlsContext{
			TlsParams: &tlsv3.TlsParameters{
				TlsMinimumProtocolVersion: tlsv3.TlsParameters_TLSv1_2,
				TlsMaximumProtocolVersion: tlsv3.TlsParameters_TLSv1_3,
			},
			AlpnProtocols:                  alpnInMesh,
			TlsCertificateSdsSecretConfigs: []*tlsv3.SdsSecretConfig{sdsSecret(sdsDefaultSecret)},
			ValidationContextType: &tlsv3.CommonTlsContext_CombinedValidationContext{
				CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
					DefaultValidationContext:         &tlsv3.CertificateValidationContext{MatchSubjectAltNames: sanMatchers(sans)},
					ValidationContextSdsSecretConfig: sdsSecret(sdsRootSecret),
				},
			},
		}
	})
}

// sdsSecret names a secret of the istio-agent's SDS server, reached through
// the sds-grpc cluster of its bootstrap (a unix socket), as Istio does.
func sdsSecret(name string) *tlsv3.SdsSecretConfig {
	return &tlsv3.SdsSecretConfig{
		Name: name,
		SdsConfig: &corev3.ConfigSource{
			ConfigSourceSpecifier: &corev3.ConfigSource_ApiConfigSource{ApiConfigSource: &corev3.ApiConfigSource{
				ApiType:                   corev3.ApiConfigSource_GRPC,
				TransportApiVersion:       corev3.ApiVersion_V3,
				SetNodeOnFirstMessageOnly: true,
				GrpcServices: []*corev3.GrpcService{{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{
					EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: sdsClusterName},
				}}},
			}},
			InitialFetchTimeout: durationpb.New(0),
			ResourceApiVersion:  corev3.ApiVersion_V3,
		},
	}
}

// grpcContext is what proxyless gRPC accepts (gRFC A29): identity and
// root from the certificate provider instance "default" of its
// bootstrap, no tls_params (gRPC NACKs them), no ALPN (gRPC ignores it).
func (g *Generator) grpcContext(p *peers) []byte {
	sans := p.sans
	return g.common.get(commonKey{model.KindProxyless, p.key}, func() *tlsv3.CommonTlsContext {
		return &tlsv3.CommonTlsContext{
			TlsCertificateProviderInstance: &tlsv3.CertificateProviderPluginInstance{InstanceName: certProviderInstance, CertificateName: sdsDefaultSecret},
			// A plain validation context: a combined one requires an SDS
			// secret, which gRPC has not.
			ValidationContextType: &tlsv3.CommonTlsContext_ValidationContext{
				ValidationContext: &tlsv3.CertificateValidationContext{
					CaCertificateProviderInstance: &tlsv3.CertificateProviderPluginInstance{InstanceName: certProviderInstance, CertificateName: sdsRootSecret},
					MatchSubjectAltNames:          sanMatchers(sans),
				},
			},
		}
	})
}
