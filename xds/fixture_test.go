package xds

import (
	"fmt"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/estuary-mesh/estuary/host/aggregate"
	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/host/replica"
	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
)

// fixture is a replica fed directly with protocol messages, as a plugin
// would feed it.
type fixture struct {
	tb    testing.TB
	store *replica.Store
	agg   *aggregate.Registry
	sess  *replica.Session
	seq   uint64
	id    *registryv1.InstanceID
}

func newFixture(tb testing.TB) *fixture {
	store := replica.NewStore(nil)
	f := &fixture{tb: tb, store: store, agg: aggregate.New(store, nil), sess: store.NewSession("test"),
		id: &registryv1.InstanceID{Provider: "Static", Cluster: "cluster1"}}
	f.apply(true, &registryv1.Event{Instance: f.id, Kind: &registryv1.Event_InstanceAdded{InstanceAdded: &registryv1.InstanceAdded{
		Properties: &registryv1.InstanceProperties{DefaultNetwork: "network1"}}}},
		&registryv1.Event{Instance: f.id, Kind: &registryv1.Event_InstanceSynced{InstanceSynced: &registryv1.InstanceSynced{}}})
	return f
}

func (f *fixture) apply(snapshot bool, events ...*registryv1.Event) {
	f.seq++
	if err := f.sess.Apply(&registryv1.WatchResponse{Sequence: f.seq, Snapshot: snapshot, SnapshotDone: snapshot, Events: events}); err != nil {
		f.tb.Fatal(err)
	}
}

func (f *fixture) service(host string, ports ...uint32) {
	svc := &registryv1.Service{Hostname: host, Namespace: "default"}
	for _, p := range ports {
		svc.Ports = append(svc.Ports, &registryv1.Port{Name: fmt.Sprintf("grpc-%d", p), Number: p, Protocol: "GRPC"})
	}
	f.apply(false, &registryv1.Event{Instance: f.id, Kind: &registryv1.Event_ServiceUpserted{ServiceUpserted: &registryv1.ServiceUpserted{Service: svc}}})
}

func (f *fixture) endpoints(host string, eps []*registryv1.Endpoint) {
	f.apply(false, &registryv1.Event{Instance: f.id, Kind: &registryv1.Event_EndpointsReplaced{EndpointsReplaced: &registryv1.EndpointsReplaced{Hostname: host, Endpoints: eps}}})
}

// genEndpoints makes n endpoints with Istio-shaped data: locality, weight,
// network and TLS mode; seed varies the addresses.
func genEndpoints(n, seed int) []*registryv1.Endpoint {
	eps := make([]*registryv1.Endpoint, n)
	for i := range eps {
		eps[i] = &registryv1.Endpoint{
			Address:  fmt.Sprintf("10.%d.%d.%d", seed%200, i/250, i%250),
			Locality: []string{"us-east1/us-east1-b", "us-east1/us-east1-c", "us-west1/us-west1-a"}[i%3],
			Weight:   uint32(1 + i%3),
			TlsMode:  registryv1.TLSMode_TLS_MODE_ISTIO,
			Labels:   map[string]string{"app": "svc"},
		}
	}
	return eps
}

func svcHost(i int) string { return fmt.Sprintf("svc%d.default.svc.cluster.local", i) }

// populate adds services with endpoints each.
func (f *fixture) populate(services, endpoints int) {
	for i := range services {
		f.service(svcHost(i), 8080)
		f.endpoints(svcHost(i), genEndpoints(endpoints, i))
	}
}

// sotwWatcher is one client's EDS subscription, driven against the cache
// directly as go-control-plane's server would drive it.
type sotwWatcher struct {
	req       *discoveryv3.DiscoveryRequest
	sub       *stream.Subscription
	ch        chan cache.Response
	responses int
}

type watcherSet []*sotwWatcher

// openEDSWatches opens n watches of the view, each on perWatcher CLAs
// (watcher i watches services i*perWatcher...), takes their first response
// as a client would, and leaves them waiting for changes.
func openEDSWatches(tb testing.TB, c *Cache, v model.View, n, perWatcher, services int) watcherSet {
	tb.Helper()
	return openEDSWatchesOf(tb, c, v, n, func(i int) []string {
		names := make([]string, perWatcher)
		for j := range names {
			names[j] = model.ClusterName(8080, "", svcHost((i*perWatcher+j)%services))
		}
		return names
	})
}

// openEDSWatchesOf opens n watches of the view, watcher i on names(i).
func openEDSWatchesOf(tb testing.TB, c *Cache, v model.View, n int, namesOf func(i int) []string) watcherSet {
	tb.Helper()
	ws := make(watcherSet, n)
	for i := range ws {
		names := namesOf(i)
		sub := stream.NewSotwSubscription(names, false)
		ws[i] = &sotwWatcher{
			req: &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: names, Node: nodeFor(v, fmt.Sprintf("node-%d", i))},
			sub: &sub,
			ch:  make(chan cache.Response, 1),
		}
		ws[i].open(tb, c)
	}
	ws.rearm(tb, c)
	return ws
}

func (w *sotwWatcher) open(tb testing.TB, c *Cache) {
	if _, err := c.CreateWatch(w.req, w.sub, w.ch); err != nil {
		tb.Fatal(err)
	}
}

// rearm takes pending responses and opens the next watch, like a client
// that ACKs.
func (ws watcherSet) rearm(tb testing.TB, c *Cache) {
	for _, w := range ws {
		select {
		case resp := <-w.ch:
			w.responses++
			w.sub.SetReturnedResources(resp.GetReturnedResources())
			w.open(tb, c)
		default:
		}
	}
}

// nodeFor is a node whose metadata gives view v.
func nodeFor(v model.View, id string) *corev3.Node {
	md, _ := structpb.NewStruct(map[string]any{"NETWORK": v.Network, "CLUSTER_ID": v.Cluster, "REQUESTED_NETWORK_VIEW": v.Networks})
	n := &corev3.Node{Id: id, Metadata: md}
	switch v.Kind {
	case model.KindProxyless:
		n.UserAgentName = "gRPC Go"
	case model.KindRouter:
		n.Id = "router~" + id
	}
	return n
}
