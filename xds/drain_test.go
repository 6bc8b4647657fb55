package xds

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"

	"github.com/estuary-mesh/estuary/host/model"
)

// errRunStuck is stop's result when Run outlives its context by 20s.
var errRunStuck = errors.New("Run did not return within 20s of its context ending")

// runStoppable runs s and returns its address and a stop that ends Run's
// context and returns Run's result. stop may be called from any goroutine,
// and more than once, concurrently too (a test's own call racing its
// cleanup's after a failure): every call waits for the one receive of
// Run's result. It never calls t.Fatal, which would only end the calling
// goroutine when that is not the test's.
func runStoppable(t testing.TB, s *Server) (string, func() error) {
	t.Helper()
	addr, err := s.Listen()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	var once sync.Once
	var result error
	stop := func() error {
		cancel()
		once.Do(func() {
			select {
			case result = <-done:
			case <-time.After(20 * time.Second):
				result = errRunStuck
			}
		})
		return result
	}
	t.Cleanup(func() {
		// Run's own error is the test's to judge; a Run that never
		// returned is always a failure.
		if err := stop(); errors.Is(err, errRunStuck) {
			t.Error(err)
		}
	})
	return addr.String(), stop
}

var drainNode = nodeFor(model.View{Kind: model.KindEnvoy, Network: "network1"}, envoyNode)

// openCDS opens an ADS stream on conn, asks for every cluster and returns
// the responses (closed, with the stream's error in *end, when it ends).
func openCDS(t *testing.T, conn *grpc.ClientConn) (discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient, <-chan *discoveryv3.DiscoveryResponse, *error) {
	t.Helper()
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(t.Context(), grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	var end error
	ch := pump(t, func() (*discoveryv3.DiscoveryResponse, error) {
		r, err := st.Recv()
		if err != nil {
			end = err
		}
		return r, err
	})
	if err := st.Send(&discoveryv3.DiscoveryRequest{Node: drainNode, TypeUrl: resourcev3.ClusterType}); err != nil {
		t.Fatal(err)
	}
	return st, ch, &end
}

func dial(t *testing.T, target string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(target, append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestDrainServesStreamsThroughTheGrace: when Run's context ends, every
// connection gets a GOAWAY at once, yet its streams are still pushed to
// during the grace; Run returns as soon as the last client has left,
// without waiting out the grace.
func TestDrainServesStreamsThroughTheGrace(t *testing.T) {
	f := newFixture(t)
	f.populate(2, 1)
	s := New(Options{Listen: "127.0.0.1:0", DrainGrace: time.Hour}, f.agg, nil, f.agg, hclog.NewNullLogger(), nil)
	addr, stop := runStoppable(t, s)
	conn := dial(t, addr)
	st, ch, _ := openCDS(t, conn)
	cds := recv(t, ch, "CDS")
	_ = st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, VersionInfo: cds.GetVersionInfo(), ResponseNonce: cds.GetNonce()})
	// A served stream does not mean the ClientConn reports READY yet:
	// grpc-go hands its balancer's new picker to RPCs before it publishes
	// the new state, so a whole round trip can complete while GetState
	// still says CONNECTING. Wait for READY: leaving it is the GOAWAY's
	// proof below, so draining before it would prove nothing.
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	for state := conn.GetState(); state != connectivity.Ready; state = conn.GetState() {
		if !conn.WaitForStateChange(ctx, state) {
			t.Fatalf("connection %v 20s after its stream was served, want READY", conn.GetState())
		}
	}

	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	// The GOAWAY: the client's connection leaves READY, so its next
	// stream would go elsewhere.
	for conn.GetState() == connectivity.Ready {
		if !conn.WaitForStateChange(ctx, connectivity.Ready) {
			t.Fatal("no GOAWAY: the connection stayed READY after the drain began")
		}
	}
	// The stream is still served: a new service reaches it.
	f.service(svcHost(9), 8080)
	if up := recv(t, ch, "CDS push during the drain"); len(up.GetResources()) != 3 {
		t.Errorf("CDS during the drain has %d clusters, want 3", len(up.GetResources()))
	}
	_ = st.CloseSend()
	if err := <-stopped; err != nil {
		t.Errorf("Run after the drain = %v, want nil", err)
	}
}

// TestDrainMovesClientsToAnotherServer: a client of two servers whose
// server drains sees its stream end with Unavailable (not another error),
// reconnects on the same ClientConn, and the other server serves it the
// whole config.
func TestDrainMovesClientsToAnotherServer(t *testing.T) {
	f := newFixture(t)
	f.populate(2, 1)
	a := New(Options{Listen: "127.0.0.1:0"}, f.agg, nil, f.agg, hclog.NewNullLogger(), nil)
	b := New(Options{Listen: "127.0.0.1:0"}, f.agg, nil, f.agg, hclog.NewNullLogger(), nil)
	addrA, stopA := runStoppable(t, a)
	addrB, _ := runStoppable(t, b)
	r := manual.NewBuilderWithScheme("drain")
	r.InitialState(resolver.State{Addresses: []resolver.Address{{Addr: addrA}, {Addr: addrB}}})
	conn := dial(t, r.Scheme()+":///xds", grpc.WithResolvers(r))

	_, ch, end := openCDS(t, conn)
	recv(t, ch, "CDS from the first server")
	if len(a.Clients()) != 1 {
		t.Fatalf("first server has %d streams, want the client's", len(a.Clients()))
	}
	if err := stopA(); err != nil {
		t.Fatalf("Run after the drain = %v", err)
	}
	streamEnds(t, ch)
	if status.Code(*end) != codes.Unavailable {
		t.Fatalf("stream ended with %v, want Unavailable", *end)
	}

	_, ch, _ = openCDS(t, conn)
	if cds := recv(t, ch, "CDS from the second server"); len(cds.GetResources()) != 2 {
		t.Errorf("second server sent %d clusters, want 2", len(cds.GetResources()))
	}
	if len(b.Clients()) != 1 {
		t.Errorf("second server has %d streams, want the client's", len(b.Clients()))
	}
}

// TestMaxConnectionAgeRecyclesConnections: with a short max_connection_age
// a client's connection is closed again and again; each time its stream
// ends with Unavailable, and its next stream is served the whole config,
// never an empty one.
func TestMaxConnectionAgeRecyclesConnections(t *testing.T) {
	f := newFixture(t)
	f.populate(2, 1)
	s := New(Options{Listen: "127.0.0.1:0", MaxConnectionAge: 50 * time.Millisecond}, f.agg, nil, f.agg, hclog.NewNullLogger(), nil)
	addr, _ := runStoppable(t, s)
	conn := dial(t, addr)
	for i := range 3 {
		_, ch, end := openCDS(t, conn)
		if cds := recv(t, ch, "CDS"); len(cds.GetResources()) != 2 {
			t.Fatalf("connection %d: CDS has %d clusters, want 2", i, len(cds.GetResources()))
		}
		streamEnds(t, ch)
		if status.Code(*end) != codes.Unavailable {
			t.Fatalf("connection %d: stream ended with %v, want Unavailable", i, *end)
		}
	}
}
