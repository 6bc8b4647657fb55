package xdsload

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The tests run the fleet against go-control-plane's own snapshot-cache
// server, a reference xDS implementation, on loopback.

// oneNode puts every client in one snapshot.
type oneNode struct{}

func (oneNode) ID(*corev3.Node) string { return "all" }

type quiet struct{}

func (quiet) Debugf(string, ...any) {}
func (quiet) Infof(string, ...any)  {}
func (quiet) Warnf(string, ...any)  {}
func (quiet) Errorf(string, ...any) {}

type server struct {
	t       *testing.T
	cache   cachev3.SnapshotCache
	addr    string
	grpc    *grpc.Server
	version int
}

// startServer serves an empty snapshot on a free loopback port. The cache
// runs without its ADS mode, which answers only clients that name every
// resource of the snapshot, and so never a client that watches a subset.
func startServer(t *testing.T) *server {
	s := &server{t: t, cache: cachev3.NewSnapshotCache(false, oneNode{}, quiet{})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = ln.Addr().String()
	s.serve(ln)
	t.Cleanup(func() { s.grpc.Stop() })
	return s
}

func (s *server) serve(ln net.Listener) {
	s.grpc = grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(s.grpc, serverv3.NewServer(context.Background(), s.cache, nil))
	go s.grpc.Serve(ln)
}

// restart stops the server, ending every stream, and serves again on the
// same address.
func (s *server) restart() {
	s.grpc.Stop()
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		s.t.Fatal(err)
	}
	s.serve(ln)
}

// set publishes a new snapshot of clusters and CLAs.
func (s *server) set(clusters []*clusterv3.Cluster, clas ...*endpointv3.ClusterLoadAssignment) {
	s.t.Helper()
	s.version++
	res := map[resourcev3.Type][]types.Resource{resourcev3.ClusterType: nil, resourcev3.EndpointType: nil}
	for _, c := range clusters {
		res[resourcev3.ClusterType] = append(res[resourcev3.ClusterType], c)
	}
	for _, c := range clas {
		res[resourcev3.EndpointType] = append(res[resourcev3.EndpointType], c)
	}
	snap, err := cachev3.NewSnapshot(strconv.Itoa(s.version), res)
	if err != nil {
		s.t.Fatal(err)
	}
	if err := s.cache.SetSnapshot(context.Background(), "all", snap); err != nil {
		s.t.Fatal(err)
	}
}

func eds(name string) *clusterv3.Cluster {
	return &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{ServiceName: name, EdsConfig: &corev3.ConfigSource{
			ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
		}},
		ConnectTimeout: durationpb.New(time.Second),
	}
}

// logical is a non-EDS cluster: the client must not ask for its CLA.
func logical(name string) *clusterv3.Cluster {
	return &clusterv3.Cluster{Name: name, ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_LOGICAL_DNS}, ConnectTimeout: durationpb.New(time.Second)}
}

func cla(name string, endpoints int) *endpointv3.ClusterLoadAssignment {
	var lbs []*endpointv3.LbEndpoint
	for i := range endpoints {
		lbs = append(lbs, &endpointv3.LbEndpoint{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
			Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
				Address: fmt.Sprintf("10.0.0.%d", i+1), PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 8080},
			}}},
		}}})
	}
	return &endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: lbs}}}
}

func startFleet(t *testing.T, s *server, opts Options) *Fleet {
	t.Helper()
	opts.Addr = s.addr
	f, err := Start(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	return f
}

func wait(t *testing.T, f *Fleet, what string, ok func(*Client) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := f.Wait(ctx, ok); err != nil {
		t.Fatalf("waiting for %s: %v; stats %+v", what, err, f.Stats())
	}
}

func endpointsOf(c *Client, name string) int {
	r, ok := c.Resource(resourcev3.EndpointType, name)
	if !ok {
		return -1
	}
	return r.Endpoints
}

func problemKinds(f *Fleet) map[ProblemKind]int {
	out := map[ProblemKind]int{}
	for _, p := range f.Problems() {
		out[p.Kind]++
	}
	return out
}

var protocols = []Protocol{SotW, Delta, Mixed}

func TestClientsFollowTheServer(t *testing.T) {
	for _, p := range protocols {
		t.Run(p.String(), func(t *testing.T) {
			s := startServer(t)
			s.set([]*clusterv3.Cluster{eds("a"), eds("b"), logical("dns")}, cla("a", 2), cla("b", 1))
			f := startFleet(t, s, Options{Clients: 4, Protocol: p, Kind: Sidecar, ClusterID: "c1", Network: "n1", Required: []string{"a"}})
			wait(t, f, "first config", func(c *Client) bool {
				return c.Served() && slices.Equal(c.Clusters(), []string{"a", "b", "dns"}) && endpointsOf(c, "a") == 2 && endpointsOf(c, "b") == 1
			})
			before, _ := f.Clients()[0].Resource(resourcev3.EndpointType, "a")

			// b goes, a changes: clients drop b's CLA and take a's new one.
			s.set([]*clusterv3.Cluster{eds("a"), logical("dns")}, cla("a", 3))
			wait(t, f, "the change", func(c *Client) bool {
				return c.Served() && slices.Equal(c.Clusters(), []string{"a", "dns"}) && endpointsOf(c, "a") == 3 && endpointsOf(c, "b") == -1
			})
			after, _ := f.Clients()[0].Resource(resourcev3.EndpointType, "a")
			if after.Version == before.Version || !after.At.After(before.At) {
				t.Errorf("CLA a: version %q at %v after the change, %q at %v before", after.Version, after.At, before.Version, before.At)
			}
			if endpointsOf(f.Clients()[0], "dns") != -1 {
				t.Error("a client holds a CLA for a DNS cluster")
			}

			// A client that reconnects is served again from nothing.
			st := f.Stats()
			if err := f.Clients()[1].Reconnect(); err != nil {
				t.Fatal(err)
			}
			wait(t, f, "the reconnected client", func(c *Client) bool { return c.Served() && endpointsOf(c, "a") == 3 })
			if got := f.Stats(); got.Streams != st.Streams+1 || got.StreamErrors != 0 {
				t.Errorf("after one reconnect: %+v, before: %+v", got, st)
			}
			if got := f.Stats(); got.Problems != 0 || got.NACKs != 0 || got.ACKs == 0 || got.Connected != 4 || got.Served != 4 {
				t.Errorf("stats %+v, problems %v", got, f.Problems())
			}
		})
	}
}

func TestClientsReconnectWhenTheServerRestarts(t *testing.T) {
	s := startServer(t)
	s.set([]*clusterv3.Cluster{eds("a")}, cla("a", 1))
	f := startFleet(t, s, Options{Clients: 6, Protocol: Mixed, Kind: Proxyless, Required: []string{"a"}})
	wait(t, f, "first config", (*Client).Served)
	streams := f.Stats().Streams

	s.restart()
	wait(t, f, "new streams", func(*Client) bool { return f.Stats().Streams >= streams+6 })
	wait(t, f, "the config again", (*Client).Served)
	if st := f.Stats(); st.StreamErrors < 6 || st.Problems != 0 {
		t.Errorf("after a server restart: %+v, problems %v", st, f.Problems())
	}
}

// TestClientsReportWhatWouldCostAProxyItsEndpoints: each bad configuration
// is counted, as the right kind, by every client.
func TestClientsReportWhatWouldCostAProxyItsEndpoints(t *testing.T) {
	bad := eds("bad")
	bad.ConnectTimeout = durationpb.New(-time.Second) // Envoy's validation rejects it
	for _, tc := range []struct {
		name     string
		clusters []*clusterv3.Cluster
		clas     []*endpointv3.ClusterLoadAssignment
		want     ProblemKind
	}{
		{"empty CDS", nil, nil, ProblemEmptyCDS},
		{"a required cluster missing", []*clusterv3.Cluster{eds("b")}, []*endpointv3.ClusterLoadAssignment{cla("b", 1)}, ProblemPartialCDS},
		{"a required CLA empty", []*clusterv3.Cluster{eds("a"), eds("b")}, []*endpointv3.ClusterLoadAssignment{cla("a", 0), cla("b", 1)}, ProblemEmptyCLA},
		{"an invalid cluster", []*clusterv3.Cluster{eds("a"), eds("b"), bad}, []*endpointv3.ClusterLoadAssignment{cla("a", 1), cla("b", 1)}, ProblemNACK},
	} {
		for _, p := range []Protocol{SotW, Delta} {
			t.Run(tc.name+"/"+p.String(), func(t *testing.T) {
				s := startServer(t)
				s.set([]*clusterv3.Cluster{eds("a"), eds("b")}, cla("a", 1), cla("b", 1))
				f := startFleet(t, s, Options{Clients: 3, Protocol: p, Required: []string{"a"}})
				wait(t, f, "first config", (*Client).Served)
				if st := f.Stats(); st.Problems != 0 {
					t.Fatalf("problems before the bad config: %v", f.Problems())
				}
				s.set(tc.clusters, tc.clas...)
				wait(t, f, string(tc.want), func(*Client) bool { return problemKinds(f)[tc.want] >= 3 })
				// A server may remove a CLA before its cluster, which is
				// an empty CLA too; but only an invalid resource is NACKed.
				if nacks := f.Stats().NACKs; (tc.want == ProblemNACK) != (nacks >= 3) || (tc.want != ProblemNACK && nacks > 0) {
					t.Errorf("%d NACKs; problems %v", nacks, f.Problems())
				}
			})
		}
	}
}

// Before a client has held every required cluster, a partial CDS is not a
// problem: that is how a cold start looks.
func TestPartialConfigBeforeFullIsNoProblem(t *testing.T) {
	s := startServer(t)
	s.set([]*clusterv3.Cluster{eds("b")}, cla("b", 1))
	f := startFleet(t, s, Options{Clients: 2, Protocol: Mixed, Required: []string{"a", "b"}})
	wait(t, f, "first config", (*Client).Served)
	s.set([]*clusterv3.Cluster{eds("a"), eds("b")}, cla("a", 1), cla("b", 1))
	wait(t, f, "the full config", func(c *Client) bool { return c.Served() && len(c.Clusters()) == 2 })
	if st := f.Stats(); st.Problems != 0 {
		t.Errorf("problems %v", f.Problems())
	}
}

func TestWatchEDSPicksTheCLAs(t *testing.T) {
	s := startServer(t)
	s.set([]*clusterv3.Cluster{eds("a"), eds("b"), eds("c")}, cla("a", 1), cla("b", 1), cla("c", 1))
	// Client i watches only the cluster at index i%3.
	names := []string{"a", "b", "c"}
	f := startFleet(t, s, Options{Clients: 6, Protocol: Mixed, WatchEDS: func(i int, cluster string) bool { return names[i%3] == cluster }})
	wait(t, f, "first config", (*Client).Served)
	for _, c := range f.Clients() {
		for j, n := range names {
			if got, want := endpointsOf(c, n) == 1, j == c.Index()%3; got != want {
				t.Errorf("client %d holds CLA %s: %v, want %v", c.Index(), n, got, want)
			}
		}
	}
}

func TestOptionsAreChecked(t *testing.T) {
	for _, o := range []Options{
		{Addr: "10.0.0.1:15010", Clients: 1},
		{Addr: "localhost:15010", Clients: 1},
		{Addr: "127.0.0.1", Clients: 1},
		{Addr: "127.0.0.1:15010", Clients: 0},
		{Addr: "127.0.0.1:15010", Clients: 1, Protocol: Mixed + 1},
	} {
		if _, err := Start(context.Background(), o); err == nil {
			t.Errorf("Start(%+v) = nil error", o)
		}
	}
}

func TestNodeLooksLikeIstios(t *testing.T) {
	o := Options{ClusterID: "c1", Network: "n1", Namespace: "ns", Kind: Proxyless}
	if err := (&o).validate(); err == nil {
		t.Fatal("validate without an address passed")
	}
	o.DomainSuffix = "cluster.local"
	n := o.node(258)
	if n.GetId() != "sidecar~10.0.1.2~load-258.ns~ns.svc.cluster.local" {
		t.Errorf("id %q", n.GetId())
	}
	md := n.GetMetadata().GetFields()
	if md["CLUSTER_ID"].GetStringValue() != "c1" || md["NETWORK"].GetStringValue() != "n1" || md["GENERATOR"].GetStringValue() != "grpc" {
		t.Errorf("metadata %v", md)
	}
}

func TestDiffSorted(t *testing.T) {
	for _, tc := range []struct{ prev, next, added, removed []string }{
		{nil, []string{"a", "b"}, []string{"a", "b"}, nil},
		{[]string{"a", "b"}, nil, nil, []string{"a", "b"}},
		{[]string{"a", "c", "d"}, []string{"b", "c", "e"}, []string{"b", "e"}, []string{"a", "d"}},
	} {
		added, removed := diffSorted(tc.prev, tc.next)
		if !slices.Equal(added, tc.added) || !slices.Equal(removed, tc.removed) {
			t.Errorf("diffSorted(%v, %v) = %v, %v", tc.prev, tc.next, added, removed)
		}
	}
}

// Clients that hold the same clusters share one set, and a Delta client
// knows that a cluster the last response did not carry arrived earlier.
func TestClientsShareTheirClusters(t *testing.T) {
	s := startServer(t)
	s.set([]*clusterv3.Cluster{eds("a"), eds("b")}, cla("a", 1), cla("b", 1))
	f := startFleet(t, s, Options{Clients: 6, Protocol: Mixed})
	wait(t, f, "first config", (*Client).Served)
	cs := f.Clients()
	for _, c := range cs[2:] {
		if c.cds != cs[c.Index()%2].cds {
			t.Errorf("client %d does not share its clusters with client %d", c.Index(), c.Index()%2)
		}
	}
	first, _ := cs[1].Resource(resourcev3.ClusterType, "a")
	firstSotW, _ := cs[0].Resource(resourcev3.ClusterType, "a")

	s.set([]*clusterv3.Cluster{eds("a"), eds("b"), eds("c")}, cla("a", 1), cla("b", 1), cla("c", 1))
	wait(t, f, "cluster c", func(c *Client) bool { return c.Served() && len(c.Clusters()) == 3 })
	a, _ := cs[1].Resource(resourcev3.ClusterType, "a")
	c, _ := cs[1].Resource(resourcev3.ClusterType, "c")
	if a != first || !c.At.After(a.At) {
		t.Errorf("Delta client: cluster a %+v (first %+v), c %+v", a, first, c)
	}
	if sa, _ := cs[0].Resource(resourcev3.ClusterType, "a"); !sa.At.After(firstSotW.At) || sa.Version == firstSotW.Version {
		t.Errorf("SotW client: cluster a %+v, first %+v: every response carries it anew", sa, firstSotW)
	}
}

// TestClientsWaitForAServerThatIsNotUpYet: clients started before their
// server listens fail their attempts, back off as Envoy does, and are
// served once it is up: a storm after a restart looks like this.
func TestClientsWaitForAServerThatIsNotUpYet(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	f, err := Start(context.Background(), Options{Addr: addr, Clients: 4, Protocol: Mixed, Required: []string{"a"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	wait(t, f, "refused attempts", func(*Client) bool { return f.Stats().StreamErrors >= 4 })
	if st := f.Stats(); st.Streams != 0 || st.Connected != 0 {
		t.Fatalf("streams with no server: %+v", st)
	}

	s := &server{t: t, cache: cachev3.NewSnapshotCache(false, oneNode{}, quiet{}), addr: addr}
	s.set([]*clusterv3.Cluster{eds("a")}, cla("a", 1))
	if ln, err = net.Listen("tcp", addr); err != nil {
		t.Fatal(err)
	}
	s.serve(ln)
	t.Cleanup(func() { s.grpc.Stop() })
	wait(t, f, "the config", func(c *Client) bool { return c.Served() && endpointsOf(c, "a") == 1 })
	if st := f.Stats(); st.Problems != 0 || st.Streams != 4 {
		t.Errorf("stats %+v, problems %v", st, f.Problems())
	}
}

// TestBackoffIsEnvoys: waits are drawn from [0, interval), the interval
// doubling from 500 ms to 30 s, and starting over after a response.
func TestBackoffIsEnvoys(t *testing.T) {
	var b backoff
	var got []time.Duration
	top := func(n int64) int64 { got = append(got, time.Duration(n)); return n - 1 }
	for range 9 {
		if d := b.wait(top); d != got[len(got)-1]-1 {
			t.Fatalf("wait %v with the draw at the top of [0, %v)", d, got[len(got)-1])
		}
	}
	b.reset()
	b.wait(top)
	s := time.Second
	want := []time.Duration{s / 2, s, 2 * s, 4 * s, 8 * s, 16 * s, 30 * s, 30 * s, 30 * s, s / 2}
	if !slices.Equal(got, want) {
		t.Errorf("intervals %v, want %v", got, want)
	}
}

// TestResponseCodecDecodesAsProtobuf: the clients' codec gives the same
// messages as protobuf, by hand where it can and through protobuf for a
// field it does not decode itself, and fails where protobuf fails.
func TestResponseCodecDecodesAsProtobuf(t *testing.T) {
	anyOf := func(m proto.Message) *anypb.Any {
		a, err := anypb.New(m)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	sotw := &discoveryv3.DiscoveryResponse{VersionInfo: "v1", TypeUrl: resourcev3.ClusterType, Nonce: "n1",
		Resources: []*anypb.Any{anyOf(eds("a")), anyOf(logical("b")), {TypeUrl: "type.example/x"}}}
	delta := &discoveryv3.DeltaDiscoveryResponse{SystemVersionInfo: "s", TypeUrl: resourcev3.EndpointType, Nonce: "n2",
		Resources: []*discoveryv3.Resource{
			{Name: "a", Version: "3", Resource: anyOf(cla("a", 2))},
			{Name: "b", Version: "4", Resource: anyOf(cla("b", 0))},
		},
		RemovedResources: []string{"c", "d"}}
	canary := proto.Clone(sotw).(*discoveryv3.DiscoveryResponse)
	canary.Canary = true // a varint: protobuf's decode
	aliased := proto.Clone(delta).(*discoveryv3.DeltaDiscoveryResponse)
	aliased.Resources[1].Aliases = []string{"b2"} // a field decodeResource leaves to protobuf
	for _, tc := range []struct {
		name   string
		m      proto.Message
		byHand bool
	}{
		{"sotw", sotw, true}, {"delta", delta, true}, {"sotw with canary", canary, false}, {"delta with aliases", aliased, false},
		{"empty sotw", &discoveryv3.DiscoveryResponse{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := proto.Marshal(tc.m)
			if err != nil {
				t.Fatal(err)
			}
			got := tc.m.ProtoReflect().New().Interface()
			if err := (responseCodec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, got); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, tc.m) {
				t.Errorf("decoded %v, want %v", got, tc.m)
			}
			var byHand bool
			switch m := tc.m.ProtoReflect().New().Interface().(type) {
			case *discoveryv3.DiscoveryResponse:
				byHand = decodeSotW(b, m)
			case *discoveryv3.DeltaDiscoveryResponse:
				byHand = decodeDelta(b, m)
			}
			if byHand != tc.byHand {
				t.Errorf("decoded by hand: %v, want %v", byHand, tc.byHand)
			}
			if len(b) > 0 {
				if err := (responseCodec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(b[:len(b)-1])}, tc.m.ProtoReflect().New().Interface()); err == nil {
					t.Error("a truncated response decoded")
				}
			}
		})
	}
	bad := []byte{byte(sotwNonce<<3 | 2), 2, 0xff, 0xfe} // a nonce that is not UTF-8
	if err := (responseCodec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(bad)}, &discoveryv3.DiscoveryResponse{}); err == nil {
		t.Error("a response with a string that is not UTF-8 decoded")
	}
}

// TestResponseKeyIgnoresOrder: a response names the same set in any
// order, and a different one when a resource, a version, a removed name
// or the protocol differs.
func TestResponseKeyIgnoresOrder(t *testing.T) {
	ss := newSets()
	anyOf := func(name string) *anypb.Any {
		a, err := anypb.New(eds(name))
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	a, b, c := anyOf("a"), anyOf("b"), anyOf("c")
	v := func(s string) func(int) string { return func(int) string { return s } }
	key := ss.responseKey(nil, true, []*anypb.Any{a, b}, v("1"), nil)
	if got := ss.responseKey(nil, true, []*anypb.Any{b, a}, v("1"), nil); got != key {
		t.Error("the order of the resources changes the key")
	}
	if ss.responseKey(nil, false, []*anypb.Any{a}, v("1"), []string{"x", "y"}) != ss.responseKey(nil, false, []*anypb.Any{a}, v("1"), []string{"y", "x"}) {
		t.Error("the order of the removed names changes the key")
	}
	for name, other := range map[string]digest{
		"another resource":  ss.responseKey(nil, true, []*anypb.Any{a, c}, v("1"), nil),
		"one resource less": ss.responseKey(nil, true, []*anypb.Any{a}, v("1"), nil),
		"one twice":         ss.responseKey(nil, true, []*anypb.Any{a, b, b}, v("1"), nil),
		"another version":   ss.responseKey(nil, true, []*anypb.Any{a, b}, v("2"), nil),
		"a removed name":    ss.responseKey(nil, true, []*anypb.Any{a, b}, v("1"), []string{"x"}),
		"Delta":             ss.responseKey(nil, false, []*anypb.Any{a, b}, v("1"), nil),
	} {
		if other == key {
			t.Errorf("%s: same key", name)
		}
	}
}
