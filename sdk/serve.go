package sdk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
)

// ProtocolVersion is the registry protocol this SDK speaks. It is negotiated
// through go-plugin and repeated in Describe.
const ProtocolVersion = 1

// PluginName is the go-plugin dispense name of the registry service.
const PluginName = "registry"

// Handshake is the go-plugin handshake shared by host and plugins. The magic
// cookie only stops a user from running a plugin binary by hand; it is not a
// security measure.
var Handshake = plugin.HandshakeConfig{
	ProtocolVersion:  ProtocolVersion,
	MagicCookieKey:   "ESTUARY_PLUGIN_MAGIC_COOKIE",
	MagicCookieValue: "8a3c0d5e-estuary-registry-plugin",
}

// MaxMessageBytes bounds one Watch response. A service with a few hundred
// thousand endpoints still fits.
const MaxMessageBytes = 256 << 20

// batchCost is how many endpoints (roughly) one Watch response carries
// before the SDK starts a new one.
const batchCost = 4096

// Serve runs a plugin built by f and returns when the host stops it. It sets
// up the go-plugin handshake, protocol negotiation, AutoMTLS (when the host
// asks for it) and an hclog JSON logger on stderr.
func Serve(f Factory) {
	// The plugin's sensitive config values and URL credentials never
	// reach its log: the state's set learns them at Configure.
	state := NewState()
	logger := hclog.New(&hclog.LoggerOptions{
		Level:      hclog.Trace,
		Output:     state.secrets.Writer(os.Stderr),
		JSONFormat: true,
	})
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer cancel()
	go exitWithParent(ctx, logger)
	serve(ctx, f, state, logger, logger, nil, nil)
}

// ServeTest serves f in this process for tests: it returns the config a
// go-plugin client reattaches with, and a channel closed when serving ends
// (after the client kills the plugin or ctx ends). By the time the channel
// is closed the plugin has stopped (see [Stopper]) and nothing the SDK or
// the plugin started will write to logger again, so a test that waits for
// it can end without a late log line reaching a finished testing.T.
func ServeTest(ctx context.Context, f Factory, logger hclog.Logger) (*plugin.ReattachConfig, <-chan struct{}, error) {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	reattach := make(chan *plugin.ReattachConfig, 1)
	served := make(chan struct{}) // closed by go-plugin when it stops serving
	done := make(chan struct{})   // closed once everything below has ended
	// go-plugin stops a test-mode server both when its context ends and when
	// a client's Shutdown RPC arrives; two at once race inside go-plugin.
	// Whichever comes first stops the server; the other is dropped.
	stop := &stopOnce{}
	serveCtx, cancelServe := context.WithCancel(context.Background())
	watching := make(chan struct{})
	go func() {
		defer close(watching)
		select {
		case <-ctx.Done():
			if stop.claim() {
				cancelServe()
			}
		case <-served:
		}
	}()
	// In test mode go-plugin never closes the write ends of the stdio pipes
	// it makes, so its two goroutines copying from them end only when the
	// garbage collector closes the files, and then log that they did. No
	// one can wait for them; instead go-plugin logs through a gate that is
	// shut before done is closed, so those last lines are dropped.
	gate := &logGate{}
	go func() {
		defer close(done)
		defer cancelServe()
		serve(ctx, f, NewState(), logger, gatedLogger{logger, gate}, &plugin.ServeTestConfig{Context: serveCtx, ReattachConfigCh: reattach, CloseCh: served}, stop)
		<-watching
		gate.close()
		// Collect now, so the copying goroutines end soon and tests that
		// check for leaked goroutines see them gone.
		runtime.GC()
	}()
	select {
	case rc := <-reattach:
		return rc, done, nil
	case <-done:
		return nil, nil, errors.New("plugin stopped before it served")
	case <-ctx.Done():
		<-done
		return nil, nil, fmt.Errorf("plugin did not start serving: %w", ctx.Err())
	}
}

// serve runs the plugin until go-plugin stops serving, then stops it.
// goPluginLogger receives go-plugin's own log lines.
func serve(ctx context.Context, f Factory, state *State, logger, goPluginLogger hclog.Logger, test *plugin.ServeTestConfig, stop *stopOnce) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	impl := f(Runtime{Context: ctx, Logger: logger, State: state})
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: Handshake,
		VersionedPlugins: map[int]plugin.PluginSet{
			ProtocolVersion: {PluginName: &GRPCPlugin{Impl: impl, State: state, Context: ctx, Logger: logger}},
		},
		GRPCServer: func(opts []grpc.ServerOption) *grpc.Server {
			opts = append(opts,
				grpc.ChainUnaryInterceptor(guardShutdown(stop), recoverUnary(logger)),
				grpc.ChainStreamInterceptor(recoverStream(logger)),
				grpc.MaxRecvMsgSize(MaxMessageBytes),
				grpc.MaxSendMsgSize(MaxMessageBytes),
				grpc.ForceServerCodecV2(registryv1.Codec()),
			)
			return grpc.NewServer(opts...)
		},
		Logger: goPluginLogger,
		Test:   test,
	})
	// The host is gone: end the plugin's context and wait for what it runs.
	cancel()
	if s, ok := impl.(Stopper); ok {
		sctx, scancel := context.WithTimeout(context.Background(), StopTimeout)
		defer scancel()
		if err := s.Stop(sctx); err != nil {
			logger.Error("plugin did not stop cleanly", "error", err)
		}
	}
}

// StopTimeout bounds how long Serve waits for a [Stopper] to stop.
const StopTimeout = 30 * time.Second

// logGate passes log calls through until it is closed and drops them
// after. A call in flight when close is called finishes first.
type logGate struct {
	mu     sync.RWMutex
	closed bool
}

func (g *logGate) do(f func()) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if !g.closed {
		f()
	}
}

func (g *logGate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
}

// gatedLogger is a logger, and every logger derived from it, behind a gate.
type gatedLogger struct {
	hclog.Logger
	gate *logGate
}

func (l gatedLogger) Log(level hclog.Level, msg string, args ...any) {
	l.gate.do(func() { l.Logger.Log(level, msg, args...) })
}
func (l gatedLogger) Trace(msg string, args ...any) { l.Log(hclog.Trace, msg, args...) }
func (l gatedLogger) Debug(msg string, args ...any) { l.Log(hclog.Debug, msg, args...) }
func (l gatedLogger) Info(msg string, args ...any)  { l.Log(hclog.Info, msg, args...) }
func (l gatedLogger) Warn(msg string, args ...any)  { l.Log(hclog.Warn, msg, args...) }
func (l gatedLogger) Error(msg string, args ...any) { l.Log(hclog.Error, msg, args...) }
func (l gatedLogger) With(args ...any) hclog.Logger {
	return gatedLogger{l.Logger.With(args...), l.gate}
}
func (l gatedLogger) Named(name string) hclog.Logger {
	return gatedLogger{l.Logger.Named(name), l.gate}
}
func (l gatedLogger) ResetNamed(name string) hclog.Logger {
	return gatedLogger{l.Logger.ResetNamed(name), l.gate}
}
func (l gatedLogger) StandardWriter(opts *hclog.StandardLoggerOptions) io.Writer {
	return gatedWriter{l.Logger.StandardWriter(opts), l.gate}
}
func (l gatedLogger) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(l.StandardWriter(opts), "", 0)
}

type gatedWriter struct {
	w    io.Writer
	gate *logGate
}

func (w gatedWriter) Write(p []byte) (n int, err error) {
	n = len(p)
	w.gate.do(func() { n, err = w.w.Write(p) })
	return n, err
}

// exitWithParent ends the plugin when its host dies without stopping it
// (for example, SIGKILL): the plugin is re-parented, so its parent PID changes.
func exitWithParent(ctx context.Context, logger hclog.Logger) {
	parent := os.Getppid()
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if os.Getppid() != parent {
				logger.Warn("host process is gone, exiting", "host_pid", parent)
				os.Exit(3)
			}
		}
	}
}

// ClientDialOptions are the gRPC options a host dials a plugin with: large
// messages and the registry codec.
func ClientDialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithDefaultCallOptions(
		grpc.MaxCallRecvMsgSize(MaxMessageBytes),
		grpc.MaxCallSendMsgSize(MaxMessageBytes),
		grpc.ForceCodecV2(registryv1.Codec()),
	)}
}

// GRPCPlugin is the go-plugin glue for the registry service. Serve uses
// its server side. Its client side hands out the raw generated client, for
// tests that drive the wire themselves; a host uses pluginclient.Plugin
// instead, whose typed client checks everything a plugin sends.
type GRPCPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	Impl    Plugin
	State   *State
	Context context.Context
	Logger  hclog.Logger
}

var _ plugin.GRPCPlugin = (*GRPCPlugin)(nil)

// GRPCServer registers the registry service.
func (p *GRPCPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	registryv1.RegisterRegistryServer(s, &server{impl: p.Impl, state: p.State, ctx: p.Context})
	return nil
}

// GRPCClient returns a registryv1.RegistryClient, which checks nothing.
func (p *GRPCPlugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return registryv1.NewRegistryClient(c), nil
}

type server struct {
	registryv1.UnimplementedRegistryServer
	impl  Plugin
	state *State
	ctx   context.Context
}

func (s *server) Describe(ctx context.Context, _ *registryv1.DescribeRequest) (*registryv1.DescribeResponse, error) {
	d, err := s.impl.Describe(ctx, &DescribeRequest{})
	if err != nil {
		return nil, toStatus(err)
	}
	out := &registryv1.DescribeResponse{
		Name:            d.Name,
		Version:         d.Version,
		ProtocolVersion: ProtocolVersion,
		ConfigSchema:    schemaToProto(d.ConfigSchema),
	}
	for _, c := range d.Capabilities {
		out.Capabilities = append(out.Capabilities, registryv1.Capability(c))
	}
	return out, nil
}

func (s *server) Configure(ctx context.Context, req *registryv1.ConfigureRequest) (*registryv1.ConfigureResponse, error) {
	// Learn the block's sensitive values before the plugin sees them, so
	// that nothing it logs or reports about them shows them.
	if d, err := s.impl.Describe(ctx, &DescribeRequest{}); err == nil && d.ConfigSchema != nil && s.state.secrets != nil {
		s.state.secrets.Add(d.ConfigSchema.SensitiveValues(req.GetConfigJson())...)
	}
	m := req.GetMesh()
	resp, err := s.impl.Configure(ctx, &ConfigureRequest{
		ConfigJSON: req.GetConfigJson(),
		Mesh:       MeshSettings{DomainSuffix: m.GetDomainSuffix(), ClusterID: m.GetClusterId(), Network: m.GetNetwork(), HostAddresses: m.GetHostAddresses()},
	})
	if err != nil {
		return nil, toStatus(err)
	}
	out := &registryv1.ConfigureResponse{}
	if resp != nil {
		for _, d := range resp.Diagnostics {
			out.Diagnostics = append(out.Diagnostics, &registryv1.Diagnostic{
				Severity: registryv1.Severity(d.Severity), Summary: d.Summary, Detail: d.Detail, Path: d.Path,
			})
		}
	}
	return out, nil
}

func (s *server) Watch(_ *registryv1.WatchRequest, stream grpc.ServerStreamingServer[registryv1.WatchResponse]) error {
	// The capabilities decide whether instance_set_complete may be sent.
	d, err := s.impl.Describe(stream.Context(), &DescribeRequest{})
	if err != nil {
		return toStatus(err)
	}
	return s.state.serveWatch(s.ctx, stream.Context(), stream.Send, slices.Contains(d.Capabilities, CapabilityInstanceSet))
}

// serveWatch streams a snapshot and then deltas until either context ends.
// instanceSet says whether the plugin declared CapabilityInstanceSet;
// without it InstanceSetComplete is not sent, as the protocol requires.
func (st *State) serveWatch(pluginCtx, streamCtx context.Context, send func(*registryv1.WatchResponse) error, instanceSet bool) error {
	sub := st.subscribe()
	defer st.unsubscribe(sub)
	var seq uint64
	snapshotSent := false
	flush := func(events []event, snapshot, last bool) error {
		resp := &registryv1.WatchResponse{Snapshot: snapshot}
		cost := 0
		for i := range events {
			if events[i].kind == kindInstanceSetComplete {
				// A plugin-level event: a flag on the batch, which applies
				// after the batch's events.
				resp.InstanceSetComplete = instanceSet
				continue
			}
			if events[i].kind == kindPluginHealth {
				resp.PluginHealth = healthToProto(events[i].health)
				continue
			}
			resp.Events = append(resp.Events, events[i].toProto())
			cost += events[i].cost()
			if cost >= batchCost && i < len(events)-1 {
				seq++
				resp.Sequence = seq
				if err := send(resp); err != nil {
					return err
				}
				resp, cost = &registryv1.WatchResponse{Snapshot: snapshot}, 0
			}
		}
		if len(resp.Events) == 0 && !resp.InstanceSetComplete && resp.PluginHealth == nil && !last {
			return nil
		}
		seq++
		resp.Sequence = seq
		resp.SnapshotDone = last
		return send(resp)
	}
	for {
		select {
		case <-sub.notify:
		case <-streamCtx.Done():
			return nil
		case <-pluginCtx.Done():
			return status.Error(codes.Unavailable, "plugin is shutting down")
		}
		events, snap := st.take(sub)
		if !snapshotSent {
			if err := flush(events[:snap], true, true); err != nil {
				return err
			}
			snapshotSent = true
			events = events[snap:]
		}
		if err := flush(events, false, false); err != nil {
			return err
		}
	}
}

// toStatus keeps gRPC statuses and wraps anything else as Unknown.
func toStatus(err error) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(codes.Unknown, err.Error())
}

// stopOnce lets one of go-plugin's two stop paths run in test mode.
type stopOnce struct {
	mu      sync.Mutex
	claimed bool
}

func (s *stopOnce) claim() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.claimed {
		return false
	}
	s.claimed = true
	return true
}

// shutdownMethod is go-plugin's controller RPC that stops a plugin.
const shutdownMethod = "/plugin.GRPCController/Shutdown"

// guardShutdown drops a Shutdown RPC when the server is already stopping.
func guardShutdown(stop *stopOnce) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if info.FullMethod == shutdownMethod && stop != nil && !stop.claim() {
			return nil, status.Error(codes.Unavailable, "plugin is already stopping")
		}
		return handler(ctx, req)
	}
}

func recoverUnary(logger hclog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if r := recover(); r != nil {
				err = panicStatus(logger, info.FullMethod, r)
			}
		}()
		return handler(ctx, req)
	}
}

func recoverStream(logger hclog.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = panicStatus(logger, info.FullMethod, r)
			}
		}()
		return handler(srv, ss)
	}
}

func panicStatus(logger hclog.Logger, method string, r any) error {
	logger.Error("plugin panicked", "method", method, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
	return status.Errorf(codes.Internal, "plugin panicked in %s: %v", method, r)
}
