// Package backoff spaces out the retries of a failing watch: delays grow
// exponentially up to a cap, and each is jittered, so that the many
// watches a plugin runs do not retry in step after they failed together
// (an API server restart, a Consul leader election).
//
// It follows gRPC's connection backoff: the exponential delay is capped
// first, then moved by up to ±Jitter of itself.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff yields the delays before successive retries. The zero value is
// not useful; set Base and Max. A Backoff is used by one goroutine.
type Backoff struct {
	// Base is the delay before the first retry.
	Base time.Duration
	// Max caps the exponential delay; a jittered delay may exceed it by at
	// most Jitter×Max.
	Max time.Duration
	// Jitter, between 0 and 1, is how far each delay is moved at random:
	// a delay d becomes a uniform draw from [d×(1-Jitter), d×(1+Jitter)].
	Jitter float64

	attempt int
}

// Next returns the delay before the next retry and counts the attempt.
func (b *Backoff) Next() time.Duration {
	d := b.Base
	// Doubling stops at Max; the loop is bounded because d at least
	// doubles each turn until it passes Max (or overflows to <= 0).
	for i := 0; i < b.attempt && d < b.Max && d > 0; i++ {
		d *= 2
	}
	if d > b.Max || d <= 0 {
		d = b.Max
	}
	b.attempt++
	j := min(max(b.Jitter, 0), 1)
	if j == 0 || d <= 0 {
		return d
	}
	// Uniform in [d(1-j), d(1+j)].
	spread := float64(d) * j
	return time.Duration(float64(d) - spread + rand.Float64()*2*spread)
}

// Reset starts over from Base, after a success.
func (b *Backoff) Reset() { b.attempt = 0 }

// Wait sleeps for the next delay. It returns ctx's error if ctx ends
// first, and nil otherwise.
func (b *Backoff) Wait(ctx context.Context) error {
	t := time.NewTimer(b.Next())
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
