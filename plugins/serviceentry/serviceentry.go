// Package serviceentry is the registry of Istio ServiceEntry and
// WorkloadEntry objects, read unchanged (istio.io/api types, API versions
// networking.istio.io/v1, v1beta1 and v1alpha3) from a watched directory of
// YAML files and, optionally, from a Kubernetes cluster's CRDs.
//
// The plugin reports one instance, Provider "ServiceEntry", whose Cluster is
// the configured cluster_id. Every host of an entry becomes a service;
// inline endpoints, the WorkloadEntries an entry selects, or (for DNS
// resolution without either) the host itself become its endpoints. An
// object that is invalid is skipped and listed in the instance's health
// notices, with its file, document and field path; a file that turns
// invalid keeps serving its last good objects until it is fixed.
package serviceentry

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sync/semaphore"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/estuary-mesh/estuary/sdk"
)

// Version of the plugin.
const Version = "0.1.0"

// Name of the plugin.
const Name = "serviceentry"

// Factory builds the plugin.
func Factory(rt sdk.Runtime) sdk.Plugin {
	logger := rt.Logger
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &plugin{ctx: rt.Context, logger: logger, state: rt.State, turn: semaphore.NewWeighted(1)}
}

type plugin struct {
	ctx    context.Context
	logger hclog.Logger
	state  *sdk.State

	// turn admits one Configure (or Stop) at a time; a caller waiting for
	// it gives up when its context ends, so a runner that is slow to stop
	// never holds a call beyond the host's deadline.
	turn *semaphore.Weighted
	run  *runner // the last started runner, maybe stopping; nil before the first Configure
}

var (
	_ sdk.Plugin  = (*plugin)(nil)
	_ sdk.Stopper = (*plugin)(nil)
)

var configSchema = &sdk.Schema{
	Attributes: []sdk.Attribute{
		{Name: "dir", Type: "string", Description: "directory of YAML files holding ServiceEntry and WorkloadEntry objects; watched"},
		{Name: "cluster_id", Type: "string", Description: "the instance's cluster identity; defaults to mesh.cluster_id"},
		{Name: "network", Type: "string", Description: "default network of the endpoints; defaults to mesh.network when cluster_id is mesh.cluster_id, else none (the networks block decides)"},
		{Name: "default_namespace", Type: "string", Description: `namespace of file objects that name none (default "default")`},
	},
	Blocks: []sdk.Block{{
		TypeName:    "kubernetes",
		Single:      true,
		Description: "also watch the ServiceEntry and WorkloadEntry CRDs of a cluster",
		Body: sdk.Schema{Attributes: []sdk.Attribute{
			{Name: "kubeconfig", Type: "string", Description: "path of a kubeconfig; unset: $KUBECONFIG or ~/.kube/config, else the in-cluster config, as kubectl finds them"},
			{Name: "namespaces", Type: "list(string)", Description: "namespaces to watch; default: all"},
		}},
	}},
}

type config struct {
	Dir              *string      `json:"dir"`
	ClusterID        *string      `json:"cluster_id"`
	Network          *string      `json:"network"`
	DefaultNamespace *string      `json:"default_namespace"`
	Kubernetes       []kubeConfig `json:"kubernetes"`
}

type kubeConfig struct {
	Kubeconfig *string  `json:"kubeconfig"`
	Namespaces []string `json:"namespaces"`
}

func (p *plugin) Describe(context.Context, *sdk.DescribeRequest) (*sdk.DescribeResponse, error) {
	return &sdk.DescribeResponse{
		Name:         Name,
		Version:      Version,
		Capabilities: []sdk.Capability{sdk.CapabilityReconfigure, sdk.CapabilityInstanceSet},
		ConfigSchema: configSchema,
	}, nil
}

// settings is a checked configuration.
type settings struct {
	id    sdk.InstanceID
	props sdk.InstanceProperties
	dir   string
	ns    string // default namespace of file objects
	kube  *kubeSettings
}

type kubeSettings struct {
	rest       *rest.Config
	namespaces []string
}

// Configure replaces the running sources. The old ones stop before the new
// ones publish, and the state they published stays until then; if they have
// not stopped when ctx ends, Configure returns ctx's error and the next
// call waits for them again.
func (p *plugin) Configure(ctx context.Context, req *sdk.ConfigureRequest) (*sdk.ConfigureResponse, error) {
	var cfg config
	if err := req.Decode(&cfg); err != nil {
		return nil, fmt.Errorf("serviceentry: decode config: %w", err)
	}
	s, diags := check(&cfg, req.Mesh)
	if diags.HasErrors() {
		return &sdk.ConfigureResponse{Diagnostics: diags}, nil
	}
	if err := p.turn.Acquire(ctx, 1); err != nil {
		return nil, fmt.Errorf("serviceentry: configure: %w", err)
	}
	defer p.turn.Release(1)
	if p.run != nil {
		if err := p.run.group.Stop(ctx); err != nil {
			return nil, fmt.Errorf("serviceentry: configure: stop the previous sources: %w", err)
		}
		if p.run.id != s.id {
			p.state.RemoveInstance(p.run.id)
		}
	}
	p.state.SetInstance(s.id, s.props)
	p.state.InstanceSetComplete() // its one instance is the whole set
	logger := p.logger.With("provider", s.id.Provider, "cluster", s.id.Cluster)
	var sources []source
	if s.dir != "" {
		sources = append(sources, newFileSource(s.dir, s.ns, logger.Named("files")))
	}
	if s.kube != nil {
		sources = append(sources, newKubeSource(s.kube, logger.Named("kubernetes")))
	}
	p.run = startRunner(p.ctx, p.state, s.id, sources, logger)
	return &sdk.ConfigureResponse{Diagnostics: diags}, nil
}

// check validates the config and fills in defaults.
func check(cfg *config, mesh sdk.MeshSettings) (*settings, sdk.Diagnostics) {
	var diags sdk.Diagnostics
	cluster := sdk.ValueOr(cfg.ClusterID, mesh.ClusterID)
	s := &settings{
		id:    sdk.InstanceID{Provider: sdk.ProviderServiceEntry, Cluster: cluster},
		props: sdk.InstanceProperties{DefaultNetwork: sdk.ValueOr(cfg.Network, mesh.NetworkOf(cluster))},
		dir:   sdk.ValueOr(cfg.Dir, ""),
		ns:    sdk.ValueOr(cfg.DefaultNamespace, "default"),
	}
	if s.id.Cluster == "" {
		diags.Errorf([]string{"cluster_id"}, "cluster_id must not be empty (set it, or mesh.cluster_id)")
	}
	if msgs := validation.IsDNS1123Label(s.ns); len(msgs) > 0 {
		diags.Errorf([]string{"default_namespace"}, "%q is not a namespace name: %s", s.ns, strings.Join(msgs, "; "))
	}
	if cfg.Dir != nil {
		switch fi, err := os.Stat(s.dir); {
		case s.dir == "":
			diags.Errorf([]string{"dir"}, "dir must not be empty")
		case err != nil:
			diags.Errorf([]string{"dir"}, "directory %s: %v", s.dir, err)
		case !fi.IsDir():
			diags.Errorf([]string{"dir"}, "%s is not a directory", s.dir)
		}
	}
	if len(cfg.Kubernetes) > 0 {
		kc := cfg.Kubernetes[0]
		s.kube = &kubeSettings{namespaces: slices.Clone(kc.Namespaces)}
		rc, err := restConfig(sdk.ValueOr(kc.Kubeconfig, ""))
		if err != nil {
			diags.Errorf([]string{"kubernetes", "0", "kubeconfig"}, "%v", err)
		}
		s.kube.rest = rc
		for i, ns := range kc.Namespaces {
			if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
				diags.Errorf([]string{"kubernetes", "0", "namespaces"}, "namespaces[%d]: %q is not a namespace name: %s", i, ns, strings.Join(msgs, "; "))
			}
		}
	}
	if cfg.Dir == nil && s.kube == nil {
		diags.Errorf(nil, "nothing to watch: set dir, add a kubernetes block, or both")
	}
	return s, diags
}

// restConfig finds the cluster's client config as kubectl does, with
// client-go's own loading rules: the kubeconfig at path; with no path,
// $KUBECONFIG or ~/.kube/config, and without those the in-cluster config
// (KUBERNETES_SERVICE_HOST and the pod's service account). The kubernetes
// plugin follows the same rule.
func restConfig(path string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = path
	c, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	switch {
	case err == nil:
		return c, nil
	case path != "":
		return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	return nil, fmt.Errorf("no kubeconfig set, none at $KUBECONFIG or ~/.kube/config, and not running in a cluster: %w", err)
}

// source feeds objects to a runner.
type source interface {
	// run watches the source until ctx ends, calling changed after every
	// change of its contents.
	run(ctx context.Context, changed func())
	// contents returns what the source holds now.
	contents() contents
}

// contents is what a source holds.
type contents struct {
	// objects are the accepted objects, in the source's order.
	objects []*object
	// notices list rejected objects.
	notices []sdk.Notice
	// synced is set once the source has been read completely.
	synced bool
	// problem is set while the source cannot be read; its last objects
	// stay served.
	problem string
}

// maxNotices bounds the notices reported in the instance's health.
const maxNotices = 1000

// Coalescing of changes: a build waits until sources have been quiet for
// settle, but no longer than maxSettle after the first change.
const (
	settle    = 10 * time.Millisecond
	maxSettle = 250 * time.Millisecond
)

// runner runs the sources of one configuration and publishes what they hold
// into the State.
type runner struct {
	id      sdk.InstanceID
	state   *sdk.State
	logger  hclog.Logger
	sources []source
	kick    chan struct{}
	group   *sdk.Run // the sources and the publishing loop
	synced  bool
}

func startRunner(parent context.Context, state *sdk.State, id sdk.InstanceID, sources []source, logger hclog.Logger) *runner {
	r := &runner{id: id, state: state, logger: logger, sources: sources,
		kick: make(chan struct{}, 1), group: sdk.StartRun(parent)}
	for _, s := range sources {
		r.group.Go(func(ctx context.Context) { s.run(ctx, r.changed) })
	}
	r.group.Go(r.loop)
	return r
}

// Stop waits for the sources to end; the SDK calls it once the plugin's
// context has ended.
func (p *plugin) Stop(ctx context.Context) error {
	if err := p.turn.Acquire(ctx, 1); err != nil {
		return fmt.Errorf("serviceentry: stop: %w", err)
	}
	defer p.turn.Release(1)
	if p.run != nil {
		return p.run.group.Stop(ctx)
	}
	return nil
}

func (r *runner) changed() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

func (r *runner) loop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
		}
		deadline := time.Now().Add(maxSettle)
		for quiet := false; !quiet; {
			t := time.NewTimer(min(settle, time.Until(deadline)))
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-r.kick:
				t.Stop()
				quiet = !time.Now().Before(deadline)
			case <-t.C:
				quiet = true
			}
		}
		if err := r.publish(); err != nil {
			r.logger.Error("cannot publish the instance", "error", err)
		}
	}
}

// publish builds the instance from every source and hands it to the State.
// Nothing but health is published until every source has synced, so the
// host never sees a half-read registry.
func (r *runner) publish() error {
	var (
		objs     []*object
		notices  []sdk.Notice
		problems []string
		synced   = true
	)
	for _, s := range r.sources {
		c := s.contents()
		objs = append(objs, c.objects...)
		notices = append(notices, c.notices...)
		synced = synced && c.synced
		if c.problem != "" {
			problems = append(problems, c.problem)
		}
	}
	health := sdk.InstanceHealth{Healthy: len(problems) == 0, Message: strings.Join(problems, "; ")}
	if synced {
		snap, more := build(r.id.Cluster, objs)
		notices = append(notices, more...)
		if err := r.state.ReplaceInstance(r.id, snap); err != nil {
			return fmt.Errorf("serviceentry: publish %s: %w", r.id, err)
		}
		if !r.synced {
			n := 0
			for _, eps := range snap.Endpoints {
				n += len(eps)
			}
			r.logger.Info("synced", "services", len(snap.Services), "endpoints", n, "rejected", len(notices))
		}
	}
	sortNotices(notices)
	capped := sdk.NoticeList{Max: maxNotices, Subject: "notices"}
	capped.Add(notices...)
	health.Notices = capped.List()
	if err := r.state.SetHealth(r.id, health); err != nil {
		return fmt.Errorf("serviceentry: health of %s: %w", r.id, err)
	}
	if synced && !r.synced {
		r.synced = true
		return r.state.MarkSynced(r.id)
	}
	return nil
}

func sortNotices(ns []sdk.Notice) {
	slices.SortStableFunc(ns, func(a, b sdk.Notice) int {
		if c := strings.Compare(a.Subject, b.Subject); c != 0 {
			return c
		}
		return strings.Compare(a.Message, b.Message)
	})
}
