package xds

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	sotwv3 "github.com/envoyproxy/go-control-plane/pkg/server/sotw/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/estuary-mesh/estuary/host/aggregate"
	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/host/pipeline"
)

// Options configure the server.
type Options struct {
	// Listen is the gRPC address, 127.0.0.1:15010 by default.
	Listen string
	// DebounceAfter is the quiet period after a change before pushing;
	// DebounceMax bounds how long changes may keep postponing a push. Zero
	// DebounceAfter pushes every change at once.
	DebounceAfter, DebounceMax time.Duration
	// MaxConnectionAge is how long a client connection may live before
	// the server sends it a GOAWAY, so that clients spread over replicas
	// after a rollout instead of staying on the first one up. grpc-go
	// adds a random ±10% to it per connection, so a fleet that connected
	// at once does not reconnect at once. Zero: connections live forever.
	MaxConnectionAge time.Duration
	// DrainGrace is how long streams keep being served after a GOAWAY,
	// whether from MaxConnectionAge or from the end of Run's context,
	// before their connection is closed. ADS streams never end by
	// themselves, so this is how long a client has to take what is in
	// flight and move to another server. Zero closes them at once.
	DrainGrace time.Duration
	// Ready, if not nil, holds every client until it is closed: streams
	// are accepted and their requests kept, but nothing is answered, so
	// no client receives a config the host has not finished loading (a
	// registry missing from it would read as "deleted"). Once Ready is
	// closed every held request is answered with the current state. The
	// host closes it when /readyz first turns true; it never reopens.
	Ready <-chan struct{}
}

// Server is the ADS server.
type Server struct {
	opts    Options
	logger  hclog.Logger
	cache   *Cache
	gen     *Generator
	metrics *metrics
	ln      net.Listener // set by Listen, served by Run

	pendingMu sync.Mutex
	pending   model.Change
	firstAt   time.Time // first change of the pending batch
	lastAt    time.Time // last change of the pending batch
	wake      chan struct{}

	// fullLogged is when a full response channel was last logged, so a
	// stuck stream cannot flood the log; guarded by the cache's lock.
	fullLogged time.Time
	fullQuiet  int // full channels not logged since

	nodesMu sync.Mutex
	streams map[int64]*streamInfo // by streamKey

	// onPush, if set, observes every push, for tests.
	onPush func(PushStats, model.Change)
}

type metrics struct {
	pushes      *prometheus.CounterVec
	pushTime    prometheus.Histogram
	convergence prometheus.Histogram
	clients     prometheus.Gauge
	nacks       *prometheus.CounterVec
	full        *prometheus.CounterVec
	ready       prometheus.Gauge
}

// streamInfo is one connected client, for /debug/adsz.
type streamInfo struct {
	ID     int64                `json:"stream"`
	Delta  bool                 `json:"delta"`
	Node   string               `json:"node"`
	Kind   string               `json:"kind"`
	View   string               `json:"view"`
	Since  time.Time            `json:"connected_at"`
	Types  map[string]*typeInfo `json:"types"`
	view   model.View
	parsed bool
}

// typeInfo is the ACK/NACK state of one type on one stream.
type typeInfo struct {
	SentVersion  string    `json:"sent_version,omitempty"`
	SentNonce    string    `json:"sent_nonce,omitempty"`
	SentAt       time.Time `json:"sent_at,omitzero"`
	AckedVersion string    `json:"acked_version,omitempty"`
	// State is ACK or NACK: how the client answered the last response.
	State string `json:"state,omitempty"`
	// NACK is the error of the most recent rejection, kept after later ACKs.
	NACK        string `json:"last_nack,omitempty"`
	NACKedNonce string `json:"last_nacked_nonce,omitempty"`
	NACKs       int    `json:"nacks"`
	Resources   int    `json:"resources_last_sent"`
}

// Upstream is the stage a server takes its changes from. In the host it is
// the network manager, which sees every registry change before the server
// does; without networks (tests) it is the aggregate itself.
type Upstream interface {
	Subscribe(func(model.Change))
}

// New builds a server over the aggregate registry, whose EDS clusters come
// from the endpoint pipeline eds (nil: one network). The server follows
// upstream and nothing else: following the aggregate as well would let a
// push race the network manager's recomputation of the gateways it depends
// on.
func New(opts Options, agg *aggregate.Registry, eds *pipeline.Pipeline, upstream Upstream, logger hclog.Logger, reg prometheus.Registerer) *Server {
	gen := NewGenerator(agg, eds)
	s := &Server{
		opts:    opts,
		logger:  logger.Named("xds"),
		gen:     gen,
		cache:   NewCache(gen),
		wake:    make(chan struct{}, 1),
		streams: map[int64]*streamInfo{},
		metrics: &metrics{
			pushes: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "estuary_xds_pushes_total", Help: "xDS responses sent by pushes, by type.",
			}, []string{"type"}),
			pushTime: prometheus.NewHistogram(prometheus.HistogramOpts{
				Name: "estuary_xds_push_seconds", Help: "Time to rebuild resources and answer watches for one push.",
				Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
			}),
			convergence: prometheus.NewHistogram(prometheus.HistogramOpts{
				Name: "estuary_xds_convergence_seconds", Help: "Time from the first registry change of a push until its responses were issued, debounce included.",
				Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
			}),
			clients: prometheus.NewGauge(prometheus.GaugeOpts{
				Name: "estuary_xds_clients", Help: "Connected xDS streams.",
			}),
			nacks: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "estuary_xds_nacks_total", Help: "Responses rejected by clients, by type.",
			}, []string{"type"}),
			full: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "estuary_xds_response_retries_total",
				Help: "Responses a stream had no room for, by type: each is retried, none is dropped. Should stay 0.",
			}, []string{"type"}),
			ready: prometheus.NewGauge(prometheus.GaugeOpts{
				Name: "estuary_xds_ready", Help: "1 once clients are answered; 0 while they are held until the host is ready.",
			}),
		},
	}
	s.cache.onFull = s.responseFull
	if opts.Ready != nil {
		s.cache.Hold()
	} else {
		s.metrics.ready.Set(1)
	}
	if reg != nil {
		reg.MustRegister(s.metrics.pushes, s.metrics.pushTime, s.metrics.convergence, s.metrics.clients, s.metrics.nacks, s.metrics.full, s.metrics.ready)
	}
	upstream.Subscribe(s.notify)
	return s
}

// Cache returns the server's resource cache.
func (s *Server) Cache() *Cache { return s.cache }

// Listen binds the gRPC address and returns it; Run serves on it. Binding
// apart from serving lets the host print the address (port 0 included)
// before anything runs, and fail before anything starts.
func (s *Server) Listen() (net.Addr, error) {
	ln, err := net.Listen("tcp", s.opts.Listen)
	if err != nil {
		return nil, fmt.Errorf("xds: listen %s: %w", s.opts.Listen, err)
	}
	s.ln = ln
	return ln.Addr(), nil
}

// Run serves ADS on the address bound by Listen and pushes debounced
// changes until ctx ends; then it drains (see drain) and returns nil. If
// gRPC stops serving on its own (the listener failed), Run stops pushing
// and returns the error: clients can no longer reach this server, so the
// host must not look ready.
func (s *Server) Run(ctx context.Context) error {
	if s.ln == nil {
		return errors.New("xds: Run before Listen")
	}
	// Streams and pushes outlive ctx by the drain: they stop only once the
	// connections are closed, so a client is served until it leaves.
	serving, stopServing := context.WithCancel(context.WithoutCancel(ctx))
	defer stopServing()
	kp := keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second, MaxConnectionAge: s.opts.MaxConnectionAge}
	if s.opts.MaxConnectionAge > 0 {
		// grpc-go reads a zero grace as "forever"; a zero DrainGrace means
		// close at once.
		kp.MaxConnectionAgeGrace = max(s.opts.DrainGrace, time.Nanosecond)
	}
	srv := grpc.NewServer(
		grpc.MaxConcurrentStreams(1<<20),
		grpc.KeepaliveParams(kp),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	)
	// Ordered ADS: responses leave in the order the cache issues them
	// (clusters, endpoints, listeners, routes), so a client never gets a
	// listener before the cluster it names.
	xs := serverv3.NewServer(serving, s.cache, s.callbacks(), sotwv3.WithOrderedADS())
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(srv, xs)

	debounced := make(chan struct{})
	go func() {
		defer close(debounced)
		s.debounce(serving)
	}()
	released := make(chan struct{})
	go func() {
		defer close(released)
		s.awaitReady(serving)
	}()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(s.ln) }()

	var err error
	select {
	case <-ctx.Done():
		s.drain(srv)
		<-served
	case err = <-served:
		// Serve returns nil only after Stop, which nothing else calls.
		if err == nil {
			err = errors.New("stopped serving")
		}
		err = fmt.Errorf("xds: serve %s: %w", s.ln.Addr(), err)
		srv.Stop()
	}
	stopServing()
	<-debounced
	<-released
	return err
}

// awaitReady waits for Options.Ready, then answers the held watches,
// unless ctx ends first. Pushes go on while held: they keep the cache
// current and answer no one.
func (s *Server) awaitReady(ctx context.Context) {
	if s.opts.Ready == nil {
		return
	}
	select {
	case <-ctx.Done():
		return
	case <-s.opts.Ready:
	}
	// The change that made the host ready may still be debouncing: push
	// what is pending first, so the held clients get all of it.
	s.pendingMu.Lock()
	change, first := s.pending, s.firstAt
	s.pending = model.Change{}
	s.pendingMu.Unlock()
	if !change.Empty() {
		s.push(change, first)
	}
	n := s.cache.Release()
	s.metrics.ready.Set(1)
	s.logger.Info("host ready: answered the clients that waited", "responses", n)
}

// drain stops srv as a replica leaving a fleet should: a GOAWAY on every
// connection at once (the listener closes, so clients reconnect to
// another replica, not this one), pushes still reaching the streams that
// stay for up to DrainGrace, then the connections closed. A client's
// stream then ends with Unavailable, which xDS clients (Envoy, gRPC)
// answer by reconnecting with backoff; since the connection already had
// its GOAWAY, they reconnect elsewhere, not in a storm at this replica.
func (s *Server) drain(srv *grpc.Server) {
	stopped := make(chan struct{})
	go func() {
		srv.GracefulStop() // GOAWAY; returns once every connection is gone
		close(stopped)
	}()
	grace := time.NewTimer(s.opts.DrainGrace)
	defer grace.Stop()
	select {
	case <-stopped:
		return
	case <-grace.C:
	}
	s.logger.Info("drain grace over; closing the remaining xDS streams", "streams", len(s.Clients()), "grace", s.opts.DrainGrace)
	srv.Stop()
	<-stopped
}

// notify records a change from upstream for the next push. It runs on the
// registry's update path and never blocks.
func (s *Server) notify(c model.Change) {
	s.pendingMu.Lock()
	now := time.Now()
	if s.pending.Empty() {
		s.firstAt = now
	}
	s.lastAt = now
	s.pending.Merge(c)
	s.pendingMu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// debounce pushes pending changes once they have been quiet for
// DebounceAfter, or once DebounceMax has passed since the first of them.
func (s *Server) debounce(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		case <-timer.C:
		}
		s.pendingMu.Lock()
		if s.pending.Empty() {
			s.pendingMu.Unlock()
			continue
		}
		now := time.Now()
		quiet := now.Sub(s.lastAt)
		waited := now.Sub(s.firstAt)
		if quiet < s.opts.DebounceAfter && waited < s.opts.DebounceMax {
			wait := min(s.opts.DebounceAfter-quiet, s.opts.DebounceMax-waited)
			s.pendingMu.Unlock()
			timer.Reset(wait)
			continue
		}
		change, first := s.pending, s.firstAt
		s.pending = model.Change{}
		s.pendingMu.Unlock()
		s.push(change, first)
	}
}

// push sends a change to every affected watch.
func (s *Server) push(change model.Change, first time.Time) {
	start := time.Now()
	st := s.cache.Push(change)
	end := time.Now()
	s.metrics.pushTime.Observe(end.Sub(start).Seconds())
	s.metrics.convergence.Observe(end.Sub(first).Seconds())
	for t, n := range st.Responses {
		if n > 0 {
			s.metrics.pushes.WithLabelValues(typeNames[t]).Add(float64(n))
		}
	}
	s.logger.Debug("push", "full", change.Full, "services", len(change.Services), "responses", st.Total(), "took", end.Sub(start))
	if s.onPush != nil {
		s.onPush(st, change)
	}
}

// responseFull counts a response that found its stream's channel full, and
// logs it at most every ten seconds. It runs under the cache's lock.
func (s *Server) responseFull(v model.View, t typ, retry time.Duration) {
	s.metrics.full.WithLabelValues(typeNames[t]).Inc()
	now := time.Now()
	if now.Sub(s.fullLogged) < 10*time.Second {
		s.fullQuiet++
		return
	}
	s.logger.Warn("xDS stream had no room for a response; retrying", "type", typeNames[t], "view", v.String(), "retry_in", retry, "unlogged_since_last", s.fullQuiet)
	s.fullLogged, s.fullQuiet = now, 0
}

// PushNow applies a change without debouncing, for tests and benchmarks.
func (s *Server) PushNow(change model.Change) PushStats { return s.cache.Push(change) }

var typeNames = [numTypes]string{"cds", "eds", "lds", "rds"}

func typeName(url string) string {
	if t, ok := typeOf(url); ok {
		return typeNames[t]
	}
	return url
}

func (s *Server) callbacks() serverv3.Callbacks {
	open := func(delta bool) func(context.Context, int64, string) error {
		return func(_ context.Context, id int64, _ string) error {
			s.nodesMu.Lock()
			s.streams[streamKey(delta, id)] = &streamInfo{ID: id, Delta: delta, Since: time.Now(), Types: map[string]*typeInfo{}}
			s.nodesMu.Unlock()
			s.metrics.clients.Inc()
			return nil
		}
	}
	closed := func(delta bool) func(int64, *corev3.Node) {
		return func(id int64, _ *corev3.Node) {
			s.nodesMu.Lock()
			delete(s.streams, streamKey(delta, id))
			s.nodesMu.Unlock()
			s.metrics.clients.Dec()
		}
	}
	return serverv3.CallbackFuncs{
		StreamOpenFunc:        open(false),
		DeltaStreamOpenFunc:   open(true),
		StreamClosedFunc:      closed(false),
		DeltaStreamClosedFunc: closed(true),
		StreamRequestFunc: func(id int64, req *discoveryv3.DiscoveryRequest) error {
			s.request(streamKey(false, id), req.GetNode(), req.GetTypeUrl(), req.GetVersionInfo(), req.GetResponseNonce(), req.GetErrorDetail().GetMessage(), req.GetErrorDetail() != nil)
			return nil
		},
		StreamDeltaRequestFunc: func(id int64, req *discoveryv3.DeltaDiscoveryRequest) error {
			s.request(streamKey(true, id), req.GetNode(), req.GetTypeUrl(), "", req.GetResponseNonce(), req.GetErrorDetail().GetMessage(), req.GetErrorDetail() != nil)
			return nil
		},
		StreamResponseFunc: func(_ context.Context, id int64, req *discoveryv3.DiscoveryRequest, resp *discoveryv3.DiscoveryResponse) {
			s.sent(streamKey(false, id), req.GetTypeUrl(), resp.GetVersionInfo(), resp.GetNonce(), len(resp.GetResources()))
		},
		StreamDeltaResponseFunc: func(id int64, req *discoveryv3.DeltaDiscoveryRequest, resp *discoveryv3.DeltaDiscoveryResponse) {
			s.sent(streamKey(true, id), req.GetTypeUrl(), resp.GetSystemVersionInfo(), resp.GetNonce(), len(resp.GetResources()))
		},
	}
}

// streamKey keys a stream in Server.streams. go-control-plane numbers
// SotW and Delta streams with separate counters, both from 1, so the ID
// alone would let a Delta stream overwrite (and its close delete) a SotW
// stream's entry: Delta streams are kept under the negated ID.
func streamKey(delta bool, id int64) int64 {
	if delta {
		return -id
	}
	return id
}

// request records a client request: the node's identity on its first
// request, and whether it ACKs or NACKs the last response.
func (s *Server) request(id int64, node *corev3.Node, typeURL, version, nonce, nackMsg string, nack bool) {
	s.nodesMu.Lock()
	defer s.nodesMu.Unlock()
	si := s.streams[id]
	if si == nil {
		return
	}
	if !si.parsed && node != nil {
		n := ParseNode(node)
		si.Node, si.Kind, si.view, si.View, si.parsed = n.ID, n.Kind.String(), n.View(), n.View().String(), true
	}
	ti := si.Types[typeName(typeURL)]
	if ti == nil {
		ti = &typeInfo{}
		si.Types[typeName(typeURL)] = ti
	}
	switch {
	case nack:
		ti.State, ti.NACK, ti.NACKedNonce = "NACK", nackMsg, nonce
		ti.NACKs++
		s.metrics.nacks.WithLabelValues(typeName(typeURL)).Inc()
		s.logger.Warn("client rejected a response", "node", si.Node, "type", typeName(typeURL), "nonce", nonce, "error", nackMsg)
	case nonce != "":
		if version == "" {
			version = ti.SentVersion
		}
		ti.AckedVersion, ti.State = version, "ACK"
	}
}

func (s *Server) sent(id int64, typeURL, version, nonce string, n int) {
	s.nodesMu.Lock()
	defer s.nodesMu.Unlock()
	si := s.streams[id]
	if si == nil {
		return
	}
	ti := si.Types[typeName(typeURL)]
	if ti == nil {
		ti = &typeInfo{}
		si.Types[typeName(typeURL)] = ti
	}
	ti.SentVersion, ti.SentNonce, ti.SentAt, ti.Resources = version, nonce, time.Now(), n
}

// Clients lists connected streams, for /debug/adsz.
func (s *Server) Clients() []streamInfo {
	s.nodesMu.Lock()
	defer s.nodesMu.Unlock()
	out := make([]streamInfo, 0, len(s.streams))
	for _, id := range slices.Sorted(maps.Keys(s.streams)) {
		si := *s.streams[id]
		si.Types = map[string]*typeInfo{}
		for k, v := range s.streams[id].Types {
			cp := *v
			si.Types[k] = &cp
		}
		out = append(out, si)
	}
	return out
}

// NodeView returns the view of a connected node.
func (s *Server) NodeView(nodeID string) (model.View, bool) {
	s.nodesMu.Lock()
	defer s.nodesMu.Unlock()
	for _, si := range s.streams {
		if si.parsed && si.Node == nodeID {
			return si.view, true
		}
	}
	return model.View{}, false
}
