package xds

import (
	"fmt"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"

	"github.com/estuary-mesh/estuary/host/model"
)

// TestWatchInSeveralSetsAnsweredOnce: watches sit in one set per name,
// each knowing its slot, and a drop moves the set's last watch into the
// hole. Cancelling the first and then the moved last watch must leave the
// two in between; a push that changes both names answers each of those
// exactly once (their channels have room for a second answer, which would
// show), never a cancelled one, and leaves no set behind.
func TestWatchInSeveralSetsAnsweredOnce(t *testing.T) {
	f := newFixture(t)
	f.populate(3, 1)
	c := NewCache(NewGenerator(f.agg, nil))
	names := []string{model.ClusterName(8080, "", svcHost(0)), model.ClusterName(8080, "", svcHost(1))}
	type client struct {
		ch     chan cache.Response
		cancel func()
	}
	clients := make([]client, 4)
	for i := range clients {
		sub := stream.NewSotwSubscription(names, false)
		req := &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: names, Node: nodeFor(proxylessView, fmt.Sprintf("node-%d", i))}
		ch := make(chan cache.Response, 2)
		if _, err := c.CreateWatch(req, &sub, ch); err != nil {
			t.Fatal(err)
		}
		first := <-ch // the initial state, as the client ACKs it
		sub.SetReturnedResources(first.GetReturnedResources())
		cancel, err := c.CreateWatch(req, &sub, ch)
		if err != nil {
			t.Fatal(err)
		}
		clients[i] = client{ch: ch, cancel: cancel}
	}
	clients[0].cancel()
	clients[3].cancel() // moved into slot 0 of both sets by the first cancel
	f.endpoints(svcHost(0), genEndpoints(2, 10))
	f.endpoints(svcHost(1), genEndpoints(2, 11))
	st := c.Push(model.Change{Services: map[string]bool{svcHost(0): false, svcHost(1): false}})
	if st.Total() != 2 {
		t.Errorf("push answered %d watches, want 2", st.Total())
	}
	for i, cl := range clients {
		want := 0
		if i == 1 || i == 2 {
			want = 1
		}
		if got := len(cl.ch); got != want {
			t.Errorf("client %d got %d responses, want %d", i, got, want)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if left := c.views[proxylessView].byName[tEndpoint]; len(left) != 0 {
		t.Errorf("answered and cancelled watches left sets behind: %v", left)
	}
}
