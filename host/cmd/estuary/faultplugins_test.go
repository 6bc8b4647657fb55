package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
	"github.com/estuary-mesh/estuary/sdk"
)

// Plugins that misbehave on purpose, for the fault suite. The test binary
// serves them as external plugins (ESTUARY_TEST_PLUGIN=MODE), so the host
// runs, watches and kills real processes.

// gateFactory serves `hostnames`, one endpoint each. Its Configure first
// waits for the file `gate` to exist (honouring the host's deadline), so a
// test can hold it in Configure for as long as it likes, or for ever; it
// refuses a hostname that is not a DNS name, as a plugin's own validation
// would.
func gateFactory(rt sdk.Runtime) sdk.Plugin { return &gatePlugin{rt: rt} }

type gatePlugin struct {
	rt sdk.Runtime
}

func (p *gatePlugin) Describe(context.Context, *sdk.DescribeRequest) (*sdk.DescribeResponse, error) {
	return &sdk.DescribeResponse{Name: "gate", Version: "test", Capabilities: []sdk.Capability{sdk.CapabilityReconfigure},
		ConfigSchema: &sdk.Schema{Attributes: []sdk.Attribute{
			{Name: "hostnames", Type: "list(string)", Required: true},
			{Name: "gate", Type: "string"},
			{Name: "entered", Type: "string"},
		}}}, nil
}

func (p *gatePlugin) Configure(ctx context.Context, req *sdk.ConfigureRequest) (*sdk.ConfigureResponse, error) {
	var cfg struct {
		Hostnames     []string
		Gate, Entered *string
	}
	if err := req.Decode(&cfg); err != nil {
		return nil, err
	}
	if cfg.Entered != nil {
		if err := os.WriteFile(*cfg.Entered, nil, 0o600); err != nil {
			return nil, err
		}
	}
	for cfg.Gate != nil {
		if _, err := os.Stat(*cfg.Gate); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	var d sdk.Diagnostics
	for i, h := range cfg.Hostnames {
		if h == "" || h[0] == '-' || h[len(h)-1] == '.' {
			d.Errorf([]string{"hostnames", strconv.Itoa(i)}, "%q is not a host name", h)
		}
	}
	if d.HasErrors() {
		return &sdk.ConfigureResponse{Diagnostics: d}, nil
	}
	id := sdk.InstanceID{Provider: "Gate", Cluster: "gate-cluster"}
	st := p.rt.State
	st.SetInstance(id, sdk.InstanceProperties{})
	snap := sdk.Snapshot{Endpoints: map[string][]sdk.Endpoint{}}
	for i, h := range cfg.Hostnames {
		snap.Services = append(snap.Services, &sdk.Service{Hostname: h, Ports: []sdk.Port{{Name: "http", Number: 80, Protocol: "HTTP"}}})
		snap.Endpoints[h] = []sdk.Endpoint{{Address: fmt.Sprintf("10.9.0.%d", i+1)}}
	}
	if err := st.ReplaceInstance(id, snap); err != nil {
		return nil, err
	}
	return &sdk.ConfigureResponse{}, st.MarkSynced(id)
}

// serveRaw serves a plugin that writes the Watch stream itself, bypassing
// sdk.State, to send what no SDK plugin can: a batch that breaks the
// protocol ("garbage"), or a stream of batches as fast as the host takes
// them ("flood").
func serveRaw(mode string) {
	goplugin.Serve(&goplugin.ServeConfig{
		HandshakeConfig: sdk.Handshake,
		VersionedPlugins: map[int]goplugin.PluginSet{
			sdk.ProtocolVersion: {sdk.PluginName: &rawPlugin{mode: mode}},
		},
		GRPCServer: func(opts []grpc.ServerOption) *grpc.Server {
			return grpc.NewServer(append(opts, grpc.ForceServerCodecV2(registryv1.Codec()))...)
		},
	})
}

type rawPlugin struct {
	goplugin.NetRPCUnsupportedPlugin
	mode string
}

func (p *rawPlugin) GRPCServer(_ *goplugin.GRPCBroker, s *grpc.Server) error {
	registryv1.RegisterRegistryServer(s, &rawServer{mode: p.mode})
	return nil
}

func (p *rawPlugin) GRPCClient(context.Context, *goplugin.GRPCBroker, *grpc.ClientConn) (any, error) {
	return nil, fmt.Errorf("server side only")
}

type rawServer struct {
	registryv1.UnimplementedRegistryServer
	mode string
}

func (s *rawServer) Describe(context.Context, *registryv1.DescribeRequest) (*registryv1.DescribeResponse, error) {
	return &registryv1.DescribeResponse{Name: s.mode, Version: "test", ProtocolVersion: sdk.ProtocolVersion}, nil
}

func (s *rawServer) Configure(context.Context, *registryv1.ConfigureRequest) (*registryv1.ConfigureResponse, error) {
	return &registryv1.ConfigureResponse{}, nil
}

// rawInstance is the raw plugins' one instance.
var rawInstance = &registryv1.InstanceID{Provider: "Raw", Cluster: "raw-cluster"}

func rawService(host string) *registryv1.Event {
	return &registryv1.Event{Instance: rawInstance, Kind: &registryv1.Event_ServiceUpserted{ServiceUpserted: &registryv1.ServiceUpserted{
		Service: &registryv1.Service{Hostname: host, Ports: []*registryv1.Port{{Name: "http", Number: 80, Protocol: "HTTP"}}},
	}}}
}

func rawEndpoints(host string, n int) *registryv1.Event {
	eps := make([]*registryv1.Endpoint, n)
	for i := range eps {
		eps[i] = &registryv1.Endpoint{Address: fmt.Sprintf("10.8.%d.%d", i/250, i%250+1)}
	}
	return &registryv1.Event{Instance: rawInstance, Kind: &registryv1.Event_EndpointsReplaced{EndpointsReplaced: &registryv1.EndpointsReplaced{Hostname: host, Endpoints: eps}}}
}

// Watch sends a good snapshot: raw.test with one endpoint. Then garbage
// sends, after a moment, a batch whose first event is valid (half.test)
// and whose second has no kind; flood sends endpoint sets of raw.test,
// alternating between 1 and 200 endpoints, as fast as the host reads them,
// until the stream ends.
func (s *rawServer) Watch(_ *registryv1.WatchRequest, stream grpc.ServerStreamingServer[registryv1.WatchResponse]) error {
	snapshot := &registryv1.WatchResponse{Sequence: 1, Snapshot: true, SnapshotDone: true, Events: []*registryv1.Event{
		{Instance: rawInstance, Kind: &registryv1.Event_InstanceAdded{InstanceAdded: &registryv1.InstanceAdded{Properties: &registryv1.InstanceProperties{}}}},
		rawService("raw.test"),
		rawEndpoints("raw.test", 1),
		{Instance: rawInstance, Kind: &registryv1.Event_InstanceSynced{InstanceSynced: &registryv1.InstanceSynced{}}},
	}}
	if err := stream.Send(snapshot); err != nil {
		return err
	}
	switch s.mode {
	case "garbage":
		select {
		case <-stream.Context().Done():
			return nil
		case <-time.After(500 * time.Millisecond):
		}
		if err := stream.Send(&registryv1.WatchResponse{Sequence: 2, Events: []*registryv1.Event{
			rawService("half.test"),
			{Instance: rawInstance},
		}}); err != nil {
			return err
		}
		<-stream.Context().Done()
		return nil
	case "flood":
		for seq := uint64(2); ; seq++ {
			n := 1
			if seq%2 == 1 {
				n = 200
			}
			if err := stream.Send(&registryv1.WatchResponse{Sequence: seq, Events: []*registryv1.Event{rawEndpoints("raw.test", n)}}); err != nil {
				return err
			}
		}
	}
	<-stream.Context().Done()
	return nil
}
