package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/estuary-mesh/estuary/host/model"
)

// BenchmarkStaticReload is issue 17's static reload, apart from the
// fleet: the real binary serving the static plugin's plugins.hcl of
// 1,000 services × 10 endpoints (about 1 MB), and one sidecar's EDS
// watch of the first service on its own connection. Each operation
// rewrites the file with that service one endpoint longer or shorter,
// sends SIGHUP, and waits until the watch receives the new endpoint set:
// ms/reload is write → client. It also reports the host's and the
// plugin's CPU per reload. RELOAD_ESTUARY runs another estuary binary (a
// build of an older commit), to compare both in one run.
func BenchmarkStaticReload(b *testing.B) {
	if bin := os.Getenv("RELOAD_ESTUARY"); bin != "" {
		saved := estuaryBin
		estuaryBin = bin
		b.Cleanup(func() { estuaryBin = saved })
	}
	const services, endpoints = 1000, 10
	counts := make([]int, services)
	for s := range counts {
		counts[s] = endpoints
	}
	config := func(xds, admin string) string {
		return fmt.Sprintf("mesh {\n  cluster_id = \"cluster1\"\n}\nxds {\n  listen = %q\n  debounce_after = \"0s\"\n}\nadmin {\n  listen = %q\n}\n%s",
			xds, admin, fleetStaticBlocks(counts))
	}
	saved := hostLogLevel
	hostLogLevel = "info" // a debug line per endpoint would be what it measures
	h := startHostFile(b, config)
	hostLogLevel = saved
	cla := model.ClusterName(8080, "", fmt.Sprintf("svc-%04d.%s.svc.cluster.local", 0, fleetNS))
	eds := watchEDS(b, h.xds, cla)
	waitEndpoints(b, eds, 0, endpoints)
	var ps pluginz
	h.getJSON("/debug/pluginz", &ps)
	var pids []int
	for _, p := range ps {
		pids = append(pids, p.PID)
	}
	var total time.Duration
	cpu0, pcpu0 := cpuSeconds(b, h.cmd.Process.Pid), pluginsCPU(b, pids)
	n := 0
	for b.Loop() {
		want := endpoints + 1 - n%2
		counts[0] = want
		content := config(h.xds, strings.TrimPrefix(h.admin, "http://"))
		_, seen := eds.since(0)
		start := time.Now()
		h.write(content)
		h.signal(syscall.SIGHUP)
		waitEndpoints(b, eds, seen, want)
		total += time.Since(start)
		n++
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(n), "ms/reload")
	b.ReportMetric((cpuSeconds(b, h.cmd.Process.Pid)-cpu0)/float64(n), "host-cpu-s/reload")
	b.ReportMetric((pluginsCPU(b, pids)-pcpu0)/float64(n), "plugin-cpu-s/reload")
}

// waitEndpoints waits until a response from the seen-th on holds want
// endpoints.
func waitEndpoints(tb testing.TB, w *edsWatch, seen, want int) {
	tb.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		got, _ := w.since(seen)
		for _, addrs := range got {
			if len(addrs) == want {
				return
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("no EDS response with %d endpoints within 2 minutes; got %v", want, got)
		}
		time.Sleep(time.Millisecond)
	}
}

// fleetNS is the namespace of the fleet's and the reload benchmark's services.
const fleetNS = "fleet"

// fleetStaticBlocks is a static plugin block with counts[s] endpoints
// for service s.
func fleetStaticBlocks(counts []int) string {
	var b strings.Builder
	w := bufio.NewWriter(&b)
	fmt.Fprintf(w, "plugin \"static\" {\n  config {\n    cluster = \"cluster1\"\n    network = \"network1\"\n")
	for s, n := range counts {
		fmt.Fprintf(w, "    service \"svc-%04d.%s.svc.cluster.local\" {\n      namespace = %q\n      port \"http\" {\n        number   = 8080\n        protocol = \"HTTP\"\n      }\n", s, fleetNS, fleetNS)
		for e := range n {
			fmt.Fprintf(w, "      endpoint {\n        address = \"10.%d.%d.%d\"\n        ports   = { http = 8080 }\n      }\n", 100+s>>8, s&255, e+1)
		}
		w.WriteString("    }\n")
	}
	w.WriteString("  }\n}\n")
	w.Flush()
	return b.String()
}

// cpuSeconds is the user and system CPU time process pid has used.
func cpuSeconds(_ testing.TB, pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name may hold spaces; fields count from after its ')'.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ is 100 on Linux
}

func pluginsCPU(tb testing.TB, pids []int) float64 {
	var s float64
	for _, p := range pids {
		s += cpuSeconds(tb, p)
	}
	return s
}
