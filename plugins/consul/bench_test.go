package consul

import (
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/sdktest"
	"github.com/estuary-mesh/estuary/testbed"
)

const (
	benchServices  = 2000
	benchInstances = 10 // per service, one on each of benchInstances nodes
	benchEndpoints = benchServices * benchInstances
)

// BenchmarkConsul registers 2,000 services × 10 instances in a dev agent
// (through the transaction API, on 10 catalog nodes) and measures:
//
//   - sync: from plugin start until the replica holds all 20,000 endpoints
//     (target: at most 5 s);
//   - quiet: requests per second the plugin sends the agent while nothing
//     changes, counted by a reverse proxy in front of the agent. Each watch
//     sends one request per wait_time (plus Consul's jitter of up to
//     wait/16), so the bound is (services + 1) / wait_time. It is measured
//     twice: with wait_time = 10s over 35 s (three expiries of every watch)
//     and with the default 5m over one minute, where no request is due.
func BenchmarkConsul(b *testing.B) {
	c := testbed.StartConsul(b, testbed.ConsulHCL("limits { http_max_conns_per_client = 10000 }"))
	registerBulk(b, c.Client())
	config := func(addr, waitTime string, extra ...string) string {
		return agentConfig(addr, append([]string{fmt.Sprintf("wait_time = %q", waitTime), "max_watchers = 2500"}, extra...)...)
	}

	// The default rate_limit (1000 requests/s, burst 1000) paces the 2,001
	// first lists; the second run lifts it to show what the agent allows.
	for _, limit := range []string{"default", "5000"} {
		b.Run("sync/rate_limit="+limit, func(b *testing.B) {
			var extra []string
			if limit != "default" {
				extra = append(extra, "rate_limit = "+limit)
			}
			var total, cpu time.Duration
			for range b.N {
				cpu0 := processCPU()
				d, h := syncOnce(b, config(c.Addr, "5m", extra...))
				cpu += processCPU() - cpu0
				h.Kill()
				total += d
			}
			b.ReportMetric(total.Seconds()/float64(b.N), "s/sync")
			// CPU of this process (plugin, gRPC and replica; not the agent),
			// a figure the other load on a shared machine does not inflate.
			b.ReportMetric(cpu.Seconds()/float64(b.N), "cpu-s/sync")
			b.ReportMetric(float64(benchEndpoints*b.N)/total.Seconds(), "endpoints/s")
		})
	}
	for _, q := range []struct {
		wait   time.Duration
		window time.Duration
	}{
		{10 * time.Second, 35 * time.Second},
		{5 * time.Minute, time.Minute},
	} {
		b.Run("quiet/wait="+q.wait.String(), func(b *testing.B) {
			px := startProxy(b, c.Addr)
			for range b.N {
				syncReq := px.count.Load()
				_, h := syncOnce(b, config(px.addr(), q.wait.String()))
				syncReq = px.count.Load() - syncReq
				start := px.count.Load()
				time.Sleep(q.window)
				quiet := px.count.Load() - start
				h.Kill()
				b.ReportMetric(float64(syncReq), "sync-requests")
				b.ReportMetric(float64(quiet)/q.window.Seconds(), "quiet-req/s")
				b.ReportMetric(float64(benchServices+1)/q.wait.Seconds(), "bound-req/s")
			}
		})
	}
}

// processCPU is the user and system CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// syncOnce starts the plugin and waits until the replica holds every
// endpoint; it returns the time that took and the running plugin.
func syncOnce(b *testing.B, config string) (time.Duration, *sdktest.Harness) {
	b.Helper()
	t0 := time.Now()
	h := sdktest.Start(b, Factory)
	h.Configure(b, config, sdk.MeshSettings{})
	w := h.Watch(b)
	w.WaitFor(b, 5*time.Minute, "20,000 endpoints", func(r *sdktest.Replica) bool {
		in := dc1(r)
		if in == nil {
			return false
		}
		n := 0
		for _, eps := range in.Endpoints {
			n += len(eps)
		}
		return n >= benchEndpoints
	})
	d := time.Since(t0)
	w.Stop()
	return d, h
}

// registerBulk registers the benchmark's services, 128 operations (Consul's
// limit) per transaction, four transactions at a time.
func registerBulk(b *testing.B, c *api.Client) {
	b.Helper()
	t0 := time.Now()
	var ops api.TxnOps
	for n := range benchInstances {
		ops = append(ops, &api.TxnOp{Node: &api.NodeTxnOp{Verb: api.NodeSet, Node: api.Node{
			Node: fmt.Sprintf("node-%d", n), Address: fmt.Sprintf("10.%d.0.1", n), Meta: map[string]string{"zone": fmt.Sprintf("z%d", n%3)},
		}}})
	}
	if ok, resp, _, err := c.Txn().Txn(ops, nil); err != nil || !ok {
		b.Fatalf("register nodes: %v %+v", err, resp)
	}
	batches := make(chan api.TxnOps)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() {
			for ops := range batches {
				ok, resp, _, err := c.Txn().Txn(ops, nil)
				if err == nil && !ok {
					err = fmt.Errorf("transaction rolled back: %+v", resp.Errors)
				}
				if err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		})
	}
	ops = nil
	for s := range benchServices {
		for n := range benchInstances {
			ops = append(ops, &api.TxnOp{Service: &api.ServiceTxnOp{Verb: api.ServiceSet, Node: fmt.Sprintf("node-%d", n), Service: api.AgentService{
				ID: fmt.Sprintf("svc-%04d-%d", s, n), Service: fmt.Sprintf("svc-%04d", s), Port: 8080, Tags: []string{"http", "version=v1"},
				Address: fmt.Sprintf("10.%d.%d.%d", n, s/250, s%250+2),
			}}})
			if len(ops) == 128 {
				batches <- ops
				ops = nil
			}
		}
	}
	if len(ops) > 0 {
		batches <- ops
	}
	close(batches)
	wg.Wait()
	select {
	case err := <-errs:
		b.Fatalf("register services: %v", err)
	default:
	}
	services, _, err := c.Catalog().Services(nil)
	if err != nil || len(services) != benchServices+1 {
		b.Fatalf("catalog lists %d services (%v), want %d", len(services), err, benchServices+1)
	}
	b.Logf("registered %d services × %d instances in %.1fs", benchServices, benchInstances, time.Since(t0).Seconds())
}
