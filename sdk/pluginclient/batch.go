package pluginclient

import "github.com/estuary-mesh/estuary/sdk/internal/stream"

// The types a Watch stream yields. They are defined with the decoder that
// builds them (an internal package, shared with sdk/sdktest) and named here,
// where a host can import them.

// Batch is one Watch response, validated and decoded: Sequence, the
// Snapshot and SnapshotDone flags, and Events in order. The protocol
// promises that a batch applies atomically.
type Batch = stream.Batch

// Event is one change to one instance. Kind says which of its fields
// (Properties, Service, Hostname, Endpoints, Gateways, Health) carry it.
type Event = stream.Event

// Kind is the kind of an Event.
type Kind = stream.Kind

// The kinds of events.
const (
	KindInstanceAdded     = stream.KindInstanceAdded
	KindInstanceRemoved   = stream.KindInstanceRemoved
	KindServiceUpserted   = stream.KindServiceUpserted
	KindServiceDeleted    = stream.KindServiceDeleted
	KindEndpointsReplaced = stream.KindEndpointsReplaced
	KindGatewaysReplaced  = stream.KindGatewaysReplaced
	KindInstanceSynced    = stream.KindInstanceSynced
	KindInstanceHealth    = stream.KindInstanceHealth
)

// NumKinds bounds the kinds, so callers can count events in an array.
const NumKinds = stream.NumKinds

// Endpoint is one address serving a service, in the compact form a host
// keeps: strings many endpoints share are interned, and endpoints with
// equal labels or target ports share one map (never modify them).
type Endpoint = stream.Endpoint

// EndpointSet is the endpoints of one service in one instance. It is
// immutable once decoded.
type EndpointSet = stream.EndpointSet

// ProtocolError is a Watch response that breaks the protocol. It names the
// batch (Sequence) and, when one event is at fault, the event (Event index,
// Kind, Instance); Event is -1 when the batch as a whole is at fault. Match
// it with errors.As.
type ProtocolError = stream.ProtocolError
