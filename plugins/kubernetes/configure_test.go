package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/util/workqueue"

	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/sdktest"
)

// TestConfigureHonoursContext: Configure waits neither for its turn nor
// for the previous clusters to stop beyond its context, so the host's call
// timeout always bounds it; the next Configure picks up once they stopped.
func TestConfigureHonoursContext(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte(kubeconfigYAML("    server: https://127.0.0.1:1\n    insecure-skip-tls-verify: true", okUser)), 0o600); err != nil {
		t.Fatal(err)
	}
	js, _ := json.Marshal(map[string]string{"kubeconfig": path, "cluster_id": "c1"})
	req := &sdk.ConfigureRequest{ConfigJSON: js}
	plug, _ := sdktest.Direct(t, Factory)
	p := plug.(*plugin)

	sdktest.ConfigureHonoursContext(t, p, req)

	// A controller whose secret loop will not end until released; its
	// cancel ends the caller's context instead, as the host's deadline
	// would.
	ctx, cancel := context.WithCancel(context.Background())
	wedged := &controller{
		opts: &options{clusterID: "c1"}, cancel: cancel, done: make(chan struct{}), gone: make(chan struct{}),
		queue:         workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[string]{}),
		secretFactory: informers.NewSharedInformerFactory(nil, 0),
		primary:       &cluster{}, members: map[string]*member{},
	}
	p.ctrl, p.key = wedged, "running"
	if _, err := p.Configure(ctx, req); !errors.Is(err, context.Canceled) || p.ctrl != wedged {
		t.Fatalf("Configure with clusters that do not stop = %v (new controller: %v), want context.Canceled", err, p.ctrl != wedged)
	}
	close(wedged.done)
	if resp, err := p.Configure(context.Background(), req); err != nil || resp.Diagnostics.HasErrors() || p.ctrl == wedged {
		t.Fatalf("Configure after the old clusters stopped = %v, %v", resp, err)
	}
}
