package stream

import (
	"fmt"
	"strings"

	"github.com/estuary-mesh/estuary/sdk"
)

// ProtocolError is a Watch response that breaks the protocol. It names the
// batch and, when one event is at fault, the event: its index in the batch,
// its kind and its instance, so an operator can find it in the plugin's
// own terms.
type ProtocolError struct {
	// Sequence is the offending batch's sequence number as the plugin sent it.
	Sequence uint64
	// Event is the index of the offending event in the batch, or -1 when
	// the batch as a whole is at fault (its sequence or snapshot flags).
	Event int
	// Kind and Instance describe the offending event; zero when Event is -1.
	// Kind is zero too for an event that carries no known kind.
	Kind     Kind
	Instance sdk.InstanceID
	// Reason says what is wrong.
	Reason string
}

func (e *ProtocolError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "protocol error in batch %d", e.Sequence)
	if e.Event >= 0 {
		kind := "event without a kind"
		if e.Kind != 0 {
			kind = e.Kind.String()
		}
		fmt.Fprintf(&b, ", event %d (%s, instance %q)", e.Event, kind, e.Instance.String())
	}
	b.WriteString(": ")
	b.WriteString(e.Reason)
	return b.String()
}
