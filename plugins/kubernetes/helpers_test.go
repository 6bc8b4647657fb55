package kubernetes

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"
	"github.com/hashicorp/go-plugin/runner"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeclient "k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/configschema"
	"github.com/estuary-mesh/estuary/sdk/sdktest"
	"github.com/estuary-mesh/estuary/testbed"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testbed.GoleakOptions()...) }

var ctxb = context.Background()

// nsCounter makes namespace names unique: a deleted namespace never
// finishes deleting on the testbed.
var nsCounter atomic.Int64

// kube wraps a clientset with helpers that fail the test on error.
type kube struct {
	t testing.TB
	c kubeclient.Interface
}

func (k kube) namespace(prefix string, labels map[string]string) string {
	k.t.Helper()
	name := fmt.Sprintf("%s-%d-%d", prefix, time.Now().UnixNano()%1e6, nsCounter.Add(1))
	k.namespaceNamed(name, labels)
	return name
}

func (k kube) namespaceNamed(name string, labels map[string]string) {
	k.t.Helper()
	_, err := k.c.CoreV1().Namespaces().Create(ctxb, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
	if err != nil {
		k.t.Fatalf("create namespace %s: %v", name, err)
	}
}

func (k kube) labelNamespace(name string, labels map[string]string) {
	k.t.Helper()
	ns, err := k.c.CoreV1().Namespaces().Get(ctxb, name, metav1.GetOptions{})
	if err != nil {
		k.t.Fatal(err)
	}
	ns.Labels = labels
	if _, err := k.c.CoreV1().Namespaces().Update(ctxb, ns, metav1.UpdateOptions{}); err != nil {
		k.t.Fatalf("label namespace %s: %v", name, err)
	}
}

func (k kube) service(svc *corev1.Service) *corev1.Service {
	k.t.Helper()
	out, err := k.c.CoreV1().Services(svc.Namespace).Create(ctxb, svc, metav1.CreateOptions{})
	if err != nil {
		k.t.Fatalf("create service %s/%s: %v", svc.Namespace, svc.Name, err)
	}
	return out
}

func (k kube) updateService(ns, name string, mutate func(*corev1.Service)) *corev1.Service {
	k.t.Helper()
	svc, err := k.c.CoreV1().Services(ns).Get(ctxb, name, metav1.GetOptions{})
	if err != nil {
		k.t.Fatal(err)
	}
	mutate(svc)
	out, err := k.c.CoreV1().Services(ns).Update(ctxb, svc, metav1.UpdateOptions{})
	if err != nil {
		k.t.Fatalf("update service %s/%s: %v", ns, name, err)
	}
	return out
}

func (k kube) slice(s *discoveryv1.EndpointSlice) {
	k.t.Helper()
	if _, err := k.c.DiscoveryV1().EndpointSlices(s.Namespace).Create(ctxb, s, metav1.CreateOptions{}); err != nil {
		k.t.Fatalf("create EndpointSlice %s/%s: %v", s.Namespace, s.Name, err)
	}
}

func (k kube) updateSlice(ns, name string, mutate func(*discoveryv1.EndpointSlice)) {
	k.t.Helper()
	s, err := k.c.DiscoveryV1().EndpointSlices(ns).Get(ctxb, name, metav1.GetOptions{})
	if err != nil {
		k.t.Fatal(err)
	}
	mutate(s)
	if _, err := k.c.DiscoveryV1().EndpointSlices(ns).Update(ctxb, s, metav1.UpdateOptions{}); err != nil {
		k.t.Fatalf("update EndpointSlice %s/%s: %v", ns, name, err)
	}
}

func (k kube) pod(ns, name string, labels map[string]string, node, sa string) {
	k.t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: corev1.PodSpec{
			NodeName: node, ServiceAccountName: sa,
			Containers: []corev1.Container{{Name: "app", Image: "example.com/app:1"}},
		},
	}
	if _, err := k.c.CoreV1().Pods(ns).Create(ctxb, p, metav1.CreateOptions{}); err != nil {
		k.t.Fatalf("create pod %s/%s: %v", ns, name, err)
	}
}

func (k kube) node(name string, labels map[string]string, externalIPs ...string) {
	k.t.Helper()
	n := nodeObj(name, labels, externalIPs...)
	if _, err := k.c.CoreV1().Nodes().Create(ctxb, n, metav1.CreateOptions{}); err != nil {
		k.t.Fatalf("create node %s: %v", name, err)
	}
}

func (k kube) updateNode(name string, mutate func(*corev1.Node)) {
	k.t.Helper()
	n, err := k.c.CoreV1().Nodes().Get(ctxb, name, metav1.GetOptions{})
	if err != nil {
		k.t.Fatal(err)
	}
	mutate(n)
	n, err = k.c.CoreV1().Nodes().Update(ctxb, n, metav1.UpdateOptions{})
	if err != nil {
		k.t.Fatalf("update node %s: %v", name, err)
	}
	mutate(n) // status is a subresource
	if _, err := k.c.CoreV1().Nodes().UpdateStatus(ctxb, n, metav1.UpdateOptions{}); err != nil {
		k.t.Fatalf("update node status %s: %v", name, err)
	}
}

// readerToken creates a service account bound to cluster-admin and returns
// a token for it, as istioctl's remote secrets carry.
func (k kube) readerToken(ns, name string) string {
	k.t.Helper()
	_, err := k.c.CoreV1().ServiceAccounts(ns).Create(ctxb, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		k.t.Fatalf("create service account: %v", err)
	}
	_, err = k.c.RbacV1().ClusterRoleBindings().Create(ctxb, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + name},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: ns}},
	}, metav1.CreateOptions{})
	if err != nil {
		k.t.Fatalf("bind service account: %v", err)
	}
	tr, err := k.c.CoreV1().ServiceAccounts(ns).CreateToken(ctxb, name, &authTokenRequest, metav1.CreateOptions{})
	if err != nil {
		k.t.Fatalf("token for %s/%s: %v", ns, name, err)
	}
	return tr.Status.Token
}

// remoteKubeconfig renders a kubeconfig the way `istioctl x create-remote-secret` does.
func remoteKubeconfig(clusterID, server string, ca []byte, token string) string {
	return fmt.Sprintf(`apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: %s
    server: %s
  name: %[3]s
contexts:
- context:
    cluster: %[3]s
    user: %[3]s
  name: %[3]s
current-context: %[3]s
kind: Config
preferences: {}
users:
- name: %[3]s
  user:
    token: %[4]s
`, b64(ca), server, clusterID, token)
}

// remoteSecret is what `istioctl x create-remote-secret` writes.
func remoteSecret(ns, name string, data map[string]string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: ns,
			Labels:      map[string]string{"istio/multiCluster": "true"},
			Annotations: map[string]string{"networking.istio.io/cluster": strings.Join(keys(data), ",")},
		},
		StringData: data,
	}
}

var authTokenRequest = authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func endpointSlice(ns, name, service string, ports map[string]int32, eps ...epSpec) *discoveryv1.EndpointSlice {
	s := sliceObj(name, ports, eps...)
	s.Namespace = ns
	s.Labels[labelServiceName] = service
	return s
}

func ready(b bool) *bool { return ptr.To(b) }

// --- a Watch stream that checks every state the host would see ---

// recorder serves the plugin in-process like sdktest.Start, and applies each
// Watch response to a replica, running the current invariant after every
// one, so a test can assert that no intermediate state breaks it. It also
// keeps the SyncTimeout property of each instance, which sdktest.Replica
// does not.
type recorder struct {
	rpc    registryv1.RegistryClient
	mu     sync.Mutex
	cond   *sync.Cond
	r      *sdktest.Replica
	syncTO map[string]time.Duration // by cluster
	inv    func(*sdktest.Replica) error
	evInv  func(*registryv1.Event) error
	seen   map[string]int // notice messages seen in any health event, by cluster + ": " + message
	err    error
	ended  bool
}

func startRecorder(t *testing.T, config string, mesh sdk.MeshSettings) *recorder {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	logger := hclog.New(&hclog.LoggerOptions{Name: "plugin", Level: hclog.Info, Output: testWriter{t}})
	rc, closed, err := sdk.ServeTest(ctx, Factory, logger)
	if err != nil {
		t.Fatal(err)
	}
	// As in sdktest: go-plugin would watch our own PID, forever.
	rc.ReattachFunc = func() (runner.AttachedRunner, error) { return inProcess{closed}, nil }
	client := goplugin.NewClient(&goplugin.ClientConfig{
		HandshakeConfig:  sdk.Handshake,
		Plugins:          goplugin.PluginSet{sdk.PluginName: &sdk.GRPCPlugin{}},
		Reattach:         rc,
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		Logger:           hclog.NewNullLogger(),
		GRPCDialOptions:  []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(sdk.MaxMessageBytes))},
	})
	cp, err := client.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		client.Kill()
		_ = cp.Close()
		cancel()
		<-closed
	})
	raw, err := cp.Dispense(sdk.PluginName)
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{
		rpc: raw.(registryv1.RegistryClient), r: sdktest.NewReplica(), syncTO: map[string]time.Duration{}, seen: map[string]int{},
	}
	rec.cond = sync.NewCond(&rec.mu)
	if diags := rec.configure(t, config, mesh); diags.HasErrors() {
		t.Fatalf("Configure: %v", diags)
	}
	stream, err := rec.rpc.Watch(ctx, &registryv1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		rec.consume(stream)
	}()
	return rec
}

func (rec *recorder) configure(t *testing.T, config string, mesh sdk.MeshSettings) sdk.Diagnostics {
	t.Helper()
	js, hd := configschema.ParseHCL("plugins.hcl", []byte(config), schema)
	if hd.HasErrors() {
		t.Fatalf("config: %v", hd)
	}
	ctx, cancel := context.WithTimeout(ctxb, 30*time.Second)
	defer cancel()
	resp, err := rec.rpc.Configure(ctx, &registryv1.ConfigureRequest{
		ConfigJson: js,
		Mesh:       &registryv1.MeshSettings{DomainSuffix: mesh.DomainSuffix, ClusterId: mesh.ClusterID, Network: mesh.Network, HostAddresses: mesh.HostAddresses},
	})
	if err != nil {
		t.Fatalf("Configure: %v", err)
	}
	var diags sdk.Diagnostics
	for _, d := range resp.GetDiagnostics() {
		diags = append(diags, sdk.Diagnostic{Severity: sdk.Severity(d.GetSeverity()), Summary: d.GetSummary(), Path: d.GetPath()})
	}
	return diags
}

func (rec *recorder) consume(stream grpc.ServerStreamingClient[registryv1.WatchResponse]) {
	for {
		resp, err := stream.Recv()
		rec.mu.Lock()
		if err != nil {
			rec.ended = true
			if err != io.EOF && rec.err == nil && !rec.r.SnapshotDone {
				rec.err = err
			}
			rec.cond.Broadcast()
			rec.mu.Unlock()
			return
		}
		for _, ev := range resp.GetEvents() {
			cluster := ev.GetInstance().GetCluster()
			if a := ev.GetInstanceAdded(); a != nil {
				rec.syncTO[cluster] = time.Duration(a.GetProperties().GetSyncTimeoutMillis()) * time.Millisecond
			}
			if h := ev.GetInstanceHealth(); h != nil {
				for _, n := range h.GetNotices() {
					rec.seen[cluster+": "+n.GetMessage()]++
				}
			}
			if rec.evInv != nil && rec.err == nil {
				if err := rec.evInv(ev); err != nil {
					rec.err = fmt.Errorf("response %d: event %v: %w", resp.GetSequence(), ev, err)
				}
			}
		}
		if err := rec.r.Apply(resp); err != nil && rec.err == nil {
			rec.err = err
		}
		if rec.inv != nil && rec.err == nil {
			if err := rec.inv(rec.r); err != nil {
				rec.err = fmt.Errorf("after response %d: %w\nstate:\n%s", rec.r.Responses, err, rec.r)
			}
		}
		rec.cond.Broadcast()
		rec.mu.Unlock()
	}
}

// invariant checks f after every response from now on (nil: no check).
// It first checks it on the current state.
func (rec *recorder) invariant(t *testing.T, f func(*sdktest.Replica) error) {
	t.Helper()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.inv = f
	if f != nil {
		if err := f(rec.r); err != nil {
			t.Fatalf("invariant does not hold now: %v\n%s", err, rec.r)
		}
	}
}

// eventInvariant checks f on every event from now on (nil: no check), so
// that a change undone within one response is caught too.
func (rec *recorder) eventInvariant(f func(*registryv1.Event) error) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.evInv = f
}

// sawNotice counts the health events of cluster that carried a notice
// whose message contains msg.
func (rec *recorder) sawNotice(cluster, msg string) int {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return countSeen(rec.seen, cluster, msg)
}

// countSeen is sawNotice for callers holding rec.mu (waitFor predicates).
func countSeen(seen map[string]int, cluster, msg string) int {
	n := 0
	for k, c := range seen {
		if strings.HasPrefix(k, cluster+": ") && strings.Contains(k, msg) {
			n += c
		}
	}
	return n
}

func (rec *recorder) waitFor(t *testing.T, what string, ok func(*sdktest.Replica) bool) {
	t.Helper()
	timeout := 60 * time.Second
	deadline := time.Now().Add(timeout)
	timer := time.AfterFunc(timeout, func() { rec.mu.Lock(); rec.cond.Broadcast(); rec.mu.Unlock() })
	defer timer.Stop()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for {
		if rec.err != nil {
			t.Fatalf("waiting for %s: %v", what, rec.err)
		}
		if ok(rec.r) {
			return
		}
		if rec.ended {
			t.Fatalf("waiting for %s: stream ended", what)
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: timed out after %s; state:\n%s", what, timeout, rec.r)
		}
		rec.cond.Wait()
	}
}

func (rec *recorder) with(f func(*sdktest.Replica)) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	f(rec.r)
}

// inProcess is the go-plugin runner of a plugin served in this process.
type inProcess struct{ closed <-chan struct{} }

func (r inProcess) Wait(context.Context) error                     { <-r.closed; return nil }
func (inProcess) Kill(context.Context) error                       { return nil }
func (inProcess) ID() string                                       { return "in-process" }
func (inProcess) PluginToHost(n, a string) (string, string, error) { return n, a, nil }
func (inProcess) HostToPlugin(n, a string) (string, string, error) { return n, a, nil }

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// --- assertions on replicas ---

func instance(r *sdktest.Replica, cluster string) *sdktest.Instance {
	return r.Instance(sdk.ProviderKubernetes, cluster)
}

// hasNotice reports whether the instance's health has a notice whose subject
// and message contain the given strings.
func hasNotice(in *sdktest.Instance, subject, message string) bool {
	if in == nil || in.Health == nil {
		return false
	}
	for _, n := range in.Health.Notices {
		if strings.Contains(n.Subject, subject) && strings.Contains(n.Message, message) {
			return true
		}
	}
	return false
}

func endpointAddrs(in *sdktest.Instance, host string) []string {
	if in == nil {
		return nil
	}
	var out []string
	for _, e := range in.Endpoints[host] {
		out = append(out, e.Address)
	}
	return out
}
