package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"
	"github.com/hashicorp/hcl/v2"

	"github.com/estuary-mesh/estuary/host/config"
	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/backoff"
	"github.com/estuary-mesh/estuary/sdk/pluginclient"
)

// State of a plugin, as /debug/pluginz shows it.
type State string

const (
	StateStarting     State = "starting"
	StateRunning      State = "running"
	StateBackoff      State = "backoff"
	StateCrashLooping State = "crash-looping"
	// StateConfigError: the plugin rejected its config; it waits for a
	// reload instead of restarting.
	StateConfigError State = "config-error"
	StateStopped     State = "stopped"
)

// Status describes one plugin for /debug/pluginz and `estuary plugins`.
type Status struct {
	Label           string    `json:"label"`
	Bundled         string    `json:"bundled,omitempty"`
	Path            string    `json:"path,omitempty"`
	State           State     `json:"state"`
	Name            string    `json:"name,omitempty"`
	Version         string    `json:"version,omitempty"`
	ProtocolVersion uint32    `json:"protocol_version,omitempty"`
	Capabilities    []string  `json:"capabilities,omitempty"`
	PID             int       `json:"pid,omitempty"`
	Restarts        int       `json:"restarts"`
	Failures        int       `json:"consecutive_failures"`
	Backoffs        []string  `json:"recent_backoffs,omitempty"`
	LastError       string    `json:"last_error,omitempty"`
	StartedAt       time.Time `json:"started_at,omitzero"`
	// SnapshotReceived is set once the plugin has streamed a complete
	// snapshot; readiness waits for it.
	SnapshotReceived bool `json:"snapshot_received"`
	// InstanceSetComplete is set once a stream of the plugin has declared
	// every instance it will report; readiness waits for it, or for the
	// sync timeout. It stays set across restarts: a restarted plugin's
	// instances serve their last-known state meanwhile.
	InstanceSetComplete bool `json:"instance_set_complete"`
}

// runner keeps one plugin running.
type runner struct {
	sup    *Supervisor
	logger hclog.Logger

	mu             sync.Mutex
	cfg            *config.Plugin
	status         Status
	client         *pluginclient.Client // nil while not connected
	schema         *sdk.Schema          // from the last Describe
	canReconfigure bool
	wake           chan struct{} // a reload arrived while waiting
	// retry spaces restarts: doubling from BackoffBase per consecutive
	// failure up to BackoffMax, with ±20% jitter so that plugins that
	// failed together do not restart together.
	retry   backoff.Backoff
	restart chan struct{} // kill the current process and start again
	cancel  context.CancelFunc
	created time.Time
	done    chan struct{}
}

func newRunner(sup *Supervisor, cfg *config.Plugin) *runner {
	// Export the counter at zero, so dashboards see the plugin before its
	// first restart.
	sup.metrics.restarts.WithLabelValues(cfg.Label).Add(0)
	return &runner{
		sup:     sup,
		logger:  sup.logger.With("plugin", cfg.Label),
		cfg:     cfg,
		status:  Status{Label: cfg.Label, Bundled: cfg.Bundled, Path: cfg.Path, State: StateStarting},
		wake:    make(chan struct{}, 1),
		retry:   backoff.Backoff{Base: sup.opts.BackoffBase, Max: sup.opts.BackoffMax, Jitter: 0.2},
		restart: make(chan struct{}, 1),
		done:    make(chan struct{}),
		created: time.Now(),
	}
}

func (r *runner) start(ctx context.Context) {
	ctx, r.cancel = context.WithCancel(ctx)
	go r.loop(ctx)
}

// stop stops the plugin and waits for it to exit.
func (r *runner) stop() {
	r.cancel()
	<-r.done
}

func (r *runner) snapshot() Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.status
	st.Backoffs = append([]string(nil), st.Backoffs...)
	return st
}

func (r *runner) setState(s State, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.status.State = s
	if err != nil {
		r.status.LastError = err.Error()
	}
}

// configErr marks errors that restarting cannot fix.
type configErr struct{ error }

func (r *runner) loop(ctx context.Context) {
	defer close(r.done)
	defer r.setState(StateStopped, nil)
	for {
		started := time.Now()
		healthy, err := r.runOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		r.sup.store.Disconnected(r.label())
		r.sup.metrics.up.WithLabelValues(r.label()).Set(0)
		var cerr configErr
		if errors.As(err, &cerr) {
			r.logger.Error("plugin configuration rejected; waiting for a reload", "error", err)
			r.setState(StateConfigError, err)
			select {
			case <-ctx.Done():
				return
			case <-r.wake:
				continue
			}
		}
		r.logger.Error("plugin stopped; restarting", "error", err, "uptime", time.Since(started).Round(time.Millisecond))
		r.sup.metrics.restarts.WithLabelValues(r.label()).Inc()
		r.mu.Lock()
		r.status.Restarts++
		if healthy && time.Since(started) > r.sup.opts.HealthyAfter {
			r.status.Failures = 0
			r.retry.Reset()
		}
		r.status.Failures++
		failures := r.status.Failures
		delay := r.retry.Next()
		r.status.Backoffs = append(r.status.Backoffs, delay.Round(time.Millisecond).String())
		if len(r.status.Backoffs) > 10 {
			r.status.Backoffs = r.status.Backoffs[1:]
		}
		r.status.LastError = err.Error()
		r.status.State = StateBackoff
		if failures >= r.sup.opts.CrashLoopAfter {
			r.status.State = StateCrashLooping
		}
		r.mu.Unlock()
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		case <-r.wake:
			t.Stop()
		}
	}
}

func (r *runner) label() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cfg.Label
}

// runOnce starts the plugin and streams its state until the process or the
// stream ends. healthy reports whether it got as far as a full snapshot.
func (r *runner) runOnce(ctx context.Context) (healthy bool, err error) {
	r.mu.Lock()
	cfg := r.cfg
	r.status.State = StateStarting
	r.mu.Unlock()

	if diags := config.VerifyBinary(cfg); diags.HasErrors() {
		return false, configErr{errors.New(config.Format(diags))}
	}
	stderr := &tailBuffer{max: 8 << 10}
	client := goplugin.NewClient(r.clientConfig(cfg, stderr))
	defer client.Kill()

	rpcClient, err := client.Client()
	if err != nil {
		client.Kill() // reap the process and drain its stderr before quoting it
		return false, handshakeError(cfg, err, stderr.String())
	}
	raw, err := rpcClient.Dispense(sdk.PluginName)
	if err != nil {
		return false, fmt.Errorf("plugin %q: dispense: %w", cfg.Label, err)
	}
	pc := raw.(*pluginclient.Client)

	dctx, cancel := context.WithTimeout(ctx, r.sup.opts.CallTimeout)
	desc, err := pc.Describe(dctx, &pluginclient.DescribeRequest{})
	cancel()
	if err != nil {
		return false, fmt.Errorf("plugin %q: describe: %w", cfg.Label, err)
	}
	if desc.ProtocolVersion != sdk.ProtocolVersion {
		return false, configErr{fmt.Errorf("plugin %q: speaks registry protocol %d, the host speaks %d", cfg.Label, desc.ProtocolVersion, sdk.ProtocolVersion)}
	}
	schema := desc.ConfigSchema
	if diags := cfg.DecodeConfig(schema); diags.HasErrors() {
		return false, configErr{fmt.Errorf("plugin %q: config does not match its schema:\n%s", cfg.Label, config.Format(diags))}
	}
	pid := 0
	if rc := client.ReattachConfig(); rc != nil {
		pid = rc.Pid
	}
	r.mu.Lock()
	r.schema = schema
	r.canReconfigure = desc.HasCapability(sdk.CapabilityReconfigure)
	r.status.Name, r.status.Version, r.status.ProtocolVersion = desc.Name, desc.Version, desc.ProtocolVersion
	r.status.Capabilities = nil
	for _, c := range desc.Capabilities {
		r.status.Capabilities = append(r.status.Capabilities, c.String())
	}
	r.status.PID = pid
	r.status.StartedAt = time.Now()
	r.mu.Unlock()

	if err := r.configure(ctx, pc, cfg); err != nil {
		return false, err
	}

	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	// The plugin is held to the capabilities it declared: an event that
	// needs another one ends the stream as a protocol error.
	stream, err := pc.Watch(sctx, &pluginclient.WatchRequest{Capabilities: desc.Capabilities})
	if err != nil {
		return false, fmt.Errorf("plugin %q: watch: %w", cfg.Label, err)
	}
	r.mu.Lock()
	r.client = pc
	r.status.State = StateRunning
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.client = nil
		r.mu.Unlock()
	}()
	r.sup.metrics.up.WithLabelValues(cfg.Label).Set(1)

	// A restart request or the process exiting ends the stream.
	go func() {
		select {
		case <-r.restart:
			scancel()
		case <-sctx.Done():
		}
	}()

	sess := r.sup.store.NewSession(cfg.Label)
	// Past the sync timeout, stop waiting for the plugin to declare its
	// instance set, and drop what it has not declared again.
	defer sess.ExpireAfter(cfg.SyncTimeout)()
	for {
		b, err := stream.Recv()
		var perr *pluginclient.ProtocolError
		switch {
		case err == nil:
		case errors.As(err, &perr):
			// Nothing of the offending batch was applied. The run does not
			// count as healthy, however long it lasted, so a plugin that
			// keeps breaking the protocol backs off further each time and
			// ends up crash-looping instead of being trusted again.
			err = fmt.Errorf("plugin %q: watch: %w", cfg.Label, err)
			r.logger.Error("plugin broke the protocol; its stream is dropped", "error", perr)
			return false, err
		case sctx.Err() != nil && ctx.Err() == nil:
			return sess.SnapshotDone(), fmt.Errorf("plugin %q: restart requested", cfg.Label)
		default:
			if err == io.EOF {
				err = errors.New("stream closed")
			}
			if client.Exited() {
				err = fmt.Errorf("%w (process exited)", err)
			}
			return sess.SnapshotDone(), fmt.Errorf("plugin %q: watch: %w", cfg.Label, err)
		}
		sess.ApplyBatch(b)
		if b.SnapshotDone || b.InstanceSetComplete {
			r.mu.Lock()
			r.status.SnapshotReceived = r.status.SnapshotReceived || b.SnapshotDone
			r.status.InstanceSetComplete = r.status.InstanceSetComplete || b.InstanceSetComplete
			r.mu.Unlock()
		}
	}
}

// configure sends the decoded config block. Diagnostics the plugin returns
// point into plugins.hcl.
func (r *runner) configure(ctx context.Context, pc *pluginclient.Client, cfg *config.Plugin) error {
	cctx, cancel := context.WithTimeout(ctx, r.sup.opts.CallTimeout)
	defer cancel()
	mesh := r.sup.mesh()
	resp, err := pc.Configure(cctx, &pluginclient.ConfigureRequest{
		ConfigJSON: cfg.ConfigJSON,
		Mesh:       sdk.MeshSettings{DomainSuffix: mesh.DomainSuffix, ClusterID: mesh.ClusterID, Network: mesh.Network},
	})
	if err != nil {
		return fmt.Errorf("plugin %q: configure: %w", cfg.Label, err)
	}
	diags := cfg.PluginDiagnostics(resp.Diagnostics)
	for _, d := range diags {
		if d.Severity == hcl.DiagWarning {
			r.logger.Warn("plugin config warning", "warning", strings.TrimSpace(config.Format(hcl.Diagnostics{d})))
		}
	}
	if diags.HasErrors() {
		return configErr{fmt.Errorf("plugin %q rejected its config:\n%s", cfg.Label, config.Format(diags))}
	}
	return nil
}

// update applies a new block for the same plugin: the config block is
// sent to the running plugin, or the plugin restarts when it cannot be
// reconfigured. It returns diagnostics that must keep the old config.
func (r *runner) update(ctx context.Context, cfg *config.Plugin) hcl.Diagnostics {
	r.mu.Lock()
	schema, pc, canReconfigure, state := r.schema, r.client, r.canReconfigure, r.status.State
	r.mu.Unlock()
	if schema != nil {
		if diags := cfg.DecodeConfig(schema); diags.HasErrors() {
			return diags
		}
	}
	r.mu.Lock()
	r.cfg = cfg
	r.mu.Unlock()
	switch {
	case pc != nil && canReconfigure:
		if err := r.configure(ctx, pc, cfg); err != nil {
			return hcl.Diagnostics{{Severity: hcl.DiagError, Summary: err.Error(), Subject: cfg.DeclRange.Ptr()}}
		}
	case pc != nil:
		r.logger.Info("plugin cannot be reconfigured; restarting it")
		select {
		case r.restart <- struct{}{}:
		default:
		}
	case state == StateConfigError || state == StateBackoff || state == StateCrashLooping:
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}
	return nil
}

func (r *runner) clientConfig(cfg *config.Plugin, stderr io.Writer) *goplugin.ClientConfig {
	var cmd *exec.Cmd
	var secure *goplugin.SecureConfig
	if cfg.External() {
		cmd = exec.Command(cfg.Path, cfg.Args...)
		secure = secureConfig(cfg.SHA256)
	} else {
		cmd = exec.Command(r.sup.opts.Self, append([]string{"plugin", cfg.Bundled}, cfg.Args...)...)
	}
	cmd.Env = os.Environ()
	for k, v := range cfg.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	dieWithParent(cmd)
	return &goplugin.ClientConfig{
		HandshakeConfig:  sdk.Handshake,
		VersionedPlugins: map[int]goplugin.PluginSet{sdk.ProtocolVersion: pluginclient.PluginSet()},
		Cmd:              cmd,
		SecureConfig:     secure,
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		AutoMTLS:         true,
		StartTimeout:     r.sup.opts.StartTimeout,
		Logger:           r.sup.logger.Named("plugin").With("plugin", cfg.Label),
		Stderr:           stderr,
		GRPCDialOptions:  sdk.ClientDialOptions(),
	}
}

// handshakeError explains a failed start in the operator's terms. Failures
// that a restart cannot fix (stdout noise, a foreign cookie, another
// protocol version) are config errors: the plugin waits for a reload.
func handshakeError(cfg *config.Plugin, err error, stderr string) error {
	msg := err.Error()
	first, _, _ := strings.Cut(strings.TrimSpace(msg), "\n")
	lower := strings.ToLower(msg)
	hint, fatal := "", true
	switch {
	case strings.Contains(msg, "Failed to read any lines"), strings.Contains(msg, "exited before we could connect"), strings.Contains(msg, "plugin exited"):
		hint, fatal = "the plugin exited during start-up", false
		if strings.Contains(stderr, "This binary is a plugin") || strings.Contains(stderr, "magic cookie") {
			hint, fatal = "the plugin expects a different magic cookie: it is not an Estuary registry plugin, or was built for another host", true
		}
	case strings.Contains(msg, "Unrecognized remote plugin message"):
		hint = "the plugin wrote to stdout before the go-plugin handshake; plugins must log to stderr"
		first = strings.TrimSpace(strings.SplitN(msg, "\n", 3)[0])
	case strings.Contains(lower, "incompatible api version"):
		hint = fmt.Sprintf("the plugin does not speak registry protocol version %d", sdk.ProtocolVersion)
	case strings.Contains(msg, "checksums did not match"):
		hint = "the binary changed after it was checked"
	default:
		fatal = false
	}
	out := fmt.Sprintf("plugin %q: handshake failed: %s", cfg.Label, first)
	if hint != "" {
		out += " (" + hint + ")"
	}
	if s := lastLines(stderr, 5); s != "" {
		out += "; stderr: " + s
	}
	if fatal {
		return configErr{errors.New(out)}
	}
	return errors.New(out)
}

// lastLines returns the last n lines of a plugin's stderr worth showing:
// its own debug and info log lines are left out.
func lastLines(s string, n int) string {
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, `{"@level":"debug"`) || strings.HasPrefix(l, `{"@level":"trace"`) || strings.HasPrefix(l, `{"@level":"info"`) {
			continue
		}
		lines = append(lines, l)
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// tailBuffer keeps the last max bytes a plugin wrote to stderr, for error
// messages about a failed start.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
	max int
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.max; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

var _ io.Writer = (*tailBuffer)(nil)
