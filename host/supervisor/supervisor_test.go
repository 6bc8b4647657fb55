package supervisor

import (
	"context"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/estuary-mesh/estuary/host/config"
	"github.com/estuary-mesh/estuary/host/replica"
)

// newTestSupervisor runs a supervisor with short backoffs.
func newTestSupervisor(t *testing.T) (*Supervisor, *replica.Store) {
	t.Helper()
	return newTestSupervisorWith(t, Options{})
}

// newTestSupervisorWith runs a supervisor with short backoffs and opts.
func newTestSupervisorWith(t *testing.T, opts Options) (*Supervisor, *replica.Store) {
	t.Helper()
	store := replica.NewStore(nil)
	logger := hclog.New(&hclog.LoggerOptions{Level: hclog.Warn, Output: testLogWriter{t}})
	opts.BackoffBase, opts.BackoffMax, opts.CrashLoopAfter = 100*time.Millisecond, 2*time.Second, 3
	sup := NewSupervisor(opts, logger, store, nil)
	t.Cleanup(run(t, sup))
	return sup, store
}

// run runs sup and returns what stops it: it cancels Run's context and
// waits for Run to stop every plugin and return.
func run(tb testing.TB, sup *Supervisor) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sup.Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			tb.Errorf("Run: %v", err)
		}
	}
}

type testLogWriter struct{ t *testing.T }

func (w testLogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// waitStatus polls the plugin's status until ok holds.
func waitStatus(t *testing.T, sup *Supervisor, label string, what string, ok func(Status) bool) Status {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	var last Status
	for time.Now().Before(deadline) {
		for _, st := range sup.Statuses() {
			if st.Label == label {
				last = st
				if ok(st) {
					return st
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("plugin %q: timed out waiting for %s; last status %+v", label, what, last)
	return last
}

func TestStartFailuresAreExplained(t *testing.T) {
	tests := []struct {
		mode string
		want []string
	}{
		{"stdout", []string{"wrote to stdout before the go-plugin handshake", "hello from a plugin that prints to stdout"}},
		{"cookie", []string{"magic cookie"}},
		{"version", []string{"ncompatible API version", "registry protocol version 1"}},
	}
	for _, tt := range tests {
		t.Run(tt.mode, func(t *testing.T) {
			sup, _ := newTestSupervisor(t)
			p := selfPlugin(t, "bad", tt.mode, "")
			sup.Apply(&config.File{Plugins: []*config.Plugin{p}})
			st := waitStatus(t, sup, "bad", "a config error", func(s Status) bool { return s.State == StateConfigError })
			for _, w := range tt.want {
				if !strings.Contains(st.LastError, w) {
					t.Errorf("error %q lacks %q", st.LastError, w)
				}
			}
			if st.Restarts != 0 {
				t.Errorf("a plugin that cannot start until reconfigured was restarted %d times", st.Restarts)
			}
		})
	}
}

func TestChecksumMismatchRefusedBeforeExec(t *testing.T) {
	sup, _ := newTestSupervisor(t)
	p := selfPlugin(t, "tampered", "ok", "")
	want := p.SHA256
	p.SHA256 = strings.Repeat("ab", 32)
	sup.Apply(&config.File{Plugins: []*config.Plugin{p}})
	st := waitStatus(t, sup, "tampered", "a config error", func(s Status) bool { return s.State == StateConfigError })
	for _, h := range []string{want, p.SHA256} {
		if !strings.Contains(st.LastError, h) {
			t.Errorf("error %q does not name hash %s", st.LastError, h)
		}
	}
	if st.PID != 0 || st.Name != "" {
		t.Errorf("plugin was started despite the mismatch: %+v", st)
	}
}

func TestCrashLoopBacksOffAndSparesOthers(t *testing.T) {
	sup, store := newTestSupervisor(t)
	crash := selfPlugin(t, "crasher", "crash", "")
	good := selfPlugin(t, "good", "ok", "")
	sup.Apply(&config.File{Plugins: []*config.Plugin{crash, good}})

	st := waitStatus(t, sup, "crasher", "crash-looping", func(s Status) bool { return s.State == StateCrashLooping && len(s.Backoffs) >= 4 })
	var delays []time.Duration
	for _, b := range st.Backoffs {
		d, err := time.ParseDuration(b)
		if err != nil {
			t.Fatal(err)
		}
		delays = append(delays, d)
	}
	// Doubling with ±20% jitter keeps consecutive delays strictly growing
	// until the cap.
	for i := 1; i < len(delays); i++ {
		if delays[i] <= delays[i-1] && delays[i] < 1600*time.Millisecond {
			t.Errorf("backoff did not grow: %v", delays)
		}
	}
	if !strings.Contains(st.LastError, "crashing on purpose") {
		t.Errorf("last error %q does not carry the plugin's stderr", st.LastError)
	}
	gst := waitStatus(t, sup, "good", "running", func(s Status) bool { return s.State == StateRunning })
	if gst.Restarts != 0 {
		t.Errorf("the healthy plugin restarted %d times", gst.Restarts)
	}
	in := store.Instance(replica.InstanceKey{Plugin: "good", Provider: "Test", Cluster: "c1"})
	if in == nil || in.Service("ok.test") == nil {
		t.Fatalf("the healthy plugin's instance is missing")
	}
}

func TestPluginConfigErrorsPointIntoTheFile(t *testing.T) {
	sup, _ := newTestSupervisor(t)
	p := selfPlugin(t, "picky", "ok", "\nport = 70000\n")
	sup.Apply(&config.File{Plugins: []*config.Plugin{p}})
	st := waitStatus(t, sup, "picky", "a config error", func(s Status) bool { return s.State == StateConfigError })
	if !strings.Contains(st.LastError, "test.hcl:2:1") || !strings.Contains(st.LastError, "not between 1 and 65535") {
		t.Errorf("error %q should point at test.hcl:2:1 and say why", st.LastError)
	}

	// A fixed config brings it back without a restart loop.
	fixed := selfPlugin(t, "picky", "ok", "port = 8080\n")
	if d := sup.Apply(&config.File{Plugins: []*config.Plugin{fixed}}); d.HasErrors() {
		t.Fatal(d)
	}
	waitStatus(t, sup, "picky", "running", func(s Status) bool { return s.State == StateRunning })
}

func TestPanicBecomesInternalError(t *testing.T) {
	sup, _ := newTestSupervisor(t)
	p := selfPlugin(t, "panicky", "panic", "")
	sup.Apply(&config.File{Plugins: []*config.Plugin{p}})
	st := waitStatus(t, sup, "panicky", "a failed start", func(s Status) bool { return s.LastError != "" })
	for _, w := range []string{"Internal", "describe exploded"} {
		if !strings.Contains(st.LastError, w) {
			t.Errorf("error %q lacks %q", st.LastError, w)
		}
	}
}

func TestReloadStartsStopsAndReconfigures(t *testing.T) {
	sup, store := newTestSupervisor(t)
	a := selfPlugin(t, "a", "ok", "port = 81\n")
	sup.Apply(&config.File{Plugins: []*config.Plugin{a}})
	keyA := replica.InstanceKey{Plugin: "a", Provider: "Test", Cluster: "c1"}
	waitPort(t, store, keyA, 81)
	first := waitStatus(t, sup, "a", "running", func(s Status) bool { return s.State == StateRunning })

	// Same plugin, new config block: reconfigured in place.
	a2 := selfPlugin(t, "a", "ok", "port = 82\n")
	b := selfPlugin(t, "b", "ok", "")
	if d := sup.Apply(&config.File{Plugins: []*config.Plugin{a2, b}}); d.HasErrors() {
		t.Fatal(d)
	}
	waitPort(t, store, keyA, 82)
	if st := waitStatus(t, sup, "a", "running", func(s Status) bool { return s.State == StateRunning }); st.PID != first.PID {
		t.Errorf("reconfigure restarted the plugin: pid %d -> %d", first.PID, st.PID)
	}
	waitStatus(t, sup, "b", "running", func(s Status) bool { return s.State == StateRunning })

	// Removing a block stops the plugin and drops its instances.
	if d := sup.Apply(&config.File{Plugins: []*config.Plugin{b}}); d.HasErrors() {
		t.Fatal(d)
	}
	if store.Instance(keyA) != nil {
		t.Errorf("instance of a removed plugin is still served")
	}
	labels := []string{}
	for _, st := range sup.Statuses() {
		labels = append(labels, st.Label)
	}
	if !slices.Equal(labels, []string{"b"}) {
		t.Errorf("plugins after reload = %v, want [b]", labels)
	}
}

func waitPort(t *testing.T, store *replica.Store, key replica.InstanceKey, port uint32) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if in := store.Instance(key); in != nil {
			if svc := in.Service("ok.test"); svc != nil && len(svc.Ports) == 1 && svc.Ports[0].Number == port {
				return
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s never served ok.test on port %d", key, port)
}

// TestRunStopsEveryPluginWhenItsContextEnds: the plugins live as long as
// Run. When its context ends, Run stops them all and returns nil, and
// Apply then changes nothing and says so.
func TestRunStopsEveryPluginWhenItsContextEnds(t *testing.T) {
	store := replica.NewStore(nil)
	logger := hclog.New(&hclog.LoggerOptions{Level: hclog.Warn, Output: testLogWriter{t}})
	sup := NewSupervisor(Options{}, logger, store, nil)
	stop := run(t, sup)
	stopped := false
	defer func() {
		if !stopped {
			stop()
		}
	}()
	sup.Apply(&config.File{Plugins: []*config.Plugin{selfPlugin(t, "a", "ok", ""), selfPlugin(t, "b", "ok", "")}})
	var pids []int
	for _, label := range []string{"a", "b"} {
		pids = append(pids, waitStatus(t, sup, label, "running", func(s Status) bool { return s.State == StateRunning }).PID)
	}

	stop()
	stopped = true
	for _, st := range sup.Statuses() {
		if st.State != StateStopped {
			t.Errorf("plugin %s is %s after Run returned, want %s", st.Label, st.State, StateStopped)
		}
	}
	for _, pid := range pids {
		// The process is reaped by the time its runner stops, so signal 0
		// finds nothing.
		if err := syscall.Kill(pid, 0); err == nil {
			t.Errorf("plugin pid %d still runs after Run returned", pid)
		}
	}
	if d := sup.Apply(&config.File{Plugins: []*config.Plugin{selfPlugin(t, "c", "ok", "")}}); !d.HasErrors() {
		t.Error("Apply after Run returned reported no error")
	}
	if n := len(sup.Statuses()); n != 2 {
		t.Errorf("Apply after Run returned changed the plugins: %d of them", n)
	}
}

// TestUndeclaredCapabilityRefused: a plugin process that sends gateways
// without declaring CAPABILITY_GATEWAYS breaks the protocol. The host
// applies nothing of the offending batch, names the event, and treats the
// plugin as a broken stream that is never healthy: restarts with growing
// backoff until it is crash-looping. Another plugin is not affected, and
// the same stream from a plugin that declares the capability is accepted.
func TestUndeclaredCapabilityRefused(t *testing.T) {
	sup, store := newTestSupervisor(t)
	sneaky := selfPlugin(t, "sneaky", "gateways", "")
	honest := selfPlugin(t, "honest", "gateways-declared", "")
	sup.Apply(&config.File{Plugins: []*config.Plugin{sneaky, honest}})

	st := waitStatus(t, sup, "sneaky", "crash-looping", func(s Status) bool { return s.State == StateCrashLooping })
	want := `plugin "sneaky": watch: protocol error in batch 1, event 2 (gateways_replaced, instance "Test/c1"): ` +
		`gateways need capability GATEWAYS, which the plugin did not declare`
	if st.LastError != want {
		t.Errorf("last error:\n got %s\nwant %s", st.LastError, want)
	}
	if st.SnapshotReceived || st.Restarts < 3 {
		t.Errorf("status %+v: want restarts, and no snapshot received", st)
	}
	if in := store.Instance(replica.InstanceKey{Plugin: "sneaky", Provider: "Test", Cluster: "c1"}); in != nil {
		t.Errorf("the refused batch's instance is served: %+v", in.Status())
	}

	hst := waitStatus(t, sup, "honest", "running", func(s Status) bool { return s.State == StateRunning && s.SnapshotReceived })
	if hst.Restarts != 0 || !slices.Contains(hst.Capabilities, "GATEWAYS") {
		t.Errorf("the plugin that declared GATEWAYS: %+v", hst)
	}
	in := store.Instance(replica.InstanceKey{Plugin: "honest", Provider: "Test", Cluster: "c1"})
	if in == nil || len(in.Gateways()) != 1 || in.Service("ok.test") == nil {
		t.Fatalf("the plugin that declared GATEWAYS is not served")
	}
}

// TestProtocolErrorIsNeverHealthy: a plugin that syncs, serves for longer
// than HealthyAfter, and then breaks the protocol does not count as a
// healthy run: its failures add up to crash-looping instead of starting
// over each time. Its last good state keeps serving, stale.
func TestProtocolErrorIsNeverHealthy(t *testing.T) {
	sup, store := newTestSupervisorWith(t, Options{HealthyAfter: 50 * time.Millisecond})
	sup.Apply(&config.File{Plugins: []*config.Plugin{selfPlugin(t, "late", "gateways-late", "")}})
	st := waitStatus(t, sup, "late", "crash-looping", func(s Status) bool { return s.State == StateCrashLooping })
	if !strings.Contains(st.LastError, "(gateways_replaced, instance \"Test/c1\"): gateways need capability GATEWAYS") {
		t.Errorf("last error %q does not name the offending event", st.LastError)
	}
	in := store.Instance(replica.InstanceKey{Plugin: "late", Provider: "Test", Cluster: "c1"})
	if in == nil || in.Service("ok.test") == nil || len(in.Gateways()) != 0 || !in.Status().Stale {
		t.Errorf("want the state from before the protocol error served stale, without the gateways")
	}
}

// TestReadyWaitsForTheInstanceSet: a plugin with CAPABILITY_INSTANCE_SET
// keeps the host unready after its snapshot until it declares its instance
// set complete, or until its sync timeout passes; the timeout completes the
// set in the store too.
func TestReadyWaitsForTheInstanceSet(t *testing.T) {
	sup, store := newTestSupervisor(t)
	done := selfPlugin(t, "done", "set", `complete = true`)
	silent := selfPlugin(t, "silent", "set", ``)
	silent.SyncTimeout = 3 * time.Second
	if diags := sup.Apply(&config.File{Plugins: []*config.Plugin{done, silent}}); diags.HasErrors() {
		t.Fatal(diags)
	}
	// Within the 3s timeout: on a loaded machine starting two plugin
	// processes can take longer than that, so readiness is asked as of
	// just after Apply rather than of whenever the snapshots arrived.
	applied := time.Now()
	waitStatus(t, sup, "done", "instance set complete", func(s Status) bool { return s.InstanceSetComplete })
	waitStatus(t, sup, "silent", "snapshot", func(s Status) bool { return s.SnapshotReceived })
	if ready, waiting := sup.Ready(applied); ready || !slices.Equal(waiting, []string{"silent"}) {
		t.Errorf("Ready = %v %v, want false, waiting for silent (snapshot, no instance set)", ready, waiting)
	}
	// The store's timer may have fired already, for the same reason; if
	// so, only the timeout may have completed the set, and not early.
	if set, _ := store.InstanceSet("silent"); set.TimeoutAt.Sub(set.Since) != 3*time.Second ||
		set.Complete && (set.CompletedBy != "sync timeout" || set.CompletedAt.Before(set.TimeoutAt)) {
		t.Errorf("silent's instance set %+v, want waiting with a 3s timeout", set)
	}
	if set, _ := store.InstanceSet("done"); !set.Complete || set.CompletedBy != "plugin" {
		t.Errorf("done's instance set %+v, want complete by the plugin", set)
	}
	deadline := time.Now().Add(20 * time.Second)
	for set, _ := store.InstanceSet("silent"); !set.Complete; set, _ = store.InstanceSet("silent") {
		if time.Now().After(deadline) {
			t.Fatalf("silent's instance set never timed out: %+v", set)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if set, _ := store.InstanceSet("silent"); set.CompletedBy != "sync timeout" {
		t.Errorf("silent's instance set %+v, want completed by the sync timeout", set)
	}
	if ready, waiting := sup.Ready(time.Now()); !ready {
		t.Errorf("Ready = %v %v after the sync timeout", ready, waiting)
	}
}
