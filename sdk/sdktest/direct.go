package sdktest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/estuary-mesh/estuary/sdk"
)

// Direct builds the plugin from f for a test that calls its methods itself,
// without gRPC: with a fresh State, a logger into the test's log, and a
// Runtime.Context that ends when the test does. Then, as sdk.Serve would,
// it stops an sdk.Stopper, failing the test if that takes over a minute,
// so no goroutine of the plugin outlives the test.
func Direct(t testing.TB, f sdk.Factory) (sdk.Plugin, *sdk.State) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	state := sdk.NewState()
	logger := hclog.New(&hclog.LoggerOptions{Name: "plugin", Level: hclog.Warn, Output: testWriter{t}})
	p := f(sdk.Runtime{Context: ctx, Logger: logger, State: state})
	t.Cleanup(func() {
		cancel()
		s, ok := p.(sdk.Stopper)
		if !ok {
			return
		}
		sctx, scancel := context.WithTimeout(context.Background(), time.Minute)
		defer scancel()
		if err := s.Stop(sctx); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	return p, state
}

// ConfigureHonoursContext checks that Configure gives up with ctx's error
// when its context has ended, as the host's call deadline needs: it must
// neither wait for a turn nor apply the config.
func ConfigureHonoursContext(t testing.TB, p sdk.Plugin, req *sdk.ConfigureRequest) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := p.Configure(ctx, req); !errors.Is(err, context.Canceled) {
		t.Errorf("Configure with an ended context = %v, want an error wrapping context.Canceled", err)
	}
}
