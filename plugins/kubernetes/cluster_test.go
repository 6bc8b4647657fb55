package kubernetes

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/istio"
	"github.com/estuary-mesh/estuary/sdk/sdktest"
	"github.com/estuary-mesh/estuary/testbed"
)

const waitTimeout = 60 * time.Second

func findEndpoint(in *sdktest.Instance, host, addr string) *sdk.Endpoint {
	if in == nil {
		return nil
	}
	for i, e := range in.Endpoints[host] {
		if e.Address == addr {
			return &in.Endpoints[host][i]
		}
	}
	return nil
}

// TestPrimaryCluster creates Services, EndpointSlices, Pods, Nodes and
// Namespaces with client-go and checks what the instance reports, then
// changes and deletes them.
func TestPrimaryCluster(t *testing.T) {
	tb := testbed.StartKube(t)
	k := kube{t, tb.Client()}
	watched := map[string]string{"estuary.io/test": "watched"}

	k.node("n1", map[string]string{corev1.LabelTopologyRegion: "eu", corev1.LabelTopologyZone: "eu-1", istio.LabelSubzone: "rack1"})
	k.node("n2", map[string]string{corev1.LabelTopologyRegion: "us", corev1.LabelTopologyZone: "us-1"})
	ns := k.namespace("apps", watched)
	hidden := k.namespace("hidden", nil)
	p1Labels := map[string]string{"app": "echo", "version": "v1", istio.LabelTLSMode: "istio"}
	k.pod(ns, "p1", p1Labels, "n1", "echo-sa")
	k.pod(ns, "p2", map[string]string{"app": "echo", istio.LabelNetwork: "net-pod"}, "n2", "")
	k.pod(ns, "p3", map[string]string{"app": "echo"}, "n1", "echo-sa")
	echo := k.service(&corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: ns, Labels: map[string]string{"app": "echo"}},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{
			{Name: "http", Port: 80},
			{Name: "api", Port: 9090, AppProtocol: ptr.To("grpc")},
		}},
	})
	slicePorts := map[string]int32{"http": 8080, "api": 9000}
	k.slice(endpointSlice(ns, "echo-1", "echo", slicePorts,
		epSpec{addr: "10.10.0.1", pod: "p1", node: "n1", ready: ready(true)},
		epSpec{addr: "10.10.0.2", pod: "p2"}, // node from the pod, ready unset
		epSpec{addr: "10.10.0.3", pod: "p3", node: "n1", ready: ready(false)},
	))
	k.service(&corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: ns},
		Spec:       corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Ports: []corev1.ServicePort{{Name: "tcp-db", Port: 5432}}},
	})
	k.slice(endpointSlice(ns, "db-1", "db", map[string]int32{"tcp-db": 5432}, epSpec{addr: "10.10.0.3", pod: "p3", node: "n1"}))
	k.service(&corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "ext", Namespace: ns},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "api.example.com", Ports: []corev1.ServicePort{{Name: "https", Port: 443}}},
	})
	k.service(&corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "unlisted", Namespace: hidden},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
	})

	h := sdktest.Start(t, Factory)
	h.Configure(t, fmt.Sprintf(`
kubeconfig = %q
cluster_id = "cluster1"
network = "net-cfg"
discovery_namespaces = ["estuary.io/test=watched"]
`, tb.Kubeconfig), sdk.MeshSettings{DomainSuffix: "cluster.local"})
	w := h.Watch(t)
	w.WaitFor(t, waitTimeout, "cluster1 synced", sdktest.AllSynced)

	echoHost := "echo." + ns + ".svc.cluster.local"
	dbHost := "db." + ns + ".svc.cluster.local"
	extHost := "ext." + ns + ".svc.cluster.local"
	// The API server may add labels (the node's topology) to a bound pod.
	p1, err := k.c.CoreV1().Pods(ns).Get(ctxb, "p1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w.With(func(r *sdktest.Replica) {
		in := instance(r, "cluster1")
		if in == nil {
			t.Fatalf("no Kubernetes/cluster1 instance:\n%s", r)
		}
		if want := (sdk.InstanceProperties{ClusterScoped: true, DefaultNetwork: "net-cfg"}); in.Properties != want {
			t.Errorf("properties = %+v, want %+v", in.Properties, want)
		}
		if in.Health == nil || !in.Health.Healthy {
			t.Errorf("health = %+v, want healthy", in.Health)
		}
		svc := in.Services[echoHost]
		if svc == nil {
			t.Fatalf("no service %s; have %v", echoHost, slices.Collect(maps.Keys(in.Services)))
		}
		wantPorts := []sdk.Port{{Name: "http", Number: 80, Protocol: "HTTP"}, {Name: "api", Number: 9090, Protocol: "GRPC"}}
		if !slices.Equal(svc.Ports, wantPorts) {
			t.Errorf("ports = %+v, want %+v", svc.Ports, wantPorts)
		}
		if got := svc.VIPs["cluster1"]; len(got) != 1 || got[0] != echo.Spec.ClusterIP {
			t.Errorf("VIPs = %v, want cluster1: [%s]", svc.VIPs, echo.Spec.ClusterIP)
		}
		if svc.Namespace != ns || svc.Name != "echo" || svc.Labels["app"] != "echo" || svc.Resolution != sdk.ResolutionStatic {
			t.Errorf("service = %+v", svc)
		}
		if got := endpointAddrs(in, echoHost); !slices.Equal(got, []string{"10.10.0.1", "10.10.0.2"}) {
			t.Errorf("endpoints = %v, want the two ready ones", got)
		}
		want1 := sdk.Endpoint{
			Address: "10.10.0.1", TargetPorts: map[string]uint32{"http": 8080, "api": 9000}, Labels: p1.Labels,
			Network: "net-cfg", Locality: sdk.Locality{Region: "eu", Zone: "eu-1", Subzone: "rack1"}, TLSMode: sdk.TLSModeIstio,
			ServiceAccount: "spiffe://cluster.local/ns/" + ns + "/sa/echo-sa", WorkloadName: "p1",
		}
		if e := findEndpoint(in, echoHost, "10.10.0.1"); e == nil || !e.Equal(&want1) {
			t.Errorf("endpoint p1 =\n%+v\nwant\n%+v", e, want1)
		}
		if e := findEndpoint(in, echoHost, "10.10.0.2"); e == nil || e.Network != "net-pod" || e.TLSMode != sdk.TLSModeDisabled ||
			e.Locality != (sdk.Locality{Region: "us", Zone: "us-1"}) || e.ServiceAccount != "" {
			t.Errorf("endpoint p2 = %+v, want network net-pod, locality us/us-1, no mTLS, no identity", e)
		}
		if db := in.Services[dbHost]; db == nil || db.Resolution != sdk.ResolutionPassthrough || len(db.VIPs) != 0 ||
			!slices.Equal(endpointAddrs(in, dbHost), []string{"10.10.0.3"}) {
			t.Errorf("headless service = %+v, endpoints %v", db, endpointAddrs(in, dbHost))
		}
		if ext := in.Services[extHost]; ext == nil || ext.Resolution != sdk.ResolutionDNS || !ext.MeshExternal ||
			!slices.Equal(endpointAddrs(in, extHost), []string{"api.example.com"}) {
			t.Errorf("ExternalName service = %+v, endpoints %v", ext, endpointAddrs(in, extHost))
		}
		if svc := in.Services["unlisted."+hidden+".svc.cluster.local"]; svc != nil {
			t.Errorf("service of an unselected namespace is reported: %+v", svc)
		}
	})

	steps := []struct {
		name   string
		change func()
		done   func(in *sdktest.Instance) bool
	}{
		{"pod labels", func() {
			p, err := k.c.CoreV1().Pods(ns).Get(ctxb, "p1", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			p.Labels["version"] = "v2"
			if _, err := k.c.CoreV1().Pods(ns).Update(ctxb, p, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}, func(in *sdktest.Instance) bool {
			e := findEndpoint(in, echoHost, "10.10.0.1")
			return e != nil && e.Labels["version"] == "v2"
		}},
		{"node locality", func() {
			k.updateNode("n1", func(n *corev1.Node) { n.Labels[corev1.LabelTopologyZone] = "eu-2" })
		}, func(in *sdktest.Instance) bool {
			e := findEndpoint(in, echoHost, "10.10.0.1")
			return e != nil && e.Locality == sdk.Locality{Region: "eu", Zone: "eu-2", Subzone: "rack1"}
		}},
		{"system namespace network", func() {
			k.namespaceNamed("istio-system", map[string]string{istio.LabelNetwork: "net-sys"})
		}, func(in *sdktest.Instance) bool {
			e1, e2 := findEndpoint(in, echoHost, "10.10.0.1"), findEndpoint(in, echoHost, "10.10.0.2")
			return in.Properties.DefaultNetwork == "net-sys" && e1 != nil && e1.Network == "net-sys" && e2 != nil && e2.Network == "net-pod"
		}},
		{"endpoint readiness", func() {
			k.updateSlice(ns, "echo-1", func(s *discoveryv1.EndpointSlice) {
				s.Endpoints[1].Conditions.Ready = ready(false)
				s.Endpoints[2].Conditions.Ready = ready(true)
			})
		}, func(in *sdktest.Instance) bool {
			return slices.Equal(endpointAddrs(in, echoHost), []string{"10.10.0.1", "10.10.0.3"})
		}},
		{"service ports", func() {
			k.updateService(ns, "echo", func(s *corev1.Service) {
				s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "http2-alt", Port: 8081})
			})
		}, func(in *sdktest.Instance) bool {
			s := in.Services[echoHost]
			return s != nil && len(s.Ports) == 3 && s.Ports[2] == sdk.Port{Name: "http2-alt", Number: 8081, Protocol: "HTTP2"}
		}},
		{"namespace selected", func() {
			k.labelNamespace(hidden, watched)
		}, func(in *sdktest.Instance) bool {
			return in.Services["unlisted."+hidden+".svc.cluster.local"] != nil
		}},
		{"namespace unselected", func() {
			k.labelNamespace(hidden, nil)
		}, func(in *sdktest.Instance) bool {
			return in.Services["unlisted."+hidden+".svc.cluster.local"] == nil
		}},
		{"slice deleted", func() {
			if err := k.c.DiscoveryV1().EndpointSlices(ns).Delete(ctxb, "echo-1", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}, func(in *sdktest.Instance) bool {
			return in.Services[echoHost] != nil && len(in.Endpoints[echoHost]) == 0
		}},
		{"service deleted", func() {
			if err := k.c.CoreV1().Services(ns).Delete(ctxb, "echo", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}, func(in *sdktest.Instance) bool {
			_, eps := in.Endpoints[echoHost]
			return in.Services[echoHost] == nil && !eps && in.Services[dbHost] != nil
		}},
	}
	for _, s := range steps {
		s.change()
		w.WaitFor(t, waitTimeout, s.name, func(r *sdktest.Replica) bool { return s.done(instance(r, "cluster1")) })
	}
}

// TestConformance runs the SDK's conformance suite against a real API server.
func TestConformance(t *testing.T) {
	tb := testbed.StartKube(t)
	k := kube{t, tb.Client()}
	ns := k.namespace("conf", nil)
	k.service(&corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: ns},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "grpc", Port: 7070}}},
	})
	k.slice(endpointSlice(ns, "echo-1", "echo", map[string]int32{"grpc": 17070}, epSpec{addr: "10.11.0.1"}, epSpec{addr: "10.11.0.2"}))
	config := fmt.Sprintf("kubeconfig = %q\n", tb.Kubeconfig)
	host := "echo." + ns + ".svc.cluster.local"
	sdktest.Run(t, sdktest.Suite{
		Factory:  Factory,
		Config:   config,
		Reconfig: config + "network = \"net-b\"\n",
		Check: func(t testing.TB, r *sdktest.Replica) {
			in := instance(r, "Kubernetes")
			if in == nil {
				t.Fatalf("no Kubernetes/Kubernetes instance:\n%s", r)
			}
			if got := endpointAddrs(in, host); !slices.Equal(got, []string{"10.11.0.1", "10.11.0.2"}) {
				t.Errorf("endpoints of %s = %v", host, got)
			}
		},
		Change: func(t testing.TB) {
			k := kube{t, tb.Client()}
			k.updateSlice(ns, "echo-1", func(s *discoveryv1.EndpointSlice) {
				s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{"10.11.0.3"}})
			})
		},
		Changed: func(r *sdktest.Replica) bool {
			return len(endpointAddrs(instance(r, "Kubernetes"), host)) == 3
		},
	})
}

// TestReconfigure changes the config of a running plugin: a bad config
// keeps the running one, a new network keeps the instance (its endpoints
// never vanish) and a new cluster ID replaces it.
func TestReconfigure(t *testing.T) {
	tb := testbed.StartKube(t)
	k := kube{t, tb.Client()}
	ns := k.namespace("reconf", nil)
	k.service(&corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: ns},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
	})
	k.slice(endpointSlice(ns, "echo-1", "echo", map[string]int32{"http": 8080}, epSpec{addr: "10.12.0.1"}))
	host := "echo." + ns + ".svc.cluster.local"
	mesh := sdk.MeshSettings{DomainSuffix: "cluster.local"}
	config := func(clusterID, network string) string {
		return fmt.Sprintf("kubeconfig = %q\ncluster_id = %q\nnetwork = %q\n", tb.Kubeconfig, clusterID, network)
	}
	epNetwork := func(r *sdktest.Replica, cluster string) string {
		if e := findEndpoint(instance(r, cluster), host, "10.12.0.1"); e != nil {
			return e.Network
		}
		return ""
	}
	rec := startRecorder(t, config("c1", "n1"), mesh)
	rec.waitFor(t, "c1 synced", func(r *sdktest.Replica) bool { return epNetwork(r, "c1") == "n1" })
	rec.invariant(t, func(r *sdktest.Replica) error {
		if len(endpointAddrs(instance(r, "c1"), host)) != 1 {
			return fmt.Errorf("c1 lost the endpoint of %s", host)
		}
		return nil
	})

	diags := rec.configure(t, config("c1", "n1")+"remote_sync_timeout = \"-1s\"\n", mesh)
	if !diags.HasErrors() || !slices.Equal(diags[0].Path, []string{"remote_sync_timeout"}) {
		t.Errorf("bad config: diagnostics %+v, want an error at remote_sync_timeout", diags)
	}
	if diags := rec.configure(t, config("c1", "n1"), mesh); diags.HasErrors() {
		t.Fatalf("same config again: %v", diags)
	}
	if diags := rec.configure(t, config("c1", "n2"), mesh); diags.HasErrors() {
		t.Fatalf("new network: %v", diags)
	}
	rec.waitFor(t, "endpoints on the new network", func(r *sdktest.Replica) bool {
		in := instance(r, "c1")
		return epNetwork(r, "c1") == "n2" && in.Properties.DefaultNetwork == "n2"
	})
	rec.invariant(t, nil)

	if diags := rec.configure(t, config("c2", "n2"), mesh); diags.HasErrors() {
		t.Fatalf("new cluster ID: %v", diags)
	}
	rec.waitFor(t, "c1 replaced by c2", func(r *sdktest.Replica) bool {
		in := instance(r, "c2")
		return instance(r, "c1") == nil && in != nil && in.Synced && epNetwork(r, "c2") == "n2"
	})
}
