package testbed

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"testing"
)

// FaultProxy is an HTTP reverse proxy on 127.0.0.1 in front of a real
// server (a kube-apiserver, a Consul agent). It passes requests through,
// streaming long polls and watches as they come, until the test tells it to
// answer some of them itself: with an error status (410, 429, 5xx), or
// with a body of its own. It can also cut every connection, so that
// clients must reconnect and start their watches again.
type FaultProxy struct {
	// URL is the proxy's address, http://127.0.0.1:PORT, or https:// when
	// the target is HTTPS (then CAData is the proxy's certificate, which
	// clients must trust instead of the target's).
	URL    string
	CAData []byte

	srv *httptest.Server
	tr  *http.Transport

	mu       sync.Mutex
	fault    func(*http.Request) *Fault
	requests []ProxiedRequest
	inflight map[int]context.CancelFunc
}

// Fault is what the proxy answers instead of passing a request on.
type Fault struct {
	Status int
	Header http.Header
	Body   string
}

// ProxiedRequest is one request the proxy received.
type ProxiedRequest struct {
	Method, Path, RawQuery string
	// Status is the status answered (0 until the answer began).
	Status int
	// Injected says the proxy answered it itself.
	Injected bool
}

// StartFaultProxy starts a proxy in front of target (http:// or https://).
// For an HTTPS target, caData is the PEM bundle that verifies it; the
// proxy then serves HTTPS itself. Client credentials (bearer tokens)
// pass through; client certificates do not.
func StartFaultProxy(t testing.TB, target string, caData []byte) *FaultProxy {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatalf("fault proxy target %q: %v", target, err)
	}
	p := &FaultProxy{tr: &http.Transport{MaxIdleConnsPerHost: 100}, inflight: map[int]context.CancelFunc{}}
	if len(caData) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(caData) {
			t.Fatalf("fault proxy: no certificate in the CA data for %s", target)
		}
		p.tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	}
	rp := &httputil.ReverseProxy{
		Transport:     p.tr,
		FlushInterval: -1, // watch events and long polls as they come
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(u)
			pr.Out.Host = u.Host
		},
		// Requests cut by CutConnections or cancelled by clients are
		// expected; the clients report what matters.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		r = r.WithContext(ctx)
		p.mu.Lock()
		i := len(p.requests)
		p.requests = append(p.requests, ProxiedRequest{Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery})
		p.inflight[i] = cancel
		fault := p.fault
		p.mu.Unlock()
		defer func() {
			p.mu.Lock()
			delete(p.inflight, i)
			p.mu.Unlock()
		}()
		sw := &statusRecorder{ResponseWriter: w, record: func(code int) {
			p.mu.Lock()
			p.requests[i].Status = code
			p.mu.Unlock()
		}}
		if fault != nil {
			if f := fault(r); f != nil {
				p.mu.Lock()
				p.requests[i].Injected = true
				p.mu.Unlock()
				for k, vs := range f.Header {
					w.Header()[k] = vs
				}
				sw.WriteHeader(f.Status)
				_, _ = io.WriteString(sw, f.Body)
				return
			}
		}
		rp.ServeHTTP(sw, r)
	})
	if u.Scheme == "https" {
		p.srv = httptest.NewTLSServer(handler)
		p.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
		p.CAData = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.srv.Certificate().Raw})
	} else {
		p.srv = httptest.NewServer(handler)
	}
	p.URL = p.srv.URL
	t.Cleanup(func() {
		p.srv.CloseClientConnections()
		p.srv.Close()
		p.tr.CloseIdleConnections()
	})
	return p
}

// SetFault makes the proxy ask f about every new request: a non-nil Fault
// is answered instead of passing the request on. nil passes everything.
func (p *FaultProxy) SetFault(f func(*http.Request) *Fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fault = f
}

// CutConnections ends every request in flight (watches and long polls)
// and closes every client connection, as a load balancer or a restarting
// server does, so clients must start their watches again.
func (p *FaultProxy) CutConnections() {
	p.mu.Lock()
	for _, cancel := range p.inflight {
		cancel()
	}
	p.mu.Unlock()
	p.srv.CloseClientConnections()
	p.tr.CloseIdleConnections()
}

// Requests returns the requests received so far, in order.
func (p *FaultProxy) Requests() []ProxiedRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]ProxiedRequest(nil), p.requests...)
}

type statusRecorder struct {
	http.ResponseWriter
	record func(int)
	wrote  bool
}

func (w *statusRecorder) WriteHeader(code int) {
	if !w.wrote {
		w.wrote = true
		w.record(code)
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusRecorder) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

// Flush lets the reverse proxy stream watch events through.
func (w *statusRecorder) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}
