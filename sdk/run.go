package sdk

import (
	"context"
	"sync"
)

// Run is the set of goroutines one configuration of a plugin runs: its
// watches. They share a context that Stop cancels; Stop then waits for
// them, but no longer than its own context allows. A plugin that stops its
// old Run from Configure with Configure's context can therefore never hang
// past the host's deadline, however slow a watch is to end; a later call
// can wait for the same Run again.
type Run struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
	done   chan struct{} // closed when every goroutine has ended after Stop
}

// StartRun returns a Run whose context ends with parent (usually
// Runtime.Context) or at Stop.
func StartRun(parent context.Context) *Run {
	ctx, cancel := context.WithCancel(parent)
	return &Run{ctx: ctx, cancel: cancel, done: make(chan struct{})}
}

// Context ends when the Run is stopped or its parent ends.
func (r *Run) Context() context.Context { return r.ctx }

// Go runs f in a goroutine of the Run, with the Run's context.
func (r *Run) Go(f func(ctx context.Context)) {
	r.wg.Go(func() { f(r.ctx) })
}

// Stop cancels the Run's context and waits until all its goroutines have
// returned, or until ctx ends, whichever comes first; then it returns
// ctx's error. Call Go no more once Stop was called.
func (r *Run) Stop(ctx context.Context) error {
	r.cancel()
	r.once.Do(func() {
		go func() {
			r.wg.Wait()
			close(r.done)
		}()
	})
	select {
	case <-r.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
