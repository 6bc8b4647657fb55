package kubernetes

import (
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/sdktest"
	"github.com/estuary-mesh/estuary/testbed"
)

// TestAPIServerFaults: the plugin watches a real API server through a
// fault-injecting proxy (issue 11.7). Whatever the API server answers,
// the plugin never drops what it last listed: the service "keep" and its
// endpoint stay in every state the host sees. Each fault is checked for
// what it must do on top: relist after 410, say why in the health on
// 429, 5xx and 403, and pick up the changes made meanwhile once the API
// server answers again.
func TestAPIServerFaults(t *testing.T) {
	tb := testbed.StartKube(t)
	k := kube{t, tb.Client()}
	px := testbed.StartFaultProxy(t, tb.Server, tb.CAData)
	t.Cleanup(func() {
		if t.Failed() {
			for _, r := range px.Requests() {
				t.Logf("proxied: %s %s?%s: %d injected=%v", r.Method, r.Path, r.RawQuery, r.Status, r.Injected)
			}
		}
	})
	ns := k.namespace("faults", nil)
	ports := map[string]int32{"http": 8080}
	for _, name := range []string{"keep", "echo", "gone"} {
		k.service(&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
		})
	}
	k.slice(endpointSlice(ns, "keep-1", "keep", ports, epSpec{addr: "10.1.0.1"}))
	k.slice(endpointSlice(ns, "echo-1", "echo", ports, epSpec{addr: "10.1.1.1"}))
	host := func(name string) string { return name + "." + ns + ".svc.cluster.local" }
	keepHost, echoHost := host("keep"), host("echo")

	// kubeconfigFor writes a kubeconfig that reaches the API server only
	// through the proxy, with token.
	kubeconfigFor := func(t *testing.T, token string) string {
		path := filepath.Join(t.TempDir(), "kubeconfig")
		if err := os.WriteFile(path, []byte(remoteKubeconfig("faults", px.URL, px.CAData, token)), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	startWatching := func(t *testing.T, token string) *recorder {
		rec := startRecorder(t, fmt.Sprintf("kubeconfig = %q\ncluster_id = \"cluster1\"\n", kubeconfigFor(t, token)), sdk.MeshSettings{DomainSuffix: "cluster.local"})
		rec.waitFor(t, "synced", func(r *sdktest.Replica) bool {
			in := instance(r, "cluster1")
			return in != nil && in.Synced && len(endpointAddrs(in, keepHost)) == 1
		})
		rec.invariant(t, func(r *sdktest.Replica) error {
			if got := endpointAddrs(instance(r, "cluster1"), keepHost); !slices.Equal(got, []string{"10.1.0.1"}) {
				return fmt.Errorf("keep's endpoints are %v, want its last-known 10.1.0.1", got)
			}
			return nil
		})
		return rec
	}
	rec := startWatching(t, tb.Token)
	// echoes sets echo's endpoints in the API server, and waits until the
	// plugin reports exactly them.
	var echoes []string
	setEchoes := func(addrs ...string) {
		t.Helper()
		k.updateSlice(ns, "echo-1", func(s *discoveryv1.EndpointSlice) {
			s.Endpoints = nil
			for _, a := range addrs {
				s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}})
			}
		})
		echoes = addrs
	}
	echoesArrive := func(t *testing.T, r *recorder) {
		t.Helper()
		r.waitFor(t, fmt.Sprintf("echo's endpoints %v", echoes), func(r *sdktest.Replica) bool {
			got := endpointAddrs(instance(r, "cluster1"), echoHost)
			slices.Sort(got)
			return slices.Equal(got, echoes)
		})
	}
	healthSays := func(t *testing.T, r *recorder, what string) {
		t.Helper()
		r.waitFor(t, "the health to say "+what, func(r *sdktest.Replica) bool {
			in := instance(r, "cluster1")
			return in.Health != nil && !in.Health.Healthy && strings.Contains(in.Health.Message, what) &&
				strings.Contains(in.Health.Message, "last-known state")
		})
	}
	healthy := func(t *testing.T, r *recorder) {
		t.Helper()
		r.waitFor(t, "healthy again", func(r *sdktest.Replica) bool {
			in := instance(r, "cluster1")
			return in.Health != nil && in.Health.Healthy
		})
	}
	injected := func(from int) (n int, relists int) {
		reqs := px.Requests()[from:]
		first := slices.IndexFunc(reqs, func(r testbed.ProxiedRequest) bool { return r.Injected })
		for i, r := range reqs {
			if r.Injected {
				n++
			}
			// A relist: a list, or a watch that starts from no
			// resource version with the initial events (client-go's
			// streaming list).
			q, _ := url.ParseQuery(r.RawQuery)
			if first >= 0 && i > first && !r.Injected && r.Method == http.MethodGet &&
				(q.Get("watch") == "" || q.Get("resourceVersion") == "" && q.Get("sendInitialEvents") == "true") {
				relists++
			}
		}
		return n, relists
	}

	// 410 Gone: every watch the plugin opens is told its resource
	// version is too old, as an API server whose watch cache moved on
	// says it: an ERROR event in a 200 stream. Only a relist brings news.
	t.Run("gone", func(t *testing.T) {
		from := len(px.Requests())
		px.SetFault(func(r *http.Request) *testbed.Fault {
			// A watch that resumes from a resource version: a fresh
			// one (the relist) is never too old.
			if q := r.URL.Query(); q.Get("watch") == "" || q.Get("resourceVersion") == "" {
				return nil
			}
			return &testbed.Fault{Status: http.StatusOK, Header: http.Header{"Content-Type": {"application/json"}},
				Body: `{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 1 (2)","reason":"Expired","code":410}}` + "\n"}
		})
		px.CutConnections()
		setEchoes("10.1.1.1", "10.1.1.2")
		if err := k.c.CoreV1().Services(ns).Delete(ctxb, "gone", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		echoesArrive(t, rec)
		rec.waitFor(t, "the deleted service gone", func(r *sdktest.Replica) bool {
			return instance(r, "cluster1").Services[host("gone")] == nil
		})
		if n, relists := injected(from); n == 0 || relists == 0 {
			t.Errorf("%d watches answered 410, %d lists after the first; want both", n, relists)
		}
		px.SetFault(nil)
		setEchoes("10.1.1.3")
		echoesArrive(t, rec)
	})

	// 429 and 5xx on every request, watches cut: the health says so,
	// the state stays; once the API server answers, what changed arrives.
	for _, tt := range []struct {
		status int
		header http.Header
		want   string
	}{
		{http.StatusTooManyRequests, http.Header{"Retry-After": {"1"}}, "429 Too Many Requests"},
		{http.StatusInternalServerError, nil, "500 Internal Server Error"},
		{http.StatusServiceUnavailable, nil, "503 Service Unavailable"},
	} {
		t.Run(fmt.Sprint(tt.status), func(t *testing.T) {
			from := len(px.Requests())
			px.SetFault(func(r *http.Request) *testbed.Fault {
				h := http.Header{"Content-Type": {"application/json"}}
				for k, v := range tt.header {
					h[k] = v
				}
				return &testbed.Fault{Status: tt.status, Header: h,
					Body: fmt.Sprintf(`{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"injected","code":%d}`, tt.status)}
			})
			px.CutConnections()
			healthSays(t, rec, tt.want)
			setEchoes("10.1.2.1")
			if n, _ := injected(from); n == 0 {
				t.Fatal("no request was answered by the fault")
			}
			px.SetFault(nil)
			healthy(t, rec)
			echoesArrive(t, rec)
		})
	}

	// RBAC revoked mid-watch: the plugin's service account loses its
	// binding; its watches, once cut, cannot start again (403). The
	// health names the 403, the state stays, and a restored binding
	// brings the changes made meanwhile.
	t.Run("rbac revoked", func(t *testing.T) {
		token := k.readerToken(ns, "estuary")
		rrec := startWatching(t, token)
		binding := ns + "-estuary"
		crb, err := k.c.RbacV1().ClusterRoleBindings().Get(ctxb, binding, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := k.c.RbacV1().ClusterRoleBindings().Delete(ctxb, binding, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		px.CutConnections()
		healthSays(t, rrec, "403 Forbidden")
		setEchoes("10.1.3.1", "10.1.3.2")
		if _, err := k.c.RbacV1().ClusterRoleBindings().Create(ctxb, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: binding}, RoleRef: crb.RoleRef, Subjects: crb.Subjects,
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		healthy(t, rrec)
		echoesArrive(t, rrec)
	})
}
