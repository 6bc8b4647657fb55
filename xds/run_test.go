package xds

import (
	"context"
	"strings"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/hashicorp/go-hclog"

	"github.com/estuary-mesh/estuary/host/model"
)

// running starts Run on a listening server with one client stream that has
// received its CDS, so the server is known to be serving. It returns the
// stream's responses (closed when the stream ends), a wait for Run's result
// and a cancel for Run's context.
func running(t *testing.T) (*Server, <-chan *discoveryv3.DiscoveryResponse, func() error, context.CancelFunc) {
	t.Helper()
	f := newFixture(t)
	f.populate(2, 1)
	s := New(Options{Listen: "127.0.0.1:0"}, f.agg, nil, f.agg, hclog.NewNullLogger(), nil)
	addr, err := s.Listen()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var runErr error
	finished := make(chan struct{})
	go func() {
		runErr = s.Run(ctx)
		close(finished)
	}()
	wait := func() error {
		t.Helper()
		select {
		case <-finished:
			return runErr
		case <-time.After(20 * time.Second):
			t.Fatal("Run did not return within 20s")
			return nil
		}
	}
	t.Cleanup(func() {
		cancel()
		<-finished
	})
	st, err := adsClient(t, addr.String()).StreamAggregatedResources(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ch := pump(t, st.Recv)
	if err := st.Send(&discoveryv3.DiscoveryRequest{Node: nodeFor(model.View{Kind: model.KindEnvoy, Network: "network1"}, envoyNode), TypeUrl: resourcev3.ClusterType}); err != nil {
		t.Fatal(err)
	}
	recv(t, ch, "CDS")
	return s, ch, wait, cancel
}

// streamEnds waits for a client stream to be closed by the server.
func streamEnds(t *testing.T, ch <-chan *discoveryv3.DiscoveryResponse) {
	t.Helper()
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-time.After(20 * time.Second):
			t.Fatal("the client stream was still open 20s after the server stopped")
		}
	}
}

// TestRunStopsWhenItsContextEnds: Run closes client streams and returns
// nil once its context ends; that is a stop, not a failure.
func TestRunStopsWhenItsContextEnds(t *testing.T) {
	_, ch, wait, cancel := running(t)
	cancel()
	if err := wait(); err != nil {
		t.Errorf("Run after its context ended = %v, want nil", err)
	}
	streamEnds(t, ch)
}

// TestRunReturnsWhenServingFails: when gRPC stops serving on its own (here
// its listener is closed under it), Run ends with an error saying so,
// rather than logging it and leaving the host looking healthy, and closes
// the streams it still had.
func TestRunReturnsWhenServingFails(t *testing.T) {
	s, ch, wait, _ := running(t)
	if err := s.ln.Close(); err != nil {
		t.Fatal(err)
	}
	if err := wait(); err == nil || !strings.Contains(err.Error(), "xds: serve") {
		t.Errorf("Run after its listener failed = %v, want an xds: serve error", err)
	}
	streamEnds(t, ch)
}

func TestRunBeforeListen(t *testing.T) {
	f := newFixture(t)
	s := New(Options{}, f.agg, nil, f.agg, hclog.NewNullLogger(), nil)
	if err := s.Run(t.Context()); err == nil {
		t.Error("Run without Listen returned nil")
	}
}
