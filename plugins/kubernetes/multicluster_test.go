package kubernetes

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/istio"
	"github.com/estuary-mesh/estuary/sdk/sdktest"
	"github.com/estuary-mesh/estuary/testbed"
)

// TestMultiCluster runs two real clusters. Cluster 1 is the primary; a
// remote secret in istioctl's format registers cluster 2. The test rotates
// the secret's token (asserting that no state the host sees lacks cluster
// 2's endpoints), feeds the plugin secrets it must refuse, stops and starts
// cluster 2's API server, and deletes the secret.
func TestMultiCluster(t *testing.T) {
	ks := testbed.StartKubes(t, 2)
	k1, k2 := kube{t, ks[0].Client()}, kube{t, ks[1].Client()}
	k1.namespaceNamed("istio-system", nil)
	k2.namespaceNamed("istio-system", map[string]string{istio.LabelNetwork: "net2"})
	ns2 := k2.namespace("apps", nil)
	k2.service(&corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: ns2},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
	})
	k2.slice(endpointSlice(ns2, "echo-1", "echo", map[string]int32{"http": 8080}, epSpec{addr: "10.20.0.1"}, epSpec{addr: "10.20.0.2"}))
	// The same service in both clusters, for the aggregate.
	var shared [2]*corev1.Service
	for i, k := range []kube{k1, k2} {
		k.namespaceNamed("shared", nil)
		shared[i] = k.service(&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: "shared"},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "grpc", Port: 7070}}},
		})
		k.slice(endpointSlice("shared", "echo-1", "echo", map[string]int32{"grpc": 17070}, epSpec{addr: fmt.Sprintf("10.40.%d.1", i+1)}))
	}
	tokenA := k2.readerToken("istio-system", "reader-a")
	tokenB := k2.readerToken("istio-system", "reader-b")
	echoHost := "echo." + ns2 + ".svc.cluster.local"

	rec := startRecorder(t, fmt.Sprintf(`
kubeconfig = %q
cluster_id = "cluster1"
remote_sync_timeout = "5s"
allowed_servers = ["127.0.0.0/8"]
`, ks[0].Kubeconfig), sdk.MeshSettings{DomainSuffix: "cluster.local"})
	rec.waitFor(t, "cluster1 synced", func(r *sdktest.Replica) bool { in := instance(r, "cluster1"); return in != nil && in.Synced })

	secrets := k1.c.CoreV1().Secrets("istio-system")
	create := func(s *corev1.Secret) {
		t.Helper()
		if _, err := secrets.Create(ctxb, s, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create secret %s: %v", s.Name, err)
		}
	}
	const secretName = "istio-remote-secret-cluster2"
	create(remoteSecret("istio-system", secretName, map[string]string{"cluster2": remoteKubeconfig("cluster2", ks[1].Server, ks[1].CAData, tokenA)}))

	t.Run("add", func(t *testing.T) {
		rec.waitFor(t, "cluster2 synced with its endpoints", func(r *sdktest.Replica) bool {
			in := instance(r, "cluster2")
			return in != nil && in.Synced && len(in.Endpoints[echoHost]) == 2
		})
		rec.with(func(r *sdktest.Replica) {
			in := instance(r, "cluster2")
			if want := (sdk.InstanceProperties{ClusterScoped: true, DefaultNetwork: "net2", SyncTimeout: 5 * time.Second}); in.Properties != want {
				t.Errorf("cluster2 properties = %+v, want %+v", in.Properties, want)
			}
			if in.Health == nil || !in.Health.Healthy {
				t.Errorf("cluster2 health = %+v", in.Health)
			}
			for _, e := range in.Endpoints[echoHost] {
				if e.Network != "net2" {
					t.Errorf("endpoint %s network = %q, want net2 (cluster 2's istio-system label)", e.Address, e.Network)
				}
			}
			if svc := in.Services[echoHost]; svc == nil || len(svc.VIPs["cluster2"]) != 1 {
				t.Errorf("cluster2 service = %+v, want a cluster2 VIP", svc)
			}
		})
		// The service both clusters have is reported by each cluster's
		// instance with that cluster's VIP and endpoints; the host merges
		// them (host/cmd/estuary TestKubernetesMulticlusterMergesInTheAggregate).
		const sharedHost = "echo.shared.svc.cluster.local"
		rec.with(func(r *sdktest.Replica) {
			for i, cluster := range []string{"cluster1", "cluster2"} {
				in := r.Instance(sdk.ProviderKubernetes, cluster)
				if in == nil || in.Services[sharedHost] == nil {
					t.Fatalf("%s does not report %s", cluster, sharedHost)
				}
				if got, want := in.Services[sharedHost].VIPs, map[string][]string{cluster: {shared[i].Spec.ClusterIP}}; !maps.EqualFunc(got, want, slices.Equal) {
					t.Errorf("%s: %s VIPs %v, want %v", cluster, sharedHost, got, want)
				}
				eps := in.Endpoints[sharedHost]
				if len(eps) == 0 {
					t.Errorf("%s: %s has no endpoints", cluster, sharedHost)
				}
				for _, e := range eps {
					if e.TargetPorts["grpc"] != 17070 {
						t.Errorf("%s: endpoint %s target ports %v, want grpc 17070", cluster, e.Address, e.TargetPorts)
					}
				}
			}
		})
		if rec.syncTO["cluster2"] != 5*time.Second || rec.syncTO["cluster1"] != 0 {
			t.Errorf("sync timeouts = %v, want cluster2 5s (remote_sync_timeout), cluster1 unset", rec.syncTO)
		}
	})

	t.Run("refused secrets", func(t *testing.T) {
		marker := filepath.Join(t.TempDir(), "exec-ran")
		execConfig := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: c3
  cluster:
    server: %s
    certificate-authority-data: %s
contexts:
- name: c3
  context: {cluster: c3, user: c3}
current-context: c3
users:
- name: c3
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: /bin/sh
      args: ["-c", "touch %s; echo '{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{\"token\":\"%s\"}}'"]
      interactiveMode: Never
`, ks[1].Server, b64(ks[1].CAData), marker, tokenA)
		create(remoteSecret("istio-system", "evil", map[string]string{"cluster3": execConfig}))
		create(remoteSecret("istio-system", "dup", map[string]string{
			"cluster2": remoteKubeconfig("cluster2", ks[1].Server, ks[1].CAData, tokenA),
			"cluster1": remoteKubeconfig("cluster1", ks[0].Server, ks[0].CAData, ks[0].Token),
		}))
		create(remoteSecret("istio-system", "far", map[string]string{"cluster4": remoteKubeconfig("cluster4", "https://10.255.0.1:6443", ks[1].CAData, tokenA)}))
		want := []struct{ subject, message string }{
			{`secret istio-system/evil, key "cluster3"`, `user "c3" uses "exec", which allow_kubeconfig_options does not list`},
			{`secret istio-system/dup, key "cluster2"`, `cluster "cluster2" is already registered by secret istio-system/` + secretName},
			{`secret istio-system/dup, key "cluster1"`, `is the primary cluster's`},
			{`secret istio-system/far, key "cluster4"`, `server https://10.255.0.1:6443 is outside allowed_servers`},
		}
		rec.waitFor(t, "a notice for every refused secret", func(r *sdktest.Replica) bool {
			in := instance(r, "cluster1")
			for _, w := range want {
				if !hasNotice(in, w.subject, w.message) {
					return false
				}
			}
			return true
		})
		rec.with(func(r *sdktest.Replica) {
			for _, c := range []string{"cluster3", "cluster4"} {
				if instance(r, c) != nil {
					t.Errorf("refused secret's cluster %s has an instance", c)
				}
			}
			for _, n := range instance(r, "cluster1").Health.Notices {
				if strings.Contains(n.Message, tokenA) || strings.Contains(n.Message, "/bin/sh") {
					t.Errorf("notice shows the kubeconfig's credentials or command: %+v", n)
				}
			}
		})
		if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the exec command ran: marker %s: %v", marker, err)
		}
		for _, name := range []string{"evil", "dup", "far"} {
			if err := secrets.Delete(ctxb, name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		rec.waitFor(t, "notices gone with their secrets", func(r *sdktest.Replica) bool {
			in := instance(r, "cluster1")
			return in.Health != nil && len(in.Health.Notices) == 0
		})
	})

	t.Run("rotate", func(t *testing.T) {
		// Nothing the host sees may lack cluster 2's endpoints: check every
		// event, and the state after every response.
		rec.eventInvariant(func(ev *registryv1.Event) error {
			if ev.GetInstance().GetCluster() != "cluster2" {
				return nil
			}
			switch {
			case ev.GetInstanceRemoved() != nil:
				return errors.New("cluster2 removed")
			case ev.GetServiceDeleted() != nil:
				return fmt.Errorf("service %s deleted", ev.GetServiceDeleted().GetHostname())
			case ev.GetEndpointsReplaced() != nil && ev.GetEndpointsReplaced().GetHostname() == echoHost && len(ev.GetEndpointsReplaced().GetEndpoints()) < 2:
				return fmt.Errorf("endpoints of %s replaced by %d", echoHost, len(ev.GetEndpointsReplaced().GetEndpoints()))
			}
			return nil
		})
		rec.invariant(t, func(r *sdktest.Replica) error {
			if got := endpointAddrs(instance(r, "cluster2"), echoHost); len(got) < 2 {
				return fmt.Errorf("cluster2 endpoints of %s = %v", echoHost, got)
			}
			return nil
		})
		defer rec.eventInvariant(nil)
		defer rec.invariant(t, nil)

		updateSecret := func(mutate func(*corev1.Secret)) {
			t.Helper()
			s, err := secrets.Get(ctxb, secretName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			mutate(s)
			if _, err := secrets.Update(ctxb, s, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		const rotating = "kubeconfig rotating"
		updateSecret(func(s *corev1.Secret) {
			s.Data["cluster2"] = []byte(remoteKubeconfig("cluster2", ks[1].Server, ks[1].CAData, tokenB))
		})
		rec.waitFor(t, "the rotation to start and finish", func(r *sdktest.Replica) bool {
			in := instance(r, "cluster2")
			return countSeen(rec.seen, "cluster2", rotating) > 0 && !hasNotice(in, "", rotating)
		})
		// The new client serves changes.
		k2.updateSlice(ns2, "echo-1", func(s *discoveryv1.EndpointSlice) {
			s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{"10.20.0.3"}})
		})
		rec.waitFor(t, "a change after the rotation", func(r *sdktest.Replica) bool {
			return len(endpointAddrs(instance(r, "cluster2"), echoHost)) == 3
		})

		// The same kubeconfig again, with other metadata: a no-op. The
		// plugin handles secrets in order, so once it has reported the
		// marker secret created next, it has handled the update.
		before := rec.sawNotice("cluster2", rotating)
		updateSecret(func(s *corev1.Secret) { s.Labels["touched"] = "yes" })
		create(remoteSecret("istio-system", "marker", map[string]string{"cluster1": "x"}))
		rec.waitFor(t, "the marker secret handled", func(r *sdktest.Replica) bool {
			return hasNotice(instance(r, "cluster1"), "secret istio-system/marker", "primary")
		})
		if n := rec.sawNotice("cluster2", rotating); n != before {
			t.Errorf("an identical kubeconfig started a rotation (%d rotation notices, was %d)", n, before)
		}
		if err := secrets.Delete(ctxb, "marker", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("rotate to a token the API server refuses", func(t *testing.T) {
		// The new client never syncs: after remote_sync_timeout it takes
		// over anyway, and the instance keeps its last-known state.
		rec.invariant(t, func(r *sdktest.Replica) error {
			if got := endpointAddrs(instance(r, "cluster2"), echoHost); len(got) != 3 {
				return fmt.Errorf("cluster2 endpoints of %s = %v", echoHost, got)
			}
			return nil
		})
		defer rec.invariant(t, nil)
		setToken := func(token string) {
			t.Helper()
			s, err := secrets.Get(ctxb, secretName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			s.Data["cluster2"] = []byte(remoteKubeconfig("cluster2", ks[1].Server, ks[1].CAData, token))
			if _, err := secrets.Update(ctxb, s, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		setToken("not-a-valid-token")
		rec.waitFor(t, "cluster2 on the refused token, last-known state kept", func(r *sdktest.Replica) bool {
			in := instance(r, "cluster2")
			return in.Health != nil && !in.Health.Healthy && strings.Contains(in.Health.Message, "401") &&
				strings.Contains(in.Health.Message, "last-known state") && !hasNotice(in, "", "kubeconfig rotating")
		})
		rec.with(func(r *sdktest.Replica) {
			if msg := instance(r, "cluster2").Health.Message; strings.Contains(msg, "not-a-valid-token") {
				t.Errorf("health message shows the token: %s", msg)
			}
		})
		setToken(tokenB)
		rec.waitFor(t, "cluster2 healthy on a good token again", func(r *sdktest.Replica) bool {
			in := instance(r, "cluster2")
			return in.Health != nil && in.Health.Healthy && in.Health.Message == ""
		})
	})

	t.Run("unreachable", func(t *testing.T) {
		ks[1].Stop()
		rec.waitFor(t, "cluster2 shown disconnected", func(r *sdktest.Replica) bool {
			in := instance(r, "cluster2")
			return in.Health != nil && !in.Health.Healthy && strings.Contains(in.Health.Message, "disconnected")
		})
		rec.with(func(r *sdktest.Replica) {
			if got := endpointAddrs(instance(r, "cluster2"), echoHost); len(got) != 3 {
				t.Errorf("last-known endpoints of an unreachable cluster = %v, want all 3 kept", got)
			}
		})
		ks[1].Start()
		rec.waitFor(t, "cluster2 healthy again", func(r *sdktest.Replica) bool {
			in := instance(r, "cluster2")
			return in.Health != nil && in.Health.Healthy
		})
		k2.service(&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "after-restart", Namespace: ns2},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
		})
		rec.waitFor(t, "a change after the restart", func(r *sdktest.Replica) bool {
			return instance(r, "cluster2").Services["after-restart."+ns2+".svc.cluster.local"] != nil
		})
	})

	t.Run("never reachable", func(t *testing.T) {
		// 127.0.0.1:1 refuses connections: the cluster never syncs, and
		// blocks readiness only for remote_sync_timeout.
		create(remoteSecret("istio-system", "ghost", map[string]string{"cluster5": remoteKubeconfig("cluster5", "https://127.0.0.1:1", ks[1].CAData, tokenA)}))
		rec.waitFor(t, "cluster5 reported unhealthy", func(r *sdktest.Replica) bool {
			in := instance(r, "cluster5")
			return in != nil && in.Health != nil && !in.Health.Healthy && strings.Contains(in.Health.Message, "cannot sync")
		})
		rec.with(func(r *sdktest.Replica) {
			if in := instance(r, "cluster5"); in.Synced {
				t.Errorf("an unreachable cluster is marked synced")
			}
		})
		if rec.syncTO["cluster5"] != 5*time.Second {
			t.Errorf("cluster5 sync timeout = %v, want 5s", rec.syncTO["cluster5"])
		}
		if err := secrets.Delete(ctxb, "ghost", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		rec.waitFor(t, "cluster5 removed", func(r *sdktest.Replica) bool { return instance(r, "cluster5") == nil })
	})

	t.Run("delete", func(t *testing.T) {
		if err := secrets.Delete(ctxb, secretName, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		rec.waitFor(t, "cluster2 and its endpoints gone", func(r *sdktest.Replica) bool { return instance(r, "cluster2") == nil })
		rec.with(func(r *sdktest.Replica) {
			if instance(r, "cluster1") == nil {
				t.Errorf("the primary went away with the remote secret")
			}
			if ids := slices.Collect(maps.Keys(r.Instances)); len(ids) != 1 {
				t.Errorf("instances = %v, want only cluster1", ids)
			}
		})
	})
}

// TestInstanceSetWaitsForRemoteClusters: the plugin declares its instance
// set complete only once the remote secrets are read and every cluster
// they name is declared, even a cluster whose API server does not answer
// (frozen with SIGSTOP): a restarted plugin's host must not drop that
// cluster's last-known state for lack of it.
func TestInstanceSetWaitsForRemoteClusters(t *testing.T) {
	ks := testbed.StartKubes(t, 2)
	k1 := kube{t, ks[0].Client()}
	k1.namespaceNamed("istio-system", nil)
	k2 := kube{t, ks[1].Client()}
	k2.namespaceNamed("istio-system", nil)
	token := k2.readerToken("istio-system", "reader")
	if _, err := k1.c.CoreV1().Secrets("istio-system").Create(ctxb, remoteSecret("istio-system", "istio-remote-secret-cluster2",
		map[string]string{"cluster2": remoteKubeconfig("cluster2", ks[1].Server, ks[1].CAData, token)}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ks[1].Freeze()
	defer ks[1].Thaw()

	rec := startRecorder(t, fmt.Sprintf(`
kubeconfig = %q
cluster_id = "cluster1"
allowed_servers = ["127.0.0.0/8"]
`, ks[0].Kubeconfig), sdk.MeshSettings{DomainSuffix: "cluster.local"})
	rec.waitFor(t, "the instance set complete", func(r *sdktest.Replica) bool { return r.InstanceSetComplete })
	rec.with(func(r *sdktest.Replica) {
		want := []sdk.InstanceID{{Provider: sdk.ProviderKubernetes, Cluster: "cluster1"}, {Provider: sdk.ProviderKubernetes, Cluster: "cluster2"}}
		if !slices.Equal(r.DeclaredAtComplete, want) {
			t.Errorf("instances declared when the set was complete: %v, want %v", r.DeclaredAtComplete, want)
		}
		if in := instance(r, "cluster2"); in == nil || in.Synced {
			t.Errorf("cluster2 = %+v, want declared and, its API server frozen, not synced", in)
		}
	})
}
