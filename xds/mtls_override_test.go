package xds

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"

	"github.com/estuary-mesh/estuary/host/model"
	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
)

const otherHost = "other.default.svc.cluster.local"

// overrideFixture: echo (as mtlsFixture) with its own mTLS mode, and
// other, with the same endpoints' kinds and no override.
func overrideFixture(t *testing.T, override registryv1.MTLSMode, meshExternal bool) *fixture {
	f := mtlsFixture(t)
	f.upsert(&registryv1.Service{Hostname: echoHost, Namespace: "default", MeshExternal: meshExternal,
		Ports:    []*registryv1.Port{{Name: "grpc-8080", Number: 8080, Protocol: "GRPC"}},
		MtlsMode: override, MtlsModeSource: "annotation estuary.io/mtls-mode"})
	f.service(otherHost, 8080)
	f.endpoints(otherHost, []*registryv1.Endpoint{
		{Address: "10.1.0.1", TlsMode: registryv1.TLSMode_TLS_MODE_ISTIO, ServiceAccount: "spiffe://cluster.local/ns/default/sa/other"},
		{Address: "10.1.0.2"},
	})
	return f
}

func (f *fixture) upsert(svc *registryv1.Service) {
	f.apply(false, &registryv1.Event{Instance: f.id, Kind: &registryv1.Event_ServiceUpserted{ServiceUpserted: &registryv1.ServiceUpserted{Service: svc}}})
}

// carried is what a decoded cluster carries, as ClusterTLS names it.
func carried(t *testing.T, c *clusterv3.Cluster) model.ServedTLS {
	t.Helper()
	s, err := servedTLS(c)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestServiceMTLSOverride: a service's own mode decides its clusters in
// every mesh mode, for Envoy and proxyless gRPC alike, and leaves every
// other service on the mesh's mode. ClusterTLS, which explain prints,
// says the same as the cluster built.
func TestServiceMTLSOverride(t *testing.T) {
	meshCarry := map[model.Kind]map[MTLSMode]string{
		model.KindEnvoy:     {MTLSPermissive: model.ClusterTLSAuto, MTLSStrict: model.ClusterTLSMutual, MTLSDisable: model.ClusterTLSNone},
		model.KindProxyless: {MTLSPermissive: model.ClusterTLSNone, MTLSStrict: model.ClusterTLSMutual, MTLSDisable: model.ClusterTLSNone},
	}
	overrides := map[registryv1.MTLSMode]MTLSMode{
		registryv1.MTLSMode_MTLS_MODE_STRICT:     MTLSStrict,
		registryv1.MTLSMode_MTLS_MODE_PERMISSIVE: MTLSPermissive,
		registryv1.MTLSMode_MTLS_MODE_DISABLE:    MTLSDisable,
	}
	for override, as := range overrides {
		f := overrideFixture(t, override, false)
		for _, mesh := range []MTLSMode{MTLSPermissive, MTLSStrict, MTLSDisable} {
			gen := NewGenerator(f.agg, nil)
			gen.mtls.Mode = mesh
			for kind, want := range meshCarry {
				v := model.View{Kind: kind}
				for host, wantTLS := range map[string]string{echoHost: want[as], otherHost: want[mesh]} {
					name := "outbound|8080||" + host
					c := decodeClusters(t, gen.Clusters(v, f.agg.GetService(host)))[name]
					got := carried(t, c)
					if got.TLS != wantTLS {
						t.Errorf("mesh %s, echo overridden to %s, %s view: %s carries %s, want %s", mesh, as, kind, host, got.TLS, wantTLS)
					}
					ex, ok := gen.ClusterTLS(v, name)
					if !ok || ex.TLS != got.TLS || ex.SNI != got.SNI {
						t.Errorf("mesh %s, override %s, %s view: explained %s SNI %q, built %s SNI %q", mesh, as, kind, ex.TLS, ex.SNI, got.TLS, got.SNI)
					}
					if host == echoHost && (ex.Override != as.String() || ex.Mode != as.String() ||
						!strings.Contains(ex.Reason, "service override "+as.String()) ||
						!strings.HasSuffix(ex.OverrideSource, "Static/cluster1, annotation estuary.io/mtls-mode")) {
						t.Errorf("echo explained as %+v, want its override %s and where it came from", ex, as)
					}
					if host == otherHost && (ex.Override != "" || ex.Mode != mesh.String() || !strings.HasPrefix(ex.Reason, "mesh mode "+mesh.String())) {
						t.Errorf("other explained as %+v, want the mesh's %s", ex, mesh)
					}
				}
			}
		}
	}
}

// TestMeshExternalGetsNoAutoMTLS: as Istio, a mesh-external service is
// never reached over Istio mTLS by the mesh's mode, only by its own.
func TestMeshExternalGetsNoAutoMTLS(t *testing.T) {
	for _, tc := range []struct {
		override registryv1.MTLSMode
		want     string
	}{
		{registryv1.MTLSMode_MTLS_MODE_UNSET, model.ClusterTLSNone},
		{registryv1.MTLSMode_MTLS_MODE_STRICT, model.ClusterTLSMutual},
	} {
		f := overrideFixture(t, tc.override, true)
		gen := NewGenerator(f.agg, nil)
		gen.mtls.Mode = MTLSStrict
		name := "outbound|8080||" + echoHost
		c := decodeClusters(t, gen.Clusters(model.View{Kind: model.KindEnvoy}, f.agg.GetService(echoHost)))[name]
		if got := carried(t, c).TLS; got != tc.want {
			t.Errorf("mesh STRICT, mesh-external echo with override %q: %s, want %s", tc.override, got, tc.want)
		}
		if ex, _ := gen.ClusterTLS(model.View{Kind: model.KindEnvoy}, name); tc.override == 0 && !strings.HasPrefix(ex.Reason, "mesh-external service") {
			t.Errorf("reason %q does not say the service is mesh-external", ex.Reason)
		}
	}
}

// TestServiceMTLSOverrideGolden: an overridden service's Envoy clusters
// are byte for byte what the mesh-wide mode of the same name builds, the
// golden files testdata/mtls_envoy_MODE.json (reviewed against istiod),
// whatever the mesh's own mode.
func TestServiceMTLSOverrideGolden(t *testing.T) {
	for override, as := range map[registryv1.MTLSMode]MTLSMode{
		registryv1.MTLSMode_MTLS_MODE_STRICT:     MTLSStrict,
		registryv1.MTLSMode_MTLS_MODE_PERMISSIVE: MTLSPermissive,
		registryv1.MTLSMode_MTLS_MODE_DISABLE:    MTLSDisable,
	} {
		f := overrideFixture(t, override, false)
		for _, mesh := range []MTLSMode{MTLSPermissive, MTLSStrict, MTLSDisable} {
			gen := NewGenerator(f.agg, nil)
			gen.mtls.Mode = mesh
			var buf bytes.Buffer
			for _, r := range gen.Clusters(model.View{Kind: model.KindEnvoy}, f.agg.GetService(echoHost)) {
				var c clusterv3.Cluster
				if err := proto.Unmarshal(r.Any.GetValue(), &c); err != nil {
					t.Fatal(err)
				}
				buf.Write(stableJSON(t, &c))
			}
			golden := filepath.Join("testdata", "mtls_envoy_"+strings.ToLower(as.String())+".json")
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf.Bytes(), want) {
				t.Errorf("mesh %s, override %s: clusters differ from %s:\n%s", mesh, as, golden, buf.String())
			}
		}
	}
}

// TestPushRebuildsOnlyTheOverriddenService: setting a service's mode is
// a change to that service: a push rebuilds its clusters in a cached
// view and leaves every other cluster the view holds as it was.
func TestPushRebuildsOnlyTheOverriddenService(t *testing.T) {
	f := overrideFixture(t, registryv1.MTLSMode_MTLS_MODE_UNSET, false)
	c := NewCache(NewGenerator(f.agg, nil))
	view := model.View{Kind: model.KindEnvoy}
	if err := c.AcquireView(view); err != nil {
		t.Fatal(err)
	}
	defer c.ReleaseView(view)
	held := func() map[string]*Resource {
		out := map[string]*Resource{}
		for _, r := range c.Resources(view, resourcev3.ClusterType) {
			out[r.Name] = r
		}
		return out
	}
	before := held()
	f.upsert(&registryv1.Service{Hostname: echoHost, Namespace: "default",
		Ports:    []*registryv1.Port{{Name: "grpc-8080", Number: 8080, Protocol: "GRPC"}},
		MtlsMode: registryv1.MTLSMode_MTLS_MODE_DISABLE})
	var ch model.Change
	ch.Touch(echoHost, true)
	st := c.Push(ch)
	after := held()
	for name, r := range after {
		changed := r.Version() != before[name].Version()
		echo := strings.HasSuffix(name, "|"+echoHost)
		if echo && !changed {
			t.Errorf("%s was not rebuilt for its new mode", name)
		}
		if !echo && r != before[name] {
			t.Errorf("%s, of another service, was rebuilt", name)
		}
	}
	var cl clusterv3.Cluster
	if err := proto.Unmarshal(after["outbound|8080||"+echoHost].Any.GetValue(), &cl); err != nil {
		t.Fatal(err)
	}
	if got := carried(t, &cl).TLS; got != model.ClusterTLSNone {
		t.Errorf("echo after DISABLE carries %s", got)
	}
	if st.Changed[tCluster] != 2 { // echo's cluster and its v2 subset
		t.Errorf("push changed %d clusters, want echo's 2", st.Changed[tCluster])
	}
}

// TestMTLSSizeIsExact: the room reserved for TLS is what is appended, so
// a cluster is marshaled into one buffer of the right size.
func TestMTLSSizeIsExact(t *testing.T) {
	f := mtlsFixture(t)
	gen := NewGenerator(f.agg, nil)
	svc := f.agg.GetService(echoHost)
	p := gen.peersOf(svc)
	sni := model.SNIClusterName(8080, "", echoHost)
	for _, mode := range []MTLSMode{MTLSPermissive, MTLSStrict, MTLSDisable} {
		gen.mtls.Mode = mode
		for _, kind := range []model.Kind{model.KindEnvoy, model.KindProxyless} {
			d := gen.decideTLS(kind, svc)
			common := gen.tlsCommon(d, &p)
			if got, want := len(appendMTLS(nil, d, common, sni)), mtlsSize(d, common, sni); got != want {
				t.Errorf("%s %s: appended %d bytes, reserved %d", mode, kind, got, want)
			}
		}
	}
}

// TestServiceSubjectAltNamesArePeers: a service's subject alt names (a
// ServiceEntry's subjectAltNames) are accepted besides its endpoints'
// accounts, as Istio does.
func TestServiceSubjectAltNamesArePeers(t *testing.T) {
	f := mtlsFixture(t)
	f.upsert(&registryv1.Service{Hostname: echoHost, Namespace: "default",
		Ports:           []*registryv1.Port{{Name: "grpc-8080", Number: 8080, Protocol: "GRPC"}},
		SubjectAltNames: []string{"spiffe://partner.example/ns/x/sa/y"}})
	gen := NewGenerator(f.agg, nil)
	gen.mtls.Mode = MTLSStrict
	c := decodeClusters(t, gen.Clusters(model.View{Kind: model.KindEnvoy}, f.agg.GetService(echoHost)))["outbound|8080||"+echoHost]
	want := []string{"spiffe://cluster.local/ns/default/sa/echo", "spiffe://cluster.local/ns/default/sa/legacy", "spiffe://partner.example/ns/x/sa/y"}
	if got := sans(upstreamTLS(t, c.GetTransportSocket())); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("SANs = %v, want %v", got, want)
	}
}
