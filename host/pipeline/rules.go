package pipeline

import (
	"fmt"
	"math"

	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/host/network"
	"github.com/estuary-mesh/estuary/sdk"
)

// Rule is what decided an endpoint's network. Rules apply in this order,
// the first that gives a network wins (this is the order Istio's code
// applies; its API comment claims the opposite):
//
//  1. RuleEndpoint: the endpoint's own network (the topology.istio.io/network
//     label of its pod or WorkloadEntry, or the endpoint's network field);
//  2. RuleRegistryDefault: the registry's default for its cluster (the label
//     on the system namespace, or the plugin's network setting);
//  3. RuleFromRegistry: the network whose from_registry names the
//     endpoint's cluster;
//  4. RuleFromCIDR: the network whose from_cidr contains the endpoint's IP.
//
// Validation refuses a registry in two networks and overlapping ranges
// across networks, so each rule has at most one answer and the result is
// deterministic.
type Rule uint8

// The rules, in precedence order.
const (
	RuleNone Rule = iota
	RuleEndpoint
	RuleRegistryDefault
	RuleFromRegistry
	RuleFromCIDR
)

// Precedence lists the rules that can place an endpoint, first match wins.
func Precedence() []Rule {
	return []Rule{RuleEndpoint, RuleRegistryDefault, RuleFromRegistry, RuleFromCIDR}
}

func (r Rule) String() string {
	switch r {
	case RuleEndpoint:
		return "1: the endpoint's own network"
	case RuleRegistryDefault:
		return "2: the registry's default network"
	case RuleFromRegistry:
		return "3: from_registry"
	case RuleFromCIDR:
		return "4: from_cidr"
	}
	return "none: no rule matched, the network is unknown"
}

// MarshalText makes rules readable in JSON.
func (r Rule) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// UnmarshalText reads what MarshalText wrote.
func (r *Rule) UnmarshalText(b []byte) error {
	for x := RuleNone; x <= RuleFromCIDR; x++ {
		if x.String() == string(b) {
			*r = x
			return nil
		}
	}
	return fmt.Errorf("pipeline: unknown rule %q", b)
}

// placeEndpoint decides which network an endpoint is on: own is its own
// network, def its registry's default for its cluster, cluster its
// registry cluster. It is the only place in the host that decides a
// network.
func placeEndpoint(s *network.Snapshot, own, def, cluster, address string) (string, Rule) {
	if own != "" {
		return own, RuleEndpoint
	}
	if def != "" {
		return def, RuleRegistryDefault
	}
	return placeByConfig(s, cluster, address)
}

// placeByConfig applies rules 3 and 4, which the networks config decides.
func placeByConfig(s *network.Snapshot, cluster, address string) (string, Rule) {
	if n, ok := s.RegistryNetwork(cluster); ok {
		return n, RuleFromRegistry
	}
	if n, ok := s.CIDRNetwork(address); ok {
		return n, RuleFromCIDR
	}
	return "", RuleNone
}

// Decision is what the pipeline did with one endpoint for one view.
type Decision uint8

// Decisions. The first six are a sidecar's or proxyless client's, in a
// multi-network mesh; the router ones are an east-west gateway's.
const (
	KeptLocal         Decision = iota // on the node's network, or either network unknown
	KeptNoGateway                     // its network has no gateway
	Replaced                          // replaced by its network's gateways
	DroppedView                       // outside REQUESTED_NETWORK_VIEW
	DroppedTLS                        // remote and not in Istio mTLS mode
	DroppedPending                    // its network's gateways have no address yet
	KeptOneNetwork                    // multi-network is off: every endpoint is sent as is
	Forwarded                         // an east-west gateway forwards to it
	DroppedRemote                     // an east-west gateway does not forward to another network
	DroppedPlain                      // an east-west gateway forwards only Istio mTLS
	DroppedNoAddress                  // network-only: reachable through its network's gateway only
	DroppedNotHealthy                 // on another network, draining or unhealthy: adds nothing to its gateways
)

func (d Decision) String() string {
	switch d {
	case KeptLocal:
		return "kept: on the node's network"
	case KeptNoGateway:
		return "kept: its network has no gateway"
	case Replaced:
		return "replaced by gateways"
	case DroppedView:
		return "dropped: the node's REQUESTED_NETWORK_VIEW does not include its network"
	case DroppedTLS:
		return "dropped: on another network and not in Istio mTLS mode, which a gateway requires"
	case DroppedPending:
		return "dropped: its network's gateways have no address yet"
	case KeptOneNetwork:
		return "kept: multi-network is off"
	case Forwarded:
		return "kept: the east-west gateway forwards to it"
	case DroppedRemote:
		return "dropped: not on the east-west gateway's network"
	case DroppedPlain:
		return "dropped: not in Istio mTLS mode, which the east-west gateway's SNI passthrough requires"
	case DroppedNoAddress:
		return "dropped: it has no address (a network-only endpoint), so only its network's gateway reaches it, and this node would get it directly"
	case DroppedNotHealthy:
		return "dropped: on another network and draining or unhealthy, so it takes no new requests and adds no weight to its gateways"
	}
	return "unknown"
}

// Sent reports whether the endpoint itself reaches the node.
func (d Decision) Sent() bool {
	return d == KeptLocal || d == KeptNoGateway || d == KeptOneNetwork || d == Forwarded
}

// MarshalText makes decisions readable in JSON.
func (d Decision) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText reads what MarshalText wrote.
func (d *Decision) UnmarshalText(b []byte) error {
	for x := KeptLocal; x <= DroppedNotHealthy; x++ {
		if x.String() == string(b) {
			*d = x
			return nil
		}
	}
	return fmt.Errorf("pipeline: unknown decision %q", b)
}

// routerDecision is the east-west gateway's rule, beside the network
// rules it depends on: a gateway (KindRouter) forwards, by SNI and
// without terminating TLS, to an endpoint its view sees, on its own
// network (or of unknown network, or when it has none), in Istio mTLS
// mode; the client's mTLS runs end to end through it, so a plain-text
// endpoint cannot be reached this way. Weights are left as they are.
func routerDecision(v model.View, network, address string, tls sdk.TLSMode) Decision {
	switch {
	case !v.Sees(network):
		return DroppedView
	case network != "" && v.Network != "" && network != v.Network:
		return DroppedRemote
	case tls != sdk.TLSModeIstio:
		return DroppedPlain
	case address == "":
		return DroppedNoAddress
	}
	return Forwarded
}

// scaleWeight applies the scale factor: unset becomes the factor itself,
// anything else is multiplied and clipped at the uint32 maximum.
func scaleWeight(w, factor uint32) uint32 {
	if w == 0 {
		return factor
	}
	return uint32(min(uint64(w)*uint64(factor), math.MaxUint32))
}
