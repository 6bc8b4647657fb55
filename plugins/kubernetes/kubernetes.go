// Package kubernetes is the Kubernetes multicluster registry. It reports one
// instance per cluster, with Provider "Kubernetes" and the cluster ID as
// Cluster: the primary cluster, read through the plugin's kubeconfig (or the
// in-cluster config), and every member cluster that a Secret labelled
// istio/multiCluster=true in the primary's secret namespace registers, as
// `istioctl x create-remote-secret` writes them.
//
// Each cluster is read with client-go shared informers on Services,
// EndpointSlices, Pods, Nodes and Namespaces. Services become
// NAME.NAMESPACE.svc.DOMAIN_SUFFIX with the cluster's VIPs, external
// addresses and node ports; ready EndpointSlice endpoints become endpoints
// with the pod's labels, service account and TLS mode, the node's locality
// and the network of the pod, the cluster or the config. Services labelled
// topology.istio.io/network are the cluster's east-west gateways.
//
// Member clusters are added, rotated (make-before-break: the new client
// syncs before the old one stops, so endpoints never vanish) and removed
// at run time. A cluster that cannot be reached keeps its last-known state
// and is reported unhealthy. Kubeconfigs from secrets may not run programs
// or read local files unless allow_kubeconfig_options says so.
package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/hashicorp/go-hclog"

	"github.com/estuary-mesh/estuary/sdk"
)

// Version of the plugin.
const Version = "0.1.0"

// Factory builds the plugin. It runs nothing until Configure.
func Factory(rt sdk.Runtime) sdk.Plugin {
	p := &plugin{rt: rt, log: rt.Logger}
	if p.log == nil {
		p.log = hclog.NewNullLogger()
	}
	p.log = p.log.With("plugin", "kubernetes")
	go func() {
		<-rt.Context.Done()
		p.shutdown()
	}()
	return p
}

type plugin struct {
	rt  sdk.Runtime
	log hclog.Logger

	mu     sync.Mutex
	closed bool
	key    string // identity of the running configuration
	ctrl   *controller
}

var _ sdk.Plugin = (*plugin)(nil)

var errShutDown = errors.New("plugin is shutting down")

func (p *plugin) Describe(context.Context, *sdk.DescribeRequest) (*sdk.DescribeResponse, error) {
	return &sdk.DescribeResponse{
		Name:    "kubernetes",
		Version: Version,
		Capabilities: []sdk.Capability{
			sdk.CapabilityReconfigure, sdk.CapabilityMultiInstance, sdk.CapabilityGateways,
		},
		ConfigSchema: schema,
	}, nil
}

// Configure starts the primary cluster and the remote secret watch, or, on
// a running plugin, replaces them when the config (or the kubeconfig file)
// changed. Instances survive a reconfigure: the new clients replace their
// content once synced, and only clusters no longer configured are removed.
func (p *plugin) Configure(_ context.Context, req *sdk.ConfigureRequest) (*sdk.ConfigureResponse, error) {
	var cfg config
	if err := req.Decode(&cfg); err != nil {
		return nil, fmt.Errorf("plugin \"kubernetes\": configure: decode config: %w", err)
	}
	opts, diags := parseConfig(&cfg, req.Mesh)
	if diags.HasErrors() {
		return &sdk.ConfigureResponse{Diagnostics: diags}, nil
	}
	rc, digest, more := primaryConfig(opts)
	diags = append(diags, more...)
	if diags.HasErrors() {
		return &sdk.ConfigureResponse{Diagnostics: diags}, nil
	}
	key := configKey(req, digest)

	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, fmt.Errorf("plugin \"kubernetes\": configure: %w", errShutDown)
	}
	if key == p.key {
		return &sdk.ConfigureResponse{Diagnostics: diags}, nil
	}
	ctrl, err := newController(p.rt.Context, opts, rc, p.rt.State, p.log)
	if err != nil {
		diags.Errorf([]string{"kubeconfig"}, "%v", err)
		return &sdk.ConfigureResponse{Diagnostics: diags}, nil
	}
	var inherited []string
	if old := p.ctrl; old != nil {
		old.stop()
		inherited = old.clusterIDs()
		if old.opts.clusterID != opts.clusterID {
			p.log.Info("primary cluster ID changed; removing the old instance", "cluster", old.opts.clusterID)
			p.rt.State.RemoveInstance(sdk.InstanceID{Provider: sdk.ProviderKubernetes, Cluster: old.opts.clusterID})
		}
	}
	p.ctrl, p.key = ctrl, key
	ctrl.start(inherited)
	p.log.Info("configured", "cluster", opts.clusterID, "server", rc.Host)
	return &sdk.ConfigureResponse{Diagnostics: diags}, nil
}

func (p *plugin) shutdown() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	if p.ctrl != nil {
		p.ctrl.stop()
		p.ctrl = nil
	}
}
