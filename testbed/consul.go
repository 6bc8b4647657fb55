package testbed

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// Consul is a real single-node Consul agent (a server) on 127.0.0.1.
type Consul struct {
	// Addr is the HTTP API address, "127.0.0.1:PORT". It stays the same
	// across Stop and Start.
	Addr string
	// Token is the ACL initial-management token; empty unless ConsulACL
	// was given.
	Token string
	// DataDir is the persistent data directory; empty for an in-memory
	// (-dev) agent.
	DataDir string
	// Ports of the agent; -1 means disabled. DNS and serf WAN are disabled,
	// HTTPS unless ConsulHTTPS was given, gRPC TLS unless ConsulPeering was.
	HTTPPort, ServerPort, SerfLANPort, GRPCPort, HTTPSPort, GRPCTLSPort int
	// Datacenter is the agent's datacenter, "dc1" unless ConsulPeering
	// named another.
	Datacenter string
	// Dir holds the config file and the log, Log is the log file.
	Dir, Log string
	// Node is the agent's node name.
	Node string

	t     testing.TB
	bin   string
	args  []string
	extra []string

	mu      sync.Mutex
	agent   *proc
	httpTr  *http.Transport // probes and Client(); idle connections closed on Stop and cleanup
	started bool
}

// ConsulOption configures StartConsul.
type ConsulOption func(*Consul)

// ConsulDataDir makes the agent a persistent server (-server
// -bootstrap-expect=1 -data-dir=DIR) instead of an in-memory -dev agent, so
// its catalog, KV and ACL state survive Stop and Start. With dir "" the
// directory is made in t.TempDir().
func ConsulDataDir(dir string) ConsulOption {
	return func(c *Consul) {
		if dir == "" {
			dir = filepath.Join(c.Dir, "data")
		}
		c.DataDir = dir
	}
}

// ConsulACL turns ACLs on with default_policy = "deny" and the given
// initial-management token (also used as the agent token). With token "" a
// random UUID is used. The token is in Consul.Token.
func ConsulACL(token string) ConsulOption {
	return func(c *Consul) {
		if token == "" {
			token = randomUUID()
		}
		c.Token = token
	}
}

// ConsulHTTPS gives the agent an HTTPS port too, in Consul.HTTPSPort, chosen
// with the others (a port picked by the test would not move when the
// testbed retries a start that found a port taken). The fragment given
// with ConsulHCL configures its TLS.
func ConsulHTTPS() ConsulOption {
	return func(c *Consul) { c.HTTPSPort = 0 }
}

// ConsulHCL adds a configuration fragment, written to its own config file
// after the testbed's own settings (so it can override them).
func ConsulHCL(hcl string) ConsulOption {
	return func(c *Consul) { c.extra = append(c.extra, hcl) }
}

// ConsulPeering makes the agent an independent cluster that can peer
// with another (Consul's cluster peering): datacenter dc, peering on, and
// a gRPC TLS port, in Consul.GRPCTLSPort, on which the servers of two
// peered clusters talk with certificates from their Connect CA. Two
// agents of two ConsulPeering calls peer through the peering API
// (GenerateToken on one, Establish on the other).
func ConsulPeering(dc string) ConsulOption {
	return func(c *Consul) { c.GRPCTLSPort, c.Datacenter = 0, dc }
}

func randomUUID() string {
	h := randomHex(16)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// StartConsul starts a Consul agent on free 127.0.0.1 ports (HTTP, server
// RPC, serf LAN and gRPC; DNS, serf WAN and gRPC TLS disabled; no update
// check) and waits until it has a leader, knows its own node and, with ACLs,
// accepts the management token. It is killed by t.Cleanup. A missing binary
// fails the test with a message saying to run `make testbed`.
func StartConsul(t testing.TB, opts ...ConsulOption) *Consul {
	t.Helper()
	bin, err := Bin("consul")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	c := &Consul{
		t:      t,
		bin:    bin,
		Dir:    dir,
		Log:    filepath.Join(dir, "consul.log"),
		Node:   "testbed",
		httpTr: &http.Transport{MaxIdleConnsPerHost: 16, IdleConnTimeout: 30 * time.Second},
		// HTTPSPort: -1 (disabled) unless ConsulHTTPS sets it to 0 (pick
		// one); GRPCTLSPort likewise with ConsulPeering.
		HTTPSPort: -1, GRPCTLSPort: -1, Datacenter: "dc1",
	}
	t.Cleanup(c.cleanup)
	for _, o := range opts {
		o(c)
	}
	if c.DataDir != "" {
		if err := os.MkdirAll(c.DataDir, 0o700); err != nil {
			t.Fatal(err)
		}
	}

	t0 := time.Now()
	for attempt := 0; ; attempt++ {
		n := 4
		if c.HTTPSPort >= 0 {
			n++
		}
		if c.GRPCTLSPort >= 0 {
			n++
		}
		ports, err := freePorts(n, true)
		if err != nil {
			t.Fatal(err)
		}
		c.HTTPPort, c.ServerPort, c.SerfLANPort, c.GRPCPort = ports[0], ports[1], ports[2], ports[3]
		rest := ports[4:]
		if c.HTTPSPort >= 0 {
			c.HTTPSPort, rest = rest[0], rest[1:]
		}
		if c.GRPCTLSPort >= 0 {
			c.GRPCTLSPort = rest[0]
		}
		c.Addr = "127.0.0.1:" + strconv.Itoa(c.HTTPPort)
		if err := c.configure(); err != nil {
			t.Fatal(err)
		}
		err = c.start()
		if err == nil {
			break
		}
		if attempt == 2 || !logShowsAddrInUse(c.Log) {
			t.Fatal(err)
		}
	}
	mode := "-dev"
	if c.DataDir != "" {
		mode = "server, data dir " + c.DataDir
	}
	t.Logf("testbed: consul %s (%s) ready at %s after %.1fs, log %s", ConsulVersion, mode, c.Addr, time.Since(t0).Seconds(), c.Log)
	return c
}

// configure writes the config files and the command line.
func (c *Consul) configure() error {
	hcl := fmt.Sprintf(`node_name = %q
bind_addr = "127.0.0.1"
advertise_addr = "127.0.0.1"
client_addr = "127.0.0.1"
disable_update_check = true
log_level = "info"
ports {
  http     = %d
  server   = %d
  serf_lan = %d
  grpc     = %d
  https    = %d
  dns      = -1
  serf_wan = -1
  grpc_tls = %d
}
datacenter = %q
`, c.Node, c.HTTPPort, c.ServerPort, c.SerfLANPort, c.GRPCPort, c.HTTPSPort, c.GRPCTLSPort, c.Datacenter)
	if c.GRPCTLSPort >= 0 {
		hcl += "peering { enabled = true }\n"
	}
	if c.DataDir != "" {
		// What -dev would give, minus the in-memory state: a single server
		// that elects itself quickly.
		hcl += fmt.Sprintf(`server = true
bootstrap_expect = 1
data_dir = %q
ui_config { enabled = true }
connect { enabled = true }
performance { raft_multiplier = 1 }
`, c.DataDir)
	}
	if c.Token != "" {
		hcl += fmt.Sprintf(`acl {
  enabled = true
  default_policy = "deny"
  enable_token_persistence = false
  tokens {
    initial_management = %q
    agent = %q
  }
}
`, c.Token, c.Token)
	}
	files := []string{filepath.Join(c.Dir, "testbed.hcl")}
	if err := os.WriteFile(files[0], []byte(hcl), 0o600); err != nil {
		return err
	}
	for i, extra := range c.extra {
		f := filepath.Join(c.Dir, fmt.Sprintf("extra-%d.hcl", i))
		if err := os.WriteFile(f, []byte(extra), 0o600); err != nil {
			return err
		}
		files = append(files, f)
	}
	c.args = []string{"agent"}
	if c.DataDir == "" {
		c.args = append(c.args, "-dev")
	}
	for _, f := range files {
		c.args = append(c.args, "-config-file="+f)
	}
	return nil
}

func (c *Consul) start() error {
	p, err := startProc("consul", c.bin, c.args, c.Dir, c.Log)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.agent = p
	c.mu.Unlock()
	err = waitFor(p, "consul leader", startTimeout, func(ctx context.Context) error {
		var leader string
		if err := c.getJSON(ctx, "/v1/status/leader", &leader); err != nil {
			return err
		}
		if leader == "" {
			return fmt.Errorf("no leader yet")
		}
		return nil
	})
	if err == nil && c.Token != "" {
		// The management token is bootstrapped by the leader, just after election.
		err = waitFor(p, "consul ACL management token", startTimeout, func(ctx context.Context) error {
			var tok map[string]any
			return c.getJSON(ctx, "/v1/acl/token/self", &tok)
		})
	}
	if err == nil {
		// The agent syncs its own node into the catalog shortly after.
		err = waitFor(p, "consul node in the catalog", startTimeout, func(ctx context.Context) error {
			var node *struct{ Node map[string]any }
			if err := c.getJSON(ctx, "/v1/catalog/node/"+c.Node, &node); err != nil {
				return err
			}
			if node == nil || node.Node == nil {
				return fmt.Errorf("node %s not registered yet", c.Node)
			}
			return nil
		})
	}
	if err != nil {
		p.stop(syscall.SIGKILL, 0)
		return err
	}
	c.started = true
	return nil
}

func (c *Consul) getJSON(ctx context.Context, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.Addr+path, nil)
	if err != nil {
		return err
	}
	if c.Token != "" {
		req.Header.Set("X-Consul-Token", c.Token)
	}
	resp, err := c.httpTr.RoundTrip(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %.200s", path, resp.Status, strings.TrimSpace(string(b)))
	}
	return json.Unmarshal(b, v)
}

// Config returns a client config for the agent, with the management token
// when ACLs are on. It shares one transport whose idle connections are closed
// by Stop and at cleanup, so no goroutines outlive the test.
func (c *Consul) Config() *api.Config {
	return &api.Config{
		Address:    c.Addr,
		Scheme:     "http",
		Token:      c.Token,
		HttpClient: &http.Client{Transport: c.httpTr},
	}
}

// Client returns a new API client, see Config.
func (c *Consul) Client() *api.Client {
	c.t.Helper()
	client, err := api.NewClient(c.Config())
	if err != nil {
		c.t.Fatalf("testbed: consul client: %v", err)
	}
	return client
}

// Stop stops the agent (SIGTERM, then SIGKILL after 10 s; a server does not
// leave the cluster on SIGTERM). Stopping a stopped agent does nothing.
func (c *Consul) Stop() {
	c.t.Helper()
	c.mu.Lock()
	p := c.agent
	c.mu.Unlock()
	p.stop(syscall.SIGTERM, stopGrace)
	c.httpTr.CloseIdleConnections()
}

// Start starts the agent again with the same ports, configuration and data
// dir, and waits as StartConsul does. A -dev agent (no ConsulDataDir) comes
// back empty. Starting a running agent does nothing. Like t.Fatal, call it
// from the test's goroutine.
func (c *Consul) Start() {
	c.t.Helper()
	c.mu.Lock()
	p := c.agent
	c.mu.Unlock()
	if p != nil && !p.exited() {
		return
	}
	t0 := time.Now()
	if err := retryAddrInUse(c.Log, c.start); err != nil {
		c.t.Fatalf("testbed: restart consul at %s: %v", c.Addr, err)
	}
	c.t.Logf("testbed: consul restarted at %s after %.1fs", c.Addr, time.Since(t0).Seconds())
}

// Running reports whether the agent is running.
func (c *Consul) Running() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.agent != nil && !c.agent.exited()
}

func (c *Consul) cleanup() {
	c.mu.Lock()
	p := c.agent
	c.mu.Unlock()
	p.stop(syscall.SIGKILL, 0)
	c.httpTr.CloseIdleConnections()
	if c.t.Failed() && c.started {
		c.t.Logf("testbed: consul %s\n%s", c.Addr, logTail(c.Log))
	}
}
