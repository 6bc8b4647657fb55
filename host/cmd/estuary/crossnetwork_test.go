package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	tcpproxyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/estuary-mesh/estuary/testbed/certs"
)

// nginxStream finds nginx and its stream module, installing Debian's
// packages if they are missing; it skips only where apt cannot run.
func nginxStream(t *testing.T) (bin, module string) {
	t.Helper()
	const mod = "/usr/lib/nginx/modules/ngx_stream_module.so"
	bin, err := exec.LookPath("nginx")
	if _, merr := os.Stat(mod); err != nil || merr != nil {
		if _, aerr := exec.LookPath("apt-get"); aerr != nil {
			t.Skip("nginx with its stream module is not installed and there is no apt-get to install it")
		}
		for _, args := range [][]string{{"update", "-qq"}, {"install", "-y", "-qq", "nginx-light", "libnginx-mod-stream"}} {
			cmd := exec.Command("apt-get", args...)
			cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("apt-get %s: %v\n%s", strings.Join(args, " "), err, out)
			}
		}
		if bin, err = exec.LookPath("nginx"); err != nil {
			t.Fatal(err)
		}
	}
	return bin, mod
}

// sniGateway is nginx's stream module with ssl_preread: an SNI-routing
// east-west gateway that passes TLS through without terminating it.
type sniGateway struct {
	t           *testing.T
	bin, module string
	dir, listen string
	cmd         *exec.Cmd
	log         syncBuffer
}

// start (re)starts the gateway with routes, SNI to ADDR:PORT; restarting
// also drops every connection it was passing through.
func (g *sniGateway) start(routes map[string]string) {
	g.t.Helper()
	g.stop()
	var m strings.Builder
	for _, sni := range slices.Sorted(func(yield func(string) bool) {
		for k := range routes {
			if !yield(k) {
				return
			}
		}
	}) {
		fmt.Fprintf(&m, "    %s %s;\n", sni, routes[sni])
	}
	conf := fmt.Sprintf(`load_module %s;
daemon off;
worker_processes 1;
pid %s/nginx.pid;
error_log stderr notice;
events {}
stream {
  map_hash_bucket_size 256;   # SNI names are long
  map $ssl_preread_server_name $upstream {
    default 127.0.0.1:9;
%s  }
  server {
    listen %s;
    ssl_preread on;
    proxy_pass $upstream;
  }
}
`, g.module, g.dir, m.String(), g.listen)
	path := filepath.Join(g.dir, "nginx.conf")
	certs.WriteFile(g.t, path, []byte(conf))
	g.cmd = exec.Command(g.bin, "-p", g.dir, "-e", "stderr", "-c", path)
	g.cmd.Stdout, g.cmd.Stderr = &g.log, &g.log
	g.cmd.WaitDelay = 10 * time.Second
	if err := g.cmd.Start(); err != nil {
		g.t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.Dial("tcp", g.listen)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			g.t.Fatalf("nginx never listened on %s: %v\n%s", g.listen, err, g.log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (g *sniGateway) stop() {
	if g.cmd == nil {
		return
	}
	// SIGTERM, not SIGKILL: nginx's master takes its workers down with
	// it, so none is left holding the log pipe (or the port).
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	_ = g.cmd.Wait()
	g.cmd = nil
}

// routerRoutes is the gateway's routing table as Estuary configures an
// east-west gateway of network: it connects as a router~ node, takes the
// SNI filter chains of its listener and the endpoints of the clusters
// they name: SNI to ADDR:PORT.
func routerRoutes(t *testing.T, xdsAddr, network, cluster string) map[string]string {
	t.Helper()
	conn, err := grpc.NewClient(xdsAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	md, _ := structpb.NewStruct(map[string]any{"NETWORK": network, "CLUSTER_ID": cluster})
	node := &corev3.Node{Id: "router~127.0.0.1~eastwest.istio-system~istio-system.svc.cluster.local", Metadata: md}
	ask := func(typeURL string, names []string) *discoveryv3.DiscoveryResponse {
		if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: typeURL, ResourceNames: names}); err != nil {
			t.Fatal(err)
		}
		for {
			resp, err := stream.Recv()
			if err != nil {
				t.Fatalf("router's %s: %v", typeURL, err)
			}
			if resp.GetTypeUrl() == typeURL {
				return resp
			}
		}
	}
	sniCluster := map[string]string{}
	for _, a := range ask(resourcev3.ListenerType, nil).GetResources() {
		var l listenerv3.Listener
		if err := proto.Unmarshal(a.GetValue(), &l); err != nil {
			t.Fatal(err)
		}
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				var tp tcpproxyv3.TcpProxy
				if f.GetTypedConfig().UnmarshalTo(&tp) != nil {
					continue
				}
				for _, sni := range fc.GetFilterChainMatch().GetServerNames() {
					sniCluster[sni] = tp.GetCluster()
				}
			}
		}
	}
	var names []string
	for _, c := range sniCluster {
		names = append(names, c)
	}
	slices.Sort(names)
	addrs := map[string]string{}
	for _, a := range ask(resourcev3.EndpointType, slices.Compact(names)).GetResources() {
		var cla endpointv3.ClusterLoadAssignment
		if err := proto.Unmarshal(a.GetValue(), &cla); err != nil {
			t.Fatal(err)
		}
		for _, le := range cla.GetEndpoints() {
			for _, lb := range le.GetLbEndpoints() {
				sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
				addrs[cla.GetClusterName()] = net.JoinHostPort(sa.GetAddress(), fmt.Sprint(sa.GetPortValue()))
			}
		}
	}
	routes := map[string]string{}
	for sni, c := range sniCluster {
		if a, ok := addrs[c]; ok {
			routes[sni] = a
		}
	}
	return routes
}

// TestCrossNetworkMTLSThroughSNIGateway: a client on network1, configured
// only by Estuary, reaches a backend on network2 through a real SNI-routing
// gateway (nginx ssl_preread) whose routes come from the filter chains
// Estuary sends network2's router. mTLS runs end to end: the backend sees
// the client's SPIFFE ID, which a gateway that terminated TLS could not
// forward. Without its route, the calls fail.
func TestCrossNetworkMTLSThroughSNIGateway(t *testing.T) {
	bin, module := nginxStream(t)
	if !inXDSSNIProcess(t) {
		return
	}
	ca := certs.NewCA(t, "mesh root")
	echo := startMTLSBackend(t, "echo2", ca, ca.Workload(t, echoID))
	gw := &sniGateway{t: t, bin: bin, module: module, dir: t.TempDir(), listen: freeAddr(t)}
	t.Cleanup(gw.stop)
	_, gwPort, _ := net.SplitHostPort(gw.listen)

	h := startHostFile(t, func(xds, admin string) string {
		return fmt.Sprintf(`mesh {
  cluster_id = "cluster1"
  mtls       = "STRICT"
}
xds {
  listen         = %q
  debounce_after = "10ms"
}
admin {
  listen = %q
}
plugin "east" {
  bundled = "static"
  config {
    cluster = "cluster1"
    network = "network1"
    service "echo.default.svc.cluster.local" {
      port "grpc" {
        number   = 8080
        protocol = "GRPC"
      }
    }
  }
}
plugin "west" {
  bundled = "static"
  config {
    cluster = "cluster2"
    network = "network2"
    service "echo.default.svc.cluster.local" {
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
  }
}
networks {
  network "network1" {
    endpoints { from_registry = "cluster1" }
  }
  network "network2" {
    endpoints { from_registry = "cluster2" }
    gateway {
      address = "127.0.0.1"
      port    = %s
    }
  }
}
`, xds, admin, echo.port, echoID, gwPort)
	})

	routes := routerRoutes(t, h.xds, "network2", "cluster2")
	want := fmt.Sprintf("127.0.0.1:%d", echo.port)
	if routes[echoSNI] != want {
		t.Fatalf("routes from network2's router = %v, want %s to %s", routes, echoSNI, want)
	}
	gw.start(routes)

	c := xdsCredsClient(t, h.xds, "echo.default.svc.cluster.local:8080", ca, ca.Workload(t, clientID))
	resp := callUntil(t, c)
	if resp.GetHostname() != "echo2" || resp.GetUsername() != clientID {
		t.Errorf("answer = %s, client seen as %q; want echo2 seeing %s end to end", resp.GetHostname(), resp.GetUsername(), clientID)
	}
	// The client went by the gateway EDS gave it, not to the pod.
	node := "sidecar~127.0.0.1~client.default~default.svc.cluster.local"
	if got := h.proxyEndpoints(node, "outbound|8080||echo.default.svc.cluster.local"); len(got) != 1 || !strings.HasPrefix(got[0], gw.listen+" ") {
		t.Errorf("the client on network1 receives %v, want only the gateway %s", got, gw.listen)
	}

	// Without the route, the gateway has nowhere to send the SNI.
	delete(routes, echoSNI)
	gw.start(routes)
	before, _ := echo.served()
	deadline := time.Now().Add(30 * time.Second)
	failed := 0
	for failed < 5 && time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		if _, err := c.UnaryCall(ctx, &testgrpc.SimpleRequest{}); err != nil {
			failed++
		}
		cancel()
	}
	if after, _ := echo.served(); failed < 5 || after != before {
		t.Errorf("without the gateway's route: %d calls failed, the backend served %d more", failed, after-before)
	}
}
