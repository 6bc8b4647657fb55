package sdk_test

import (
	"bytes"
	"context"
	"errors"
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
	rpc := serve(t, func(rt sdk.Runtime) sdk.Plugin { impl.state = rt.State; return impl }, logger)
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
	rpc := serve(t, func(sdk.Runtime) sdk.Plugin { return errPlugin{} }, nil)
	ctx := t.Context()
	_, err := rpc.Describe(ctx, &registryv1.DescribeRequest{})
	wantStatus(t, err, codes.FailedPrecondition, "not yet")
	_, err = rpc.Configure(ctx, &registryv1.ConfigureRequest{})
	wantStatus(t, err, codes.Unknown, "context deadline exceeded")
}

// serve serves the plugin built by f in this process with sdk.ServeTest and
// connects to it as the host does: go-plugin, reattached, over gRPC. The
// plugin is stopped, and its connection closed, when the test ends.
func serve(t *testing.T, f sdk.Factory, logger hclog.Logger) registryv1.RegistryClient {
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
	t.Cleanup(func() {
		// As the host does: closing the client asks the plugin to stop.
		// The context ends only afterwards, so go-plugin does not stop
		// the server twice at once.
		client.Kill()
		_ = cp.Close()
		select {
		case <-closed:
		case <-time.After(5 * time.Second):
			t.Errorf("plugin still serving 5s after the client closed")
		}
		cancel()
	})
	raw, err := cp.Dispense(sdk.PluginName)
	if err != nil {
		t.Fatal(err)
	}
	return raw.(registryv1.RegistryClient)
}

type inProcess struct{ closed <-chan struct{} }

func (r inProcess) Wait(context.Context) error                     { <-r.closed; return nil }
func (inProcess) Kill(context.Context) error                       { return nil }
func (inProcess) ID() string                                       { return "in-process" }
func (inProcess) PluginToHost(n, a string) (string, string, error) { return n, a, nil }
func (inProcess) HostToPlugin(n, a string) (string, string, error) { return n, a, nil }
