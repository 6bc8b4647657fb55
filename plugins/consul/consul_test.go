package consul

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/sdktest"
	"github.com/estuary-mesh/estuary/testbed"
)

const wait = 60 * time.Second // bound of every WaitFor; never reached when the plugin works

func TestConformance(t *testing.T) {
	c := startConsul(t)
	client := c.Client()
	register(t, client, api.AgentServiceRegistration{ID: "echo-1", Name: "echo", Port: 8080, Address: "10.0.0.1", Tags: []string{"http", "version=v1"}}, api.HealthPassing)
	sdktest.Run(t, sdktest.Suite{
		Factory:     Factory,
		Config:      agentConfig(c.Addr, `network = "net1"`),
		Reconfig:    agentConfig(c.Addr, `network = "net1"`, `domain_suffix = "consul.example"`),
		SyncTimeout: wait,
		Check: func(t testing.TB, r *sdktest.Replica) {
			in := dc1(r)
			if in == nil {
				t.Fatalf("no Consul/dc1 instance: %s", r)
			}
			if want := (sdk.InstanceProperties{ClusterScoped: true, DefaultNetwork: "net1"}); in.Properties != want {
				t.Errorf("properties = %+v, want %+v", in.Properties, want)
			}
			s := in.Services["echo.service.consul"]
			if s == nil {
				t.Fatalf("echo.service.consul missing: %s", r)
			}
			if want := []sdk.Port{{Name: "http", Number: 8080, Protocol: "HTTP"}}; !slices.Equal(s.Ports, want) {
				t.Errorf("ports = %v, want %v", s.Ports, want)
			}
			if got := endpointsOf(r, "echo.service.consul"); !slices.Equal(got, []string{"10.0.0.1"}) {
				t.Errorf("endpoints = %v", got)
			}
			if in.Health == nil || !in.Health.Healthy {
				t.Errorf("health = %+v, want healthy", in.Health)
			}
		},
		Change: func(t testing.TB) {
			register(t, client, api.AgentServiceRegistration{ID: "echo-2", Name: "echo", Port: 8080, Address: "10.0.0.2"}, api.HealthPassing)
		},
		Changed: func(r *sdktest.Replica) bool { return len(endpointsOf(r, "echo.service.consul")) == 2 },
	})
}

// TestRegisterAndHealth follows services and instances as they are
// registered, fail their checks, recover and leave.
func TestRegisterAndHealth(t *testing.T) {
	c := startConsul(t)
	client := c.Client()
	p := startStrict(t)
	p.configure(t, agentConfig(c.Addr))
	p.watch(t)
	p.waitFor(t, wait, "synced with the agent's own consul service", func(r *sdktest.Replica) bool {
		return dc1(r) != nil && dc1(r).Synced && hasService(r, "consul.service.consul")
	})

	const web = "web.service.consul"
	steps := []struct {
		name   string
		do     func()
		want   []string // endpoint addresses; nil with gone = the service is gone
		gone   bool
		reason string
	}{
		{"register", func() {
			register(t, client, api.AgentServiceRegistration{ID: "web-1", Name: "web", Port: 8080, Address: "10.0.0.1"}, api.HealthPassing)
		}, []string{"10.0.0.1"}, false, ""},
		{"second instance", func() {
			register(t, client, api.AgentServiceRegistration{ID: "web-2", Name: "web", Port: 8080, Address: "10.0.0.2"}, api.HealthPassing)
		}, []string{"10.0.0.1", "10.0.0.2"}, false, ""},
		{"check critical", func() { setTTL(t, client, "web-2", api.HealthCritical) }, []string{"10.0.0.1"}, false, ""},
		{"warning is not passing", func() { setTTL(t, client, "web-1", api.HealthWarning) }, nil, false, ""},
		{"both back to passing", func() {
			setTTL(t, client, "web-1", api.HealthPassing)
			setTTL(t, client, "web-2", api.HealthPassing)
		}, []string{"10.0.0.1", "10.0.0.2"}, false, ""},
		{"maintenance", func() {
			if err := client.Agent().EnableServiceMaintenance("web-1", "test"); err != nil {
				t.Fatal(err)
			}
		}, []string{"10.0.0.2"}, false, ""},
		{"maintenance off", func() {
			if err := client.Agent().DisableServiceMaintenance("web-1"); err != nil {
				t.Fatal(err)
			}
		}, []string{"10.0.0.1", "10.0.0.2"}, false, ""},
		{"deregister one", func() { deregister(t, client, "web-1") }, []string{"10.0.0.2"}, false, ""},
		{"deregister the last", func() { deregister(t, client, "web-2") }, nil, true, ""},
	}
	for _, st := range steps {
		st.do()
		p.waitFor(t, wait, st.name, func(r *sdktest.Replica) bool {
			if st.gone {
				return !hasService(r, web)
			}
			return hasService(r, web) && slices.Equal(endpointsOf(r, web), st.want)
		})
	}
	p.with(func(r *sdktest.Replica) {
		if h, msg, _ := healthOf(r); !h {
			t.Errorf("health = unhealthy (%s) after normal operation", msg)
		}
	})
}

// TestAttributes: tags, meta, weights, several ports, a service on two
// nodes, gateways, tag filter and passing_and_warning.
func TestAttributes(t *testing.T) {
	c := startConsul(t)
	client := c.Client()
	register(t, client, api.AgentServiceRegistration{
		ID: "web-1", Name: "web", Port: 8080, Address: "10.1.0.1",
		Tags:    []string{"version=v1", "canary", "http", "mesh"},
		Meta:    map[string]string{"port_admin": "9901", "tls_mode": "istio", "network": "net-a"},
		Weights: &api.AgentWeights{Passing: 5, Warning: 2},
	}, api.HealthPassing)
	// A second node, registered in the catalog as an external node would be.
	if _, err := client.Catalog().Register(&api.CatalogRegistration{
		Node: "node2", Address: "10.2.0.2", NodeMeta: map[string]string{"zone": "z2", "network": "net-b"},
		Service: &api.AgentService{ID: "web-2", Service: "web", Port: 18080, Tags: []string{"version=v2", "http", "mesh"},
			Meta: map[string]string{"port_admin": "9901"}, Weights: api.AgentWeights{Passing: 3, Warning: 1}},
		Check: &api.AgentCheck{Node: "node2", CheckID: "web-2-check", Name: "web-2", ServiceID: "web-2", Status: api.HealthWarning},
	}, nil); err != nil {
		t.Fatal(err)
	}
	register(t, client, api.AgentServiceRegistration{ID: "web-3", Name: "web", Port: 8080, Address: "10.1.0.3", Tags: []string{"http"}}, api.HealthPassing)
	register(t, client, api.AgentServiceRegistration{
		ID: "grpc-1", Name: "multi", Address: "10.1.0.4",
		Ports: api.ServicePorts{{Name: "grpc", Port: 9090, Default: true}, {Name: "http-admin", Port: 9901}},
	}, api.HealthPassing)
	register(t, client, api.AgentServiceRegistration{
		ID: "ew-1", Name: "eastwest", Port: 15443, Address: "10.1.0.9", Tags: []string{"mesh", "estuary.io/network-gateway=net-a"},
	}, api.HealthPassing)

	p := startStrict(t)
	p.configure(t, agentConfig(c.Addr, `health = "passing_and_warning"`))
	p.watch(t)
	p.waitFor(t, wait, "web on both nodes, multi, gateway", func(r *sdktest.Replica) bool {
		return dc1(r) != nil && dc1(r).Synced && len(endpointsOf(r, "web.service.consul")) == 3 && hasService(r, "multi.service.consul") && len(dc1(r).Gateways) == 1
	})
	p.with(func(r *sdktest.Replica) {
		in := dc1(r)
		web := in.Services["web.service.consul"]
		if want := []sdk.Port{{Name: "admin", Number: 9901, Protocol: "TCP"}, {Name: "http", Number: 8080, Protocol: "HTTP"}}; !slices.Equal(web.Ports, want) {
			t.Errorf("web ports = %v, want %v", web.Ports, want)
		}
		if web.Labels["http"] != "true" || len(web.Labels) != 1 {
			t.Errorf("web labels = %v, want the labels all instances share (http=true)", web.Labels)
		}
		eps := in.Endpoints["web.service.consul"]
		byAddr := map[string]sdk.Endpoint{}
		for _, e := range eps {
			byAddr[e.Address] = e
		}
		e1, e2 := byAddr["10.1.0.1"], byAddr["10.2.0.2"]
		if e1.Labels["version"] != "v1" || e1.Labels["canary"] != "true" || e1.Labels["port_admin"] != "9901" ||
			e1.Weight != 5 || e1.TLSMode != sdk.TLSModeIstio || e1.Network != "net-a" ||
			e1.Locality != (sdk.Locality{Region: "dc1"}) || e1.WorkloadName != c.Node+"/web-1" {
			t.Errorf("web-1 endpoint = %+v", e1)
		}
		// Warning, included: the warning weight; its own port number.
		if e2.Labels["version"] != "v2" || e2.Weight != 1 || e2.TLSMode != sdk.TLSModeDisabled || e2.Network != "net-b" ||
			e2.Locality != (sdk.Locality{Region: "dc1", Zone: "z2"}) || e2.TargetPorts["http"] != 18080 || len(e2.TargetPorts) != 1 {
			t.Errorf("web-2 endpoint = %+v", e2)
		}
		multi := in.Services["multi.service.consul"]
		if want := []sdk.Port{{Name: "grpc", Number: 9090, Protocol: "GRPC"}, {Name: "http-admin", Number: 9901, Protocol: "HTTP"}}; !slices.Equal(multi.Ports, want) {
			t.Errorf("multi ports = %v, want %v", multi.Ports, want)
		}
		if want := (sdk.NetworkGateway{Network: "net-a", Cluster: "dc1", Address: "10.1.0.9", Port: 15443, Locality: sdk.Locality{Region: "dc1"}}); in.Gateways[0] != want {
			t.Errorf("gateway = %+v, want %+v", in.Gateways[0], want)
		}
		// web-3 lacks the admin port the others declare: a notice says so.
		found := false
		for _, n := range in.Health.Notices {
			found = found || strings.Contains(n.Subject, "web-3") && strings.Contains(n.Message, `lacks port "admin"`)
		}
		if !found {
			t.Errorf("notices %+v do not mention web-3's missing admin port", in.Health.Notices)
		}
	})

	// Reconfigured: passing only, and only instances tagged mesh.
	p.configure(t, agentConfig(c.Addr, `tag_filter = ["mesh"]`))
	p.waitFor(t, wait, "tag filter and passing only", func(r *sdktest.Replica) bool {
		return slices.Equal(endpointsOf(r, "web.service.consul"), []string{"10.1.0.1"}) &&
			!hasService(r, "multi.service.consul") && !hasService(r, "consul.service.consul") && hasService(r, "eastwest.service.consul")
	})
}

// TestLatency: with wait_time = 5m, a change reaches the replica through
// the blocking query that was already waiting when the change was made,
// not through a later request.
func TestLatency(t *testing.T) {
	c := startConsul(t)
	client := c.Client()
	register(t, client, api.AgentServiceRegistration{ID: "web-1", Name: "web", Port: 8080, Address: "10.0.0.1"}, api.HealthPassing)
	px := startProxy(t, c.Addr)
	p := startStrict(t)
	p.configure(t, agentConfig(px.addr(), `wait_time = "5m"`))
	p.watch(t)
	p.waitFor(t, wait, "synced", func(r *sdktest.Replica) bool { return dc1(r) != nil && dc1(r).Synced })

	// blockedAt waits until a blocking query on path is outstanding, and
	// returns it.
	blockedAt := func(path string) proxyReq {
		t.Helper()
		deadline := time.Now().Add(wait)
		for time.Now().Before(deadline) {
			for _, r := range px.requests(path) {
				if r.Index != "" && r.End == 0 {
					return r
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("no blocking query on %s", path)
		return proxyReq{}
	}
	// deliveredBy checks that the query outstanding before the change
	// (mark) answered after it, with a new index, before the change arrived
	// in the replica: the change came through the waiting blocking query.
	deliveredBy := func(path string, before proxyReq, mark, arrived int64) {
		t.Helper()
		var got proxyReq
		for _, r := range px.requests(path) {
			if r.Start == before.Start {
				got = r
			}
		}
		if got.Start > mark || got.End < mark || got.End > arrived {
			t.Errorf("blocking query %+v did not span the change (clock %d) and answer before it arrived (clock %d)", got, mark, arrived)
		}
		if got.RespIndex == got.Index {
			t.Errorf("blocking query answered with its own index %s: it timed out instead of waking", got.Index)
		}
	}

	// A new service: the catalog query wakes.
	before := blockedAt("/v1/catalog/services")
	mark := px.mark()
	register(t, client, api.AgentServiceRegistration{ID: "api-1", Name: "api", Port: 9090, Address: "10.0.0.2"}, api.HealthPassing)
	p.waitFor(t, 30*time.Second, "the new service, long before wait_time", func(r *sdktest.Replica) bool {
		return len(endpointsOf(r, "api.service.consul")) == 1
	})
	deliveredBy("/v1/catalog/services", before, mark, px.mark())

	// A health change: the service's own query wakes.
	before = blockedAt("/v1/health/service/web")
	mark = px.mark()
	setTTL(t, client, "web-1", api.HealthCritical)
	p.waitFor(t, 30*time.Second, "web-1 leaving, long before wait_time", func(r *sdktest.Replica) bool {
		return hasService(r, "web.service.consul") && len(endpointsOf(r, "web.service.consul")) == 0
	})
	deliveredBy("/v1/health/service/web", before, mark, px.mark())
}

// TestAgentRestart: a stopped agent turns the instance unhealthy and keeps
// its state; a restarted one (same data dir) resyncs without any response
// in between leaving the instance short of a service or an endpoint.
func TestAgentRestart(t *testing.T) {
	c := startConsul(t, testbed.ConsulDataDir(""))
	client := c.Client()
	for i := 1; i <= 3; i++ {
		register(t, client, api.AgentServiceRegistration{ID: fmt.Sprintf("web-%d", i), Name: "web", Port: 8080, Address: fmt.Sprintf("10.0.0.%d", i)}, api.HealthPassing)
	}
	register(t, client, api.AgentServiceRegistration{ID: "db-1", Name: "db", Port: 5432, Address: "10.0.1.1"}, api.HealthPassing)
	// A TTL check comes back from a restart in the state last set through
	// the API (the agent persists it then), not the one given at registration.
	for _, id := range []string{"web-1", "web-2", "web-3", "db-1"} {
		setTTL(t, client, id, api.HealthPassing)
	}
	p := startStrict(t)
	p.configure(t, agentConfig(c.Addr))
	p.watch(t)
	p.waitFor(t, wait, "synced", func(r *sdktest.Replica) bool {
		return dc1(r) != nil && dc1(r).Synced && len(endpointsOf(r, "web.service.consul")) == 3 && len(endpointsOf(r, "db.service.consul")) == 1
	})
	p.setInvariant(func(r *sdktest.Replica) string {
		if n := len(endpointsOf(r, "web.service.consul")); n < 3 {
			return fmt.Sprintf("web has %d endpoints, want 3", n)
		}
		if n := len(endpointsOf(r, "db.service.consul")); n != 1 {
			return fmt.Sprintf("db has %d endpoints, want 1", n)
		}
		return ""
	})

	c.Stop()
	p.waitFor(t, wait, "unhealthy while the agent is down", func(r *sdktest.Replica) bool {
		h, _, known := healthOf(r)
		return known && !h
	})
	p.with(func(r *sdktest.Replica) {
		_, msg, _ := healthOf(r)
		if !strings.Contains(msg, "last-known state") || !strings.Contains(msg, "dc1") {
			t.Errorf("health message %q does not say what failed and that the state is kept", msg)
		}
	})

	c.Start()
	p.waitFor(t, wait, "healthy after the restart", func(r *sdktest.Replica) bool {
		h, _, _ := healthOf(r)
		return h
	})
	register(t, client, api.AgentServiceRegistration{ID: "web-4", Name: "web", Port: 8080, Address: "10.0.0.4"}, api.HealthPassing)
	p.waitFor(t, wait, "a change after the restart", func(r *sdktest.Replica) bool {
		return len(endpointsOf(r, "web.service.consul")) == 4
	})
}

// TestACL: a wrong token makes the instance unhealthy with a clear error
// and never empties it; a fixed token file is picked up again.
func TestACL(t *testing.T) {
	c := startConsul(t, testbed.ConsulACL(""))
	client := c.Client()
	register(t, client, api.AgentServiceRegistration{ID: "web-1", Name: "web", Port: 8080, Address: "10.0.0.1"}, api.HealthPassing)
	tokenFile := filepath.Join(t.TempDir(), "token")
	writeToken := func(tok string) {
		t.Helper()
		if err := os.WriteFile(tokenFile, []byte(tok+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	const wrong = "00000000-dead-beef-0000-000000000000"

	t.Run("wrong token from the start", func(t *testing.T) {
		p := startStrict(t)
		// No datacenters: the agent's own is learnt without the token.
		p.configure(t, fmt.Sprintf("address = %q\ntoken = %q\n", c.Addr, wrong))
		p.watch(t)
		p.waitFor(t, wait, "unhealthy", func(r *sdktest.Replica) bool { h, _, known := healthOf(r); return known && !h })
		p.with(func(r *sdktest.Replica) {
			_, msg, _ := healthOf(r)
			for _, want := range []string{"permission denied", "403", "ACL not found", "token"} {
				if !strings.Contains(msg, want) {
					t.Errorf("health message %q lacks %q", msg, want)
				}
			}
			if dc1(r).Synced {
				t.Errorf("instance synced although nothing could be read")
			}
		})
		if strings.Contains(p.logs.String(), wrong) {
			t.Errorf("the token appears in the plugin's log")
		}
	})

	t.Run("token turns wrong at run time", func(t *testing.T) {
		writeToken(c.Token)
		p := startStrict(t)
		p.configure(t, agentConfig(c.Addr, fmt.Sprintf("token_file = %q", tokenFile)))
		p.watch(t)
		p.waitFor(t, wait, "synced with the good token", func(r *sdktest.Replica) bool {
			return dc1(r) != nil && dc1(r).Synced && len(endpointsOf(r, "web.service.consul")) == 1
		})
		p.setInvariant(func(r *sdktest.Replica) string {
			if n := len(endpointsOf(r, "web.service.consul")); n != 1 {
				return fmt.Sprintf("web has %d endpoints, want 1: a 403 emptied the instance", n)
			}
			return ""
		})
		writeToken(wrong)
		p.configure(t, agentConfig(c.Addr, fmt.Sprintf("token_file = %q", tokenFile)))
		p.waitFor(t, wait, "unhealthy with the wrong token", func(r *sdktest.Replica) bool {
			h, msg, _ := healthOf(r)
			return !h && strings.Contains(msg, "HTTP 403")
		})
		// The token file is fixed: the next retry re-reads it.
		writeToken(c.Token)
		p.waitFor(t, wait, "healthy again without a reconfigure", func(r *sdktest.Replica) bool { h, _, _ := healthOf(r); return h })
		logs := p.logs.String()
		if strings.Contains(logs, wrong) || strings.Contains(logs, c.Token) {
			t.Errorf("a token appears in the plugin's log")
		}
	})
}

// TestIndexRulesAndBackoff puts a proxy in front of the agent that answers
// the catalog query with an index going backwards, then an index of 0, then
// 429s. The watcher relists, blocks on index 1 and backs off, and the
// instance keeps its state throughout.
func TestIndexRulesAndBackoff(t *testing.T) {
	c := startConsul(t)
	client := c.Client()
	register(t, client, api.AgentServiceRegistration{ID: "web-1", Name: "web", Port: 8080, Address: "10.0.0.1"}, api.HealthPassing)
	px := startProxy(t, c.Addr)
	p := startStrict(t)
	p.configure(t, agentConfig(px.addr(), `wait_time = "10s"`))
	p.watch(t)
	p.waitFor(t, wait, "synced", func(r *sdktest.Replica) bool { return dc1(r) != nil && dc1(r).Synced })
	p.setInvariant(func(r *sdktest.Replica) string {
		if n := len(endpointsOf(r, "web.service.consul")); n != 1 {
			return fmt.Sprintf("web has %d endpoints, want 1", n)
		}
		return ""
	})

	const catalog = "/v1/catalog/services"
	// Phase 1: the next blocking catalog query gets index 3, far behind.
	// Phase 2: the relist that follows gets index 0.
	// Phase 3: 429 until the test has seen the instance unhealthy.
	var mu sync.Mutex
	phase := 1
	release := make(chan struct{})
	px.setFault(func(r *http.Request) fault {
		if r.URL.Path != catalog {
			return fault{}
		}
		mu.Lock()
		defer mu.Unlock()
		switch {
		case phase == 1 && r.URL.Query().Get("index") != "":
			phase = 2
			return fault{index: "3"}
		case phase == 2:
			phase = 3
			return fault{index: "0"}
		case phase == 3:
			select {
			case <-release:
				return fault{}
			default:
				return fault{status: http.StatusTooManyRequests}
			}
		}
		return fault{}
	})
	// Wake the blocking catalog query with a change.
	register(t, client, api.AgentServiceRegistration{ID: "api-1", Name: "api", Port: 9090, Address: "10.0.0.2"}, api.HealthPassing)
	p.waitFor(t, wait, "unhealthy on 429", func(r *sdktest.Replica) bool {
		h, msg, _ := healthOf(r)
		return !h && strings.Contains(msg, "HTTP 429") && strings.Contains(msg, "http_max_conns_per_client")
	})
	// Let a few retries happen, then release.
	for len(failed(px.requests(catalog))) < 3 {
		time.Sleep(50 * time.Millisecond)
	}
	close(release)
	p.waitFor(t, wait, "healthy and the change applied", func(r *sdktest.Replica) bool {
		h, _, _ := healthOf(r)
		return h && len(endpointsOf(r, "api.service.consul")) == 1
	})

	reqs := px.requests(catalog)
	i := slices.IndexFunc(reqs, func(r proxyReq) bool { return r.Injected == "index 3" })
	if i < 0 || i+2 >= len(reqs) {
		t.Fatalf("no backwards answer followed by two more requests in %+v", reqs)
	}
	if reqs[i].Index == "" {
		t.Errorf("the backwards answer went to a non-blocking request: %+v", reqs[i])
	}
	if next := reqs[i+1]; next.Index != "" || next.Injected != "index 0" {
		t.Errorf("after the index went backwards, the next request was %+v, want a relist without index", next)
	}
	if next := reqs[i+2]; next.Index != "1" {
		t.Errorf("after an index of 0, the next request waited on index %q, want 1", next.Index)
	}
	// Back-off: every retry after a 429 waited at least half the base
	// delay (the jitter's floor), and the waits grew.
	fails := failed(reqs)
	for k := 1; k < len(fails); k++ {
		gap := fails[k].Began.Sub(fails[k-1].Began)
		if floor := min(retryBase<<(k-1), retryMax) / 2; gap < floor {
			t.Errorf("retry %d came %v after the previous 429, want at least %v", k, gap, floor)
		}
	}
	// The first 429 hit the query blocking on index 1; the retries list
	// afresh, so the health recovers as soon as Consul answers.
	for k, r := range fails {
		if want := map[bool]string{true: "1", false: ""}[k == 0]; r.Index != want {
			t.Errorf("429'd request %d waited on index %q, want %q", k, r.Index, want)
		}
	}
}

func failed(reqs []proxyReq) []proxyReq {
	var out []proxyReq
	for _, r := range reqs {
		if r.Status == http.StatusTooManyRequests {
			out = append(out, r)
		}
	}
	return out
}

// TestUnknownDatacenter: a datacenter Consul cannot reach is its own
// unhealthy instance; the others work.
func TestUnknownDatacenter(t *testing.T) {
	c := startConsul(t)
	p := startStrict(t)
	p.configure(t, fmt.Sprintf("address = %q\ndatacenters = [\"dc1\", \"nowhere\"]\n", c.Addr))
	p.watch(t)
	p.waitFor(t, wait, "dc1 synced, nowhere unhealthy", func(r *sdktest.Replica) bool {
		in := r.Instance(sdk.ProviderConsul, "nowhere")
		return dc1(r) != nil && dc1(r).Synced && in != nil && in.Health != nil && !in.Health.Healthy
	})
	p.with(func(r *sdktest.Replica) {
		msg := r.Instance(sdk.ProviderConsul, "nowhere").Health.Message
		if !strings.Contains(msg, "No path to datacenter") || !strings.Contains(msg, "nowhere") {
			t.Errorf("health message %q does not name the problem", msg)
		}
	})
	// Dropping the datacenter from the config removes its instance.
	p.configure(t, agentConfig(c.Addr))
	p.waitFor(t, wait, "nowhere removed", func(r *sdktest.Replica) bool {
		return r.Instance(sdk.ProviderConsul, "nowhere") == nil && dc1(r) != nil
	})
}

// TestReconfigureRenames: a new domain suffix replaces the hostnames; the
// old ones leave only once the new config has synced, so the instance is
// never empty.
func TestReconfigureRenames(t *testing.T) {
	c := startConsul(t)
	register(t, c.Client(), api.AgentServiceRegistration{ID: "web-1", Name: "web", Port: 8080, Address: "10.0.0.1"}, api.HealthPassing)
	p := startStrict(t)
	p.configure(t, agentConfig(c.Addr))
	p.watch(t)
	p.waitFor(t, wait, "synced", func(r *sdktest.Replica) bool { return hasService(r, "web.service.consul") })
	p.setInvariant(func(r *sdktest.Replica) string {
		if !hasService(r, "web.service.consul") && !hasService(r, "web.consul.example") {
			return "web is missing under both names"
		}
		return ""
	})
	p.configure(t, agentConfig(c.Addr, `domain_suffix = "consul.example"`))
	p.waitFor(t, wait, "renamed", func(r *sdktest.Replica) bool {
		return hasService(r, "web.consul.example") && !hasService(r, "web.service.consul") && !hasService(r, "consul.service.consul")
	})
}

// TestMaxWatchers: services beyond the bound are not watched, and a notice
// says which.
func TestMaxWatchers(t *testing.T) {
	c := startConsul(t)
	client := c.Client()
	for _, name := range []string{"a", "b", "c"} {
		register(t, client, api.AgentServiceRegistration{ID: name + "-1", Name: name, Port: 80, Address: "10.0.0.1"}, api.HealthPassing)
	}
	p := startStrict(t)
	p.configure(t, agentConfig(c.Addr, `max_watchers = 2`))
	p.watch(t)
	p.waitFor(t, wait, "synced with a and b", func(r *sdktest.Replica) bool {
		return dc1(r) != nil && dc1(r).Synced && hasService(r, "a.service.consul") && hasService(r, "b.service.consul")
	})
	p.with(func(r *sdktest.Replica) {
		in := dc1(r)
		if len(in.Services) != 2 {
			t.Errorf("services = %d, want 2 (max_watchers)", len(in.Services))
		}
		found := false
		for _, n := range in.Health.Notices {
			found = found || strings.Contains(n.Message, "2 services are not watched because max_watchers is 2; first unwatched: c, consul")
		}
		if !found {
			t.Errorf("notices %+v do not name the unwatched services", in.Health.Notices)
		}
	})
}

// TestSameConfigKeepsWatches: a reload that re-sends the same block does
// not restart the watches (a restart would list the catalog again).
func TestSameConfigKeepsWatches(t *testing.T) {
	c := startConsul(t)
	px := startProxy(t, c.Addr)
	p := startStrict(t)
	cfg := agentConfig(px.addr())
	p.configure(t, cfg)
	p.watch(t)
	p.waitFor(t, wait, "synced", func(r *sdktest.Replica) bool { return dc1(r) != nil && dc1(r).Synced })
	mark := px.mark()
	p.configure(t, cfg)
	register(t, c.Client(), api.AgentServiceRegistration{ID: "web-1", Name: "web", Port: 8080, Address: "10.0.0.1"}, api.HealthPassing)
	p.waitFor(t, wait, "a change after the reload", func(r *sdktest.Replica) bool { return hasService(r, "web.service.consul") })
	for _, r := range px.requests("/v1/catalog/services") {
		if r.Start > mark && r.Index == "" {
			t.Errorf("the catalog was listed again after an unchanged reload: %+v", r)
		}
	}
}

// TestInstanceSetWaitsForTheAgent: without configured datacenters, the
// plugin declares its instance set complete only once the agent has named
// its datacenter, and that datacenter is declared by then; while the agent
// cannot be reached it says nothing is complete.
func TestInstanceSetWaitsForTheAgent(t *testing.T) {
	c := startConsul(t)
	c.Stop()
	p := startStrict(t)
	p.configure(t, fmt.Sprintf("address = %q\n", c.Addr))
	p.watch(t)
	p.waitFor(t, wait, "the snapshot", func(r *sdktest.Replica) bool { return r.SnapshotDone })
	deadline := time.Now().Add(wait)
	for !strings.Contains(p.logs.String(), "cannot learn the agent's datacenter") {
		if time.Now().After(deadline) {
			t.Fatalf("the plugin never failed to reach the stopped agent:\n%s", p.logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.waitFor(t, wait, "the plugin's health to say why", func(r *sdktest.Replica) bool { return r.PluginHealth != nil })
	p.with(func(r *sdktest.Replica) {
		if r.InstanceSetComplete {
			t.Errorf("instance set complete with %v while the agent is down", r.DeclaredAtComplete)
		}
		if h := r.PluginHealth; h.Healthy || !strings.Contains(h.Message, "Consul never reached") || !strings.Contains(h.Message, "connection refused") {
			t.Errorf("plugin health %+v, want unhealthy: Consul never reached ... connection refused", h)
		}
	})
	c.Start()
	p.waitFor(t, wait, "the instance set complete", func(r *sdktest.Replica) bool { return r.InstanceSetComplete })
	p.with(func(r *sdktest.Replica) {
		if !r.PluginHealth.Healthy {
			t.Errorf("plugin health %+v once the agent answered, want healthy", r.PluginHealth)
		}
	})
	p.with(func(r *sdktest.Replica) {
		if want := []sdk.InstanceID{{Provider: sdk.ProviderConsul, Cluster: "dc1"}}; !slices.Equal(r.DeclaredAtComplete, want) {
			t.Errorf("declared when complete: %v, want %v", r.DeclaredAtComplete, want)
		}
	})
}
