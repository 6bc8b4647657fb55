// Package admin serves the host's admin HTTP endpoints: /healthz, /readyz,
// Prometheus /metrics and the JSON debug views. Components add their own
// debug pages with Handle.
package admin

import (
	"cmp"
	"context"
	"crypto/subtle"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/net/netutil"

	"github.com/estuary-mesh/estuary/host/aggregate"
	"github.com/estuary-mesh/estuary/host/config"
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
	// Security is the admin block: who may ask (token_file, tls with
	// client_ca_file) and how many connections are served at once.
	// Listen reads its files.
	Security config.Admin
	// ReadTimeout, WriteTimeout and IdleTimeout bound a request's reading,
	// its response's writing, and an idle keep-alive connection; zero
	// takes the defaults (10s, 30s, 60s).
	ReadTimeout, WriteTimeout, IdleTimeout time.Duration
}

// Timeouts of the admin server: every page is built from memory, so a
// request that takes longer to arrive, or a response to leave, is a
// client holding a connection open.
const (
	DefaultReadTimeout  = 10 * time.Second
	DefaultWriteTimeout = 30 * time.Second
	DefaultIdleTimeout  = 60 * time.Second
)

// Server is the admin HTTP server.
type Server struct {
	mux    *http.ServeMux
	logger hclog.Logger
	opts   Options
	agg    *aggregate.Registry
	sup    *supervisor.Supervisor
	ln     net.Listener // set by Listen, served by Run
	// token is the bearer token read from token_file by Listen; empty
	// when the admin block sets none.
	token string
}

// New builds the admin server.
func New(logger hclog.Logger, opts Options) *Server {
	if opts.DefaultSyncTimeout == 0 {
		opts.DefaultSyncTimeout = 30 * time.Second
	}
	opts.ReadTimeout = cmp.Or(opts.ReadTimeout, DefaultReadTimeout)
	opts.WriteTimeout = cmp.Or(opts.WriteTimeout, DefaultWriteTimeout)
	opts.IdleTimeout = cmp.Or(opts.IdleTimeout, DefaultIdleTimeout)
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
	// Go's profiles, behind the same authentication as every other page:
	// where a fleet's CPU and memory go is found on the running host, not
	// on a rebuilt one. A CPU profile longer than WriteTimeout is cut off.
	s.mux.HandleFunc("/debug/pprof/", pprof.Index)
	s.mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	s.mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	s.mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return s
}

// Handle adds a page.
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// Handler returns the server's handler, authentication included, for
// tests.
func (s *Server) Handler() http.Handler { return s.authenticate(s.mux) }

// Listen binds addr and returns the bound address; Run serves on it.
// Binding apart from serving lets the host print the address (port 0
// included) and fail before anything starts. It reads the token and TLS
// files of Options.Security, and serves at most its MaxConnections
// connections at once: the next wait in the kernel's backlog.
func (s *Server) Listen(addr string) (net.Addr, error) {
	sec := s.opts.Security
	if sec.TokenFile != "" {
		tok, err := sec.Token()
		if err != nil {
			return nil, fmt.Errorf("admin: token_file: %w", err)
		}
		s.token = tok
	}
	var tlsConf *tls.Config
	if sec.TLS != nil {
		cert, err := tls.LoadX509KeyPair(sec.TLS.CertFile, sec.TLS.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("admin: tls: %w", err)
		}
		tlsConf = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		if sec.TLS.ClientCAFile != "" {
			pool, err := sec.TLS.ClientCAs()
			if err != nil {
				return nil, fmt.Errorf("admin: tls: %w", err)
			}
			// A certificate is verified if given, but not required at
			// the handshake: probes reach /healthz and /readyz without
			// one, and authenticate refuses everything else.
			tlsConf.ClientCAs, tlsConf.ClientAuth = pool, tls.VerifyClientCertIfGiven
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("admin: listen %s: %w", addr, err)
	}
	bound := ln.Addr()
	if sec.MaxConnections > 0 {
		ln = netutil.LimitListener(ln, sec.MaxConnections)
	}
	if tlsConf != nil {
		ln = tls.NewListener(ln, tlsConf)
	}
	s.ln = ln
	return bound, nil
}

// openPaths answer without authentication, for liveness and readiness
// probes; /readyz then says only whether the host is ready, not why.
var openPaths = []string{"/healthz", "/readyz"}

// authenticate refuses a request that presents neither the bearer token
// nor a verified client certificate, when the admin block asks for
// either, except on openPaths.
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.authenticated(r) || slices.Contains(openPaths, r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="estuary admin"`)
		http.Error(w, "unauthenticated: present the admin token (Authorization: Bearer ...) or a client certificate", http.StatusUnauthorized)
	})
}

// authenticated reports whether r presents the token or a verified client
// certificate, or no authentication is configured.
func (s *Server) authenticated(r *http.Request) bool {
	sec := s.opts.Security
	if !sec.Authenticates() {
		return true
	}
	if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
		return true
	}
	if s.token == "" {
		return false
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), []byte(s.token)) == 1
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
	srv := &http.Server{Handler: s.authenticate(s.mux), ErrorLog: s.logger.StandardLogger(&hclog.StandardLoggerOptions{ForceLevel: hclog.Debug}),
		ReadHeaderTimeout: s.opts.ReadTimeout, ReadTimeout: s.opts.ReadTimeout,
		WriteTimeout: s.opts.WriteTimeout, IdleTimeout: s.opts.IdleTimeout}
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

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
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
	if !s.authenticated(r) {
		// Why is for operators: plugin health messages name servers.
		fmt.Fprintln(w, "not ready")
		return
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
