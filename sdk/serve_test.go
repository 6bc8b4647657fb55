package sdk_test

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"github.com/hashicorp/go-plugin/runner"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
	"github.com/estuary-mesh/estuary/sdk"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// panicky panics in the calls listed in panics, once each.
type panicky struct {
	describes  atomic.Int32
	configures atomic.Int32
	state      *sdk.State
}

func (p *panicky) Describe(context.Context, *sdk.DescribeRequest) (*sdk.DescribeResponse, error) {
	if p.describes.Add(1) == 1 {
		panic("boom in describe")
	}
	return &sdk.DescribeResponse{Name: "panicky", Version: "1.0.0"}, nil
}

func (p *panicky) Configure(context.Context, *sdk.ConfigureRequest) (*sdk.ConfigureResponse, error) {
	if p.configures.Add(1) == 1 {
		panic(errors.New("config exploded")) // an error value, not a string
	}
	id := sdk.InstanceID{Provider: "Panicky", Cluster: "c1"}
	p.state.SetInstance(id, sdk.InstanceProperties{})
	return &sdk.ConfigureResponse{}, p.state.MarkSynced(id)
}

// syncBuffer collects the plugin's log lines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestServeRecoversPanics serves a plugin that panics, reaches it the way
// the host does (go-plugin, gRPC), and checks that each panic becomes an
// Internal error, is logged with its stack, and leaves the plugin serving.
func TestServeRecoversPanics(t *testing.T) {
	logs := &syncBuffer{}
	logger := hclog.New(&hclog.LoggerOptions{Level: hclog.Error, Output: logs, JSONFormat: true})
	impl := &panicky{}
	rpc, _ := serve(t, func(rt sdk.Runtime) sdk.Plugin { impl.state = rt.State; return impl }, logger)
	call, done := context.WithTimeout(t.Context(), 10*time.Second)
	defer done()

	_, err := rpc.Describe(call, &registryv1.DescribeRequest{})
	wantStatus(t, err, codes.Internal, "plugin panicked in /estuary.registry.v1.Registry/Describe: boom in describe")

	d, err := rpc.Describe(call, &registryv1.DescribeRequest{})
	if err != nil {
		t.Fatalf("second Describe: %v", err)
	}
	if d.GetName() != "panicky" || d.GetProtocolVersion() != sdk.ProtocolVersion {
		t.Errorf("second Describe = %v", d)
	}

	_, err = rpc.Configure(call, &registryv1.ConfigureRequest{})
	wantStatus(t, err, codes.Internal, "plugin panicked in /estuary.registry.v1.Registry/Configure: config exploded")
	if _, err := rpc.Configure(call, &registryv1.ConfigureRequest{}); err != nil {
		t.Fatalf("second Configure: %v", err)
	}

	// The stream still works after the panics, with the state Configure set.
	stream, err := rpc.Watch(call, &registryv1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	if !resp.GetSnapshot() || !resp.GetSnapshotDone() || resp.GetSequence() != 1 || len(resp.GetEvents()) != 2 {
		t.Errorf("first Watch response = %v, want a one-response snapshot with instance added and synced", resp)
	}

	out := logs.String()
	for _, want := range []string{`"@message":"plugin panicked"`, `"method":"/estuary.registry.v1.Registry/Describe"`, `"panic":"boom in describe"`, `"stack":"goroutine `} {
		if !strings.Contains(out, want) {
			t.Errorf("plugin log lacks %s:\n%s", want, out)
		}
	}
}

func wantStatus(t *testing.T, err error, code codes.Code, msg string) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || st.Code() != code || st.Message() != msg {
		t.Errorf("err = %v, want %s %q", err, code, msg)
	}
}

// errPlugin returns plain errors, which cross the wire as Unknown, and
// gRPC statuses, which keep their code.
type errPlugin struct{}

func (errPlugin) Describe(context.Context, *sdk.DescribeRequest) (*sdk.DescribeResponse, error) {
	return nil, status.Error(codes.FailedPrecondition, "not yet")
}

func (errPlugin) Configure(context.Context, *sdk.ConfigureRequest) (*sdk.ConfigureResponse, error) {
	return nil, context.DeadlineExceeded
}

func TestServeErrorCodes(t *testing.T) {
	rpc, _ := serve(t, func(sdk.Runtime) sdk.Plugin { return errPlugin{} }, nil)
	ctx := t.Context()
	_, err := rpc.Describe(ctx, &registryv1.DescribeRequest{})
	wantStatus(t, err, codes.FailedPrecondition, "not yet")
	_, err = rpc.Configure(ctx, &registryv1.ConfigureRequest{})
	wantStatus(t, err, codes.Unknown, "context deadline exceeded")
}

// serve serves the plugin built by f in this process with sdk.ServeTest and
// connects to it as the host does: go-plugin, reattached, over gRPC. The
// plugin is stopped, and its connection closed, by kill or when the test
// ends; kill returns once sdk.ServeTest says serving has ended.
func serve(t *testing.T, f sdk.Factory, logger hclog.Logger) (rpc registryv1.RegistryClient, kill func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	rc, closed, err := sdk.ServeTest(ctx, f, logger)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	// Wait for the plugin to stop serving rather than for the PID (this
	// process) to exit, which go-plugin would poll for forever.
	rc.ReattachFunc = func() (runner.AttachedRunner, error) { return inProcess{closed}, nil }
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  sdk.Handshake,
		Plugins:          plugin.PluginSet{sdk.PluginName: &sdk.GRPCPlugin{}},
		Reattach:         rc,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		Logger:           hclog.NewNullLogger(),
	})
	cp, err := client.Client()
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	kill = sync.OnceFunc(func() {
		// As the host does: closing the client asks the plugin to stop.
		// The context ends only afterwards, so go-plugin does not stop
		// the server twice at once.
		client.Kill()
		_ = cp.Close()
		select {
		case <-closed:
		case <-time.After(30 * time.Second):
			t.Errorf("plugin still serving 30s after the client closed")
		}
		cancel()
		<-closed // nothing of the plugin may outlive the test
	})
	t.Cleanup(kill)
	raw, err := cp.Dispense(sdk.PluginName)
	if err != nil {
		t.Fatal(err)
	}
	return raw.(registryv1.RegistryClient), kill
}

type inProcess struct{ closed <-chan struct{} }

func (r inProcess) Wait(context.Context) error                     { <-r.closed; return nil }
func (inProcess) Kill(context.Context) error                       { return nil }
func (inProcess) ID() string                                       { return "in-process" }
func (inProcess) PluginToHost(n, a string) (string, string, error) { return n, a, nil }
func (inProcess) HostToPlugin(n, a string) (string, string, error) { return n, a, nil }

// worker runs a goroutine of its own, as a plugin's watches do, that logs
// when it stops.
type worker struct {
	rt      sdk.Runtime
	stopped atomic.Bool
	done    chan struct{}
}

func (w *worker) Describe(context.Context, *sdk.DescribeRequest) (*sdk.DescribeResponse, error) {
	return &sdk.DescribeResponse{Name: "worker", Version: "1.0.0"}, nil
}

func (w *worker) Configure(context.Context, *sdk.ConfigureRequest) (*sdk.ConfigureResponse, error) {
	go func() {
		defer close(w.done)
		<-w.rt.Context.Done()
		w.rt.Logger.Info("worker stopping")
		w.stopped.Store(true)
	}()
	return &sdk.ConfigureResponse{}, nil
}

func (w *worker) Stop(ctx context.Context) error {
	select {
	case <-w.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

var _ sdk.Stopper = (*worker)(nil)

// lateLog fails a test that writes to it after it was sealed: a line
// logged after the test ended would reach a finished testing.T.
type lateLog struct {
	mu     sync.Mutex
	sealed bool
	late   []string
	lines  []string
}

func (l *lateLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sealed {
		l.late = append(l.late, string(p))
	} else {
		l.lines = append(l.lines, string(p))
	}
	return len(p), nil
}

// TestServeTestWaitsForEverything checks ServeTest's promise: once its
// channel is closed, the plugin's goroutines have ended (Stopper) and
// neither they nor go-plugin's stdio copiers (which end only when the
// garbage collector closes their pipes) write to the logger again.
func TestServeTestWaitsForEverything(t *testing.T) {
	log := &lateLog{}
	logger := hclog.New(&hclog.LoggerOptions{Level: hclog.Trace, Output: log})
	w := &worker{done: make(chan struct{})}
	rpc, kill := serve(t, func(rt sdk.Runtime) sdk.Plugin { w.rt = rt; return w }, logger)
	if _, err := rpc.Configure(t.Context(), &registryv1.ConfigureRequest{}); err != nil {
		t.Fatal(err)
	}

	kill()
	if !w.stopped.Load() {
		t.Errorf("serving ended before the plugin's goroutine did")
	}
	log.mu.Lock()
	log.sealed = true
	log.mu.Unlock()

	// Let go-plugin's stdio copiers end, then look at what they wrote.
	deadline := time.Now().Add(time.Minute)
	for copiers() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("go-plugin's stdio copiers still run a minute after serving ended")
		}
		runtime.GC()
		runtime.Gosched()
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	if len(log.late) > 0 {
		t.Errorf("logged after serving ended: %q", log.late)
	}
	if !slices.ContainsFunc(log.lines, func(s string) bool { return strings.Contains(s, "worker stopping") }) {
		t.Errorf("the plugin's last line is missing: %q", log.lines)
	}
}

// copiers counts go-plugin's stdio copy goroutines.
func copiers() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), "go-plugin.copyChan(")
		}
		buf = make([]byte, 2*len(buf))
	}
}
