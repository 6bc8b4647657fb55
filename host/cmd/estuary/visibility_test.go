package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/host/visibility"
	"github.com/estuary-mesh/estuary/testbed"
)

// seEntry is a ServiceEntry of one STATIC endpoint, in namespace ns,
// exported as exportTo says (nil: not set).
func seEntry(name, ns, host string, exportTo ...string) string {
	out := fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: %s
  namespace: %s
spec:
  hosts: [%s]
  location: MESH_INTERNAL
  resolution: STATIC
  ports:
  - {number: 8080, name: grpc, protocol: GRPC}
  endpoints:
  - {address: 127.0.0.1}
`, name, ns, host)
	if exportTo != nil {
		q := make([]string, len(exportTo))
		for i, e := range exportTo {
			q[i] = fmt.Sprintf("%q", e)
		}
		out += "  exportTo: [" + strings.Join(q, ", ") + "]\n"
	}
	return out
}

// adsWatcher is an ADS stream of a node that takes every response; it
// keeps, per type, the resource names of the latest response.
type adsWatcher struct {
	t      *testing.T
	stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	node   *corev3.Node
	got    chan *discoveryv3.DiscoveryResponse
}

func watchADS(t *testing.T, xdsAddr string, node *corev3.Node) *adsWatcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream := openADS(t, ctx, xdsAddr)
	w := &adsWatcher{t: t, stream: stream, node: node, got: make(chan *discoveryv3.DiscoveryResponse, 64)}
	go func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				close(w.got)
				return
			}
			w.got <- resp
		}
	}()
	return w
}

func (w *adsWatcher) ask(typeURL string, names []string, ack *discoveryv3.DiscoveryResponse) {
	w.t.Helper()
	req := &discoveryv3.DiscoveryRequest{Node: w.node, TypeUrl: typeURL, ResourceNames: names}
	if ack != nil {
		req.VersionInfo, req.ResponseNonce = ack.GetVersionInfo(), ack.GetNonce()
	}
	if err := w.stream.Send(req); err != nil {
		w.t.Fatal(err)
	}
}

// next waits for the next response of typeURL, ACKs it and returns the
// names it holds.
func (w *adsWatcher) next(typeURL string, names []string) []string {
	w.t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		select {
		case resp, ok := <-w.got:
			if !ok {
				w.t.Fatal("ADS stream closed")
			}
			if resp.GetTypeUrl() != typeURL {
				continue
			}
			w.ask(typeURL, names, resp)
			var out []string
			for _, a := range resp.GetResources() {
				out = append(out, resourceName(w.t, typeURL, a.GetValue()))
			}
			slices.Sort(out)
			return out
		case <-deadline:
			w.t.Fatalf("no %s response in 60s", typeURL)
		}
	}
}

// until takes pushes of typeURL until one's names satisfy ok, and
// returns those names; it fails after a minute. An unrelated push on the
// way (a busy machine reorders nothing, but registries may push twice) is
// skipped.
func (w *adsWatcher) until(typeURL string, names []string, what string, ok func([]string) bool) []string {
	w.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		got := w.next(typeURL, names)
		if ok(got) {
			return got
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("%s: last %s push %v", what, typeURL, got)
		}
	}
}

func namespacedNode(kind, ns string, md map[string]any) *corev3.Node {
	m, _ := structpb.NewStruct(md)
	return &corev3.Node{Id: fmt.Sprintf("%s~127.0.0.1~client.%s~%s.svc.cluster.local", kind, ns, ns), Metadata: m}
}

// hostsOf returns the hostnames of outbound|PORT|SUBSET|HOST clusters.
func hostsOf(clusters []string) []string {
	var out []string
	for _, c := range clusters {
		if _, _, h, ok := model.ParseClusterName(c); ok && !slices.Contains(out, h) {
			out = append(out, h)
		}
	}
	slices.Sort(out)
	return out
}

// TestExportToPerNamespace: a client in namespace a sees a ServiceEntry
// exported to "." from a, and one exported to "*" from c, but not one of
// a exported only to b: no cluster, listener, route or EDS for it. An
// edit of the file that exports it to a pushes it to the connected
// client, and the edit back takes it away.
func TestExportToPerNamespace(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		tmp := filepath.Join(dir, "."+name)
		if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	const own, onlyB, all = "own.a.example", "onlyb.a.example", "all.c.example"
	write("own.yaml", seEntry("own", "a", own, "."))
	write("onlyb.yaml", seEntry("onlyb", "a", onlyB, "b"))
	write("all.yaml", seEntry("all", "c", all, "*"))
	h := startHost(t, fmt.Sprintf("plugin \"serviceentry\" {\n  config {\n    dir = %q\n  }\n}\n", dir))

	// Envoy in a: CDS, and EDS of the hidden service asked by name.
	envoy := watchADS(t, h.xds, namespacedNode("sidecar", "a", map[string]any{"CLUSTER_ID": "cluster1"}))
	envoy.ask(resourcev3.ClusterType, nil, nil)
	if got, want := hostsOf(envoy.next(resourcev3.ClusterType, nil)), []string{all, own}; !slices.Equal(got, want) {
		t.Fatalf("namespace a's clusters are of %v, want %v", got, want)
	}
	hidden := model.ClusterName(8080, "", onlyB)
	envoy.ask(resourcev3.EndpointType, []string{hidden, model.ClusterName(8080, "", own)}, nil)
	if got := envoy.next(resourcev3.EndpointType, []string{hidden, model.ClusterName(8080, "", own)}); !slices.Equal(got, []string{model.ClusterName(8080, "", own)}) {
		t.Fatalf("namespace a's EDS holds %v, want only %s's", got, own)
	}

	// Proxyless gRPC in a: listeners and routes.
	grpcNode := namespacedNode("sidecar", "a", map[string]any{"GENERATOR": "grpc", "CLUSTER_ID": "cluster1"})
	pl := watchADS(t, h.xds, grpcNode)
	pl.ask(resourcev3.ListenerType, nil, nil)
	if got, want := pl.next(resourcev3.ListenerType, nil), []string{model.ListenerName(all, 8080), model.ListenerName(own, 8080)}; !slices.Equal(got, want) {
		t.Fatalf("namespace a's listeners are %v, want %v", got, want)
	}
	routes := []string{model.ListenerName(own, 8080), model.ListenerName(onlyB, 8080)}
	pl.ask(resourcev3.RouteType, routes, nil)
	if got := pl.next(resourcev3.RouteType, routes); !slices.Equal(got, []string{model.ListenerName(own, 8080)}) {
		t.Fatalf("namespace a's routes are %v, want only %s's", got, own)
	}

	// In b, the other way round for onlyb and own; all is everywhere.
	inB := watchADS(t, h.xds, namespacedNode("sidecar", "b", map[string]any{"CLUSTER_ID": "cluster1"}))
	inB.ask(resourcev3.ClusterType, nil, nil)
	if got, want := hostsOf(inB.next(resourcev3.ClusterType, nil)), []string{all, onlyB}; !slices.Equal(got, want) {
		t.Fatalf("namespace b's clusters are of %v, want %v", got, want)
	}

	// The edit reaches the connected client of a as a push.
	write("onlyb.yaml", seEntry("onlyb", "a", onlyB, "b", "a"))
	envoy.until(resourcev3.ClusterType, nil, "a's CDS after exporting onlyb to a", func(got []string) bool {
		return slices.Equal(hostsOf(got), []string{all, onlyB, own})
	})
	envoy.until(resourcev3.EndpointType, []string{hidden, model.ClusterName(8080, "", own)}, "a's EDS after exporting onlyb to a", func(got []string) bool {
		return slices.Contains(got, hidden)
	})
	write("onlyb.yaml", seEntry("onlyb", "a", onlyB, "b"))
	envoy.until(resourcev3.ClusterType, nil, "a's CDS after exporting onlyb to b only again", func(got []string) bool {
		return slices.Equal(hostsOf(got), []string{all, own})
	})

	// proxy-config shows what the node gets: no endpoint of onlyb.
	var rows []model.EndpointRow
	h.getJSON("/debug/proxyendpointz?node="+envoy.node.GetId(), &rows)
	for _, r := range rows {
		if r.Cluster == hidden {
			t.Errorf("proxy-config endpoints of a's node lists %s, which it does not see", hidden)
		}
	}
	if len(rows) == 0 {
		t.Errorf("proxy-config endpoints of a's node lists nothing; want %s's", own)
	}

	// explain service says the same, and why.
	var ex visibility.Explanation
	h.getJSON("/debug/visibilityz?host="+onlyB+"&node="+envoy.node.GetId(), &ex)
	if ex.Visible || !ex.Connected || len(ex.Received) != 0 || ex.Source != visibility.SourceServiceEntry ||
		!slices.Equal(ex.ExportTo, []string{"b"}) || len(ex.Instances) != 1 || ex.Instances[0].Provider != "ServiceEntry" {
		t.Fatalf("visibilityz for %s from a: %+v", onlyB, ex)
	}
	out, err := exec.Command(estuaryBin, "explain", "service", own, "--node", envoy.node.GetId(), "--admin", strings.TrimPrefix(h.admin, "http://")).CombinedOutput()
	if err != nil {
		t.Fatalf("explain service: %v\n%s", err, out)
	}
	for _, want := range []string{"SEES service " + own, "exportTo: ., from ServiceEntry spec.exportTo", `"." exports it to its own namespace "a"`,
		"instance: serviceentry (provider ServiceEntry", "outbound|8080||" + own, "This matches what the xDS server holds"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("explain service %s lacks %q:\n%s", own, want, out)
		}
	}
	out, err = exec.Command(estuaryBin, "explain", "service", onlyB, "--node", envoy.node.GetId(), "--admin", strings.TrimPrefix(h.admin, "http://")).CombinedOutput()
	if err != nil {
		t.Fatalf("explain service: %v\n%s", err, out)
	}
	for _, want := range []string{"DOES NOT SEE service " + onlyB, `namespace "a" is not in its exportTo`, "holds no cluster of it", "This matches"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("explain service %s lacks %q:\n%s", onlyB, want, out)
		}
	}
}

// TestMeshDefaultServiceExportTo: a service that sets no exportTo takes
// mesh.default_service_export_to; one that sets it keeps its own.
func TestMeshDefaultServiceExportTo(t *testing.T) {
	h := startHostFile(t, func(xds, admin string) string {
		return fmt.Sprintf(`mesh {
  cluster_id                = "cluster1"
  default_service_export_to = ["."]
}
xds {
  listen         = %q
  debounce_after = "10ms"
}
admin { listen = %q }
plugin "static" {
  config {
    cluster = "cluster1"
    service "quiet.x.svc.cluster.local" {
      namespace = "x"
      port "grpc" {
        number   = 8080
        protocol = "GRPC"
      }
      endpoint { address = "127.0.0.1" }
    }
    service "loud.x.svc.cluster.local" {
      namespace = "x"
      export_to = ["*"]
      port "grpc" {
        number   = 8080
        protocol = "GRPC"
      }
      endpoint { address = "127.0.0.1" }
    }
  }
}
`, xds, admin)
	})
	for ns, want := range map[string][]string{
		"x": {"loud.x.svc.cluster.local", "quiet.x.svc.cluster.local"},
		"y": {"loud.x.svc.cluster.local"},
	} {
		w := watchADS(t, h.xds, namespacedNode("sidecar", ns, map[string]any{"CLUSTER_ID": "cluster1"}))
		w.ask(resourcev3.ClusterType, nil, nil)
		if got := hostsOf(w.next(resourcev3.ClusterType, nil)); !slices.Equal(got, want) {
			t.Errorf("namespace %s's clusters are of %v, want %v", ns, got, want)
		}
	}
	var cz struct {
		Mesh struct {
			ExportTo []string `json:"default_service_export_to"`
		} `json:"mesh"`
	}
	h.getJSON("/debug/configz", &cz)
	if !slices.Equal(cz.Mesh.ExportTo, []string{"."}) {
		t.Errorf("configz mesh.default_service_export_to = %q, want [.]", cz.Mesh.ExportTo)
	}
	var ex visibility.Explanation
	h.getJSON("/debug/visibilityz?host=quiet.x.svc.cluster.local&namespace=y", &ex)
	if ex.Visible || ex.Source != visibility.SourceMeshDefault || !slices.Equal(ex.ExportTo, []string{"."}) {
		b, _ := json.Marshal(ex)
		t.Fatalf("visibilityz of quiet from y: %s", b)
	}
}

// resourceName decodes the name of a resource of typeURL.
func resourceName(t *testing.T, typeURL string, b []byte) string {
	t.Helper()
	var m interface {
		proto.Message
		GetName() string
	}
	switch typeURL {
	case resourcev3.ClusterType:
		m = &clusterv3.Cluster{}
	case resourcev3.ListenerType:
		m = &listenerv3.Listener{}
	case resourcev3.RouteType:
		m = &routev3.RouteConfiguration{}
	case resourcev3.EndpointType:
		var cla endpointv3.ClusterLoadAssignment
		if err := proto.Unmarshal(b, &cla); err != nil {
			t.Fatal(err)
		}
		return cla.GetClusterName()
	}
	if err := proto.Unmarshal(b, m); err != nil {
		t.Fatal(err)
	}
	return m.GetName()
}

// TestKubernetesExportToAnnotationIsPushed: a real API server's Service
// in namespace ns, annotated networking.istio.io/exportTo=".": a
// connected client in ns gets it, one in another namespace does not;
// editing the annotation to "other" swaps them, by push, on the streams
// already open.
func TestKubernetesExportToAnnotationIsPushed(t *testing.T) {
	k := testbed.StartKube(t)
	ns := fmt.Sprintf("vis-%d", time.Now().UnixNano()%100000)
	kubeEcho(t, k.Client(), ns, "10.96.7.7", "10.7.0.1")
	annotate := func(v string) {
		t.Helper()
		ctx := context.Background()
		svc, err := k.Client().CoreV1().Services(ns).Get(ctx, "echo", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		svc.Annotations = map[string]string{"networking.istio.io/exportTo": v}
		if _, err := k.Client().CoreV1().Services(ns).Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	annotate(".")
	h := startHost(t, fmt.Sprintf("plugin \"kubernetes\" {\n  config {\n    kubeconfig = %q\n    cluster_id = \"cluster1\"\n  }\n}\n", k.Kubeconfig))
	echo := "echo." + ns + ".svc.cluster.local"
	h.eventually("echo in the registry", 60*time.Second, func() bool {
		code, _ := h.get("/debug/endpointz?host=" + echo)
		return code == 200
	})
	own := watchADS(t, h.xds, namespacedNode("sidecar", ns, map[string]any{"CLUSTER_ID": "cluster1"}))
	other := watchADS(t, h.xds, namespacedNode("sidecar", "other", map[string]any{"CLUSTER_ID": "cluster1"}))
	own.ask(resourcev3.ClusterType, nil, nil)
	other.ask(resourcev3.ClusterType, nil, nil)
	hasEcho := func(w *adsWatcher) bool { return slices.Contains(hostsOf(w.next(resourcev3.ClusterType, nil)), echo) }
	if !hasEcho(own) {
		t.Fatalf("a client in %s lacks %s, exported to \".\"", ns, echo)
	}
	if hasEcho(other) {
		t.Fatalf("a client in namespace other gets %s, exported to \".\" of %s", echo, ns)
	}
	annotate("other")
	with := func(got []string) bool { return slices.Contains(hostsOf(got), echo) }
	other.until(resourcev3.ClusterType, nil, "namespace other's CDS once exported to it", with)
	own.until(resourcev3.ClusterType, nil, ns+"'s CDS once no longer exported to it", func(got []string) bool { return !with(got) })
	var ex visibility.Explanation
	h.getJSON("/debug/visibilityz?host="+echo+"&node="+own.node.GetId(), &ex)
	if ex.Visible || ex.Source != visibility.SourceAnnotation || !slices.Equal(ex.ExportTo, []string{"other"}) || ex.Instances[0].Cluster != "cluster1" {
		t.Errorf("visibilityz: %+v", ex)
	}
}

// TestProxylessGRPCCallsOnlyWhatIsExported: grpc-go's own xDS client in
// namespace a calls a service of a exported to ".", and one of c
// exported to "*", through estuary; a service of b exported to "." does
// not resolve for it (no listener), while a client in b calls it.
func TestProxylessGRPCCallsOnlyWhatIsExported(t *testing.T) {
	mine, all, theirs := startBackend(t, "mine"), startBackend(t, "all"), startBackend(t, "theirs")
	svc := func(host, ns, export string, be *backend) string {
		return fmt.Sprintf(`    service %q {
      namespace = %q
      export_to = [%q]
      port "grpc" {
        number   = 8080
        protocol = "GRPC"
      }
      endpoint {
        address = "127.0.0.1"
        ports   = { grpc = %d }
      }
    }
`, host, ns, export, be.port)
	}
	h := startHost(t, "plugin \"static\" {\n  config {\n    cluster = \"cluster1\"\n    network = \"network1\"\n"+
		svc("mine.a.svc.cluster.local", "a", ".", mine)+svc("all.c.svc.cluster.local", "c", "*", all)+
		svc("theirs.b.svc.cluster.local", "b", ".", theirs)+"  }\n}\n")
	inA := "sidecar~127.0.0.1~client.a~a.svc.cluster.local"
	waitServedBy(t, xdsClient(t, h.xds, inA, "mine.a.svc.cluster.local:8080"), "mine")
	waitServedBy(t, xdsClient(t, h.xds, inA, "all.c.svc.cluster.local:8080"), "all")
	waitServedBy(t, xdsClient(t, h.xds, "sidecar~127.0.0.1~client.b~b.svc.cluster.local", "theirs.b.svc.cluster.local:8080"), "theirs")
	_, err := call(context.Background(), xdsClient(t, h.xds, inA, "theirs.b.svc.cluster.local:8080"))
	if err == nil {
		t.Fatal("a client in namespace a called theirs.b, exported only to b")
	}
	t.Logf("a's call to theirs.b: %v", err)
}
