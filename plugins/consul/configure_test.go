package consul

import (
	"context"
	"errors"
	"testing"

	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/sdktest"
)

// TestConfigureHonoursContext: Configure never waits beyond its context,
// neither for its turn nor for the previous config's watches to stop, so
// the host's call timeout always bounds it; a later Configure picks up
// once the old watches are gone.
func TestConfigureHonoursContext(t *testing.T) {
	plug, _ := sdktest.Direct(t, Factory)
	p := plug.(*plugin)
	req := &sdk.ConfigureRequest{ConfigJSON: []byte(`{"address": "127.0.0.1:1", "datacenters": ["dc1"]}`)}

	sdktest.ConfigureHonoursContext(t, p, req)

	// A previous run that will not stop until released, while the
	// caller's context ends, as the host's deadline would.
	ctx, cancel := context.WithCancel(context.Background())
	release := make(chan struct{})
	wedged := &run{group: sdk.StartRun(context.Background())}
	wedged.ctx = wedged.group.Context()
	wedged.group.Go(func(context.Context) { cancel(); <-release })
	p.cur = wedged
	t.Run("waiting for the old run to stop", func(t *testing.T) {
		if _, err := p.Configure(ctx, req); !errors.Is(err, context.Canceled) {
			t.Fatalf("Configure = %v, want context.Canceled", err)
		}
		if p.cur != wedged {
			t.Fatalf("a new run started while the old one still runs")
		}
	})

	t.Run("after the old run stopped", func(t *testing.T) {
		close(release)
		resp, err := p.Configure(context.Background(), req)
		if err != nil || resp.Diagnostics.HasErrors() {
			t.Fatalf("Configure = %v, %v", resp, err)
		}
		if p.cur == wedged {
			t.Fatalf("no new run started")
		}
	})
}
