package serviceentry

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/connrotation"
	"sigs.k8s.io/yaml"

	"github.com/estuary-mesh/estuary/sdk/sdktest"
	"github.com/estuary-mesh/estuary/testbed"
)

var (
	crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	seGVR  = schema.GroupVersionResource{Group: istioGroup, Version: "v1", Resource: "serviceentries"}
	weGVR  = schema.GroupVersionResource{Group: istioGroup, Version: "v1", Resource: "workloadentries"}
	// The same resource through an alias version.
	weAlphaGVR = schema.GroupVersionResource{Group: istioGroup, Version: "v1alpha3", Resource: "workloadentries"}
)

// kubeDyn is a dynamic client of a test cluster, on connections of its
// own that are closed when the test ends.
type kubeDyn struct {
	t   *testing.T
	dyn dynamic.Interface
}

func newKubeDyn(t *testing.T, cfg *rest.Config) *kubeDyn {
	t.Helper()
	d := connrotation.NewDialer((&net.Dialer{Timeout: 10 * time.Second}).DialContext)
	t.Cleanup(d.CloseAll)
	cfg.Dial = d.DialContext
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &kubeDyn{t: t, dyn: dyn}
}

func (k *kubeDyn) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	k.t.Cleanup(cancel)
	return ctx
}

// apply creates or updates an object given as YAML (server-side apply).
func (k *kubeDyn) apply(gvr schema.GroupVersionResource, doc string) {
	k.t.Helper()
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
		k.t.Fatalf("test object: %v", err)
	}
	_, err := k.dyn.Resource(gvr).Namespace(u.GetNamespace()).Apply(k.ctx(), u.GetName(), u, metav1.ApplyOptions{FieldManager: "serviceentry-test", Force: true})
	if err != nil {
		k.t.Fatalf("apply %s %s/%s: %v", gvr.Resource, u.GetNamespace(), u.GetName(), err)
	}
}

func (k *kubeDyn) delete(gvr schema.GroupVersionResource, ns, name string) {
	k.t.Helper()
	if err := k.dyn.Resource(gvr).Namespace(ns).Delete(k.ctx(), name, metav1.DeleteOptions{}); err != nil {
		k.t.Fatalf("delete %s %s/%s: %v", gvr.Resource, ns, name, err)
	}
}

// TestKubernetes runs the plugin against a real kube-apiserver, together
// with a directory: the CRDs are installed after the plugin starts;
// ServiceEntries and WorkloadEntries are then created, updated and deleted,
// one is made invalid, and the API server goes away and comes back. The
// instance follows each step.
func TestKubernetes(t *testing.T) {
	savedPoll, savedRetry, savedProbe := crdPoll, kubeRetryFirst, kubeProbe
	crdPoll, kubeRetryFirst, kubeProbe = 200*time.Millisecond, 200*time.Millisecond, 200*time.Millisecond
	t.Cleanup(func() { crdPoll, kubeRetryFirst, kubeProbe = savedPoll, savedRetry, savedProbe })

	k := testbed.StartKube(t)
	kd := newKubeDyn(t, k.RestConfig())
	const ns, otherNS = "se-test", "se-unwatched"
	for _, n := range []string{ns, otherNS} {
		if _, err := k.Client().CoreV1().Namespaces().Create(kd.ctx(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	writeFile(t, dir, "file.yaml", staticEntry("from-file", "file.example.com", "10.9.0.1"))

	h := sdktest.Start(t, Factory)
	h.Configure(t, fmt.Sprintf("cluster_id = \"k1\"\ndir = %q\nkubernetes {\n  kubeconfig = %q\n  namespaces = [%q]\n}\n", dir, k.Kubeconfig, ns), mesh)
	w := h.Watch(t)
	w.WaitFor(t, wait, "synced without the CRDs, files served", func(r *sdktest.Replica) bool {
		in := instance(r, "k1")
		return in != nil && in.Synced && len(addresses(in, "file.example.com")) == 1 &&
			hasNotice(in, "CRD serviceentries.networking.istio.io", "not served by the API server")
	})

	k.InstallIstioCRDs(t, "serviceentries."+istioGroup, "workloadentries."+istioGroup)
	kd.apply(seGVR, `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: static, namespace: se-test}
spec:
  hosts: [static.example.com]
  addresses: [240.0.0.1]
  location: MESH_INTERNAL
  ports: [{number: 80, name: http, protocol: HTTP, targetPort: 8080}]
  resolution: STATIC
  endpoints:
  - {address: 10.0.0.1, labels: {version: v1}, ports: {http: 9090}}
`)
	kd.apply(seGVR, `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: vms, namespace: se-test}
spec:
  hosts: [vms.example.com]
  location: MESH_INTERNAL
  ports: [{number: 80, name: http, protocol: HTTP}]
  resolution: STATIC
  workloadSelector: {labels: {app: vm}}
`)
	for _, we := range []string{"vm-1:10.1.0.1:vm", "vm-2:10.1.0.2:vm", "other:10.1.0.3:other"} {
		f := strings.Split(we, ":")
		kd.apply(weGVR, fmt.Sprintf("apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\nmetadata: {name: %s, namespace: se-test}\nspec: {address: %s, labels: {app: %s}, serviceAccount: vm}\n", f[0], f[1], f[2]))
	}
	kd.apply(seGVR, `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: unwatched, namespace: se-unwatched}
spec:
  hosts: [unwatched.example.com]
  ports: [{number: 80, name: http}]
  resolution: DNS
`)

	w.WaitFor(t, wait, "the cluster's objects", func(r *sdktest.Replica) bool {
		in := instance(r, "k1")
		svc := in.Services["static.example.com"]
		eps := in.Endpoints["static.example.com"]
		return svc != nil && slices.Equal(svc.VIPs["k1"], []string{"240.0.0.1"}) && svc.Namespace == ns &&
			len(eps) == 1 && eps[0].TargetPorts["http"] == 9090 && eps[0].Labels["version"] == "v1" &&
			slices.Equal(addresses(in, "vms.example.com"), []string{"10.1.0.1", "10.1.0.2"}) &&
			len(addresses(in, "file.example.com")) == 1 && len(in.Health.Notices) == 0
	})
	w.With(func(r *sdktest.Replica) {
		in := instance(r, "k1")
		if _, ok := in.Services["unwatched.example.com"]; ok {
			t.Errorf("an entry of an unwatched namespace is served")
		}
		for _, e := range in.Endpoints["vms.example.com"] {
			if e.WorkloadName == "" || e.ServiceAccount != "vm" || e.TLSMode.String() != "istio" {
				t.Errorf("endpoint from a WorkloadEntry = %+v, want its name, service account vm and TLS mode istio", e)
			}
		}
	})

	steps := []struct {
		name   string
		do     func()
		follow func(in *sdktest.Instance) bool
	}{
		{"update a ServiceEntry", func() {
			kd.apply(seGVR, `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: static, namespace: se-test}
spec:
  hosts: [static.example.com]
  addresses: [240.0.0.1]
  location: MESH_INTERNAL
  ports: [{number: 80, name: http, protocol: HTTP, targetPort: 8080}]
  resolution: STATIC
  endpoints:
  - {address: 10.0.0.1, labels: {version: v1}, ports: {http: 9090}}
  - {address: 10.0.0.2}
`)
		}, func(in *sdktest.Instance) bool {
			eps := in.Endpoints["static.example.com"]
			return len(eps) == 2 && eps[1].Address == "10.0.0.2" && eps[1].TargetPorts["http"] == 8080
		}},
		{"a WorkloadEntry stops matching", func() {
			kd.apply(weGVR, "apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\nmetadata: {name: vm-2, namespace: se-test}\nspec: {address: 10.1.0.2, labels: {app: retired}}\n")
		}, func(in *sdktest.Instance) bool {
			return slices.Equal(addresses(in, "vms.example.com"), []string{"10.1.0.1"})
		}},
		{"a WorkloadEntry is added, in the v1alpha3 version", func() {
			kd.apply(weAlphaGVR, "apiVersion: networking.istio.io/v1alpha3\nkind: WorkloadEntry\nmetadata: {name: vm-3, namespace: se-test}\nspec: {address: 10.1.0.4, labels: {app: vm}}\n")
		}, func(in *sdktest.Instance) bool {
			return slices.Equal(addresses(in, "vms.example.com"), []string{"10.1.0.1", "10.1.0.4"})
		}},
		{"a WorkloadEntry is deleted", func() { kd.delete(weGVR, ns, "vm-1") },
			func(in *sdktest.Instance) bool {
				return slices.Equal(addresses(in, "vms.example.com"), []string{"10.1.0.4"})
			}},
		{"a ServiceEntry turns invalid: its last good version stays", func() {
			kd.apply(seGVR, `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: static, namespace: se-test}
spec:
  hosts: [static.example.com]
  location: MESH_INTERNAL
  ports: [{number: 80, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints:
  - {address: backend.example.com}
`)
		}, func(in *sdktest.Instance) bool {
			return len(in.Endpoints["static.example.com"]) == 2 && hasNotice(in, "ServiceEntry se-test/static (kubernetes)",
				`spec.endpoints[0].address: "backend.example.com" is not an IP address (resolution STATIC); serving its last good version`)
		}},
		{"a ServiceEntry is deleted", func() { kd.delete(seGVR, ns, "static") },
			func(in *sdktest.Instance) bool {
				_, ok := in.Services["static.example.com"]
				return !ok && len(in.Health.Notices) == 0 && len(addresses(in, "vms.example.com")) == 1
			}},
	}
	for _, s := range steps {
		s.do()
		w.WaitFor(t, wait, s.name, func(r *sdktest.Replica) bool {
			in := instance(r, "k1")
			return in != nil && s.follow(in)
		})
	}

	// The API server goes away: the instance turns unhealthy and keeps what
	// it has; back, it catches up with what changed meanwhile.
	k.Stop()
	w.WaitFor(t, wait, "unhealthy while the API server is down", func(r *sdktest.Replica) bool {
		in := instance(r, "k1")
		return !in.Health.Healthy && strings.Contains(in.Health.Message, "kubernetes") &&
			len(addresses(in, "vms.example.com")) == 1 && len(addresses(in, "file.example.com")) == 1
	})
	k.Start()
	kd.apply(weGVR, "apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\nmetadata: {name: vm-5, namespace: se-test}\nspec: {address: 10.1.0.5, labels: {app: vm}}\n")
	w.WaitFor(t, wait, "healthy again and following", func(r *sdktest.Replica) bool {
		in := instance(r, "k1")
		return in.Health.Healthy && slices.Equal(addresses(in, "vms.example.com"), []string{"10.1.0.4", "10.1.0.5"})
	})
}
