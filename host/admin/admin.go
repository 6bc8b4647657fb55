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
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/estuary-mesh/estuary/host/aggregate"
	"github.com/estuary-mesh/estuary/host/replica"
	"github.com/estuary-mesh/estuary/host/supervisor"
)

// Server is the admin HTTP server.
type Server struct {
	mux    *http.ServeMux
	srv    *http.Server
	logger hclog.Logger
	agg    *aggregate.Registry
	sup    *supervisor.Supervisor
	// DefaultSyncTimeout applies to instances that declare none.
	DefaultSyncTimeout time.Duration
	// Config returns the effective configuration for /debug/configz.
	Config func() any
}

// New builds the admin server over the aggregate and the supervisor.
func New(logger hclog.Logger, gatherer prometheus.Gatherer, agg *aggregate.Registry, sup *supervisor.Supervisor) *Server {
	s := &Server{mux: http.NewServeMux(), logger: logger.Named("admin"), agg: agg, sup: sup, DefaultSyncTimeout: 30 * time.Second}
	s.mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	s.mux.HandleFunc("/readyz", s.readyz)
	s.mux.Handle("/metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	s.mux.HandleFunc("/debug/registryz", s.registryz)
	s.mux.HandleFunc("/debug/syncz", s.syncz)
	s.mux.HandleFunc("/debug/pluginz", s.pluginz)
	s.mux.HandleFunc("/debug/configz", func(w http.ResponseWriter, _ *http.Request) {
		if s.Config == nil {
			writeJSON(w, nil)
			return
		}
		writeJSON(w, s.Config())
	})
	s.mux.HandleFunc("/debug/endpointz", s.endpointz)
	return s
}

// Handle adds a page.
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// Handler returns the server's handler, for tests.
func (s *Server) Handler() http.Handler { return s.mux }

// Listen binds addr and serves until Shutdown. It returns the bound address.
func (s *Server) Listen(addr string) (net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("admin: listen %s: %w", addr, err)
	}
	s.srv = &http.Server{Handler: s.mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.logger.Error("admin server stopped", "error", err)
		}
	}()
	return ln.Addr(), nil
}

// Shutdown stops serving.
func (s *Server) Shutdown(ctx context.Context) error {
	if s.srv == nil {
		return nil
	}
	return s.srv.Shutdown(ctx)
}

// Ready reports readiness and, if not ready, what it waits for: every
// plugin has streamed its snapshot and every instance has synced, or their
// sync timeouts have passed.
func (s *Server) Ready(now time.Time) (bool, []string) {
	ready, waiting := s.sup.Ready(now)
	for _, in := range s.agg.Store().Instances() {
		st := in.Status()
		timeout := st.SyncTimeout
		if timeout == 0 {
			timeout = s.DefaultSyncTimeout
		}
		if !st.Synced && now.Sub(st.FirstSeen) < timeout {
			ready = false
			waiting = append(waiting, "instance "+st.Key.String())
		}
	}
	return ready, waiting
}

func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	ready, waiting := s.Ready(time.Now())
	if !ready {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "not ready: waiting for %v\n", waiting)
		return
	}
	fmt.Fprintln(w, "ready")
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

func (s *Server) syncz(w http.ResponseWriter, _ *http.Request) {
	out := []replica.Status{}
	for _, in := range s.agg.Store().Instances() {
		out = append(out, in.Status())
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
