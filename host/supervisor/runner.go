package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"
	"github.com/hashicorp/hcl/v2"

	"github.com/estuary-mesh/estuary/host/config"
	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/backoff"
	"github.com/estuary-mesh/estuary/sdk/configschema"
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
// Restarts and Failures count runs that ended on their own; a restart
// that a new block needs is neither.
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
	// ConfigGeneration counts the plugin's blocks applied, the latest
	// first; RunningGeneration is the one the plugin last accepted, which
	// runs and which a restart uses. RejectedGeneration, when set, is the
	// latest block, which the plugin or the host refused.
	ConfigGeneration   uint64 `json:"config_generation"`
	RunningGeneration  uint64 `json:"running_generation"`
	RejectedGeneration uint64 `json:"rejected_generation,omitempty"`
	// InstanceSetComplete is set once a stream of the plugin has declared
	// every instance it will report; readiness waits for it, or for the
	// sync timeout. It stays set across restarts: a restarted plugin's
	// instances serve their last-known state meanwhile.
	InstanceSetComplete bool `json:"instance_set_complete"`
}

// generation is one applied config block of a plugin, with the mesh
// settings it is configured with. The block is shared with the config
// file, so it is only read: json holds the block decoded against the
// plugin's schema, once Configure accepted it.
type generation struct {
	n      uint64
	cfg    *config.Plugin
	mesh   config.Mesh
	json   []byte
	schema *sdk.Schema // json was decoded against it
}

// sameProcess reports whether a process started for g can take o by
// Configure; otherwise moving to o takes a restart.
func (g generation) sameProcess(o generation) bool {
	return g.cfg.Same(o.cfg) && g.mesh == o.mesh
}

// runner keeps one plugin running.
type runner struct {
	sup     *Supervisor
	logger  hclog.Logger
	label   string
	created time.Time

	mu sync.Mutex
	// desired is the latest block Apply gave; committed the latest one
	// Configure accepted. A restart starts desired unless it was rejected,
	// then committed unless that was rejected too.
	desired, committed                 generation
	desiredRejected, committedRejected bool

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
	done    chan struct{}
}

func newRunner(sup *Supervisor, cfg *config.Plugin, mesh config.Mesh) *runner {
	// Export the counter at zero, so dashboards see the plugin before its
	// first restart.
	sup.metrics.restarts.WithLabelValues(cfg.Label).Add(0)
	return &runner{
		sup:     sup,
		logger:  sup.logger.With("plugin", cfg.Label),
		label:   cfg.Label,
		desired: generation{n: 1, cfg: cfg, mesh: mesh},
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
	st.ConfigGeneration, st.RunningGeneration = r.desired.n, r.committed.n
	if r.desiredRejected {
		st.RejectedGeneration = r.desired.n
	}
	return st
}

// readiness reports whether the plugin has declared its instance set
// complete, and how long readiness waits for that.
func (r *runner) readiness() (instanceSetComplete bool, syncTimeout time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.status.InstanceSetComplete, r.desired.cfg.SyncTimeout
}

// nextLocked is the generation to start: the desired one unless it was
// rejected, else the committed one unless that was rejected too.
func (r *runner) nextLocked() (generation, bool) {
	switch {
	case !r.desiredRejected:
		return r.desired, true
	case r.committed.n != 0 && !r.committedRejected:
		return r.committed, true
	}
	return generation{}, false
}

// commit records that the plugin accepted g, decoded as js against schema.
func (r *runner) commit(g generation, js []byte, schema *sdk.Schema) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if g.n >= r.committed.n {
		g.json, g.schema = js, schema
		r.committed, r.committedRejected = g, false
	}
}

// running returns the block the plugin runs, with its decoded config, or
// nil before it accepted one; latest reports whether it is the last block
// applied.
func (r *runner) running() (cfg *config.Plugin, latest bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.committed.n == 0 {
		return nil, false
	}
	c := *r.committed.cfg
	c.ConfigJSON, c.Schema = r.committed.json, r.committed.schema
	return &c, r.committed.n == r.desired.n
}

// reject records that generation n cannot run, and why.
func (r *runner) reject(n uint64, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.desired.n == n {
		r.desiredRejected = true
	}
	if r.committed.n == n {
		r.committedRejected = true
	}
	r.status.LastError = r.sup.opts.Secrets.String(err.Error())
}

func (r *runner) setState(s State, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.status.State = s
	if err != nil {
		r.status.LastError = r.sup.opts.Secrets.String(err.Error())
	}
}

// configErr marks errors that restarting cannot fix.
type configErr struct{ error }

// errRestart ends a run that a new config block needs to restart; it is
// not a failure.
var errRestart = errors.New("restarting for a new config block")

func (r *runner) loop(ctx context.Context) {
	defer close(r.done)
	defer r.setState(StateStopped, nil)
	for {
		r.mu.Lock()
		g, ok := r.nextLocked()
		r.mu.Unlock()
		if !ok {
			// Every block the plugin had was rejected: wait for a reload.
			r.setState(StateConfigError, nil)
			select {
			case <-ctx.Done():
				return
			case <-r.wake:
				continue
			}
		}
		started := time.Now()
		healthy, err := r.runOnce(ctx, g)
		if ctx.Err() != nil {
			return
		}
		r.sup.store.Disconnected(r.label)
		r.sup.metrics.up.WithLabelValues(r.label).Set(0)
		if errors.Is(err, errRestart) {
			r.logger.Info("plugin restarting with its new config block")
			continue
		}
		var cerr configErr
		if errors.As(err, &cerr) {
			// runOnce marked the generation rejected: start the last
			// accepted one if there is one, else wait for a reload.
			r.logger.Error("plugin configuration rejected", "error", err)
			continue
		}
		r.logger.Error("plugin stopped; restarting", "error", err, "uptime", time.Since(started).Round(time.Millisecond))
		r.sup.metrics.restarts.WithLabelValues(r.label).Inc()
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
		r.status.LastError = r.sup.opts.Secrets.String(err.Error())
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

// runOnce starts the plugin with generation g and streams its state until
// the process or the stream ends. healthy reports whether it got as far as
// a full snapshot. A block applied while the plugin starts is configured
// before it counts as running, or restarts it (errRestart). A configErr
// marks the generation it concerns rejected.
func (r *runner) runOnce(ctx context.Context, g generation) (healthy bool, err error) {
	cfg := g.cfg
	cur := g // the generation being configured
	defer func() {
		var cerr configErr
		if errors.As(err, &cerr) {
			r.reject(cur.n, err)
		}
	}()
	r.setState(StateStarting, nil)

	// The binary is checked and hashed through the descriptor it then
	// runs from, so nothing swapped in at its path afterwards ever runs.
	bin, diags := config.OpenBinary(cfg)
	if diags.HasErrors() {
		return false, configErr{errors.New(config.Format(diags))}
	}
	stderr := &tailBuffer{max: 8 << 10}
	client := goplugin.NewClient(r.clientConfig(cfg, bin, stderr))
	defer client.Kill()

	rpcClient, err := client.Client()
	if bin != nil {
		// Started (or failed to): the child holds its own copy.
		bin.Close()
	}
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
	canReconfigure := desc.HasCapability(sdk.CapabilityReconfigure)
	pid := 0
	if rc := client.ReattachConfig(); rc != nil {
		pid = rc.Pid
	}
	r.mu.Lock()
	r.schema = schema
	r.canReconfigure = canReconfigure
	r.status.Name, r.status.Version, r.status.ProtocolVersion = desc.Name, desc.Version, desc.ProtocolVersion
	r.status.Capabilities = nil
	for _, c := range desc.Capabilities {
		r.status.Capabilities = append(r.status.Capabilities, c.String())
	}
	r.status.PID = pid
	r.status.StartedAt = time.Now()
	r.mu.Unlock()

	// Configure cur, then look again: Apply may have given a newer block
	// meanwhile, which it left to this start-up to apply.
	accepted := false // this process runs an accepted generation
	for {
		js, err := r.configureChecked(ctx, pc, schema, cur)
		var cerr configErr
		switch {
		case err == nil:
			r.commit(cur, js, schema)
			accepted = true
		case accepted && errors.As(err, &cerr):
			// A newer block was refused; the process keeps the one it
			// accepted, which stays committed.
			r.reject(cur.n, err)
			r.logger.Error("plugin configuration rejected; it keeps its previous config", "error", err)
		default:
			return false, err
		}
		r.mu.Lock()
		next, ok := r.nextLocked()
		if ok && next.n != cur.n && next.n != r.committed.n {
			r.mu.Unlock()
			if !canReconfigure || !g.sameProcess(next) {
				return false, errRestart
			}
			cur = next
			continue
		}
		// Connected: from now on Apply configures this process itself.
		// Requests from before are covered by the check above.
		r.client = pc
		drain(r.wake)
		drain(r.restart)
		r.mu.Unlock()
		break
	}
	defer func() {
		r.mu.Lock()
		r.client = nil
		r.mu.Unlock()
	}()

	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	// The plugin is held to the capabilities it declared: an event that
	// needs another one ends the stream as a protocol error.
	stream, err := pc.Watch(sctx, &pluginclient.WatchRequest{Capabilities: desc.Capabilities})
	if err != nil {
		return false, fmt.Errorf("plugin %q: watch: %w", cfg.Label, err)
	}
	r.setState(StateRunning, nil)
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
			return sess.SnapshotDone(), errRestart
		default:
			if err == io.EOF {
				err = errors.New("stream closed")
			}
			if client.Exited() {
				err = fmt.Errorf("%w (process exited)", err)
			}
			return sess.SnapshotDone(), fmt.Errorf("plugin %q: watch: %w", cfg.Label, err)
		}
		r.redactHealth(b)
		sess.ApplyBatch(b)
		if b.SnapshotDone || b.InstanceSetComplete {
			r.mu.Lock()
			r.status.SnapshotReceived = r.status.SnapshotReceived || b.SnapshotDone
			r.status.InstanceSetComplete = r.status.InstanceSetComplete || b.InstanceSetComplete
			r.mu.Unlock()
		}
	}
}

// redactHealth removes sensitive values and URL credentials from the
// health messages in b before the replica keeps them for /readyz and
// /debug/syncz. The SDK already does this in the plugin; a plugin built
// otherwise, or a value it learnt elsewhere, is caught here.
func (r *runner) redactHealth(b *pluginclient.Batch) {
	sec := r.sup.opts.Secrets
	clean := func(h *sdk.InstanceHealth) {
		if h == nil {
			return
		}
		h.Message = sec.String(h.Message)
		for i := range h.Notices {
			h.Notices[i].Subject = sec.String(h.Notices[i].Subject)
			h.Notices[i].Message = sec.String(h.Notices[i].Message)
		}
	}
	clean(b.PluginHealth)
	for i := range b.Events {
		clean(b.Events[i].Health)
	}
}

// configureChecked checks g's block against the plugin's schema and sends
// it. Diagnostics the plugin returns point into plugins.hcl; a refused
// block is a configErr.
func (r *runner) configureChecked(ctx context.Context, pc *pluginclient.Client, schema *sdk.Schema, g generation) ([]byte, error) {
	cfg := g.cfg
	js, diags := g.json, hcl.Diagnostics(nil)
	if js == nil || g.schema != schema {
		js, diags = decodeBlock(cfg, schema)
	}
	if diags.HasErrors() {
		return nil, configErr{fmt.Errorf("plugin %q: config does not match its schema:\n%s", cfg.Label, config.Format(diags))}
	}
	// From now on the block's sensitive values are redacted from the
	// host's log, the plugin's forwarded log and its health messages.
	r.sup.opts.Secrets.Add(schema.SensitiveValues(js)...)
	cctx, cancel := context.WithTimeout(ctx, r.sup.opts.CallTimeout)
	defer cancel()
	resp, err := pc.Configure(cctx, &pluginclient.ConfigureRequest{
		ConfigJSON: js,
		Mesh: sdk.MeshSettings{DomainSuffix: g.mesh.DomainSuffix, ClusterID: g.mesh.ClusterID, Network: g.mesh.Network,
			HostAddresses: r.sup.hostAddresses()},
	})
	if err != nil {
		return nil, fmt.Errorf("plugin %q: configure: %w", cfg.Label, err)
	}
	diags = cfg.PluginDiagnostics(resp.Diagnostics)
	for _, d := range diags {
		if d.Severity == hcl.DiagWarning {
			r.logger.Warn("plugin config warning", "warning", strings.TrimSpace(config.Format(hcl.Diagnostics{d})))
		}
	}
	if diags.HasErrors() {
		return nil, configErr{fmt.Errorf("plugin %q rejected its config:\n%s", cfg.Label, config.Format(diags))}
	}
	return js, nil
}

// decodeBlock decodes cfg's config block against schema. The file's
// loader decoded a bundled plugin's block already, against the schema the
// same code describes in-process: that result is taken when the schemas
// match, so a reload decodes each block once. (hcldec and cty take about
// 0.3 s for a static block of 10,000 endpoints on a busy 2-core machine.)
func decodeBlock(cfg *config.Plugin, schema *sdk.Schema) ([]byte, hcl.Diagnostics) {
	if cfg.ConfigJSON != nil && configschema.Equal(cfg.Schema, schema) {
		return cfg.ConfigJSON, nil
	}
	return configschema.Decode(cfg.Config, schema)
}

// update applies a new block for the same plugin as its next generation.
// A connected plugin is reconfigured in place, or restarted when it cannot
// take the block by Configure; a deliberate restart is not a failure. A
// plugin that is starting applies the block once its start-up Configure
// returns; one waiting to restart starts with it now. The diagnostics
// returned mean the plugin refused the block and keeps running, and
// restarts with, the block it last accepted.
func (r *runner) update(ctx context.Context, cfg *config.Plugin, mesh config.Mesh) hcl.Diagnostics {
	r.mu.Lock()
	r.desired = generation{n: r.desired.n + 1, cfg: cfg, mesh: mesh}
	r.desiredRejected = false
	g, committed, schema := r.desired, r.committed, r.schema
	r.mu.Unlock()
	if schema != nil && committed.n != 0 && committed.cfg.Same(cfg) {
		// The same binary: its schema applies. A block that does not
		// match it is refused here, with every problem's position.
		js, diags := decodeBlock(cfg, schema)
		if diags.HasErrors() {
			r.reject(g.n, errors.New(config.Format(diags)))
			return diags
		}
		g.json, g.schema = js, schema
	}
	r.mu.Lock()
	pc, schema, canReconfigure := r.client, r.schema, r.canReconfigure
	committed = r.committed
	switch {
	case pc == nil:
		signal(r.wake)
		r.mu.Unlock()
		return nil
	case !canReconfigure || !committed.sameProcess(g):
		signal(r.restart)
		r.mu.Unlock()
		r.logger.Info("plugin cannot take its new block by Configure; restarting it")
		return nil
	}
	r.mu.Unlock()
	js, err := r.configureChecked(ctx, pc, schema, g)
	var cerr configErr
	switch {
	case errors.As(err, &cerr):
		// The plugin refused the block: it keeps the one it had, and a
		// restart must not bring up the refused one.
		r.reject(g.n, err)
		return hcl.Diagnostics{{Severity: hcl.DiagError, Summary: err.Error(), Subject: cfg.DeclRange.Ptr()}}
	case err != nil:
		// The call failed, not the block: the plugin died or hangs. The
		// block stays desired, so the restart that follows (the runner's
		// own, after a death, or this one, for a hung plugin) starts
		// with it.
		r.logger.Warn("plugin could not take its new block; restarting it with that block", "error", err)
		r.mu.Lock()
		signal(r.restart)
		r.mu.Unlock()
		return nil
	}
	r.commit(g, js, schema)
	return nil
}

// signal leaves a token in ch unless one is already there.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// drain takes the token left in ch, if any.
func drain(ch chan struct{}) {
	select {
	case <-ch:
	default:
	}
}

// clientConfig is how go-plugin starts cfg: an external plugin from bin,
// its binary as OpenBinary checked it, a bundled one from the host's own
// image; either with pluginEnv as its whole environment.
func (r *runner) clientConfig(cfg *config.Plugin, bin *os.File, stderr io.Writer) *goplugin.ClientConfig {
	var cmd *exec.Cmd
	if cfg.External() {
		cmd = exec.Command(cfg.Path, cfg.Args...)
		execFromFile(cmd, bin)
	} else {
		self := r.sup.opts.Self
		cmd = exec.Command(self, append([]string{"plugin", cfg.Bundled}, cfg.Args...)...)
		if exe, err := os.Executable(); err == nil && exe == self {
			cmd.Path = runningImage(self)
		}
	}
	cmd.Env = pluginEnv(os.Environ(), cfg.Env)
	dieWithParent(cmd)
	return &goplugin.ClientConfig{
		HandshakeConfig:  sdk.Handshake,
		VersionedPlugins: map[int]goplugin.PluginSet{sdk.ProtocolVersion: pluginclient.PluginSet()},
		Cmd:              cmd,
		// go-plugin would append the host's whole environment after
		// ours, overriding the plugin's env block with it.
		SkipHostEnv:      true,
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		AutoMTLS:         true,
		StartTimeout:     r.sup.opts.StartTimeout,
		Logger:           r.sup.logger.Named("plugin").With("plugin", cfg.Label),
		Stderr:           stderr,
		GRPCDialOptions:  sdk.ClientDialOptions(),
	}
}

// inheritedEnv are the variables of the host's environment a plugin
// inherits: where to find programs and temporary files, locale and time
// zone, the system's CA bundle, the Go runtime's knobs, and the address a
// pod's in-cluster client config reads. Nothing that commonly carries a
// credential (CONSUL_HTTP_TOKEN, AWS_*, proxies with user:pass@) passes;
// a plugin that needs such a variable gets it from its env block.
var inheritedEnv = []string{
	"PATH", "HOME", "USER", "LOGNAME", "TMPDIR", "LANG", "LANGUAGE", "TZ",
	"SSL_CERT_FILE", "SSL_CERT_DIR",
	"GOMAXPROCS", "GOMEMLIMIT", "GOGC", "GODEBUG", "GOTRACEBACK", "GOCOVERDIR",
	"KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT",
}

// pluginEnv is a plugin's environment: the allowed variables of the
// host's (inheritedEnv, and LC_*), then the plugin's env block, which wins
// over them. go-plugin adds its handshake variables after these.
func pluginEnv(host []string, own map[string]string) []string {
	var env []string
	for _, kv := range host {
		k, _, _ := strings.Cut(kv, "=")
		if _, set := own[k]; set {
			continue
		}
		if slices.Contains(inheritedEnv, k) || strings.HasPrefix(k, "LC_") {
			env = append(env, kv)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(own)) {
		env = append(env, k+"="+own[k])
	}
	return env
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
