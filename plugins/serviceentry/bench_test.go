package serviceentry

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/estuary-mesh/estuary/sdk/sdktest"
)

// The benchmark registry: 5,000 ServiceEntries with 20 endpoints each,
// 100 entries per file, spread over 50 namespaces.
const (
	benchEntries   = 5000
	benchEndpoints = 20
	benchPerFile   = 100
)

// writeBenchDir writes the benchmark registry into a new directory.
func writeBenchDir(b *testing.B) string {
	b.Helper()
	dir := b.TempDir()
	var buf strings.Builder
	for i := range benchEntries {
		fmt.Fprintf(&buf, `---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: svc-%[1]d
  namespace: ns-%[2]d
  labels: {app: svc-%[1]d}
spec:
  hosts: [svc-%[1]d.ns-%[2]d.example.com]
  addresses: [240.%[3]d.%[4]d.1]
  location: MESH_INTERNAL
  ports:
  - {number: 80, name: http, protocol: HTTP, targetPort: 8080}
  - {number: 9090, name: grpc, protocol: GRPC}
  resolution: STATIC
  endpoints:
`, i, i%50, i/256, i%256)
		for j := range benchEndpoints {
			fmt.Fprintf(&buf, "  - address: 10.%d.%d.%d\n    labels: {app: svc-%d, version: v%d}\n    locality: region-%d/zone-%d\n    weight: %d\n",
				i/256, i%256, j+1, i, j%2+1, i%3, j%3, j+1)
		}
		if (i+1)%benchPerFile == 0 {
			name := filepath.Join(dir, fmt.Sprintf("entries-%03d.yaml", i/benchPerFile))
			if err := os.WriteFile(name, []byte(buf.String()), 0o644); err != nil {
				b.Fatal(err)
			}
			buf.Reset()
		}
	}
	return dir
}

// BenchmarkSync5000x20 measures a cold start: from Configure with a
// directory of 5,000 ServiceEntries x 20 endpoints until a replica, fed
// over the plugin's real gRPC Watch stream, holds every endpoint. Target:
// at most 2 s per sync.
func BenchmarkSync5000x20(b *testing.B) {
	dir := writeBenchDir(b)
	config := fmt.Sprintf("dir = %q\ncluster_id = \"bench\"\n", dir)
	const want = benchEntries * benchEndpoints
	var total, cpu time.Duration
	for b.Loop() {
		b.StopTimer()
		h := sdktest.Start(b, Factory)
		w := h.Watch(b)
		b.StartTimer()
		start, cpu0 := time.Now(), cpuTime(b)
		h.Configure(b, config, mesh)
		w.WaitFor(b, 2*time.Minute, "every endpoint in the replica", func(r *sdktest.Replica) bool {
			in := instance(r, "bench")
			if in == nil || !in.Synced || len(in.Services) != benchEntries {
				return false
			}
			n := 0
			for _, eps := range in.Endpoints {
				n += len(eps)
			}
			return n == want
		})
		total += time.Since(start)
		cpu += cpuTime(b) - cpu0
		b.StopTimer()
		h.Kill()
		w.Stop()
		b.StartTimer()
	}
	sync := total.Seconds() / float64(b.N)
	b.ReportMetric(sync, "s/sync")
	b.ReportMetric(want/sync, "endpoints/s")
	// CPU time used by the whole process per sync: what the sync costs
	// regardless of what else runs on the machine.
	b.ReportMetric(cpu.Seconds()/float64(b.N), "cpu-s/sync")
}

// cpuTime is the user and system CPU time of the process so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkConvert5000x20 measures the plugin's own share of a cold start:
// decoding every file and building the snapshot, without the stream.
func BenchmarkConvert5000x20(b *testing.B) {
	dir := writeBenchDir(b)
	var ms runtime.MemStats
	for b.Loop() {
		s := newFileSource(dir, "default", hclog.NewNullLogger())
		s.scan()
		c := s.contents()
		snap, notices := build("bench", c.objects)
		if len(snap.Services) != benchEntries || len(notices)+len(c.notices) != 0 {
			b.Fatalf("%d services, notices %v %v", len(snap.Services), c.notices, notices)
		}
	}
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "heap-MB")
}
