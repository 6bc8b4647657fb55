package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"reflect"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"

	"github.com/estuary-mesh/estuary/host/admin"
	"github.com/estuary-mesh/estuary/host/aggregate"
	"github.com/estuary-mesh/estuary/host/config"
	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/host/network"
	"github.com/estuary-mesh/estuary/host/pipeline"
	"github.com/estuary-mesh/estuary/host/replica"
	"github.com/estuary-mesh/estuary/host/supervisor"
	"github.com/estuary-mesh/estuary/host/visibility"
	"github.com/estuary-mesh/estuary/sdk/redact"
	"github.com/estuary-mesh/estuary/xds"
)

func runHost(args []string) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	path := fs.String("config", "plugins.hcl", "configuration file")
	level := fs.String("log-level", "info", "trace, debug, info, warn or error")
	jsonLogs := fs.Bool("log-json", false, "log JSON lines")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	// Every log line, the plugins' forwarded ones included, loses the
	// plugins' sensitive values and URL credentials on its way out.
	secrets := &redact.Secrets{}
	logger := hclog.New(&hclog.LoggerOptions{Name: "estuary", Level: hclog.LevelFromString(*level), JSONFormat: *jsonLogs, Output: secrets.Writer(os.Stderr)})

	caches := decodeCaches{}
	file, diags := config.Load(*path, catalog.Names())
	caches.attach(file)
	file, diags = validated(file, diags)
	if diags.HasErrors() {
		fmt.Fprint(os.Stderr, config.Format(diags))
		return 1
	}
	if len(diags) > 0 { // warnings, such as an admin server with insecure = true
		logger.Warn("configuration warnings", "warnings", "\n"+config.Format(diags))
	}
	self, err := os.Executable()
	if err != nil {
		logger.Error("cannot find the estuary executable to run bundled plugins", "error", err)
		return 1
	}
	// Catch signals before anything starts, so that a SIGTERM while
	// plugins start still stops them.
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, syscall.SIGHUP, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(signals)

	h, err := newServer(*path, file, self, logger, secrets)
	if err != nil {
		logger.Error("cannot start", "error", err)
		return 1
	}
	h.caches = caches
	if err := h.run(context.Background(), signals, func() {
		adminScheme := "http"
		if file.Admin.TLS != nil {
			adminScheme = "https"
		}
		fmt.Fprintf(os.Stderr, "estuary %s: xDS (ADS) on %s; admin on %s://%s (/readyz, /metrics, /debug/registryz); %d plugin(s)\n",
			Version, h.xdsAddr, adminScheme, h.adminAddr, len(file.Plugins))
	}); err != nil {
		return 1
	}
	return 0
}

// server is `estuary run`: the host's long-lived components, built and
// wired.
//
// A registry change travels one path, in this order, each stage built on
// the one before it and following only it:
//
//	supervisor → replica store → aggregate → network manager → xDS server
//
// The network manager recomputes gateways before it hands a change on
// (widened to Full when they moved), so the xDS server never pushes a
// change against gateways that do not include it yet.
type server struct {
	logger hclog.Logger
	path   string // plugins.hcl, reread on SIGHUP

	sup   *supervisor.Supervisor
	nets  *network.Manager
	xds   *xds.Server
	admin *admin.Server

	xdsAddr, adminAddr net.Addr

	// ready is xDS's readiness gate, closed once by openWhenReady;
	// readyWake nudges it when the registry changes.
	ready, readyWake chan struct{}

	// components are run by run, each until its context ends.
	components []component
	failures   failures

	mu      sync.Mutex
	current *config.File // the config in effect, for /debug/configz

	caches decodeCaches // used by reload only, on the signal goroutine
}

// component is a long-lived part of the host. Run serves until ctx ends,
// then stops gracefully and returns nil; it returns early only if the
// component died.
type component struct {
	name string
	run  func(ctx context.Context) error
}

// newServer builds the host for file and binds its listeners; nothing runs
// until run.
func newServer(path string, file *config.File, self string, logger hclog.Logger, secrets *redact.Secrets) (*server, error) {
	h := &server{logger: logger, path: path, current: file, caches: decodeCaches{}}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	// The chain, in the order a change travels it.
	store := replica.NewStore(reg)
	h.ready, h.readyWake = make(chan struct{}), make(chan struct{}, 1)
	store.Subscribe(func(model.Change) {
		select {
		case h.readyWake <- struct{}{}:
		default:
		}
	})
	h.sup = supervisor.NewSupervisor(supervisor.Options{Self: self, Secrets: secrets}, logger, store, reg)
	agg := aggregate.New(store, reg)                     // follows the store
	h.nets = network.New(agg, logger, network.Options{}) // follows the aggregate
	netCfg, _ := loadNetworks(file)                      // load validated it
	h.nets.Apply(netCfg)
	eds := pipeline.New(agg, h.nets, logger) // what EDS and explain read
	eds.SetLocality(localityPolicy(file.Locality))
	xo := xdsOptions(file.XDS)
	xo.MTLS = meshMTLS(file.Mesh)
	xo.Visibility = visibility.Rules{Default: file.DefaultServiceExportTo}
	xo.LocalityViews = file.Locality.Failover != nil // views keyed by locality only if it can matter
	xo.Ready = h.ready                               // xDS answers no one before /readyz is first true
	h.xds = xds.New(xo,
		agg, eds, // what it reads: the merged services, the endpoint pipeline
		h.nets, // what it follows
		logger, reg)
	h.admin = admin.New(logger, admin.Options{
		Gatherer: reg, Aggregate: agg, Supervisor: h.sup,
		Config: h.effectiveConfig, Failed: h.failures.list,
		Warnings: func() []string { return xdsWarnings(file.XDS) },
		Security: file.Admin, // token, TLS, connection limit
	})
	for _, w := range xdsWarnings(file.XDS) {
		logger.Warn("INSECURE: " + w)
	}
	h.admin.Handle("/debug/networkz", eds.Handler(h.xds))
	h.admin.Handle("/debug/visibilityz", xo.Visibility.Handler(agg, h.xds)) // the rules the xDS server applies
	for path, handler := range h.xds.DebugHandlers() {
		h.admin.Handle(path, handler)
	}

	var err error
	if h.xdsAddr, err = h.xds.Listen(); err != nil {
		return nil, err
	}
	if h.adminAddr, err = h.admin.Listen(file.Admin.Listen); err != nil {
		return nil, err
	}
	h.sup.SetHostAddresses([]string{h.xdsAddr.String(), h.adminAddr.String()})
	h.components = []component{
		{"supervisor", h.sup.Run},
		{"network", h.nets.Run},
		{"xds", h.xds.Run},
		{"admin", h.admin.Run},
	}
	return h, nil
}

// run runs every component under one errgroup, applies the config, calls
// started, and handles signals: SIGHUP reloads, SIGTERM and SIGINT stop
// the host. It returns nil once every component has stopped after a stop
// signal or the end of ctx.
//
// A component that dies takes /readyz down at once, is logged as an error,
// and stops the host: the errgroup cancels the others, which stop
// gracefully, and run returns the error, so estuary exits non-zero. The
// host keeps no state of its own, so a restart by its supervisor (systemd,
// Kubernetes), as istiod gets, is the cure; limping on without, say, its
// xDS listener would only hide the failure.
func (h *server) run(ctx context.Context, signals <-chan os.Signal, started func()) error {
	// run owns the host's lifecycle: a stop signal ends it here.
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	g, ctx := errgroup.WithContext(ctx)
	for _, c := range h.components {
		g.Go(func() error { return h.runComponent(ctx, c) })
	}
	g.Go(func() error {
		h.handleSignals(ctx, signals, stop)
		return nil
	})
	for _, d := range h.sup.Apply(h.config()) {
		h.logger.Warn("plugin config", "problem", d.Error())
	}
	// Only now: before Apply the supervisor has no plugins to wait for.
	g.Go(func() error {
		h.openWhenReady(ctx)
		return nil
	})
	started()
	return g.Wait()
}

// readyPoll is how often openWhenReady checks readiness without a registry
// change, so that a sync timeout passing (which changes nothing in the
// registry) opens the gate.
const readyPoll = 200 * time.Millisecond

// openWhenReady opens xDS's gate the first time the host is ready, by the
// condition /readyz reports: every plugin has sent its snapshot and every
// instance has synced, or their sync timeouts have passed. The gate stays
// open: a plugin restarting later is covered by the replica, which keeps
// its last-known state serving until the new session has synced.
func (h *server) openWhenReady(ctx context.Context) {
	tick := time.NewTicker(readyPoll)
	defer tick.Stop()
	for {
		ready, waiting := h.admin.Ready(time.Now())
		if ready {
			close(h.ready)
			h.logger.Info("ready: xDS answers clients")
			return
		}
		h.logger.Trace("xDS holds clients until ready", "waiting", waiting)
		select {
		case <-ctx.Done():
			return
		case <-h.readyWake:
		case <-tick.C:
		}
	}
}

// runComponent runs c until ctx ends. If c stops before that, it has died:
// readiness goes down naming it, the error is logged, and returning it
// makes the errgroup stop the rest of the host.
func (h *server) runComponent(ctx context.Context, c component) error {
	err := c.run(ctx)
	if ctx.Err() == nil {
		if err == nil {
			err = errors.New("stopped unexpectedly")
		}
		h.failures.add(fmt.Sprintf("%s died: %v", c.name, err))
		h.logger.Error("component died; stopping the host", "component", c.name, "error", err)
		return fmt.Errorf("%s: %w", c.name, err)
	}
	if err != nil {
		h.logger.Error("component did not stop cleanly", "component", c.name, "error", err)
		return fmt.Errorf("%s: %w", c.name, err)
	}
	return nil
}

// handleSignals reloads the config on SIGHUP and stops the host on
// SIGTERM or SIGINT, until ctx ends.
func (h *server) handleSignals(ctx context.Context, signals <-chan os.Signal, stop context.CancelFunc) {
	for {
		select {
		case <-ctx.Done():
			return
		case sig := <-signals:
			if sig != syscall.SIGHUP {
				h.logger.Info("shutting down", "signal", sig.String())
				stop()
				return
			}
			h.reload()
		}
	}
}

// reload applies the config file again; a file with errors changes nothing.
func (h *server) reload() {
	h.logger.Info("SIGHUP: reloading", "config", h.path)
	// A file caught between its truncation and its writing is empty, and
	// valid HCL: applied, it would stop every plugin. No one reloads to
	// an empty file on purpose.
	src, err := os.ReadFile(h.path)
	if err == nil && len(bytes.TrimSpace(src)) == 0 {
		h.logger.Error("reload rejected; keeping the running configuration", "errors", h.path+" is empty (read while being written?)")
		return
	}
	// The bytes checked are the bytes applied: reading the file again
	// could catch another write, and costs a read of it (1 MB for a
	// static plugin's 10,000 endpoints).
	var next *config.File
	var diags hcl.Diagnostics
	if err != nil {
		next, diags = load(h.path) // reports the error as a start does
	} else {
		next, diags = config.Parse(h.path, src, catalog.Names())
		h.caches.attach(next)
		next, diags = validated(next, diags)
	}
	if diags.HasErrors() {
		h.logger.Error("reload rejected; keeping the running configuration", "errors", "\n"+config.Format(diags))
		return
	}
	if len(diags) > 0 {
		h.logger.Warn("configuration warnings", "warnings", "\n"+config.Format(diags))
	}
	file := h.config()
	if next.XDS.Listen != file.XDS.Listen || next.Admin.Listen != file.Admin.Listen {
		h.logger.Warn("listen addresses change only on restart")
	}
	if next.XDS.MaxConnectionAge != file.XDS.MaxConnectionAge || next.XDS.DrainGrace != file.XDS.DrainGrace {
		h.logger.Warn("xds max_connection_age and drain_grace change only on restart")
	}
	if a, b := xdsOptions(next.XDS), xdsOptions(file.XDS); !reflect.DeepEqual([]any{a.TLS, a.Policy, a.Limits}, []any{b.TLS, b.Policy, b.Limits}) {
		h.logger.Warn("xds tls, authorize and limits change only on restart (the TLS files' contents reload by themselves)")
	}
	if meshMTLS(next.Mesh) != meshMTLS(file.Mesh) {
		h.logger.Warn("mesh mtls and trust_domain change only on restart")
	}
	if !slices.Equal(next.DefaultServiceExportTo, file.DefaultServiceExportTo) {
		h.logger.Warn("mesh default_service_export_to changes only on restart")
	}
	if !reflect.DeepEqual(next.Locality, file.Locality) {
		h.logger.Warn("mesh locality_failover and failover change only on restart")
	}
	if d := h.sup.Apply(next); d.HasErrors() {
		h.logger.Error("some plugins kept their previous config", "errors", "\n"+config.Format(d))
	}
	if nc, d := loadNetworks(next); d.HasErrors() {
		h.logger.Error("networks kept their previous config", "errors", "\n"+config.Format(d))
	} else {
		h.nets.Apply(nc)
	}
	h.mu.Lock()
	h.current = next
	h.mu.Unlock()
	h.logger.Info("reload applied", "plugins", len(next.Plugins))
}

func (h *server) config() *config.File {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.current
}

func (h *server) effectiveConfig() any { return effectiveConfig(h.config(), h.sup.Running) }

// failures are the components that died, for /readyz.
type failures struct {
	mu  sync.Mutex
	why []string
}

func (f *failures) add(why string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.why = append(f.why, why)
}

func (f *failures) list() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.why)
}

// localityPolicy is the endpoint pipeline's view of the mesh's locality
// failover.
func localityPolicy(l config.Locality) pipeline.LocalityPolicy {
	lp := pipeline.LocalityPolicy{Enabled: l.Failover != nil && *l.Failover}
	for _, r := range l.Rules {
		lp.Failover = append(lp.Failover, pipeline.FailoverRule{From: r.From, To: r.To})
	}
	return lp
}
