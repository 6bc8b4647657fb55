package kubernetes

import (
	"cmp"
	"crypto/sha256"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/estuary-mesh/estuary/sdk"
)

// Defaults of the config block.
const (
	defaultClusterID         = "Kubernetes" // as in Istio
	defaultDomainSuffix      = "cluster.local"
	defaultTrustDomain       = "cluster.local"
	defaultSecretNamespace   = "istio-system"
	defaultRemoteSyncTimeout = 30 * time.Second
)

var schema = &sdk.Schema{Attributes: []sdk.Attribute{
	{Name: "kubeconfig", Type: "string", Description: "path of the primary cluster's kubeconfig; unset: $KUBECONFIG or ~/.kube/config, else the in-cluster config, as kubectl finds them"},
	{Name: "context", Type: "string", Description: "kubeconfig context of the primary cluster; unset means the current one"},
	{Name: "cluster_id", Type: "string", Description: `the primary cluster's ID; default mesh.cluster_id, else "Kubernetes"`},
	{Name: "network", Type: "string", Description: "default network of the primary cluster's endpoints; default mesh.network when the primary is mesh.cluster_id"},
	{Name: "domain_suffix", Type: "string", Description: `DNS suffix of service host names; default mesh.domain_suffix, else "cluster.local"`},
	{Name: "trust_domain", Type: "string", Description: `trust domain of workload identities (spiffe://TRUST_DOMAIN/ns/NS/sa/SA); default "cluster.local"`},
	{Name: "secret_namespace", Type: "string", Description: `namespace of remote secrets, and the system namespace whose topology.istio.io/network label names a cluster's network; default "istio-system"`},
	{Name: "discovery_namespaces", Type: "list(string)", Description: "label selectors; a namespace matching any is watched; empty means all"},
	{Name: "remote_sync_timeout", Type: sdk.TypeDuration, Description: `how long readiness waits for a remote cluster, and a rotated kubeconfig, to sync; default "30s"`},
	{Name: "allow_kubeconfig_options", Type: "list(string)", Description: "kubeconfig features remote secrets may use: " + strings.Join(kubeconfigOptions, ", ")},
	{Name: "mcs", Type: "bool", Description: "read Kubernetes Multi-Cluster Services (ServiceExport, ServiceImport, multicluster.x-k8s.io/v1alpha1) in every cluster: an exported Service is also NAME.NAMESPACE.svc.clusterset.local with the endpoints of the clusters that export it; default false (Istio's ENABLE_MCS_SERVICE_DISCOVERY and ENABLE_MCS_HOST)"},
	{Name: "clusterset_only", Type: "bool", Description: "with mcs: NAME.NAMESPACE.svc.cluster.local reaches only the client's own cluster, and only clusterset.local spans clusters; default false, cluster.local merges every cluster's endpoints (Istio's ENABLE_MCS_CLUSTER_LOCAL)"},
	{Name: "allowed_servers", Type: "list(string)", Description: "CIDRs or host names (*.example.com) remote API servers must be in; empty means any but link-local and metadata addresses and the host's own listen addresses"},
}}

// config is the decoded config block; unset attributes are nil.
type config struct {
	Kubeconfig             *string       `json:"kubeconfig"`
	Context                *string       `json:"context"`
	ClusterID              *string       `json:"cluster_id"`
	Network                *string       `json:"network"`
	DomainSuffix           *string       `json:"domain_suffix"`
	TrustDomain            *string       `json:"trust_domain"`
	SecretNamespace        *string       `json:"secret_namespace"`
	DiscoveryNamespaces    []string      `json:"discovery_namespaces"`
	RemoteSyncTimeout      *sdk.Duration `json:"remote_sync_timeout"`
	AllowKubeconfigOptions []string      `json:"allow_kubeconfig_options"`
	AllowedServers         []string      `json:"allowed_servers"`
	MCS                    *bool         `json:"mcs"`
	ClusterSetOnly         *bool         `json:"clusterset_only"`
}

// options is a validated config with defaults applied.
type options struct {
	kubeconfig, context string
	clusterID           string
	network             string
	domainSuffix        string
	trustDomain         string
	systemNamespace     string
	discovery           []labels.Selector // empty: every namespace
	remoteSyncTimeout   time.Duration
	policy              kubeconfigPolicy
	mcs                 bool // read ServiceExports and ServiceImports
	clusterSetOnly      bool // cluster.local is cluster-local
}

// parseConfig validates cfg, reporting every problem with its path.
func parseConfig(cfg *config, mesh sdk.MeshSettings) (*options, sdk.Diagnostics) {
	var diags sdk.Diagnostics
	o := &options{
		kubeconfig:        sdk.ValueOr(cfg.Kubeconfig, ""),
		context:           sdk.ValueOr(cfg.Context, ""),
		clusterID:         cmp.Or(sdk.ValueOr(cfg.ClusterID, ""), mesh.ClusterID, defaultClusterID),
		network:           sdk.ValueOr(cfg.Network, ""),
		domainSuffix:      strings.Trim(cmp.Or(sdk.ValueOr(cfg.DomainSuffix, ""), mesh.DomainSuffix, defaultDomainSuffix), "."),
		trustDomain:       cmp.Or(sdk.ValueOr(cfg.TrustDomain, ""), defaultTrustDomain),
		systemNamespace:   cmp.Or(sdk.ValueOr(cfg.SecretNamespace, ""), defaultSecretNamespace),
		remoteSyncTimeout: defaultRemoteSyncTimeout,
		policy:            kubeconfigPolicy{allowed: map[string]bool{}, hostAddrs: mesh.HostAddresses},
	}
	o.mcs, o.clusterSetOnly = sdk.ValueOr(cfg.MCS, false), sdk.ValueOr(cfg.ClusterSetOnly, false)
	if o.clusterSetOnly && !o.mcs {
		diags.Errorf([]string{"clusterset_only"}, "clusterset_only needs mcs = true: without MCS no host spans clusters, and cluster.local confined to one would leave none")
	}
	if o.mcs && o.domainSuffix == clusterSetDomain {
		diags.Errorf([]string{"domain_suffix"}, "domain_suffix %q is the MCS clusterset domain; with mcs, cluster hosts need another", o.domainSuffix)
	}
	if cfg.ClusterID != nil && *cfg.ClusterID == "" {
		diags.Errorf([]string{"cluster_id"}, "cluster_id must not be empty")
	}
	// mesh.network is the host's own cluster's network: a primary that is
	// another cluster (cluster_id set) does not inherit it.
	o.network = cmp.Or(o.network, mesh.NetworkOf(o.clusterID))
	if msgs := validation.IsDNS1123Subdomain(o.domainSuffix); len(msgs) > 0 {
		diags.Errorf([]string{"domain_suffix"}, "domain_suffix %q is not a DNS name: %s", o.domainSuffix, strings.Join(msgs, "; "))
	}
	if msgs := validation.IsDNS1123Label(o.systemNamespace); len(msgs) > 0 {
		diags.Errorf([]string{"secret_namespace"}, "secret_namespace %q is not a namespace name: %s", o.systemNamespace, strings.Join(msgs, "; "))
	}
	for i, s := range cfg.DiscoveryNamespaces {
		sel, err := labels.Parse(s)
		if err != nil {
			diags.Errorf([]string{"discovery_namespaces", strconv.Itoa(i)}, "discovery_namespaces[%d] is not a label selector: %v", i, err)
			continue
		}
		if sel.Empty() {
			diags.Errorf([]string{"discovery_namespaces", strconv.Itoa(i)}, "discovery_namespaces[%d] is empty; leave the list empty to watch every namespace", i)
			continue
		}
		o.discovery = append(o.discovery, sel)
	}
	if cfg.RemoteSyncTimeout != nil {
		switch d := cfg.RemoteSyncTimeout.Duration; {
		case d <= 0:
			diags.Errorf([]string{"remote_sync_timeout"}, "remote_sync_timeout must be positive, not %s", d)
		default:
			o.remoteSyncTimeout = d
		}
	}
	for i, opt := range cfg.AllowKubeconfigOptions {
		if opt == "auth-provider" || opt == "idp-certificate-authority" {
			diags.Errorf([]string{"allow_kubeconfig_options", strconv.Itoa(i)}, "%q: %s", opt, noAuthProvider)
			continue
		}
		if !slices.Contains(kubeconfigOptions, opt) {
			diags.Errorf([]string{"allow_kubeconfig_options", strconv.Itoa(i)}, "unknown kubeconfig option %q (want one of %s)", opt, strings.Join(kubeconfigOptions, ", "))
			continue
		}
		o.policy.allowed[opt] = true
	}
	if len(cfg.AllowedServers) > 0 {
		servers, errs := parseAllowedServers(cfg.AllowedServers)
		for i := range cfg.AllowedServers {
			if err := errs[i]; err != nil {
				diags.Errorf([]string{"allowed_servers", strconv.Itoa(i)}, "allowed_servers[%d]: %v", i, err)
			}
		}
		o.policy.servers = servers
	}
	return o, diags
}

// primaryConfig loads the primary cluster's client config as kubectl finds
// it, with client-go's own loading rules: the kubeconfig file if one is
// set; else $KUBECONFIG or ~/.kube/config; else, in a pod, the in-cluster
// config. The serviceentry plugin follows the same rule. It also returns
// a digest of the loaded kubeconfig, so that a reconfigure notices a
// changed file (zero for the in-cluster config).
func primaryConfig(o *options) (*rest.Config, [32]byte, sdk.Diagnostics) {
	var diags sdk.Diagnostics
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = o.kubeconfig
	loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: o.context})
	raw, err := loader.RawConfig()
	if err != nil {
		diags.Errorf([]string{"kubeconfig"}, "load kubeconfig: %v", err)
		return nil, [32]byte{}, diags
	}
	if o.context != "" && raw.Contexts[o.context] == nil {
		diags.Errorf([]string{"context"}, "kubeconfig %s has no context %q", kubeconfigFiles(rules), o.context)
		return nil, [32]byte{}, diags
	}
	rc, err := loader.ClientConfig()
	if err != nil {
		if o.kubeconfig == "" && clientcmd.IsEmptyConfig(err) {
			diags.Errorf([]string{"kubeconfig"}, "no kubeconfig set, none at $KUBECONFIG or ~/.kube/config, and not running in a cluster")
		} else {
			diags.Errorf([]string{"kubeconfig"}, "kubeconfig %s: %v", kubeconfigFiles(rules), err)
		}
		return nil, [32]byte{}, diags
	}
	var digest [32]byte
	if len(raw.Clusters) > 0 {
		// The files' content, merged: a rotated token or certificate
		// changes it. It stays in memory; only its hash is kept.
		if data, err := clientcmd.Write(raw); err == nil {
			digest = sha256.Sum256(data)
		}
	}
	return rc, digest, diags
}

// kubeconfigFiles names the files the loading rules read, for messages.
func kubeconfigFiles(rules *clientcmd.ClientConfigLoadingRules) string {
	if rules.ExplicitPath != "" {
		return rules.ExplicitPath
	}
	return strings.Join(rules.GetLoadingPrecedence(), ":")
}

// configKey identifies a configuration: Configure with the same key again
// changes nothing.
func configKey(req *sdk.ConfigureRequest, kubeconfigDigest [32]byte) string {
	return fmt.Sprintf("%x|%s|%s|%s|%x", sha256.Sum256(req.ConfigJSON), req.Mesh.ClusterID, req.Mesh.Network, req.Mesh.DomainSuffix, kubeconfigDigest)
}
