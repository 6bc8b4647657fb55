// Package admin serves the host's admin HTTP endpoints: /healthz, /readyz,
// Prometheus /metrics and the JSON debug views. Components add their own
// debug pages with Handle.
package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/estuary-mesh/estuary/host/aggregate"
	"github.com/estuary-mesh/estuary/host/replica"
	"github.com/estuary-mesh/estuary/host/supervisor"
)

// Options are what the admin server reads. Config and Failed may be nil.
type Options struct {
	// Gatherer serves /metrics.
	Gatherer prometheus.Gatherer
	// Aggregate and Supervisor are the state readiness and the debug
	// views report.
	Aggregate  *aggregate.Registry
	Supervisor *supervisor.Supervisor
	// Config returns the effective configuration for /debug/configz.
	Config func() any
	// Failed names each host component that has died, with why: any makes
	// /readyz fail, since the host no longer does all its work.
	Failed func() []string
	// DefaultSyncTimeout applies to instances that declare none (30s).
	DefaultSyncTimeout time.Duration
	// Warnings, if set, are shown by /readyz whether ready or not: what
	// the operator chose that is unsafe (plain-text xDS beyond loopback).
	Warnings func() []string
}

// Server is the admin HTTP server.
type Server struct {
	mux    *http.ServeMux
	logger hclog.Logger
	opts   Options
	agg    *aggregate.Registry
	sup    *supervisor.Supervisor
	ln     net.Listener // set by Listen, served by Run
}

// New builds the admin server.
func New(logger hclog.Logger, opts Options) *Server {
	if opts.DefaultSyncTimeout == 0 {
		opts.DefaultSyncTimeout = 30 * time.Second
	}
	s := &Server{mux: http.NewServeMux(), logger: logger.Named("admin"), opts: opts, agg: opts.Aggregate, sup: opts.Supervisor}
	s.mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	s.mux.HandleFunc("/readyz", s.readyz)
	s.mux.Handle("/metrics", promhttp.HandlerFor(opts.Gatherer, promhttp.HandlerOpts{}))
	s.mux.HandleFunc("/debug/registryz", s.registryz)
	s.mux.HandleFunc("/debug/syncz", s.syncz)
	s.mux.HandleFunc("/debug/pluginz", s.pluginz)
	s.mux.HandleFunc("/debug/configz", func(w http.ResponseWriter, _ *http.Request) {
		if opts.Config == nil {
			writeJSON(w, nil)
			return
		}
		writeJSON(w, opts.Config())
	})
	s.mux.HandleFunc("/debug/endpointz", s.endpointz)
	return s
}

// Handle adds a page.
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// Handler returns the server's handler, for tests.
func (s *Server) Handler() http.Handler { return s.mux }

// Listen binds addr and returns the bound address; Run serves on it.
// Binding apart from serving lets the host print the address (port 0
// included) and fail before anything starts.
func (s *Server) Listen(addr string) (net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("admin: listen %s: %w", addr, err)
	}
	s.ln = ln
	return ln.Addr(), nil
}

// shutdownTimeout bounds how long requests in flight may delay a stop.
const shutdownTimeout = 2 * time.Second

// Run serves on the address bound by Listen until ctx ends; then it lets
// requests in flight finish for up to two seconds and returns nil. If
// serving fails, it returns the error.
func (s *Server) Run(ctx context.Context) error {
	if s.ln == nil {
		return errors.New("admin: Run before Listen")
	}
	srv := &http.Server{Handler: s.mux, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(s.ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("admin: serve %s: %w", s.ln.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		s.logger.Warn("requests still in flight at shutdown; closing them", "error", err)
		_ = srv.Close()
	}
	<-served
	return nil
}

// Ready reports readiness and, if not ready, what it waits for: no host
// component has died, and every plugin has declared its instance set and
// every instance has synced, or their sync timeouts have passed. A plugin
// waited for is named with why: since when, until when, and what its
// unhealthy instances say (connection refused, 403, ...).
func (s *Server) Ready(now time.Time) (bool, []string) {
	ready, plugins := s.sup.Ready(now)
	ready = ready && len(s.failed()) == 0
	waiting := make([]string, 0, len(plugins))
	for _, label := range plugins {
		waiting = append(waiting, "plugin "+s.pluginSync(label, now).Reason)
	}
	for _, in := range s.agg.Store().Instances() {
		st := in.Status()
		timeout := st.SyncTimeout
		if timeout == 0 {
			timeout = s.opts.DefaultSyncTimeout
		}
		if !st.Synced && now.Sub(st.FirstSeen) < timeout {
			ready = false
			waiting = append(waiting, "instance "+st.Key.String())
		}
	}
	return ready, waiting
}

func (s *Server) failed() []string {
	if s.opts.Failed == nil {
		return nil
	}
	return s.opts.Failed()
}

func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	ready, waiting := s.Ready(time.Now())
	var warnings []string
	if s.opts.Warnings != nil {
		warnings = s.opts.Warnings()
	}
	if ready {
		fmt.Fprintln(w, "ready")
		for _, x := range warnings {
			fmt.Fprintf(w, "warning: %s\n", x)
		}
		return
	}
	w.WriteHeader(http.StatusServiceUnavailable)
	for _, x := range warnings {
		fmt.Fprintf(w, "warning: %s\n", x)
	}
	for _, f := range s.failed() {
		fmt.Fprintf(w, "not ready: %s\n", f)
	}
	if len(waiting) > 0 {
		fmt.Fprintf(w, "not ready: waiting for %v\n", waiting)
	}
}

// InstanceView is one instance in /debug/registryz.
type InstanceView struct {
	replica.Status
	Services []ServiceView `json:"services"`
}

// ServiceView is one service of an instance in /debug/registryz.
type ServiceView struct {
	*replica.Service
	Endpoints int `json:"endpoints"`
}

func (s *Server) registryz(w http.ResponseWriter, r *http.Request) {
	out := struct {
		Instances []InstanceView       `json:"instances"`
		Conflicts []aggregate.Conflict `json:"conflicts"`
		Gateways  any                  `json:"gateways"`
		Merged    []*aggregate.Service `json:"merged,omitempty"`
	}{Instances: []InstanceView{}, Conflicts: []aggregate.Conflict{}}
	for _, in := range s.agg.Store().Instances() {
		v := InstanceView{Status: in.Status(), Services: []ServiceView{}}
		for _, svc := range in.Services() {
			v.Services = append(v.Services, ServiceView{Service: svc, Endpoints: in.Endpoints(svc.Hostname).Len()})
		}
		out.Instances = append(out.Instances, v)
	}
	merged := s.agg.Services()
	for _, svc := range merged {
		out.Conflicts = append(out.Conflicts, svc.Conflicts...)
	}
	if b, _ := strconv.ParseBool(r.URL.Query().Get("merged")); b {
		out.Merged = merged
	}
	out.Gateways = s.agg.NetworkGateways()
	writeJSON(w, out)
}

// PluginSync is one plugin in /debug/syncz: whether its instance set is
// complete, and why not.
type PluginSync struct {
	replica.InstanceSetStatus
	// Connected is false until the plugin has opened its first stream.
	Connected bool `json:"connected"`
	// Unhealthy lists the plugin's instances that cannot reach their
	// source, with the reason they give.
	Unhealthy []string `json:"unhealthy,omitempty"`
	// Reason says in one line what the host waits for, or "complete".
	Reason string `json:"reason"`
}

// pluginSync describes plugin's instance set.
func (s *Server) pluginSync(label string, now time.Time) PluginSync {
	set, ok := s.agg.Store().InstanceSet(label)
	ps := PluginSync{InstanceSetStatus: set, Connected: ok}
	if h := set.Health; h != nil && !h.Healthy {
		ps.Unhealthy = append(ps.Unhealthy, "plugin: "+h.Message)
	}
	for _, in := range s.agg.Store().Instances() {
		st := in.Status()
		if st.Key.Plugin == label && st.Health != nil && !st.Health.Healthy {
			ps.Unhealthy = append(ps.Unhealthy, fmt.Sprintf("%s/%s: %s", st.Key.Provider, st.Key.Cluster, st.Health.Message))
		}
	}
	switch {
	case set.Complete:
		ps.Reason = fmt.Sprintf("%s: instance set complete (by %s)", label, set.CompletedBy)
	case !ok:
		ps.Reason = fmt.Sprintf("%s: not connected yet", label)
	default:
		ps.Reason = fmt.Sprintf("%s: instance set not complete, waiting %s", label, now.Sub(set.Since).Round(time.Millisecond))
		if !set.TimeoutAt.IsZero() {
			ps.Reason += fmt.Sprintf(" of the sync timeout %s", set.TimeoutAt.Sub(set.Since).Round(time.Millisecond))
		}
	}
	if len(ps.Unhealthy) > 0 {
		ps.Reason += "; unhealthy: " + strings.Join(ps.Unhealthy, "; ")
	}
	return ps
}

func (s *Server) syncz(w http.ResponseWriter, _ *http.Request) {
	now := time.Now()
	out := struct {
		Plugins   []PluginSync     `json:"plugins"`
		Instances []replica.Status `json:"instances"`
	}{Plugins: []PluginSync{}, Instances: []replica.Status{}}
	for _, p := range s.sup.Statuses() {
		out.Plugins = append(out.Plugins, s.pluginSync(p.Label, now))
	}
	for _, in := range s.agg.Store().Instances() {
		out.Instances = append(out.Instances, in.Status())
	}
	writeJSON(w, out)
}

func (s *Server) pluginz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, s.sup.Statuses())
}

// EndpointView is one endpoint in /debug/endpointz.
type EndpointView struct {
	replica.Endpoint
	Instance replica.InstanceKey `json:"instance"`
}

func (s *Server) endpointz(w http.ResponseWriter, r *http.Request) {
	host := r.URL.Query().Get("host")
	if host == "" {
		http.Error(w, "missing ?host=HOSTNAME", http.StatusBadRequest)
		return
	}
	svc := s.agg.GetService(host)
	if svc == nil {
		http.Error(w, fmt.Sprintf("no service %q", host), http.StatusNotFound)
		return
	}
	type perInstance struct {
		Instance  replica.InstanceKey `json:"instance"`
		Endpoints []replica.Endpoint  `json:"endpoints"`
	}
	out := struct {
		Service    *aggregate.Service `json:"service"`
		ByInstance []perInstance      `json:"by_instance"`
		Merged     []EndpointView     `json:"merged"`
	}{Service: svc, ByInstance: []perInstance{}, Merged: []EndpointView{}}
	for _, src := range s.agg.EndpointSources(host) {
		out.ByInstance = append(out.ByInstance, perInstance{Instance: src.Instance.Key, Endpoints: src.Set.Endpoints})
		for _, e := range src.Set.Endpoints {
			out.Merged = append(out.Merged, EndpointView{Endpoint: e, Instance: src.Instance.Key})
		}
	}
	writeJSON(w, out)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
