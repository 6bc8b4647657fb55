package xds

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"runtime"
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
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/estuary-mesh/estuary/host/aggregate"
	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/host/pipeline"
	"github.com/estuary-mesh/estuary/host/visibility"
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
	// TLS, if not nil, serves xDS over TLS from these files, reloaded
	// when they change. With a client CA every client must present a
	// certificate with a SPIFFE ID, and its node is checked against it.
	TLS *TLSFiles
	// Policy is what identities allow nodes to claim (see Policy); nil
	// applies only the namespace rule. It needs TLS with a client CA.
	Policy *Policy
	// Limits bound per-client state.
	Limits Limits
	// MTLS is the mesh's workload mTLS, which the clusters carry.
	MTLS MTLS
	// Visibility decides which client namespaces see which services
	// (exportTo); its zero value exports services without an exportTo
	// to every namespace.
	Visibility visibility.Rules
	// LocalityViews puts a node's locality in its view, so that the
	// endpoint pipeline can order priorities relative to it. Only locality
	// failover needs it: without, views ignore localities and are no
	// more numerous than before. East-west gateways never get one.
	LocalityViews bool
}

// Server is the ADS server.
type Server struct {
	opts        Options
	logger      hclog.Logger
	cache       *Cache
	gen         *Generator
	metrics     *metrics
	ln          net.Listener // set by Listen, served by Run
	tls         *tlsReloader // set by Listen when serving TLS
	streamLimit *streamLimiter
	// warn rate-limits warnings about one client.
	warn *warnLimiter

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

	// onPush, if set, observes every push, for tests; beforePush is
	// called with each change the debounce loop has taken, before it
	// reaches the cache.
	onPush     func(PushStats, model.Change)
	beforePush func()
}

type metrics struct {
	pushes      *prometheus.CounterVec
	pushTime    prometheus.Histogram
	pushCPU     prometheus.Histogram
	taken       prometheus.Histogram
	convergence prometheus.Histogram
	clients     prometheus.Gauge
	nacks       *prometheus.CounterVec
	full        *prometheus.CounterVec
	ready       prometheus.Gauge
	denied      *prometheus.CounterVec
	limited     *prometheus.CounterVec
	handshakes  prometheus.Counter
	tlsReloads  *prometheus.CounterVec
	views       prometheus.GaugeFunc
}

// streamInfo is one connected client, for /debug/adsz.
type streamInfo struct {
	ID    int64  `json:"stream"`
	Delta bool   `json:"delta"`
	Node  string `json:"node"`
	Kind  string `json:"kind"`
	View  string `json:"view"`
	// Namespace decides which services the node sees (exportTo).
	Namespace string               `json:"namespace"`
	Since     time.Time            `json:"connected_at"`
	Types     map[string]*typeInfo `json:"types"`
	view      model.View
	parsed    bool
	// identity is the client's SPIFFE ID, when its certificate has one.
	identity    model.Identity
	hasIdentity bool
	// own is what only the stream's goroutine reads and writes.
	own *streamOwn
}

// streamOwn is the part of a stream's state that only its own goroutine
// (go-control-plane's request loop) touches, so it needs no lock.
type streamOwn struct {
	// node is the node the view was taken from; unknown holds the type
	// URLs asked for that Estuary does not serve.
	node    *corev3.Node
	unknown map[string]struct{}
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
	gen.mtls = opts.MTLS
	gen.vis = opts.Visibility
	opts.Limits = opts.Limits.withDefaults()
	s := &Server{
		opts:    opts,
		logger:  logger.Named("xds"),
		gen:     gen,
		cache:   NewCache(gen),
		wake:    make(chan struct{}, 1),
		streams: map[int64]*streamInfo{},
		warn:    newWarnLimiter(10 * time.Second),
		metrics: &metrics{
			pushes: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "estuary_xds_pushes_total", Help: "xDS responses sent by pushes, by type.",
			}, []string{"type"}),
			pushTime: prometheus.NewHistogram(prometheus.HistogramOpts{
				Name: "estuary_xds_push_seconds", Help: "Time to rebuild resources and answer watches for one push.",
				Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
			}),
			pushCPU: prometheus.NewHistogram(prometheus.HistogramOpts{
				Name:    "estuary_xds_push_cpu_seconds",
				Help:    "CPU time of one push (rebuilding resources and answering watches), without the time it waited for a CPU; Linux only.",
				Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
			}),
			taken: prometheus.NewHistogram(prometheus.HistogramOpts{
				Name:    "estuary_xds_response_wait_seconds",
				Help:    "Time from a push handing a response to a stream until the stream took it to send: the wait for the stream's goroutine to run.",
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
			denied: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "estuary_xds_denied_total",
				Help: "Streams refused with PermissionDenied because the node claimed what its identity does not allow, by claim (identity, namespace, router, trust_domain, cluster, network, node).",
			}, []string{"claim"}),
			limited: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "estuary_xds_limit_refusals_total",
				Help: "Connections, streams and requests refused by a limit, by limit (connections, streams_per_connection, views, resource_names, unknown_types).",
			}, []string{"limit"}),
			handshakes: prometheus.NewCounter(prometheus.CounterOpts{
				Name: "estuary_xds_tls_handshake_failures_total",
				Help: "TLS handshakes that failed: no client certificate, one from another CA, an old TLS version, or not TLS at all.",
			}),
			tlsReloads: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "estuary_xds_tls_reloads_total", Help: "Changes to the xDS TLS files, by result (ok, error: the previous files stay in use).",
			}, []string{"result"}),
		},
	}
	s.metrics.views = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "estuary_xds_views", Help: "Live views: distinct (kind, network, requested networks, cluster) claims of connected nodes.",
	}, func() float64 { return float64(s.cache.LiveViews()) })
	s.cache.maxViews, s.cache.maxNames = opts.Limits.MaxViews, opts.Limits.MaxResourceNames
	s.cache.localityViews = opts.LocalityViews
	s.cache.onRefuse = func(limit string) { s.metrics.limited.WithLabelValues(limit).Inc() }
	s.streamLimit = &streamLimiter{max: opts.Limits.MaxStreamsPerConnection, live: map[string]int{},
		refused: func(a net.Addr) { s.refusedByLimit(limitStreams, clientKey(a)) }}
	s.cache.onFull = s.responseFull
	s.cache.onTaken = func(d time.Duration) { s.metrics.taken.Observe(d.Seconds()) }
	if opts.Ready != nil {
		s.cache.Hold()
	} else {
		s.metrics.ready.Set(1)
	}
	if reg != nil {
		reg.MustRegister(s.metrics.pushes, s.metrics.pushTime, s.metrics.pushCPU, s.metrics.taken, s.metrics.convergence, s.metrics.clients, s.metrics.nacks, s.metrics.full, s.metrics.ready,
			s.metrics.denied, s.metrics.limited, s.metrics.handshakes, s.metrics.tlsReloads, s.metrics.views)
	}
	upstream.Subscribe(s.notify)
	return s
}

// Cache returns the server's resource cache.
func (s *Server) Cache() *Cache { return s.cache }

// Listen binds the gRPC address and returns it; Run serves on it. Binding
// apart from serving lets the host print the address (port 0 included)
// before anything runs, and fail before anything starts.
// The TLS files are read here too, so a bad one stops the host before it
// starts.
func (s *Server) Listen() (net.Addr, error) {
	if s.opts.TLS != nil {
		r, err := newTLSReloader(*s.opts.TLS, s.logger)
		if err != nil {
			return nil, err
		}
		r.reloaded = func(ok bool) {
			s.metrics.tlsReloads.WithLabelValues(map[bool]string{true: "ok", false: "error"}[ok]).Inc()
		}
		s.tls = r
	} else if s.opts.Policy != nil {
		return nil, errors.New("xds: an authorization policy needs TLS with a client CA")
	}
	ln, err := net.Listen("tcp", s.opts.Listen)
	if err != nil {
		return nil, fmt.Errorf("xds: listen %s: %w", s.opts.Listen, err)
	}
	s.ln = &limitListener{Listener: ln, max: int64(s.opts.Limits.MaxConnections),
		refused: func(a net.Addr) { s.refusedByLimit(limitConnections, clientKey(a)) }}
	return ln.Addr(), nil
}

// identities reports whether every client must prove a SPIFFE identity.
func (s *Server) identities() bool { return s.opts.TLS != nil && s.opts.TLS.ClientCAFile != "" }

// refusedByLimit counts a refusal and warns, at most every ten seconds
// per client (its host, or its node).
func (s *Server) refusedByLimit(limit, client string) {
	s.metrics.limited.WithLabelValues(limit).Inc()
	if ok, held := s.warn.allow("limit " + limit + " " + client); ok {
		s.logger.Warn("xDS client refused by a limit", "limit", "max_"+limit, "client", client, "unlogged_since_last", held)
	}
}

// handshakeFailed counts a failed TLS handshake and warns, at most every
// ten seconds per client host.
func (s *Server) handshakeFailed(a net.Addr, err error) {
	s.metrics.handshakes.Inc()
	if ok, held := s.warn.allow("tls " + clientKey(a)); ok {
		s.logger.Warn("xDS TLS handshake failed", "client", clientKey(a), "error", err, "unlogged_since_last", held)
	}
}

// deny counts a refused claim, warns at most every ten seconds per
// client, and returns the PermissionDenied error that ends the stream.
func (s *Server) deny(d *denial, who string) error {
	s.metrics.denied.WithLabelValues(d.claim).Inc()
	if ok, held := s.warn.allow("deny " + who); ok {
		s.logger.Warn("xDS client refused", "claim", d.claim, "reason", d.msg, "unlogged_since_last", held)
	}
	return status.Error(codes.PermissionDenied, "xds: "+d.msg)
}

// serverReadBuffer is the read buffer of each client connection.
const serverReadBuffer = 4 << 10

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
	opts := []grpc.ServerOption{
		// The stream limiter refuses, with a reason, streams beyond the
		// limit; HTTP/2's own cap is a backstop above it, so the limiter
		// sees (and counts) what a client attempts past the limit.
		grpc.MaxConcurrentStreams(uint32(2 * s.opts.Limits.MaxStreamsPerConnection)),
		grpc.StreamInterceptor(s.streamLimit.interceptor),
		grpc.KeepaliveParams(kp),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		// Every proxy holds its own connection, and gRPC's buffers are per
		// connection: 32 KiB to read and 32 KiB to write, 640 MB at 10,000
		// proxies. What a proxy sends is small (requests and ACKs), so a
		// small read buffer costs a few more read calls at most; the write
		// buffer goes back to a pool after each flush rather than staying
		// with an idle connection. Responses are no smaller or slower for it.
		grpc.ReadBufferSize(serverReadBuffer),
		grpc.SharedWriteBuffer(true),
		// A proxy opens one ADS stream and sends its request headers once,
		// so HPACK's dynamic table (4 KiB each way by default, kept for the
		// connection's life) saves nothing: clients are told to use none.
		grpc.HeaderTableSize(0),
		// Responses reference the cache's marshaled resources rather than
		// copying them once per client (see sharedCodec).
		grpc.ForceServerCodecV2(newSharedCodec()),
	}
	if s.tls != nil {
		opts = append(opts, grpc.Creds(s.tls.credentials(s.handshakeFailed)))
		go s.tls.run(serving)
	}
	srv := grpc.NewServer(opts...)
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
	return err
}

// release answers the held watches once Options.Ready has closed. The
// debounce loop calls it: it is the goroutine that pushes, so no change
// it has taken can still be on its way into the cache while the watches
// are answered from it. (Released from another goroutine, a change taken
// just before the gate opened could reach the cache after the held
// clients had been answered without it: a partial first configuration
// for every client that reconnected to a restarting host.) What is
// pending, debounced or not, goes in first, so the held clients get all
// of it.
func (s *Server) release() {
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
// DebounceAfter, or once DebounceMax has passed since the first of them,
// and releases the held clients once Options.Ready closes. Pushes go on
// while clients are held: they keep the cache current and answer no one.
func (s *Server) debounce(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	ready := s.opts.Ready // nil: nothing is held, and this never fires
	for {
		select {
		case <-ctx.Done():
			return
		case <-ready:
			ready = nil
			s.release()
			continue
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
		if s.beforePush != nil {
			s.beforePush()
		}
		s.push(change, first)
	}
}

// push sends a change to every affected watch.
func (s *Server) push(change model.Change, first time.Time) {
	// The push's CPU time is its thread's while the goroutine holds it:
	// on a busy host the push's wall time is mostly waiting for a CPU.
	// The wall-time window encloses the CPU window, so that CPU ≤ wall.
	runtime.LockOSThread()
	start := time.Now()
	cpu0, cpuOK := threadCPU()
	st := s.cache.Push(change)
	cpu1, _ := threadCPU()
	end := time.Now()
	runtime.UnlockOSThread()
	s.metrics.pushTime.Observe(end.Sub(start).Seconds())
	if cpuOK {
		s.metrics.pushCPU.Observe((cpu1 - cpu0).Seconds())
	}
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

// typeName names a type URL in metrics and /debug/adsz; every type
// Estuary does not serve is "unknown", so clients cannot mint labels.
func typeName(url string) string {
	if t, ok := typeOf(url); ok {
		return typeNames[t]
	}
	return "unknown"
}

func (s *Server) callbacks() serverv3.Callbacks {
	open := func(delta bool) func(context.Context, int64, string) error {
		return func(ctx context.Context, id int64, _ string) error {
			si := &streamInfo{ID: id, Delta: delta, Since: time.Now(), Types: map[string]*typeInfo{}, own: &streamOwn{}}
			if s.identities() {
				ident, ok, err := peerIdentity(ctx)
				if !ok {
					if err == nil {
						err = errors.New("the connection carries no verified client certificate")
					}
					who := "unknown"
					if p, found := peer.FromContext(ctx); found {
						who = clientKey(p.Addr)
					}
					s.metrics.clients.Inc() // closed still runs
					return s.deny(&denial{claimIdentity, err.Error()}, who)
				}
				si.identity, si.hasIdentity = ident, true
			}
			s.nodesMu.Lock()
			s.streams[streamKey(delta, id)] = si
			s.nodesMu.Unlock()
			s.metrics.clients.Inc()
			return nil
		}
	}
	closed := func(delta bool) func(int64, *corev3.Node) {
		return func(id int64, _ *corev3.Node) {
			s.nodesMu.Lock()
			si := s.streams[streamKey(delta, id)]
			delete(s.streams, streamKey(delta, id))
			s.nodesMu.Unlock()
			if si != nil && si.parsed {
				s.cache.ReleaseView(si.view)
			}
			s.metrics.clients.Dec()
		}
	}
	return serverv3.CallbackFuncs{
		StreamOpenFunc:        open(false),
		DeltaStreamOpenFunc:   open(true),
		StreamClosedFunc:      closed(false),
		DeltaStreamClosedFunc: closed(true),
		StreamRequestFunc: func(id int64, req *discoveryv3.DiscoveryRequest) error {
			return s.request(streamKey(false, id), req.GetNode(), req.GetTypeUrl(), req.GetVersionInfo(), req.GetResponseNonce(), req.GetErrorDetail().GetMessage(), req.GetErrorDetail() != nil)
		},
		StreamDeltaRequestFunc: func(id int64, req *discoveryv3.DeltaDiscoveryRequest) error {
			return s.request(streamKey(true, id), req.GetNode(), req.GetTypeUrl(), "", req.GetResponseNonce(), req.GetErrorDetail().GetMessage(), req.GetErrorDetail() != nil)
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

// request admits a client request, or refuses it with the error that ends
// its stream. The first request fixes the stream's node: it is checked
// against the client's identity, and its view is held for the stream; a
// later request may repeat the node but not change it. A type Estuary
// does not serve is kept unanswered, up to MaxUnknownTypes per stream.
// Then request records whether the client ACKs or NACKs the last
// response.
func (s *Server) request(id int64, node *corev3.Node, typeURL, version, nonce, nackMsg string, nack bool) error {
	s.nodesMu.Lock()
	si := s.streams[id]
	s.nodesMu.Unlock()
	if si == nil {
		return nil
	}
	// Only this stream's goroutine writes si.parsed and si.own, so they
	// are read here without the lock.
	own := si.own
	if !si.parsed || (node != nil && node != own.node) {
		if err := s.admit(si, node); err != nil {
			return err
		}
	}
	if _, ok := typeOf(typeURL); !ok {
		if _, seen := own.unknown[typeURL]; !seen {
			if len(own.unknown) >= s.opts.Limits.MaxUnknownTypes {
				s.refusedByLimit(limitUnknownTypes, si.Node)
				return errLimit(limitUnknownTypes, "the stream asked for %d type URLs Estuary does not serve", len(own.unknown)+1)
			}
			if own.unknown == nil {
				own.unknown = map[string]struct{}{}
			}
			own.unknown[typeURL] = struct{}{}
		}
	}
	s.nodesMu.Lock()
	defer s.nodesMu.Unlock()
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
		if ok, held := s.warn.allow("nack " + si.Node); ok {
			s.logger.Warn("client rejected a response", "node", si.Node, "type", typeName(typeURL), "nonce", nonce, "error", nackMsg, "unlogged_since_last", held)
		}
	case nonce != "":
		if version == "" {
			version = ti.SentVersion
		}
		ti.AckedVersion, ti.State = version, "ACK"
	}
	return nil
}

// admit takes the stream's node from its first request: it authorizes
// it and holds its view. A node sent again must be the same node.
func (s *Server) admit(si *streamInfo, node *corev3.Node) error {
	n := ParseNode(node)
	v := s.cache.viewOf(&n)
	if si.parsed {
		if n.ID != si.Node || v != si.view {
			return s.deny(&denial{claimNode, fmt.Sprintf("node %q (view %s) changed to %q (view %s) within a stream; open a new stream", si.Node, si.view, n.ID, v)}, si.Node)
		}
		si.own.node = node
		return nil
	}
	if si.hasIdentity {
		if d := s.opts.Policy.check(si.identity, node, n); d != nil {
			return s.deny(d, si.identity.String())
		}
	}
	if err := s.cache.AcquireView(v); err != nil {
		if ok, held := s.warn.allow("views"); ok {
			s.logger.Warn("xDS client refused: too many views", "node", n.ID, "view", v.String(), "limit", "max_views", "unlogged_since_last", held)
		}
		return err
	}
	s.nodesMu.Lock()
	si.Node, si.Kind, si.view, si.View, si.Namespace, si.parsed = n.ID, n.Kind.String(), v, v.String(), n.Namespace, true
	s.nodesMu.Unlock()
	si.own.node = node
	return nil
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
