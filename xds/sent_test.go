package xds

import (
	"fmt"
	"maps"
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

	"github.com/estuary-mesh/estuary/host/model"
)

// These tests drive the cache as go-control-plane's server does, with its
// own Subscription and its own edits of it (SetResourceSubscription,
// UpdateResourceSubscriptions), so the edits that made a shared map
// unsafe are the real ones.

// sotwClient is one SotW stream's CDS subscription.
type sotwClient struct {
	sub    stream.Subscription
	req    *discoveryv3.DiscoveryRequest
	ch     chan cache.Response
	cancel func() // the stream's last watch, which the server keeps
}

func newSotwCDS(t *testing.T, c *Cache, id string) *sotwClient {
	t.Helper()
	cl := &sotwClient{sub: stream.NewSotwSubscription(nil, true), ch: make(chan cache.Response, 4),
		req: &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, Node: nodeFor(proxylessView, id)}}
	cl.watch(t, c)
	return cl
}

func (cl *sotwClient) watch(t *testing.T, c *Cache) {
	t.Helper()
	cancel, err := c.CreateWatch(cl.req, cl.sub, cl.ch)
	if err != nil {
		t.Fatal(err)
	}
	cl.cancel = cancel
}

// take returns the response the stream got, recorded as the server does
// when it sends it.
func (cl *sotwClient) take(t *testing.T) cache.Response {
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
func (cl *sotwClient) next(t *testing.T, c *Cache, version string, nack bool, names ...string) {
	t.Helper()
	cl.cancel()
	cl.req = &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, VersionInfo: version, ResourceNames: names, Node: cl.req.GetNode()}
	if nack {
		cl.req.ErrorDetail = &status.Status{Code: 3, Message: "rejected by the test"}
	}
	cl.sub.SetResourceSubscription(names)
	cl.watch(t, c)
}

func resourceNames(t *testing.T, r cache.Response) []string {
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

// TestWholeSetSharedEditsStayPrivate: two SotW clients of one view are
// sent the same CDS set and record it as one set the cache shares. One
// NACKs it (not sent again), then names a single cluster, which
// go-control-plane applies by deleting names from that stream's map: the
// other's record must not change, and it is not answered again.
func TestWholeSetSharedEditsStayPrivate(t *testing.T) {
	f := newFixture(t)
	f.populate(5, 1)
	c := NewCache(NewGenerator(f.agg, nil))
	a, b := newSotwCDS(t, c, "a"), newSotwCDS(t, c, "b")
	ra, rb := a.take(t), b.take(t)
	va, _ := ra.GetVersion()
	vb, _ := rb.GetVersion()
	all := resourceNames(t, ra)
	if va != vb || len(all) != 5 {
		t.Fatalf("versions %q and %q of %d clusters; want one version of 5", va, vb, len(all))
	}
	// Each stream records one entry, not every cluster, and the set it
	// names is one, held by the cache.
	for _, cl := range []*sotwClient{a, b} {
		if m := cl.sub.ReturnedResources(); !maps.Equal(m, map[string]string{baseKey: va}) {
			t.Fatalf("stream record %v, want only the set's version %q", m, va)
		}
	}
	c.mu.Lock()
	set := c.views[proxylessView].sent[tCluster][va].Value()
	c.mu.Unlock()
	if set == nil || len(set.vers) != 5 {
		t.Fatalf("shared set of %q: %v", va, set)
	}

	a.next(t, c, "", true) // NACK
	if len(a.ch) != 0 {
		t.Fatalf("the NACKed set was sent again: %v", resourceNames(t, a.take(t)))
	}
	a.next(t, c, "", false, all[0]) // go-control-plane deletes the other names from a's map
	if got := resourceNames(t, a.take(t)); !slices.Equal(got, all[:1]) {
		t.Fatalf("after naming %s, a got %v", all[0], got)
	}
	if m := b.sub.ReturnedResources(); !maps.Equal(m, map[string]string{baseKey: va}) {
		t.Fatalf("a's subscription change edited b's record: %v", m)
	}
	b.next(t, c, vb, false) // ACK
	if len(b.ch) != 0 {
		t.Fatalf("b was sent its set again: %v", resourceNames(t, b.take(t)))
	}
	c.mu.Lock()
	same := c.views[proxylessView].sent[tCluster][va].Value()
	c.mu.Unlock()
	if same != set || len(same.vers) != 5 {
		t.Fatalf("b's shared set changed: %v", same)
	}

	// A new service: b gets the new set, whole.
	f.service(svcHost(5), 8080)
	c.Push(model.Change{Services: map[string]bool{svcHost(5): true}})
	if got := resourceNames(t, b.take(t)); len(got) != 6 {
		t.Fatalf("b got %d clusters after a service was added, want 6", len(got))
	}
}

// deltaClient is one Delta stream's CDS subscription.
type deltaClient struct {
	sub    stream.Subscription
	node   *discoveryv3.DeltaDiscoveryRequest
	ch     chan cache.DeltaResponse
	cancel func()
}

func newDeltaCDS(t *testing.T, c *Cache, id string) (*deltaClient, error) {
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
func (cl *deltaClient) next(t *testing.T, c *Cache, subscribe, unsubscribe []string) error {
	t.Helper()
	if cl.cancel != nil {
		cl.cancel()
	}
	cl.sub.UpdateResourceSubscriptions(subscribe, unsubscribe)
	return cl.watch(c, &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: subscribe, ResourceNamesUnsubscribe: unsubscribe})
}

func (cl *deltaClient) take(t *testing.T) (names, removed []string) {
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

// TestDeltaRecordSharedAndUnsubscribe: Delta clients of one view record
// their wildcard CDS set as one shared set, which survives collections
// while their streams can name it. One client unsubscribes the wildcard
// and a cluster, which go-control-plane applies to its map only: the
// other keeps its record, and the first, subscribing the cluster again,
// is sent it again (it no longer holds it). A change is then sent to the
// other as a diff against the shared set.
func TestDeltaRecordSharedAndUnsubscribe(t *testing.T) {
	f := newFixture(t)
	f.populate(5, 1)
	c := NewCache(NewGenerator(f.agg, nil))
	var cls []*deltaClient
	var all []string
	for i := range 2 {
		cl, err := newDeltaCDS(t, c, fmt.Sprint("d", i))
		if err != nil {
			t.Fatal(err)
		}
		all, _ = cl.take(t)
		if err := cl.next(t, c, nil, nil); err != nil { // ACK
			t.Fatal(err)
		}
		cls = append(cls, cl)
	}
	a, b := cls[0], cls[1]
	if len(all) != 5 || len(b.sub.ReturnedResources()) != 1 {
		t.Fatalf("%d clusters, b's record %v; want 5 and one entry", len(all), b.sub.ReturnedResources())
	}
	// Nothing else holds the set: the streams' last watches keep it.
	runtime.GC()
	runtime.GC()

	if err := a.next(t, c, nil, []string{"*", all[1]}); err != nil {
		t.Fatal(err)
	}
	if len(a.ch) != 0 {
		t.Fatalf("unsubscribing answered: %v", <-a.ch)
	}
	if _, held := a.sub.ReturnedResources()[all[1]]; held {
		t.Fatalf("a still records %s after unsubscribing it: %v", all[1], a.sub.ReturnedResources())
	}
	if err := a.next(t, c, []string{all[1]}, nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := a.take(t); !slices.Equal(got, all[1:2]) {
		t.Fatalf("subscribing %s again sent %v", all[1], got)
	}
	if m := b.sub.ReturnedResources(); len(m) != 1 || m[baseKey] == "" {
		t.Fatalf("a's unsubscription edited b's record: %v", m)
	}

	// svc0 moves from port 8080 to 9090: one cluster removed, one added.
	f.service(svcHost(0), 9090)
	c.Push(model.Change{Services: map[string]bool{svcHost(0): true}})
	got, removed := b.take(t)
	if len(got) != 1 || !slices.Equal(removed, all[:1]) {
		t.Fatalf("b got %v and removed %v; want one new cluster and %s removed", got, removed, all[0])
	}
}

// TestDeltaRecordLivesWithTheStream: a stream's set is held by its last
// watch, which the server keeps through the watch's cancel func, even
// when the watch was answered as it opened: a collection then leaves the
// set in place. Breaking that (the last watch dropped, nothing else
// holding the set) frees it, and the next request ends the stream rather
// than get a diff against a set nobody knows.
func TestDeltaRecordLivesWithTheStream(t *testing.T) {
	f := newFixture(t)
	f.populate(3, 1)
	c := NewCache(NewGenerator(f.agg, nil))
	cl, err := newDeltaCDS(t, c, "d")
	if err != nil {
		t.Fatal(err)
	}
	cl.take(t) // answered as it opened: only its cancel func holds it
	runtime.GC()
	runtime.GC()
	if err := cl.next(t, c, nil, nil); err != nil {
		t.Fatalf("ACK after a collection: %v", err)
	}
	if len(cl.ch) != 0 {
		t.Fatal("the ACK was answered")
	}
	cl.cancel()
	cl.cancel = nil
	runtime.GC()
	runtime.GC()
	if err := cl.next(t, c, nil, nil); err != errSentGone {
		t.Fatalf("request after the set was collected: %v, want %v", err, errSentGone)
	}
}
