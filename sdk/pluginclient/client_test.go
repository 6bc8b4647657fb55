package pluginclient_test

import (
	"context"
	"errors"
	"io"
	"net"
	"reflect"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/pluginclient"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// wirePlugin is a plugin that speaks raw wire messages, so the test
// controls every byte the client receives, including broken ones.
type wirePlugin struct {
	registryv1.UnimplementedRegistryServer
	describe  *registryv1.DescribeResponse
	configure func(*registryv1.ConfigureRequest) *registryv1.ConfigureResponse
	responses []*registryv1.WatchResponse
	// streamEnded receives the Watch stream's context error once the
	// client has ended the stream.
	streamEnded chan error
}

func (p *wirePlugin) Describe(context.Context, *registryv1.DescribeRequest) (*registryv1.DescribeResponse, error) {
	return p.describe, nil
}

func (p *wirePlugin) Configure(_ context.Context, req *registryv1.ConfigureRequest) (*registryv1.ConfigureResponse, error) {
	if p.configure == nil {
		return nil, status.Error(codes.InvalidArgument, "no config accepted")
	}
	return p.configure(req), nil
}

func (p *wirePlugin) Watch(_ *registryv1.WatchRequest, s grpc.ServerStreamingServer[registryv1.WatchResponse]) error {
	for _, r := range p.responses {
		if err := s.Send(r); err != nil {
			return err
		}
	}
	// A plugin keeps its stream open; only the client ends it.
	select {
	case <-s.Context().Done():
		p.streamEnded <- s.Context().Err()
	case <-time.After(10 * time.Second):
		p.streamEnded <- errors.New("the client never ended the stream")
	}
	return nil
}

func connect(t *testing.T, p *wirePlugin) *pluginclient.Client {
	t.Helper()
	p.streamEnded = make(chan error, 1)
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(grpc.ForceServerCodecV2(registryv1.Codec()))
	registryv1.RegisterRegistryServer(srv, p)
	go func() { _ = srv.Serve(lis) }()
	opts := append(sdk.ClientDialOptions(),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	conn, err := grpc.NewClient("passthrough:///plugin", opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		srv.Stop()
	})
	return pluginclient.New(conn)
}

func TestDescribeAndConfigure(t *testing.T) {
	var got *registryv1.ConfigureRequest
	c := connect(t, &wirePlugin{
		describe: &registryv1.DescribeResponse{Name: "p", Version: "1.0", ProtocolVersion: 1,
			Capabilities: []registryv1.Capability{registryv1.Capability_CAPABILITY_GATEWAYS, registryv1.Capability_CAPABILITY_UNSPECIFIED, registryv1.Capability_CAPABILITY_RECONFIGURE},
			ConfigSchema: &registryv1.Schema{Attributes: []*registryv1.Attribute{{Name: "port", Type: "number", Required: true}}}},
		configure: func(req *registryv1.ConfigureRequest) *registryv1.ConfigureResponse {
			got = req
			return &registryv1.ConfigureResponse{Diagnostics: []*registryv1.Diagnostic{
				{Severity: registryv1.Severity_SEVERITY_WARNING, Summary: "odd", Detail: "very", Path: []string{"port"}}}}
		},
	})
	ctx := context.Background()
	d, err := c.Describe(ctx, &pluginclient.DescribeRequest{})
	if err != nil {
		t.Fatal(err)
	}
	want := &pluginclient.DescribeResponse{Name: "p", Version: "1.0", ProtocolVersion: 1,
		Capabilities: []sdk.Capability{sdk.CapabilityGateways, sdk.CapabilityReconfigure},
		ConfigSchema: &sdk.Schema{Attributes: []sdk.Attribute{{Name: "port", Type: "number", Required: true}}}}
	if !reflect.DeepEqual(d, want) {
		t.Errorf("Describe:\n got %+v\nwant %+v", d, want)
	}
	if !d.HasCapability(sdk.CapabilityGateways) || d.HasCapability(sdk.CapabilityMultiInstance) {
		t.Errorf("HasCapability disagrees with %v", d.Capabilities)
	}

	resp, err := c.Configure(ctx, &pluginclient.ConfigureRequest{ConfigJSON: []byte(`{"port":80}`),
		Mesh: sdk.MeshSettings{DomainSuffix: "example.org", ClusterID: "c9", Network: "n9", HostAddresses: []string{"127.0.0.1:15014"}}})
	if err != nil {
		t.Fatal(err)
	}
	if string(got.GetConfigJson()) != `{"port":80}` || got.GetMesh().GetDomainSuffix() != "example.org" ||
		got.GetMesh().GetClusterId() != "c9" || got.GetMesh().GetNetwork() != "n9" ||
		len(got.GetMesh().GetHostAddresses()) != 1 || got.GetMesh().GetHostAddresses()[0] != "127.0.0.1:15014" {
		t.Errorf("plugin received %v", got)
	}
	wantDiags := sdk.Diagnostics{{Severity: sdk.SeverityWarning, Summary: "odd", Detail: "very", Path: []string{"port"}}}
	if !reflect.DeepEqual(resp.Diagnostics, wantDiags) {
		t.Errorf("diagnostics %+v, want %+v", resp.Diagnostics, wantDiags)
	}
}

// TestErrorsKeepTheirStatus: a plugin's gRPC status reaches the caller
// unchanged, so the host can wrap it and still match its code.
func TestErrorsKeepTheirStatus(t *testing.T) {
	c := connect(t, &wirePlugin{})
	_, err := c.Configure(context.Background(), &pluginclient.ConfigureRequest{})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("error %v, want code InvalidArgument", err)
	}
}

func event(kind string) *registryv1.Event {
	id := &registryv1.InstanceID{Provider: "P", Cluster: "c1"}
	switch kind {
	case "added":
		return &registryv1.Event{Instance: id, Kind: &registryv1.Event_InstanceAdded{InstanceAdded: &registryv1.InstanceAdded{}}}
	case "gateways":
		return &registryv1.Event{Instance: id, Kind: &registryv1.Event_GatewaysReplaced{GatewaysReplaced: &registryv1.GatewaysReplaced{
			Gateways: []*registryv1.NetworkGateway{{Network: "n1", Address: "192.0.2.1", Port: 15443}}}}}
	}
	return &registryv1.Event{Instance: id, Kind: &registryv1.Event_InstanceSynced{InstanceSynced: &registryv1.InstanceSynced{}}}
}

// TestWatchEndsStreamOnProtocolError: batches come whole; the first one
// that breaks the protocol (here: gateways the plugin did not declare) is
// not returned, its error names the event, the plugin sees its stream
// cancelled, and the stream stays ended.
func TestWatchEndsStreamOnProtocolError(t *testing.T) {
	p := &wirePlugin{responses: []*registryv1.WatchResponse{
		{Sequence: 1, Snapshot: true, SnapshotDone: true, Events: []*registryv1.Event{event("added"), event("synced")}},
		{Sequence: 2, Events: []*registryv1.Event{event("synced"), event("gateways")}},
		{Sequence: 3, Events: []*registryv1.Event{event("synced")}},
	}}
	c := connect(t, p)
	w, err := c.Watch(context.Background(), &pluginclient.WatchRequest{Capabilities: []sdk.Capability{sdk.CapabilityReconfigure}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := w.Recv()
	if err != nil || b.Sequence != 1 || !b.SnapshotDone || len(b.Events) != 2 || b.Events[0].Kind != pluginclient.KindInstanceAdded {
		t.Fatalf("first batch %+v, %v", b, err)
	}
	b, err = w.Recv()
	var perr *pluginclient.ProtocolError
	if b != nil || !errors.As(err, &perr) || perr.Sequence != 2 || perr.Event != 1 || perr.Kind != pluginclient.KindGatewaysReplaced ||
		perr.Instance != (sdk.InstanceID{Provider: "P", Cluster: "c1"}) {
		t.Fatalf("second batch %+v, error %#v: want a protocol error naming batch 2, event 1", b, err)
	}
	select {
	case serr := <-p.streamEnded:
		if !errors.Is(serr, context.Canceled) {
			t.Errorf("plugin's stream ended with %v, want it cancelled", serr)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the plugin's stream is still open after a protocol error")
	}
	if b, again := w.Recv(); b != nil || again != err {
		t.Errorf("Recv after the protocol error = %+v, %v; want the same error", b, again)
	}
}

// TestWatchHoldsToDeclaredCapabilities: the same stream is fine from a
// plugin that declared GATEWAYS, and ends cleanly with io.EOF.
func TestWatchHoldsToDeclaredCapabilities(t *testing.T) {
	p := &wirePlugin{responses: []*registryv1.WatchResponse{
		{Sequence: 1, Snapshot: true, SnapshotDone: true, Events: []*registryv1.Event{event("added"), event("gateways")}},
	}}
	c := connect(t, p)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := c.Watch(ctx, &pluginclient.WatchRequest{Capabilities: []sdk.Capability{sdk.CapabilityGateways}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := w.Recv()
	if err != nil || len(b.Events) != 2 || len(b.Events[1].Gateways) != 1 {
		t.Fatalf("batch %+v, %v", b, err)
	}
	w.Close()
	if _, err := w.Recv(); err == nil || err == io.EOF {
		t.Errorf("Recv after Close = %v, want a cancellation", err)
	}
	<-p.streamEnded
}
