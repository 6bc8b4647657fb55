package xds

import (
	"context"
	"fmt"
	"strings"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/estuary-mesh/estuary/host/model"
)

// TestFullChannelIsRetriedNotDropped: a response that finds its stream's
// channel full is counted, the watch stays open, and once the channel has
// room the watch is answered with the state current then.
func TestFullChannelIsRetriedNotDropped(t *testing.T) {
	f := newFixture(t)
	f.populate(3, 1)
	reg := prometheus.NewRegistry()
	s := New(Options{}, f.agg, nil, f.agg, hclog.NewNullLogger(), reg)
	c := s.Cache()

	name := model.ClusterName(8080, "", svcHost(1))
	sub := stream.NewSotwSubscription([]string{name}, false)
	req := &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: []string{name}, Node: nodeFor(proxylessView, "n")}
	ch := make(chan cache.Response, 1)
	ch <- &sotwResponse{req: req} // the channel is full: no room for the first answer
	if _, err := c.CreateWatch(req, &sub, ch); err != nil {
		t.Fatal(err)
	}
	if n := counterValue(t, s.metrics.full.WithLabelValues("eds")); n != 1 {
		t.Fatalf("full-channel counter = %v, want 1", n)
	}
	// A change while the channel is still full is not lost either.
	eps := genEndpoints(4, 9)
	f.endpoints(svcHost(1), eps)
	s.PushNow(model.Change{Services: map[string]bool{svcHost(1): false}})

	<-ch // the stream takes the response that was in the way
	resp := <-ch
	if got := claAddresses(decodeCLAs(t, mustDiscovery(t, resp).GetResources())[name]); strings.Join(got, ",") != strings.Join(wantAddresses(eps), ",") {
		t.Fatalf("retried response has endpoints %v, want the current %v", got, wantAddresses(eps))
	}
}

func mustDiscovery(t *testing.T, r cache.Response) *discoveryv3.DiscoveryResponse {
	t.Helper()
	d, err := r.GetDiscoveryResponse()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestSlowClientDelaysNoOne: clients that stop reading (SotW and Delta),
// with flow-control windows far smaller than what is pushed to them, do not
// delay another client's pushes; that client sees every round, its final
// state is the registry's, and no response ever found a full channel.
func TestSlowClientDelaysNoOne(t *testing.T) {
	const services, endpoints, rounds = 20, 200, 24
	f := newFixture(t)
	f.populate(services, endpoints)
	s, _, addr := startServer(t, f)
	node := nodeFor(model.View{Kind: model.KindEnvoy, Network: "network1"}, envoyNode)
	names := make([]string, services)
	for i := range names {
		names[i] = model.ClusterName(8080, "", svcHost(i))
	}

	// The stalled clients: a 64 KiB window (no BDP growth) and no Recv.
	small, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(1<<16), grpc.WithInitialConnWindowSize(1<<16))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { small.Close() })
	stalled := discoveryv3.NewAggregatedDiscoveryServiceClient(small)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ss, err := stalled.StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ss.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.ClusterType}); err != nil {
		t.Fatal(err)
	}
	_ = ss.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: names})
	ds, err := stalled.DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = ds.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node, TypeUrl: resourcev3.ClusterType})
	_ = ds.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: names})

	// The reading client: SotW EDS for every service, ACKing each response.
	st, err := adsClient(t, addr).StreamAggregatedResources(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ch := pump(t, st.Recv)
	_ = st.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.EndpointType, ResourceNames: names})
	seen := map[string][]string{}
	take := func(what string) {
		resp := recv(t, ch, what)
		for n, cla := range decodeCLAs(t, resp.GetResources()) {
			seen[n] = claAddresses(cla)
		}
		_ = st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: names, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
	}
	take("first EDS")

	var before map[string]string
	for round := 1; round <= rounds; round++ {
		if round == rounds-1 {
			before = stalledEDS(s)
		}
		want := wantAddresses(genEndpoints(endpoints, 100+round))
		for i := range services {
			f.endpoints(svcHost(i), genEndpoints(endpoints, 100+round))
		}
		for !allEqual(seen, names, want) {
			take(fmt.Sprintf("EDS of round %d", round))
		}
	}
	if n := testutilSum(t, s.metrics.full); n != 0 {
		t.Errorf("%v responses found a full channel", n)
	}
	// The stalled streams really were stalled: blocked in Send, they sent
	// nothing in the last two rounds.
	after := stalledEDS(s)
	if len(after) != 2 || fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("stalled streams' last EDS nonces went from %v to %v; want two streams, unchanged", before, after)
	}
}

// stalledEDS is the last EDS nonce sent to each stalled stream: those that
// asked for CDS, which the reading client never does.
func stalledEDS(s *Server) map[string]string {
	out := map[string]string{}
	for _, c := range s.Clients() {
		if c.Types["cds"] != nil {
			k := fmt.Sprintf("delta=%v/%d", c.Delta, c.ID)
			out[k] = ""
			if e := c.Types["eds"]; e != nil {
				out[k] = e.SentNonce
			}
		}
	}
	return out
}

func allEqual(seen map[string][]string, names, want []string) bool {
	for _, n := range names {
		if strings.Join(seen[n], ",") != strings.Join(want, ",") {
			return false
		}
	}
	return true
}

func testutilSum(t *testing.T, v *prometheus.CounterVec) float64 {
	t.Helper()
	sum := 0.0
	for _, typ := range typeNames {
		sum += counterValue(t, v.WithLabelValues(typ))
	}
	return sum
}
