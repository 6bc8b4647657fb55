package xdsload

import (
	"context"
	"time"

	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
)

// errorDetailer is a request of either protocol: a NACK has error detail.
type errorDetailer interface{ GetErrorDetail() *status.Status }

// converse runs one ADS stream of either protocol until it ends: it opens
// the stream with open, sends first (which carries the node), and answers
// every response with the ACK or NACK that handle returns. handle may send
// requests of its own before that (subscriptions).
func converse[Req, Resp any](ctx context.Context, c *Client,
	open func(context.Context, ...grpc.CallOption) (grpc.BidiStreamingClient[Req, Resp], error),
	first *Req,
	handle func(st grpc.BidiStreamingClient[Req, Resp], resp *Resp, at time.Time) (*Req, error),
) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Not WaitForReady: if the one connection attempt fails, so does the
	// stream, and the client backs off as Envoy does (see retryBase).
	st, err := open(ctx)
	if err != nil {
		return err
	}
	c.f.streams.Add(1)
	c.beginStream()
	if err := st.Send(first); err != nil {
		return err
	}
	for {
		resp, err := st.Recv()
		if err != nil {
			return err
		}
		at := time.Now()
		c.received = true
		c.f.responses.Add(1)
		reply, err := handle(st, resp, at)
		if err != nil {
			return err
		}
		if any(reply).(errorDetailer).GetErrorDetail() == nil {
			c.f.acks.Add(1)
		}
		if err := st.Send(reply); err != nil {
			return err
		}
	}
}
