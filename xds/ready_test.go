package xds

import (
	"context"
	"sync"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/hashicorp/go-hclog"
	dto "github.com/prometheus/client_model/go"

	"github.com/estuary-mesh/estuary/host/model"
)

// TestClientsWaitUntilReady: SotW and Delta clients that connect before
// the host is ready are held, not refused and not answered, even when
// the registry changes meanwhile; once ready, the first response each
// gets is the whole current state, changes made while held included.
func TestClientsWaitUntilReady(t *testing.T) {
	h := newHeld(t, Options{})
	f, s, gate, held := h.f, h.s, h.gate, h.held
	pushes := make(chan PushStats, 10)
	s.onPush = func(st PushStats, _ model.Change) { pushes <- st }
	sotwCh := h.sotwCDS()
	addr := h.addr
	delta, err := adsClient(t, addr).DeltaAggregatedResources(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	deltaCh := pump(t, delta.Recv)
	_ = delta.Send(&discoveryv3.DeltaDiscoveryRequest{Node: drainNode, TypeUrl: resourcev3.ClusterType})
	recv(t, held, "SotW watch held")
	recv(t, held, "Delta watch held")

	// A registry change while held is pushed into the cache, to no one.
	f.service(svcHost(9), 8080)
	if st := recv(t, pushes, "push while held"); st.Total() != 0 {
		t.Errorf("a push while held answered %d watches, want 0", st.Total())
	}

	close(gate)
	if r := recv(t, sotwCh, "SotW CDS once ready"); len(r.GetResources()) != 3 {
		t.Errorf("first SotW CDS has %d clusters, want all 3", len(r.GetResources()))
	}
	if r := recv(t, deltaCh, "Delta CDS once ready"); len(r.GetResources()) != 3 {
		t.Errorf("first Delta CDS has %d clusters, want all 3", len(r.GetResources()))
	}
	if v := gaugeValue(t, s); v != 1 {
		t.Errorf("estuary_xds_ready = %v after the gate opened", v)
	}
}

// TestReadyFlushesThePendingChange: the change that made the host ready
// may still be debouncing when the gate opens; held clients get it in
// their first response, not a debounce later.
func TestReadyFlushesThePendingChange(t *testing.T) {
	h := newHeld(t, Options{DebounceAfter: 1 << 62, DebounceMax: 1 << 62})
	ch := h.sotwCDS()
	recv(t, h.held, "watch held")
	h.f.service(svcHost(9), 8080) // debounced "forever"
	close(h.gate)
	if r := recv(t, ch, "CDS once ready"); len(r.GetResources()) != 3 {
		t.Errorf("first CDS has %d clusters, want all 3", len(r.GetResources()))
	}
}

// held is a server of two services behind a readiness gate, serving.
type held struct {
	t    *testing.T
	f    *fixture
	s    *Server
	addr string
	gate chan struct{}
	held chan struct{} // a watch was held
}

func newHeld(t *testing.T, opts Options) *held {
	h := &held{t: t, f: newFixture(t), gate: make(chan struct{}), held: make(chan struct{}, 10)}
	h.f.populate(2, 1)
	opts.Listen, opts.Ready = "127.0.0.1:0", h.gate
	h.s = New(opts, h.f.agg, nil, h.f.agg, hclog.NewNullLogger(), nil)
	h.s.cache.onHold = func() { h.held <- struct{}{} }
	h.addr = serve(t, h.s)
	return h
}

// sotwCDS opens a SotW stream that asks for every cluster.
func (h *held) sotwCDS() <-chan *discoveryv3.DiscoveryResponse {
	st, err := adsClient(h.t, h.addr).StreamAggregatedResources(context.Background())
	if err != nil {
		h.t.Fatal(err)
	}
	ch := pump(h.t, st.Recv)
	_ = st.Send(&discoveryv3.DiscoveryRequest{Node: drainNode, TypeUrl: resourcev3.ClusterType})
	return ch
}

func gaugeValue(t *testing.T, s *Server) float64 {
	t.Helper()
	var m dto.Metric
	if err := s.metrics.ready.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

// TestReadyWaitsForThePushInFlight: a change the debounce loop has taken,
// but not yet pushed into the cache, when the gate opens reaches the held
// clients in their first response. Answered without it, every client
// that reconnected to a restarting host would get a partial
// configuration: the reconnect storm's clients did, once they came back
// faster than the host's plugins synced.
func TestReadyWaitsForThePushInFlight(t *testing.T) {
	h := newHeld(t, Options{})
	taken, resume := make(chan struct{}, 1), make(chan struct{})
	var once sync.Once
	h.s.beforePush = func() {
		once.Do(func() {
			taken <- struct{}{}
			<-resume
		})
	}
	ch := h.sotwCDS()
	recv(t, h.held, "watch held")
	h.f.service(svcHost(9), 8080)
	recv(t, taken, "the change taken for a push")
	close(h.gate)
	// A server that answered now would send the two clusters the cache
	// holds without the third. Give it the time to (the test cannot wait
	// for something that must not happen), then let the push go on.
	select {
	case r := <-ch:
		t.Fatalf("answered with %d clusters while a push was on its way", len(r.GetResources()))
	case <-time.After(time.Second):
	}
	close(resume)
	if r := recv(t, ch, "CDS once ready"); len(r.GetResources()) != 3 {
		t.Errorf("first CDS has %d clusters, want all 3", len(r.GetResources()))
	}
}
