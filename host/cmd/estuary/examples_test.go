package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/host/pipeline"
)

// TestExamplesValidate: every configuration under examples/ and the
// repository's plugins.hcl pass `estuary validate`.
func TestExamplesValidate(t *testing.T) {
	files, err := filepath.Glob("../../../examples/*/plugins.hcl")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, "../../../plugins.hcl")
	if len(files) < 4 {
		t.Fatalf("found only %v", files)
	}
	for _, f := range files {
		t.Run(f, func(t *testing.T) {
			if out, err := exec.Command(estuaryBin, "validate", "-config", f).CombinedOutput(); err != nil {
				t.Errorf("estuary validate %s: %v\n%s", f, err, out)
			}
		})
	}
}

// readExample returns the example's plugins.hcl with xds and admin blocks
// on the given addresses appended, and rewrite applied to the rest: the
// paths and addresses it names (/etc/estuary/kubeconfig, the Consul agent)
// become those of the real components the test started.
func readExample(t *testing.T, name string, rewrite ...string) func(xds, admin string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("../../../examples", name, "plugins.hcl"))
	if err != nil {
		t.Fatal(err)
	}
	src := string(b)
	for i := 0; i+1 < len(rewrite); i += 2 {
		if !strings.Contains(src, rewrite[i]) {
			t.Fatalf("examples/%s/plugins.hcl no longer contains %q", name, rewrite[i])
		}
		src = strings.ReplaceAll(src, rewrite[i], rewrite[i+1])
	}
	return func(xds, admin string) string {
		return src + fmt.Sprintf("\nxds {\n  listen         = %q\n  debounce_after = \"10ms\"\n}\nadmin {\n  listen = %q\n}\n", xds, admin)
	}
}

// TestExampleTwoNetworks runs examples/two-networks as it is and checks
// the promise of its comment for each node it describes. The west
// registry (cluster2) names no network and is not mesh.cluster_id, so it
// does not inherit mesh.network: from_registry puts it on network2.
func TestExampleTwoNetworks(t *testing.T) {
	h := startHostFile(t, readExample(t, "two-networks"))
	const echo = "echo.default.svc.cluster.local"
	eds, sni := model.ClusterName(8080, "", echo), model.SNIClusterName(8080, "", echo)
	// One gateway per network: the scale factor (the LCM of the gateway
	// counts) is 1, every endpoint weighs 1 (unset), so the local endpoint
	// is sent with 1 and the gateway with the sum of what it replaces, 1.
	nodes := []struct {
		name, id string
		md       map[string]any
		cluster  string
		want     []string // sorted
	}{
		{"client on network1", "sidecar~127.0.0.2~east-client.default~default.svc.cluster.local",
			map[string]any{"NETWORK": "network1", "CLUSTER_ID": "cluster1"}, eds,
			[]string{"127.0.0.12:15443 w=1", "127.0.0.1:50051 w=1"}},
		{"client on network2", "sidecar~127.0.0.3~west-client.default~default.svc.cluster.local",
			map[string]any{"NETWORK": "network2", "CLUSTER_ID": "cluster2"}, eds,
			[]string{"10.20.0.5:50051 w=1", "127.0.0.11:15443 w=1"}},
		{"east-west gateway of network1", "router~127.0.0.11~istio-eastwestgateway-1.istio-system~istio-system.svc.cluster.local",
			map[string]any{"NETWORK": "network1", "REQUESTED_NETWORK_VIEW": "network1", "CLUSTER_ID": "cluster1"}, sni,
			[]string{"127.0.0.1:50051 w=1"}},
		{"east-west gateway of network2", "router~127.0.0.12~istio-eastwestgateway-2.istio-system~istio-system.svc.cluster.local",
			map[string]any{"NETWORK": "network2", "REQUESTED_NETWORK_VIEW": "network2", "CLUSTER_ID": "cluster2"}, sni,
			[]string{"10.20.0.5:50051 w=1"}},
	}
	for _, n := range nodes {
		got := adsEndpoints(t, h.xds, n.id, n.md)[n.cluster]
		if !slices.Equal(got, n.want) {
			t.Errorf("%s gets %v for %s, want %v", n.name, got, n.cluster, n.want)
		}
	}
	// explain says why 10.20.0.5 is on network2: from_registry, because
	// its registry has no default network of its own.
	out := h.estuary("explain", "endpoint", "--node", nodes[0].id, "--cluster", eds, "--json")
	var ex pipeline.Explanation
	if err := json.Unmarshal(out, &ex); err != nil {
		t.Fatalf("explain: %v\n%s", err, out)
	}
	found := false
	for _, e := range ex.Endpoints {
		if e.Endpoint != "10.20.0.5:50051" {
			continue
		}
		found = true
		if e.Network != "network2" || e.Rule != pipeline.RuleFromRegistry || e.RegistryDefault != "" || e.Decision != pipeline.Replaced {
			t.Errorf("explain: 10.20.0.5 on %q by rule %q (registry default %q), %q; want network2 by from_registry, no registry default, replaced",
				e.Network, e.Rule, e.RegistryDefault, e.Decision)
		}
	}
	if !found {
		t.Errorf("explain does not list 10.20.0.5:50051: %s", out)
	}
}
