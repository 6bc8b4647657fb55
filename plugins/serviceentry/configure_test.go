package serviceentry

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/sdktest"
)

// TestConfigureHonoursContext: Configure waits neither for its turn nor
// for the previous sources to stop beyond its context, so the host's call
// timeout always bounds it; the next Configure picks up once they stopped.
func TestConfigureHonoursContext(t *testing.T) {
	plug, _ := sdktest.Direct(t, Factory)
	p := plug.(*plugin)
	js, _ := json.Marshal(map[string]string{"dir": t.TempDir(), "cluster_id": "c1"})
	req := &sdk.ConfigureRequest{ConfigJSON: js}

	sdktest.ConfigureHonoursContext(t, p, req)

	// Sources that will not stop until released, while the caller's
	// context ends, as the host's deadline would.
	ctx, cancel := context.WithCancel(context.Background())
	release := make(chan struct{})
	wedged := &runner{id: sdk.InstanceID{Provider: sdk.ProviderServiceEntry, Cluster: "c1"}, group: sdk.StartRun(context.Background())}
	wedged.group.Go(func(context.Context) { cancel(); <-release })
	p.run = wedged
	if _, err := p.Configure(ctx, req); !errors.Is(err, context.Canceled) || p.run != wedged {
		t.Fatalf("Configure with sources that do not stop = %v (new runner started: %v), want context.Canceled", err, p.run != wedged)
	}
	close(release)
	if resp, err := p.Configure(context.Background(), req); err != nil || resp.Diagnostics.HasErrors() || p.run == wedged {
		t.Fatalf("Configure after the old sources stopped = %v, %v", resp, err)
	}
}

// TestKubeconfigRule: an unset kubeconfig is found as kubectl finds it,
// by client-go's loading rules: $KUBECONFIG, else ~/.kube/config, else
// the in-cluster config.
func TestKubeconfigRule(t *testing.T) {
	kubeconfig := func(server string) string {
		path := filepath.Join(t.TempDir(), "config")
		cfg := "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: \"" + server + "\"}}]\n" +
			"users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
		if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	explicit, env, home := kubeconfig("https://explicit:6443"), kubeconfig("https://env:6443"), kubeconfig("https://home:6443")
	tests := []struct {
		name             string
		path, env, home  string
		wantHost, errHas string
	}{
		{name: "explicit path wins", path: explicit, env: env, home: home, wantHost: "https://explicit:6443"},
		{name: "$KUBECONFIG", env: env, home: home, wantHost: "https://env:6443"},
		{name: "~/.kube/config", home: home, wantHost: "https://home:6443"},
		{name: "nothing, not in a pod", errHas: "not running in a cluster"},
		{name: "missing explicit file", path: "/does/not/exist", home: home, errHas: "kubeconfig /does/not/exist"},
	}
	defer func(saved string) { clientcmd.RecommendedHomeFile = saved }(clientcmd.RecommendedHomeFile)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("KUBECONFIG", tt.env)
			t.Setenv("KUBERNETES_SERVICE_HOST", "")
			clientcmd.RecommendedHomeFile = cmp.Or(tt.home, filepath.Join(t.TempDir(), "none"))
			rc, err := restConfig(tt.path)
			switch {
			case tt.errHas != "":
				if err == nil || !strings.Contains(err.Error(), tt.errHas) {
					t.Errorf("restConfig = %v, %v; want an error with %q", rc, err, tt.errHas)
				}
			case err != nil || rc.Host != tt.wantHost:
				t.Errorf("restConfig = %v, %v; want host %s", rc, err, tt.wantHost)
			}
		})
	}
}
