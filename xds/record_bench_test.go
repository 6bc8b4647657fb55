package xds

import (
	"fmt"
	"runtime"
	"slices"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
)

// Clients of CDS driven against the cache as go-control-plane's server
// drives it, with its own Subscription and its own edits of it
// (SetResourceSubscription, UpdateResourceSubscriptions).

// sotwClient is one SotW stream's CDS subscription.
type sotwClient struct {
	sub    stream.Subscription
	req    *discoveryv3.DiscoveryRequest
	ch     chan cache.Response
	cancel func() // the stream's last watch, which the server keeps
}

func newSotwCDS(t testing.TB, c *Cache, id string) *sotwClient {
	t.Helper()
	cl := &sotwClient{sub: stream.NewSotwSubscription(nil, true), ch: make(chan cache.Response, 4),
		req: &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, Node: nodeFor(proxylessView, id)}}
	cl.watch(t, c)
	return cl
}

func (cl *sotwClient) watch(t testing.TB, c *Cache) {
	t.Helper()
	cancel, err := c.CreateWatch(cl.req, cl.sub, cl.ch)
	if err != nil {
		t.Fatal(err)
	}
	cl.cancel = cancel
}

// take returns the response the stream got, recorded as the server does
// when it sends it.
func (cl *sotwClient) take(t testing.TB) cache.Response {
	t.Helper()
	select {
	case r := <-cl.ch:
		cl.sub.SetReturnedResources(r.GetReturnedResources())
		return r
	default:
		t.Fatal("no response")
		return nil
	}
}

// next sends the client's next request: an ACK of version, or a NACK.
func (cl *sotwClient) next(t testing.TB, c *Cache, version string, nack bool, names ...string) {
	t.Helper()
	cl.cancel()
	cl.req = &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, VersionInfo: version, ResourceNames: names, Node: cl.req.GetNode()}
	if nack {
		cl.req.ErrorDetail = &status.Status{Code: 3, Message: "rejected by the test"}
	}
	cl.sub.SetResourceSubscription(names)
	cl.watch(t, c)
}

func resourceNames(t testing.TB, r cache.Response) []string {
	t.Helper()
	out, err := r.GetDiscoveryResponse()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, a := range out.GetResources() {
		var cl clusterv3.Cluster
		if err := proto.Unmarshal(a.GetValue(), &cl); err != nil {
			t.Fatal(err)
		}
		names = append(names, cl.GetName())
	}
	slices.Sort(names)
	return names
}

// deltaClient is one Delta stream's CDS subscription.
type deltaClient struct {
	sub    stream.Subscription
	node   *discoveryv3.DeltaDiscoveryRequest
	ch     chan cache.DeltaResponse
	cancel func()
}

func newDeltaCDS(t testing.TB, c *Cache, id string) (*deltaClient, error) {
	t.Helper()
	req := &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, Node: nodeFor(proxylessView, id), ResourceNamesSubscribe: []string{"*"}}
	cl := &deltaClient{sub: stream.NewDeltaSubscription(req.GetResourceNamesSubscribe(), nil, nil, true), node: req, ch: make(chan cache.DeltaResponse, 8)}
	return cl, cl.watch(c, req)
}

func (cl *deltaClient) watch(c *Cache, req *discoveryv3.DeltaDiscoveryRequest) error {
	req.Node = cl.node.GetNode()
	cancel, err := c.CreateDeltaWatch(req, cl.sub, cl.ch)
	cl.cancel = cancel
	return err
}

// next sends a request that changes the subscription, or only ACKs.
func (cl *deltaClient) next(t testing.TB, c *Cache, subscribe, unsubscribe []string) error {
	t.Helper()
	if cl.cancel != nil {
		cl.cancel()
	}
	cl.sub.UpdateResourceSubscriptions(subscribe, unsubscribe)
	return cl.watch(c, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: subscribe, ResourceNamesUnsubscribe: unsubscribe})
}

func (cl *deltaClient) take(t testing.TB) (names, removed []string) {
	t.Helper()
	select {
	case r := <-cl.ch:
		cl.sub.SetReturnedResources(r.GetNextVersionMap())
		out, err := r.GetDeltaDiscoveryResponse()
		if err != nil {
			t.Fatal(err)
		}
		for _, res := range out.GetResources() {
			names = append(names, res.GetName())
		}
		slices.Sort(names)
		return names, out.GetRemovedResources()
	default:
		t.Fatal("no response")
		return nil, nil
	}
}

// BenchmarkHeapPerWildcardClient: what the cache keeps per client of a
// fleet's shape, without gRPC: 1,000 services, 1,000 clients of one view,
// half SotW and half Delta, each subscribed to every cluster, served and
// ACKed, each holding its last watch as the server does. Reported: heap
// per client, after a collection, beyond the cache without clients.
func BenchmarkHeapPerWildcardClient(b *testing.B) {
	const services, clients = 1000, 1000
	for b.Loop() {
		b.StopTimer()
		f := newFixture(b)
		f.populate(services, 1)
		c := NewCache(NewGenerator(f.agg, nil))
		if err := c.AcquireView(proxylessView); err != nil {
			b.Fatal(err)
		}
		before := heapInUse()
		var sotw []*sotwClient
		var delta []*deltaClient
		for i := range clients {
			if i%2 == 0 {
				cl := newSotwCDS(b, c, fmt.Sprint("s", i))
				r := cl.take(b)
				v, _ := r.GetVersion()
				cl.next(b, c, v, false)
				sotw = append(sotw, cl)
				continue
			}
			cl, err := newDeltaCDS(b, c, fmt.Sprint("d", i))
			if err != nil {
				b.Fatal(err)
			}
			cl.take(b)
			if err := cl.next(b, c, nil, nil); err != nil {
				b.Fatal(err)
			}
			delta = append(delta, cl)
		}
		after := heapInUse()
		b.ReportMetric(float64(int64(after)-int64(before))/clients, "heap-B/client")
		runtime.KeepAlive(sotw)
		runtime.KeepAlive(delta)
		b.StartTimer()
	}
}
