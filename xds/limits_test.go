package xds

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/estuary-mesh/estuary/host/model"
)

// startLimited serves the fixture with limits.
func startLimited(t *testing.T, f *fixture, l Limits) (*Server, *prometheus.Registry, string) {
	t.Helper()
	reg := prometheus.NewRegistry()
	s := New(Options{Listen: "127.0.0.1:0", Limits: l}, f.agg, nil, f.agg, hclog.NewNullLogger(), reg)
	return s, reg, serve(t, s)
}

// viewNode is a node of its own view: cluster i.
func viewNode(i int) *discoveryv3.DiscoveryRequest {
	return &discoveryv3.DiscoveryRequest{Node: nodeFor(model.View{Kind: model.KindEnvoy, Network: "network1", Cluster: fmt.Sprintf("cluster-%d", i)},
		fmt.Sprintf("sidecar~10.0.0.1~c%d.default~default.svc.cluster.local", i)), TypeUrl: resourcev3.ClusterType}
}

// ask opens a stream on conn, sends req and returns the first answer or
// the error that ended the stream, and a cancel that ends the stream.
func ask(t *testing.T, conn *grpc.ClientConn, req *discoveryv3.DiscoveryRequest) (*discoveryv3.DiscoveryResponse, context.CancelFunc, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return nil, cancel, err
	}
	_ = st.Send(req)
	resp, err := st.Recv()
	return resp, cancel, err
}

func wantRefused(t *testing.T, err error, code codes.Code, says string) {
	t.Helper()
	if status.Code(err) != code || !strings.Contains(err.Error(), says) {
		t.Fatalf("got %v, want %v saying %q", err, code, says)
	}
}

// TestLimits: each limit refuses past its value with an error naming its
// attribute, counts the refusal, and admits again once there is room.
func TestLimits(t *testing.T) {
	f := newFixture(t)
	f.populate(5, 1)

	t.Run("views", func(t *testing.T) {
		s, reg, addr := startLimited(t, f, Limits{MaxViews: 2})
		conn := dial(t, addr)
		_, leave, err := ask(t, conn, viewNode(1))
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := ask(t, conn, viewNode(2)); err != nil {
			t.Fatal(err)
		}
		// A third client of an existing view costs nothing: admitted.
		if _, _, err := ask(t, conn, viewNode(2)); err != nil {
			t.Fatal(err)
		}
		_, _, err = ask(t, conn, viewNode(3))
		wantRefused(t, err, codes.ResourceExhausted, "max_views")
		if got := metric(t, reg, "estuary_xds_limit_refusals_total", limitViews); got != 1 {
			t.Errorf("refusals{limit=views} = %v, want 1", got)
		}
		// The only client of view 1 leaves: view 3 fits.
		leave()
		eventually(t, "view 1 to be freed", func() bool { return s.Cache().LiveViews() == 1 })
		if _, _, err := ask(t, conn, viewNode(3)); err != nil {
			t.Fatalf("after a view was freed: %v", err)
		}
	})

	t.Run("streams per connection", func(t *testing.T) {
		_, reg, addr := startLimited(t, f, Limits{MaxStreamsPerConnection: 2})
		conn := dial(t, addr)
		for range 2 {
			if _, _, err := ask(t, conn, viewNode(1)); err != nil {
				t.Fatal(err)
			}
		}
		_, _, err := ask(t, conn, viewNode(1))
		wantRefused(t, err, codes.ResourceExhausted, "max_streams_per_connection")
		if got := metric(t, reg, "estuary_xds_limit_refusals_total", limitStreams); got != 1 {
			t.Errorf("refusals{limit=streams_per_connection} = %v, want 1", got)
		}
		// Another connection has its own streams.
		if _, _, err := ask(t, dial(t, addr), viewNode(1)); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("connections", func(t *testing.T) {
		_, reg, addr := startLimited(t, f, Limits{MaxConnections: 2})
		first := dial(t, addr)
		for _, c := range []*grpc.ClientConn{first, dial(t, addr)} {
			if _, _, err := ask(t, c, viewNode(1)); err != nil {
				t.Fatal(err)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		third := dial(t, addr)
		st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(third).StreamAggregatedResources(ctx, grpc.WaitForReady(false))
		if err == nil {
			_ = st.Send(viewNode(1))
			_, err = st.Recv()
		}
		if err == nil {
			t.Fatal("a third connection was served")
		}
		eventually(t, "the refused connection to be counted", func() bool {
			return metric(t, reg, "estuary_xds_limit_refusals_total", limitConnections) >= 1
		})
		// A connection closes: the next one is served.
		first.Close()
		eventually(t, "a connection to be admitted once one closed", func() bool {
			_, _, err := ask(t, dial(t, addr), viewNode(1))
			return err == nil
		})
	})

	t.Run("resource names", func(t *testing.T) {
		_, reg, addr := startLimited(t, f, Limits{MaxResourceNames: 3})
		conn := dial(t, addr)
		names := func(n int) []string {
			var out []string
			for i := range n {
				out = append(out, model.ClusterName(8080, "", svcHost(i)))
			}
			return out
		}
		req := viewNode(1)
		req.TypeUrl, req.ResourceNames = resourcev3.EndpointType, names(3)
		if _, _, err := ask(t, conn, req); err != nil {
			t.Fatal(err)
		}
		req.ResourceNames = names(4)
		_, _, err := ask(t, conn, req)
		wantRefused(t, err, codes.ResourceExhausted, "max_resource_names")

		// Delta: a subscription that grows past the limit, request by
		// request, is refused too.
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		ds, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_ = ds.Send(&discoveryv3.DeltaDiscoveryRequest{Node: req.Node, TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: names(2)})
		if _, err := ds.Recv(); err != nil {
			t.Fatal(err)
		}
		_ = ds.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: names(4)[2:]})
		_, err = ds.Recv()
		wantRefused(t, err, codes.ResourceExhausted, "max_resource_names")
		if got := metric(t, reg, "estuary_xds_limit_refusals_total", limitResourceNames); got != 2 {
			t.Errorf("refusals{limit=resource_names} = %v, want 2", got)
		}
	})

	t.Run("unknown types", func(t *testing.T) {
		_, reg, addr := startLimited(t, f, Limits{MaxUnknownTypes: 1})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(dial(t, addr)).StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		req := viewNode(1)
		// One unknown type is kept, unanswered; the stream goes on.
		_ = st.Send(&discoveryv3.DiscoveryRequest{Node: req.Node, TypeUrl: "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"})
		_ = st.Send(req)
		resp, err := st.Recv()
		if err != nil || resp.GetTypeUrl() != resourcev3.ClusterType {
			t.Fatalf("after one unknown type: %v %v", resp.GetTypeUrl(), err)
		}
		_ = st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: "type.googleapis.com/made.up.Type"})
		_, err = st.Recv()
		wantRefused(t, err, codes.ResourceExhausted, "max_unknown_types")
		if got := metric(t, reg, "estuary_xds_limit_refusals_total", limitUnknownTypes); got != 1 {
			t.Errorf("refusals{limit=unknown_types} = %v, want 1", got)
		}
	})

	// A negative limit (max_unknown_types = 0 in plugins.hcl) allows none:
	// the first unknown type ends the stream.
	t.Run("no unknown types", func(t *testing.T) {
		_, reg, addr := startLimited(t, f, Limits{MaxUnknownTypes: -1})
		// Were the type kept, nothing would answer it: the deadline
		// turns that into a failure instead of a hang.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(dial(t, addr)).StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_ = st.Send(&discoveryv3.DiscoveryRequest{Node: viewNode(1).Node, TypeUrl: "type.googleapis.com/made.up.Type"})
		_, err = st.Recv()
		wantRefused(t, err, codes.ResourceExhausted, "max_unknown_types")
		if got := metric(t, reg, "estuary_xds_limit_refusals_total", limitUnknownTypes); got != 1 {
			t.Errorf("refusals{limit=unknown_types} = %v, want 1", got)
		}
	})
}

// TestUnknownTypesShareOneLabel: NACKs of types Estuary does not serve
// are counted under one label, so a client cannot mint series.
func TestUnknownTypesShareOneLabel(t *testing.T) {
	f := newFixture(t)
	f.populate(1, 1)
	_, reg, addr := startLimited(t, f, Limits{MaxUnknownTypes: 3})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(dial(t, addr)).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		_ = st.Send(&discoveryv3.DiscoveryRequest{Node: viewNode(1).Node, TypeUrl: fmt.Sprintf("type.googleapis.com/x.T%d", i),
			ResponseNonce: "1", ErrorDetail: &rpcstatus.Status{Message: "no"}})
	}
	_ = st.Send(viewNode(1))
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != "estuary_xds_nacks_total" {
			continue
		}
		if len(mf.GetMetric()) != 1 || mf.GetMetric()[0].GetLabel()[0].GetValue() != "unknown" || mf.GetMetric()[0].GetCounter().GetValue() != 3 {
			t.Errorf("nacks: %v", mf.GetMetric())
		}
		return
	}
	t.Error("no estuary_xds_nacks_total")
}

// TestViewsAreFreedWhenClientsLeave: 1,000 clients, each claiming its own
// view (CLUSTER_ID and NETWORK), connect and leave; afterwards the live
// views and the heap are back to where they were with one client, and a
// push reaches the client that stayed. Before views were reference
// counted every view ever claimed stayed, and every push rebuilt all.
func TestViewsAreFreedWhenClientsLeave(t *testing.T) {
	if testing.Short() {
		t.Skip("1,000 clients")
	}
	f := newFixture(t)
	f.populate(50, 10)
	s, _, addr := startLimited(t, f, Limits{MaxViews: 2000})
	stay := dial(t, addr)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(stay).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = st.Send(viewNode(0))
	first, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	_ = st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, VersionInfo: first.GetVersionInfo(), ResponseNonce: first.GetNonce()})
	ch := pump(t, st.Recv)
	baseViews := s.Cache().LiveViews()
	// A first round of as many clients warms what a process makes once
	// and keeps: gRPC's buffer pools, HPACK tables, lazily built protobuf
	// descriptors, and the runtime's descriptors of dead goroutines
	// (never freed; 1,000 clients on both ends of loopback leave ~2 MB
	// of them). The baseline is then the steady state the second round,
	// of 1,000 other views, must return to.
	churn(t, addr, 1000, 5000, nil)
	eventually(t, "the warm-up views to be freed", func() bool { return s.Cache().LiveViews() == baseViews })
	baseHeap := heapInUse()

	churn(t, addr, 1000, 1, func() {
		if got := s.Cache().LiveViews(); got != baseViews+1000 {
			t.Fatalf("%d live views with 1,000 clients of distinct views connected, want %d", got, baseViews+1000)
		}
	})
	eventually(t, "the views of the clients that left to be freed", func() bool { return s.Cache().LiveViews() == baseViews })
	var heap uint64
	deadline := time.Now().Add(30 * time.Second)
	for heap = heapInUse(); heap > baseHeap*12/10 && time.Now().Before(deadline); heap = heapInUse() {
		time.Sleep(200 * time.Millisecond)
	}
	if heap > baseHeap*12/10 {
		t.Errorf("heap %d KiB after the clients left, %d KiB before: more than 20%% up", heap>>10, baseHeap>>10)
	}
	f.service(svcHost(99), 8080)
	if resp := recv(t, ch, "a push to the client that stayed"); len(resp.GetResources()) != 51 {
		t.Errorf("push carried %d clusters, want 51", len(resp.GetResources()))
	}
}

// churn connects n clients, each of its own view (from offset), over
// connections of 50 streams, waits until each is answered, calls
// connected, then closes them all.
func churn(tb testing.TB, addr string, n, offset int, connected func()) {
	tb.Helper()
	const perConn = 50
	ctx, cancel := context.WithCancel(context.Background())
	var conns []*grpc.ClientConn
	answered := make(chan error, n)
	for i := range n {
		if i%perConn == 0 {
			c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				tb.Fatal(err)
			}
			conns = append(conns, c)
		}
		st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conns[len(conns)-1]).StreamAggregatedResources(ctx)
		if err != nil {
			tb.Fatal(err)
		}
		go func() {
			if err := st.Send(viewNode(offset + i)); err != nil {
				answered <- err
				return
			}
			_, err := st.Recv()
			answered <- err
		}()
	}
	for range n {
		select {
		case err := <-answered:
			if err != nil {
				tb.Fatal(err)
			}
		case <-time.After(60 * time.Second):
			tb.Fatal("clients not answered within 60s")
		}
	}
	if connected != nil {
		connected()
	}
	cancel()
	for _, c := range conns {
		c.Close()
	}
}

// TestUnknownSubsetsKeepNoState: EDS names the view's clusters do not
// hold (a subset no endpoint carries, a host that does not exist) get no
// resource and leave nothing in the cache; once such a subset appears,
// the client that asked for it is answered.
func TestUnknownSubsetsKeepNoState(t *testing.T) {
	f := newFixture(t)
	f.populate(1, 2)
	c := NewCache(NewGenerator(f.agg, nil))
	v := model.View{Kind: model.KindEnvoy, Network: "network1"}
	var names []string
	for i := range 100 {
		names = append(names, model.ClusterName(8080, fmt.Sprintf("v%d", i), svcHost(0)))
	}
	names = append(names, model.ClusterName(8080, "", "nowhere.default.svc.cluster.local"))
	sub := stream.NewSotwSubscription(names, false)
	ch := make(chan cache.Response, 1)
	req := &discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: names, Node: nodeFor(v, envoyNode)}
	if _, err := c.CreateWatch(req, &sub, ch); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-ch:
		t.Fatalf("answered names no cluster holds: %v", r.GetReturnedResources())
	default:
	}
	c.mu.Lock()
	vs := c.views[v]
	held, hosts := len(vs.res[tEndpoint]), len(vs.hostNames[tEndpoint])
	c.mu.Unlock()
	if held != 0 || hosts != 0 {
		t.Fatalf("the view keeps %d CLAs under %d hosts for names no cluster holds", held, hosts)
	}

	// Subset v7 appears: its cluster is pushed, and the waiting watch gets
	// its CLA.
	eps := genEndpoints(2, 0)
	eps[0].Labels = map[string]string{model.SubsetLabel: "v7"}
	f.endpoints(svcHost(0), eps)
	c.Push(model.Change{Services: map[string]bool{svcHost(0): false}})
	select {
	case r := <-ch:
		want := model.ClusterName(8080, "v7", svcHost(0))
		if _, ok := r.GetReturnedResources()[want]; !ok || len(r.GetReturnedResources()) != 1 {
			t.Fatalf("answered %v, want only %s", r.GetReturnedResources(), want)
		}
	default:
		t.Fatal("the watch of the subset that appeared was not answered")
	}

	// The subset goes away again: its CLA is dropped from the view.
	f.endpoints(svcHost(0), genEndpoints(2, 0))
	c.Push(model.Change{Services: map[string]bool{svcHost(0): false}})
	c.mu.Lock()
	_, kept := vs.res[tEndpoint][model.ClusterName(8080, "v7", svcHost(0))]
	c.mu.Unlock()
	if kept {
		t.Error("the CLA of a subset that went away is still kept")
	}
}

// TestWarnLimiter: one warning per client per interval, with the count of
// those held back; other clients are not held back by it.
func TestWarnLimiter(t *testing.T) {
	l := newWarnLimiter(time.Hour)
	if ok, _ := l.allow("a"); !ok {
		t.Fatal("first warning held back")
	}
	for range 5 {
		if ok, _ := l.allow("a"); ok {
			t.Fatal("a second warning within the interval let through")
		}
	}
	if ok, _ := l.allow("b"); !ok {
		t.Fatal("another client's warning held back")
	}
	l.every = 0
	if ok, held := l.allow("a"); !ok || held != 5 {
		t.Fatalf("after the interval: ok %v, held %d; want true, 5", ok, held)
	}
	for i := range warnMaxKeys * 2 {
		l.allow(fmt.Sprint(i))
	}
	if len(l.last) > warnMaxKeys {
		t.Errorf("limiter keeps %d clients, more than %d", len(l.last), warnMaxKeys)
	}
}
