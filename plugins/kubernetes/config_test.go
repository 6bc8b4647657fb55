package kubernetes

import (
	"cmp"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/configschema"
)

func decodeConfig(t *testing.T, hcl string) *config {
	t.Helper()
	js, diags := configschema.ParseHCL("plugins.hcl", []byte(hcl), schema)
	if diags.HasErrors() {
		t.Fatalf("schema decode: %v", diags)
	}
	var cfg config
	if err := (&sdk.ConfigureRequest{ConfigJSON: js}).Decode(&cfg); err != nil {
		t.Fatal(err)
	}
	return &cfg
}

func TestConfigDefaults(t *testing.T) {
	tests := []struct {
		name, hcl string
		mesh      sdk.MeshSettings
		check     func(t *testing.T, o *options)
	}{
		{"istio defaults", ``, sdk.MeshSettings{}, func(t *testing.T, o *options) {
			if o.clusterID != "Kubernetes" || o.domainSuffix != "cluster.local" || o.systemNamespace != "istio-system" ||
				o.remoteSyncTimeout != 30*time.Second || o.network != "" || len(o.discovery) != 0 || o.policy.servers != nil || len(o.policy.allowed) != 0 {
				t.Errorf("options = %+v", o)
			}
		}},
		{"mesh settings fill in", ``, sdk.MeshSettings{ClusterID: "east", Network: "n-east", DomainSuffix: "corp.local"}, func(t *testing.T, o *options) {
			if o.clusterID != "east" || o.network != "n-east" || o.domainSuffix != "corp.local" {
				t.Errorf("options = %+v", o)
			}
		}},
		{"a primary that is another cluster does not inherit mesh.network", `cluster_id = "west"`, sdk.MeshSettings{ClusterID: "east", Network: "n-east"}, func(t *testing.T, o *options) {
			if o.clusterID != "west" || o.network != "" {
				t.Errorf("cluster %q network %q, want west and no network (the host's networks block decides)", o.clusterID, o.network)
			}
		}},
		{"config wins over mesh", `
cluster_id = "c1"
network = "net1"
domain_suffix = "example.local."
secret_namespace = "mesh-system"
remote_sync_timeout = "1m30s"
discovery_namespaces = ["env=prod", "team in (a, b)"]
allow_kubeconfig_options = ["exec", "tokenFile"]
allowed_servers = ["10.0.0.0/8", "*.example.com"]
`, sdk.MeshSettings{ClusterID: "east", Network: "n-east"}, func(t *testing.T, o *options) {
			if o.clusterID != "c1" || o.network != "net1" || o.domainSuffix != "example.local" || o.systemNamespace != "mesh-system" ||
				o.remoteSyncTimeout != 90*time.Second || len(o.discovery) != 2 || !o.policy.allowed["exec"] || !o.policy.allowed["tokenFile"] ||
				o.policy.allowed["client-key"] || o.policy.servers == nil || !o.policy.servers.allows("api.example.com") {
				t.Errorf("options = %+v", o)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, diags := parseConfig(decodeConfig(t, tt.hcl), tt.mesh)
			if diags.HasErrors() {
				t.Fatalf("diagnostics: %v", diags)
			}
			tt.check(t, o)
		})
	}
}

func TestConfigValidation(t *testing.T) {
	tests := []struct {
		name, hcl string
		wantPath  []string
		wantMsg   string
	}{
		{"negative duration", `remote_sync_timeout = "-1s"`, []string{"remote_sync_timeout"}, "must be positive"},
		{"bad selector", `discovery_namespaces = ["env=prod", "env in prod"]`, []string{"discovery_namespaces", "1"}, "is not a label selector"},
		{"empty selector", `discovery_namespaces = [""]`, []string{"discovery_namespaces", "0"}, "leave the list empty"},
		{"unknown kubeconfig option", `allow_kubeconfig_options = ["exec", "gcp"]`, []string{"allow_kubeconfig_options", "1"}, `unknown kubeconfig option "gcp"`},
		{"bad allowed server", `allowed_servers = ["10.0.0.0/8", "10.0.0.0/33"]`, []string{"allowed_servers", "1"}, "neither a CIDR"},
		{"empty cluster id", `cluster_id = ""`, []string{"cluster_id"}, "must not be empty"},
		{"bad secret namespace", `secret_namespace = "Istio_System"`, []string{"secret_namespace"}, "is not a namespace name"},
		{"bad domain suffix", `domain_suffix = "cluster local"`, []string{"domain_suffix"}, "is not a DNS name"},
		{"clusterset_only without mcs", `clusterset_only = true`, []string{"clusterset_only"}, "needs mcs = true"},
		{"mcs with the clusterset domain", "mcs = true\ndomain_suffix = \"clusterset.local\"", []string{"domain_suffix"}, "is the MCS clusterset domain"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, diags := parseConfig(decodeConfig(t, tt.hcl), sdk.MeshSettings{})
			for _, d := range diags {
				if d.Severity == sdk.SeverityError && slices.Equal(d.Path, tt.wantPath) && strings.Contains(d.Summary, tt.wantMsg) {
					return
				}
			}
			t.Errorf("diagnostics %+v lack %q at %v", diags, tt.wantMsg, tt.wantPath)
		})
	}
}

func TestPrimaryConfig(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(path, []byte(kubeconfigYAML(okCluster, okUser)), 0o600); err != nil {
		t.Fatal(err)
	}
	// An unset kubeconfig is found as kubectl finds it (client-go's
	// loading rules): $KUBECONFIG, else ~/.kube/config, else in-cluster.
	// The in-cluster case needs a pod's service account and is not run.
	tests := []struct {
		name                   string
		kubeconfig, kctx       string
		envKubeconfig, homeCfg string
		wantPath               []string
		wantMsg, wantHost      string
	}{
		{name: "file", kubeconfig: path, wantHost: "https://10.20.0.1:6443"},
		{name: "file and context", kubeconfig: path, kctx: "c2", wantHost: "https://10.20.0.1:6443"},
		{name: "missing context", kubeconfig: path, kctx: "prod", wantPath: []string{"context"}, wantMsg: `has no context "prod"`},
		{name: "missing file", kubeconfig: filepath.Join(dir, "nope"), wantPath: []string{"kubeconfig"}, wantMsg: "no such file"},
		{name: "$KUBECONFIG", envKubeconfig: path, wantHost: "https://10.20.0.1:6443"},
		{name: "~/.kube/config with a context", homeCfg: path, kctx: "c2", wantHost: "https://10.20.0.1:6443"},
		{name: "not in a cluster", wantPath: []string{"kubeconfig"}, wantMsg: "not running in a cluster"},
	}
	defer func(saved string) { clientcmd.RecommendedHomeFile = saved }(clientcmd.RecommendedHomeFile)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("KUBERNETES_SERVICE_HOST", "")
			t.Setenv("KUBECONFIG", tt.envKubeconfig)
			clientcmd.RecommendedHomeFile = cmp.Or(tt.homeCfg, filepath.Join(dir, "no-home-config"))
			rc, digest, diags := primaryConfig(&options{kubeconfig: tt.kubeconfig, context: tt.kctx})
			if tt.wantMsg == "" {
				if diags.HasErrors() {
					t.Fatalf("diagnostics: %v", diags)
				}
				if rc.Host != tt.wantHost || rc.BearerToken == "" || digest == [32]byte{} {
					t.Errorf("host %q, token set %v, digest %x", rc.Host, rc.BearerToken != "", digest)
				}
				return
			}
			if len(diags) != 1 || !slices.Equal(diags[0].Path, tt.wantPath) || !strings.Contains(diags[0].Summary, tt.wantMsg) {
				t.Errorf("diagnostics %+v, want %q at %v", diags, tt.wantMsg, tt.wantPath)
			}
		})
	}
}

// TestRemoteSyncTimeoutIsADuration: a malformed remote_sync_timeout is
// the host's to report, at its position, before the plugin sees it.
func TestRemoteSyncTimeoutIsADuration(t *testing.T) {
	_, diags := configschema.ParseHCL("plugins.hcl", []byte("cluster_id = \"c1\"\nremote_sync_timeout = \"30\"\n"), schema)
	if len(diags) != 1 || diags[0].Subject.Start.Line != 2 || !strings.Contains(diags[0].Detail, `"30" is not a duration`) {
		t.Errorf("diagnostics = %v, want one at line 2", diags)
	}
}
