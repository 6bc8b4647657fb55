package footprint

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// series builds samples whose metric m takes the values vs.
func series(m string, vs ...float64) []Sample {
	out := make([]Sample, len(vs))
	for i, v := range vs {
		out[i] = Sample{Values: map[string]float64{m: v}}
	}
	return out
}

func TestCheck(t *testing.T) {
	heap := Limit{Metric: HeapGoal, Rel: 0.25}
	fds := Limit{Metric: FDs, Abs: 20}
	const mib = 1 << 20
	for _, tc := range []struct {
		name    string
		limit   Limit
		base    int
		window  int // 3 if zero
		values  []float64
		grew    bool
		wantErr bool
	}{
		{name: "flat", limit: heap, values: []float64{100, 100, 100, 100, 100, 100, 100}},
		{name: "warm-up growth is ignored", limit: heap, base: 2, values: []float64{10, 50, 100, 100, 101, 99, 100, 100}},
		{name: "GC sawtooth", limit: heap, values: []float64{100, 190, 105, 180, 100, 195, 102, 185, 101}},
		{name: "a spike at the end", limit: heap, values: []float64{100, 100, 100, 100, 100, 400}},
		{name: "growth within tolerance", limit: heap, values: []float64{100, 100, 100, 110, 120, 124, 124, 124}},
		{name: "steady leak", limit: heap, values: []float64{100, 110, 120, 130, 140, 150, 160, 170, 180}, grew: true},
		{name: "step up after warm-up", limit: heap, values: []float64{100, 100, 100, 100, 130, 130, 130}, grew: true},
		{name: "leak under GC sawtooth", limit: heap, values: []float64{100, 190, 110, 200, 120, 210, 130, 220, 140}, grew: true},
		{name: "noise judged by single samples", limit: heap, window: 1, values: []float64{31, 42, 33, 38, 32, 40}, grew: true},
		{name: "the same noise judged by floors", limit: heap, window: 3, values: []float64{31, 42, 33, 38, 32, 40}},
		{name: "shrinking", limit: heap, values: []float64{200 * mib, 190 * mib, 150 * mib, 120 * mib}},
		{name: "fds within slack", limit: fds, values: []float64{1030, 1031, 1040, 1049, 1050, 1050}},
		{name: "fds past slack", limit: fds, values: []float64{1030, 1030, 1030, 1051, 1052, 1051}, grew: true},
		{name: "fds leaking one per sample", limit: fds, values: []float64{1030, 1035, 1040, 1045, 1050, 1055, 1060, 1065}, grew: true},
		{name: "short run, flat", limit: fds, values: []float64{1030, 1032, 1031}},
		{name: "short run, grew", limit: fds, values: []float64{1030, 1040, 1060}, grew: true},
		{name: "one sample after warm-up", limit: fds, base: 2, values: []float64{1, 2, 3}, wantErr: true},
		{name: "no samples", limit: fds, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			window := tc.window
			if window == 0 {
				window = 3
			}
			rs, err := Check(series(tc.limit.Metric, tc.values...), tc.base, window, []Limit{tc.limit})
			if tc.wantErr {
				if err == nil {
					t.Fatalf("Check = %v, want an error", rs)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(rs) != 1 || rs[0].Grew != tc.grew {
				t.Errorf("Check = %v, want grew=%v", rs, tc.grew)
			}
		})
	}
}

func TestCheckNeedsTheMetric(t *testing.T) {
	if _, err := Check(series(FDs, 1, 2, 3), 0, 3, []Limit{{Metric: Goroutines}}); err == nil {
		t.Error("Check of a metric the samples lack passed")
	}
}

const exposition = `# HELP go_goroutines Number of goroutines that currently exist.
# TYPE go_goroutines gauge
go_goroutines 1042
go_memstats_heap_inuse_bytes 5.0331648e+07
go_memstats_next_gc_bytes 6.1e+07
go_gc_duration_seconds{quantile="0.5"} 0.0001
process_open_fds 1037
process_resident_memory_bytes 1.2e+08
estuary_xds_pushes_total{type="cds"} 12
`

func TestScrape(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, exposition)
	}))
	defer srv.Close()
	s, err := Scrape(context.Background(), srv.URL+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{Goroutines: 1042, HeapInuse: 50331648, HeapGoal: 61e6, FDs: 1037, RSS: 120e6}
	for m, v := range want {
		if s.Values[m] != v {
			t.Errorf("%s = %v, want %v", m, s.Values[m], v)
		}
	}
	if _, ok := s.Values["estuary_xds_pushes_total"]; ok {
		t.Error("a labelled series was read")
	}
	if _, err := Scrape(context.Background(), srv.URL+"/nothing"); err == nil {
		t.Error("Scrape of a 404 passed")
	}
}

func TestParseNeedsEveryRequiredMetric(t *testing.T) {
	_, err := Parse(strings.NewReader("go_goroutines 3\n"))
	if err == nil || !strings.Contains(err.Error(), HeapInuse) {
		t.Errorf("Parse without %s: %v", HeapInuse, err)
	}
}

func TestFormat(t *testing.T) {
	if got := Format(RSS, 3<<20); got != "3.0MiB" {
		t.Errorf("Format(RSS) = %q", got)
	}
	if got := Format(FDs, 1037); got != "1037" {
		t.Errorf("Format(FDs) = %q", got)
	}
}
