package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/hashicorp/consul/api"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/estuary-mesh/estuary/testbed"
)

// The sync contract end to end (issue 11.1): a plugin restarted while its
// source is down keeps its last-known instances served, stale, until it has
// declared its instance set again; a cold start with an unreachable source
// is not ready, and says why, until the plugin's sync timeout.

// pluginSync is the part of one plugin in /debug/syncz the tests read.
type pluginSync struct {
	Plugin      string    `json:"plugin"`
	Complete    bool      `json:"complete"`
	CompletedBy string    `json:"completed_by"`
	Since       time.Time `json:"since"`
	Unhealthy   []string  `json:"unhealthy"`
	Reason      string    `json:"reason"`
}

func (h *host) pluginSync(label string) pluginSync {
	h.t.Helper()
	var out struct {
		Plugins []pluginSync `json:"plugins"`
	}
	h.getJSON("/debug/syncz", &out)
	for _, p := range out.Plugins {
		if p.Plugin == label {
			return p
		}
	}
	h.t.Fatalf("no plugin %q in /debug/syncz", label)
	return pluginSync{}
}

// instanceOf returns whether /debug/registryz holds the instance of plugin
// in cluster, whether it is stale, and its endpoints for hostname.
func (h *host) instanceOf(plugin, cluster, hostname string) (held, stale bool, endpoints int) {
	h.t.Helper()
	var r registryz
	h.getJSON("/debug/registryz", &r)
	for _, in := range r.Instances {
		if in.Key.Plugin != plugin || in.Key.Cluster != cluster {
			continue
		}
		for _, s := range in.Services {
			if s.Hostname == hostname {
				endpoints = s.Endpoints
			}
		}
		return true, in.Stale, endpoints
	}
	return false, false, 0
}

// killPlugin kills the plugin's process with SIGKILL and returns when.
func (h *host) killPlugin(label string) time.Time {
	h.t.Helper()
	_, pid, _ := h.plugin(label)
	killed := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		h.t.Fatalf("kill plugin %q (pid %d): %v", label, pid, err)
	}
	return killed
}

// edsWatch is a sidecar's EDS subscription to one cluster over ADS,
// acknowledging every response as Envoy does and keeping the endpoint
// addresses of each, in order, until the test ends.
type edsWatch struct {
	mu      sync.Mutex
	history [][]string
}

func watchEDS(t testing.TB, xdsAddr, cluster string) *edsWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream := openADS(t, ctx, xdsAddr)
	node := &corev3.Node{Id: "sidecar~10.1.0.9~client.default~default.svc.cluster.local"}
	req := &discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.EndpointType, ResourceNames: []string{cluster}}
	if err := stream.Send(req); err != nil {
		t.Fatal(err)
	}
	w := &edsWatch{}
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			var addrs []string
			for _, r := range resp.GetResources() {
				var cla endpointv3.ClusterLoadAssignment
				if r.UnmarshalTo(&cla) != nil || cla.GetClusterName() != cluster {
					continue
				}
				for _, le := range cla.GetEndpoints() {
					for _, lb := range le.GetLbEndpoints() {
						addrs = append(addrs, lb.GetEndpoint().GetAddress().GetSocketAddress().GetAddress())
					}
				}
			}
			slices.Sort(addrs)
			w.mu.Lock()
			w.history = append(w.history, addrs)
			w.mu.Unlock()
			if stream.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resp.GetTypeUrl(), VersionInfo: resp.GetVersionInfo(),
				ResponseNonce: resp.GetNonce(), ResourceNames: []string{cluster}}) != nil {
				return
			}
		}
	}()
	return w
}

// since returns the responses from the nth on, and how many there are.
func (w *edsWatch) since(n int) ([][]string, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.history[min(n, len(w.history)):]), len(w.history)
}

// TestRestartWithARemoteClusterDown: cluster 2's API server is frozen,
// then the kubernetes plugin is killed. The restarted plugin cannot list
// cluster 2, but it declares it from the secret: cluster 2's instance and
// endpoint stay in the registry, stale, the whole time, and are fresh
// again once the API server answers.
func TestRestartWithARemoteClusterDown(t *testing.T) {
	k1, k2, ns := twoClusters(t)
	h := startHost(t, fmt.Sprintf(`plugin "kubernetes" {
  sync_timeout = "10m"
  config {
    kubeconfig = %q
    cluster_id = "cluster1"
  }
}
`, k1.Kubeconfig))
	echoHost := "echo." + ns + ".svc.cluster.local"
	h.eventually("cluster2's echo endpoint", 60*time.Second, func() bool {
		held, stale, n := h.instanceOf("kubernetes", "cluster2", echoHost)
		return held && !stale && n == 1
	})
	eds := watchEDS(t, h.xds, "outbound|8080||"+echoHost)
	both := []string{"10.1.0.1", "10.2.0.1"}
	var from int
	h.eventually("a sidecar's EDS with both clusters' endpoints", 30*time.Second, func() bool {
		got, n := eds.since(0)
		from = n
		return len(got) > 0 && slices.Equal(got[len(got)-1], both)
	})

	k2.Freeze()
	defer k2.Thaw()
	killed := h.killPlugin("kubernetes")
	h.eventually("the restarted plugin to declare its instance set", 60*time.Second, func() bool {
		if held, _, n := h.instanceOf("kubernetes", "cluster2", echoHost); !held || n != 1 {
			t.Fatalf("cluster2 held=%v with %d endpoints for echo after the restart; want its last-known endpoint kept", held, n)
		}
		p := h.pluginSync("kubernetes")
		return p.Since.After(killed) && p.Complete
	})
	if p := h.pluginSync("kubernetes"); p.CompletedBy != "plugin" {
		t.Errorf("instance set %+v, want completed by the plugin", p)
	}
	if held, stale, n := h.instanceOf("kubernetes", "cluster2", echoHost); !held || !stale || n != 1 {
		t.Errorf("cluster2 after the set is complete: held=%v stale=%v endpoints=%d; want kept, stale, 1", held, stale, n)
	}

	k2.Thaw()
	h.eventually("cluster2 fresh again", 60*time.Second, func() bool {
		held, stale, n := h.instanceOf("kubernetes", "cluster2", echoHost)
		if !held || n != 1 {
			t.Fatalf("cluster2 held=%v with %d endpoints while resyncing", held, n)
		}
		return !stale
	})
	// A barrier: a new endpoint in cluster 1 reaches the sidecar after
	// every push that came before it.
	slice, err := k1.Client().DiscoveryV1().EndpointSlices(ns).Get(context.Background(), "echo-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{"10.1.0.2"}, Conditions: slice.Endpoints[0].Conditions})
	if _, err := k1.Client().DiscoveryV1().EndpointSlices(ns).Update(context.Background(), slice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("the barrier in the sidecar's EDS", 30*time.Second, func() bool {
		got, _ := eds.since(0)
		return slices.Contains(got[len(got)-1], "10.1.0.2")
	})
	// The sidecar never saw cluster 2's endpoint go.
	after, _ := eds.since(from)
	for i, addrs := range after {
		if !slices.Contains(addrs, "10.2.0.1") {
			t.Errorf("EDS response %d after the freeze: %v, want cluster 2's 10.2.0.1 kept", from+i, addrs)
		}
	}
}

// consulAgent starts an agent with service web at 10.0.0.1:8080.
func consulAgent(t *testing.T) *testbed.Consul {
	t.Helper()
	c := testbed.StartConsul(t)
	if err := c.Client().Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "web-1", Name: "web", Address: "10.0.0.1", Port: 8080}); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestRestartWithTheConsulAgentDown: the agent dies, then the consul
// plugin (no datacenters configured) is killed. The restarted plugin
// cannot learn its datacenter; dc1 and its services stay, stale, and
// /debug/syncz says the plugin never reached Consul.
func TestRestartWithTheConsulAgentDown(t *testing.T) {
	c := consulAgent(t)
	h := startHost(t, fmt.Sprintf(`plugin "consul" {
  sync_timeout = "10m"
  config {
    address = %q
  }
}
`, c.Addr))
	const web = "web.service.consul"
	h.eventually("web from dc1", 60*time.Second, func() bool {
		held, _, n := h.instanceOf("consul", "dc1", web)
		return held && n == 1
	})

	c.Stop()
	killed := h.killPlugin("consul")
	h.eventually("the restarted plugin to say it cannot reach Consul", 60*time.Second, func() bool {
		if held, _, n := h.instanceOf("consul", "dc1", web); !held || n != 1 {
			t.Fatalf("dc1 held=%v with %d endpoints for web after the restart; want its last-known endpoint kept", held, n)
		}
		p := h.pluginSync("consul")
		return p.Since.After(killed) && strings.Contains(p.Reason, "Consul never reached")
	})
	p := h.pluginSync("consul")
	if p.Complete {
		t.Errorf("instance set %+v complete while the agent is down", p)
	}
	if held, stale, n := h.instanceOf("consul", "dc1", web); !held || !stale || n != 1 {
		t.Errorf("dc1: held=%v stale=%v endpoints=%d; want kept, stale, 1", held, stale, n)
	}
}

// TestColdStartWithTheConsulAgentDown: a static plugin and a consul plugin
// whose agent refuses connections. /readyz says not ready, naming consul
// and why, until consul's sync timeout; then it is ready, and syncz says
// the set was completed by the timeout and Consul was never reached.
func TestColdStartWithTheConsulAgentDown(t *testing.T) {
	c := testbed.StartConsul(t)
	c.Stop()
	const timeout = 4 * time.Second
	started := time.Now()
	h := launchHost(t, func(xds, admin string) string {
		return hostConfig(xds, admin, echoBlock()+fmt.Sprintf(`plugin "consul" {
  sync_timeout = %q
  config {
    address = %q
  }
}
`, timeout, c.Addr))
	})
	// A proxy that connects at once: its first CDS must not come before
	// the host is ready, or it would hold only the static services.
	firstCDS := make(chan time.Time, 1)
	conn, err := grpc.NewClient(h.xds, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(sctx, grpc.WaitForReady(true))
		if err != nil {
			return
		}
		node := &corev3.Node{Id: "sidecar~10.1.0.9~early.default~default.svc.cluster.local"}
		if stream.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.ClusterType}) != nil {
			return
		}
		if _, err := stream.Recv(); err == nil {
			firstCDS <- time.Now()
		}
	}()
	var notReady time.Time // the last time /readyz said 503
	h.eventually("/readyz to say why consul is waited for", 30*time.Second, func() bool {
		code, body := h.get("/readyz")
		if code == http.StatusOK {
			t.Fatalf("ready %s after start, before consul's sync timeout (%s)", time.Since(started), timeout)
		}
		if code == http.StatusServiceUnavailable {
			notReady = time.Now()
		}
		return code == http.StatusServiceUnavailable && strings.Contains(string(body), "consul: instance set not complete") &&
			strings.Contains(string(body), "Consul never reached")
	})
	h.eventually("ready after the sync timeout", 30*time.Second, func() bool {
		code, _ := h.get("/readyz")
		if code != http.StatusOK {
			notReady = time.Now()
		}
		return code == http.StatusOK
	})
	select {
	case at := <-firstCDS:
		if at.Before(notReady) {
			t.Errorf("a CDS answered %s after start, while /readyz still said 503 (until %s)", at.Sub(started), notReady.Sub(started))
		}
	case <-time.After(30 * time.Second):
		t.Error("the early proxy got no CDS within 30s of the host being ready")
	}
	if d := time.Since(started); d < timeout {
		t.Errorf("ready after %s, before consul's sync timeout %s", d, timeout)
	}
	// Readiness counts the timeout from the plugin's launch, the replica
	// from its stream's start, a moment later.
	h.eventually("the instance set given up on", 30*time.Second, func() bool { return h.pluginSync("consul").Complete })
	p := h.pluginSync("consul")
	if p.CompletedBy != "sync timeout" || !strings.Contains(p.Reason, "Consul never reached") {
		t.Errorf("consul in /debug/syncz: %+v; want completed by the sync timeout, saying Consul was never reached", p)
	}
}
