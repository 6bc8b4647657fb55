package admin

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/estuary-mesh/estuary/host/aggregate"
	"github.com/estuary-mesh/estuary/host/config"
	"github.com/estuary-mesh/estuary/host/replica"
	"github.com/estuary-mesh/estuary/host/supervisor"
	"github.com/estuary-mesh/estuary/testbed/certs"
)

// serverWith is newServer with the admin block sec and opts' timeouts.
func serverWith(sec config.Admin, opts Options) *Server {
	store := replica.NewStore(nil)
	opts.Gatherer = prometheus.NewRegistry()
	opts.Aggregate = aggregate.New(store, nil)
	opts.Supervisor = supervisor.NewSupervisor(supervisor.Options{}, hclog.NewNullLogger(), store, nil)
	opts.Security = sec
	return New(hclog.NewNullLogger(), opts)
}

func get(t *testing.T, client *http.Client, url, token string) (int, string, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

// TestAdminToken: with token_file, every page but the probes' needs the
// bearer token; /readyz without it says only whether the host is ready.
func TestAdminToken(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	certs.WriteFile(t, tokenFile, []byte("the-admin-token\n"))
	s := serverWith(config.Admin{TokenFile: tokenFile}, Options{Failed: func() []string { return []string{"xds died: why"} }})
	url, _, _ := running(t, s)
	c := http.DefaultClient
	tests := []struct {
		path, token string
		code        int
		body        string // a substring of the body
	}{
		{"/debug/pluginz", "", http.StatusUnauthorized, "unauthenticated"},
		{"/debug/configz", "wrong", http.StatusUnauthorized, "unauthenticated"},
		{"/metrics", "", http.StatusUnauthorized, "unauthenticated"},
		{"/debug/pluginz", "the-admin-token", http.StatusOK, "[]"},
		{"/debug/pprof/heap", "", http.StatusUnauthorized, "unauthenticated"},
		{"/debug/pprof/heap?debug=1", "the-admin-token", http.StatusOK, "heap profile"},
		{"/debug/pprof/", "the-admin-token", http.StatusOK, "goroutine"},
		{"/healthz", "", http.StatusOK, "ok"},
		{"/readyz", "", http.StatusServiceUnavailable, "not ready\n"},
		{"/readyz", "the-admin-token", http.StatusServiceUnavailable, "xds died: why"},
	}
	for _, tt := range tests {
		code, body, err := get(t, c, url+tt.path, tt.token)
		if err != nil {
			t.Fatal(err)
		}
		if code != tt.code || !strings.Contains(body, tt.body) {
			t.Errorf("GET %s with token %q = %d %q, want %d with %q", tt.path, tt.token, code, body, tt.code, tt.body)
		}
		if tt.token == "" && strings.Contains(body, "xds died") {
			t.Errorf("GET %s without the token shows why the host is not ready: %q", tt.path, body)
		}
	}
}

// TestAdminClientCertificates: with tls { client_ca_file }, a certificate
// from that CA authenticates; none reaches only the probes; one from
// another CA is refused at the handshake.
func TestAdminClientCertificates(t *testing.T) {
	dir := t.TempDir()
	ca, other := certs.NewCA(t, "admin-ca"), certs.NewCA(t, "other-ca")
	cert, key := ca.Server(t, "admin").Write(t, dir, "server")
	caFile := filepath.Join(dir, "ca.pem")
	certs.WriteFile(t, caFile, ca.PEM)
	s := serverWith(config.Admin{TLS: &config.AdminTLS{CertFile: cert, KeyFile: key, ClientCAFile: caFile}}, Options{})
	url, _, _ := running(t, s)
	url = "https" + strings.TrimPrefix(url, "http")
	client := func(pair *certs.Pair) *http.Client {
		roots := x509.NewCertPool()
		roots.AddCert(ca.Cert)
		conf := &tls.Config{RootCAs: roots}
		if pair != nil {
			// Sent whatever CAs the server names, as an attacker would.
			c := pair.TLS(t)
			conf.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &c, nil }
		}
		return &http.Client{Transport: &http.Transport{TLSClientConfig: conf}}
	}
	good, foreign := ca.Client(t), other.Client(t)

	if code, body, err := get(t, client(nil), url+"/debug/pluginz", ""); err != nil || code != http.StatusUnauthorized {
		t.Errorf("no certificate: /debug/pluginz = %d %q %v, want 401", code, body, err)
	}
	if code, _, err := get(t, client(nil), url+"/healthz", ""); err != nil || code != http.StatusOK {
		t.Errorf("no certificate: /healthz = %d %v, want 200", code, err)
	}
	if code, body, err := get(t, client(&good), url+"/debug/pluginz", ""); err != nil || code != http.StatusOK {
		t.Errorf("certificate from the CA: /debug/pluginz = %d %q %v, want 200", code, body, err)
	}
	if code, _, err := get(t, client(&foreign), url+"/debug/pluginz", ""); err == nil {
		t.Errorf("a certificate from another CA: %d, want refused at the handshake", code)
	}
	// Plain HTTP to the TLS port gets nothing.
	if code, _, err := get(t, http.DefaultClient, "http"+strings.TrimPrefix(url, "https")+"/debug/pluginz", ""); err == nil && code == http.StatusOK {
		t.Error("plain HTTP was served")
	}
}

// rawConn dials the admin server and sends a request (or part of one).
func rawConn(t *testing.T, url, request string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := io.WriteString(conn, request); err != nil {
		t.Fatal(err)
	}
	return conn
}

// closedByServer reports whether the server closes conn (after any
// response) within a generous deadline.
func closedByServer(conn net.Conn) error {
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	_, err := io.Copy(io.Discard, conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("still open after 20s")
	}
	return nil
}

// TestAdminTimeouts: a client that never finishes its request, or keeps
// an idle connection, is disconnected.
func TestAdminTimeouts(t *testing.T) {
	s := serverWith(config.Admin{}, Options{ReadTimeout: 200 * time.Millisecond, IdleTimeout: 200 * time.Millisecond})
	url, _, _ := running(t, s)
	slow := rawConn(t, url, "GET /healthz HTTP/1.1\r\nHost: x\r\n") // headers never end
	if err := closedByServer(slow); err != nil {
		t.Errorf("a request whose headers never end: %v", err)
	}
	idle := rawConn(t, url, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(idle), nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("keep-alive request: %v %v", resp, err)
	}
	resp.Body.Close()
	if err := closedByServer(idle); err != nil {
		t.Errorf("an idle keep-alive connection: %v", err)
	}
}

// TestAdminConnectionLimit: past max_connections, a connection is not
// served until another one closes.
func TestAdminConnectionLimit(t *testing.T) {
	s := serverWith(config.Admin{MaxConnections: 1}, Options{})
	url, _, _ := running(t, s)
	first := rawConn(t, url, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	r1 := bufio.NewReader(first)
	if resp, err := http.ReadResponse(r1, nil); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("first connection: %v %v", resp, err)
	}
	second := rawConn(t, url, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	_ = second.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	if n, err := second.Read(make([]byte, 1)); n > 0 || err == nil {
		t.Fatal("a second connection was served while the first, the limit, was open")
	}
	first.Close()
	_ = second.SetReadDeadline(time.Now().Add(20 * time.Second))
	if resp, err := http.ReadResponse(bufio.NewReader(second), nil); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("second connection once the first closed: %v %v", resp, err)
	}
}
