package main

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	grpcxds "google.golang.org/grpc/xds"
)

// backend is a real gRPC server on 127.0.0.1 that answers with its name.
type backend struct {
	testgrpc.UnimplementedTestServiceServer
	name string
	port int
}

func (b *backend) UnaryCall(context.Context, *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	return &testgrpc.SimpleResponse{Hostname: b.name}, nil
}

func startBackend(t *testing.T, name string) *backend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &backend{name: name, port: ln.Addr().(*net.TCPAddr).Port}
	s := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(s, b)
	go s.Serve(ln)
	t.Cleanup(s.Stop)
	return b
}

// echoBlock is a static plugin block serving echo:8080 from the backends.
func echoBlock(backends ...*backend) string {
	var b strings.Builder
	b.WriteString(`plugin "static" {
  config {
    cluster = "cluster1"
    network = "network1"
    service "echo.default.svc.cluster.local" {
      port "grpc" {
        number   = 8080
        protocol = "GRPC"
      }
`)
	for _, be := range backends {
		fmt.Fprintf(&b, "      endpoint {\n        address = \"127.0.0.1\"\n        name = %q\n        ports = { grpc = %d }\n        locality = \"us-east1/us-east1-b\"\n      }\n", be.name, be.port)
	}
	b.WriteString("    }\n  }\n}\n")
	return b.String()
}

// xdsClient dials target through estuary with grpc-go's own xDS client,
// as a node on network1 in cluster1.
func xdsClient(t *testing.T, xdsAddr, nodeID, target string) testgrpc.TestServiceClient {
	t.Helper()
	return testgrpc.NewTestServiceClient(xdsConn(t, xdsAddr, nodeID, target, "network1", "cluster1"))
}

// xdsConn is a channel to xds:///target through estuary, with grpc-go's
// own xDS client, as a proxyless node on network in cluster.
func xdsConn(t *testing.T, xdsAddr, nodeID, target, network, cluster string) *grpc.ClientConn {
	t.Helper()
	return dialXDS(t, xdsAddr, target, fmt.Sprintf(`{"id": %q, "metadata": {"GENERATOR": "grpc", "NETWORK": %q, "CLUSTER_ID": %q}}`, nodeID, network, cluster))
}

// dialXDS is a channel to xds:///target through estuary with grpc-go's
// own xDS client, whose bootstrap has node, a JSON object.
func dialXDS(t *testing.T, xdsAddr, target, node string) *grpc.ClientConn {
	t.Helper()
	bootstrap := fmt.Sprintf(`{
  "xds_servers": [{"server_uri": %q, "channel_creds": [{"type": "insecure"}], "server_features": ["xds_v3"]}],
  "node": %s
}`, xdsAddr, node)
	rb, err := grpcxds.NewXDSResolverWithConfigForTesting([]byte(bootstrap))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("xds:///"+target, grpc.WithResolvers(rb), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// callers counts which backends answered recent calls.
func call(ctx context.Context, c testgrpc.TestServiceClient) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := c.UnaryCall(ctx, &testgrpc.SimpleRequest{})
	return resp.GetHostname(), err
}

// waitServedBy polls until the last `window` calls were answered by
// exactly the backends in want.
func waitServedBy(t *testing.T, c testgrpc.TestServiceClient, want ...string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last map[string]int
	for time.Now().Before(deadline) {
		seen := map[string]int{}
		for range 40 {
			name, err := call(context.Background(), c)
			if err != nil {
				seen["error: "+err.Error()]++
				continue
			}
			seen[name]++
		}
		last = seen
		ok := len(seen) == len(want)
		for _, w := range want {
			if seen[w] == 0 {
				ok = false
			}
		}
		if ok {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("calls never reached exactly %v; last 40 calls: %v", want, last)
}

func TestProxylessGRPCClientFollowsTheRegistry(t *testing.T) {
	b1, b2, b3 := startBackend(t, "b1"), startBackend(t, "b2"), startBackend(t, "b3")
	h := startHost(t, echoBlock(b1, b2))
	node := "sidecar~127.0.0.1~client.default~default.svc.cluster.local"
	c := xdsClient(t, h.xds, node, "echo.default.svc.cluster.local:8080")

	waitServedBy(t, c, "b1", "b2")

	// What the node receives, as an operator sees it.
	out, err := exec.Command(estuaryBin, "proxy-config", "endpoints", "--node", node,
		"--cluster", "outbound|8080||echo.default.svc.cluster.local", "--admin", strings.TrimPrefix(h.admin, "http://")).CombinedOutput()
	if err != nil {
		t.Fatalf("proxy-config: %v\n%s", err, out)
	}
	for _, want := range []string{fmt.Sprintf("127.0.0.1:%d", b1.port), fmt.Sprintf("127.0.0.1:%d", b2.port), "HEALTHY", "us-east1/us-east1-b", "network1", "cluster1"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("proxy-config output lacks %q:\n%s", want, out)
		}
	}

	// Add a backend: traffic reaches it.
	h.rewrite(echoBlock(b1, b2, b3))
	h.signal(syscall.SIGHUP)
	waitServedBy(t, c, "b1", "b2", "b3")

	// Remove one: traffic stops reaching it.
	h.rewrite(echoBlock(b2, b3))
	h.signal(syscall.SIGHUP)
	waitServedBy(t, c, "b2", "b3")

	// Kill the registry plugin while calls run: no call fails.
	ctx, cancel := context.WithCancel(context.Background())
	var calls, failures atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				_, err := call(ctx, c)
				calls.Add(1)
				if err != nil && ctx.Err() == nil {
					failures.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				}
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	_, pid, restartsBefore := h.plugin("static")
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	h.eventually("the plugin to restart", 30*time.Second, func() bool {
		state, newPID, restarts := h.plugin("static")
		return state == "running" && newPID != pid && restarts > restartsBefore
	})
	time.Sleep(500 * time.Millisecond)
	cancel()
	wg.Wait()
	if failures.Load() > 0 {
		t.Errorf("%d of %d calls failed while the plugin restarted; first: %v", failures.Load(), calls.Load(), firstErr.Load())
	}
	if calls.Load() < 10 {
		t.Errorf("only %d calls ran during the restart", calls.Load())
	}
	waitServedBy(t, c, "b2", "b3")
}
