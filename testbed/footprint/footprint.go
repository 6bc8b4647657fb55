// Package footprint reads a Go process's resource use from its Prometheus
// /metrics (client_golang's Go and process collectors) and decides whether
// it grew over a long run, for soaks and fleet benchmarks.
package footprint

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Metrics that Scrape requires, as the Go and process collectors name them.
const (
	// HeapInuse is the heap in use at the moment of the scrape; it swings
	// with the GC cycle.
	HeapInuse = "go_memstats_heap_inuse_bytes"
	// HeapGoal is the heap size at which the next GC starts: the heap
	// live after the last GC (plus stacks and globals) times 1+GOGC/100.
	// It moves only at a GC, with what survived it, so it shows a leak
	// without the sawtooth of HeapInuse.
	HeapGoal = "go_memstats_next_gc_bytes"
	// RSS is the resident set size.
	RSS = "process_resident_memory_bytes"
	// Goroutines is the number of goroutines.
	Goroutines = "go_goroutines"
	// FDs is the number of open file descriptors.
	FDs = "process_open_fds"
)

// Required lists the metrics every Sample holds.
var Required = []string{HeapInuse, HeapGoal, RSS, Goroutines, FDs}

// Sample is one reading of a process's metrics.
type Sample struct {
	At time.Time
	// Values holds every metric of the scrape that has no labels.
	Values map[string]float64
}

// Scrape reads url (a Prometheus text endpoint) and returns its unlabelled
// metrics. It fails if any of Required is missing.
func Scrape(ctx context.Context, url string) (Sample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return Sample{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return Sample{}, fmt.Errorf("footprint: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Sample{}, fmt.Errorf("footprint: GET %s: %s", url, resp.Status)
	}
	s, err := Parse(resp.Body)
	if err != nil {
		return Sample{}, fmt.Errorf("footprint: GET %s: %w", url, err)
	}
	return s, nil
}

// Parse reads the Prometheus text format. Labelled series are skipped:
// the metrics this package reads have none.
func Parse(r io.Reader) (Sample, error) {
	s := Sample{At: time.Now(), Values: map[string]float64{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' || strings.ContainsRune(line, '{') {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		v, err := strconv.ParseFloat(fields[1], 64)
		if err != nil {
			return Sample{}, fmt.Errorf("metric %s: %w", fields[0], err)
		}
		s.Values[fields[0]] = v
	}
	if err := sc.Err(); err != nil {
		return Sample{}, err
	}
	for _, m := range Required {
		if _, ok := s.Values[m]; !ok {
			return Sample{}, fmt.Errorf("no metric %s", m)
		}
	}
	return s, nil
}

// Limit is how much a metric may grow from the baseline to the end of a
// run: Rel times the baseline, plus Abs.
type Limit struct {
	Metric   string
	Rel, Abs float64
}

// Result compares one metric's level at the baseline with its level at
// the end.
type Result struct {
	Limit
	Baseline, Final float64
	// Allowed is the most Final may be: Baseline*(1+Rel) + Abs.
	Allowed float64
	Grew    bool
}

func (r Result) String() string {
	verdict := "ok"
	if r.Grew {
		verdict = "GREW"
	}
	return fmt.Sprintf("%s: baseline %s, final %s, allowed up to %s (+%g%% +%s): %s",
		r.Metric, Format(r.Metric, r.Baseline), Format(r.Metric, r.Final), Format(r.Metric, r.Allowed), r.Rel*100, Format(r.Metric, r.Abs), verdict)
}

// Check compares, for each limit, the level of the first window samples
// of samples[base:] (the first ones after warm-up) with the level of the
// last window samples. A level is the minimum over its samples: a GC
// cycle or a busy moment lifts single samples, but a leak lifts the floor
// under all of them. A short run uses fewer samples per level (half of
// those after base, at least one each).
func Check(samples []Sample, base, window int, limits []Limit) ([]Result, error) {
	n := len(samples) - base
	if base < 0 || n < 2 {
		return nil, fmt.Errorf("footprint: %d samples from %d on: need a baseline and a later sample", max(n, 0), base)
	}
	w := max(1, min(window, n/2))
	out := make([]Result, 0, len(limits))
	for _, l := range limits {
		level := func(ss []Sample) (float64, error) {
			vs := make([]float64, 0, len(ss))
			for _, s := range ss {
				v, ok := s.Values[l.Metric]
				if !ok {
					return 0, fmt.Errorf("footprint: sample at %s has no %s", s.At.Format(time.TimeOnly), l.Metric)
				}
				vs = append(vs, v)
			}
			return slices.Min(vs), nil
		}
		b, err := level(samples[base : base+w])
		if err != nil {
			return nil, err
		}
		f, err := level(samples[len(samples)-w:])
		if err != nil {
			return nil, err
		}
		r := Result{Limit: l, Baseline: b, Final: f, Allowed: b*(1+l.Rel) + l.Abs}
		r.Grew = r.Final > r.Allowed
		out = append(out, r)
	}
	return out, nil
}

// Format shows a value of metric: bytes in MiB, counts as integers.
func Format(metric string, v float64) string {
	if strings.HasSuffix(metric, "_bytes") {
		return strconv.FormatFloat(v/(1<<20), 'f', 1, 64) + "MiB"
	}
	return strconv.FormatFloat(v, 'f', 0, 64)
}
