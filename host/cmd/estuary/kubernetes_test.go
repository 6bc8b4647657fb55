package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/estuary-mesh/estuary/testbed"
)

// TestKubernetesMulticlusterMergesInTheAggregate: two real API servers;
// cluster2 joins through a remote secret in cluster1 written as
// `istioctl x create-remote-secret` writes it. The same service in both
// clusters becomes one merged service with a VIP per cluster and the
// endpoints of both.
func TestKubernetesMulticlusterMergesInTheAggregate(t *testing.T) {
	k1, _, ns := twoClusters(t)
	h := startHost(t, fmt.Sprintf(`plugin "kubernetes" {
  config {
    kubeconfig = %q
    cluster_id = "cluster1"
  }
}
`, k1.Kubeconfig))
	host := "echo." + ns + ".svc.cluster.local"
	var got struct {
		Service struct {
			VIPs map[string][]string `json:"vips"`
		} `json:"service"`
		Merged []struct {
			Address  string                   `json:"address"`
			Instance struct{ Cluster string } `json:"instance"`
		} `json:"merged"`
	}
	h.eventually("echo merged from both clusters", 60*time.Second, func() bool {
		code, _ := h.get("/debug/endpointz?host=" + host)
		if code != 200 {
			return false
		}
		h.getJSON("/debug/endpointz?host="+host, &got)
		return len(got.Service.VIPs) == 2 && len(got.Merged) == 2
	})
	if !slices.Equal(got.Service.VIPs["cluster1"], []string{"10.96.1.1"}) || !slices.Equal(got.Service.VIPs["cluster2"], []string{"10.96.2.2"}) {
		t.Errorf("VIPs = %v, want cluster1: 10.96.1.1, cluster2: 10.96.2.2", got.Service.VIPs)
	}
	byCluster := map[string]string{}
	for _, e := range got.Merged {
		byCluster[e.Instance.Cluster] = e.Address
	}
	if byCluster["cluster1"] != "10.1.0.1" || byCluster["cluster2"] != "10.2.0.1" {
		t.Errorf("merged endpoints by cluster = %v", byCluster)
	}
}

// twoClusters starts two API servers, creates service echo in a new
// namespace of each (cluster1: VIP 10.96.1.1, pod 10.1.0.1; cluster2:
// 10.96.2.2, 10.2.0.1), and registers cluster2 with cluster1 through a
// remote secret written as `istioctl x create-remote-secret` writes it.
func twoClusters(t *testing.T) (k1, k2 *testbed.Kube, ns string) {
	t.Helper()
	kubes := testbed.StartKubes(t, 2)
	k1, k2 = kubes[0], kubes[1]
	ns = fmt.Sprintf("demo-%d", time.Now().UnixNano()%100000)
	kubeEcho(t, k1.Client(), ns, "10.96.1.1", "10.1.0.1")
	kubeEcho(t, k2.Client(), ns, "10.96.2.2", "10.2.0.1")
	remoteSecretFor(t, k1, k2)
	return k1, k2, ns
}

// remoteSecretFor registers k2 with k1 as cluster2, as `istioctl x
// create-remote-secret` does.
func remoteSecretFor(t *testing.T, k1, k2 *testbed.Kube) {
	t.Helper()
	remote := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: cluster2
  cluster:
    server: %s
    certificate-authority-data: %s
contexts:
- name: cluster2
  context: {cluster: cluster2, user: cluster2}
current-context: cluster2
users:
- name: cluster2
  user:
    token: %s
`, k2.Server, base64.StdEncoding.EncodeToString(k2.CAData), k2.Token)
	ctx := context.Background()
	if _, err := k1.Client().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "istio-system"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := k1.Client().CoreV1().Secrets("istio-system").Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "istio-remote-secret-cluster2", Namespace: "istio-system",
			Labels:      map[string]string{"istio/multiCluster": "true"},
			Annotations: map[string]string{"networking.istio.io/cluster": "cluster2"}},
		StringData: map[string]string{"cluster2": remote},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}
