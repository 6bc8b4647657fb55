package xds

import (
	"context"
	"fmt"
	"github.com/estuary-mesh/estuary/host/model"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
)

// BenchmarkConvergence: 1,000 ADS clients over gRPC, each watching 10 CLAs
// including the one that changes. One op changes that CLA in the replica
// and waits until every client has it; debounce is off. Reported: p50 and
// p99 of the per-client latency, and the time until all had it.
func BenchmarkConvergence(b *testing.B) {
	for _, sh := range []struct{ services, endpoints int }{{1000, 10}, {10000, 10}} {
		b.Run(fmt.Sprintf("services=%d/endpoints=%d", sh.services, sh.services*sh.endpoints), func(b *testing.B) {
			benchConvergence(b, 1000, sh.services, sh.endpoints)
		})
	}
}

func benchConvergence(b *testing.B, clients, services, perService int) {
	f := newFixture(b)
	f.populate(services, perService)
	s := New(Options{Listen: "127.0.0.1:0"}, f.agg, nil, f.agg, hclog.NewNullLogger(), nil)
	addr := serve(b, s)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	const perConn = 50
	var conns []*grpc.ClientConn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	changing := model.ClusterName(8080, "", svcHost(0))
	got := make(chan time.Time, clients)
	var ready sync.WaitGroup
	for i := range clients {
		if i%perConn == 0 {
			c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				b.Fatal(err)
			}
			conns = append(conns, c)
		}
		names := []string{changing}
		for j := 1; j < 10; j++ {
			names = append(names, model.ClusterName(8080, "", svcHost((i*9+j)%services)))
		}
		st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conns[len(conns)-1]).StreamAggregatedResources(ctx)
		if err != nil {
			b.Fatal(err)
		}
		node := nodeFor(proxylessView, fmt.Sprintf("sidecar~10.0.0.1~c%d.default~default.svc.cluster.local", i))
		if err := st.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.EndpointType, ResourceNames: names}); err != nil {
			b.Fatal(err)
		}
		ready.Add(1)
		go func() {
			first := true
			for {
				resp, err := st.Recv()
				if err != nil {
					return
				}
				now := time.Now()
				_ = st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: names, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
				if first {
					first = false
					ready.Done()
					continue
				}
				got <- now
			}
		}()
	}
	ready.Wait()
	variants := [2][]*registryv1.Endpoint{genEndpoints(perService, 1), genEndpoints(perService, 2)}
	var lat []time.Duration
	var all []time.Duration
	runtime.GC()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		start := time.Now()
		f.endpoints(svcHost(0), variants[i%2])
		var last time.Duration
		for range clients {
			select {
			case t := <-got:
				d := t.Sub(start)
				lat = append(lat, d)
				last = max(last, d)
			case <-time.After(30 * time.Second):
				b.Fatalf("only part of the clients received the change within 30s")
			}
		}
		all = append(all, last)
	}
	b.StopTimer()
	slices.Sort(lat)
	slices.Sort(all)
	b.ReportMetric(ms(lat[len(lat)/2]), "p50-ms")
	b.ReportMetric(ms(lat[len(lat)*99/100]), "p99-ms")
	b.ReportMetric(ms(all[len(all)/2]), "all-ms")
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
