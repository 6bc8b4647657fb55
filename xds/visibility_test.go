package xds

import (
	"fmt"
	"runtime"
	"slices"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/estuary-mesh/estuary/host/model"
	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
)

// exported upserts a one-port service of namespace ns with exportTo.
func (f *fixture) exported(host, ns string, exportTo ...string) {
	svc := &registryv1.Service{Hostname: host, Namespace: ns, ExportTo: exportTo,
		Ports: []*registryv1.Port{{Name: "grpc", Number: 8080, Protocol: "GRPC"}}}
	f.apply(false, &registryv1.Event{Instance: f.id, Kind: &registryv1.Event_ServiceUpserted{ServiceUpserted: &registryv1.ServiceUpserted{Service: svc}}})
	f.endpoints(host, []*registryv1.Endpoint{{Address: "10.0.0.1", TlsMode: registryv1.TLSMode_TLS_MODE_ISTIO}})
}

func nsNode(kind, ns string) *corev3.Node {
	md, _ := structpb.NewStruct(map[string]any{"NETWORK": "network1", "CLUSTER_ID": "cluster1"})
	return &corev3.Node{Id: fmt.Sprintf("%s~10.0.0.9~pod.%s~%s.svc.cluster.local", kind, ns, ns), Metadata: md}
}

// TestDeltaClientSeesExportToChanges: over Delta, a client of namespace a
// gets the clusters exported to it; a service exported to a later is
// added, one no longer exported to a is removed, and clients of other
// namespaces of the same view are answered only with what they see.
func TestDeltaClientSeesExportToChanges(t *testing.T) {
	f := newFixture(t)
	f.exported("pub.x", "x", "*")
	f.exported("mine.a", "a", ".")
	f.exported("theirs.b", "b", ".")
	_, _, addr := startServer(t, f)
	// open returns a function that takes the next response and ACKs it.
	open := func(ns string) func(what string) *discoveryv3.DeltaDiscoveryResponse {
		st, err := adsClient(t, addr).DeltaAggregatedResources(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&discoveryv3.DeltaDiscoveryRequest{Node: nsNode("sidecar", ns), TypeUrl: resourcev3.ClusterType}); err != nil {
			t.Fatal(err)
		}
		ch := pump(t, st.Recv)
		return func(what string) *discoveryv3.DeltaDiscoveryResponse {
			r := recv(t, ch, what)
			_ = st.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResponseNonce: r.GetNonce()})
			return r
		}
	}
	names := func(r *discoveryv3.DeltaDiscoveryResponse) []string {
		var out []string
		for _, res := range r.GetResources() {
			out = append(out, res.GetName())
		}
		slices.Sort(out)
		return out
	}
	a, b := open("a"), open("b")
	cl := func(h string) string { return model.ClusterName(8080, "", h) }
	if got, want := names(a("a's CDS")), []string{cl("mine.a"), cl("pub.x")}; !slices.Equal(got, want) {
		t.Fatalf("a got %v, want %v", got, want)
	}
	if got, want := names(b("b's CDS")), []string{cl("pub.x"), cl("theirs.b")}; !slices.Equal(got, want) {
		t.Fatalf("b got %v, want %v", got, want)
	}

	f.exported("theirs.b", "b", ".", "a") // now a sees it too
	if got := a("a's push"); !slices.Equal(names(got), []string{cl("theirs.b")}) || len(got.GetRemovedResources()) != 0 {
		t.Fatalf("after exporting theirs.b to a, a got %v removed %v", names(got), got.GetRemovedResources())
	}
	f.exported("mine.a", "a", "b") // a no longer sees its own
	if got := a("a's push"); len(got.GetResources()) != 0 || !slices.Equal(got.GetRemovedResources(), []string{cl("mine.a")}) {
		t.Fatalf("after exporting mine.a to b only, a got %v removed %v", names(got), got.GetRemovedResources())
	}
	// b was told of mine.a alone: theirs.b's change moved nothing for b.
	if got := b("b's push"); !slices.Equal(names(got), []string{cl("mine.a")}) || len(got.GetRemovedResources()) != 0 {
		t.Fatalf("b got %v removed %v, want only mine.a added", names(got), got.GetRemovedResources())
	}
}

// TestRouterSeesWhatItsNamespaceSees: as Istio's gateways, an east-west
// gateway sees the services exported to its own namespace: its SNI
// listener and clusters leave out the others.
func TestRouterSeesWhatItsNamespaceSees(t *testing.T) {
	f := newFixture(t)
	f.exported("pub.x", "x", "*")
	f.exported("private.a", "a", ".")
	f.exported("gw.a", "a", "istio-system")
	c := NewCache(NewGenerator(f.agg, nil))
	router := nsNode("router", "istio-system")
	ask := func(typeURL string) []*discoveryv3.DiscoveryResponse {
		sub := stream.NewSotwSubscription(nil, true)
		w := &sotwWatcher{req: &discoveryv3.DiscoveryRequest{TypeUrl: typeURL, Node: router}, sub: &sub, ch: make(chan cache.Response, 1)}
		w.open(t, c)
		resp, _ := (<-w.ch).GetDiscoveryResponse()
		return []*discoveryv3.DiscoveryResponse{resp}
	}
	var chains []string
	for _, a := range ask(resourcev3.ListenerType)[0].GetResources() {
		var l listenerv3.Listener
		if err := proto.Unmarshal(a.GetValue(), &l); err != nil {
			t.Fatal(err)
		}
		for _, fc := range l.GetFilterChains() {
			chains = append(chains, fc.GetName())
		}
	}
	slices.Sort(chains)
	want := []string{model.SNIClusterName(8080, "", "gw.a"), model.SNIClusterName(8080, "", "pub.x")}
	if !slices.Equal(chains, want) {
		t.Fatalf("router's filter chains %v, want %v", chains, want)
	}
	if n := len(ask(resourcev3.ClusterType)[0].GetResources()); n != 2 {
		t.Fatalf("router got %d clusters, want 2", n)
	}
}

// BenchmarkHeapPerNamespace: 1,000 services, 100 of them exported only
// to their own namespace ("."), and a proxyless client with a wildcard
// CDS watch in each of 1,000 other namespaces, all of which see the same
// 900 services. Reported: the heap of the view (its clusters, listeners
// and routes, shared by every namespace), what each further namespace
// costs (its watch and its share of a visibility set: answers in flight
// are left out, as the cache is held), and the number of distinct sets;
// "distinct-sets" gives every namespace one private service of its own
// instead (1,000 sets). A view per namespace would cost view-B each.
func BenchmarkHeapPerNamespace(b *testing.B) {
	const services, namespaces = 1000, 1000
	for _, distinct := range []bool{false, true} {
		name := "same-set"
		if distinct {
			name = "distinct-sets"
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				f := newFixture(b)
				for i := range services {
					ns, export := "shared", "*"
					switch {
					case distinct && i < namespaces:
						ns, export = fmt.Sprintf("ns%d", i), "."
					case !distinct && i%10 == 0:
						ns, export = "private", "."
					}
					f.exported(svcHost(i), ns, export)
				}
				base := heapInUse()
				c := NewCache(NewGenerator(f.agg, nil))
				// Held, the watches stay open unanswered, so what is
				// measured is the cache's state, not responses in flight.
				c.Hold()
				watch := func(ns string) *sotwWatcher {
					sub := stream.NewSotwSubscription(nil, true)
					node := nsNode("sidecar", ns)
					node.UserAgentName = "gRPC Go"
					w := &sotwWatcher{req: &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, Node: node}, sub: &sub, ch: make(chan cache.Response, 1)}
					w.open(b, c)
					c.mu.Lock()
					c.visSetLocked(ParseNode(node).Namespace) // as answering it would
					c.mu.Unlock()
					return w
				}
				ws := []*sotwWatcher{watch("ns0")}
				oneNS := heapInUse()
				for i := 1; i < namespaces; i++ {
					ws = append(ws, watch(fmt.Sprintf("ns%d", i)))
				}
				all := heapInUse()
				b.ReportMetric(float64(oneNS-base), "view-B")
				b.ReportMetric(float64(all-oneNS)/(namespaces-1), "B/namespace")
				c.mu.Lock()
				b.ReportMetric(float64(len(c.vis.byKey)), "sets")
				c.mu.Unlock()
				runtime.KeepAlive(ws)
			}
		})
	}
}

// BenchmarkPushExportToChange: the push of one service's exportTo change
// (toggled between "." and one other namespace) with a client in each of
// 1,000 namespaces watching every cluster, 100 of 1,000 services
// restricted. Each push computes the namespaces' sets again and answers
// exactly the one client whose namespace gains or loses the service.
func BenchmarkPushExportToChange(b *testing.B) {
	const services, namespaces = 1000, 1000
	f := newFixture(b)
	for i := range services {
		ns, export := "shared", "*"
		if i%10 == 0 {
			ns, export = "private", "."
		}
		f.exported(svcHost(i), ns, export)
	}
	c := NewCache(NewGenerator(f.agg, nil))
	var ws watcherSet
	for i := range namespaces {
		sub := stream.NewSotwSubscription(nil, true)
		node := nsNode("sidecar", fmt.Sprintf("ns%d", i))
		w := &sotwWatcher{req: &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, Node: node}, sub: &sub, ch: make(chan cache.Response, 1)}
		w.open(b, c)
		ws = append(ws, w)
	}
	ackAll(b, c, ws)
	toggle := false
	for b.Loop() {
		toggle = !toggle
		export := "."
		if toggle {
			export = "ns5"
		}
		f.exported(svcHost(0), "private", export)
		if st := c.Push(model.Change{Services: map[string]bool{svcHost(0): true}}); st.Responses[tCluster] != 1 {
			b.Fatalf("push answered %d CDS watches, want 1 (ns5's)", st.Responses[tCluster])
		}
		ackAll(b, c, ws)
	}
}

// ackAll takes pending responses and opens the next watch with the
// version received, as a client's ACK does.
func ackAll(tb testing.TB, c *Cache, ws watcherSet) {
	for _, w := range ws {
		select {
		case resp := <-w.ch:
			v, _ := resp.GetVersion()
			w.sub.SetReturnedResources(resp.GetReturnedResources())
			w.req = proto.Clone(w.req).(*discoveryv3.DiscoveryRequest)
			w.req.VersionInfo = v
			w.open(tb, c)
		default:
		}
	}
}
