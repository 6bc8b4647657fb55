package consul

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"syscall"
	"testing"

	"github.com/hashicorp/consul/api"
)

func TestNextIndex(t *testing.T) {
	tests := []struct {
		name      string
		prev, got uint64
		next      uint64
		reset     bool
	}{
		{"first list", 0, 42, 42, false},
		{"forward", 42, 50, 50, false},
		{"unchanged (wait expired)", 42, 42, 42, false},
		{"backwards resets to 0 and relists", 42, 7, 0, true},
		{"zero becomes one", 0, 0, 1, false},
		{"zero after a real index is backwards", 42, 0, 0, true},
		{"zero after the forced one is backwards too", 1, 0, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			next, reset := nextIndex(tt.prev, tt.got)
			if next != tt.next || reset != tt.reset {
				t.Errorf("nextIndex(%d, %d) = %d, %v; want %d, %v", tt.prev, tt.got, next, reset, tt.next, tt.reset)
			}
		})
	}
}

// TestRetryTiming pins the consul loops' backoff: from retryBase to
// retryMax, jittered so that failed watches spread out.
func TestRetryTiming(t *testing.T) {
	b := newBackoff()
	for range 20 {
		b.Next()
	}
	if d := b.Next(); d < retryMax/2 || d > retryMax*3/2 {
		t.Errorf("capped delay %v, want within ±50%% of %v", d, retryMax)
	}
	b.Reset()
	if d := b.Next(); d > retryBase*3/2 {
		t.Errorf("first delay after Reset %v, want at most %v", d, retryBase*3/2)
	}
}

func TestDescribe(t *testing.T) {
	refused := &url.Error{Op: "Get", URL: "http://127.0.0.1:8500/v1/catalog/services?index=42&wait=300000ms",
		Err: fmt.Errorf("dial tcp 127.0.0.1:8500: connect: %w", syscall.ECONNREFUSED)}
	tests := []struct {
		name string
		err  error
		want []string
		not  []string
	}{
		{"403", api.StatusError{Code: 403, Body: "ACL not found"}, []string{"permission denied", "HTTP 403 Forbidden: ACL not found", "token_file"}, nil},
		{"429", api.StatusError{Code: 429, Body: "Your IP is issuing too many concurrent connections, please rate limit your calls\n"},
			[]string{"HTTP 429", "http_max_conns_per_client", "max_watchers"}, nil},
		{"500", api.StatusError{Code: 500, Body: "No cluster leader"}, []string{"Consul failed (HTTP 500 Internal Server Error: No cluster leader)"}, nil},
		{"refused", refused, []string{"cannot reach the agent", "127.0.0.1:8500/v1/catalog/services", "connection refused"}, []string{"index=42"}},
		{"other", errors.New("boom"), []string{"boom"}, nil},
		{"explained", fmt.Errorf("%w (over HTTP/1.1: %w)", &url.Error{Op: "Get", URL: "https://127.0.0.1:8501/v1/catalog/services",
			Err: errors.New("http2: client conn could not be established")}, errors.New("remote error: tls: certificate required")),
			[]string{"client conn could not be established", "(over HTTP/1.1: remote error: tls: certificate required)"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := describe(tt.err)
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("describe = %q, lacks %q", got, w)
				}
			}
			for _, n := range tt.not {
				if strings.Contains(got, n) {
					t.Errorf("describe = %q, has %q (it must not change between retries)", got, n)
				}
			}
		})
	}
}

// TestExplainHiddenTLSFailure: when Go's HTTP/2 client hides why an agent
// dropped the connection, explain asks once more over HTTP/1.1 and adds
// the agent's TLS alert; errors that name their cause pass unchanged.
func TestExplainHiddenTLSFailure(t *testing.T) {
	newAgent := func(auth tls.ClientAuthType) (*httptest.Server, *tls.Config) {
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, `"leader"`) }))
		srv.TLS = &tls.Config{ClientAuth: auth, MinVersion: tls.VersionTLS13}
		srv.Config.ErrorLog = log.New(io.Discard, "", 0) // refused handshakes are the point
		srv.StartTLS()
		t.Cleanup(srv.Close)
		roots := x509.NewCertPool()
		roots.AddCert(srv.Certificate())
		return srv, &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	}
	strict, strictTLS := newAgent(tls.RequireAnyClientCert)
	open, openTLS := newAgent(tls.NoClientCert)
	hidden := &url.Error{Op: "Get", URL: "https://agent/v1/catalog/services", Err: errors.New("http2: client conn could not be established")}
	refused := &url.Error{Op: "Get", URL: "https://agent/v1/catalog/services", Err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}
	tests := []struct {
		name string
		srv  *httptest.Server
		conf *tls.Config
		err  error
		want string // in the explained error; "" means unchanged
	}{
		{"agent refuses the missing certificate", strict, strictTLS, hidden, "over HTTP/1.1: "},
		{"agent accepts HTTP/1.1: nothing to add", open, openTLS, hidden, ""},
		{"network errors name their cause", strict, strictTLS, refused, ""},
		{"plain HTTP", strict, nil, hidden, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &run{s: &settings{tls: tt.conf, api: api.Config{Address: tt.srv.Listener.Addr().String()}}}
			got := r.explain(context.Background(), tt.err)
			if !errors.Is(got, tt.err) {
				t.Errorf("explain lost the original error: %v", got)
			}
			switch {
			case tt.want == "" && got.Error() != tt.err.Error():
				t.Errorf("explain = %q, want it unchanged", got)
			case tt.want != "" && (!strings.Contains(got.Error(), tt.want) || !strings.Contains(got.Error(), "tls")):
				t.Errorf("explain = %q, want %q and the TLS alert", got, tt.want)
			}
		})
	}
}
