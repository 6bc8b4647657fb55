package supervisor

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/estuary-mesh/estuary/host/config"
	"github.com/estuary-mesh/estuary/host/replica"
	"github.com/estuary-mesh/estuary/sdk/redact"
)

// Options tune the supervisor. Zero values take the defaults.
type Options struct {
	// Self is the estuary executable, re-executed for bundled plugins.
	// When it is the running executable, Linux runs /proc/self/exe
	// instead: the image the host runs, even if the file was replaced.
	Self string
	// BackoffBase is the first restart delay; it doubles per consecutive
	// failure up to BackoffMax.
	BackoffBase, BackoffMax time.Duration
	// CrashLoopAfter consecutive failures mark a plugin crash-looping.
	CrashLoopAfter int
	// HealthyAfter: a run that synced and lasted this long resets the
	// failure count.
	HealthyAfter time.Duration
	// StartTimeout bounds the go-plugin handshake; CallTimeout every unary
	// call (Describe, Configure).
	StartTimeout, CallTimeout time.Duration
	// StopTimeout bounds how long Run waits for plugins to stop once its
	// context ends.
	StopTimeout time.Duration
	// Secrets learns the sensitive values of every block a plugin is
	// configured with; the supervisor redacts them (and URL credentials)
	// from health messages and errors it keeps, and the host's log output
	// should go through Secrets.Writer. Nil: a set of its own.
	Secrets *redact.Secrets
}

func (o *Options) defaults() {
	if o.BackoffBase == 0 {
		o.BackoffBase = 200 * time.Millisecond
	}
	if o.BackoffMax == 0 {
		o.BackoffMax = 30 * time.Second
	}
	if o.CrashLoopAfter == 0 {
		o.CrashLoopAfter = 3
	}
	if o.HealthyAfter == 0 {
		o.HealthyAfter = 10 * time.Second
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = 30 * time.Second
	}
	if o.CallTimeout == 0 {
		o.CallTimeout = 30 * time.Second
	}
	if o.StopTimeout == 0 {
		o.StopTimeout = 10 * time.Second
	}
	if o.Secrets == nil {
		o.Secrets = &redact.Secrets{}
	}
}

// Supervisor runs the plugins a config file names.
type Supervisor struct {
	opts    Options
	logger  hclog.Logger
	store   *replica.Store
	metrics *metrics

	// applies carries Apply's requests to Run, which owns the plugins'
	// lifetime; stopped is closed when Run returns.
	applies chan applyRequest
	stopped chan struct{}

	mu      sync.Mutex
	runners map[string]*runner
	order   []string
	// hostAddrs are the host's own listen addresses, sent to plugins in
	// MeshSettings.HostAddresses.
	hostAddrs []string
}

// SetHostAddresses records the addresses the host listens on (xDS and
// admin, as bound), which plugins learn in MeshSettings.HostAddresses, so
// that a plugin told by a third party where to connect (a kubeconfig in
// a Secret) refuses the host itself. Call it before Apply.
func (s *Supervisor) SetHostAddresses(addrs []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hostAddrs = slices.Clone(addrs)
}

func (s *Supervisor) hostAddresses() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hostAddrs
}

type applyRequest struct {
	file  *config.File
	diags chan hcl.Diagnostics
}

type metrics struct {
	restarts *prometheus.CounterVec
	up       *prometheus.GaugeVec
}

// NewSupervisor returns a supervisor that streams into store. Run runs
// the plugins that Apply asks for.
func NewSupervisor(opts Options, logger hclog.Logger, store *replica.Store, reg prometheus.Registerer) *Supervisor {
	opts.defaults()
	m := &metrics{
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "estuary_plugin_restarts_total", Help: "Plugin restarts after the process or its stream ended.",
		}, []string{"plugin"}),
		up: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "estuary_plugin_up", Help: "1 while the plugin is connected and streaming.",
		}, []string{"plugin"}),
	}
	if reg != nil {
		reg.MustRegister(m.restarts, m.up)
	}
	return &Supervisor{opts: opts, logger: logger.Named("supervisor"), store: store, metrics: m,
		applies: make(chan applyRequest), stopped: make(chan struct{}), runners: map[string]*runner{}}
}

// Run keeps the plugins running until ctx ends; then it stops every
// plugin, waiting at most StopTimeout, and returns nil. The plugins live
// as long as Run: Apply hands its config to Run, which starts them. Run
// is called once.
func (s *Supervisor) Run(ctx context.Context) error {
	defer close(s.stopped)
	for {
		select {
		case <-ctx.Done():
			s.stopAll()
			return nil
		case req := <-s.applies:
			req.diags <- s.apply(ctx, req.file)
		}
	}
}

// errStopped is Apply's answer once Run has returned.
var errStopped = &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "the supervisor has stopped"}

// Apply makes the running plugins match f: new blocks start, removed ones
// stop (their instances leave the replica), changed ones are reconfigured in
// place or restarted. Diagnostics returned for a plugin mean that plugin
// kept its previous config. Apply waits for Run to take the config; once
// Run has returned, it changes nothing and says so.
func (s *Supervisor) Apply(f *config.File) hcl.Diagnostics {
	req := applyRequest{file: f, diags: make(chan hcl.Diagnostics, 1)}
	select {
	case s.applies <- req:
		return <-req.diags
	case <-s.stopped:
		return hcl.Diagnostics{errStopped}
	}
}

// apply is Apply, on Run's goroutine: plugins started here live until
// ctx ends.
func (s *Supervisor) apply(ctx context.Context, f *config.File) hcl.Diagnostics {
	s.mu.Lock()
	want := map[string]*config.Plugin{}
	var order []string
	for _, p := range f.Plugins {
		want[p.Label] = p
		order = append(order, p.Label)
	}
	var stopping []*runner
	for label, r := range s.runners {
		if _, ok := want[label]; !ok {
			stopping = append(stopping, r)
			delete(s.runners, label)
		}
	}
	var updates []func() hcl.Diagnostics
	for _, p := range f.Plugins {
		r, ok := s.runners[p.Label]
		if !ok {
			r = newRunner(s, p, f.Mesh)
			s.runners[p.Label] = r
			r.start(ctx)
			s.logger.Info("plugin started", "plugin", p.Label, "bundled", p.Bundled, "path", p.Path)
			continue
		}
		updates = append(updates, func() hcl.Diagnostics { return r.update(ctx, p, f.Mesh) })
	}
	s.order = order
	s.mu.Unlock()

	for _, r := range stopping {
		r.stop()
		s.store.RemovePlugin(r.label)
		s.logger.Info("plugin stopped: removed from config", "plugin", r.label)
	}
	var diags hcl.Diagnostics
	for _, u := range updates {
		if d := u(); d.HasErrors() {
			diags = append(diags, d...)
		}
	}
	s.store.SetPluginOrder(order)
	return diags
}

// stopAll stops every plugin and waits for them to exit, for at most
// StopTimeout: a plugin that hangs must not keep the host from exiting.
func (s *Supervisor) stopAll() {
	s.mu.Lock()
	runners := make([]*runner, 0, len(s.runners))
	for _, r := range s.runners {
		runners = append(runners, r)
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, r := range runners {
		wg.Go(r.stop)
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	t := time.NewTimer(s.opts.StopTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		s.logger.Warn("plugins did not stop in time", "timeout", s.opts.StopTimeout)
	}
}

// Statuses reports every plugin in config order.
func (s *Supervisor) Statuses() []Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Status, 0, len(s.order))
	for _, label := range s.order {
		if r, ok := s.runners[label]; ok {
			out = append(out, r.snapshot())
		}
	}
	return out
}

// Running returns the block the plugin runs: the last one its Configure
// accepted, which a restart uses, with its decoded config. It is nil
// before the plugin accepted one; latest reports whether it is the last
// block applied, rather than an earlier one kept because the plugin
// refused the last, or has not taken it yet.
func (s *Supervisor) Running(label string) (cfg *config.Plugin, latest bool) {
	s.mu.Lock()
	r, ok := s.runners[label]
	s.mu.Unlock()
	if !ok {
		return nil, false
	}
	return r.running()
}

// Ready reports whether every plugin has declared its instance set
// complete (for a plugin without CAPABILITY_INSTANCE_SET, delivered its
// first snapshot) or its sync timeout has passed since the supervisor
// started it. If not, it names the plugins it waits for.
func (s *Supervisor) Ready(now time.Time) (bool, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var waiting []string
	for _, label := range s.order {
		r := s.runners[label]
		complete, syncTimeout := r.readiness()
		if !complete && now.Sub(r.created) < syncTimeout {
			waiting = append(waiting, label)
		}
	}
	slices.Sort(waiting)
	return len(waiting) == 0, waiting
}
