// Package stream validates and decodes the registry protocol's Watch stream.
// It is the one place that decides what a plugin may send: the typed plugin
// client (sdk/pluginclient) runs it for the host, and sdk/sdktest runs it for
// the conformance suite, so the host and a plugin's own tests can never
// disagree about a stream.
//
// A [Decoder] follows one stream. It checks a whole response before it
// returns any of it, so a caller applies a batch completely or not at all,
// and it decodes endpoints into the compact form the host's replica keeps:
// strings many endpoints share are interned and shared label and port maps
// stay shared.
package stream

import (
	"fmt"

	"github.com/estuary-mesh/estuary/sdk"
)

// Kind is the kind of an event.
type Kind uint8

const (
	KindInstanceAdded Kind = iota + 1
	KindInstanceRemoved
	KindServiceUpserted
	KindServiceDeleted
	KindEndpointsReplaced
	KindGatewaysReplaced
	KindInstanceSynced
	KindInstanceHealth
)

// NumKinds bounds the kinds: every Kind is below it, so callers can count
// events in an array.
const NumKinds = int(KindInstanceHealth) + 1

var kindNames = [NumKinds]string{
	KindInstanceAdded:     "instance_added",
	KindInstanceRemoved:   "instance_removed",
	KindServiceUpserted:   "service_upserted",
	KindServiceDeleted:    "service_deleted",
	KindEndpointsReplaced: "endpoints_replaced",
	KindGatewaysReplaced:  "gateways_replaced",
	KindInstanceSynced:    "instance_synced",
	KindInstanceHealth:    "instance_health",
}

// String names the kind as the proto's Event.kind field does.
func (k Kind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Batch is one Watch response, validated and decoded. The protocol promises
// that a batch applies atomically.
type Batch struct {
	// Sequence numbers batches on one stream: 1, 2, 3, ...
	Sequence uint64
	// Snapshot is set on every batch of the stream's initial snapshot.
	Snapshot bool
	// SnapshotDone is set on the snapshot's last batch. After it the host
	// drops what the snapshot did not mention.
	SnapshotDone bool
	// InstanceSetComplete says every instance the plugin will report is
	// declared; it applies after Events. At most one batch of a stream
	// carries it. For a plugin without CapabilityInstanceSet the decoder
	// sets it on the SnapshotDone batch, so a host has one rule for both.
	InstanceSetComplete bool
	// PluginHealth, if not nil, is the plugin's connection to the source
	// that lists its instances; it applies after Events.
	PluginHealth *sdk.InstanceHealth
	// Events in order.
	Events []Event
}

// Event is one change to one instance. Kind says which of the other fields
// carry it; the rest are zero.
type Event struct {
	Kind     Kind
	Instance sdk.InstanceID
	// Properties of an InstanceAdded event.
	Properties sdk.InstanceProperties
	// Service of a ServiceUpserted event; its Hostname is never empty.
	Service *sdk.Service
	// Hostname of a ServiceDeleted or EndpointsReplaced event.
	Hostname string
	// Endpoints of an EndpointsReplaced event; never nil there.
	Endpoints *EndpointSet
	// Gateways of a GatewaysReplaced event.
	Gateways []sdk.NetworkGateway
	// Health of an InstanceHealth event.
	Health *sdk.InstanceHealth
}

// Endpoint is one address serving a service, in the compact form a host
// keeps by the million: a flat value of about a hundred bytes whose strings
// and maps are shared with the other endpoints that carry the same values.
type Endpoint struct {
	Address string `json:"address"`
	// Additional holds the workload's other IPs (dual stack), nil for the
	// many endpoints that have none: a pointer costs every endpoint 8
	// bytes where a slice would cost 24. Read it with AdditionalAddresses.
	Additional *[]string `json:"additional_addresses,omitempty"`
	// Labels is shared between endpoints with equal labels: never modify it.
	Labels map[string]string `json:"labels,omitempty"`
	// TargetPorts is shared like Labels: never modify it.
	TargetPorts map[string]uint32 `json:"target_ports,omitempty"`
	// Network is the endpoint's own network ("" if it has none).
	Network string `json:"network,omitempty"`
	// Locality is "region/zone/subzone".
	Locality       string      `json:"locality,omitempty"`
	ServiceAccount string      `json:"service_account,omitempty"`
	WorkloadName   string      `json:"workload_name,omitempty"`
	Weight         uint32      `json:"weight"`
	TLSMode        sdk.TLSMode `json:"tls_mode"`
	Health         sdk.Health  `json:"health"`
}

// AdditionalAddresses returns the endpoint's other IPs, or nil.
func (e *Endpoint) AdditionalAddresses() []string {
	if e.Additional == nil {
		return nil
	}
	return *e.Additional
}

// TargetPort returns the port the endpoint serves service port p on.
func (e *Endpoint) TargetPort(p sdk.Port) uint32 {
	if tp, ok := e.TargetPorts[p.Name]; ok {
		return tp
	}
	return p.Number
}

// EndpointSet is the endpoints one instance reports for one service. It is
// immutable once decoded, so readers share it without locks.
type EndpointSet struct {
	Endpoints []Endpoint
}

// Len returns the number of endpoints; a nil set has none.
func (s *EndpointSet) Len() int {
	if s == nil {
		return 0
	}
	return len(s.Endpoints)
}
