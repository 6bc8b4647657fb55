package deploy

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclwrite"
	"github.com/zclconf/go-cty/cty"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/estuary-mesh/estuary/testbed"
)

const (
	release  = "estuary"
	relNS    = "estuary-system"
	secretNS = "mesh-secrets" // not the release namespace, so the Role's place is tested
	saUser   = "system:serviceaccount:" + relNS + ":" + release
)

// TestRBACIsSufficientAndMinimal runs the real estuary, from the image,
// with the kubernetes and serviceentry plugins on nothing but the chart's RBAC: a token of
// the chart's ServiceAccount, minted with the TokenRequest API, in two
// clusters (the primary, and a member cluster registered by a remote
// secret in the secret namespace). Both clusters sync Services,
// EndpointSlices, Pods, Nodes and Namespaces, and the primary its
// ServiceEntries and WorkloadEntries, with no request refused. Then the API server
// shows the same identity can write nothing and read no Secret outside the
// secret namespace, and holds no rule beyond those. A chart that lacks a
// grant the plugin needs fails here: the last subtest takes one away.
func TestRBACIsSufficientAndMinimal(t *testing.T) {
	img := image(t)
	ks := testbed.StartKubes(t, 2)
	primary, member := ks[0], ks[1]
	// Both registries that read the API server: kubernetes, and
	// serviceentry with the CRDs the chart installs.
	r := render(t, chartCase{name: "default"}, release, relNS, "--set", "secretNamespace="+secretNS,
		"--set", "mesh.clusterID=cluster1", "--set", "plugins.serviceentry.enabled=true", "--set", "crds.install=true")
	applyAll(t, primary, r.objects)
	// In the member cluster, the same read-only identity: what a remote
	// secret's token belongs to.
	applyAll(t, member, rbacObjects(r))

	seedCluster(t, primary, "network1")
	seedCluster(t, member, "network2")
	memberToken := mintToken(t, member, relNS, release)
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: "istio-remote-secret-cluster2", Namespace: secretNS,
			Labels:      map[string]string{"istio/multiCluster": "true"},
			Annotations: map[string]string{"networking.istio.io/cluster": "cluster2"},
		},
		StringData: map[string]string{"cluster2": tokenKubeconfig(member, memberToken)},
	}
	if _, err := primary.Client().CoreV1().Secrets(secretNS).Create(context.Background(), secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	applyAll(t, primary, []*unstructured.Unstructured{{Object: map[string]any{
		"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
		"metadata": map[string]any{"name": "api", "namespace": "app"},
		"spec": map[string]any{"hosts": []any{"api.example.com"}, "location": "MESH_EXTERNAL", "resolution": "DNS",
			"ports": []any{map[string]any{"number": int64(443), "name": "tls", "protocol": "TLS"}}},
	}}})

	h := startEstuary(t, img, r, primary, mintToken(t, primary, relNS, release))
	var refused string
	h.eventually("both clusters and the ServiceEntry synced and healthy", 90*time.Second, func() bool {
		var rz registryz
		if !h.getJSON("/debug/registryz", &rz) {
			return false
		}
		if refused = rz.refusal(); refused != "" {
			return true
		}
		return rz.healthy("Kubernetes", "cluster1", "web.app.svc.cluster.local") &&
			rz.healthy("Kubernetes", "cluster2", "web.app.svc.cluster.local") &&
			rz.healthy("ServiceEntry", "cluster1", "api.example.com")
	})
	if refused != "" {
		t.Fatalf("the API server refused the chart's identity: %s", refused)
	}
	// What each informer contributes reached the endpoints: the pod's
	// labels, the node's locality, and the cluster's network from its
	// system namespace.
	var rz registryz
	if !h.getJSON("/debug/registryz", &rz) {
		t.Fatal("no /debug/registryz")
	}
	nets := map[string]string{"cluster1": "network1", "cluster2": "network2"}
	for _, in := range rz.Instances {
		if in.Key.Provider != "Kubernetes" {
			continue
		}
		if want := nets[in.Key.Cluster]; in.Properties.DefaultNetwork != want {
			t.Errorf("%s: network %q, want %q from its system namespace", in.Key.Cluster, in.Properties.DefaultNetwork, want)
		}
	}
	var ez struct {
		ByInstance []struct {
			Instance  struct{ Cluster string } `json:"instance"`
			Endpoints []struct {
				Address  string            `json:"address"`
				Labels   map[string]string `json:"labels"`
				Locality string            `json:"locality"`
			} `json:"endpoints"`
		} `json:"by_instance"`
	}
	if !h.getJSON("/debug/endpointz?host=web.app.svc.cluster.local", &ez) {
		t.Fatal("no /debug/endpointz")
	}
	for _, in := range ez.ByInstance {
		if len(in.Endpoints) != 1 {
			t.Errorf("%s: %d endpoints, want 1", in.Instance.Cluster, len(in.Endpoints))
			continue
		}
		if e := in.Endpoints[0]; e.Labels["version"] != "v1" || !strings.HasPrefix(e.Locality, "region-a/zone-a") {
			t.Errorf("%s: endpoint %+v: want the pod's labels and the node's locality", in.Instance.Cluster, e)
		}
	}
	if len(ez.ByInstance) != 2 {
		t.Errorf("endpoints from %d clusters, want 2", len(ez.ByInstance))
	}
	// 403 as a word: the test's random temp dirs hold the digits too.
	if log := h.log.String(); refusal.MatchString(log) {
		t.Errorf("estuary's log names a refusal:\n%s", log)
	}

	t.Run("refused every write and other Secrets", func(t *testing.T) {
		sar := func(verb, group, resource, sub, ns string) bool {
			t.Helper()
			res, err := primary.Client().AuthorizationV1().SubjectAccessReviews().Create(context.Background(), &authorizationv1.SubjectAccessReview{
				Spec: authorizationv1.SubjectAccessReviewSpec{
					User:   saUser,
					Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + relNS, "system:authenticated"},
					ResourceAttributes: &authorizationv1.ResourceAttributes{
						Namespace: ns, Verb: verb, Group: group, Resource: resource, Subresource: sub,
					},
				},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return res.Status.Allowed
		}
		reads := []string{"get", "list", "watch"}
		writes := []string{"create", "update", "patch", "delete", "deletecollection"}
		type res struct{ group, resource string }
		granted := []res{{"", "services"}, {"", "pods"}, {"", "nodes"}, {"", "namespaces"}, {"discovery.k8s.io", "endpointslices"},
			{"networking.istio.io", "serviceentries"}, {"networking.istio.io", "workloadentries"}}
		others := []res{{"", "configmaps"}, {"", "serviceaccounts"}, {"", "endpoints"}, {"apps", "deployments"},
			{"rbac.authorization.k8s.io", "clusterroles"}, {"rbac.authorization.k8s.io", "rolebindings"},
			{"networking.istio.io", "workloadgroups"}, {"networking.istio.io", "destinationrules"},
			{"apiextensions.k8s.io", "customresourcedefinitions"}}
		namespaces := []string{"", secretNS, relNS, "app", "default", "kube-system"}
		for _, ns := range namespaces {
			for _, g := range granted {
				for _, v := range reads {
					if !sar(v, g.group, g.resource, "", ns) {
						t.Errorf("%s %s/%s in %q refused; the plugin needs it", v, g.group, g.resource, ns)
					}
				}
			}
			for _, g := range append(append(slices.Clone(granted), others...), res{"", "secrets"}) {
				for _, v := range writes {
					if sar(v, g.group, g.resource, "", ns) {
						t.Errorf("%s %s/%s in %q allowed", v, g.group, g.resource, ns)
					}
				}
			}
			for _, g := range others {
				if sar("get", g.group, g.resource, "", ns) {
					t.Errorf("get %s/%s in %q allowed", g.group, g.resource, ns)
				}
			}
			for _, v := range reads {
				if got, want := sar(v, "", "secrets", "", ns), ns == secretNS; got != want {
					t.Errorf("%s secrets in %q: allowed %v, want %v", v, ns, got, want)
				}
			}
			for _, sub := range [][2]string{{"pods", "exec"}, {"pods", "log"}, {"services", "proxy"}, {"serviceaccounts", "token"}, {"pods", "status"}} {
				for _, v := range []string{"get", "create", "update"} {
					if sar(v, "", sub[0], sub[1], ns) {
						t.Errorf("%s %s/%s in %q allowed", v, sub[0], sub[1], ns)
					}
				}
			}
		}
		for _, v := range []string{"impersonate", "escalate", "bind"} {
			for _, g := range []res{{"", "users"}, {"", "serviceaccounts"}, {"rbac.authorization.k8s.io", "clusterroles"}, {"rbac.authorization.k8s.io", "roles"}} {
				if sar(v, g.group, g.resource, "", secretNS) || sar(v, g.group, g.resource, "", "") {
					t.Errorf("%s %s/%s allowed", v, g.group, g.resource)
				}
			}
		}
	})

	t.Run("no rule beyond the plugin's", func(t *testing.T) {
		// What the token may do, as the API server lists it, against what
		// any authenticated identity may: the difference must be exactly
		// the chart's read rules.
		if _, err := primary.Client().CoreV1().ServiceAccounts(relNS).Create(context.Background(),
			&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "nobody"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		nobody := tokenClient(t, primary, mintToken(t, primary, relNS, "nobody"))
		estuary := tokenClient(t, primary, mintToken(t, primary, relNS, release))
		core := []string{
			"/services:get", "/services:list", "/services:watch", "/pods:get", "/pods:list", "/pods:watch",
			"/nodes:get", "/nodes:list", "/nodes:watch", "/namespaces:get", "/namespaces:list", "/namespaces:watch",
			"discovery.k8s.io/endpointslices:get", "discovery.k8s.io/endpointslices:list", "discovery.k8s.io/endpointslices:watch",
			"networking.istio.io/serviceentries:get", "networking.istio.io/serviceentries:list", "networking.istio.io/serviceentries:watch",
			"networking.istio.io/workloadentries:get", "networking.istio.io/workloadentries:list", "networking.istio.io/workloadentries:watch",
		}
		for _, ns := range []string{secretNS, relNS, "app"} {
			base := rules(t, nobody, ns)
			var extra []string
			for _, r := range rules(t, estuary, ns) {
				if !slices.Contains(base, r) {
					extra = append(extra, r)
				}
			}
			want := slices.Clone(core)
			if ns == secretNS {
				want = append(want, "/secrets:get", "/secrets:list", "/secrets:watch")
			}
			slices.Sort(want)
			if !slices.Equal(extra, want) {
				t.Errorf("rules in %s beyond an unbound identity's:\n got %q\nwant %q", ns, extra, want)
			}
		}
	})

	t.Run("a missing grant is found", func(t *testing.T) {
		// The same chart without nodes: the plugin cannot sync, and says
		// why. This is what the test above would see if the chart lacked
		// a resource the plugin reads.
		const brokenNS = "estuary-broken"
		br := render(t, chartCase{name: "default"}, release, brokenNS,
			"--set", "secretNamespace="+secretNS, "--set", "mesh.clusterID=cluster1", "--set", "plugins.kubernetes.remoteSyncTimeout=5s")
		cr := br.find("ClusterRole", "")
		rs, _, _ := unstructured.NestedSlice(cr.Object, "rules")
		for _, rule := range rs {
			m := rule.(map[string]any)
			var kept []any
			for _, res := range m["resources"].([]any) {
				if res != "nodes" {
					kept = append(kept, res)
				}
			}
			m["resources"] = kept
		}
		if err := unstructured.SetNestedSlice(cr.Object, rs, "rules"); err != nil {
			t.Fatal(err)
		}
		applyAll(t, primary, br.objects)
		bh := startEstuary(t, img, br, primary, mintToken(t, primary, brokenNS, release))
		bh.eventually("the plugin's health to name the refused nodes", 60*time.Second, func() bool {
			var rz registryz
			if !bh.getJSON("/debug/registryz", &rz) {
				return false
			}
			return strings.Contains(rz.refusal(), "nodes")
		})
	})
}

// rbacObjects are the rendered ServiceAccount and RBAC objects.
func rbacObjects(r *rendered) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range r.objects {
		switch o.GetKind() {
		case "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding":
			out = append(out, o)
		}
	}
	return out
}

// rules lists what a token may do in a namespace, as the API server
// lists it (SelfSubjectRulesReview), as "GROUP/RESOURCE:VERB".
func rules(t testing.TB, cs kubernetes.Interface, ns string) []string {
	t.Helper()
	res, err := cs.AuthorizationV1().SelfSubjectRulesReviews().Create(context.Background(),
		&authorizationv1.SelfSubjectRulesReview{Spec: authorizationv1.SelfSubjectRulesReviewSpec{Namespace: ns}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status.Incomplete {
		t.Fatalf("rules review in %s incomplete: %s", ns, res.Status.EvaluationError)
	}
	var out []string
	for _, r := range res.Status.ResourceRules {
		for _, g := range r.APIGroups {
			for _, rs := range r.Resources {
				for _, v := range r.Verbs {
					s := g + "/" + rs + ":" + v
					if len(r.ResourceNames) > 0 {
						s += "#" + strings.Join(r.ResourceNames, ",")
					}
					out = append(out, s)
				}
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// mintToken asks the TokenRequest API for an hour's token of a
// ServiceAccount, as the kubelet does for a pod.
func mintToken(t testing.TB, k *testbed.Kube, ns, sa string) string {
	t.Helper()
	tr, err := k.Client().CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), sa,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for %s/%s: %v", ns, sa, err)
	}
	return tr.Status.Token
}

// tokenKubeconfig is a kubeconfig for a cluster with a bearer token and
// the CA inline, as remote secrets carry.
func tokenKubeconfig(k *testbed.Kube, token string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: u
  user:
    token: %s
contexts:
- name: c
  context: {cluster: c, user: u}
current-context: c
`, k.Server, base64.StdEncoding.EncodeToString(k.CAData), token)
}

// seedCluster makes a service with one endpoint, backed by a pod on a
// node, in namespace app, and names the cluster's network on its system
// namespace (the secret namespace), so each of the five informers adds
// something to what estuary serves.
func seedCluster(t testing.TB, k *testbed.Kube, network string) {
	t.Helper()
	ctx := context.Background()
	c := k.Client()
	must := func(_ any, err error) {
		t.Helper()
		if err != nil && !strings.Contains(err.Error(), "already exists") {
			t.Fatal(err)
		}
	}
	must(c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "app"}}, metav1.CreateOptions{}))
	ns, err := c.CoreV1().Namespaces().Get(ctx, secretNS, metav1.GetOptions{})
	if err != nil {
		must(c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: secretNS,
			Labels: map[string]string{"topology.istio.io/network": network}}}, metav1.CreateOptions{}))
	} else {
		if ns.Labels == nil {
			ns.Labels = map[string]string{}
		}
		ns.Labels["topology.istio.io/network"] = network
		must(c.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{}))
	}
	must(c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{
		"topology.kubernetes.io/region": "region-a", "topology.kubernetes.io/zone": "zone-a"}}}, metav1.CreateOptions{}))
	must(c.CoreV1().Pods("app").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web-0", Labels: map[string]string{"app": "web", "version": "v1"}},
		Spec:       corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: "web", Image: "example.com/web:1"}}},
	}, metav1.CreateOptions{}))
	must(c.CoreV1().Services("app").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec:       corev1.ServiceSpec{Selector: map[string]string{"app": "web"}, Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
	}, metav1.CreateOptions{}))
	must(c.DiscoveryV1().EndpointSlices("app").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}},
		Endpoints: []discoveryv1.Endpoint{{
			Addresses: []string{"10.1.2.3"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			NodeName: ptr.To("node-a"), TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "app", Name: "web-0"},
		}},
	}, metav1.CreateOptions{}))
}

// estuaryProc is a running estuary.
type estuaryProc struct {
	t      testing.TB
	admin  string
	log    *lockedBuffer
	exited chan struct{}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// startEstuary runs the image's estuary on the plugins.hcl the chart
// rendered, changed only where a pod and a test differ: xDS and admin on
// free loopback ports (so no TLS files or admin token), and the kubernetes
// plugin reaching the API server through a kubeconfig holding token
// instead of the pod's in-cluster config.
func startEstuary(t testing.TB, img *ociImage, r *rendered, k *testbed.Kube, token string) *estuaryProc {
	t.Helper()
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(tokenKubeconfig(k, token)), 0o600); err != nil {
		t.Fatal(err)
	}
	cm := r.find("ConfigMap", "")
	src, _, _ := unstructured.NestedString(cm.Object, "data", "plugins.hcl")
	f, diags := hclwrite.ParseConfig([]byte(src), "plugins.hcl", hcl.InitialPos)
	if diags.HasErrors() {
		t.Fatalf("rendered plugins.hcl: %v", diags)
	}
	body := f.Body()
	xds := body.FirstMatchingBlock("xds", nil).Body()
	xds.SetAttributeValue("listen", cty.StringVal(freeAddr(t)))
	if tls := xds.FirstMatchingBlock("tls", nil); tls != nil {
		xds.RemoveBlock(tls)
	}
	adminAddr := freeAddr(t)
	admin := body.FirstMatchingBlock("admin", nil).Body()
	admin.SetAttributeValue("listen", cty.StringVal(adminAddr))
	admin.RemoveAttribute("token_file")
	body.FirstMatchingBlock("plugin", []string{"kubernetes"}).Body().FirstMatchingBlock("config", nil).Body().
		SetAttributeValue("kubeconfig", cty.StringVal(kubeconfig))
	if se := body.FirstMatchingBlock("plugin", []string{"serviceentry"}); se != nil {
		se.Body().FirstMatchingBlock("config", nil).Body().FirstMatchingBlock("kubernetes", nil).Body().
			SetAttributeValue("kubeconfig", cty.StringVal(kubeconfig))
	}
	config := filepath.Join(dir, "plugins.hcl")
	if err := os.WriteFile(config, f.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}

	p := &estuaryProc{t: t, admin: "http://" + adminAddr, log: &lockedBuffer{}, exited: make(chan struct{})}
	cmd := exec.Command(filepath.Join(img.rootfs, "usr/local/bin/estuary"), "run", "-config", config, "-log-level", "debug")
	cmd.Stdout, cmd.Stderr = p.log, p.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.exited
		if t.Failed() {
			t.Logf("plugins.hcl:\n%s\nestuary log:\n%s", f.Bytes(), p.log.String())
		}
	})
	return p
}

func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func (p *estuaryProc) getJSON(path string, v any) bool {
	resp, err := http.Get(p.admin + path)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return err == nil && resp.StatusCode == http.StatusOK && json.Unmarshal(b, v) == nil
}

func (p *estuaryProc) eventually(what string, timeout time.Duration, ok func() bool) {
	p.t.Helper()
	testbed.Eventually(p.t, p.exited, what, timeout, 50*time.Millisecond, ok)
}

// registryz is the part of /debug/registryz the test reads.
type registryz struct {
	Instances []struct {
		Key struct {
			Plugin, Provider, Cluster string
		} `json:"key"`
		Synced     bool `json:"synced"`
		Properties struct {
			DefaultNetwork string `json:"default_network"`
		} `json:"properties"`
		Health *struct {
			Healthy bool   `json:"healthy"`
			Message string `json:"message"`
		} `json:"health"`
		Services []struct {
			Hostname string
		} `json:"services"`
	} `json:"instances"`
}

// refusal is the health message of an instance the API server refuses
// (403), or "".
func (r registryz) refusal() string {
	for _, in := range r.Instances {
		if h := in.Health; h != nil && !h.Healthy && strings.Contains(strings.ToLower(h.Message), "forbidden") {
			return fmt.Sprintf("%s/%s: %s", in.Key.Provider, in.Key.Cluster, h.Message)
		}
	}
	return ""
}

// healthy reports whether the provider's instance for the cluster has
// synced, is healthy and holds the service.
func (r registryz) healthy(provider, cluster, host string) bool {
	for _, in := range r.Instances {
		if in.Key.Provider != provider || in.Key.Cluster != cluster {
			continue
		}
		return in.Synced && (in.Health == nil || in.Health.Healthy) &&
			slices.ContainsFunc(in.Services, func(s struct{ Hostname string }) bool { return s.Hostname == host })
	}
	return false
}

// refusal matches what a denied API request leaves in estuary's log.
var refusal = regexp.MustCompile(`(?i)forbidden|\b403\b`)
