package testbed_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/tools/clientcmd/api/latest"
	"k8s.io/utils/ptr"

	"github.com/estuary-mesh/estuary/testbed"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testbed.GoleakOptions()...)
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return c
}

// Two clusters share nothing: an object made in one is not in the other,
// and one cluster's token is refused by the other.
func TestTwoKubeClustersAreIndependent(t *testing.T) {
	ks := testbed.StartKubes(t, 2)
	a, b := ks[0], ks[1]
	if a.Server == b.Server || a.Token == b.Token || string(a.CAData) == string(b.CAData) {
		t.Fatalf("clusters share server, token or CA: %s %s", a.Server, b.Server)
	}
	c := ctx(t)
	for i, k := range ks {
		other := ks[1-i]
		name := "only-in-" + strings.ReplaceAll(strings.TrimPrefix(k.Server, "https://127.0.0.1:"), ".", "-")
		_, err := k.Client().CoreV1().Namespaces().Create(c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create namespace %s in %s: %v", name, k.Server, err)
		}
		if _, err := k.Client().CoreV1().Namespaces().Get(c, name, metav1.GetOptions{}); err != nil {
			t.Fatalf("get namespace %s in %s: %v", name, k.Server, err)
		}
		_, err = other.Client().CoreV1().Namespaces().Get(c, name, metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			t.Fatalf("namespace %s made in %s: want NotFound in %s, got %v", name, k.Server, other.Server, err)
		}
	}

	// a's token against b's server.
	cfg := b.RestConfig()
	cfg.BearerToken = a.Token
	cross, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = cross.CoreV1().Namespaces().List(c, metav1.ListOptions{})
	if !apierrors.IsUnauthorized(err) {
		t.Fatalf("cluster a's token on cluster b: want Unauthorized, got %v", err)
	}
}

// The kubeconfig file is self contained and both of its users (token and
// client certificate) are admins.
func TestKubeconfig(t *testing.T) {
	k := testbed.StartKube(t)
	b, err := os.ReadFile(k.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != string(k.KubeconfigBytes()) {
		t.Fatal("Kubeconfig file and KubeconfigBytes differ")
	}
	obj, _, err := latest.Codec.Decode(b, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	kc := obj.(*clientcmdapi.Config)
	cur := kc.Contexts[kc.CurrentContext]
	if cur == nil || kc.Clusters[cur.Cluster] == nil || kc.AuthInfos[cur.AuthInfo] == nil {
		t.Fatalf("bad current context in\n%s", b)
	}
	cluster := kc.Clusters[cur.Cluster]
	if cluster.Server != k.Server || string(cluster.CertificateAuthorityData) != string(k.CAData) {
		t.Fatalf("cluster %+v", cluster)
	}
	if kc.AuthInfos[cur.AuthInfo].Token != k.Token {
		t.Fatal("current user's token is not Kube.Token")
	}
	c := ctx(t)
	for name, ctxt := range kc.Contexts {
		user := kc.AuthInfos[ctxt.AuthInfo]
		cs, err := kubernetes.NewForConfig(&rest.Config{
			Host:        cluster.Server,
			BearerToken: user.Token,
			TLSClientConfig: rest.TLSClientConfig{
				CAData:   cluster.CertificateAuthorityData,
				CertData: user.ClientCertificateData,
				KeyData:  user.ClientKeyData,
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		// Creating a namespace needs system:masters under RBAC.
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "kubeconfig-"}}
		if _, err := cs.CoreV1().Namespaces().Create(c, ns, metav1.CreateOptions{}); err != nil {
			t.Fatalf("context %q: %v", name, err)
		}
	}
	if len(kc.Contexts) != 2 {
		t.Fatalf("want 2 contexts (token, cert), got %d", len(kc.Contexts))
	}
}

// Stop takes the API server down (etcd stays), Start brings it back on the
// same URL with the data intact; clients made before keep working.
func TestKubeStopStart(t *testing.T) {
	k := testbed.StartKube(t)
	cs := k.Client()
	c := ctx(t)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "survives", Namespace: "default"}, Data: map[string]string{"k": "v"}}
	if _, err := cs.CoreV1().ConfigMaps("default").Create(c, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	server := k.Server

	t0 := time.Now()
	k.Stop()
	t.Logf("stop took %.2fs", time.Since(t0).Seconds())
	if k.Running() {
		t.Fatal("still running after Stop")
	}
	short, cancel := context.WithTimeout(c, 3*time.Second)
	_, err := cs.CoreV1().ConfigMaps("default").Get(short, "survives", metav1.GetOptions{})
	cancel()
	if err == nil {
		t.Fatal("API server answered while stopped")
	}
	k.Stop() // no-op

	k.Start()
	if k.Server != server {
		t.Fatalf("server moved from %s to %s", server, k.Server)
	}
	got, err := cs.CoreV1().ConfigMaps("default").Get(c, "survives", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("after restart: %v", err)
	}
	if got.Data["k"] != "v" {
		t.Fatalf("after restart: data %v", got.Data)
	}
	k.Start() // no-op
}

func TestConsulRegisterService(t *testing.T) {
	c := testbed.StartConsul(t)
	if !strings.HasPrefix(c.Addr, "127.0.0.1:") || c.Token != "" || c.DataDir != "" {
		t.Fatalf("unexpected consul: %+v", c)
	}
	client := c.Client()
	reg := &api.AgentServiceRegistration{
		ID:      "web-1",
		Name:    "web",
		Address: "10.1.2.3",
		Port:    8080,
		Tags:    []string{"v1"},
		Meta:    map[string]string{"version": "1"},
	}
	if err := client.Agent().ServiceRegister(reg); err != nil {
		t.Fatal(err)
	}
	svcs := waitService(t, client, "web", 1)
	s := svcs[0]
	if s.ServiceID != "web-1" || s.ServiceAddress != "10.1.2.3" || s.ServicePort != 8080 || s.ServiceMeta["version"] != "1" {
		t.Fatalf("catalog entry %+v", s)
	}
}

// With ACLs and a data dir: anonymous writes are refused, the management
// token works, and the catalog survives a stop and start on the same ports.
func TestConsulACLAndRestart(t *testing.T) {
	c := testbed.StartConsul(t, testbed.ConsulDataDir(""), testbed.ConsulACL(""))
	if c.Token == "" || c.DataDir == "" {
		t.Fatalf("want token and data dir: %+v", c)
	}
	anonCfg := c.Config()
	anonCfg.Token = "anonymous"
	anon, err := api.NewClient(anonCfg)
	if err != nil {
		t.Fatal(err)
	}
	reg := &api.AgentServiceRegistration{ID: "db-1", Name: "db", Address: "10.1.2.4", Port: 5432}
	err = anon.Agent().ServiceRegister(reg)
	var se api.StatusError
	if !errors.As(err, &se) || se.Code != http.StatusForbidden {
		t.Fatalf("anonymous register: want 403, got %v", err)
	}
	client := c.Client()
	if err := client.Agent().ServiceRegister(reg); err != nil {
		t.Fatal(err)
	}
	waitService(t, client, "db", 1)
	if _, err := client.KV().Put(&api.KVPair{Key: "estuary/test", Value: []byte("kept")}, nil); err != nil {
		t.Fatal(err)
	}

	addr := c.Addr
	c.Stop()
	if _, _, err := client.KV().Get("estuary/test", nil); err == nil {
		t.Fatal("consul answered while stopped")
	}
	c.Start()
	if c.Addr != addr {
		t.Fatalf("address moved from %s to %s", addr, c.Addr)
	}
	// A restarted server answers before it has applied its log again: a
	// read then finds nothing, without an error. A consistent read waits
	// for the leader to be established; poll until it holds the value.
	var kv *api.KVPair
	deadline := time.Now().Add(30 * time.Second)
	for {
		kv, _, err = client.KV().Get("estuary/test", &api.QueryOptions{RequireConsistent: true})
		if err == nil && kv != nil && string(kv.Value) == "kept" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("KV after restart: %v %v", kv, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	waitService(t, client, "db", 1)
}

func waitService(t *testing.T, client *api.Client, name string, n int) []*api.CatalogService {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		svcs, _, err := client.Catalog().Service(name, "", nil)
		if err == nil && len(svcs) == n {
			return svcs
		}
		if time.Now().After(deadline) {
			t.Fatalf("service %s: want %d instances, got %d (err %v)", name, n, len(svcs), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ESTUARY_TESTBED_BIN overrides the cache; a missing binary is an error that
// says how to build it.
func TestBin(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(testbed.EnvBinDir, dir)
	if err := os.WriteFile(filepath.Join(dir, "etcd"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if p, err := testbed.Bin("etcd"); err != nil || p != filepath.Join(dir, "etcd") {
		t.Fatalf("Bin(etcd) = %q, %v", p, err)
	}
	if err := os.Remove(filepath.Join(dir, "etcd")); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"kube-apiserver", "etcd", "consul"} {
		_, err := testbed.Bin(name)
		if err == nil || !strings.Contains(err.Error(), "make testbed") {
			t.Fatalf("Bin(%q) with an empty dir: %v", name, err)
		}
	}
	if _, err := testbed.Bin("kubelet"); err == nil {
		t.Fatal("Bin(kubelet): want an error")
	}
}

// A fault proxy in front of a real agent passes requests through, answers
// those the test picks itself, and cuts a blocking query in flight.
func TestFaultProxy(t *testing.T) {
	c := testbed.StartConsul(t)
	px := testbed.StartFaultProxy(t, "http://"+c.Addr, nil)
	cfg := api.DefaultConfig()
	cfg.Address = strings.TrimPrefix(px.URL, "http://")
	client, err := api.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, meta, err := client.Catalog().Services((&api.QueryOptions{}).WithContext(ctx(t)))
	if err != nil {
		t.Fatalf("through the proxy: %v", err)
	}

	px.SetFault(func(r *http.Request) *testbed.Fault {
		return &testbed.Fault{Status: http.StatusServiceUnavailable, Body: "injected"}
	})
	_, _, err = client.Catalog().Services((&api.QueryOptions{}).WithContext(ctx(t)))
	var se api.StatusError
	if !errors.As(err, &se) || se.Code != http.StatusServiceUnavailable || se.Body != "injected" {
		t.Fatalf("with a 503 fault: %v", err)
	}
	px.SetFault(nil)

	blocked := make(chan error, 1)
	go func() {
		opts := (&api.QueryOptions{WaitIndex: meta.LastIndex, WaitTime: time.Minute}).WithContext(ctx(t))
		_, _, err := client.Catalog().Services(opts)
		blocked <- err
	}()
	deadline := time.Now().Add(30 * time.Second)
	for !slices.ContainsFunc(px.Requests(), func(r testbed.ProxiedRequest) bool { return strings.Contains(r.RawQuery, "index=") }) {
		if time.Now().After(deadline) {
			t.Fatal("the blocking query never reached the proxy")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// A client may send a cut GET again (Go's transport does, when no
	// byte of the answer arrived): that one is answered at once.
	px.SetFault(func(r *http.Request) *testbed.Fault {
		return &testbed.Fault{Status: http.StatusServiceUnavailable, Body: "injected"}
	})
	px.CutConnections()
	select {
	case err := <-blocked:
		if err == nil {
			t.Error("a cut blocking query returned no error")
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("CutConnections did not end the blocking query: %+v", px.Requests())
	}
	reqs := px.Requests()
	if len(reqs) < 3 || reqs[0].Status != http.StatusOK || reqs[0].Injected || !reqs[1].Injected || reqs[1].Status != http.StatusServiceUnavailable {
		t.Errorf("requests recorded: %+v", reqs)
	}
}

// WithDualStack gives Services a ClusterIP of each family; a cluster
// started without it stays single-stack IPv4, and refuses them.
func TestDualStackOption(t *testing.T) {
	c := ctx(t)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "dual", Namespace: "default"},
		Spec: corev1.ServiceSpec{
			Ports:          []corev1.ServicePort{{Name: "http", Port: 80}},
			IPFamilyPolicy: ptr.To(corev1.IPFamilyPolicyRequireDualStack),
		},
	}
	single, dual := testbed.StartKube(t), testbed.StartKube(t, testbed.WithDualStack())
	if _, err := single.Client().CoreV1().Services("default").Create(c, svc, metav1.CreateOptions{}); err == nil {
		t.Error("a default cluster accepted a RequireDualStack Service; its Service range is meant to be IPv4 only")
	}
	got, err := dual.Client().CoreV1().Services("default").Create(c, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("dual-stack cluster: %v", err)
	}
	if want := []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}; len(got.Spec.ClusterIPs) != 2 || !slices.Equal(got.Spec.IPFamilies, want) {
		t.Errorf("ClusterIPs %v, families %v; want one IPv4 and one IPv6", got.Spec.ClusterIPs, got.Spec.IPFamilies)
	}
}
