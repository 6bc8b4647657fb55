package xds

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/estuary-mesh/estuary/host/model"
	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

const echoHost = "echo.default.svc.cluster.local"

// mtlsFixture: echo with a sidecar workload (a SPIFFE ID), a WorkloadEntry
// style one (a bare account in a subset), and one without a sidecar.
func mtlsFixture(t *testing.T) *fixture {
	f := newFixture(t)
	f.service(echoHost, 8080)
	f.endpoints(echoHost, []*registryv1.Endpoint{
		{Address: "10.0.0.1", TlsMode: registryv1.TLSMode_TLS_MODE_ISTIO, ServiceAccount: "spiffe://cluster.local/ns/default/sa/echo"},
		{Address: "10.0.0.2", TlsMode: registryv1.TLSMode_TLS_MODE_ISTIO, ServiceAccount: "legacy", Labels: map[string]string{"version": "v2"}},
		{Address: "10.0.0.3"},
	})
	return f
}

func decodeClusters(t *testing.T, rs []*Resource) map[string]*clusterv3.Cluster {
	t.Helper()
	out := map[string]*clusterv3.Cluster{}
	for _, r := range rs {
		var c clusterv3.Cluster
		if err := proto.Unmarshal(r.Any.GetValue(), &c); err != nil {
			t.Fatal(err)
		}
		if err := c.ValidateAll(); err != nil {
			t.Errorf("cluster %s fails Envoy's validation: %v", c.GetName(), err)
		}
		out[c.GetName()] = &c
	}
	return out
}

func upstreamTLS(t *testing.T, ts *corev3.TransportSocket) *tlsv3.UpstreamTlsContext {
	t.Helper()
	var u tlsv3.UpstreamTlsContext
	if err := proto.Unmarshal(ts.GetTypedConfig().GetValue(), &u); err != nil {
		t.Fatal(err)
	}
	if err := u.ValidateAll(); err != nil {
		t.Errorf("UpstreamTlsContext fails Envoy's validation: %v", err)
	}
	return &u
}

func sans(u *tlsv3.UpstreamTlsContext) []string {
	var out []string
	ms := u.GetCommonTlsContext().GetCombinedValidationContext().GetDefaultValidationContext().GetMatchSubjectAltNames()
	if v := u.GetCommonTlsContext().GetValidationContext(); v != nil {
		ms = v.GetMatchSubjectAltNames()
	}
	for _, m := range ms {
		out = append(out, m.GetExact())
	}
	return out
}

// TestEnvoyMTLSGolden: an Envoy view's clusters per mode, checked by
// Envoy's own proto validation and against testdata/mtls_envoy_MODE.json,
// which was reviewed against istiod's output for the same service (auto
// mTLS; STRICT as a DestinationRule ISTIO_MUTUAL). -update rewrites them.
func TestEnvoyMTLSGolden(t *testing.T) {
	f := mtlsFixture(t)
	for _, mode := range []MTLSMode{MTLSPermissive, MTLSStrict, MTLSDisable} {
		t.Run(mode.String(), func(t *testing.T) {
			gen := NewGenerator(f.agg, nil)
			gen.mtls = MTLS{Mode: mode}
			rs := gen.Clusters(model.View{Kind: model.KindEnvoy}, f.agg.GetService(echoHost))
			decodeClusters(t, rs) // validates
			var buf bytes.Buffer
			for _, r := range rs {
				var c clusterv3.Cluster
				_ = proto.Unmarshal(r.Any.GetValue(), &c)
				buf.Write(stableJSON(t, &c))
			}
			golden := filepath.Join("testdata", "mtls_envoy_"+strings.ToLower(mode.String())+".json")
			if *update {
				if err := os.WriteFile(golden, buf.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to write it)", err)
			}
			if !bytes.Equal(buf.Bytes(), want) {
				t.Errorf("clusters differ from %s:\n%s", golden, buf.String())
			}
		})
	}
}

// stableJSON is protojson reindented by encoding/json: protojson varies
// its whitespace on purpose, a golden file must not.
func stableJSON(t *testing.T, m proto.Message) []byte {
	b, err := protojson.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	out, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(out, '\n')
}

// TestEnvoyAutoMTLS: what each mode does to an Envoy cluster, field by
// field: the promises the golden file holds, named.
func TestEnvoyAutoMTLS(t *testing.T) {
	f := mtlsFixture(t)
	gen := NewGenerator(f.agg, nil)
	wantSANs := []string{"spiffe://cluster.local/ns/default/sa/echo", "spiffe://cluster.local/ns/default/sa/legacy"}

	cs := decodeClusters(t, gen.Clusters(model.View{Kind: model.KindEnvoy}, f.agg.GetService(echoHost)))
	for name, sni := range map[string]string{
		"outbound|8080||" + echoHost:   "outbound_.8080_._." + echoHost,
		"outbound|8080|v2|" + echoHost: "outbound_.8080_.v2_." + echoHost,
	} {
		c := cs[name]
		if c == nil {
			t.Fatalf("no cluster %s", name)
		}
		m := c.GetTransportSocketMatches()
		if c.GetTransportSocket() != nil || len(m) != 2 {
			t.Fatalf("PERMISSIVE %s: transport socket %v, %d matches; want 2 matches and no socket", name, c.GetTransportSocket(), len(m))
		}
		if got := m[0].GetMatch().GetFields()["tlsMode"].GetStringValue(); got != "istio" || m[0].GetName() != "tlsMode-istio" {
			t.Errorf("first match = %s %v, want tlsMode-istio on tlsMode: istio", m[0].GetName(), m[0].GetMatch())
		}
		if len(m[1].GetMatch().GetFields()) != 0 || m[1].GetTransportSocket().GetName() != "envoy.transport_sockets.raw_buffer" {
			t.Errorf("second match = %v, want everything else in raw_buffer", m[1])
		}
		u := upstreamTLS(t, m[0].GetTransportSocket())
		if u.GetSni() != sni {
			t.Errorf("%s SNI = %q, want %q", name, u.GetSni(), sni)
		}
		ctx := u.GetCommonTlsContext()
		if !slices.Equal(ctx.GetAlpnProtocols(), []string{"istio-peer-exchange", "istio"}) {
			t.Errorf("ALPN = %v", ctx.GetAlpnProtocols())
		}
		if got := sans(u); !slices.Equal(got, wantSANs) {
			t.Errorf("SANs = %v, want %v (the plain-text endpoint has no identity)", got, wantSANs)
		}
		if s := ctx.GetTlsCertificateSdsSecretConfigs(); len(s) != 1 || s[0].GetName() != "default" ||
			s[0].GetSdsConfig().GetApiConfigSource().GetGrpcServices()[0].GetEnvoyGrpc().GetClusterName() != "sds-grpc" {
			t.Errorf("certificate SDS = %v, want secret default from sds-grpc", s)
		}
		if r := ctx.GetCombinedValidationContext().GetValidationContextSdsSecretConfig(); r.GetName() != "ROOTCA" {
			t.Errorf("root SDS = %v, want ROOTCA", r)
		}
	}

	gen.mtls = MTLS{Mode: MTLSStrict, TrustDomain: "example.org"}
	cs = decodeClusters(t, gen.Clusters(model.View{Kind: model.KindEnvoy}, f.agg.GetService(echoHost)))
	c := cs["outbound|8080||"+echoHost]
	if len(c.GetTransportSocketMatches()) != 0 || c.GetTransportSocket() == nil {
		t.Fatalf("STRICT: %d matches, socket %v; want only a TLS socket", len(c.GetTransportSocketMatches()), c.GetTransportSocket())
	}
	if got := sans(upstreamTLS(t, c.GetTransportSocket())); !slices.Equal(got, []string{"spiffe://cluster.local/ns/default/sa/echo", "spiffe://example.org/ns/default/sa/legacy"}) {
		t.Errorf("STRICT SANs with trust domain example.org = %v", got)
	}

	gen.mtls = MTLS{Mode: MTLSDisable}
	for name, c := range decodeClusters(t, gen.Clusters(model.View{Kind: model.KindEnvoy}, f.agg.GetService(echoHost))) {
		if c.GetTransportSocket() != nil || len(c.GetTransportSocketMatches()) != 0 {
			t.Errorf("DISABLE: %s carries TLS", name)
		}
	}
}

// TestProxylessMTLS: gRPC gets one transport socket with certificate
// provider instances (it NACKs transport_socket_matches and tls_params),
// only in STRICT: grpc-go NACKs a provider its bootstrap lacks, so
// PERMISSIVE must not break clients without one.
func TestProxylessMTLS(t *testing.T) {
	f := mtlsFixture(t)
	gen := NewGenerator(f.agg, nil)
	view := model.View{Kind: model.KindProxyless}
	name := "outbound|8080||" + echoHost

	// Every endpoint in Istio mTLS: PERMISSIVE still leaves gRPC alone.
	f.endpoints(echoHost, []*registryv1.Endpoint{{Address: "10.0.0.1", TlsMode: registryv1.TLSMode_TLS_MODE_ISTIO, ServiceAccount: "spiffe://cluster.local/ns/default/sa/echo"}})
	if c := decodeClusters(t, gen.Clusters(view, f.agg.GetService(echoHost)))[name]; c.GetTransportSocket() != nil {
		t.Errorf("PERMISSIVE: gRPC cluster has TLS, which a client without certificate providers NACKs")
	}
	gen.mtls.Mode = MTLSStrict
	c := decodeClusters(t, gen.Clusters(view, f.agg.GetService(echoHost)))[name]
	if len(c.GetTransportSocketMatches()) != 0 || c.GetTransportSocket().GetName() != "envoy.transport_sockets.tls" {
		t.Fatalf("STRICT gRPC cluster: %v", c)
	}
	u := upstreamTLS(t, c.GetTransportSocket())
	ctx := u.GetCommonTlsContext()
	if ctx.GetTlsParams() != nil || len(ctx.GetTlsCertificateSdsSecretConfigs()) != 0 {
		t.Errorf("gRPC context carries what gRPC NACKs or cannot use: %v", ctx)
	}
	if p := ctx.GetTlsCertificateProviderInstance(); p.GetInstanceName() != "default" {
		t.Errorf("identity provider = %v, want instance default", p)
	}
	if p := ctx.GetValidationContext().GetCaCertificateProviderInstance(); p.GetInstanceName() != "default" {
		t.Errorf("root provider = %v, want instance default", p)
	}
	if u.GetSni() != "outbound_.8080_._."+echoHost {
		t.Errorf("SNI = %q", u.GetSni())
	}
	if got := sans(u); !slices.Equal(got, []string{"spiffe://cluster.local/ns/default/sa/echo"}) {
		t.Errorf("SANs = %v", got)
	}
}

// TestRouterClustersCarryNoTLS: an east-west gateway passes the client's
// TLS through untouched, so its clusters stay plain in every mode.
func TestRouterClustersCarryNoTLS(t *testing.T) {
	f := mtlsFixture(t)
	gen := NewGenerator(f.agg, nil)
	gen.mtls.Mode = MTLSStrict
	for name, c := range decodeClusters(t, gen.Clusters(model.View{Kind: model.KindRouter}, f.agg.GetService(echoHost))) {
		if c.GetTransportSocket() != nil || len(c.GetTransportSocketMatches()) != 0 {
			t.Errorf("router cluster %s carries TLS", name)
		}
	}
}

// TestPushRebuildsClustersWhenIdentitiesChange: an endpoint-only change
// that brings a new service account reaches the SANs of the clusters a
// client holds; one that does not leaves CDS alone.
func TestPushRebuildsClustersWhenIdentitiesChange(t *testing.T) {
	f := mtlsFixture(t)
	c := NewCache(NewGenerator(f.agg, nil))
	view := model.View{Kind: model.KindEnvoy}
	if err := c.AcquireView(view); err != nil {
		t.Fatal(err)
	}
	defer c.ReleaseView(view)
	sansNow := func() []string {
		for _, r := range c.Resources(view, resourcev3.ClusterType) {
			if r.Name == "outbound|8080||"+echoHost {
				var cl clusterv3.Cluster
				_ = proto.Unmarshal(r.Any.GetValue(), &cl)
				return sans(upstreamTLS(t, cl.GetTransportSocketMatches()[0].GetTransportSocket()))
			}
		}
		return nil
	}
	before := sansNow()
	push := func(eps ...*registryv1.Endpoint) PushStats {
		f.endpoints(echoHost, eps)
		var ch model.Change
		ch.Touch(echoHost, false)
		return c.Push(ch)
	}
	st := push(
		&registryv1.Endpoint{Address: "10.0.0.1", TlsMode: registryv1.TLSMode_TLS_MODE_ISTIO, ServiceAccount: "spiffe://cluster.local/ns/default/sa/echo"},
		&registryv1.Endpoint{Address: "10.0.0.2", TlsMode: registryv1.TLSMode_TLS_MODE_ISTIO, ServiceAccount: "legacy", Labels: map[string]string{"version": "v2"}},
		&registryv1.Endpoint{Address: "10.0.0.9"}, // a new address, same identities
	)
	if st.Changed[tCluster] != 0 {
		t.Errorf("an address change rebuilt %d clusters", st.Changed[tCluster])
	}
	push(
		&registryv1.Endpoint{Address: "10.0.0.1", TlsMode: registryv1.TLSMode_TLS_MODE_ISTIO, ServiceAccount: "spiffe://cluster.local/ns/default/sa/echo-v2"},
		&registryv1.Endpoint{Address: "10.0.0.2", TlsMode: registryv1.TLSMode_TLS_MODE_ISTIO, ServiceAccount: "legacy", Labels: map[string]string{"version": "v2"}},
	)
	if after := sansNow(); slices.Equal(after, before) || !slices.Contains(after, "spiffe://cluster.local/ns/default/sa/echo-v2") {
		t.Errorf("SANs after a new service account = %v (before %v)", after, before)
	}
}

// TestTLSSocketMatchesEnvoyTypes holds the field numbers tlsSocket splices
// against the generated UpstreamTlsContext.
func TestTLSSocketMatchesEnvoyTypes(t *testing.T) {
	for _, tc := range []struct {
		m      proto.Message
		fields map[protoreflect.Name]protoreflect.FieldNumber
	}{
		{&tlsv3.UpstreamTlsContext{}, map[protoreflect.Name]protoreflect.FieldNumber{"common_tls_context": upstreamCommonTLSContext, "sni": upstreamSNI}},
		{&clusterv3.Cluster{}, map[protoreflect.Name]protoreflect.FieldNumber{"transport_socket": clusterTransportSocket, "transport_socket_matches": clusterTransportSocketMatches}},
		{&clusterv3.Cluster_TransportSocketMatch{}, map[protoreflect.Name]protoreflect.FieldNumber{"name": tsmName, "match": tsmMatch, "transport_socket": tsmTransportSocket}},
		{&corev3.TransportSocket{}, map[protoreflect.Name]protoreflect.FieldNumber{"name": tsName, "typed_config": tsTypedConfig}},
		{&anypb.Any{}, map[protoreflect.Name]protoreflect.FieldNumber{"type_url": anyTypeURL, "value": anyValue}},
	} {
		d := tc.m.ProtoReflect().Descriptor()
		for name, num := range tc.fields {
			if f := d.Fields().ByName(name); f == nil || f.Number() != num {
				t.Errorf("%s.%s is not field %d", d.FullName(), name, num)
			}
		}
	}
}

// BenchmarkCDSGeneration builds the clusters of 1,000 services (10
// endpoints each, in Istio mTLS, one service account per service) for a
// view, without TLS and with it: the budget is at most 2x. "cold"
// starts every op from a new generator, so every TLS context is built and
// marshaled again, as after a restart; the others reuse the contexts of
// identity sets seen before, as pushes do.
func BenchmarkCDSGeneration(b *testing.B) {
	const services, endpoints = 1000, 10
	f := newFixture(b)
	for i := range services {
		f.service(svcHost(i), 8080)
		eps := genEndpoints(endpoints, i)
		for _, e := range eps {
			e.ServiceAccount = fmt.Sprintf("spiffe://cluster.local/ns/default/sa/svc%d", i)
		}
		f.endpoints(svcHost(i), eps)
	}
	svcs := f.agg.Services()
	for _, bc := range []struct {
		name string
		kind model.Kind
		mode MTLSMode
		cold bool
	}{
		{"envoy/tls=DISABLE", model.KindEnvoy, MTLSDisable, false},
		{"envoy/tls=PERMISSIVE", model.KindEnvoy, MTLSPermissive, false},
		{"envoy/tls=PERMISSIVE/cold", model.KindEnvoy, MTLSPermissive, true},
		{"envoy/tls=STRICT", model.KindEnvoy, MTLSStrict, false},
		{"proxyless/tls=DISABLE", model.KindProxyless, MTLSDisable, false},
		{"proxyless/tls=STRICT", model.KindProxyless, MTLSStrict, false},
	} {
		b.Run(bc.name, func(b *testing.B) {
			gen := NewGenerator(f.agg, nil)
			gen.mtls.Mode = bc.mode
			v := model.View{Kind: bc.kind, Network: "network1", Cluster: "cluster1"}
			b.ReportAllocs()
			for b.Loop() {
				if bc.cold {
					gen = NewGenerator(f.agg, nil)
					gen.mtls.Mode = bc.mode
				}
				for _, svc := range svcs {
					if len(gen.Clusters(v, svc)) == 0 {
						b.Fatal("no cluster")
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*services), "ns/service")
		})
	}
}
