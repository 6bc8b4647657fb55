package xds

import (
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/estuary-mesh/estuary/host/model"
)

// TestResponseWaitIsReported: every response a push hands to a stream
// reports how long it waited there once the stream takes it to send,
// and not before: the wait is the stream's, not the push's.
func TestResponseWaitIsReported(t *testing.T) {
	f := newFixture(t)
	f.populate(20, 1)
	c := NewCache(NewGenerator(f.agg, nil))
	shared := model.ClusterName(8080, "", svcHost(0))
	ws := openEDSWatchesOf(t, c, proxylessView, 50, func(i int) []string {
		return []string{shared, model.ClusterName(8080, "", svcHost(1+i%19))}
	})
	var waits []time.Duration
	c.onTaken = func(d time.Duration) { waits = append(waits, d) } // the test's goroutine only

	f.endpoints(svcHost(0), genEndpoints(2, 7))
	if st := c.Push(model.Change{Services: map[string]bool{svcHost(0): false}}); st.Responses[tEndpoint] != len(ws) {
		t.Fatalf("push answered %d watches, want %d", st.Responses[tEndpoint], len(ws))
	}
	if len(waits) != 0 {
		t.Fatalf("%d waits reported before any stream took its response", len(waits))
	}
	for _, w := range ws {
		resp := mustDiscovery(t, <-w.ch)
		if got := decodeCLAs(t, resp.GetResources())[shared]; len(claAddresses(got)) != 2 {
			t.Fatalf("a watcher got %d endpoints of the changed CLA, want 2", len(claAddresses(got)))
		}
	}
	if len(waits) != len(ws) {
		t.Fatalf("%d waits reported for %d responses taken", len(waits), len(ws))
	}
	for _, d := range waits {
		if d < 0 {
			t.Fatalf("negative wait %v", d)
		}
	}
}

// TestPushReportsItsCPUTime: a push observes its own CPU time, apart from
// its wall time, and (on Linux, where it is measured) never more than
// the wall time: it is the push's thread alone, not the process's.
func TestPushReportsItsCPUTime(t *testing.T) {
	f := newFixture(t)
	f.populate(200, 10)
	reg := prometheus.NewRegistry()
	s := New(Options{}, f.agg, nil, f.agg, hclog.NewNullLogger(), reg)
	openEDSWatches(t, s.Cache(), proxylessView, 100, 10, 200)
	f.endpoints(svcHost(0), genEndpoints(10, 3))
	s.push(model.Change{Full: true}, time.Now())
	if _, ok := threadCPU(); !ok {
		t.Skip("thread CPU time is measured on Linux only")
	}
	cpu, wall := histogramOf(t, s.metrics.pushCPU), histogramOf(t, s.metrics.pushTime)
	if cpu.GetSampleCount() != 1 || cpu.GetSampleSum() <= 0 || cpu.GetSampleSum() > wall.GetSampleSum()+cpuSlack {
		t.Fatalf("push CPU: %d samples, %v s, for a push of %v s wall time", cpu.GetSampleCount(), cpu.GetSampleSum(), wall.GetSampleSum())
	}
}

// cpuSlack allows for the kernel's accounting of a thread's CPU time,
// which can run a few microseconds ahead of the wall clock's reading.
const cpuSlack = 0.0005 // seconds

func histogramOf(t *testing.T, h prometheus.Histogram) *dto.Histogram {
	t.Helper()
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram()
}
