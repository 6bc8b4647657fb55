package xds

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/estuary-mesh/estuary/host/model"
	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
)

// startServer serves the fixture's registry over ADS on a free port,
// pushing every change at once.
func startServer(t *testing.T, f *fixture) (*Server, *prometheus.Registry, string) {
	t.Helper()
	reg := prometheus.NewRegistry()
	s := New(Options{Listen: "127.0.0.1:0"}, f.agg, nil, f.agg, hclog.NewNullLogger(), reg)
	return s, reg, serve(t, s)
}

// serve runs s until the test ends and returns the address it serves on.
// The test fails if Run does not end cleanly when its context does.
func serve(tb testing.TB, s *Server) string {
	tb.Helper()
	addr, stop := runStoppable(tb, s)
	tb.Cleanup(func() {
		if err := stop(); err != nil {
			tb.Errorf("Run after its context ended: %v", err)
		}
	})
	return addr
}

func adsClient(t *testing.T, addr string) discoveryv3.AggregatedDiscoveryServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return discoveryv3.NewAggregatedDiscoveryServiceClient(conn)
}

// recv waits for the next response, failing after timeout.
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(20 * time.Second):
		t.Fatalf("no %s within 20s", what)
	}
	var zero T
	return zero
}

// noRecv checks that nothing arrived for a type since the last recv, after
// a later response on the same ordered stream has proven the server moved
// on.
func pump[T any](t *testing.T, recvFn func() (T, error)) <-chan T {
	ch := make(chan T, 100)
	go func() {
		for {
			v, err := recvFn()
			if err != nil {
				close(ch)
				return
			}
			ch <- v
		}
	}()
	return ch
}

func decodeCLAs(t *testing.T, anys []*anypb.Any) map[string]*endpointv3.ClusterLoadAssignment {
	t.Helper()
	out := map[string]*endpointv3.ClusterLoadAssignment{}
	for _, a := range anys {
		var cla endpointv3.ClusterLoadAssignment
		if err := proto.Unmarshal(a.GetValue(), &cla); err != nil {
			t.Fatal(err)
		}
		out[cla.GetClusterName()] = &cla
	}
	return out
}

func claAddresses(cla *endpointv3.ClusterLoadAssignment) []string {
	var out []string
	for _, le := range cla.GetEndpoints() {
		for _, lb := range le.GetLbEndpoints() {
			out = append(out, lb.GetEndpoint().GetAddress().GetSocketAddress().GetAddress())
		}
	}
	slices.Sort(out)
	return out
}

func wantAddresses(eps []*registryv1.Endpoint) []string {
	var out []string
	for _, e := range eps {
		out = append(out, e.GetAddress())
	}
	slices.Sort(out)
	return out
}

const envoyNode = "sidecar~10.9.9.9~client.default~default.svc.cluster.local"

// TestSotWAndDeltaAgreeOn1000Services: both protocol variants receive the
// same CDS and EDS for 1,000 services, consistent with the registry; then
// a change to one service reaches both, and only as that one resource.
func TestSotWAndDeltaAgreeOn1000Services(t *testing.T) {
	const services = 1000
	f := newFixture(t)
	f.populate(services, 3)
	_, _, addr := startServer(t, f)
	node := nodeFor(model.View{Kind: model.KindEnvoy, Network: "network1"}, envoyNode)

	// State of the World: wildcard CDS, then EDS for every cluster.
	sotw, err := adsClient(t, addr).StreamAggregatedResources(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	sotwCh := pump(t, sotw.Recv)
	if err := sotw.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.ClusterType}); err != nil {
		t.Fatal(err)
	}
	cds := recv(t, sotwCh, "SotW CDS")
	var names []string
	for _, a := range cds.GetResources() {
		var c clusterv3.Cluster
		if err := proto.Unmarshal(a.GetValue(), &c); err != nil {
			t.Fatal(err)
		}
		names = append(names, c.GetName())
	}
	if len(names) != services {
		t.Fatalf("SotW CDS has %d clusters, want %d", len(names), services)
	}
	_ = sotw.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, VersionInfo: cds.GetVersionInfo(), ResponseNonce: cds.GetNonce()})
	_ = sotw.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: names})
	eds := recv(t, sotwCh, "SotW EDS")
	sotwCLAs := decodeCLAs(t, eds.GetResources())
	_ = sotw.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: names, VersionInfo: eds.GetVersionInfo(), ResponseNonce: eds.GetNonce()})

	// Delta: the same, incrementally.
	delta, err := adsClient(t, addr).DeltaAggregatedResources(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	deltaCh := pump(t, delta.Recv)
	_ = delta.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node, TypeUrl: resourcev3.ClusterType})
	dcds := recv(t, deltaCh, "delta CDS")
	if len(dcds.GetResources()) != services {
		t.Fatalf("delta CDS has %d clusters", len(dcds.GetResources()))
	}
	_ = delta.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResponseNonce: dcds.GetNonce()})
	_ = delta.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: names})
	deds := recv(t, deltaCh, "delta EDS")
	deltaAnys := make([]*anypb.Any, 0, len(deds.GetResources()))
	for _, r := range deds.GetResources() {
		deltaAnys = append(deltaAnys, r.GetResource())
	}
	deltaCLAs := decodeCLAs(t, deltaAnys)
	_ = delta.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResponseNonce: deds.GetNonce()})

	for i := range services {
		name := model.ClusterName(8080, "", svcHost(i))
		want := wantAddresses(genEndpoints(3, i))
		for variant, clas := range map[string]map[string]*endpointv3.ClusterLoadAssignment{"SotW": sotwCLAs, "delta": deltaCLAs} {
			if got := claAddresses(clas[name]); !slices.Equal(got, want) {
				t.Fatalf("%s %s: endpoints %v, want %v", variant, name, got, want)
			}
		}
		if !proto.Equal(sotwCLAs[name], deltaCLAs[name]) {
			t.Fatalf("SotW and delta disagree on %s", name)
		}
	}

	// One service changes: each client gets exactly that CLA.
	newEps := genEndpoints(5, 777)
	f.endpoints(svcHost(42), newEps)
	changed := model.ClusterName(8080, "", svcHost(42))
	up := recv(t, sotwCh, "SotW EDS update")
	if got := decodeCLAs(t, up.GetResources()); len(got) != 1 || !slices.Equal(claAddresses(got[changed]), wantAddresses(newEps)) {
		t.Errorf("SotW update carries %d CLAs (%v), want only %s with the new endpoints", len(got), slices.Collect(mapsKeys(got)), changed)
	}
	dup := recv(t, deltaCh, "delta EDS update")
	if len(dup.GetResources()) != 1 || dup.GetResources()[0].GetName() != changed {
		t.Errorf("delta update = %d resources, want only %s", len(dup.GetResources()), changed)
	}
}

func mapsKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// TestNACKedVersionIsNotResent: a client that rejects a CLA is not sent the
// same version again, while other changes still reach it; a new version
// of the rejected CLA does go out; the NACK is counted.
func TestNACKedVersionIsNotResent(t *testing.T) {
	f := newFixture(t)
	f.populate(2, 2)
	s, _, addr := startServer(t, f)
	node := nodeFor(model.View{Kind: model.KindProxyless, Network: "network1"}, "sidecar~10.1.1.1~nacker.default~default.svc.cluster.local")
	names := []string{model.ClusterName(8080, "", svcHost(0)), model.ClusterName(8080, "", svcHost(1))}

	st, err := adsClient(t, addr).StreamAggregatedResources(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ch := pump(t, st.Recv)
	_ = st.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.EndpointType, ResourceNames: names})
	first := recv(t, ch, "EDS")
	_ = st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: names, VersionInfo: first.GetVersionInfo(), ResponseNonce: first.GetNonce()})

	// svc0 changes; the client rejects the new CLA.
	f.endpoints(svcHost(0), genEndpoints(4, 100))
	bad := recv(t, ch, "EDS update")
	if got := decodeCLAs(t, bad.GetResources()); len(got) != 1 || got[names[0]] == nil {
		t.Fatalf("update = %v", slices.Collect(mapsKeys(got)))
	}
	_ = st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: names,
		VersionInfo: first.GetVersionInfo(), ResponseNonce: bad.GetNonce(), ErrorDetail: &status.Status{Code: 3, Message: "test rejects this CLA"}})

	// An unrelated change reaches the client without the rejected CLA.
	f.endpoints(svcHost(1), genEndpoints(3, 101))
	next := recv(t, ch, "EDS update after NACK")
	if got := decodeCLAs(t, next.GetResources()); len(got) != 1 || got[names[1]] == nil {
		t.Fatalf("after the NACK the server sent %v, want only %s", slices.Collect(mapsKeys(got)), names[1])
	}
	_ = st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: names, VersionInfo: next.GetVersionInfo(), ResponseNonce: next.GetNonce()})

	// A new version of the rejected CLA does go out.
	f.endpoints(svcHost(0), genEndpoints(2, 102))
	fixed := recv(t, ch, "EDS fix")
	if got := decodeCLAs(t, fixed.GetResources()); len(got) != 1 || got[names[0]] == nil {
		t.Fatalf("fix = %v", slices.Collect(mapsKeys(got)))
	}

	if n := counterValue(t, s.metrics.nacks.WithLabelValues("eds")); n != 1 {
		t.Errorf("estuary_xds_nacks_total{type=eds} = %v, want 1", n)
	}
	for _, c := range s.Clients() {
		if ti := c.Types["eds"]; ti == nil || ti.NACKs != 1 || !strings.Contains(ti.NACK, "test rejects this CLA") {
			t.Errorf("/debug/adsz for %s: %+v, want the NACK and its message", c.Node, ti)
		}
	}
}

// TestPushAnswersOnlyAffectedWatches: with many watchers, a change to one
// service answers only the watchers of its CLA.
func TestPushAnswersOnlyAffectedWatches(t *testing.T) {
	f := newFixture(t)
	f.populate(100, 1)
	c := NewCache(NewGenerator(f.agg, nil))
	ws := openEDSWatches(t, c, proxylessView, 50, 2, 100)
	before := make([]int, len(ws))
	for i, w := range ws {
		before[i] = w.responses
	}
	f.endpoints(svcHost(7), genEndpoints(2, 7))
	st := c.Push(model.Change{Services: map[string]bool{svcHost(7): false}})
	if st.Total() != 1 {
		t.Errorf("push answered %d watches, want 1", st.Total())
	}
	ws.rearm(t, c)
	for i, w := range ws {
		got := w.responses - before[i]
		want := 0
		if i == 3 { // watcher 3 watches services 6 and 7
			want = 1
		}
		if got != want {
			t.Errorf("watcher %d got %d responses, want %d", i, got, want)
		}
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestWarmingOrder: when a service appears, a client on one ADS stream
// receives its cluster before the listener and route that name it, and can
// then get the cluster's endpoints.
func TestWarmingOrder(t *testing.T) {
	f := newFixture(t)
	f.populate(1, 1)
	_, _, addr := startServer(t, f)
	node := nodeFor(model.View{Kind: model.KindProxyless, Network: "network1"}, "sidecar~10.2.2.2~warm.default~default.svc.cluster.local")
	newHost := "late.default.svc.cluster.local"
	listener := model.ListenerName(newHost, 8080)
	cluster := model.ClusterName(8080, "", newHost)

	st, err := adsClient(t, addr).StreamAggregatedResources(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ch := pump(t, st.Recv)
	// Subscribe to what the service will need before it exists.
	_ = st.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.ClusterType, ResourceNames: []string{cluster}})
	_ = st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ListenerType, ResourceNames: []string{listener}})
	_ = st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.RouteType, ResourceNames: []string{listener}})

	f.service(newHost, 8080)
	f.endpoints(newHost, genEndpoints(2, 9))
	var order []string
	nonces := map[string]*discoveryv3.DiscoveryResponse{}
	for len(order) < 3 {
		resp := recv(t, ch, "push for the new service")
		order = append(order, typeName(resp.GetTypeUrl()))
		nonces[resp.GetTypeUrl()] = resp
	}
	if !slices.Equal(order, []string{"cds", "lds", "rds"}) {
		t.Fatalf("responses arrived in order %v, want cds, lds, rds", order)
	}
	// The cluster's endpoints can follow.
	_ = st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: []string{cluster}})
	eds := recv(t, ch, "EDS for the new cluster")
	if got := decodeCLAs(t, eds.GetResources()); len(claAddresses(got[cluster])) != 2 {
		t.Errorf("EDS for %s = %v", cluster, got)
	}
}

// TestDeletedServiceLeavesCDS: a client on a wildcard CDS watch loses the
// cluster of a service that is deleted.
func TestDeletedServiceLeavesCDS(t *testing.T) {
	f := newFixture(t)
	f.populate(3, 1)
	_, _, addr := startServer(t, f)
	st, err := adsClient(t, addr).StreamAggregatedResources(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ch := pump(t, st.Recv)
	_ = st.Send(&discoveryv3.DiscoveryRequest{Node: nodeFor(model.View{Kind: model.KindEnvoy}, envoyNode), TypeUrl: resourcev3.ClusterType})
	first := recv(t, ch, "CDS")
	if len(first.GetResources()) != 3 {
		t.Fatalf("CDS has %d clusters", len(first.GetResources()))
	}
	_ = st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, VersionInfo: first.GetVersionInfo(), ResponseNonce: first.GetNonce()})
	f.apply(false, &registryv1.Event{Instance: f.id, Kind: &registryv1.Event_ServiceDeleted{ServiceDeleted: &registryv1.ServiceDeleted{Hostname: svcHost(1)}}})
	next := recv(t, ch, "CDS after the delete")
	var names []string
	for _, a := range next.GetResources() {
		var c clusterv3.Cluster
		if err := proto.Unmarshal(a.GetValue(), &c); err != nil {
			t.Fatal(err)
		}
		names = append(names, c.GetName())
	}
	slices.Sort(names)
	want := []string{model.ClusterName(8080, "", svcHost(0)), model.ClusterName(8080, "", svcHost(2))}
	if !slices.Equal(names, want) {
		t.Errorf("CDS after deleting %s = %v, want %v", svcHost(1), names, want)
	}
}
