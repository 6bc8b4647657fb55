//go:build soak

package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/testbed/footprint"
	"github.com/estuary-mesh/estuary/testbed/xdsload"
)

// TestSoak is `make soak` (issue 11, point 8): the real binary with two
// static plugins, SOAK_CLIENTS xDS clients (default 1,000, each on its own
// connection, half SotW and half Delta), and SOAK_DURATION (default 1h) of
// churn: endpoints and services change through plugins.hcl and SIGHUP,
// plugin processes are killed with SIGKILL, and waves of clients reconnect.
// It samples the host's heap, goroutines, file descriptors and RSS from
// /metrics soakScrapesPerRow times per SOAK_INTERVAL (default 1m), always
// at a quiet moment, and prints a row every SOAK_INTERVAL.
//
// It fails if the host dies, if it stops converging (every client holding
// exactly the registry's clusters and endpoints within soakConverge of a
// change), if any client ever received a configuration that would cost a
// proxy endpoints it had (an empty or partial CDS, an empty CLA of a
// service that never goes away, a NACK-worthy resource), or if the host's
// resource use at the end exceeds its baseline after warm-up (SOAK_WARMUP,
// default a sixth of the run, from 1m to 5m) by more than soakLimits allow.
//
// SOAK_SEED replays a run's choice of changes.
func TestSoak(t *testing.T) {
	cfg := soakConfigFromEnv(t)
	if dl, ok := t.Deadline(); ok && time.Until(dl) < cfg.duration+5*time.Minute {
		t.Fatalf("go test -timeout leaves %s, too little for SOAK_DURATION=%s plus start-up: raise it", time.Until(dl).Round(time.Second), cfg.duration)
	}
	w := newSoakWorld(cfg.seed)
	h := startHost(t, w.blocks())
	fleet, err := xdsload.Start(context.Background(), xdsload.Options{
		Addr: h.xds, Clients: cfg.clients, Protocol: xdsload.Mixed, Kind: xdsload.Sidecar,
		ClusterID: "cluster1", Network: "network1", Namespace: "soak",
		Required: w.required(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fleet.Close)
	s := &soak{t: t, cfg: cfg, h: h, fleet: fleet, world: w, start: time.Now(), base: -1}
	t.Logf("soak: %d clients (SotW and Delta), %s, a row every %s (%d scrapes), warm-up %s, seed %d",
		cfg.clients, cfg.duration, cfg.interval, soakScrapesPerRow, cfg.warmup.Round(time.Second), cfg.seed)
	s.converge("the first configuration")
	t.Logf("soak: all %d clients served in %s", cfg.clients, time.Since(s.start).Round(time.Millisecond))
	s.run()
	s.finish()
}

// soakConverge bounds how long every client may take to hold a change.
// A 2-core machine shared with other builds can be slow; a host that has
// stopped pushing never converges.
const soakConverge = 2 * time.Minute

// soakLimits are how much the host may grow from the baseline (its level
// over the first SOAK_INTERVAL after warm-up) to the end (its level over
// the last SOAK_INTERVAL); a level is the minimum of that interval's
// samples. Samples are taken at quiet moments: every client connected and
// served, no plugin restarting. (A 6-minute run at 200 clients showed the
// heap goal swinging between 31 and 42 MiB from one sample to the next
// with no trend: hence floors over several samples, not single ones.)
var soakLimits = []footprint.Limit{
	// Heap: the GC's goal, which moves with what survived the last GC
	// (see footprint.HeapGoal). +25% leaves room for the registry's size at
	// the moment (churned services come and go, and each is built per
	// view and kept marshaled) and for responses still queued to slow
	// clients; a per-client or per-push leak passes it within the hour.
	{Metric: footprint.HeapGoal, Rel: 0.25},
	// RSS: the same tolerance as the heap, which dominates it; it also
	// shows stacks of leaked goroutines and memory outside the Go heap.
	{Metric: footprint.RSS, Rel: 0.25},
	// Goroutines: at a quiet moment their number is a function of the
	// clients and plugins, which are the same at every sample. 50 covers
	// what comes and goes (the scrape's own handler, timers, a keepalive
	// ping); a leak of one goroutine per reconnect (a wave reconnects a
	// tenth of the clients) or per plugin restart exceeds it in minutes.
	{Metric: footprint.Goroutines, Abs: 50},
	// File descriptors: one per client connection, plus each plugin's
	// pipes and sockets. 20 covers the scrape's connection and a plugin's
	// sockets being replaced; a descriptor leaked per reconnect or per
	// plugin restart exceeds it.
	{Metric: footprint.FDs, Abs: 20},
}

type soakConfig struct {
	duration, interval, warmup time.Duration
	clients                    int
	seed                       uint64
}

func soakConfigFromEnv(t *testing.T) soakConfig {
	dur := func(name string, def time.Duration) time.Duration {
		v := os.Getenv(name)
		if v == "" {
			return def
		}
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("%s=%q: want a positive duration such as 1h or 3m", name, v)
		}
		return d
	}
	num := func(name string, def uint64) uint64 {
		v := os.Getenv(name)
		if v == "" {
			return def
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: want a number", name, v)
		}
		return n
	}
	c := soakConfig{duration: dur("SOAK_DURATION", time.Hour), interval: dur("SOAK_INTERVAL", time.Minute)}
	c.warmup = dur("SOAK_WARMUP", min(max(c.duration/6, time.Minute), 5*time.Minute, c.duration/2))
	c.clients = int(num("SOAK_CLIENTS", 1000))
	c.seed = num("SOAK_SEED", uint64(time.Now().UnixNano()))
	if c.clients < 10 {
		t.Fatalf("SOAK_CLIENTS=%d: want at least 10", c.clients)
	}
	return c
}

// Churn rates. One registry change per tick; plugin kills and reconnect
// waves on their own periods.
const (
	soakScrapesPerRow = 6
	soakTick          = time.Second
	soakKillEvery     = 45 * time.Second
	soakWaveEvery     = 20 * time.Second
	soakWaveShare     = 10 // a wave reconnects 1/soakWaveShare of the clients
	soakAnchors       = 2  // endpoints a stable service always keeps
	soakMaxExtra      = 4  // endpoints churn adds to a stable service
	soakMaxChurned    = 3  // endpoints of a churned service
)

// soakService is one service of a static plugin. Stable services never go
// away and keep soakAnchors endpoints; churned ones come and go.
type soakService struct {
	host      string
	stable    bool
	present   bool
	endpoints int
	net       [2]int // the 10.A.B.0/24 its endpoints live in
}

type soakPlugin struct {
	label, cluster string
	services       []*soakService
}

// soakWorld is what the static plugins serve; churn changes it.
type soakWorld struct {
	rng     *rand.Rand
	plugins []*soakPlugin
}

func newSoakWorld(seed uint64) *soakWorld {
	w := &soakWorld{rng: rand.New(rand.NewPCG(seed, seed>>1|1))}
	for p, shape := range []struct {
		label, cluster, prefix string
		stable, churned        int
	}{
		{"static", "cluster1", "s", 20, 10},
		{"east", "cluster2", "e", 10, 5},
	} {
		pl := &soakPlugin{label: shape.label, cluster: shape.cluster}
		for i := range shape.stable + shape.churned {
			svc := &soakService{host: fmt.Sprintf("%s%02d.soak.svc.cluster.local", shape.prefix, i), stable: i < shape.stable, net: [2]int{100 + p, i}}
			if svc.stable {
				svc.present, svc.endpoints = true, soakAnchors+w.rng.IntN(soakMaxExtra+1)
			} else if w.rng.IntN(2) == 0 {
				svc.present, svc.endpoints = true, 1+w.rng.IntN(soakMaxChurned)
			}
			pl.services = append(pl.services, svc)
		}
		w.plugins = append(w.plugins, pl)
	}
	return w
}

// blocks renders the plugin blocks of plugins.hcl.
func (w *soakWorld) blocks() string {
	var b strings.Builder
	for _, p := range w.plugins {
		fmt.Fprintf(&b, "plugin %q {\n", p.label)
		if p.label != "static" {
			b.WriteString("  bundled = \"static\"\n")
		}
		fmt.Fprintf(&b, "  config {\n    cluster = %q\n    network = \"network1\"\n", p.cluster)
		for _, s := range p.services {
			if !s.present {
				continue
			}
			fmt.Fprintf(&b, "    service %q {\n      namespace = \"soak\"\n      port \"http\" {\n        number   = 8080\n        protocol = \"HTTP\"\n      }\n", s.host)
			for e := range s.endpoints {
				fmt.Fprintf(&b, "      endpoint {\n        address = \"10.%d.%d.%d\"\n        ports   = { http = 8080 }\n      }\n", s.net[0], s.net[1], e+1)
			}
			b.WriteString("    }\n")
		}
		b.WriteString("  }\n}\n")
	}
	return b.String()
}

func soakCluster(host string) string { return model.ClusterName(8080, "", host) }

// required lists the clusters of the stable services.
func (w *soakWorld) required() []string {
	var out []string
	for _, p := range w.plugins {
		for _, s := range p.services {
			if s.stable {
				out = append(out, soakCluster(s.host))
			}
		}
	}
	return out
}

// want maps every cluster a client should hold to its endpoint count.
func (w *soakWorld) want() map[string]int {
	out := map[string]int{}
	for _, p := range w.plugins {
		for _, s := range p.services {
			if s.present {
				out[soakCluster(s.host)] = s.endpoints
			}
		}
	}
	return out
}

// churn makes one change to the registry and describes it: new endpoint
// counts for one to three stable services, or a churned service added or
// removed.
func (w *soakWorld) churn() string {
	p := w.plugins[w.rng.IntN(len(w.plugins))]
	if w.rng.IntN(10) < 7 {
		var changed []string
		for range 1 + w.rng.IntN(3) {
			s := p.services[w.rng.IntN(len(p.services))]
			if !s.stable {
				continue
			}
			s.endpoints = soakAnchors + (s.endpoints-soakAnchors+1+w.rng.IntN(soakMaxExtra))%(soakMaxExtra+1)
			changed = append(changed, fmt.Sprintf("%s=%d", s.host, s.endpoints))
		}
		if len(changed) > 0 {
			return "endpoints " + strings.Join(changed, " ")
		}
	}
	var churned []*soakService
	for _, s := range p.services {
		if !s.stable {
			churned = append(churned, s)
		}
	}
	s := churned[w.rng.IntN(len(churned))]
	s.present = !s.present
	if s.present {
		s.endpoints = 1 + w.rng.IntN(soakMaxChurned)
		return fmt.Sprintf("add %s (%d endpoints)", s.host, s.endpoints)
	}
	return "remove " + s.host
}

// soak is one run.
type soak struct {
	t     *testing.T
	cfg   soakConfig
	h     *host
	fleet *xdsload.Fleet
	world *soakWorld
	start time.Time

	reloads, kills, waves, reconnects int
	durations                         []time.Duration // to converge, per change
	worstSince                        time.Duration   // slowest convergence since the last row
	samples                           []footprint.Sample
	rowFrom                           int // first sample of the next row
	rows                              []string
	base                              int // index of the baseline sample; -1 during warm-up
}

// run churns until the duration has passed, sampling on the way.
func (s *soak) run() {
	s.scrape()
	s.row()
	end := s.start.Add(s.cfg.duration)
	scrapeEvery := max(s.cfg.interval/soakScrapesPerRow, soakTick)
	nextScrape, nextRow := s.start.Add(scrapeEvery), s.start.Add(s.cfg.interval)
	nextKill := s.start.Add(soakKillEvery)
	nextWave := s.start.Add(soakWaveEvery)
	tick := time.NewTicker(soakTick)
	defer tick.Stop()
	for time.Now().Before(end) {
		select {
		case <-s.h.exited:
			s.t.Fatalf("estuary exited during the soak")
		case <-tick.C:
		}
		now := time.Now()
		switch {
		case now.After(nextKill):
			nextKill = now.Add(soakKillEvery)
			s.killPlugin(s.world.plugins[s.kills%len(s.world.plugins)].label)
		case now.After(nextWave):
			nextWave = now.Add(soakWaveEvery)
			s.reconnectWave()
		default:
			what := s.world.churn()
			s.h.rewrite(s.world.blocks())
			s.h.signal(syscall.SIGHUP)
			s.reloads++
			s.converge(what)
		}
		if now := time.Now(); now.After(nextScrape) {
			nextScrape = nextScrape.Add(scrapeEvery)
			s.scrape()
			if now.After(nextRow) {
				nextRow = nextRow.Add(s.cfg.interval)
				s.row()
			}
		}
	}
	if time.Since(s.samples[len(s.samples)-1].At) > scrapeEvery/2 {
		s.scrape()
	}
	s.row()
}

// converge waits until every client holds exactly the world's clusters,
// each with its endpoints.
func (s *soak) converge(what string) {
	s.t.Helper()
	want := s.world.want()
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), soakConverge)
	defer cancel()
	ok := func(c *xdsload.Client) bool {
		if !c.Served() {
			return false
		}
		for name, n := range want {
			if r, held := c.Resource(resourcev3.EndpointType, name); !held || r.Endpoints != n {
				return false
			}
		}
		return len(c.Clusters()) == len(want)
	}
	if err := s.fleet.Wait(ctx, ok); err != nil {
		for _, c := range s.fleet.Clients() {
			if !ok(c) {
				s.t.Errorf("client %d (served %v) holds %v", c.Index(), c.Served(), c.Clusters())
				break
			}
		}
		s.t.Fatalf("after %s: %v; want %v; fleet %+v", what, err, want, s.fleet.Stats())
	}
	d := time.Since(began)
	s.durations = append(s.durations, d)
	s.worstSince = max(s.worstSince, d)
}

// killPlugin sends SIGKILL to a plugin process and waits until the host
// has restarted it and every client still holds everything.
func (s *soak) killPlugin(label string) {
	_, pid, restarts := s.h.plugin(label)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		s.t.Fatalf("kill plugin %s (pid %d): %v", label, pid, err)
	}
	s.kills++
	s.h.eventually("plugin "+label+" to restart", soakConverge, func() bool {
		state, newPID, n := s.h.plugin(label)
		return state == "running" && newPID != pid && n > restarts
	})
	s.converge("killing plugin " + label)
}

// reconnectWave closes the connections of a random tenth of the clients
// and opens new ones, as proxies restarting in a rollout do.
func (s *soak) reconnectWave() {
	clients := s.fleet.Clients()
	for _, i := range s.world.rng.Perm(len(clients))[:len(clients)/soakWaveShare] {
		if err := clients[i].Reconnect(); err != nil {
			s.t.Fatal(err)
		}
		s.reconnects++
	}
	s.waves++
	s.converge("a reconnect wave")
}

const soakHeader = "|      t | heap inuse | heap goal |     RSS | goroutines |  fds | xds clients | cpu | reloads | kills | reconnects | worst converge | problems |"

// scrape reads the host's metrics.
func (s *soak) scrape() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sm, err := footprint.Scrape(ctx, s.h.admin+"/metrics")
	if err != nil {
		s.t.Fatal(err)
	}
	if s.base < 0 && sm.At.Sub(s.start) >= s.cfg.warmup {
		s.base = len(s.samples)
	}
	s.samples = append(s.samples, sm)
}

// row prints the floor (the minimum) of each metric over the samples
// since the last row: what the growth check compares.
func (s *soak) row() {
	if s.rowFrom == len(s.samples) {
		return
	}
	span := s.samples[s.rowFrom:]
	last := span[len(span)-1]
	floor := func(m string) string {
		v := last.Values[m]
		for _, sm := range span {
			v = min(v, sm.Values[m])
		}
		return footprint.Format(m, v)
	}
	cpu := "-"
	if s.rowFrom > 0 {
		prev := s.samples[s.rowFrom-1]
		const m = "process_cpu_seconds_total"
		cpu = fmt.Sprintf("%.0f%%", 100*(last.Values[m]-prev.Values[m])/last.At.Sub(prev.At).Seconds())
	}
	s.rowFrom = len(s.samples)
	row := fmt.Sprintf("| %6s | %10s | %9s | %7s | %10s | %4s | %11.0f | %3s | %7d | %5d | %10d | %14s | %8d |",
		last.At.Sub(s.start).Round(time.Second).String(), floor(footprint.HeapInuse), floor(footprint.HeapGoal), floor(footprint.RSS),
		floor(footprint.Goroutines), floor(footprint.FDs), last.Values["estuary_xds_clients"], cpu,
		s.reloads, s.kills, s.reconnects, s.worstSince.Round(time.Millisecond), s.fleet.Stats().Problems)
	if len(s.rows) == 0 {
		s.t.Logf("each row: the floor of each metric over the interval's samples; cpu over the interval")
		s.t.Log(soakHeader)
	}
	s.rows = append(s.rows, row)
	s.worstSince = 0
	s.t.Log(row)
}

// finish prints the summary and fails on growth, problems or a dead host.
func (s *soak) finish() {
	t := s.t
	select {
	case <-s.h.exited:
		t.Fatalf("estuary exited during the soak")
	default:
	}
	var b strings.Builder
	fmt.Fprintf(&b, "soak summary: %s, %d clients, seed %d\n%s\n", s.cfg.duration, s.cfg.clients, s.cfg.seed, soakHeader)
	for _, r := range s.rows {
		b.WriteString(r + "\n")
	}
	slices.Sort(s.durations)
	q := func(p int) time.Duration { return s.durations[(len(s.durations)-1)*p/100].Round(time.Millisecond) }
	st := s.fleet.Stats()
	fmt.Fprintf(&b, "changes %d (reloads %d, plugin kills %d, reconnect waves %d with %d reconnects); every client converged: p50 %s, p99 %s, max %s\n",
		len(s.durations), s.reloads, s.kills, s.waves, s.reconnects, q(50), q(99), q(100))
	fmt.Fprintf(&b, "clients: %d streams, %d ended by the server, %d responses, %d ACKs, %d NACKs, %d problems\n",
		st.Streams, st.StreamErrors, st.Responses, st.ACKs, st.NACKs, st.Problems)
	results, err := footprint.Check(s.samples, max(s.base, 0), soakScrapesPerRow, soakLimits)
	if err != nil {
		t.Fatalf("%s%v (run longer than SOAK_WARMUP plus two SOAK_INTERVALs)", b.String(), err)
	}
	fmt.Fprintf(&b, "growth from the baseline after warm-up (%s) to the end, each the floor of up to %d samples:\n",
		s.samples[max(s.base, 0)].At.Sub(s.start).Round(time.Second), soakScrapesPerRow)
	for _, r := range results {
		fmt.Fprintf(&b, "  %s\n", r)
	}
	t.Log(b.String())
	for _, r := range results {
		if r.Grew {
			t.Errorf("the host grew: %s", r)
		}
	}
	if st.Problems > 0 {
		for _, p := range s.fleet.Problems() {
			t.Errorf("client problem: %s", p)
		}
		t.Errorf("%d problems in all", st.Problems)
	}
}
