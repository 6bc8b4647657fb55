// Package xdsload is a fleet of simulated xDS clients for soaks and
// benchmarks against a real control plane on loopback.
//
// Every client is what a proxy looks like to the server: its own gRPC
// connection, one ADS stream (State of the World or Delta) speaking
// go-control-plane's discovery types, an Istio node id and metadata. It
// subscribes to CDS as a wildcard, then to EDS for the EDS clusters it
// received (all of them, or those Options.WatchEDS picks), and ACKs or
// NACKs every response with the version and nonce the protocol asks for.
//
// A client records, per resource, the version it holds and when it arrived,
// so a benchmark can time a change from its write to each client. It also
// judges what it receives: a response that Envoy would reject is NACKed and
// counted, and so is a configuration that would take working endpoints away
// from a proxy (an empty or partial CDS, an empty CLA of a required cluster)
// once the client has been fully served.
//
// Each new stream starts as a restarted proxy does, with no versions, so the
// server must send the whole configuration again, and the first answer must
// already be complete.
//
// 10,000 clients fit in one test process. Clients that hold the same
// clusters share one immutable set, and a CDS response that many clients
// receive is decoded and validated once; a client's own state is little
// more than its gRPC connection and the CLAs it watches.
package xdsload

import (
	"fmt"
	"net"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// Protocol is the ADS variant a client speaks.
type Protocol uint8

const (
	// SotW is State of the World ADS (StreamAggregatedResources).
	SotW Protocol = iota
	// Delta is incremental ADS (DeltaAggregatedResources).
	Delta
	// Mixed gives even-numbered clients SotW and odd-numbered ones Delta.
	Mixed
)

func (p Protocol) String() string {
	switch p {
	case SotW:
		return "sotw"
	case Delta:
		return "delta"
	case Mixed:
		return "mixed"
	}
	return fmt.Sprintf("Protocol(%d)", uint8(p))
}

// Kind is the kind of proxy a client claims to be in its node.
type Kind uint8

const (
	// Sidecar is an Envoy sidecar (user agent "envoy").
	Sidecar Kind = iota
	// Proxyless is a gRPC client with xDS (GENERATOR=grpc, user agent "gRPC Go").
	Proxyless
)

// Options describe a fleet.
type Options struct {
	// Addr is the server's xDS address; it must be a loopback IP and port.
	Addr string
	// Clients is how many clients the fleet runs.
	Clients int
	// Protocol is SotW, Delta or Mixed.
	Protocol Protocol
	// Kind is Sidecar or Proxyless.
	Kind Kind
	// ClusterID and Network go into the node metadata (CLUSTER_ID, NETWORK).
	ClusterID, Network string
	// Namespace of the simulated pods; "default" if empty.
	Namespace string
	// DomainSuffix of the node id; "cluster.local" if empty.
	DomainSuffix string
	// WatchEDS picks, for client i, the EDS clusters it subscribes to. Nil
	// subscribes every client to every EDS cluster it receives.
	WatchEDS func(client int, cluster string) bool
	// Required names clusters that, once a client has held all of them,
	// must stay in its CDS and keep at least one endpoint in their CLAs.
	// Empty: once a client has held any cluster, an empty CDS is a problem.
	Required []string
	// MaxProblems caps how many problems the fleet keeps in detail (it
	// counts all of them); 100 if zero.
	MaxProblems int
}

// A client reconnects as Envoy's ADS client does (GrpcStream in
// envoyproxy/envoy source/extensions/config_subscription/grpc/grpc_stream.h,
// JitteredExponentialBackOffStrategy in source/common/common/backoff_strategy.cc):
// after a stream ends or fails to open, it waits a random time in
// [0, interval), where interval starts at 500 ms and doubles up to 30 s,
// and back to 500 ms once a stream has delivered a response. Each attempt
// is one connection attempt: Envoy's connection pool makes one when the
// stream starts and has no backoff of its own. So the client does not use
// gRPC's channel backoff (1 s, ×1.6, up to 120 s, between attempts it makes
// on its own), which would stretch a storm to what no Envoy would see.
const (
	retryBase = 500 * time.Millisecond
	retryMax  = 30 * time.Second
	// envoyWindow is Envoy's default HTTP/2 stream and connection flow-
	// control window (Http2ProtocolOptions initial_stream_window_size and
	// initial_connection_window_size, 256 MiB), which its gRPC client
	// uses. gRPC's own 64 KiB start would make the server wait for window
	// updates a few times within every large CDS response.
	envoyWindow = 256 << 20
)

// backoff is Envoy's jittered exponential backoff.
type backoff struct{ next time.Duration }

// wait returns how long to wait before the next attempt, given random,
// which returns a number in [0, n).
func (b *backoff) wait(random func(n int64) int64) time.Duration {
	if b.next == 0 {
		b.next = retryBase
	}
	d := time.Duration(random(int64(b.next)))
	b.next = min(2*b.next, retryMax)
	return d
}

// reset starts over at the base interval: a stream delivered a response.
func (b *backoff) reset() { b.next = 0 }

func (o *Options) validate() error {
	host, _, err := net.SplitHostPort(o.Addr)
	if err != nil {
		return fmt.Errorf("xdsload: address %q: %w", o.Addr, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("xdsload: address %q is not a loopback IP", o.Addr)
	}
	if o.Clients < 1 {
		return fmt.Errorf("xdsload: %d clients", o.Clients)
	}
	if o.Protocol > Mixed {
		return fmt.Errorf("xdsload: unknown protocol %v", o.Protocol)
	}
	if o.Namespace == "" {
		o.Namespace = "default"
	}
	if o.DomainSuffix == "" {
		o.DomainSuffix = "cluster.local"
	}
	if o.MaxProblems == 0 {
		o.MaxProblems = 100
	}
	return nil
}

// protocolOf returns the protocol client i speaks.
func (o *Options) protocolOf(i int) Protocol {
	if o.Protocol == Mixed {
		return Protocol(i % 2)
	}
	return o.Protocol
}

// podIP is client i's made-up pod address in 10.0.0.0/8, unique for 16M
// clients. It is never dialled.
func podIP(i int) string {
	return fmt.Sprintf("10.%d.%d.%d", (i>>16)&0xff, (i>>8)&0xff, i&0xff)
}

// nodeID is client i's Istio node id: sidecar~IP~POD.NS~NS.svc.DOMAIN.
func (o *Options) nodeID(i int) string {
	return fmt.Sprintf("sidecar~%s~load-%d.%s~%s.svc.%s", podIP(i), i, o.Namespace, o.Namespace, o.DomainSuffix)
}

// node builds client i's node as an Istio sidecar or proxyless gRPC client
// sends it. It is built for each stream's first request and not kept.
func (o *Options) node(i int) *corev3.Node {
	md := map[string]*structpb.Value{
		"CLUSTER_ID":   structpb.NewStringValue(o.ClusterID),
		"NETWORK":      structpb.NewStringValue(o.Network),
		"NAMESPACE":    structpb.NewStringValue(o.Namespace),
		"INSTANCE_IPS": structpb.NewStringValue(podIP(i)),
		"LABELS": structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			"app": structpb.NewStringValue("load"),
		}}),
	}
	n := &corev3.Node{
		Id:       o.nodeID(i),
		Cluster:  "load." + o.Namespace,
		Metadata: &structpb.Struct{Fields: md},
	}
	switch o.Kind {
	case Proxyless:
		md["GENERATOR"] = structpb.NewStringValue("grpc")
		n.UserAgentName = "gRPC Go"
		n.ClientFeatures = []string{"envoy.lb.does_not_support_overprovisioning", "xds.config.resource-in-sotw"}
	default:
		n.UserAgentName = "envoy"
	}
	return n
}
