// Package pluginclient is the host's side of the registry protocol: a typed
// Go client for a registry plugin, as Nomad's base plugin client is for its
// plugins. A host dispenses it through go-plugin ([Plugin] is the
// go-plugin glue) and never sees a generated protocol type:
//
//	raw, _ := rpcClient.Dispense(sdk.PluginName)
//	c := raw.(*pluginclient.Client)
//	desc, err := c.Describe(ctx, &pluginclient.DescribeRequest{})
//	...
//	w, err := c.Watch(ctx, &pluginclient.WatchRequest{Capabilities: desc.Capabilities})
//	for {
//		b, err := w.Recv() // a whole batch, validated and decoded
//		...
//	}
//
// The client does not trust the plugin: every Watch response is checked
// against the protocol, and against the capabilities the plugin declared,
// before any of it is returned. The same checks back sdk/sdktest, so a
// plugin that passes its conformance suite passes the host.
package pluginclient

import (
	"context"
	"errors"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/configschema"
	"github.com/estuary-mesh/estuary/sdk/internal/stream"
)

// Plugin is the go-plugin glue on the host's side: dispensing
// [sdk.PluginName] from a client configured with it yields a *[Client].
// Plugins serve with sdk.Serve, whose own glue is sdk.GRPCPlugin.
type Plugin struct {
	plugin.NetRPCUnsupportedPlugin
}

var _ plugin.GRPCPlugin = (*Plugin)(nil)

// GRPCServer refuses: this glue is only ever the client side.
func (*Plugin) GRPCServer(*plugin.GRPCBroker, *grpc.Server) error {
	return errors.New("pluginclient.Plugin is the host's side of the registry protocol; plugins serve with sdk.Serve")
}

// GRPCClient returns a *Client on the plugin's connection.
func (*Plugin) GRPCClient(_ context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return New(c), nil
}

// PluginSet is what a host passes to go-plugin to dispense a *Client: as
// VersionedPlugins (keyed by sdk.ProtocolVersion) when it starts a plugin,
// or as Plugins when it reattaches to a running one.
func PluginSet() plugin.PluginSet { return plugin.PluginSet{sdk.PluginName: &Plugin{}} }

// Client calls one registry plugin. Its methods are safe for concurrent use.
// Errors from the plugin are gRPC statuses, returned as they are, so that
// a caller can wrap them in its own view ("plugin \"consul\": configure: ...")
// and still match their codes.
type Client struct {
	rpc registryv1.RegistryClient
}

// New returns a client on a connection to a plugin, dialled with
// sdk.ClientDialOptions. Hosts usually get one from go-plugin through
// [Plugin] instead.
func New(conn grpc.ClientConnInterface) *Client {
	return &Client{rpc: registryv1.NewRegistryClient(conn)}
}

// DescribeRequest is empty today; fields may be added.
type DescribeRequest struct{}

// DescribeResponse identifies the plugin.
type DescribeResponse struct {
	Name    string
	Version string
	// ProtocolVersion is the registry protocol the plugin says it speaks;
	// a host refuses a plugin whose version differs from the negotiated one.
	ProtocolVersion uint32
	// Capabilities are the optional features the plugin declared. Pass them
	// to Watch: events that need any other are protocol errors.
	Capabilities []sdk.Capability
	// ConfigSchema is the shape of the plugin's `config { }` block.
	ConfigSchema *sdk.Schema
}

// HasCapability reports whether the plugin declared c.
func (r *DescribeResponse) HasCapability(c sdk.Capability) bool {
	for _, x := range r.Capabilities {
		if x == c {
			return true
		}
	}
	return false
}

// Describe asks the plugin who it is and what config it takes.
func (c *Client) Describe(ctx context.Context, _ *DescribeRequest) (*DescribeResponse, error) {
	d, err := c.rpc.Describe(ctx, &registryv1.DescribeRequest{})
	if err != nil {
		return nil, err
	}
	out := &DescribeResponse{
		Name:            d.GetName(),
		Version:         d.GetVersion(),
		ProtocolVersion: d.GetProtocolVersion(),
		ConfigSchema:    configschema.FromProto(d.GetConfigSchema()),
	}
	for _, x := range d.GetCapabilities() {
		if x != registryv1.Capability_CAPABILITY_UNSPECIFIED {
			out.Capabilities = append(out.Capabilities, sdk.Capability(x))
		}
	}
	return out, nil
}

// ConfigureRequest carries the plugin's config block, decoded by the host
// against the plugin's schema.
type ConfigureRequest struct {
	// ConfigJSON is the block as the proto's ConfigureRequest.config_json
	// describes it (configschema.Decode produces it).
	ConfigJSON []byte
	// Mesh holds mesh-wide defaults from the host's `mesh { }` block.
	Mesh sdk.MeshSettings
}

// ConfigureResponse reports the problems the plugin found in its config.
// An error diagnostic means the plugin kept its previous config.
type ConfigureResponse struct {
	Diagnostics sdk.Diagnostics
}

// Configure hands the plugin its config.
func (c *Client) Configure(ctx context.Context, req *ConfigureRequest) (*ConfigureResponse, error) {
	resp, err := c.rpc.Configure(ctx, &registryv1.ConfigureRequest{
		ConfigJson: req.ConfigJSON,
		Mesh: &registryv1.MeshSettings{DomainSuffix: req.Mesh.DomainSuffix, ClusterId: req.Mesh.ClusterID, Network: req.Mesh.Network,
			HostAddresses: req.Mesh.HostAddresses},
	})
	if err != nil {
		return nil, err
	}
	out := &ConfigureResponse{}
	for _, d := range resp.GetDiagnostics() {
		out.Diagnostics = append(out.Diagnostics, sdk.Diagnostic{
			Severity: sdk.Severity(d.GetSeverity()), Summary: d.GetSummary(), Detail: d.GetDetail(), Path: d.GetPath(),
		})
	}
	return out, nil
}

// WatchRequest opens a Watch stream.
type WatchRequest struct {
	// Capabilities the plugin declared in Describe. An event that needs a
	// capability not listed here is a protocol error: a plugin is held to
	// what it declared.
	Capabilities []sdk.Capability
}

// WatchStream is one Watch stream: the plugin's snapshot, then deltas.
type WatchStream struct {
	stream  grpc.ServerStreamingClient[registryv1.WatchResponse]
	cancel  context.CancelFunc
	decoder *stream.Decoder
	err     error
}

// Watch opens a stream of the plugin's state. The stream lives until ctx
// ends, Close is called, or Recv returns an error.
func (c *Client) Watch(ctx context.Context, req *WatchRequest) (*WatchStream, error) {
	ctx, cancel := context.WithCancel(ctx)
	s, err := c.rpc.Watch(ctx, &registryv1.WatchRequest{})
	if err != nil {
		cancel()
		return nil, err
	}
	return &WatchStream{stream: s, cancel: cancel, decoder: stream.NewDecoder(req.Capabilities)}, nil
}

// Recv returns the next batch, whole: it has been checked against the
// protocol before any of it is returned, so a caller can apply it
// atomically. A response that breaks the protocol ends the stream: Recv
// returns a *ProtocolError naming the offending batch and event, and the
// stream is cancelled so the plugin stops sending. Once Recv has returned
// an error (io.EOF when the plugin closed the stream), it returns the same
// error on every later call.
func (w *WatchStream) Recv() (*Batch, error) {
	if w.err != nil {
		return nil, w.err
	}
	resp, err := w.stream.Recv()
	if err == nil {
		var b *Batch
		if b, err = w.decoder.Decode(resp); err == nil {
			return b, nil
		}
	}
	w.err = err
	w.cancel()
	return nil, err
}

// Close ends the stream.
func (w *WatchStream) Close() { w.cancel() }
