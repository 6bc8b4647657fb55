package xds

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/estuary-mesh/estuary/host/model"
	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
)

// edsShapes are the endpoints-per-service / services shapes of Istio's
// BenchmarkEndpointGeneration.
var edsShapes = []struct{ endpoints, services int }{
	{1, 100}, {10, 10}, {100, 10}, {1000, 1}, {10000, 1}, {100, 100},
}

var proxylessView = model.View{Kind: model.KindProxyless, Network: "network1", Cluster: "cluster1"}

// BenchmarkEDSGeneration builds every CLA from scratch (no cache) with
// locality, weight and network/cluster/tlsMode metadata on every endpoint,
// including marshalling. One op builds all CLAs of the shape.
func BenchmarkEDSGeneration(b *testing.B) {
	for _, sh := range edsShapes {
		b.Run(fmt.Sprintf("endpoints=%d/services=%d", sh.endpoints, sh.services), func(b *testing.B) {
			f := newFixture(b)
			f.populate(sh.services, sh.endpoints)
			gen := NewGenerator(f.agg, nil)
			names := make([]string, sh.services)
			for i := range names {
				names[i] = model.ClusterName(8080, "", svcHost(i))
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				for _, n := range names {
					if gen.CLA(proxylessView, n, nil) == nil {
						b.Fatal("no CLA")
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*sh.endpoints*sh.services), "ns/endpoint")
		})
	}
}

// BenchmarkEDSRegenerateUnchanged asks again for CLAs whose inputs did not
// change: the previous resource must come back without being rebuilt.
func BenchmarkEDSRegenerateUnchanged(b *testing.B) {
	for _, sh := range edsShapes {
		b.Run(fmt.Sprintf("endpoints=%d/services=%d", sh.endpoints, sh.services), func(b *testing.B) {
			f := newFixture(b)
			f.populate(sh.services, sh.endpoints)
			gen := NewGenerator(f.agg, nil)
			prev := make([]*Resource, sh.services)
			for i := range prev {
				prev[i] = gen.CLA(proxylessView, model.ClusterName(8080, "", svcHost(i)), nil)
			}
			b.ResetTimer()
			for b.Loop() {
				for i, p := range prev {
					if gen.CLA(proxylessView, p.Name, p) != prev[i] {
						b.Fatal("unchanged CLA was rebuilt")
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*sh.endpoints*sh.services), "ns/endpoint")
		})
	}
}

// BenchmarkPushOneChange: 1,000 watchers over 10,000 CLAs (each watches
// ten), one CLA changes. Only its one watcher may be answered.
func BenchmarkPushOneChange(b *testing.B) {
	const services, watchers, perWatcher = 10000, 1000, 10
	f := newFixture(b)
	f.populate(services, 1)
	c := NewCache(NewGenerator(f.agg, nil))
	ws := openEDSWatches(b, c, proxylessView, watchers, perWatcher, services)
	benchPushService0(b, f, c, ws, 1)
}

// benchPushService0 times pushes of alternating endpoints of service 0,
// each of which must answer want watches of ws; re-opening the answered
// watches, as the clients' ACKs would, is not timed.
func benchPushService0(b *testing.B, f *fixture, c *Cache, ws watcherSet, want int) {
	variants := [2][]*registryv1.Endpoint{genEndpoints(1, 1), genEndpoints(1, 2)}
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		f.endpoints(svcHost(0), variants[i%2])
		ws.rearm(b, c)
		b.StartTimer()
		st := c.Push(model.Change{Services: map[string]bool{svcHost(0): false}})
		if st.Total() != want {
			b.Fatalf("push answered %d watches, want %d", st.Total(), want)
		}
	}
	b.StopTimer()
	ws.rearm(b, c)
}

// BenchmarkPushAllWatchers: the fleet's shape in one view, without the
// network. 10,000 watchers (one per client; the cache does not care how
// they are spread over connections, so none are opened) each watch 10 of
// 1,000 CLAs, one of which they all share. That one changes: every watcher
// is answered and dropped from each of its ten name sets, one of which
// holds all 10,000. One op is the push alone.
func BenchmarkPushAllWatchers(b *testing.B) {
	const services, watchers, perWatcher = 1000, 10000, 10
	f := newFixture(b)
	f.populate(services, 1)
	c := NewCache(NewGenerator(f.agg, nil))
	ws := openEDSWatchesOf(b, c, proxylessView, watchers, func(i int) []string {
		names := []string{model.ClusterName(8080, "", svcHost(0))}
		for j := 1; j < perWatcher; j++ {
			names = append(names, model.ClusterName(8080, "", svcHost(1+(i*(perWatcher-1)+j)%(services-1))))
		}
		return names
	})
	benchPushService0(b, f, c, ws, watchers)
}

// BenchmarkHeapPerEndpoint reports the host's heap at 100,000 endpoints
// (1,000 services × 100) with 1,000 proxyless clients each watching 10
// CLAs: the replica per endpoint, the view's marshaled CLAs per endpoint
// (shared by every client of the view), everything per endpoint, and what
// each client's watches cost on top.
func BenchmarkHeapPerEndpoint(b *testing.B) {
	const services, perService, clients = 1000, 100, 1000
	const endpoints = services * perService
	for b.Loop() {
		base := heapInUse()
		f := newFixture(b)
		f.populate(services, perService)
		replica := heapInUse()
		c := NewCache(NewGenerator(f.agg, nil))
		c.Resources(proxylessView, resourcev3.EndpointType) // builds every CLA of the view
		clas := heapInUse()
		ws := openEDSWatches(b, c, proxylessView, clients, 10, services)
		withClients := heapInUse()
		b.ReportMetric(float64(replica-base)/endpoints, "replica-B/endpoint")
		b.ReportMetric(float64(clas-replica)/endpoints, "cla-B/endpoint")
		b.ReportMetric(float64(withClients-base)/endpoints, "total-B/endpoint")
		b.ReportMetric(float64(withClients-clas)/clients, "B/client")
		runtime.KeepAlive(ws)
		runtime.KeepAlive(f)
	}
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkPushAfterViewChurn: the cost of a full push with one client
// connected, after 1,000 clients of 1,000 distinct views came and went.
// Reported: ns/op of the push after the churn, and before-ns, the same
// push timed before it; views live only while streams use them, so the
// two should match (before reference counting, "after" was ~200× worse).
func BenchmarkPushAfterViewChurn(b *testing.B) {
	f := newFixture(b)
	f.populate(200, 10)
	s := New(Options{Listen: "127.0.0.1:0", Limits: Limits{MaxViews: 2000}}, f.agg, nil, f.agg, hclog.NewNullLogger(), nil)
	addr := serve(b, s)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if err := st.Send(viewNode(0)); err != nil {
		b.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		b.Fatal(err)
	}
	full := model.Change{Full: true}
	const rounds = 50
	start := time.Now()
	for range rounds {
		s.PushNow(full)
	}
	before := time.Since(start) / rounds
	churn(b, addr, 1000, 1, nil)
	deadline := time.Now().Add(60 * time.Second)
	for s.Cache().LiveViews() != 1 {
		if time.Now().After(deadline) {
			b.Fatalf("%d views still live a minute after the clients left", s.Cache().LiveViews())
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.ResetTimer()
	for b.Loop() {
		s.PushNow(full)
	}
	b.ReportMetric(float64(before.Nanoseconds()), "before-ns")
}
