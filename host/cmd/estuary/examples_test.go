package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/host/pipeline"
	"github.com/estuary-mesh/estuary/testbed"
)

// TestExamplesValidate: every configuration under examples/ and the
// repository's plugins.hcl pass `estuary validate`.
func TestExamplesValidate(t *testing.T) {
	files, err := filepath.Glob("../../../examples/*/plugins.hcl")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, "../../../plugins.hcl")
	if len(files) < 4 {
		t.Fatalf("found only %v", files)
	}
	for _, f := range files {
		t.Run(f, func(t *testing.T) {
			if out, err := exec.Command(estuaryBin, "validate", "-config", f).CombinedOutput(); err != nil {
				t.Errorf("estuary validate %s: %v\n%s", f, err, out)
			}
		})
	}
}

// readExample returns the example's plugins.hcl with xds and admin blocks
// on the given addresses appended, and rewrite applied to the rest: the
// paths and addresses it names (/etc/estuary/kubeconfig, the Consul agent)
// become those of the real components the test started.
func readExample(t *testing.T, name string, rewrite ...string) func(xds, admin string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("../../../examples", name, "plugins.hcl"))
	if err != nil {
		t.Fatal(err)
	}
	src := string(b)
	for i := 0; i+1 < len(rewrite); i += 2 {
		if !strings.Contains(src, rewrite[i]) {
			t.Fatalf("examples/%s/plugins.hcl no longer contains %q", name, rewrite[i])
		}
		src = strings.ReplaceAll(src, rewrite[i], rewrite[i+1])
	}
	return func(xds, admin string) string {
		return src + fmt.Sprintf("\nxds {\n  listen         = %q\n  debounce_after = \"10ms\"\n}\nadmin {\n  listen = %q\n}\n", xds, admin)
	}
}

// TestExampleTwoNetworks runs examples/two-networks as it is and checks
// the promise of its comment for each node it describes. The west
// registry (cluster2) names no network and is not mesh.cluster_id, so it
// does not inherit mesh.network: from_registry puts it on network2.
func TestExampleTwoNetworks(t *testing.T) {
	h := startHostFile(t, readExample(t, "two-networks"))
	const echo = "echo.default.svc.cluster.local"
	eds, sni := model.ClusterName(8080, "", echo), model.SNIClusterName(8080, "", echo)
	// One gateway per network: the scale factor (the LCM of the gateway
	// counts) is 1, every endpoint weighs 1 (unset), so the local endpoint
	// is sent with 1 and the gateway with the sum of what it replaces, 1.
	nodes := []struct {
		name, id string
		md       map[string]any
		cluster  string
		want     []string // sorted
	}{
		{"client on network1", "sidecar~127.0.0.2~east-client.default~default.svc.cluster.local",
			map[string]any{"NETWORK": "network1", "CLUSTER_ID": "cluster1"}, eds,
			[]string{"127.0.0.12:15443 w=1", "127.0.0.1:50051 w=1"}},
		{"client on network2", "sidecar~127.0.0.3~west-client.default~default.svc.cluster.local",
			map[string]any{"NETWORK": "network2", "CLUSTER_ID": "cluster2"}, eds,
			[]string{"10.20.0.5:50051 w=1", "127.0.0.11:15443 w=1"}},
		{"east-west gateway of network1", "router~127.0.0.11~istio-eastwestgateway-1.istio-system~istio-system.svc.cluster.local",
			map[string]any{"NETWORK": "network1", "REQUESTED_NETWORK_VIEW": "network1", "CLUSTER_ID": "cluster1"}, sni,
			[]string{"127.0.0.1:50051 w=1"}},
		{"east-west gateway of network2", "router~127.0.0.12~istio-eastwestgateway-2.istio-system~istio-system.svc.cluster.local",
			map[string]any{"NETWORK": "network2", "REQUESTED_NETWORK_VIEW": "network2", "CLUSTER_ID": "cluster2"}, sni,
			[]string{"10.20.0.5:50051 w=1"}},
	}
	for _, n := range nodes {
		got := adsEndpoints(t, h.xds, n.id, n.md)[n.cluster]
		if !slices.Equal(got, n.want) {
			t.Errorf("%s gets %v for %s, want %v", n.name, got, n.cluster, n.want)
		}
	}
	// explain says why 10.20.0.5 is on network2: from_registry, because
	// its registry has no default network of its own.
	out := h.estuary("explain", "endpoint", "--node", nodes[0].id, "--cluster", eds, "--json")
	var ex pipeline.Explanation
	if err := json.Unmarshal(out, &ex); err != nil {
		t.Fatalf("explain: %v\n%s", err, out)
	}
	found := false
	for _, e := range ex.Endpoints {
		if e.Endpoint != "10.20.0.5:50051" {
			continue
		}
		found = true
		if e.Network != "network2" || e.Rule != pipeline.RuleFromRegistry || e.RegistryDefault != "" || e.Decision != pipeline.Replaced {
			t.Errorf("explain: 10.20.0.5 on %q by rule %q (registry default %q), %q; want network2 by from_registry, no registry default, replaced",
				e.Network, e.Rule, e.RegistryDefault, e.Decision)
		}
	}
	if !found {
		t.Errorf("explain does not list 10.20.0.5:50051: %s", out)
	}
}

// kubeEcho creates, in namespace ns (created unless it exists), service
// echo (port grpc 8080, VIP clusterIP) with one ready endpoint podIP.
func kubeEcho(t *testing.T, c kubernetes.Interface, ns, clusterIP, podIP string) {
	t.Helper()
	ctx := context.Background()
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: ns},
		Spec:       corev1.ServiceSpec{ClusterIP: clusterIP, Ports: []corev1.ServicePort{{Name: "grpc", Port: 8080}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ready := true
	port, name := int32(8080), "grpc"
	if _, err := c.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "echo-1", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: "echo"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{podIP}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// eventuallyEndpoints waits until the registries hold n endpoints of
// host, then checks that a new ADS stream of node id (metadata md) gets
// exactly want (sorted "ADDR:PORT w=W") for its cluster on port 8080.
func eventuallyEndpoints(t *testing.T, h *host, id string, md map[string]any, host string, n int, want []string) {
	t.Helper()
	eventuallyEndpointsOn(t, h, id, md, host, 8080, n, want)
}

// eventuallyEndpointsOn is eventuallyEndpoints for the cluster of port.
func eventuallyEndpointsOn(t *testing.T, h *host, id string, md map[string]any, host string, port uint32, n int, want []string) {
	t.Helper()
	h.eventually(fmt.Sprintf("%d endpoints of %s in the registries", n, host), 60*time.Second, func() bool {
		var got struct {
			Merged []json.RawMessage `json:"merged"`
		}
		code, b := h.get("/debug/endpointz?host=" + host)
		return code == 200 && json.Unmarshal(b, &got) == nil && len(got.Merged) == n
	})
	cluster := model.ClusterName(port, "", host)
	if got := adsEndpoints(t, h.xds, id, md)[cluster]; !slices.Equal(got, want) {
		t.Errorf("%s gets %v for %s, want %v", id, got, cluster, want)
	}
}

// TestExampleConsulKubernetes runs examples/consul-kubernetes with a real
// API server and Consul agent: service echo in Kubernetes (default
// namespace) and echo in Consul (its domain_suffix gives it the same
// hostname) merge, so a client gets the endpoints of both, and the
// merged service's attributes are the first plugin's (kubernetes).
func TestExampleConsulKubernetes(t *testing.T) {
	k := testbed.StartKube(t)
	c := testbed.StartConsul(t, testbed.ConsulACL("")) // the example reads a token file
	token := filepath.Join(t.TempDir(), "consul-token")
	if err := os.WriteFile(token, []byte(c.Token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	kubeEcho(t, k.Client(), "default", "10.96.0.10", "10.1.0.1")
	if err := c.Client().Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "echo-vm", Name: "echo", Port: 8080, Address: "10.2.0.1"}); err != nil {
		t.Fatal(err)
	}
	h := startHostFile(t, readExample(t, "consul-kubernetes",
		`"/etc/estuary/kubeconfig"`, strconv.Quote(k.Kubeconfig),
		`"127.0.0.1:8500"`, strconv.Quote(c.Addr),
		`"/etc/estuary/consul-token"`, strconv.Quote(token)))
	const echo = "echo.default.svc.cluster.local"
	eventuallyEndpoints(t, h, "sidecar~10.1.0.9~client.default~default.svc.cluster.local",
		map[string]any{"NETWORK": "network1", "CLUSTER_ID": "cluster1"}, echo, 2,
		[]string{"10.1.0.1:8080 w=1", "10.2.0.1:8080 w=1"})
	var got struct {
		Service struct {
			VIPs map[string][]string `json:"vips"`
		} `json:"service"`
	}
	h.getJSON("/debug/endpointz?host="+echo, &got)
	if vips := got.Service.VIPs["cluster1"]; !slices.Equal(vips, []string{"10.96.0.10"}) {
		t.Errorf("merged VIPs = %v, want kubernetes' 10.96.0.10 in cluster1", got.Service.VIPs)
	}
}

// TestExampleOneCluster runs examples/one-cluster with two real API
// servers: the primary from the kubeconfig, and a member cluster that
// joins at run time through a remote secret in istio-system. A client of
// cluster1 gets the endpoints of both. The example's allowed_servers is
// widened to the testbed's loopback servers; the rest is as written.
func TestExampleOneCluster(t *testing.T) {
	k1, _, ns := twoClusters(t)
	h := startHostFile(t, readExample(t, "one-cluster",
		`"/etc/estuary/kubeconfig"`, strconv.Quote(k1.Kubeconfig),
		`allowed_servers = [`, `allowed_servers = ["127.0.0.0/8", `))
	host := "echo." + ns + ".svc.cluster.local"
	eventuallyEndpoints(t, h, "sidecar~10.1.0.9~client."+ns+"~"+ns+".svc.cluster.local",
		map[string]any{"NETWORK": "network1", "CLUSTER_ID": "cluster1"}, host, 2,
		[]string{"10.1.0.1:8080 w=1", "10.2.0.1:8080 w=1"})
}

// TestExampleServiceEntry runs examples/serviceentry with a directory of
// ServiceEntries and a real API server holding Istio's CRDs: entries from
// both sources are served, the WorkloadEntries of the watched namespace
// included, on the VMs' network.
func TestExampleServiceEntry(t *testing.T) {
	k := testbed.StartKube(t)
	k.InstallIstioCRDs(t, "serviceentries.networking.istio.io", "workloadentries.networking.istio.io")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "legacy.yaml"), []byte(`apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: legacy, namespace: vms}
spec:
  hosts: [legacy.example.com]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 8080, name: grpc, protocol: GRPC}]
  endpoints: [{address: 10.30.0.1}]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(k.RestConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := k.Client().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "vms"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	gv := schema.GroupVersion{Group: "networking.istio.io", Version: "v1"}
	for _, o := range []map[string]any{
		{"kind": "ServiceEntry", "metadata": map[string]any{"name": "vm-app", "namespace": "vms"}, "spec": map[string]any{
			"hosts": []any{"vm-app.example.com"}, "location": "MESH_INTERNAL", "resolution": "STATIC",
			"ports":            []any{map[string]any{"number": int64(8080), "name": "grpc", "protocol": "GRPC"}},
			"workloadSelector": map[string]any{"labels": map[string]any{"app": "vm-app"}}}},
		{"kind": "WorkloadEntry", "metadata": map[string]any{"name": "vm-1", "namespace": "vms"}, "spec": map[string]any{
			"address": "10.30.0.2", "labels": map[string]any{"app": "vm-app"}}},
	} {
		o["apiVersion"] = gv.String()
		u := &unstructured.Unstructured{Object: o}
		res := map[string]string{"ServiceEntry": "serviceentries", "WorkloadEntry": "workloadentries"}[u.GetKind()]
		if _, err := dyn.Resource(gv.WithResource(res)).Namespace("vms").Create(ctx, u, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	h := startHostFile(t, readExample(t, "serviceentry",
		`"/etc/estuary/serviceentries"`, strconv.Quote(dir),
		`"/etc/estuary/kubeconfig"`, strconv.Quote(k.Kubeconfig)))
	md := map[string]any{"NETWORK": "vm-network", "CLUSTER_ID": "vms"}
	id := "sidecar~10.30.0.9~client.vms~vms.svc.cluster.local"
	eventuallyEndpoints(t, h, id, md, "legacy.example.com", 1, []string{"10.30.0.1:8080 w=1"})
	eventuallyEndpoints(t, h, id, md, "vm-app.example.com", 1, []string{"10.30.0.2:8080 w=1"})
	// The plugin's network setting places them (its cluster is not
	// mesh.cluster_id, and it names its own network).
	out := h.estuary("explain", "endpoint", "--node", id, "--cluster", model.ClusterName(8080, "", "vm-app.example.com"), "--json")
	var ex pipeline.Explanation
	if err := json.Unmarshal(out, &ex); err != nil {
		t.Fatalf("explain: %v\n%s", err, out)
	}
	if len(ex.Endpoints) != 1 || ex.Endpoints[0].Network != "vm-network" || ex.Endpoints[0].Rule != pipeline.RuleRegistryDefault {
		t.Errorf("explain: %+v, want 10.30.0.2 on vm-network by the registry default", ex.Endpoints)
	}
}

// TestEveryExampleRuns: each configuration under examples/ has a test
// above that runs it; a new example without one fails here.
func TestEveryExampleRuns(t *testing.T) {
	files, err := filepath.Glob("../../../examples/*/plugins.hcl")
	if err != nil {
		t.Fatal(err)
	}
	run := map[string]bool{"two-networks": true, "consul-kubernetes": true, "one-cluster": true, "serviceentry": true}
	for _, f := range files {
		if name := filepath.Base(filepath.Dir(f)); !run[name] {
			t.Errorf("examples/%s/plugins.hcl is not run by any test", name)
		}
	}
}
