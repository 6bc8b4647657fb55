package xds

import (
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
	"github.com/hashicorp/go-hclog"

	"github.com/estuary-mesh/estuary/host/model"
	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
)

// TestPushScope: an endpoint-only change answers EDS watches and leaves
// CDS alone; a change of the service itself answers CDS too; a full change
// reaches every watch whose resources differ.
func TestPushScope(t *testing.T) {
	f := newFixture(t)
	f.populate(5, 1)
	c := NewCache(NewGenerator(f.agg, nil))
	node := nodeFor(model.View{Kind: model.KindEnvoy, Network: "network1"}, envoyNode)
	cdsSub := stream.NewSotwSubscription(nil, true)
	cds := &sotwWatcher{req: &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, Node: node}, sub: &cdsSub, ch: make(chan cache.Response, 1)}
	cds.open(t, c)
	eds := openEDSWatches(t, c, model.View{Kind: model.KindEnvoy, Network: "network1"}, 1, 5, 5)
	all := append(watcherSet{cds}, eds...)
	all.rearm(t, c) // take the first CDS response
	base := [2]int{cds.responses, eds[0].responses}

	f.endpoints(svcHost(2), genEndpoints(3, 20))
	st := c.Push(model.Change{Services: map[string]bool{svcHost(2): false}})
	all.rearm(t, c)
	if st.Responses[tCluster] != 0 || cds.responses != base[0] {
		t.Errorf("endpoint-only change answered CDS (%d responses)", st.Responses[tCluster])
	}
	if st.Responses[tEndpoint] != 1 || eds[0].responses != base[1]+1 {
		t.Errorf("endpoint-only change: %d EDS responses, want 1", st.Responses[tEndpoint])
	}

	// The service gains a port: CDS changes.
	f.apply(false, &registryv1.Event{Instance: f.id, Kind: &registryv1.Event_ServiceUpserted{ServiceUpserted: &registryv1.ServiceUpserted{Service: &registryv1.Service{
		Hostname: svcHost(2), Namespace: "default", Ports: []*registryv1.Port{{Name: "grpc", Number: 8080, Protocol: "GRPC"}, {Name: "http", Number: 9090, Protocol: "HTTP"}},
	}}}})
	st = c.Push(model.Change{Services: map[string]bool{svcHost(2): true}})
	all.rearm(t, c)
	if st.Responses[tCluster] != 1 || cds.responses != base[0]+1 {
		t.Errorf("service change: %d CDS responses, want 1", st.Responses[tCluster])
	}

	// A full change with nothing different answers nobody.
	if st := c.Push(model.Change{Full: true}); st.Total() != 0 {
		t.Errorf("a full push of unchanged resources answered %d watches", st.Total())
	}
}

// TestDebounceMergesABurst: changes that come closer together than the
// quiet period leave in one push carrying all of them.
func TestDebounceMergesABurst(t *testing.T) {
	f := newFixture(t)
	f.populate(3, 1)
	s := New(Options{Listen: "127.0.0.1:0", DebounceAfter: 300 * time.Millisecond, DebounceMax: 10 * time.Second}, f.agg, nil, f.agg, hclog.NewNullLogger(), nil)
	pushes := make(chan PushStats, 10)
	s.onPush = func(st PushStats, c model.Change) { pushes <- st }
	serve(t, s)
	openEDSWatches(t, s.Cache(), proxylessView, 1, 3, 3)
	for i := range 3 {
		f.endpoints(svcHost(i), genEndpoints(2, 30+i))
	}
	select {
	case st := <-pushes:
		if st.Changed[tEndpoint] != 3 || st.Responses[tEndpoint] != 1 {
			t.Errorf("first push changed %d CLAs with %d responses; want all 3 changes in one response", st.Changed[tEndpoint], st.Responses[tEndpoint])
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no push")
	}
	select {
	case st := <-pushes:
		t.Errorf("a second push followed the burst: %+v", st)
	case <-time.After(time.Second):
	}
}

// TestWildcardACKOfTheCurrentSet: a wildcard CDS client that acknowledges
// the current set is not answered again; one that claims a version from
// elsewhere (another view, another host process) gets the set.
func TestWildcardACKOfTheCurrentSet(t *testing.T) {
	f := newFixture(t)
	f.populate(3, 1)
	c := NewCache(NewGenerator(f.agg, nil))
	view := model.View{Kind: model.KindEnvoy, Network: "network1"}
	open := func(version string) (*sotwWatcher, cache.Response) {
		sub := stream.NewSotwSubscription(nil, true)
		w := &sotwWatcher{req: &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, Node: nodeFor(view, envoyNode), VersionInfo: version}, sub: &sub, ch: make(chan cache.Response, 1)}
		w.open(t, c)
		select {
		case r := <-w.ch:
			return w, r
		default:
			return w, nil
		}
	}
	_, first := open("")
	if first == nil || len(first.(*sotwResponse).resources) != 3 {
		t.Fatalf("first CDS response = %v", first)
	}
	if _, again := open(first.GetResponseVersion()); again != nil {
		t.Errorf("a client holding the current set was sent it again")
	}
	other := NewCache(NewGenerator(f.agg, nil))
	sub := stream.NewSotwSubscription(nil, true)
	w := &sotwWatcher{req: &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, Node: nodeFor(view, envoyNode)}, sub: &sub, ch: make(chan cache.Response, 1)}
	w.open(t, other)
	otherVersion := (<-w.ch).GetResponseVersion()
	if otherVersion == first.GetResponseVersion() {
		t.Fatalf("two caches issued the same set version %q", otherVersion)
	}
	if _, r := open(otherVersion); r == nil {
		t.Errorf("a client with another cache's version was not sent the set")
	}
}
