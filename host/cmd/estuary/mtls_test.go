package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	xdscreds "google.golang.org/grpc/credentials/xds"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/peer"
	grpcxds "google.golang.org/grpc/xds"

	"github.com/estuary-mesh/estuary/testbed/certs"
)

const (
	echoID   = "spiffe://cluster.local/ns/default/sa/echo"
	clientID = "spiffe://cluster.local/ns/default/sa/client"
	echoSNI  = "outbound_.8080_._.echo.default.svc.cluster.local"
)

// mtlsBackend is a gRPC server that, with a certificate, requires and
// checks the client's, and answers with its name and the client's SPIFFE
// ID; it records the SNI of every handshake.
type mtlsBackend struct {
	testgrpc.UnimplementedTestServiceServer
	name  string
	port  int
	mu    sync.Mutex
	snis  []string
	calls int
}

func (b *mtlsBackend) UnaryCall(ctx context.Context, _ *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	b.mu.Lock()
	b.calls++
	b.mu.Unlock()
	peerID := "plaintext"
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			peerID = "tls without a SPIFFE ID"
			if cs := ti.State.PeerCertificates; len(cs) > 0 && len(cs[0].URIs) > 0 {
				peerID = cs[0].URIs[0].String()
			}
		}
	}
	return &testgrpc.SimpleResponse{Hostname: b.name, Username: peerID}, nil
}

func (b *mtlsBackend) served() (int, []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.calls, append([]string(nil), b.snis...)
}

// startMTLSBackend serves with pair, trusting ca for client certificates
// (required); a nil ca serves plain text.
func startMTLSBackend(t *testing.T, name string, ca *certs.CA, pair certs.Pair) *mtlsBackend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &mtlsBackend{name: name, port: ln.Addr().(*net.TCPAddr).Port}
	var opts []grpc.ServerOption
	if ca != nil {
		cfg := &tls.Config{
			Certificates: []tls.Certificate{pair.TLS(t)},
			ClientAuth:   tls.RequireAndVerifyClientCert,
			ClientCAs:    certs.Pool(ca),
			MinVersion:   tls.VersionTLS12,
		}
		cfg.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			b.mu.Lock()
			b.snis = append(b.snis, hello.ServerName)
			b.mu.Unlock()
			return nil, nil
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(cfg)))
	}
	s := grpc.NewServer(opts...)
	testgrpc.RegisterTestServiceServer(s, b)
	go s.Serve(ln)
	t.Cleanup(s.Stop)
	return b
}

// mtlsConfig is a plugins.hcl with mesh mtls = mode and, from the static
// plugin, echo and rogue on port 8080 (their workloads in Istio mTLS,
// both declared as the echo service account) served by the backends.
func mtlsConfig(mode string, echo, rogue *mtlsBackend) func(xds, admin string) string {
	return func(xds, admin string) string {
		var b strings.Builder
		fmt.Fprintf(&b, "mesh {\n  cluster_id = \"cluster1\"\n  mtls = %q\n}\nxds {\n  listen = %q\n  debounce_after = \"10ms\"\n}\nadmin {\n  listen = %q\n}\n", mode, xds, admin)
		b.WriteString("plugin \"static\" {\n  config {\n    cluster = \"cluster1\"\n    network = \"network1\"\n")
		for host, be := range map[string]*mtlsBackend{"echo": echo, "rogue": rogue} {
			if be == nil {
				continue
			}
			fmt.Fprintf(&b, `    service "%s.default.svc.cluster.local" {
      port "grpc" {
        number   = 8080
        protocol = "GRPC"
      }
      endpoint {
        address         = "127.0.0.1"
        ports           = { grpc = %d }
        tls_mode        = "istio"
        service_account = %q
      }
    }
`, host, be.port, echoID)
		}
		b.WriteString("  }\n}\n")
		return b.String()
	}
}

// xdsCredsClient is a grpc-go xDS client with xDS credentials: its
// identity and root come from a file_watcher certificate provider named
// "default" in its bootstrap, as istio-agent writes it for proxyless gRPC.
func xdsCredsClient(t *testing.T, xdsAddr, target string, ca *certs.CA, pair certs.Pair) testgrpc.TestServiceClient {
	t.Helper()
	dir := t.TempDir()
	certFile, keyFile := pair.Write(t, dir, "client")
	caFile := dir + "/root.crt"
	certs.WriteFile(t, caFile, ca.PEM)
	bootstrap := fmt.Sprintf(`{
  "xds_servers": [{"server_uri": %q, "channel_creds": [{"type": "insecure"}], "server_features": ["xds_v3"]}],
  "node": {"id": "sidecar~127.0.0.1~client.default~default.svc.cluster.local", "metadata": {"GENERATOR": "grpc", "NETWORK": "network1", "CLUSTER_ID": "cluster1"}},
  "certificate_providers": {"default": {"plugin_name": "file_watcher", "config": {
    "certificate_file": %q, "private_key_file": %q, "ca_certificate_file": %q, "refresh_interval": "600s"}}}
}`, xdsAddr, certFile, keyFile, caFile)
	rb, err := grpcxds.NewXDSResolverWithConfigForTesting([]byte(bootstrap))
	if err != nil {
		t.Fatal(err)
	}
	creds, err := xdscreds.NewClientCredentials(xdscreds.ClientOptions{FallbackCreds: insecure.NewCredentials()})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("xds:///"+target, grpc.WithResolvers(rb), grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return testgrpc.NewTestServiceClient(conn)
}

// callUntil calls until a call succeeds, and returns its answer.
func callUntil(t *testing.T, c testgrpc.TestServiceClient) *testgrpc.SimpleResponse {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var lastErr error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := c.UnaryCall(ctx, &testgrpc.SimpleRequest{})
		cancel()
		if err == nil {
			return resp
		}
		lastErr = err
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("no call succeeded in 30s; last error: %v", lastErr)
	return nil
}

// inXDSSNIProcess reports whether the test runs where grpc-go sends the
// SNI of the cluster (gRFC A101). grpc-go reads GRPC_EXPERIMENTAL_XDS_SNI
// once, when it starts: where it is not set, the test runs again in a
// child process of this test binary that has it, which must pass, and
// the caller returns.
func inXDSSNIProcess(t *testing.T) bool {
	t.Helper()
	if os.Getenv("GRPC_EXPERIMENTAL_XDS_SNI") == "true" {
		return true
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "GRPC_EXPERIMENTAL_XDS_SNI=true")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatalf("with GRPC_EXPERIMENTAL_XDS_SNI=true: %v\n%s", err, out)
	}
	return false
}

// TestProxylessMTLSEndToEnd: a grpc-go client configured only by Estuary
// and its bootstrap reaches a backend that requires its certificate, with
// the SNI Istio's gateways route on; it refuses a backend whose identity
// is not the service's; with mtls = "DISABLE" it speaks plain text.
func TestProxylessMTLSEndToEnd(t *testing.T) {
	if !inXDSSNIProcess(t) {
		return
	}
	ca := certs.NewCA(t, "mesh root")
	clientPair := ca.Workload(t, clientID)
	echo := startMTLSBackend(t, "echo", ca, ca.Workload(t, echoID))
	rogue := startMTLSBackend(t, "rogue", ca, ca.Workload(t, "spiffe://cluster.local/ns/default/sa/rogue"))

	t.Run("STRICT", func(t *testing.T) {
		h := startHostFile(t, mtlsConfig("STRICT", echo, rogue))
		c := xdsCredsClient(t, h.xds, "echo.default.svc.cluster.local:8080", ca, clientPair)
		resp := callUntil(t, c)
		if resp.GetHostname() != "echo" || resp.GetUsername() != clientID {
			t.Errorf("answer = %s, client seen as %q; want echo seeing %s", resp.GetHostname(), resp.GetUsername(), clientID)
		}
		if _, snis := echo.served(); len(snis) == 0 || snis[len(snis)-1] != echoSNI {
			t.Errorf("SNIs the backend saw = %q, want %s", snis, echoSNI)
		}

		// rogue presents a certificate of the mesh, but not the identity
		// the registry gives its service: the client must not talk to it.
		rc := xdsCredsClient(t, h.xds, "rogue.default.svc.cluster.local:8080", ca, clientPair)
		var lastErr error
		for range 10 {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			_, lastErr = rc.UnaryCall(ctx, &testgrpc.SimpleRequest{})
			cancel()
			if lastErr == nil {
				t.Fatal("the client called a backend whose SAN is not the service's identity")
			}
		}
		if calls, snis := rogue.served(); calls != 0 {
			t.Errorf("rogue served %d calls", calls)
		} else if len(snis) == 0 {
			t.Errorf("the client never reached rogue's handshake (last error %v): the refusal proves nothing", lastErr)
		}
	})

	t.Run("PERMISSIVE", func(t *testing.T) {
		// The default must not break a client whose bootstrap has no
		// certificate provider (grpc-go NACKs a cluster naming one it
		// lacks): proxyless gRPC gets plain text, as from istiod.
		plain := startMTLSBackend(t, "plain", nil, certs.Pair{})
		h := startHostFile(t, mtlsConfig("PERMISSIVE", plain, nil))
		waitServedBy(t, xdsClient(t, h.xds, "sidecar~127.0.0.1~plain.default~default.svc.cluster.local", "echo.default.svc.cluster.local:8080"), "plain")
	})

	t.Run("DISABLE", func(t *testing.T) {
		plain := startMTLSBackend(t, "plain", nil, certs.Pair{})
		h := startHostFile(t, mtlsConfig("DISABLE", plain, nil))
		c := xdsCredsClient(t, h.xds, "echo.default.svc.cluster.local:8080", ca, clientPair)
		if resp := callUntil(t, c); resp.GetHostname() != "plain" || resp.GetUsername() != "plaintext" {
			t.Errorf("answer = %s over %q, want plain over plaintext", resp.GetHostname(), resp.GetUsername())
		}
	})
}
