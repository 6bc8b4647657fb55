package backoff

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestNext(t *testing.T) {
	for _, tc := range []struct {
		name   string
		b      Backoff
		delays []time.Duration // the un-jittered delays of attempts 0, 1, 2, ...
	}{
		{"doubles to the cap", Backoff{Base: 250 * time.Millisecond, Max: 2 * time.Second},
			[]time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 2 * time.Second}},
		{"cap between two doublings", Backoff{Base: time.Second, Max: 3 * time.Second, Jitter: 0.2},
			[]time.Duration{time.Second, 2 * time.Second, 3 * time.Second, 3 * time.Second}},
		{"base above the cap", Backoff{Base: time.Minute, Max: time.Second, Jitter: 0.5},
			[]time.Duration{time.Second, time.Second}},
		{"full jitter", Backoff{Base: time.Second, Max: 30 * time.Second, Jitter: 1},
			[]time.Duration{time.Second, 2 * time.Second, 4 * time.Second}},
		{"jitter above 1 is 1", Backoff{Base: time.Second, Max: 30 * time.Second, Jitter: 7},
			[]time.Duration{time.Second, 2 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for range 50 { // several draws of the jitter
				b := tc.b
				j := min(tc.b.Jitter, 1)
				for i, want := range tc.delays {
					got := b.Next()
					lo := time.Duration(float64(want) * (1 - j))
					hi := time.Duration(float64(want) * (1 + j))
					if got < lo || got > hi {
						t.Fatalf("attempt %d: delay %v outside [%v, %v]", i, got, lo, hi)
					}
				}
			}
		})
	}
}

func TestNextNeverOverflows(t *testing.T) {
	b := Backoff{Base: time.Hour, Max: 48 * time.Hour, Jitter: 0.1}
	for i := range 200 {
		if d := b.Next(); d <= 0 || d > time.Duration(float64(b.Max)*1.1) {
			t.Fatalf("attempt %d: delay %v", i, d)
		}
	}
}

func TestReset(t *testing.T) {
	b := Backoff{Base: 100 * time.Millisecond, Max: 10 * time.Second}
	for range 10 {
		b.Next()
	}
	if d := b.Next(); d != b.Max {
		t.Fatalf("after 10 attempts: %v, want the cap %v", d, b.Max)
	}
	b.Reset()
	if d := b.Next(); d != b.Base {
		t.Fatalf("after Reset: %v, want Base %v", d, b.Base)
	}
}

func TestJitterSpreads(t *testing.T) {
	seen := map[time.Duration]bool{}
	for range 50 {
		b := Backoff{Base: time.Second, Max: time.Minute, Jitter: 0.5}
		seen[b.Next()] = true
	}
	// Watches that failed together must not retry together.
	if len(seen) < 40 {
		t.Errorf("50 draws gave %d distinct delays", len(seen))
	}
}

func TestWait(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	b := Backoff{Base: time.Hour, Max: time.Hour}
	if err := b.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait on an ended context = %v, want context.Canceled", err)
	}
	b = Backoff{Base: time.Nanosecond, Max: time.Nanosecond}
	if err := b.Wait(context.Background()); err != nil {
		t.Fatalf("Wait = %v, want nil", err)
	}
}
