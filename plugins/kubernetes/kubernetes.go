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

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sync/semaphore"

	"github.com/estuary-mesh/estuary/sdk"
)

// Version of the plugin.
const Version = "0.1.0"

// Factory builds the plugin. It runs nothing until Configure.
func Factory(rt sdk.Runtime) sdk.Plugin {
	p := &plugin{rt: rt, log: rt.Logger, turn: semaphore.NewWeighted(1)}
	if p.log == nil {
		p.log = hclog.NewNullLogger()
	}
	p.log = p.log.With("plugin", "kubernetes")
	return p
}

type plugin struct {
	rt  sdk.Runtime
	log hclog.Logger

	// turn admits one Configure (or Stop) at a time. Unlike a mutex, a
	// caller waiting for it gives up when its context ends, so clusters
	// that are slow to stop never hold a call beyond the host's deadline.
	turn *semaphore.Weighted
	key  string      // identity of the running configuration
	ctrl *controller // the last started controller, maybe stopping
}

var (
	_ sdk.Plugin  = (*plugin)(nil)
	_ sdk.Stopper = (*plugin)(nil)
)

var errShutDown = errors.New("plugin is shutting down")

func (p *plugin) Describe(context.Context, *sdk.DescribeRequest) (*sdk.DescribeResponse, error) {
	return &sdk.DescribeResponse{
		Name:    "kubernetes",
		Version: Version,
		Capabilities: []sdk.Capability{
			sdk.CapabilityReconfigure, sdk.CapabilityMultiInstance, sdk.CapabilityGateways,
			// Remote clusters are known only once the secrets are read.
			sdk.CapabilityInstanceSet,
		},
		ConfigSchema: schema,
	}, nil
}

// Configure starts the primary cluster and the remote secret watch, or, on
// a running plugin, replaces them when the config (or the kubeconfig file)
// changed. Instances survive a reconfigure: the new clients replace their
// content once synced, and only clusters no longer configured are removed.
// If the old clusters have not stopped when ctx ends, Configure returns
// ctx's error and the next call waits for them again.
func (p *plugin) Configure(ctx context.Context, req *sdk.ConfigureRequest) (*sdk.ConfigureResponse, error) {
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

	if err := p.turn.Acquire(ctx, 1); err != nil {
		return nil, fmt.Errorf("plugin \"kubernetes\": configure: %w", err)
	}
	defer p.turn.Release(1)
	if p.rt.Context.Err() != nil {
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
		if err := old.stop(ctx); err != nil {
			p.key = "" // the old controller is stopping: never keep it as is
			return nil, fmt.Errorf("plugin \"kubernetes\": configure: stop the previous clusters: %w", err)
		}
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

// Stop stops every cluster; the SDK calls it once the plugin's context
// has ended.
func (p *plugin) Stop(ctx context.Context) error {
	if err := p.turn.Acquire(ctx, 1); err != nil {
		return fmt.Errorf("plugin \"kubernetes\": stop: %w", err)
	}
	defer p.turn.Release(1)
	if p.ctrl != nil {
		return p.ctrl.stop(ctx)
	}
	return nil
}
