package kubernetes

import (
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/sdktest"
	"github.com/estuary-mesh/estuary/testbed"
)

// mcsClient writes ServiceExports and ServiceImports as an MCS controller
// and its users do.
type mcsClient struct {
	t   *testing.T
	dyn dynamic.Interface
}

func newMCSClient(t *testing.T, k *testbed.Kube) mcsClient {
	dyn, err := dynamic.NewForConfig(k.RestConfig())
	if err != nil {
		t.Fatal(err)
	}
	return mcsClient{t, dyn}
}

func (m mcsClient) export(ns, name string) {
	m.t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ServiceExport",
		"metadata": map[string]any{"name": name, "namespace": ns},
	}}
	if _, err := m.dyn.Resource(gvrServiceExport).Namespace(ns).Create(ctxb, u, metav1.CreateOptions{}); err != nil {
		m.t.Fatalf("create ServiceExport %s/%s: %v", ns, name, err)
	}
}

func (m mcsClient) importService(ns, name string, ips ...string) {
	m.t.Helper()
	var list []any
	for _, ip := range ips {
		list = append(list, ip)
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ServiceImport",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec": map[string]any{
			"type":  "ClusterSetIP",
			"ips":   list,
			"ports": []any{map[string]any{"name": "http", "port": int64(80), "protocol": "TCP"}},
		},
	}}
	if _, err := m.dyn.Resource(gvrServiceImport).Namespace(ns).Create(ctxb, u, metav1.CreateOptions{}); err != nil {
		m.t.Fatalf("create ServiceImport %s/%s: %v", ns, name, err)
	}
}

func (m mcsClient) delete(kind string, ns, name string) {
	m.t.Helper()
	res := gvrServiceExport
	if kind == "import" {
		res = gvrServiceImport
	}
	if err := m.dyn.Resource(res).Namespace(ns).Delete(ctxb, name, metav1.DeleteOptions{}); err != nil {
		m.t.Fatalf("delete %s %s/%s: %v", res.Resource, ns, name, err)
	}
}

// clusterSet is what the host would merge for a hostname: each instance's
// service and endpoints, by cluster.
type clusterSet struct {
	services  map[string]*sdk.Service
	endpoints []string // addresses, over every instance, sorted
}

func mergedView(r *sdktest.Replica, host string, clusters ...string) clusterSet {
	out := clusterSet{services: map[string]*sdk.Service{}}
	for _, c := range clusters {
		in := instance(r, c)
		if in == nil || in.Services[host] == nil {
			continue
		}
		out.services[c] = in.Services[host]
		out.endpoints = append(out.endpoints, endpointAddrs(in, host)...)
	}
	slices.Sort(out.endpoints)
	return out
}

// TestMCS: two clusters with the MCS CRDs installed from the upstream
// module and the same Service (namespace sameness). The clusterset host
// appears when one cluster exports the Service, with that cluster's
// endpoints only; gains the other's when it exports too; and disappears
// when neither does.
func TestMCS(t *testing.T) {
	ks := testbed.StartKubes(t, 2)
	var ms [2]mcsClient
	for i, k := range ks {
		k.InstallMCSCRDs(t)
		ms[i] = newMCSClient(t, k)
	}
	k1, k2 := kube{t, ks[0].Client()}, kube{t, ks[1].Client()}
	k1.namespaceNamed("istio-system", nil)
	const ns = "shop"
	for i, k := range []kube{k1, k2} {
		k.namespaceNamed(ns, nil)
		k.service(&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: ns},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
		})
		k.slice(endpointSlice(ns, "echo-1", "echo", map[string]int32{"http": 8080}, epSpec{addr: fmt.Sprintf("10.8%d.0.1", i+1)}))
	}
	token := k2.readerToken("default", "reader")
	local, set := "echo."+ns+".svc.cluster.local", "echo."+ns+".svc.clusterset.local"

	rec := startRecorder(t, fmt.Sprintf(`
kubeconfig = %q
cluster_id = "cluster1"
mcs = true
allowed_servers = ["127.0.0.0/8"]
`, ks[0].Kubeconfig), sdk.MeshSettings{DomainSuffix: "cluster.local"})
	if _, err := k1.c.CoreV1().Secrets("istio-system").Create(ctxb, remoteSecret("istio-system", "remote-cluster2",
		map[string]string{"cluster2": remoteKubeconfig("cluster2", ks[1].Server, ks[1].CAData, token)}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rec.waitFor(t, "both clusters synced", func(r *sdktest.Replica) bool {
		a, b := instance(r, "cluster1"), instance(r, "cluster2")
		return a != nil && a.Synced && b != nil && b.Synced && len(b.Endpoints[local]) == 1
	})
	rec.with(func(r *sdktest.Replica) {
		if v := mergedView(r, set, "cluster1", "cluster2"); len(v.services) != 0 {
			t.Errorf("%s exists before any export: %+v", set, v.services)
		}
		if s := instance(r, "cluster1").Services[local]; s.ClusterLocal {
			t.Errorf("%s is cluster-local without clusterset_only", local)
		}
	})
	waitSet := func(what string, want []string, vips map[string][]string) {
		t.Helper()
		rec.waitFor(t, what, func(r *sdktest.Replica) bool {
			v := mergedView(r, set, "cluster1", "cluster2")
			if !slices.Equal(v.endpoints, want) {
				return false
			}
			got := map[string][]string{}
			for _, s := range v.services {
				if s.ClusterLocal || s.Hostname != set || len(s.Ports) != 1 || s.Ports[0].Number != 80 {
					return false
				}
				for vc, ips := range s.VIPs {
					got[vc] = ips
				}
			}
			if len(got) != len(vips) {
				return false
			}
			for c, ips := range vips {
				if !slices.Equal(got[c], ips) {
					return false
				}
			}
			return true
		})
	}

	// Exported in cluster1 only: only cluster1's endpoints, though
	// cluster2 has the Service too.
	ms[0].export(ns, "echo")
	waitSet("exported in cluster1", []string{"10.81.0.1"}, nil)
	// An MCS controller imports it into cluster2 with a clusterset IP:
	// cluster2 reports the host with that VIP and none of its endpoints.
	ms[1].importService(ns, "echo", "10.99.0.10")
	waitSet("imported into cluster2", []string{"10.81.0.1"}, map[string][]string{"cluster2": {"10.99.0.10"}})
	rec.with(func(r *sdktest.Replica) {
		if eps := instance(r, "cluster2").Endpoints[set]; len(eps) != 0 {
			t.Errorf("cluster2 gives %s endpoints %v without exporting it", set, endpointAddrs(instance(r, "cluster2"), set))
		}
	})

	// Exported in both: both clusters' endpoints.
	ms[1].export(ns, "echo")
	waitSet("exported in both", []string{"10.81.0.1", "10.82.0.1"}, map[string][]string{"cluster2": {"10.99.0.10"}})
	// The cluster.local host is unchanged all along: each cluster's own.
	rec.with(func(r *sdktest.Replica) {
		if got := mergedView(r, local, "cluster1", "cluster2").endpoints; !slices.Equal(got, []string{"10.81.0.1", "10.82.0.1"}) {
			t.Errorf("%s endpoints = %v", local, got)
		}
	})

	// A cluster's endpoints follow its slices into the clusterset host.
	k1.updateSlice(ns, "echo-1", func(s *discoveryv1.EndpointSlice) { s.Endpoints[0].Addresses = []string{"10.81.0.2"} })
	waitSet("cluster1's endpoint moved", []string{"10.81.0.2", "10.82.0.1"}, map[string][]string{"cluster2": {"10.99.0.10"}})

	// cluster1 stops exporting: cluster2's endpoints only.
	ms[0].delete("export", ns, "echo")
	waitSet("unexported in cluster1", []string{"10.82.0.1"}, map[string][]string{"cluster2": {"10.99.0.10"}})
	// Unexported everywhere, the import withdrawn: the host disappears.
	ms[1].delete("export", ns, "echo")
	ms[1].delete("import", ns, "echo")
	rec.waitFor(t, set+" gone", func(r *sdktest.Replica) bool {
		return len(mergedView(r, set, "cluster1", "cluster2").services) == 0
	})

	// clusterset_only: cluster.local becomes cluster-local; the
	// clusterset host does not.
	ms[0].export(ns, "echo")
	if diags := rec.configure(t, fmt.Sprintf(`
kubeconfig = %q
cluster_id = "cluster1"
mcs = true
clusterset_only = true
allowed_servers = ["127.0.0.0/8"]
`, ks[0].Kubeconfig), sdk.MeshSettings{DomainSuffix: "cluster.local"}); diags.HasErrors() {
		t.Fatal(diags)
	}
	rec.waitFor(t, "cluster.local cluster-local in both clusters, clusterset.local not", func(r *sdktest.Replica) bool {
		for _, c := range []string{"cluster1", "cluster2"} {
			in := instance(r, c)
			if in == nil || in.Services[local] == nil || !in.Services[local].ClusterLocal {
				return false
			}
		}
		s := instance(r, "cluster1").Services[set]
		return s != nil && !s.ClusterLocal
	})
}

// TestMCSWithoutCRDs: with mcs on, a cluster that does not serve the MCS
// API syncs all the same, and says why nothing of it is exported.
func TestMCSWithoutCRDs(t *testing.T) {
	tb := testbed.StartKube(t)
	rec := startRecorder(t, fmt.Sprintf("kubeconfig = %q\ncluster_id = \"c1\"\nmcs = true\n", tb.Kubeconfig), sdk.MeshSettings{})
	rec.waitFor(t, "synced, with a notice", func(r *sdktest.Replica) bool {
		in := instance(r, "c1")
		return in != nil && in.Synced && in.Health != nil && in.Health.Healthy && hasNotice(in, "MCS", "does not serve multicluster.x-k8s.io/v1alpha1")
	})
}
