// Package sdktest is the conformance suite every registry plugin runs from
// its own tests. It serves the plugin in-process behind a real go-plugin
// gRPC connection and checks the contract the host relies on:
//
//   - Describe names the plugin and speaks the SDK's protocol version;
//   - the config decodes against the declared schema and Configure accepts it;
//   - each Watch stream starts with a snapshot closed by snapshot_done, then
//     carries deltas, with sequence numbers 1, 2, 3, ... and no gaps;
//   - every event names its instance, and an instance is added before any
//     other event of it;
//   - every instance reports synced;
//   - a new stream's snapshot equals what the first stream's deltas built;
//   - Configure can be called again on a running plugin;
//   - the plugin stops cleanly when the host kills it.
package sdktest

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/configschema"
)

// Suite describes a plugin under test.
type Suite struct {
	// Factory builds the plugin.
	Factory sdk.Factory
	// Config is the body of the plugin's `config { }` block, in HCL.
	Config string
	// Reconfig is the body used for the reconfigure check; empty reuses Config.
	Reconfig string
	// Mesh are the mesh settings passed to Configure.
	Mesh sdk.MeshSettings
	// SyncTimeout bounds every wait; default 30s.
	SyncTimeout time.Duration
	// Check, if set, asserts the plugin's state after it has synced.
	Check func(t testing.TB, r *Replica)
	// Change, if set, changes the plugin's source after the first sync;
	// Changed then reports (polled) whether the change has arrived.
	Change  func(t testing.TB)
	Changed func(r *Replica) bool
}

// Run runs the conformance suite.
func Run(t *testing.T, s Suite) {
	t.Helper()
	if s.SyncTimeout == 0 {
		s.SyncTimeout = 30 * time.Second
	}
	if s.Mesh.DomainSuffix == "" {
		s.Mesh = sdk.MeshSettings{DomainSuffix: "cluster.local", ClusterID: "Kubernetes"}
	}
	h := start(t, s)
	defer h.kill()

	desc := h.describe(t)
	cfg := decode(t, s.Config, desc.ConfigSchema)
	h.configure(t, cfg, s.Mesh)

	w1 := h.watch(t)
	w1.waitFor(t, s.SyncTimeout, "every instance synced", allSynced)
	if s.Check != nil {
		w1.with(func(r *Replica) { s.Check(t, r) })
	}
	if s.Change != nil {
		s.Change(t)
		w1.waitFor(t, s.SyncTimeout, "the change", s.Changed)
	}

	// Deltas must have built what a fresh snapshot says.
	w2 := h.watch(t)
	w2.waitFor(t, s.SyncTimeout, "second stream's snapshot", func(r *Replica) bool { return r.SnapshotDone })
	w1.with(func(r1 *Replica) {
		w2.with(func(r2 *Replica) {
			if diff := r1.Diff(r2); diff != "" {
				t.Errorf("state built from deltas differs from a new snapshot:\n%s", diff)
			}
		})
	})
	w2.stop()

	// Reconfigure on a running plugin.
	recfg := cfg
	if s.Reconfig != "" {
		recfg = decode(t, s.Reconfig, desc.ConfigSchema)
	}
	if !hasCapability(desc, registryv1.Capability_CAPABILITY_RECONFIGURE) {
		t.Errorf("Describe: plugin lacks CAPABILITY_RECONFIGURE; the host would restart it on every config change")
	}
	h.configure(t, recfg, s.Mesh)
	w1.waitFor(t, s.SyncTimeout, "every instance synced after reconfigure", allSynced)

	// Clean shutdown.
	h.kill()
	select {
	case <-h.closed:
	case <-time.After(5 * time.Second):
		t.Errorf("plugin did not stop within 5s of being killed")
	}
	w1.waitEnded(t, 5*time.Second)
	if err := w1.violation(); err != nil {
		t.Errorf("stream 1: %v", err)
	}
}

func allSynced(r *Replica) bool {
	if !r.SnapshotDone || len(r.Instances) == 0 {
		return false
	}
	for _, in := range r.Instances {
		if !in.Synced {
			return false
		}
	}
	return true
}

func hasCapability(d *registryv1.DescribeResponse, c registryv1.Capability) bool {
	for _, x := range d.GetCapabilities() {
		if x == c {
			return true
		}
	}
	return false
}

// harness is one plugin served in-process, reached through go-plugin.
type harness struct {
	client *plugin.Client
	rpc    registryv1.RegistryClient
	closed <-chan struct{}
	cancel context.CancelFunc
	once   sync.Once
}

func start(t *testing.T, s Suite) *harness {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	logger := hclog.New(&hclog.LoggerOptions{Name: "plugin", Level: hclog.Warn, Output: testWriter{t}})
	rc, closed, err := sdk.ServeTest(ctx, s.Factory, logger)
	if err != nil {
		cancel()
		t.Fatalf("serve plugin: %v", err)
	}
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig: sdk.Handshake,
		// A reattached client does not negotiate, so it takes Plugins.
		Plugins:          plugin.PluginSet{sdk.PluginName: &sdk.GRPCPlugin{}},
		Reattach:         rc,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		Logger:           hclog.NewNullLogger(),
		GRPCDialOptions:  []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(sdk.MaxMessageBytes))},
	})
	cp, err := client.Client()
	if err != nil {
		cancel()
		t.Fatalf("connect to plugin: %v", err)
	}
	raw, err := cp.Dispense(sdk.PluginName)
	if err != nil {
		cancel()
		t.Fatalf("dispense %q: %v", sdk.PluginName, err)
	}
	return &harness{client: client, rpc: raw.(registryv1.RegistryClient), closed: closed, cancel: cancel}
}

func (h *harness) kill() {
	h.once.Do(func() {
		h.client.Kill()
		h.cancel()
	})
}

func (h *harness) describe(t *testing.T) *registryv1.DescribeResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := h.rpc.Describe(ctx, &registryv1.DescribeRequest{})
	if err != nil {
		t.Fatalf("Describe: %v", err)
	}
	if d.GetName() == "" {
		t.Errorf("Describe: empty plugin name")
	}
	if d.GetVersion() == "" {
		t.Errorf("Describe: empty plugin version")
	}
	if d.GetProtocolVersion() != sdk.ProtocolVersion {
		t.Errorf("Describe: protocol version %d, want %d", d.GetProtocolVersion(), sdk.ProtocolVersion)
	}
	return d
}

func (h *harness) configure(t *testing.T, cfg []byte, mesh sdk.MeshSettings) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := h.rpc.Configure(ctx, &registryv1.ConfigureRequest{
		ConfigJson: cfg,
		Mesh:       &registryv1.MeshSettings{DomainSuffix: mesh.DomainSuffix, ClusterId: mesh.ClusterID, Network: mesh.Network},
	})
	if err != nil {
		t.Fatalf("Configure: %v", err)
	}
	for _, d := range resp.GetDiagnostics() {
		if d.GetSeverity() == registryv1.Severity_SEVERITY_ERROR {
			t.Fatalf("Configure rejected the config: %s: %s (at %s)", d.GetSummary(), d.GetDetail(), strings.Join(d.GetPath(), "."))
		}
	}
}

func decode(t *testing.T, src string, schema *registryv1.Schema) []byte {
	t.Helper()
	js, diags := configschema.ParseHCL("config.hcl", []byte(src), configschema.FromProto(schema))
	if diags.HasErrors() {
		t.Fatalf("config does not match the plugin's schema: %s", diags.Error())
	}
	return js
}

// watcher consumes one Watch stream into a Replica, checking the protocol.
type watcher struct {
	mu      sync.Mutex
	cond    *sync.Cond
	replica *Replica
	err     error // first protocol violation
	ended   bool
	cancel  context.CancelFunc
}

func (h *harness) watch(t *testing.T) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := h.rpc.Watch(ctx, &registryv1.WatchRequest{})
	if err != nil {
		cancel()
		t.Fatalf("Watch: %v", err)
	}
	w := &watcher{replica: NewReplica(), cancel: cancel}
	w.cond = sync.NewCond(&w.mu)
	go w.run(stream)
	t.Cleanup(w.stop)
	return w
}

func (w *watcher) stop() { w.cancel() }

func (w *watcher) run(stream grpc.ServerStreamingClient[registryv1.WatchResponse]) {
	for {
		resp, err := stream.Recv()
		w.mu.Lock()
		if err != nil {
			w.ended = true
			if err != io.EOF && w.replica.err == nil && !w.replica.SnapshotDone {
				w.err = fmt.Errorf("stream ended before the snapshot was complete: %w", err)
			}
			w.cond.Broadcast()
			w.mu.Unlock()
			return
		}
		if verr := w.replica.Apply(resp); verr != nil && w.err == nil {
			w.err = verr
		}
		w.cond.Broadcast()
		w.mu.Unlock()
	}
}

func (w *watcher) with(f func(*Replica)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	f(w.replica)
}

func (w *watcher) violation() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

func (w *watcher) waitFor(t *testing.T, timeout time.Duration, what string, ok func(*Replica) bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	timer := time.AfterFunc(timeout, func() { w.mu.Lock(); w.cond.Broadcast(); w.mu.Unlock() })
	defer timer.Stop()
	w.mu.Lock()
	defer w.mu.Unlock()
	for !ok(w.replica) {
		if w.err != nil {
			t.Fatalf("waiting for %s: protocol violation: %v", what, w.err)
		}
		if w.ended {
			t.Fatalf("waiting for %s: stream ended", what)
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: timed out after %s; state:\n%s", what, timeout, w.replica)
		}
		w.cond.Wait()
	}
	if w.err != nil {
		t.Fatalf("protocol violation: %v", w.err)
	}
}

func (w *watcher) waitEnded(t *testing.T, timeout time.Duration) {
	t.Helper()
	timer := time.AfterFunc(timeout, func() { w.mu.Lock(); w.cond.Broadcast(); w.mu.Unlock() })
	defer timer.Stop()
	deadline := time.Now().Add(timeout)
	w.mu.Lock()
	defer w.mu.Unlock()
	for !w.ended {
		if time.Now().After(deadline) {
			t.Errorf("watch stream still open %s after the plugin was killed", timeout)
			return
		}
		w.cond.Wait()
	}
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
