// Command estuary-plugin-hello is a third-party Estuary registry plugin,
// built only on the SDK. It reports one instance, Provider "Hello", with
// one service, hello.example.com, whose labels carry the configured
// greeting. Change plugins.hcl and send SIGHUP: it reconfigures in place.
package main

import (
	"context"
	"fmt"
	"sync"

	"github.com/estuary-mesh/estuary/sdk"
)

func main() { sdk.Serve(Factory) }

// Factory builds the plugin; the SDK hands it the State it publishes to.
func Factory(rt sdk.Runtime) sdk.Plugin { return &hello{state: rt.State} }

type hello struct {
	state *sdk.State
	mu    sync.Mutex
	id    sdk.InstanceID // the instance of the current config
}

func (*hello) Describe(context.Context, *sdk.DescribeRequest) (*sdk.DescribeResponse, error) {
	return &sdk.DescribeResponse{
		Name: "hello", Version: "0.1.0",
		Capabilities: []sdk.Capability{sdk.CapabilityReconfigure, sdk.CapabilityInstanceSet},
		ConfigSchema: &sdk.Schema{Attributes: []sdk.Attribute{
			{Name: "greeting", Type: "string", Required: true, Description: "shown as the service's greeting label"},
			{Name: "cluster", Type: "string", Description: "the instance's Cluster; defaults to mesh.cluster_id"},
		}},
	}, nil
}

func (h *hello) Configure(_ context.Context, req *sdk.ConfigureRequest) (*sdk.ConfigureResponse, error) {
	var cfg struct {
		Greeting string  `json:"greeting"`
		Cluster  *string `json:"cluster"` // null when unset
	}
	if err := req.Decode(&cfg); err != nil {
		return nil, fmt.Errorf("hello: decode config: %w", err)
	}
	id := sdk.InstanceID{Provider: "Hello", Cluster: req.Mesh.ClusterID}
	if cfg.Cluster != nil {
		id.Cluster = *cfg.Cluster
	}
	var diags sdk.Diagnostics // each problem points at its attribute
	if cfg.Greeting == "" {
		diags.Errorf([]string{"greeting"}, "greeting must not be empty")
	}
	if id.Cluster == "" {
		diags.Errorf([]string{"cluster"}, "cluster must not be empty")
	}
	if diags.HasErrors() { // keep serving the previous config
		return &sdk.ConfigureResponse{Diagnostics: diags}, nil
	}
	svc := &sdk.Service{Hostname: "hello.example.com", Namespace: "default", Name: "hello",
		Ports: []sdk.Port{{Name: "http", Number: 80, Protocol: "HTTP"}}, Labels: map[string]string{"greeting": cfg.Greeting}}
	eps := []sdk.Endpoint{{Address: "127.0.0.1", TargetPorts: map[string]uint32{"http": 8080}, Labels: map[string]string{"app": "hello"}}}

	h.mu.Lock()
	defer h.mu.Unlock()
	if h.id != (sdk.InstanceID{}) && h.id != id {
		h.state.RemoveInstance(h.id) // the cluster was renamed
	}
	h.id = id
	h.state.SetInstance(id, sdk.InstanceProperties{})
	h.state.InstanceSetComplete() // one instance: the set is complete
	// State works out what changed since the last Configure.
	snap := sdk.Snapshot{Services: []*sdk.Service{svc}, Endpoints: map[string][]sdk.Endpoint{svc.Hostname: eps}}
	if err := h.state.ReplaceInstance(id, snap); err != nil {
		return nil, fmt.Errorf("hello: %w", err)
	}
	return &sdk.ConfigureResponse{}, h.state.MarkSynced(id)
}
