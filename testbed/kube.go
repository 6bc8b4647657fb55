package testbed

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Kube is one test "cluster": a real etcd and kube-apiserver on 127.0.0.1.
// There is no controller-manager, scheduler or kubelet: no EndpointSlice
// controller, no default ServiceAccount (its admission plugin is off), and a
// deleted namespace never finishes deleting, so use unique namespace names.
type Kube struct {
	// Server is the API server URL, https://127.0.0.1:PORT. It stays the
	// same across Stop and Start.
	Server string
	// CAData is the PEM CA bundle that signed the serving certificate.
	CAData []byte
	// Token is a bearer token for user "admin" in group system:masters.
	Token string
	// Kubeconfig is the path of a kubeconfig file (token auth, CA data
	// inline, current context = the admin token user).
	Kubeconfig string
	// Dir is the cluster's run directory (PKI, etcd data, logs).
	Dir string
	// APIServerLog and EtcdLog are the components' log files.
	APIServerLog, EtcdLog string

	t          testing.TB
	apiBin     string
	apiArgs    []string
	apiPort    int
	etcdURL    string
	kubeconfig []byte

	mu        sync.Mutex
	apiserver *proc
	etcd      *proc
	probe     *http.Transport // readiness probes
	clientTr  *http.Transport // behind Client(); closed on Stop and cleanup
	client    kubernetes.Interface
}

// StartKube starts etcd and kube-apiserver on free 127.0.0.1 ports in a
// t.TempDir() and waits until /readyz is ok and the default namespace
// exists. The processes are killed by t.Cleanup. A missing binary fails the
// test with a message saying to run `make testbed`.
func StartKube(t testing.TB, opts ...KubeOption) *Kube {
	t.Helper()
	k, err := startKube(t, opts)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// StartKubes starts n independent clusters at the same time (faster than n
// calls to StartKube on a multi-core machine).
func StartKubes(t testing.TB, n int, opts ...KubeOption) []*Kube {
	t.Helper()
	ks := make([]*Kube, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { ks[i], errs[i] = startKube(t, opts) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return ks
}

// KubeOption changes how StartKube and StartKubes start a cluster; the
// defaults suit most tests.
type KubeOption func(*kubeOptions)

type kubeOptions struct {
	serviceCIDRs string
}

// DefaultServiceCIDR is the Service IP range of a cluster started without
// options: single-stack IPv4.
const DefaultServiceCIDR = "10.96.0.0/16"

// DualStackServiceCIDRs are the IPv4 and IPv6 Service ranges WithDualStack
// gives a cluster.
const DualStackServiceCIDRs = DefaultServiceCIDR + ",fd00:10:96::/112"

// WithDualStack starts the API server with an IPv4 and an IPv6 Service
// range, so a Service with ipFamilyPolicy RequireDualStack gets a
// ClusterIP of each family.
func WithDualStack() KubeOption {
	return func(o *kubeOptions) { o.serviceCIDRs = DualStackServiceCIDRs }
}

func startKube(t testing.TB, opts []KubeOption) (*Kube, error) {
	t.Helper()
	o := kubeOptions{serviceCIDRs: DefaultServiceCIDR}
	for _, opt := range opts {
		opt(&o)
	}
	apiBin, err := Bin("kube-apiserver")
	if err != nil {
		return nil, err
	}
	etcdBin, err := Bin("etcd")
	if err != nil {
		return nil, err
	}
	dir := t.TempDir()
	k := &Kube{
		t:            t,
		apiBin:       apiBin,
		Dir:          dir,
		APIServerLog: filepath.Join(dir, "kube-apiserver.log"),
		EtcdLog:      filepath.Join(dir, "etcd.log"),
		Kubeconfig:   filepath.Join(dir, "kubeconfig"),
	}
	// Registered after t.TempDir, so it runs before the directory is removed.
	t.Cleanup(k.cleanup)

	p, err := writePKI(filepath.Join(dir, "pki"))
	if err != nil {
		return nil, err
	}
	k.CAData = p.caPEM
	k.Token = p.adminToken
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(p.caPEM)
	k.probe = &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: pool},
		DisableKeepAlives: true,
	}

	t0 := time.Now()
	if err := k.startEtcd(etcdBin); err != nil {
		return nil, err
	}
	tEtcd := time.Since(t0)

	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		ports, err := freePorts(1, false)
		if err != nil {
			return nil, err
		}
		k.apiPort = ports[0]
		k.Server = "https://127.0.0.1:" + strconv.Itoa(k.apiPort)
		k.apiArgs = []string{
			"--etcd-servers=" + k.etcdURL,
			"--bind-address=127.0.0.1",
			"--advertise-address=127.0.0.1",
			"--secure-port=" + strconv.Itoa(k.apiPort),
			"--tls-cert-file=" + p.serverCert,
			"--tls-private-key-file=" + p.serverKey,
			"--client-ca-file=" + p.caCert,
			"--token-auth-file=" + p.tokenFile,
			"--authorization-mode=RBAC",
			"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
			"--service-account-key-file=" + p.saPub,
			"--service-account-signing-key-file=" + p.saKey,
			"--service-cluster-ip-range=" + o.serviceCIDRs,
			"--disable-admission-plugins=ServiceAccount",
			"--endpoint-reconciler-type=none",
			"--allow-privileged=true",
			"--profiling=false",
			"--cert-dir=" + filepath.Join(dir, "pki"),
		}
		lastErr = k.startAPIServer()
		if lastErr == nil || !logShowsAddrInUse(k.APIServerLog) {
			break
		}
	}
	if lastErr != nil {
		return nil, lastErr
	}
	t.Logf("testbed: kube-apiserver %s ready at %s after %.1fs (etcd %.1fs), logs in %s",
		K8sVersion, k.Server, time.Since(t0).Seconds(), tEtcd.Seconds(), dir)

	k.kubeconfig = k.renderKubeconfig(p)
	if err := os.WriteFile(k.Kubeconfig, k.kubeconfig, 0o600); err != nil {
		return nil, err
	}
	return k, nil
}

func (k *Kube) startEtcd(bin string) error {
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		ports, err := freePorts(2, false)
		if err != nil {
			return err
		}
		client := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
		peer := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
		args := []string{
			"--name=testbed",
			"--data-dir=" + filepath.Join(k.Dir, "etcd"),
			"--listen-client-urls=" + client,
			"--advertise-client-urls=" + client,
			"--listen-peer-urls=" + peer,
			"--initial-advertise-peer-urls=" + peer,
			"--initial-cluster=testbed=" + peer,
			"--unsafe-no-fsync",
			"--quota-backend-bytes=2147483648",
		}
		p, err := startProc("etcd", bin, args, k.Dir, k.EtcdLog)
		if err != nil {
			return err
		}
		k.mu.Lock()
		k.etcd = p
		k.mu.Unlock()
		lastErr = waitFor(p, "etcd", startTimeout, func(ctx context.Context) error {
			return k.get(ctx, client+"/health", "", nil)
		})
		if lastErr == nil {
			k.etcdURL = client
			return nil
		}
		p.stop(syscall.SIGKILL, 0)
		if !logShowsAddrInUse(k.EtcdLog) {
			break
		}
	}
	return lastErr
}

// startAPIServer starts kube-apiserver with k.apiArgs and waits until it is
// ready and has created the default namespace.
func (k *Kube) startAPIServer() error {
	p, err := startProc("kube-apiserver", k.apiBin, k.apiArgs, k.Dir, k.APIServerLog)
	if err != nil {
		return err
	}
	k.mu.Lock()
	k.apiserver = p
	k.mu.Unlock()
	err = waitFor(p, "kube-apiserver /readyz", startTimeout, func(ctx context.Context) error {
		var body []byte
		if err := k.get(ctx, k.Server+"/readyz", k.Token, &body); err != nil {
			return err
		}
		if string(body) != "ok" {
			return fmt.Errorf("readyz says %q", body)
		}
		return nil
	})
	if err == nil {
		// Created by a post-start controller that /readyz does not wait for.
		err = waitFor(p, "namespace default", startTimeout, func(ctx context.Context) error {
			return k.get(ctx, k.Server+"/api/v1/namespaces/default", k.Token, nil)
		})
	}
	if err != nil {
		p.stop(syscall.SIGKILL, 0)
	}
	return err
}

// get does one GET and fails unless the status is 200.
func (k *Kube) get(ctx context.Context, url, token string, body *[]byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := k.probe.RoundTrip(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %.200s", url, resp.Status, b)
	}
	if body != nil {
		*body = b
	}
	return nil
}

func (k *Kube) renderKubeconfig(p *pki) []byte {
	b64 := base64.StdEncoding.EncodeToString
	name := "testbed-" + strconv.Itoa(k.apiPort)
	return fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters:
- name: %[1]s
  cluster:
    server: %[2]s
    certificate-authority-data: %[3]s
users:
- name: %[1]s-admin
  user:
    token: %[4]s
- name: %[1]s-admin-cert
  user:
    client-certificate-data: %[5]s
    client-key-data: %[6]s
contexts:
- name: %[1]s
  context:
    cluster: %[1]s
    user: %[1]s-admin
- name: %[1]s-cert
  context:
    cluster: %[1]s
    user: %[1]s-admin-cert
current-context: %[1]s
`, name, k.Server, b64(k.CAData), k.Token, b64(p.clientCertPEM), b64(p.clientKeyPEM))
}

// KubeconfigBytes returns the content of the Kubeconfig file. It is self
// contained (CA, token and client certificate inline), so it can be stored in
// a Secret for multi-cluster tests.
func (k *Kube) KubeconfigBytes() []byte {
	return append([]byte(nil), k.kubeconfig...)
}

// RestConfig returns a new client config for the admin token, with QPS and
// Burst raised so client-side throttling does not slow tests down.
func (k *Kube) RestConfig() *rest.Config {
	return &rest.Config{
		Host:            k.Server,
		BearerToken:     k.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: append([]byte(nil), k.CAData...)},
		QPS:             200,
		Burst:           400,
	}
}

// Client returns a clientset for the admin token. The same clientset is
// returned on every call; it keeps working across Stop and Start. Its
// connections are closed by Stop and at cleanup.
func (k *Kube) Client() kubernetes.Interface {
	k.t.Helper()
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.client != nil {
		return k.client
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(k.CAData)
	// Own transport (instead of client-go's process-wide cache) so that
	// cleanup can close its idle connections: no goroutines outlive the test.
	k.clientTr = utilnet.SetTransportDefaults(&http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
	})
	cfg := k.RestConfig()
	cfg.TLSClientConfig = rest.TLSClientConfig{}
	cfg.Transport = k.clientTr
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		k.t.Fatalf("testbed: clientset: %v", err)
	}
	k.client = c
	return c
}

// Stop stops kube-apiserver (SIGTERM, then SIGKILL after 10 s). etcd and
// all data stay; Start brings the API server back on the same port.
// Stopping a stopped server does nothing.
func (k *Kube) Stop() {
	k.t.Helper()
	k.mu.Lock()
	p := k.apiserver
	tr := k.clientTr
	k.mu.Unlock()
	p.stop(syscall.SIGTERM, stopGrace)
	if tr != nil {
		tr.CloseIdleConnections()
	}
}

// Start starts kube-apiserver again, on the same port with the same
// certificates and token, and waits until it is ready. Starting a running
// server does nothing. Like t.Fatal, call it from the test's goroutine.
func (k *Kube) Start() {
	k.t.Helper()
	k.mu.Lock()
	p := k.apiserver
	k.mu.Unlock()
	if p != nil && !p.exited() {
		return
	}
	t0 := time.Now()
	if err := retryAddrInUse(k.APIServerLog, k.startAPIServer); err != nil {
		k.t.Fatalf("testbed: restart kube-apiserver on %s: %v", k.Server, err)
	}
	k.t.Logf("testbed: kube-apiserver restarted at %s after %.1fs", k.Server, time.Since(t0).Seconds())
}

// Freeze stops kube-apiserver with SIGSTOP: its port stays open and
// connections hang unanswered, as when a cluster's API server is
// unreachable without refusing. Thaw resumes it; cleanup kills it either way.
func (k *Kube) Freeze() { k.signalAPIServer(syscall.SIGSTOP) }

// Thaw resumes a frozen kube-apiserver (SIGCONT).
func (k *Kube) Thaw() { k.signalAPIServer(syscall.SIGCONT) }

func (k *Kube) signalAPIServer(sig syscall.Signal) {
	k.mu.Lock()
	p := k.apiserver
	k.mu.Unlock()
	if p != nil && !p.exited() {
		_ = syscall.Kill(-p.cmd.Process.Pid, sig)
	}
}

// Running reports whether kube-apiserver is running.
func (k *Kube) Running() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.apiserver != nil && !k.apiserver.exited()
}

func (k *Kube) cleanup() {
	k.mu.Lock()
	api, etcd, tr := k.apiserver, k.etcd, k.clientTr
	k.mu.Unlock()
	// Nothing is kept, so no need for a graceful shutdown.
	api.stop(syscall.SIGKILL, 0)
	etcd.stop(syscall.SIGKILL, 0)
	if tr != nil {
		tr.CloseIdleConnections()
	}
	if k.probe != nil {
		k.probe.CloseIdleConnections()
	}
	if k.t.Failed() {
		k.t.Logf("testbed: kube-apiserver %s\n%s", k.Server, logTail(k.APIServerLog))
	}
}
