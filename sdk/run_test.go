package sdk

import (
	"context"
	"errors"
	"testing"
)

func TestRunStop(t *testing.T) {
	r := StartRun(context.Background())
	release := make(chan struct{})
	var ended bool
	r.Go(func(ctx context.Context) {
		<-ctx.Done()
		<-release // a watch that is slow to end
		ended = true
	})

	// The caller's deadline bounds the wait.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.Stop(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Stop with an ended context = %v, want context.Canceled", err)
	}
	if r.Context().Err() == nil {
		t.Fatalf("Stop did not cancel the Run's context")
	}

	// A later Stop waits for the same goroutines.
	close(release)
	if err := r.Stop(context.Background()); err != nil {
		t.Fatalf("second Stop = %v", err)
	}
	if !ended {
		t.Fatalf("Stop returned before the goroutine ended")
	}
}

func TestRunEndsWithParent(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	r := StartRun(parent)
	r.Go(func(ctx context.Context) { <-ctx.Done() })
	cancel()
	if err := r.Stop(context.Background()); err != nil {
		t.Fatalf("Stop = %v", err)
	}
}
