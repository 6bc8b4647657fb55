// Package protoconv decodes registry protocol messages for code that holds
// them already: tests, benchmarks and fixtures that build Watch responses by
// hand. It runs the same checks and decoding as the typed plugin client
// (sdk/pluginclient), which is what a host uses to talk to a plugin; plugin
// authors never need it.
package protoconv

import (
	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/internal/stream"
	"github.com/estuary-mesh/estuary/sdk/pluginclient"
)

// Stream decodes the responses of one Watch stream, in order, as
// pluginclient.WatchStream does.
type Stream struct{ d *stream.Decoder }

// NewStream starts a stream from a plugin that declared caps.
func NewStream(caps ...sdk.Capability) *Stream { return &Stream{d: stream.NewDecoder(caps)} }

// Decode checks resp against the protocol and the stream so far and
// returns it whole, or a *pluginclient.ProtocolError and nothing. The first
// error ends the stream: later calls return it again.
func (s *Stream) Decode(resp *registryv1.WatchResponse) (*pluginclient.Batch, error) {
	return s.d.Decode(resp)
}
