//go:build fleet

package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/testbed"
	"github.com/estuary-mesh/estuary/testbed/footprint"
	"github.com/estuary-mesh/estuary/testbed/xdsload"
)

// TestFleet is `make bench-fleet` (issue 17): the real binary serving
// FLEET_CLIENTS simulated proxies (default 1,000), each on its own gRPC
// connection, half State of the World and half Delta, each watching
// fleetWatch CLAs. The registry is FLEET_SERVICES services (default 1,000)
// of FLEET_ENDPOINTS endpoints (default 10), from a real kube-apiserver
// (EndpointSlices written with client-go) and, for comparison, from the
// static plugin (plugins.hcl rewritten, then SIGHUP). FLEET_SOURCES picks
// them ("kube,static").
//
// For each source it reports, with the machine's load average:
//   - the time for every client to connect and hold its initial state;
//   - the host's heap in use and RSS per client (with clients minus
//     before them, divided by the clients), from its /metrics;
//   - for FLEET_PUSHES changes (default 5) of one endpoint of a service
//     every client watches: the time from the write call to each client's
//     receipt, p50/p99/max, for SotW and Delta; the host's CPU seconds per
//     change (utime+stime of /proc/PID/stat, plugins are other processes
//     and reported apart) and its push time (estuary_xds_push_seconds:
//     rebuilding resources and handing responses to the streams; the rest
//     of the convergence is the source, the debounce and the wire);
//   - the reconnect storm (kube only, FLEET_STORM=0 skips it): the host is
//     killed with SIGKILL and started again; the time from the restart
//     until every client holds its full state once more. The clients
//     reconnect as Envoy does (see xdsload's retryBase): one connection
//     attempt per stream, a full-jitter backoff from 500 ms doubling to
//     30 s, not gRPC's channel backoff (1 s ×1.6 to 120 s), which no Envoy
//     uses. The host binds its xDS port before it starts its plugins and
//     holds the streams it accepts until it is ready, so a client that
//     reconnects early waits on an open stream rather than backing off.
//   - for the connect and the storm, the CPU seconds of the host and of
//     this process, the load generator, which shares the machine.
//
// All clients start connecting at once, each from its own goroutine, as
// proxies that lost their control plane do; the generator decodes each
// distinct CDS response and CLA once, so its cost stays out of the host's.
//
// It fails if any client ever held a partial configuration (a required
// cluster missing from CDS, an empty CLA) once it had been fully served,
// NACKed anything, or if a change does not reach every client within
// its deadline (2 minutes, plus one per 1,000 clients: a 10,000-client
// fleet connecting on a busy 2-core machine takes minutes). Speed is
// reported, never asserted.
//
// FLEET_DEBOUNCE sets xds debounce_after (default 0s: off). FLEET_ESTUARY
// runs another estuary binary (a build of an older commit, to compare in
// one run). FLEET_PROFILE=DIR saves the host's CPU profiles over the
// connect, the pushes and the storm and its heap profile with every
// client served, from /debug/pprof, and this process's CPU profiles over
// the connect and the storm (gen-cpu-*).
func TestFleet(t *testing.T) {
	cfg := fleetConfigFromEnv(t)
	raiseFDLimit(t)
	if cfg.bin != "" {
		estuaryBin = cfg.bin
	}
	hostLogLevel = "info"
	t.Logf("fleet: %d clients (SotW and Delta, own connections), %d services × %d endpoints, %d CLAs watched per client, debounce %s, sources %v; %s",
		cfg.clients, cfg.services, cfg.endpoints, fleetWatch, cfg.debounce, cfg.sources, loadAvg())
	var rows []string
	for _, src := range cfg.sources {
		switch src {
		case "kube":
			rows = append(rows, fleetKube(t, cfg)...)
		case "static":
			rows = append(rows, fleetStatic(t, cfg)...)
		}
	}
	t.Logf("fleet summary (%d clients):\n%s", cfg.clients, strings.Join(rows, "\n"))
}

// fleetWatch is how many CLAs each client watches; fleetHot of them are
// the services the pushes change, so every change reaches every client.
const (
	fleetWatch = 10
	fleetHot   = 5
)

type fleetConfig struct {
	clients, services, endpoints, pushes int
	debounce                             string
	sources                              []string
	storm                                bool
	bin, profile                         string
}

func fleetConfigFromEnv(t *testing.T) fleetConfig {
	num := func(name string, def int) int {
		v := os.Getenv(name)
		if v == "" {
			return def
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number", name, v)
		}
		return n
	}
	c := fleetConfig{
		clients: num("FLEET_CLIENTS", 1000), services: num("FLEET_SERVICES", 1000),
		endpoints: num("FLEET_ENDPOINTS", 10), pushes: num("FLEET_PUSHES", 5),
		debounce: cmpOr(os.Getenv("FLEET_DEBOUNCE"), "0s"),
		storm:    os.Getenv("FLEET_STORM") != "0",
		bin:      os.Getenv("FLEET_ESTUARY"), profile: os.Getenv("FLEET_PROFILE"),
	}
	for _, s := range strings.Split(cmpOr(os.Getenv("FLEET_SOURCES"), "kube,static"), ",") {
		if s != "kube" && s != "static" {
			t.Fatalf("FLEET_SOURCES: unknown source %q (want kube, static)", s)
		}
		c.sources = append(c.sources, s)
	}
	if c.services < fleetWatch {
		t.Fatalf("FLEET_SERVICES=%d: want at least %d", c.services, fleetWatch)
	}
	if c.profile != "" {
		// Made here, not found missing after minutes of connecting.
		if err := os.MkdirAll(c.profile, 0o755); err != nil {
			t.Fatalf("FLEET_PROFILE: %v", err)
		}
	}
	return c
}

// deadline bounds every wait for the whole fleet: the clients are served
// (after connecting or the storm) or hold a change. It only catches a host
// that stopped serving; how long they took is the measurement.
func (c fleetConfig) deadline() time.Duration {
	return 2*time.Minute + time.Duration(c.clients/1000)*time.Minute
}

func cmpOr(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// raiseFDLimit lifts this process's open-file limit to its hard limit:
// every client is a socket here and one in the host, which inherits it.
func raiseFDLimit(t *testing.T) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		t.Fatal(err)
	}
	l.Cur = l.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		t.Fatal(err)
	}
}

// loadAvg is the machine's load, to read every figure against.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "load ?"
	}
	f := strings.Fields(string(b))
	return "load " + strings.Join(f[:3], " ")
}

// fleetWatches picks client i's CLAs: every hot service, and
// fleetWatch-fleetHot others spread over the rest.
func fleetWatches(cluster func(int) string, services int) func(int, string) bool {
	hot := map[string]bool{}
	for s := range fleetHot {
		hot[cluster(s)] = true
	}
	idx := map[string]int{}
	for s := range services {
		idx[cluster(s)] = s
	}
	rest := services - fleetHot
	return func(client int, c string) bool {
		if hot[c] {
			return true
		}
		s, ok := idx[c]
		if !ok || rest <= 0 {
			return false
		}
		off := (s - fleetHot + rest - (client*(fleetWatch-fleetHot))%rest) % rest
		return off < fleetWatch-fleetHot
	}
}

func fleetHostConfig(cfg fleetConfig, xds, admin, plugins string) string {
	return fmt.Sprintf("mesh {\n  cluster_id = \"cluster1\"\n}\nxds {\n  listen = %q\n  debounce_after = %q\n}\nadmin {\n  listen = %q\n}\n%s",
		xds, cfg.debounce, admin, plugins)
}

// fleetRun is one source's run against one host.
type fleetRun struct {
	t       *testing.T
	cfg     fleetConfig
	name    string
	h       *host
	fleet   *xdsload.Fleet
	cluster func(int) string
	rows    []string
}

func (r *fleetRun) row(format string, args ...any) {
	s := fmt.Sprintf("%-6s ", r.name) + fmt.Sprintf(format, args...) + "  (" + loadAvg() + ")"
	r.t.Log(s)
	r.rows = append(r.rows, s)
}

func (r *fleetRun) start() {
	t := r.t
	r.forceGC()
	base := footprintOf(t, r.h)
	required := make([]string, r.cfg.services)
	for s := range required {
		required[s] = r.cluster(s)
	}
	var profile func()
	if r.cfg.profile != "" {
		profile = r.profileAsync("cpu-connect", "profile", 10*time.Second)
	}
	stopGen := r.profileSelf("gen-cpu-connect")
	cpu := r.cpuNow()
	t0 := time.Now()
	f, err := xdsload.Start(context.Background(), xdsload.Options{
		Addr: r.h.xds, Clients: r.cfg.clients, Protocol: xdsload.Mixed, Kind: xdsload.Sidecar,
		ClusterID: "cluster1", Network: "network1", Namespace: "load",
		Required: required, WatchEDS: fleetWatches(r.cluster, r.cfg.services),
	})
	if err != nil {
		t.Fatal(err)
	}
	r.fleet = f
	t.Cleanup(f.Close)
	r.waitServed("the initial state")
	took := time.Since(t0)
	stopGen()
	r.row("connect+initial state: %s for %d clients; CPU %s", took.Round(time.Millisecond), r.cfg.clients, r.cpuSince(cpu))
	if profile != nil {
		profile()
	}
	r.footprint(base)
	if r.cfg.profile != "" {
		r.profile("heap", "heap", 0)
	}
}

func (r *fleetRun) waitServed(what string) {
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.deadline())
	defer cancel()
	if err := r.fleet.WaitServed(ctx); err != nil {
		r.t.Fatalf("%s: %v; stats %+v", what, err, r.fleet.Stats())
	}
	r.checkProblems()
}

func (r *fleetRun) checkProblems() {
	if st := r.fleet.Stats(); st.Problems > 0 {
		r.t.Fatalf("%d problems, e.g. %v", st.Problems, r.fleet.Problems())
	}
}

// footprint reports the host's memory per client, after a GC it forces
// through /debug/pprof/heap?gc=1: without one, an idle host keeps the
// garbage of the clients' initial responses until its next cycle. RSS
// keeps what the runtime has not returned to the kernel yet.
func (r *fleetRun) footprint(base footprint.Sample) {
	code := r.forceGC()
	with := footprintOf(r.t, r.h)
	gc := "after a forced GC"
	if code != http.StatusOK {
		gc = "no forced GC (the binary has no /debug/pprof)"
	}
	n := float64(r.cfg.clients)
	per := func(m string) float64 { return (with.Values[m] - base.Values[m]) / n / 1024 }
	f := footprint.Format
	r.row("host heap in use %s → %s, RSS %s → %s: per client %.1f KiB heap, %.1f KiB RSS, %s; goroutines %.0f → %.0f",
		f(footprint.HeapInuse, base.Values[footprint.HeapInuse]), f(footprint.HeapInuse, with.Values[footprint.HeapInuse]),
		f(footprint.RSS, base.Values[footprint.RSS]), f(footprint.RSS, with.Values[footprint.RSS]),
		per(footprint.HeapInuse), per(footprint.RSS), gc, base.Values[footprint.Goroutines], with.Values[footprint.Goroutines])
}

// forceGC makes the host collect twice: gRPC keeps freed message buffers
// in a sync.Pool, which survives one GC (as its victim cache) and not two.
func (r *fleetRun) forceGC() int {
	code, _ := r.h.get("/debug/pprof/heap?gc=1")
	r.h.get("/debug/pprof/heap?gc=1")
	return code
}

func footprintOf(t *testing.T, h *host) footprint.Sample {
	s, err := footprint.Scrape(context.Background(), h.admin+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// pushes makes cfg.pushes changes with write (which returns when its
// write call was made, and the endpoint count it sets on service s) and
// times each from the write to every client's receipt.
func (r *fleetRun) pushes(write func(s, n int) time.Time, plugins func() []int) {
	t := r.t
	var sotw, delta, all []time.Duration
	var hostCPU, pluginCPU, pushSec, genCPU float64
	var firsts []time.Duration
	var profile func()
	if r.cfg.profile != "" {
		profile = r.profileAsync("cpu", "profile", time.Duration(r.cfg.pushes)*2*time.Second)
	}
	before := footprintOf(t, r.h)
	for p := range r.cfg.pushes {
		s := p % fleetHot
		// Each hot service gains an endpoint, then loses it again.
		want := r.cfg.endpoints + 1 - p/fleetHot%2
		cla := r.cluster(s)
		cpu0, pcpu0, gcpu0 := cpuSeconds(t, r.h.cmd.Process.Pid), pluginsCPU(t, plugins()), selfCPU()
		at := write(s, want)
		ctx, cancel := context.WithTimeout(context.Background(), r.cfg.deadline())
		err := r.fleet.Wait(ctx, func(c *xdsload.Client) bool {
			res, ok := c.Resource(resourcev3.EndpointType, cla)
			return ok && res.Endpoints == want
		})
		cancel()
		if err != nil {
			t.Fatalf("push %d (%s → %d endpoints): %v", p, cla, want, err)
		}
		hostCPU += cpuSeconds(t, r.h.cmd.Process.Pid) - cpu0
		pluginCPU += pluginsCPU(t, plugins()) - pcpu0
		genCPU += selfCPU() - gcpu0
		first := time.Duration(1<<63 - 1)
		for _, c := range r.fleet.Clients() {
			res, _ := c.Resource(resourcev3.EndpointType, cla)
			d := res.At.Sub(at)
			first = min(first, d)
			all = append(all, d)
			if c.Index()%2 == 0 {
				sotw = append(sotw, d)
			} else {
				delta = append(delta, d)
			}
		}
		firsts = append(firsts, first)
		// Let the ACKs land and the GC settle between changes.
		time.Sleep(300 * time.Millisecond)
	}
	after := footprintOf(t, r.h)
	if profile != nil {
		profile()
	}
	r.checkProblems()
	n := float64(r.cfg.pushes)
	if c := after.Values["estuary_xds_push_seconds_count"] - before.Values["estuary_xds_push_seconds_count"]; c > 0 {
		pushSec = (after.Values["estuary_xds_push_seconds_sum"] - before.Values["estuary_xds_push_seconds_sum"]) / c
	}
	r.row("convergence over %d changes, write → client: all %s; SotW %s; Delta %s", r.cfg.pushes, pcts(all), pcts(sotw), pcts(delta))
	r.row("per change: host CPU %.3f s, plugin CPU %.3f s, host push (rebuild + hand to streams) %.1f ms", hostCPU/n, pluginCPU/n, pushSec*1000)
	// Where a change's time goes: the first client bounds the source's
	// part (API server, plugin, host pipeline) plus one send; the push's
	// CPU time is its own work, its wall time adds the waits for a CPU;
	// the response wait is a stream's wait to run once handed its
	// response; the rest, to the last client, is the host's gRPC writes
	// and the clients' reads, ACKs included, on the shared cores (the
	// generator's CPU is this process's).
	mean := func(m string) float64 {
		if c := after.Values[m+"_count"] - before.Values[m+"_count"]; c > 0 {
			return (after.Values[m+"_sum"] - before.Values[m+"_sum"]) / c * 1000
		}
		return 0
	}
	r.row("stages per change: write → first client %s (source + one send); push wall %.1f ms, push CPU %.1f ms; response wait for its stream mean %.1f ms; generator CPU %.3f s",
		pcts(firsts), pushSec*1000, mean("estuary_xds_push_cpu_seconds"), mean("estuary_xds_response_wait_seconds"), genCPU/n)
}

// pcts formats p50/p99/max.
func pcts(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	slices.Sort(ds)
	q := func(p float64) time.Duration { return ds[min(len(ds)-1, int(p*float64(len(ds))))] }
	return fmt.Sprintf("p50 %s p99 %s max %s", q(0.5).Round(100*time.Microsecond), q(0.99).Round(100*time.Microsecond), ds[len(ds)-1].Round(100*time.Microsecond))
}

// pluginPIDs are the plugin processes the host runs, from /debug/pluginz.
func (r *fleetRun) pluginPIDs() []int {
	var ps pluginz
	r.h.getJSON("/debug/pluginz", &ps)
	var out []int
	for _, p := range ps {
		out = append(out, p.PID)
	}
	return out
}

// storm kills the host and starts it again on the same addresses, and
// times until every client is served again.
func (r *fleetRun) storm() {
	t := r.t
	if err := r.h.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-r.h.exited
	stopGen := r.profileSelf("gen-cpu-storm")
	self0 := selfCPU()
	t0 := time.Now()
	r.h = r.h.again()
	var profile func()
	if r.cfg.profile != "" {
		// The new host's admin listener comes up with it; the profile
		// starts as soon as it answers, off the storm's clock.
		h := r.h
		done := make(chan struct{})
		go func() {
			defer close(done)
			for code, _ := h.get("/readyz"); code == 0; code, _ = h.get("/readyz") {
				time.Sleep(5 * time.Millisecond)
			}
			r.profile("cpu-storm", "profile", 15*time.Second)
		}()
		profile = func() { <-done }
	}
	r.waitServed("the reconnect storm")
	served := time.Since(t0)
	stopGen()
	cpu := fmt.Sprintf("host %.2f s (all of its life), generator %.2f s", cpuSeconds(t, r.h.cmd.Process.Pid), selfCPU()-self0)
	if profile != nil {
		profile()
	}
	ready := "?"
	// The host is ready by now; /readyz turned 200 at most this late.
	if code, _ := r.h.get("/readyz"); code == http.StatusOK {
		ready = "ready"
	}
	st := r.fleet.Stats()
	r.row("reconnect storm: SIGKILL, restart → all %d clients served again in %s (%s); CPU %s; streams %d, stream errors %d (last: %q), refused by xds limits %s, problems %d",
		r.cfg.clients, served.Round(time.Millisecond), ready, cpu, st.Streams, st.StreamErrors, st.LastStreamError, r.refusals(), st.Problems)
}

// refusals is the host's estuary_xds_limit_refusals_total by limit: a
// client refused backs off, up to 30 s, which a storm's time shows.
func (r *fleetRun) refusals() string {
	_, b := r.h.get("/metrics")
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "estuary_xds_limit_refusals_total{") {
			out = append(out, strings.TrimPrefix(l, "estuary_xds_limit_refusals_total"))
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ", ")
}

// cpuMark is the CPU seconds of the host and of this process (the load
// generator) at one moment.
type cpuMark struct{ host, self float64 }

func (r *fleetRun) cpuNow() cpuMark {
	return cpuMark{cpuSeconds(r.t, r.h.cmd.Process.Pid), selfCPU()}
}

func (r *fleetRun) cpuSince(m cpuMark) string {
	n := r.cpuNow()
	return fmt.Sprintf("host %.2f s, generator %.2f s", n.host-m.host, n.self-m.self)
}

// selfCPU is this process's user+system CPU seconds: the load
// generator's, which shares the machine with the host.
func selfCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// profileSelf starts a CPU profile of this process (the load generator)
// into FLEET_PROFILE, if set, and returns what stops it.
func (r *fleetRun) profileSelf(name string) (stop func()) {
	if r.cfg.profile == "" {
		return func() {}
	}
	out := filepath.Join(r.cfg.profile, fmt.Sprintf("%s-%s-%d.pprof", name, r.name, r.cfg.clients))
	f, err := os.Create(out)
	if err != nil {
		r.t.Fatalf("profile: %v", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		r.t.Fatalf("profile %s: %v", out, err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			r.t.Errorf("profile %s: %v", out, err)
		}
	}
}

// profile saves /debug/pprof/<path> of the host as FLEET_PROFILE/<name>-<source>.pprof.
func (r *fleetRun) profile(name, path string, d time.Duration) {
	r.profileAsync(name, path, d)()
}

func (r *fleetRun) profileAsync(name, path string, d time.Duration) (wait func()) {
	var wg sync.WaitGroup
	url := r.h.admin + "/debug/pprof/" + path
	if d > 0 {
		url += fmt.Sprintf("?seconds=%d", int(d.Seconds())+1)
	}
	out := filepath.Join(r.cfg.profile, fmt.Sprintf("%s-%s-%d.pprof", name, r.name, r.cfg.clients))
	wg.Go(func() {
		resp, err := http.Get(url)
		if err != nil {
			r.t.Errorf("profile %s: %v", url, err)
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			r.t.Errorf("profile %s: %s", url, resp.Status)
			return
		}
		b, err := io.ReadAll(resp.Body)
		if err == nil {
			err = os.WriteFile(out, b, 0o644)
		}
		if err != nil {
			r.t.Errorf("profile %s: %v", out, err)
		}
	})
	return wg.Wait
}

// fleetKube serves the registry from a real kube-apiserver.
func fleetKube(t *testing.T, cfg fleetConfig) []string {
	k := testbed.StartKube(t)
	c := fleetKubeClient(t, k)
	t0 := time.Now()
	eps := fleetPopulate(t, c, cfg)
	t.Logf("kube: created %d services and EndpointSlices in %s", cfg.services, time.Since(t0).Round(time.Millisecond))
	plugins := fmt.Sprintf("plugin \"kubernetes\" {\n  config {\n    kubeconfig = %q\n    cluster_id = \"cluster1\"\n  }\n}\n", k.Kubeconfig)
	t0 = time.Now()
	h := startHostFile(t, func(xds, admin string) string { return fleetHostConfig(cfg, xds, admin, plugins) })
	r := &fleetRun{t: t, cfg: cfg, name: "kube", h: h, cluster: func(s int) string {
		return model.ClusterName(80, "", fmt.Sprintf("svc-%04d.%s.svc.cluster.local", s, fleetNS))
	}}
	r.row("host start → ready (1 API server, %d endpoints): %s", cfg.services*cfg.endpoints, time.Since(t0).Round(time.Millisecond))
	r.start()
	r.pushes(func(s, n int) time.Time {
		sl := eps[s].DeepCopy()
		sl.Endpoints = fleetSliceEndpoints(s, n)
		at := time.Now()
		got, err := c.DiscoveryV1().EndpointSlices(fleetNS).Update(context.Background(), sl, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		eps[s] = got
		return at
	}, r.pluginPIDs)
	if cfg.storm {
		r.storm()
	}
	return r.rows
}

func fleetKubeClient(t *testing.T, k *testbed.Kube) kubernetes.Interface {
	rc := k.RestConfig()
	rc.QPS, rc.Burst = 5000, 5000
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func fleetSliceEndpoints(s, n int) []discoveryv1.Endpoint {
	out := make([]discoveryv1.Endpoint, n)
	for e := range out {
		out[e] = discoveryv1.Endpoint{
			Addresses:  []string{fmt.Sprintf("10.%d.%d.%d", 100+s>>8, s&255, e+1)},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
		}
	}
	return out
}

// fleetPopulate creates the services and their EndpointSlices with a few
// concurrent writers, and returns the slices by service.
func fleetPopulate(t *testing.T, c kubernetes.Interface, cfg fleetConfig) []*discoveryv1.EndpointSlice {
	ctx := context.Background()
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fleetNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	out := make([]*discoveryv1.EndpointSlice, cfg.services)
	work := make(chan int)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	for range 16 {
		wg.Go(func() {
			for s := range work {
				name := fmt.Sprintf("svc-%04d", s)
				_, err := c.CoreV1().Services(fleetNS).Create(ctx, &corev1.Service{
					ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: fleetNS},
					Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
				}, metav1.CreateOptions{})
				var sl *discoveryv1.EndpointSlice
				if err == nil {
					sl, err = c.DiscoveryV1().EndpointSlices(fleetNS).Create(ctx, &discoveryv1.EndpointSlice{
						ObjectMeta:  metav1.ObjectMeta{Name: name + "-1", Namespace: fleetNS, Labels: map[string]string{discoveryv1.LabelServiceName: name}},
						AddressType: discoveryv1.AddressTypeIPv4,
						Endpoints:   fleetSliceEndpoints(s, cfg.endpoints),
						Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}},
					}, metav1.CreateOptions{})
				}
				mu.Lock()
				out[s] = sl
				if err != nil && first == nil {
					first = fmt.Errorf("service %s: %w", name, err)
				}
				mu.Unlock()
			}
		})
	}
	for s := range cfg.services {
		work <- s
	}
	close(work)
	wg.Wait()
	if first != nil {
		t.Fatal(first)
	}
	return out
}

// fleetStatic serves the same registry from the static plugin; a change
// rewrites plugins.hcl and sends SIGHUP.
func fleetStatic(t *testing.T, cfg fleetConfig) []string {
	counts := make([]int, cfg.services)
	for s := range counts {
		counts[s] = cfg.endpoints
	}
	blocks := func() string { return fleetStaticBlocks(counts) }
	h := startHostFile(t, func(xds, admin string) string { return fleetHostConfig(cfg, xds, admin, blocks()) })
	r := &fleetRun{t: t, cfg: cfg, name: "static", h: h, cluster: func(s int) string {
		return model.ClusterName(8080, "", fmt.Sprintf("svc-%04d.%s.svc.cluster.local", s, fleetNS))
	}}
	size, _ := os.Stat(h.config)
	r.row("plugins.hcl %d KiB, %d endpoints; estuary validate %s", size.Size()>>10, cfg.services*cfg.endpoints, timeValidate(t, h.config))
	r.start()
	r.pushes(func(s, n int) time.Time {
		counts[s] = n
		content := fleetHostConfig(cfg, h.xds, strings.TrimPrefix(h.admin, "http://"), blocks())
		at := time.Now()
		h.write(content)
		h.signal(syscall.SIGHUP)
		return at
	}, r.pluginPIDs)
	return r.rows
}

// timeValidate times `estuary validate` on the file: the host's decode
// of it, and each plugin's check of its config block.
func timeValidate(t *testing.T, path string) time.Duration {
	t0 := time.Now()
	out, err := exec.Command(estuaryBin, "validate", "-config", path).CombinedOutput()
	if err != nil {
		t.Fatalf("estuary validate: %v\n%s", err, out)
	}
	return time.Since(t0).Round(time.Millisecond)
}
