package consul

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"
	"github.com/hashicorp/go-plugin/runner"
	"google.golang.org/grpc"

	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/configschema"
	"github.com/estuary-mesh/estuary/sdk/sdktest"
	"github.com/estuary-mesh/estuary/testbed"
)

// --- a plugin whose every Watch response is checked ---------------------

// strict serves the plugin like sdktest.Start, but its stream consumer runs
// an invariant after every single response, so a transient state (an
// instance emptied for one response) cannot slip between two polls of a
// WaitFor. It also keeps the plugin's log, to check what it says.
type strict struct {
	rpc    registryv1.RegistryClient
	client *goplugin.Client
	cancel context.CancelFunc
	logs   *syncBuffer

	mu        sync.Mutex
	cond      *sync.Cond
	replica   *sdktest.Replica
	violation string
	ended     bool
	invariant func(*sdktest.Replica) string
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
	t  testing.TB
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.t.Log(strings.TrimRight(string(p), "\n"))
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func startStrict(t testing.TB) *strict {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	logs := &syncBuffer{t: t}
	logger := hclog.New(&hclog.LoggerOptions{Name: "consul", Level: hclog.Debug, Output: logs})
	rc, closed, err := sdk.ServeTest(ctx, Factory, logger)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	// As sdktest does: go-plugin's default reattach would watch this very
	// process's PID in a goroutine that never ends.
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
		cancel()
		t.Fatal(err)
	}
	raw, err := cp.Dispense(sdk.PluginName)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	s := &strict{rpc: raw.(registryv1.RegistryClient), client: client, cancel: cancel, logs: logs, replica: sdktest.NewReplica()}
	s.cond = sync.NewCond(&s.mu)
	t.Cleanup(func() {
		// Stop serving first: a Shutdown RPC (client.Kill) racing the
		// server's own stop is a data race inside go-plugin.
		cancel()
		<-closed
		client.Kill()
		_ = cp.Close() // a reattached client leaves its connection open
	})
	return s
}

// inProcess is the go-plugin runner of a plugin served in this process.
type inProcess struct{ closed <-chan struct{} }

func (r inProcess) Wait(context.Context) error                     { <-r.closed; return nil }
func (inProcess) Kill(context.Context) error                       { return nil }
func (inProcess) ID() string                                       { return "in-process" }
func (inProcess) PluginToHost(n, a string) (string, string, error) { return n, a, nil }
func (inProcess) HostToPlugin(n, a string) (string, string, error) { return n, a, nil }

// configure applies an HCL config body, failing on any diagnostic.
func (s *strict) configure(t testing.TB, hcl string) {
	t.Helper()
	if diags := s.tryConfigure(t, hcl); len(diags) > 0 {
		t.Fatalf("Configure: %v", diags)
	}
}

func (s *strict) tryConfigure(t testing.TB, hcl string) sdk.Diagnostics {
	t.Helper()
	js, hd := configschema.ParseHCL("plugins.hcl", []byte(hcl), schema)
	if hd.HasErrors() {
		t.Fatalf("config does not match the schema: %v", hd)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := s.rpc.Configure(ctx, &registryv1.ConfigureRequest{ConfigJson: js, Mesh: &registryv1.MeshSettings{Network: "mesh-net"}})
	if err != nil {
		t.Fatalf("Configure: %v", err)
	}
	var diags sdk.Diagnostics
	for _, d := range resp.GetDiagnostics() {
		diags = append(diags, sdk.Diagnostic{Severity: sdk.Severity(d.GetSeverity()), Summary: d.GetSummary(), Path: d.GetPath()})
	}
	return diags
}

// watch opens the stream; invariant (may be nil, settable later with
// setInvariant) runs after every response and returns a violation or "".
func (s *strict) watch(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := s.rpc.Watch(ctx, &registryv1.WatchRequest{})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			resp, err := stream.Recv()
			s.mu.Lock()
			if err != nil {
				s.ended = true
				s.cond.Broadcast()
				s.mu.Unlock()
				return
			}
			if aerr := s.replica.Apply(resp); aerr != nil && s.violation == "" {
				s.violation = "protocol: " + aerr.Error()
			}
			if s.invariant != nil && s.violation == "" {
				if v := s.invariant(s.replica); v != "" {
					s.violation = fmt.Sprintf("after response %d: %s\n%s", s.replica.Responses, v, s.replica)
				}
			}
			s.cond.Broadcast()
			s.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
}

func (s *strict) setInvariant(f func(*sdktest.Replica) string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.invariant = f
}

// waitFor blocks until ok holds, failing on timeout or on a violation of
// the invariant.
func (s *strict) waitFor(t testing.TB, timeout time.Duration, what string, ok func(*sdktest.Replica) bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	timer := time.AfterFunc(timeout, func() { s.mu.Lock(); s.cond.Broadcast(); s.mu.Unlock() })
	defer timer.Stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		if s.violation != "" {
			t.Fatalf("waiting for %s: invariant violated %s", what, s.violation)
		}
		if ok(s.replica) {
			return
		}
		if s.ended {
			t.Fatalf("waiting for %s: stream ended", what)
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: timed out after %s; state:\n%s", what, timeout, s.replica)
		}
		s.cond.Wait()
	}
}

func (s *strict) with(f func(*sdktest.Replica)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s.replica)
}

// --- a proxy in front of the agent that records and injects faults ------

// proxyReq is one request that went through the proxy. Start and End are
// positions on the proxy's clock, shared with mark(), so tests can order
// requests against their own actions without reading the wall clock.
type proxyReq struct {
	Path       string
	Index      string // the request's ?index=, "" for a non-blocking list
	Start, End int64
	Status     int
	RespIndex  string // X-Consul-Index answered
	Injected   string // what the proxy did instead of passing through
	Began      time.Time
}

// fault is what the proxy does with one request.
type fault struct {
	status int    // answer this status without asking the agent
	index  string // ask the agent without blocking, answer with this index
}

type agentProxy struct {
	srv   *httptest.Server
	tr    *http.Transport
	clock atomic.Int64
	count atomic.Int64

	mu     sync.Mutex
	reqs   []*proxyReq
	faultf func(r *http.Request) fault
}

type proxyKey struct{}

// startProxy puts a reverse proxy in front of the agent at addr.
func startProxy(t testing.TB, addr string) *agentProxy {
	t.Helper()
	target := &url.URL{Scheme: "http", Host: addr}
	p := &agentProxy{tr: &http.Transport{MaxIdleConnsPerHost: 10000, IdleConnTimeout: 30 * time.Second}}
	rp := &httputil.ReverseProxy{
		Transport: p.tr,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			if f, _ := pr.In.Context().Value(proxyKey{}).(fault); f.index != "" {
				q := pr.Out.URL.Query()
				q.Del("index")
				q.Del("wait")
				pr.Out.URL.RawQuery = q.Encode()
			}
		},
		ModifyResponse: func(resp *http.Response) error {
			if f, _ := resp.Request.Context().Value(proxyKey{}).(fault); f.index != "" {
				resp.Header.Set("X-Consul-Index", f.index)
			}
			return nil
		},
		ErrorLog: log.New(io.Discard, "", 0), // cancelled long polls at cleanup are expected
	}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.count.Add(1)
		rec := &proxyReq{Path: r.URL.Path, Index: r.URL.Query().Get("index"), Start: p.clock.Add(1), Began: time.Now()}
		p.mu.Lock()
		p.reqs = append(p.reqs, rec)
		ff := p.faultf
		p.mu.Unlock()
		var f fault
		if ff != nil {
			f = ff(r)
		}
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		switch {
		case f.status != 0:
			rec.Injected = fmt.Sprintf("status %d", f.status)
			http.Error(sw, "injected by the test proxy", f.status)
		default:
			if f.index != "" {
				rec.Injected = "index " + f.index
			}
			rp.ServeHTTP(sw, r.WithContext(context.WithValue(r.Context(), proxyKey{}, f)))
		}
		p.mu.Lock()
		rec.Status, rec.RespIndex, rec.End = sw.status, sw.Header().Get("X-Consul-Index"), p.clock.Add(1)
		p.mu.Unlock()
	}))
	t.Cleanup(func() {
		p.srv.CloseClientConnections()
		p.srv.Close()
		p.tr.CloseIdleConnections()
	})
	return p
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (p *agentProxy) addr() string { return strings.TrimPrefix(p.srv.URL, "http://") }

// mark returns a position on the proxy's clock.
func (p *agentProxy) mark() int64 { return p.clock.Add(1) }

func (p *agentProxy) setFault(f func(r *http.Request) fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faultf = f
}

// requests returns copies of the recorded requests to path.
func (p *agentProxy) requests(path string) []proxyReq {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []proxyReq
	for _, r := range p.reqs {
		if path == "" || r.Path == path {
			out = append(out, *r)
		}
	}
	return out
}

// --- Consul fixtures ----------------------------------------------------

// register registers a service instance with the agent, with a TTL check
// (ID "ttl-<id>") in the given state.
func register(t testing.TB, c *api.Client, reg api.AgentServiceRegistration, status string) {
	t.Helper()
	reg.Check = &api.AgentServiceCheck{CheckID: "ttl-" + reg.ID, TTL: "1h", Status: status}
	if err := c.Agent().ServiceRegister(&reg); err != nil {
		t.Fatalf("register %s: %v", reg.ID, err)
	}
}

func setTTL(t testing.TB, c *api.Client, id, status string) {
	t.Helper()
	if err := c.Agent().UpdateTTL("ttl-"+id, "set by the test", status); err != nil {
		t.Fatalf("update check of %s to %s: %v", id, status, err)
	}
}

func deregister(t testing.TB, c *api.Client, id string) {
	t.Helper()
	if err := c.Agent().ServiceDeregister(id); err != nil {
		t.Fatalf("deregister %s: %v", id, err)
	}
}

// agentConfig is a config body pointing at addr, watching dc1.
func agentConfig(addr string, extra ...string) string {
	return fmt.Sprintf("address = %q\ndatacenters = [\"dc1\"]\n%s\n", addr, strings.Join(extra, "\n"))
}

func dc1(r *sdktest.Replica) *sdktest.Instance { return r.Instance(sdk.ProviderConsul, "dc1") }

// endpointsOf returns the endpoint addresses of a hostname in dc1.
func endpointsOf(r *sdktest.Replica, host string) []string {
	in := dc1(r)
	if in == nil {
		return nil
	}
	var out []string
	for _, e := range in.Endpoints[host] {
		out = append(out, e.Address)
	}
	return out
}

func hasService(r *sdktest.Replica, host string) bool {
	in := dc1(r)
	return in != nil && in.Services[host] != nil
}

func healthOf(r *sdktest.Replica) (healthy bool, msg string, known bool) {
	in := dc1(r)
	if in == nil || in.Health == nil {
		return false, "", false
	}
	return in.Health.Healthy, in.Health.Message, true
}

func startConsul(t testing.TB, opts ...testbed.ConsulOption) *testbed.Consul {
	t.Helper()
	return testbed.StartConsul(t, opts...)
}
