package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/estuary-mesh/estuary/testbed"
)

// replicaNode is the one node every replica test connects as.
const replicaNode = "sidecar~10.1.0.9~client.default~default.svc.cluster.local"

var replicaMeta = map[string]any{"CLUSTER_ID": "cluster1", "NETWORK": "network1"}

// xdsState is what a node holds: clusters and CLAs by name, without
// versions or nonces, so two servers can be compared.
type xdsState struct {
	clusters map[string]*clusterv3.Cluster
	clas     map[string]*endpointv3.ClusterLoadAssignment
}

// fetchState takes a node's whole CDS (wildcard) and the CLAs of its EDS
// clusters from the server at addr, over one ADS stream.
func fetchState(t *testing.T, addr string) xdsState {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	node := replicaNodeProto(t)
	st := xdsState{clusters: map[string]*clusterv3.Cluster{}, clas: map[string]*endpointv3.ClusterLoadAssignment{}}
	if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.ClusterType}); err != nil {
		t.Fatal(err)
	}
	var eds []string
	for eds == nil || len(st.clas) < len(eds) {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("ADS from %s: %v", addr, err)
		}
		ack := &discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resp.GetTypeUrl(), VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}
		if resp.GetTypeUrl() == resourcev3.EndpointType {
			ack.ResourceNames = eds
		}
		if err := stream.Send(ack); err != nil {
			t.Fatal(err)
		}
		for _, r := range resp.GetResources() {
			switch resp.GetTypeUrl() {
			case resourcev3.ClusterType:
				c := &clusterv3.Cluster{}
				if err := r.UnmarshalTo(c); err != nil {
					t.Fatal(err)
				}
				st.clusters[c.GetName()] = c
			case resourcev3.EndpointType:
				cla := &endpointv3.ClusterLoadAssignment{}
				if err := r.UnmarshalTo(cla); err != nil {
					t.Fatal(err)
				}
				st.clas[cla.GetClusterName()] = cla
			}
		}
		if resp.GetTypeUrl() == resourcev3.ClusterType && eds == nil {
			eds = edsClusters(st.clusters)
			if len(eds) == 0 {
				t.Fatalf("%s sent no EDS cluster", addr)
			}
			if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.EndpointType, ResourceNames: eds}); err != nil {
				t.Fatal(err)
			}
		}
	}
	return st
}

func replicaNodeProto(t *testing.T) *corev3.Node {
	t.Helper()
	md, err := structpb.NewStruct(replicaMeta)
	if err != nil {
		t.Fatal(err)
	}
	return &corev3.Node{Id: replicaNode, Metadata: md}
}

func edsClusters(cs map[string]*clusterv3.Cluster) []string {
	out := []string{}
	for _, name := range slices.Sorted(maps.Keys(cs)) {
		if cs[name].GetType() == clusterv3.Cluster_EDS {
			out = append(out, name)
		}
	}
	return out
}

// replicaPlugins is the same sources for every replica: a Kubernetes
// cluster and a static plugin with a service of three endpoints.
func replicaPlugins(k *testbed.Kube) string {
	return fmt.Sprintf(`plugin "kubernetes" {
  config {
    kubeconfig = %q
    cluster_id = "cluster1"
    network    = "network1"
  }
}
plugin "static" {
  config {
    cluster = "vms"
    service "db.example.com" {
      port "tcp" {
        number = 5432
      }
      endpoint {
        address  = "10.9.0.1"
        locality = "r1/z1/s1"
      }
      endpoint {
        address  = "10.9.0.2"
        locality = "r1/z2/s1"
      }
      endpoint {
        address = "10.9.0.3"
        weight  = 3
      }
    }
  }
}
`, k.Kubeconfig)
}

// TestReplicasServeTheSameConfig: two estuary processes on the same
// sources (an API server and a static plugin) send the same node the same
// clusters and the same endpoints, resource for resource, whatever their
// versions. Then a client connected through both addresses (as through a
// Service in front of the replicas) loses replica A to SIGKILL and
// reconnects to B: every response it got, on either stream, held every
// cluster and every endpoint.
func TestReplicasServeTheSameConfig(t *testing.T) {
	k := testbed.StartKube(t)
	ns := "rep-" + strconv.FormatInt(time.Now().UnixNano()%100000, 10)
	kubeEcho(t, k.Client(), ns, "10.96.1.1", "10.1.0.1")
	a := startHost(t, replicaPlugins(k))
	b := startHost(t, replicaPlugins(k))
	echo := "echo." + ns + ".svc.cluster.local"
	for _, h := range []*host{a, b} {
		eventuallyEndpoints(t, h, replicaNode, replicaMeta, echo, 1, []string{"10.1.0.1:8080 w=1"})
	}

	sa, sb := fetchState(t, a.xds), fetchState(t, b.xds)
	if len(sa.clusters) < 2 || len(sa.clas) < 2 {
		t.Fatalf("replica A sent %d clusters and %d CLAs, want both services", len(sa.clusters), len(sa.clas))
	}
	if d := cmp.Diff(sa.clusters, sb.clusters, protocmp.Transform()); d != "" {
		t.Errorf("CDS differs between replicas (-A +B):\n%s", d)
	}
	if d := cmp.Diff(sa.clas, sb.clas, protocmp.Transform()); d != "" {
		t.Errorf("EDS differs between replicas (-A +B):\n%s", d)
	}

	want := map[string]int{}
	for name, cla := range sb.clas {
		want[name] = lbEndpoints(cla)
	}
	w := watchReplicas(t, []string{a.xds, b.xds}, slices.Sorted(maps.Keys(sb.clusters)), want)
	w.waitFull(t, 1)
	a.signal(syscall.SIGKILL)
	<-a.exited
	w.waitFull(t, 2)
	if p := w.problems(); len(p) > 0 {
		t.Errorf("the client saw %d bad responses:\n%s", len(p), strings.Join(p, "\n"))
	}
}

func lbEndpoints(cla *endpointv3.ClusterLoadAssignment) int {
	n := 0
	for _, le := range cla.GetEndpoints() {
		n += len(le.GetLbEndpoints())
	}
	return n
}

// replicaWatch is an ADS client behind one gRPC channel to several
// replicas (pick_first over their addresses, as a client reaches the
// pods behind a Service). It reopens its stream when one ends, as Envoy
// does, and checks every response: a CDS that lacks a cluster, or a CLA
// with fewer or more endpoints than the full state, is a problem.
type replicaWatch struct {
	mu       sync.Mutex
	streams  int          // streams opened
	fullOn   map[int]bool // streams on which every CLA arrived whole
	seen     map[int]map[string]bool
	problem  []string
	clusters []string
	want     map[string]int
}

func watchReplicas(t *testing.T, addrs []string, clusters []string, want map[string]int) *replicaWatch {
	t.Helper()
	r := manual.NewBuilderWithScheme("replicas")
	var state resolver.State
	for _, a := range addrs {
		state.Addresses = append(state.Addresses, resolver.Address{Addr: a})
	}
	r.InitialState(state)
	conn, err := grpc.NewClient(r.Scheme()+":///estuary", grpc.WithResolvers(r),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	w := &replicaWatch{fullOn: map[int]bool{}, seen: map[int]map[string]bool{}, clusters: clusters, want: want}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done; conn.Close() })
	node := replicaNodeProto(t)
	go func() {
		defer close(done)
		client := discoveryv3.NewAggregatedDiscoveryServiceClient(conn)
		for ctx.Err() == nil {
			w.stream(ctx, client, node)
		}
	}()
	return w
}

// stream runs one ADS stream until it ends.
func (w *replicaWatch) stream(ctx context.Context, client discoveryv3.AggregatedDiscoveryServiceClient, node *corev3.Node) {
	stream, err := client.StreamAggregatedResources(ctx, grpc.WaitForReady(true))
	if err != nil {
		return
	}
	w.mu.Lock()
	w.streams++
	n := w.streams
	w.seen[n] = map[string]bool{}
	w.mu.Unlock()
	eds := slices.Collect(maps.Keys(w.want))
	if stream.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.ClusterType}) != nil ||
		stream.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.EndpointType, ResourceNames: eds}) != nil {
		return
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return
		}
		w.check(n, resp)
		ack := &discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resp.GetTypeUrl(), VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}
		if resp.GetTypeUrl() == resourcev3.EndpointType {
			ack.ResourceNames = eds
		}
		if stream.Send(ack) != nil {
			return
		}
	}
}

func (w *replicaWatch) check(n int, resp *discoveryv3.DiscoveryResponse) {
	w.mu.Lock()
	defer w.mu.Unlock()
	bad := func(format string, args ...any) {
		w.problem = append(w.problem, fmt.Sprintf("stream %d: ", n)+fmt.Sprintf(format, args...))
	}
	switch resp.GetTypeUrl() {
	case resourcev3.ClusterType:
		var names []string
		for _, r := range resp.GetResources() {
			c := &clusterv3.Cluster{}
			if err := r.UnmarshalTo(c); err != nil {
				bad("CDS: %v", err)
				return
			}
			names = append(names, c.GetName())
		}
		slices.Sort(names)
		if !slices.Equal(names, w.clusters) {
			bad("CDS %v, want %v", names, w.clusters)
		}
	case resourcev3.EndpointType:
		for _, r := range resp.GetResources() {
			cla := &endpointv3.ClusterLoadAssignment{}
			if err := r.UnmarshalTo(cla); err != nil {
				bad("EDS: %v", err)
				return
			}
			if got, want := lbEndpoints(cla), w.want[cla.GetClusterName()]; got != want {
				bad("CLA %s with %d endpoints, want %d", cla.GetClusterName(), got, want)
				continue
			}
			w.seen[n][cla.GetClusterName()] = true
		}
		if len(resp.GetResources()) == 0 {
			bad("an EDS response with no CLA")
		}
		if len(w.seen[n]) == len(w.want) {
			w.fullOn[n] = true
		}
	}
}

// waitFull waits until stream n has received every CLA whole.
func (w *replicaWatch) waitFull(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		w.mu.Lock()
		ok, streams := w.fullOn[n], w.streams
		w.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("stream %d never held every CLA (%d streams opened); problems: %v", n, streams, w.problems())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (w *replicaWatch) problems() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.problem)
}

// TestReplicaWatchFlagsPartialResponses: the failover check above can
// fail. A CLA short of an endpoint, an EDS response without a CLA and a
// CDS short of a cluster are each a problem; only the whole CLA counts
// toward "every CLA arrived".
func TestReplicaWatchFlagsPartialResponses(t *testing.T) {
	cla := func(n int) *endpointv3.ClusterLoadAssignment {
		c := &endpointv3.ClusterLoadAssignment{ClusterName: "c", Endpoints: []*endpointv3.LocalityLbEndpoints{{}}}
		for range n {
			c.Endpoints[0].LbEndpoints = append(c.Endpoints[0].LbEndpoints, &endpointv3.LbEndpoint{})
		}
		return c
	}
	resp := func(typ string, msgs ...proto.Message) *discoveryv3.DiscoveryResponse {
		r := &discoveryv3.DiscoveryResponse{TypeUrl: typ}
		for _, m := range msgs {
			a, err := anypb.New(m)
			if err != nil {
				t.Fatal(err)
			}
			r.Resources = append(r.Resources, a)
		}
		return r
	}
	w := &replicaWatch{fullOn: map[int]bool{}, seen: map[int]map[string]bool{1: {}}, clusters: []string{"c", "d"}, want: map[string]int{"c": 2}}
	w.check(1, resp(resourcev3.EndpointType, cla(1)))
	w.check(1, resp(resourcev3.EndpointType))
	w.check(1, resp(resourcev3.ClusterType, &clusterv3.Cluster{Name: "c"}))
	if p := w.problems(); len(p) != 3 || w.fullOn[1] {
		t.Fatalf("problems %q, full %v: want 3 problems and stream 1 not full", p, w.fullOn[1])
	}
	w.check(1, resp(resourcev3.EndpointType, cla(2)))
	w.check(1, resp(resourcev3.ClusterType, &clusterv3.Cluster{Name: "d"}, &clusterv3.Cluster{Name: "c"}))
	if p := w.problems(); len(p) != 3 || !w.fullOn[1] {
		t.Fatalf("problems %q, full %v: whole responses should add none and fill stream 1", p, w.fullOn[1])
	}
}
