package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/hashicorp/consul/api"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/host/pipeline"
	"github.com/estuary-mesh/estuary/testbed"
)

// sidecarNode is the Envoy sidecar these tests connect over ADS.
const sidecarNode = "sidecar~127.0.0.5~client.default~default.svc.cluster.local"

// cdsWatch is an Envoy sidecar's CDS over a real ADS stream (grpc-go's
// client; no Envoy runs here): it asks for every cluster and acknowledges
// each response, as Envoy does, and keeps the node connected until the
// test ends.
type cdsWatch struct {
	t     *testing.T
	resps chan *discoveryv3.DiscoveryResponse
}

func watchCDS(t *testing.T, xdsAddr, id string) *cdsWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream := openADS(t, ctx, xdsAddr)
	meta, _ := structpb.NewStruct(map[string]any{"CLUSTER_ID": "cluster1"})
	node := &corev3.Node{Id: id, Metadata: meta}
	if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.ClusterType}); err != nil {
		t.Fatal(err)
	}
	w := &cdsWatch{t: t, resps: make(chan *discoveryv3.DiscoveryResponse, 16)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			_ = stream.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resp.GetTypeUrl(), VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
			select {
			case w.resps <- resp:
			case <-ctx.Done():
				return
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return w
}

// wireCluster is one cluster as received: its bytes and what it carries.
type wireCluster struct {
	raw      []byte
	tls, sni string
}

// until waits for a CDS response whose clusters satisfy ok.
func (w *cdsWatch) until(what string, ok func(map[string]wireCluster) bool) map[string]wireCluster {
	w.t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		select {
		case resp := <-w.resps:
			got := map[string]wireCluster{}
			for _, r := range resp.GetResources() {
				var c clusterv3.Cluster
				if err := r.UnmarshalTo(&c); err != nil {
					w.t.Fatal(err)
				}
				tls, sni := carriedTLS(w.t, &c)
				got[c.GetName()] = wireCluster{raw: r.GetValue(), tls: tls, sni: sni}
			}
			if ok(got) {
				return got
			}
		case <-deadline:
			w.t.Fatalf("timed out waiting for CDS where %s", what)
		}
	}
}

// carriedTLS reads, as Envoy would, what a received cluster does about TLS.
func carriedTLS(t *testing.T, c *clusterv3.Cluster) (kind, sni string) {
	t.Helper()
	var ts *corev3.TransportSocket
	kind = model.ClusterTLSNone
	if ts = c.GetTransportSocket(); ts != nil {
		kind = model.ClusterTLSMutual
	}
	for _, m := range c.GetTransportSocketMatches() {
		kind = model.ClusterTLSAuto
		if m.GetMatch().GetFields()["tlsMode"].GetStringValue() == "istio" {
			ts = m.GetTransportSocket()
		}
	}
	if ts == nil {
		return kind, ""
	}
	var u tlsv3.UpstreamTlsContext
	if err := proto.Unmarshal(ts.GetTypedConfig().GetValue(), &u); err != nil {
		t.Fatal(err)
	}
	return kind, u.GetSni()
}

// clusterTLS asks `estuary proxy-config clusters` and `estuary explain
// endpoint` about one cluster of a connected node; the two must agree.
func (h *host) clusterTLS(node, cluster string) model.ClusterTLS {
	h.t.Helper()
	var rows []model.ClusterTLS
	out := h.estuary("proxy-config", "clusters", "--node", node, "--cluster", cluster, "--json")
	if err := json.Unmarshal(out, &rows); err != nil || len(rows) != 1 {
		h.t.Fatalf("proxy-config clusters: %v\n%s", err, out)
	}
	var ex pipeline.Explanation
	out = h.estuary("explain", "endpoint", "--node", node, "--cluster", cluster, "--json")
	if err := json.Unmarshal(out, &ex); err != nil || ex.TLS == nil {
		h.t.Fatalf("explain has no TLS: %v\n%s", err, out)
	}
	if ex.TLS.Reason != rows[0].Reason || ex.TLS.TLS != rows[0].TLS || ex.TLS.SNI != rows[0].SNI {
		h.t.Errorf("explain says %+v, proxy-config %+v", ex.TLS, rows[0])
	}
	return rows[0]
}

// agrees checks an explanation against the cluster the node received.
func agrees(t *testing.T, what string, ex model.ClusterTLS, got wireCluster) {
	t.Helper()
	if ex.TLS != got.tls || ex.SNI != got.sni {
		t.Errorf("%s: explained tls %s SNI %q, but the node received tls %s SNI %q", what, ex.TLS, ex.SNI, got.tls, got.sni)
	}
	if ex.Served == nil || ex.Served.TLS != got.tls || ex.Served.SNI != got.sni {
		t.Errorf("%s: proxy-config shows the server holds %+v, the node received tls %s SNI %q", what, ex.Served, got.tls, got.sni)
	}
}

const (
	echoCluster  = "outbound|8080||echo.default.svc.cluster.local"
	otherCluster = "outbound|8080||other.default.svc.cluster.local"
)

// staticMTLSConfig is a host with mesh mode mesh and two static services,
// echo (its own mode when echoMode is set) and other; each has an
// endpoint in Istio mTLS and one without.
func staticMTLSConfig(mesh, echoMode string) func(xds, admin string) string {
	return func(xds, admin string) string {
		var b strings.Builder
		fmt.Fprintf(&b, "mesh {\n  cluster_id = \"cluster1\"\n  mtls = %q\n}\nxds {\n  listen = %q\n  debounce_after = \"10ms\"\n}\nadmin {\n  listen = %q\n}\n", mesh, xds, admin)
		b.WriteString("plugin \"static\" {\n  config {\n")
		for i, name := range []string{"echo", "other"} {
			mode := ""
			if name == "echo" && echoMode != "" {
				mode = fmt.Sprintf("      mtls_mode = %q\n", echoMode)
			}
			fmt.Fprintf(&b, `    service "%s.default.svc.cluster.local" {
%s      port "grpc" {
        number   = 8080
        protocol = "GRPC"
      }
      endpoint {
        address         = "10.0.%d.1"
        tls_mode        = "istio"
        service_account = %q
      }
      endpoint {
        address = "10.0.%d.2"
      }
    }
`, name, mode, i, name, i)
		}
		b.WriteString("  }\n}\n")
		return b.String()
	}
}

// TestExplainMTLSFollowsModeAndOverride: `estuary explain` and
// `estuary proxy-config clusters` say why a cluster carries the TLS it
// does, and the reason moves with what decides it: the mesh's mode (a
// restart), and a static service's mtls_mode (a reload). Each time, what
// they explain is what an Envoy node connected over ADS receives, and
// the override touches echo's cluster only.
func TestExplainMTLSFollowsModeAndOverride(t *testing.T) {
	h := startHostFile(t, staticMTLSConfig("PERMISSIVE", ""))
	w := watchCDS(t, h.xds, sidecarNode)
	got := w.until("echo and other are auto mTLS", func(cs map[string]wireCluster) bool {
		return cs[echoCluster].tls == model.ClusterTLSAuto && cs[otherCluster].tls == model.ClusterTLSAuto
	})
	ex := h.clusterTLS(sidecarNode, echoCluster)
	agrees(t, "PERMISSIVE", ex, got[echoCluster])
	if !strings.HasPrefix(ex.Reason, "mesh mode PERMISSIVE: transport_socket_matches") || ex.Override != "" || ex.SNI != echoSNI {
		t.Errorf("PERMISSIVE: explained %+v", ex)
	}
	table := string(h.estuary("proxy-config", "clusters", "--node", sidecarNode))
	if !strings.Contains(table, echoCluster) || !strings.Contains(table, "AUTO") || !strings.Contains(table, echoSNI) || !strings.Contains(table, "mesh mode PERMISSIVE") {
		t.Errorf("proxy-config clusters prints:\n%s", table)
	}
	text := string(h.estuary("explain", "endpoint", "--node", sidecarNode, "--cluster", echoCluster))
	if !strings.Contains(text, "tls istio -> Istio mTLS (match tlsMode-istio)") || !strings.Contains(text, "the cluster the xDS server holds carries the same") {
		t.Errorf("explain prints:\n%s", text)
	}

	// echo's own mode, by a reload: only echo's cluster changes.
	h.write(staticMTLSConfig("PERMISSIVE", "DISABLE")(h.xds, strings.TrimPrefix(h.admin, "http://")))
	h.signal(syscall.SIGHUP)
	after := w.until("echo is plain text", func(cs map[string]wireCluster) bool { return cs[echoCluster].tls == model.ClusterTLSNone })
	if string(after[otherCluster].raw) != string(got[otherCluster].raw) {
		t.Errorf("echo's override changed other's cluster")
	}
	h.eventually("explain to see the override", 30*time.Second, func() bool {
		return h.clusterTLS(sidecarNode, echoCluster).Override == "DISABLE"
	})
	ex = h.clusterTLS(sidecarNode, echoCluster)
	agrees(t, "override DISABLE", ex, after[echoCluster])
	if !strings.HasPrefix(ex.Reason, "service override DISABLE (from static:Static/cluster1, attribute mtls_mode) over mesh mode PERMISSIVE") {
		t.Errorf("override: reason %q", ex.Reason)
	}
	if o := h.clusterTLS(sidecarNode, otherCluster); !strings.HasPrefix(o.Reason, "mesh mode PERMISSIVE") {
		t.Errorf("other: reason %q, want the mesh's", o.Reason)
	}

	// The mesh's mode, by a restart.
	h.signal(syscall.SIGTERM)
	h.write(staticMTLSConfig("STRICT", "")(h.xds, strings.TrimPrefix(h.admin, "http://")))
	h = h.again()
	h.eventually("ready", 30*time.Second, func() bool { code, _ := h.get("/readyz"); return code == 200 })
	w = watchCDS(t, h.xds, sidecarNode)
	got = w.until("echo is Istio mTLS", func(cs map[string]wireCluster) bool { return cs[echoCluster].tls == model.ClusterTLSMutual })
	ex = h.clusterTLS(sidecarNode, echoCluster)
	agrees(t, "STRICT", ex, got[echoCluster])
	if !strings.HasPrefix(ex.Reason, "mesh mode STRICT: every endpoint over Istio mTLS") || ex.SNI != echoSNI ||
		strings.Join(ex.SANs, ",") != "spiffe://cluster.local/ns/default/sa/echo" {
		t.Errorf("STRICT: explained %+v", ex)
	}
}

// TestKubernetesMTLSAnnotation: a real API server; the annotation
// estuary.io/mtls-mode on one Service changes the clusters of that
// service only, pushed to an Envoy node connected over ADS, and explain
// names the annotation; removing it restores the mesh's mode.
func TestKubernetesMTLSAnnotation(t *testing.T) {
	k := testbed.StartKube(t)
	ns := "default"
	kubeEcho(t, k.Client(), ns, "10.96.0.10", "10.1.0.1")
	ctx := context.Background()
	if _, err := k.Client().CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: ns},
		Spec:       corev1.ServiceSpec{ClusterIP: "10.96.0.11", Ports: []corev1.ServicePort{{Name: "grpc", Port: 8080}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h := startHost(t, fmt.Sprintf("plugin \"kubernetes\" {\n  config {\n    kubeconfig = %q\n    cluster_id = \"cluster1\"\n  }\n}\n", k.Kubeconfig))
	w := watchCDS(t, h.xds, sidecarNode)
	got := w.until("echo and other are auto mTLS", func(cs map[string]wireCluster) bool {
		return cs[echoCluster].tls == model.ClusterTLSAuto && cs[otherCluster].tls == model.ClusterTLSAuto
	})

	annotate := func(v *string) {
		t.Helper()
		svc, err := k.Client().CoreV1().Services(ns).Get(ctx, "echo", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if v == nil {
			delete(svc.Annotations, "estuary.io/mtls-mode")
		} else {
			svc.Annotations = map[string]string{"estuary.io/mtls-mode": *v}
		}
		if _, err := k.Client().CoreV1().Services(ns).Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	strict := "STRICT"
	annotate(&strict)
	after := w.until("echo is Istio mTLS", func(cs map[string]wireCluster) bool { return cs[echoCluster].tls == model.ClusterTLSMutual })
	if string(after[otherCluster].raw) != string(got[otherCluster].raw) {
		t.Errorf("echo's annotation changed other's cluster")
	}
	if after[echoCluster].sni != echoSNI {
		t.Errorf("echo's SNI = %q", after[echoCluster].sni)
	}
	ex := h.clusterTLS(sidecarNode, echoCluster)
	agrees(t, "annotation STRICT", ex, after[echoCluster])
	if ex.Override != "STRICT" || !strings.HasSuffix(ex.OverrideSource, "Kubernetes/cluster1, annotation estuary.io/mtls-mode") {
		t.Errorf("explained %+v, want the annotation as the source", ex)
	}

	// A value that is no mode: a notice for the Service, and the mesh's
	// mode again.
	bad := "strict"
	annotate(&bad)
	w.until("echo is auto mTLS again", func(cs map[string]wireCluster) bool { return cs[echoCluster].tls == model.ClusterTLSAuto })
	h.noticeUntilFixed("Service default/echo", "ignored, the service follows the mesh's mode", func() { annotate(nil) })
}

// TestConsulMTLSMeta: a real Consul agent; the service meta mtls_mode of
// web's instance gives web its own mode, pushed to an Envoy node over
// ADS, and leaves api, of the same agent, on the mesh's.
func TestConsulMTLSMeta(t *testing.T) {
	c := testbed.StartConsul(t)
	register := func(id, name, addr string, meta map[string]string) {
		t.Helper()
		if err := c.Client().Agent().ServiceRegister(&api.AgentServiceRegistration{ID: id, Name: name, Address: addr, Port: 8080, Meta: meta}); err != nil {
			t.Fatal(err)
		}
	}
	register("web-1", "web", "10.0.0.1", map[string]string{"tls_mode": "istio", "mtls_mode": "DISABLE"})
	register("api-1", "api", "10.0.0.2", map[string]string{"tls_mode": "istio"})
	h := startHost(t, fmt.Sprintf("plugin \"consul\" {\n  config {\n    address = %q\n  }\n}\n", c.Addr))
	const web, apiCluster = "outbound|8080||web.service.consul", "outbound|8080||api.service.consul"
	w := watchCDS(t, h.xds, sidecarNode)
	got := w.until("web is plain text and api auto mTLS", func(cs map[string]wireCluster) bool {
		return cs[web].tls == model.ClusterTLSNone && cs[apiCluster].tls == model.ClusterTLSAuto
	})
	ex := h.clusterTLS(sidecarNode, web)
	agrees(t, "meta DISABLE", ex, got[web])
	if ex.Override != "DISABLE" || !strings.HasSuffix(ex.OverrideSource, "Consul/dc1, service meta mtls_mode") {
		t.Errorf("explained %+v, want the meta as the source", ex)
	}

	register("web-1", "web", "10.0.0.1", map[string]string{"tls_mode": "istio", "mtls_mode": "STRICT"})
	after := w.until("web is Istio mTLS", func(cs map[string]wireCluster) bool { return cs[web].tls == model.ClusterTLSMutual })
	if string(after[apiCluster].raw) != string(got[apiCluster].raw) {
		t.Errorf("web's meta changed api's cluster")
	}
	agrees(t, "meta STRICT", h.clusterTLS(sidecarNode, web), after[web])
}

// noticeUntilFixed waits for /debug/registryz to hold a notice about
// object, calls fix, and waits for the notice to go.
func (h *host) noticeUntilFixed(object, notice string, fix func()) {
	h.t.Helper()
	registryz := func() string { _, b := h.get("/debug/registryz"); return string(b) }
	h.eventually("a notice about "+object, 30*time.Second, func() bool {
		r := registryz()
		return strings.Contains(r, object) && strings.Contains(r, notice)
	})
	fix()
	h.eventually("the notice about "+object+" to go", 30*time.Second, func() bool { return !strings.Contains(registryz(), notice) })
}
