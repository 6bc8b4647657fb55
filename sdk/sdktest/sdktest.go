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
//   - the plugin declares CAPABILITY_INSTANCE_SET and marks its instance
//     set complete on every stream, with every instance it reports already
//     declared then;
//   - a new stream's snapshot equals what the first stream's deltas built;
//   - Configure can be called again on a running plugin;
//   - the plugin stops cleanly when the host kills it.
package sdktest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"github.com/hashicorp/go-plugin/runner"

	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/configschema"
	"github.com/estuary-mesh/estuary/sdk/pluginclient"
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
	h := Start(t, s.Factory)
	defer h.Kill()

	desc := h.Describe(t)
	cfg := decode(t, s.Config, desc.ConfigSchema)
	if diags := h.configure(t, cfg, s.Mesh); diags.HasErrors() {
		t.Fatalf("Configure rejected the config: %v", diags)
	}

	if !desc.HasCapability(sdk.CapabilityInstanceSet) {
		t.Errorf("Describe: plugin lacks CAPABILITY_INSTANCE_SET; a host that restarts it keeps its old instances until the sync timeout")
	}
	w1 := h.Watch(t)
	w1.WaitFor(t, s.SyncTimeout, "every instance synced", AllSynced)
	w1.WaitFor(t, s.SyncTimeout, "the instance set complete (State.InstanceSetComplete)", func(r *Replica) bool { return r.InstanceSetComplete })
	w1.With(func(r *Replica) {
		for id := range r.Instances {
			if !slices.Contains(r.DeclaredAtComplete, id) {
				t.Errorf("instance %s was declared after the instance set was complete (then: %v)", id, r.DeclaredAtComplete)
			}
		}
	})
	if s.Check != nil {
		w1.With(func(r *Replica) { s.Check(t, r) })
	}
	if s.Change != nil {
		s.Change(t)
		w1.WaitFor(t, s.SyncTimeout, "the change", s.Changed)
	}

	// Deltas must have built what a fresh snapshot says.
	w2 := h.Watch(t)
	w2.WaitFor(t, s.SyncTimeout, "second stream's snapshot and instance set", func(r *Replica) bool { return r.SnapshotDone && r.InstanceSetComplete })
	w1.With(func(r1 *Replica) {
		w2.With(func(r2 *Replica) {
			if diff := r1.Diff(r2); diff != "" {
				t.Errorf("state built from deltas differs from a new snapshot:\n%s", diff)
			}
		})
	})
	w2.Stop()

	// Reconfigure on a running plugin.
	recfg := cfg
	if s.Reconfig != "" {
		recfg = decode(t, s.Reconfig, desc.ConfigSchema)
	}
	if !desc.HasCapability(sdk.CapabilityReconfigure) {
		t.Errorf("Describe: plugin lacks CAPABILITY_RECONFIGURE; the host would restart it on every config change")
	}
	if diags := h.configure(t, recfg, s.Mesh); diags.HasErrors() {
		t.Fatalf("Configure rejected the new config: %v", diags)
	}
	w1.WaitFor(t, s.SyncTimeout, "every instance synced after reconfigure", AllSynced)

	// Clean shutdown.
	h.Kill()
	select {
	case <-h.closed:
	case <-time.After(5 * time.Second):
		t.Errorf("plugin did not stop within 5s of being killed")
	}
	w1.waitEnded(t, 5*time.Second)
	if err := w1.Err(); err != nil {
		t.Errorf("stream 1: %v", err)
	}
}

// AllSynced reports whether the snapshot is done and every instance synced.
func AllSynced(r *Replica) bool {
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

// Harness is one plugin served in-process, reached through go-plugin. Plugin
// tests use it to drive a plugin beyond the fixed suite.
type Harness struct {
	client *plugin.Client
	conn   plugin.ClientProtocol
	rpc    *pluginclient.Client
	closed <-chan struct{}
	cancel context.CancelFunc
	once   sync.Once
}

// Start serves the plugin built by f. It is killed when the test ends.
func Start(t testing.TB, f sdk.Factory) *Harness {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	logger := hclog.New(&hclog.LoggerOptions{Name: "plugin", Level: hclog.Warn, Output: testWriter{t}})
	rc, closed, err := sdk.ServeTest(ctx, f, logger)
	if err != nil {
		cancel()
		t.Fatalf("serve plugin: %v", err)
	}
	// go-plugin's default reattach watches the plugin's PID, which here is
	// the test process itself, in a goroutine that never ends; this runner
	// waits for the plugin to stop serving instead.
	rc.ReattachFunc = func() (runner.AttachedRunner, error) { return inProcess{closed}, nil }
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig: sdk.Handshake,
		// A reattached client does not negotiate, so it takes Plugins.
		Plugins:          pluginclient.PluginSet(),
		Reattach:         rc,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		Logger:           hclog.NewNullLogger(),
		GRPCDialOptions:  sdk.ClientDialOptions(),
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
	h := &Harness{client: client, conn: cp, rpc: raw.(*pluginclient.Client), closed: closed, cancel: cancel}
	t.Cleanup(h.Kill)
	return h
}

// Kill stops the plugin as the host does, and returns once everything the
// plugin and the SDK started for it has ended (sdk.ServeTest's promise), so
// no goroutine of the plugin outlives, or logs after, the test.
func (h *Harness) Kill() {
	h.once.Do(func() {
		h.client.Kill()
		// A client reattached in test mode neither closes its connection
		// nor stops the plugin on Kill. Closing the connection asks the
		// plugin to shut down, as the host does; ending its context only
		// after it has stopped keeps go-plugin from stopping the server
		// twice at once (a data race inside go-plugin). A plugin that
		// ignores the closed connection is stopped through its context.
		_ = h.conn.Close()
		select {
		case <-h.closed:
		case <-time.After(killGrace):
		}
		h.cancel()
		<-h.closed
	})
}

// killGrace is how long Kill lets a plugin stop on its own before it ends
// the plugin's context; generous, so a busy machine does not take the
// slower path.
const killGrace = 30 * time.Second

// inProcess is the go-plugin runner of a plugin served in this process.
type inProcess struct{ closed <-chan struct{} }

func (r inProcess) Wait(context.Context) error { <-r.closed; return nil }
func (inProcess) Kill(context.Context) error   { return nil }
func (inProcess) ID() string                   { return "in-process" }
func (inProcess) PluginToHost(n, a string) (string, string, error) {
	return n, a, nil
}
func (inProcess) HostToPlugin(n, a string) (string, string, error) {
	return n, a, nil
}

// Describe calls Describe and checks the identity it returns.
func (h *Harness) Describe(t testing.TB) *pluginclient.DescribeResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := h.rpc.Describe(ctx, &pluginclient.DescribeRequest{})
	if err != nil {
		t.Fatalf("Describe: %v", err)
	}
	if d.Name == "" {
		t.Errorf("Describe: empty plugin name")
	}
	if d.Version == "" {
		t.Errorf("Describe: empty plugin version")
	}
	if d.ProtocolVersion != sdk.ProtocolVersion {
		t.Errorf("Describe: protocol version %d, want %d", d.ProtocolVersion, sdk.ProtocolVersion)
	}
	return d
}

// Configure decodes config (HCL) against the plugin's schema and applies it,
// failing the test on any error.
func (h *Harness) Configure(t testing.TB, config string, mesh sdk.MeshSettings) {
	t.Helper()
	if diags := h.TryConfigure(t, config, mesh); diags.HasErrors() {
		t.Fatalf("Configure rejected the config: %v", diags)
	}
}

// TryConfigure applies config and returns the plugin's diagnostics.
func (h *Harness) TryConfigure(t testing.TB, config string, mesh sdk.MeshSettings) sdk.Diagnostics {
	t.Helper()
	cfg := decode(t, config, h.Describe(t).ConfigSchema)
	return h.configure(t, cfg, mesh)
}

func (h *Harness) configure(t testing.TB, cfg []byte, mesh sdk.MeshSettings) sdk.Diagnostics {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := h.rpc.Configure(ctx, &pluginclient.ConfigureRequest{ConfigJSON: cfg, Mesh: mesh})
	if err != nil {
		t.Fatalf("Configure: %v", err)
	}
	return resp.Diagnostics
}

func decode(t testing.TB, src string, schema *sdk.Schema) []byte {
	t.Helper()
	js, diags := configschema.ParseHCL("config.hcl", []byte(src), schema)
	if diags.HasErrors() {
		t.Fatalf("config does not match the plugin's schema: %s", diags.Error())
	}
	return js
}

// Watcher consumes one Watch stream into a Replica, checking the protocol.
type Watcher struct {
	mu      sync.Mutex
	cond    *sync.Cond
	replica *Replica
	err     error // first protocol violation
	ended   bool
	cancel  context.CancelFunc
	done    chan struct{} // closed when run returns
}

// Watch opens a Watch stream; it is closed when the test ends. The stream
// goes through the host's own plugin client, so it is checked exactly as
// the host checks it, including against the capabilities the plugin
// declares: gateways from a plugin without CAPABILITY_GATEWAYS, or a second
// instance from one without CAPABILITY_MULTI_INSTANCE, are violations.
func (h *Harness) Watch(t testing.TB) *Watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	desc, err := h.rpc.Describe(ctx, &pluginclient.DescribeRequest{})
	if err != nil {
		cancel()
		t.Fatalf("Describe: %v", err)
	}
	stream, err := h.rpc.Watch(ctx, &pluginclient.WatchRequest{Capabilities: desc.Capabilities})
	if err != nil {
		cancel()
		t.Fatalf("Watch: %v", err)
	}
	w := &Watcher{replica: newReplica(), cancel: cancel, done: make(chan struct{})}
	w.cond = sync.NewCond(&w.mu)
	go func() {
		defer close(w.done)
		w.run(stream)
	}()
	t.Cleanup(w.Stop)
	return w
}

// Stop closes the stream and waits until the watcher's goroutine is gone.
func (w *Watcher) Stop() {
	w.cancel()
	<-w.done
}

func (w *Watcher) run(stream *pluginclient.WatchStream) {
	for {
		b, err := stream.Recv()
		w.mu.Lock()
		if err != nil {
			// A protocol violation has ended the stream, as it does in the
			// host: the plugin is not listened to any further.
			var perr *pluginclient.ProtocolError
			w.ended = true
			switch {
			case w.err != nil:
			case errors.As(err, &perr):
				w.err = err
			case err != io.EOF && !w.replica.SnapshotDone:
				w.err = fmt.Errorf("stream ended before the snapshot was complete: %w", err)
			}
			w.cond.Broadcast()
			w.mu.Unlock()
			return
		}
		w.replica.Responses++
		w.replica.apply(b)
		w.cond.Broadcast()
		w.mu.Unlock()
	}
}

// With runs f on the replica under the watcher's lock.
func (w *Watcher) With(f func(*Replica)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	f(w.replica)
}

// Err returns the first protocol violation seen on the stream.
func (w *Watcher) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// WaitFor blocks until ok holds for the replica, failing the test after
// timeout or on a protocol violation.
func (w *Watcher) WaitFor(t testing.TB, timeout time.Duration, what string, ok func(*Replica) bool) {
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

func (w *Watcher) waitEnded(t testing.TB, timeout time.Duration) {
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
