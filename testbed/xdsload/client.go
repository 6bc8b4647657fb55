package xdsload

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"
	"unique"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// name is an interned resource name: every client holding the same
// cluster shares one copy of its name.
type name = unique.Handle[string]

// Resource is what a client holds of one resource.
type Resource struct {
	// Version is the resource's version (Delta) or the version_info of
	// the response that carried it (SotW).
	Version string
	// At is when the client received this version. For a cluster that
	// the client's last cdsHistory CDS responses all held unchanged, it is
	// when the oldest of them arrived.
	At time.Time
	// Endpoints counts a CLA's endpoints over every locality.
	Endpoints int
}

// cdsHistory is how many of its last CDS responses a client remembers, to
// tell when a cluster that did not change since arrived.
const cdsHistory = 4

type cdsEntry struct {
	set *clusterSet
	at  int64 // unix nanoseconds
}

type endpointRec struct {
	version   string
	at        int64
	endpoints uint32
}

// Client is one simulated proxy.
type Client struct {
	f     *Fleet
	index int

	// life serializes Connect and Disconnect.
	life   sync.Mutex
	cancel context.CancelFunc
	done   chan struct{} // closed when the client's goroutine returns

	// received: the current stream has delivered a response. Only the
	// client's goroutine uses it.
	received bool

	mu        sync.Mutex
	cds       *clusterSet // nil before the stream's first CDS response
	cdsLog    [cdsHistory]cdsEntry
	cdsN      int // CDS responses applied on this stream; the newest is cdsLog[(cdsN-1)%cdsHistory]
	endpoints map[name]endpointRec
	watched   []string // EDS names subscribed on the current stream, sorted; shared, never modified
	full      bool     // the client has held every required cluster (sticky)
	served    bool     // the stream delivered CDS and a CLA for every watched name
	open      bool     // a stream is open
}

// Index is the client's number in its fleet.
func (c *Client) Index() int { return c.index }

// NodeID is the client's node id.
func (c *Client) NodeID() string { return c.f.opts.nodeID(c.index) }

// Served reports whether the current stream has delivered CDS and the CLA
// of every EDS cluster the client watches.
func (c *Client) Served() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.served
}

// Clusters lists the cluster names the client holds, sorted.
func (c *Client) Clusters() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, c.cds.len())
	for i := range out {
		out[i] = c.cds.names[i].Value()
	}
	return out
}

// Resource returns what the client holds of a cluster
// (resourcev3.ClusterType) or CLA (resourcev3.EndpointType).
func (c *Client) Resource(typeURL, resourceName string) (Resource, bool) {
	n := unique.Make(resourceName)
	c.mu.Lock()
	defer c.mu.Unlock()
	switch typeURL {
	case resourcev3.ClusterType:
		return c.clusterLocked(n)
	case resourcev3.EndpointType:
		if r, ok := c.endpoints[n]; ok {
			return Resource{Version: r.version, At: time.Unix(0, r.at), Endpoints: int(r.endpoints)}, true
		}
	}
	return Resource{}, false
}

// clusterLocked returns what the client holds of cluster n. It arrived
// with the oldest of the remembered CDS responses since which it has not
// changed.
func (c *Client) clusterLocked(n name) (Resource, bool) {
	i := c.cds.lookup(n)
	if i < 0 {
		return Resource{}, false
	}
	version, eds := c.cds.version[i], c.cds.eds[i]
	at := c.cdsLog[(c.cdsN-1)%cdsHistory].at
	for k := 2; k <= min(c.cdsN, cdsHistory); k++ {
		e := c.cdsLog[(c.cdsN-k)%cdsHistory]
		j := e.set.lookup(n)
		if j < 0 || e.set.version[j] != version || e.set.eds[j] != eds {
			break
		}
		at = e.at
	}
	return Resource{Version: version, At: time.Unix(0, at)}, true
}

// Connect starts the client: in the background it opens its own gRPC
// connection and ADS stream, and opens them again, after a backoff, when
// they end. It does nothing if the client is started.
func (c *Client) Connect() error {
	c.life.Lock()
	defer c.life.Unlock()
	if c.done != nil {
		return nil
	}
	if c.f.ctx.Err() != nil {
		return c.f.ctx.Err()
	}
	ctx, cancel := context.WithCancel(c.f.ctx)
	c.cancel, c.done = cancel, make(chan struct{})
	go c.run(ctx, c.done)
	return nil
}

// Disconnect ends the client's stream and closes its connection, and
// returns once its goroutine has. What it holds is kept until the next
// stream starts.
func (c *Client) Disconnect() {
	c.life.Lock()
	defer c.life.Unlock()
	if c.done == nil {
		return
	}
	c.cancel()
	<-c.done
	c.cancel, c.done = nil, nil
}

// Reconnect closes the client's connection and opens a new one, as a
// restarted proxy does.
func (c *Client) Reconnect() error {
	c.Disconnect()
	return c.Connect()
}

// run keeps one ADS stream open until ctx ends: when one ends, or cannot
// be opened, it waits out Envoy's backoff and makes another attempt.
func (c *Client) run(ctx context.Context, done chan struct{}) {
	defer close(done)
	var b backoff
	for {
		err := c.attempt(ctx)
		c.endStream()
		if ctx.Err() != nil {
			return
		}
		c.f.streamEnded(err)
		if c.received {
			b.reset()
		}
		timer := time.NewTimer(b.wait(c.f.jitter))
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
	}
}

// attempt opens a connection and a stream on it, and runs the stream
// until it ends. The connection is the client's own and lives as long as
// the stream: an Envoy opens one per attempt.
func (c *Client) attempt(ctx context.Context) error {
	c.received = false
	conn, err := grpc.NewClient("passthrough:///"+c.f.opts.Addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDisableServiceConfig(),
		// A smaller read buffer than gRPC's 32 KiB: it only batches
		// syscalls, and 10,000 clients pay for it 10,000 times. (The
		// write buffer is shared between writes by default.)
		grpc.WithReadBufferSize(16<<10),
		grpc.WithInitialWindowSize(envoyWindow),
		grpc.WithInitialConnWindowSize(envoyWindow),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(256<<20), grpc.ForceCodecV2(responseCodec{})),
	)
	if err != nil {
		return fmt.Errorf("xdsload: client %d: %w", c.index, err)
	}
	defer conn.Close()
	ads := discoveryv3.NewAggregatedDiscoveryServiceClient(conn)
	if c.f.opts.protocolOf(c.index) == Delta {
		return c.delta(ctx, ads)
	}
	return c.sotw(ctx, ads)
}

// beginStream forgets what the last stream delivered: a new stream starts
// from nothing, as a restarted proxy's does.
func (c *Client) beginStream() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cds, c.cdsLog, c.cdsN = nil, [cdsHistory]cdsEntry{}, 0
	clear(c.endpoints)
	c.watched = nil
	c.open = true
	c.f.connected.Add(1)
}

func (c *Client) endStream() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.open {
		c.open = false
		c.f.connected.Add(-1)
	}
	c.setServed(false)
}

func (c *Client) setServed(v bool) {
	if c.served == v {
		return
	}
	c.served = v
	if v {
		c.f.served.Add(1)
	} else {
		c.f.served.Add(-1)
	}
}

// clusterUpdate is one cluster of a response, decoded.
type clusterUpdate struct {
	name name
	eds  name
}

// decodeClusters decodes and validates a response's clusters as Envoy
// does before it applies any; an error is a reason to NACK.
func decodeClusters(anys []*anypb.Any) ([]clusterUpdate, error) {
	out := make([]clusterUpdate, 0, len(anys))
	seen := make(map[string]struct{}, len(anys))
	var cl clusterv3.Cluster
	for _, a := range anys {
		if a.GetTypeUrl() != resourcev3.ClusterType {
			return nil, fmt.Errorf("resource of type %q in a CDS response", a.GetTypeUrl())
		}
		proto.Reset(&cl)
		if err := proto.Unmarshal(a.GetValue(), &cl); err != nil {
			return nil, fmt.Errorf("cluster: %w", err)
		}
		if err := cl.Validate(); err != nil {
			return nil, fmt.Errorf("cluster %q: %w", cl.GetName(), err)
		}
		if cl.GetName() == "" {
			return nil, fmt.Errorf("cluster without a name")
		}
		if _, dup := seen[cl.GetName()]; dup {
			return nil, fmt.Errorf("cluster %q twice in one response", cl.GetName())
		}
		seen[cl.GetName()] = struct{}{}
		u := clusterUpdate{name: unique.Make(cl.GetName())}
		if cl.GetType() == clusterv3.Cluster_EDS {
			eds := cl.GetEdsClusterConfig().GetServiceName()
			if eds == "" {
				eds = cl.GetName()
			}
			u.eds = unique.Make(eds)
		}
		out = append(out, u)
	}
	return out, nil
}

// endpointUpdate is one CLA of a response, decoded.
type endpointUpdate struct {
	name      name
	endpoints uint32
}

// decodeEndpoints decodes and validates a response's CLAs as Envoy does;
// an error is a reason to NACK. A CLA that many clients receive is
// decoded once (see sets.cla).
func (c *Client) decodeEndpoints(anys []*anypb.Any) ([]endpointUpdate, error) {
	out := make([]endpointUpdate, 0, len(anys))
	for _, a := range anys {
		if a.GetTypeUrl() != resourcev3.EndpointType {
			return nil, fmt.Errorf("resource of type %q in an EDS response", a.GetTypeUrl())
		}
		u, err := c.f.sets.cla(a.GetValue())
		if err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	return out, nil
}

func decodeCLA(b []byte) (endpointUpdate, error) {
	var cla endpointv3.ClusterLoadAssignment
	if err := proto.Unmarshal(b, &cla); err != nil {
		return endpointUpdate{}, fmt.Errorf("cluster load assignment: %w", err)
	}
	if err := cla.Validate(); err != nil {
		return endpointUpdate{}, fmt.Errorf("cluster load assignment %q: %w", cla.GetClusterName(), err)
	}
	n := 0
	for _, l := range cla.GetEndpoints() {
		n += len(l.GetLbEndpoints())
	}
	return endpointUpdate{name: unique.Make(cla.GetClusterName()), endpoints: uint32(n)}, nil
}

// nextClusters works out the set a CDS response leads to: SotW (replace)
// replaces the set, Delta adds ups and drops removed. If another client
// has applied (or is applying) the same response to the same set, its
// result is shared, a failure too; otherwise the response is decoded and
// validated, and an error is a reason to NACK.
func (c *Client) nextClusters(replace bool, anys []*anypb.Any, versions func(int) string, removed []string) (*clusterSet, error) {
	c.mu.Lock()
	prev := c.cds
	c.mu.Unlock()
	ss := c.f.sets
	key := ss.responseKey(prev, replace, anys, versions, removed)
	return ss.memo.do(key, func() (*clusterSet, error) {
		ups, err := decodeClusters(anys)
		if err != nil {
			return nil, err
		}
		var es []setEntry
		if !replace && prev != nil {
			gone := make(map[string]bool, len(removed))
			for _, r := range removed {
				gone[r] = true
			}
			for _, e := range prev.entries() {
				if !gone[e.name.Value()] {
					es = append(es, e)
				}
			}
		}
		for i, u := range ups {
			es = append(es, setEntry{name: u.name, eds: u.eds, version: versions(i)})
		}
		return ss.build(sortEntries(es), c.f.required), nil
	})
}

// applyClusters makes s the client's clusters, judges them, and returns
// the EDS names the client now watches, and whether they changed.
func (c *Client) applyClusters(s *clusterSet, at time.Time) (watched []string, changed bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cds = s
	c.cdsLog[c.cdsN%cdsHistory] = cdsEntry{set: s, at: at.UnixNano()}
	c.cdsN++
	c.judgeClustersLocked()

	next := s.watchAll
	if w := c.f.opts.WatchEDS; w != nil {
		next = nil
		for i, n := range s.names {
			if s.eds[i] != (name{}) && w(c.index, n.Value()) {
				next = append(next, s.eds[i].Value())
			}
		}
		slices.Sort(next)
		next = slices.Compact(next)
	}
	if !slices.Equal(next, c.watched) {
		c.watched = next
		changed = true
		// Forget the CLAs of clusters no longer watched.
		maps.DeleteFunc(c.endpoints, func(n name, _ endpointRec) bool {
			_, ok := slices.BinarySearch(next, n.Value())
			return !ok
		})
	}
	c.updateServedLocked()
	return c.watched, changed
}

// judgeClustersLocked records a problem if a client that has been fully
// served now lacks clusters: an Envoy would accept such a response and
// drop the clusters' endpoints.
func (c *Client) judgeClustersLocked() {
	s := c.cds
	if len(c.f.required) == 0 {
		if s.len() > 0 {
			c.full = true
		} else if c.full {
			c.f.problem(c.index, ProblemEmptyCDS, "no clusters after having held some")
		}
		return
	}
	switch {
	case s.missing == 0:
		c.full = true
	case !c.full:
	case s.len() == 0:
		c.f.problem(c.index, ProblemEmptyCDS, fmt.Sprintf("no clusters after having held all %d required ones", len(c.f.required)))
	default:
		c.f.problem(c.index, ProblemPartialCDS, fmt.Sprintf("lacks %d of %d required clusters, e.g. %s", s.missing, len(c.f.required), s.firstMissing.Value()))
	}
}

// applyEndpoints applies an EDS response. CLAs the client did not ask
// for are ignored, as Envoy ignores them.
func (c *Client) applyEndpoints(ups []endpointUpdate, versions func(int) string, removed []string, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range removed {
		n := unique.Make(r)
		if _, ok := c.endpoints[n]; ok && c.full && c.requiredCLALocked(n) {
			c.f.problem(c.index, ProblemEmptyCLA, fmt.Sprintf("CLA %s removed while its cluster is required", r))
		}
		delete(c.endpoints, n)
	}
	for i, u := range ups {
		if _, ok := slices.BinarySearch(c.watched, u.name.Value()); !ok {
			continue
		}
		if u.endpoints == 0 && c.full && c.requiredCLALocked(u.name) {
			c.f.problem(c.index, ProblemEmptyCLA, fmt.Sprintf("CLA %s has no endpoints while its cluster is required", u.name.Value()))
		}
		c.endpoints[u.name] = endpointRec{version: versions(i), at: at.UnixNano(), endpoints: u.endpoints}
	}
	c.updateServedLocked()
}

// requiredCLALocked reports whether CLA n belongs to a required cluster.
func (c *Client) requiredCLALocked(n name) bool {
	if c.cds == nil {
		return false
	}
	_, ok := c.cds.requiredCLA[n]
	return ok
}

func (c *Client) updateServedLocked() {
	ok := c.cds != nil
	for _, n := range c.watched {
		if !ok {
			break
		}
		_, ok = c.endpoints[unique.Make(n)]
	}
	c.setServed(ok)
}

// nack counts a rejected response and returns the error detail to send.
func (c *Client) nack(err error) *status.Status {
	c.f.nacks.Add(1)
	c.f.problem(c.index, ProblemNACK, err.Error())
	return &status.Status{Code: int32(codes.InvalidArgument), Message: err.Error()}
}

func errUnasked(typeURL string) error {
	return fmt.Errorf("response of type %q, which the client never asked for", typeURL)
}
