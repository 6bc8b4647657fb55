package xdsload

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
	"unique"
)

// ProblemKind classifies what a client found wrong.
type ProblemKind string

// Kinds of problems.
const (
	// ProblemNACK: a response Envoy would reject (undecodable, invalid,
	// of the wrong type, or naming a resource twice). The client NACKs it.
	ProblemNACK ProblemKind = "nack"
	// ProblemEmptyCDS: no clusters at all after having been fully served.
	ProblemEmptyCDS ProblemKind = "empty-cds"
	// ProblemPartialCDS: some required clusters missing after having held
	// them all.
	ProblemPartialCDS ProblemKind = "partial-cds"
	// ProblemEmptyCLA: a required cluster's CLA empty or removed after the
	// client was fully served.
	ProblemEmptyCLA ProblemKind = "empty-cla"
)

// Problem is one thing a client found wrong.
type Problem struct {
	Client int
	Kind   ProblemKind
	Detail string
	At     time.Time
}

func (p Problem) String() string {
	return fmt.Sprintf("%s client %d: %s: %s", p.At.Format(time.TimeOnly), p.Client, p.Kind, p.Detail)
}

// Stats are a fleet's counters.
type Stats struct {
	Clients int
	// Connected clients have a stream open; Served ones have received, on
	// that stream, CDS and every CLA they watch.
	Connected, Served int
	// Streams opened, and StreamErrors: streams the server ended (or
	// failed to open) without the client asking.
	Streams, StreamErrors uint64
	// Responses received; ACKs and NACKs sent.
	Responses, ACKs, NACKs uint64
	// Problems found, of every kind.
	Problems uint64
	// LastStreamError is the most recent stream error, if any.
	LastStreamError string
}

// Fleet is a set of clients against one server.
type Fleet struct {
	opts     Options
	ctx      context.Context
	cancel   context.CancelFunc
	clients  []*Client
	required map[name]struct{}
	sets     *sets

	connected, served                     atomic.Int64
	streams, streamErrors                 atomic.Uint64
	responses, acks, nacks, problemsCount atomic.Uint64

	mu         sync.Mutex
	problems   []Problem
	lastStream string
}

// Start builds a fleet and connects every client in the background. The
// clients run until ctx ends or Close is called.
func Start(ctx context.Context, opts Options) (*Fleet, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	f := &Fleet{opts: opts, required: make(map[name]struct{}, len(opts.Required)), sets: newSets()}
	f.ctx, f.cancel = context.WithCancel(ctx)
	for _, r := range opts.Required {
		f.required[unique.Make(r)] = struct{}{}
	}
	f.clients = make([]*Client, opts.Clients)
	for i := range f.clients {
		f.clients[i] = &Client{f: f, index: i, endpoints: map[name]endpointRec{}}
	}
	for _, c := range f.clients {
		if err := c.Connect(); err != nil {
			f.Close()
			return nil, err
		}
	}
	return f, nil
}

// Clients returns the fleet's clients, by index.
func (f *Fleet) Clients() []*Client { return f.clients }

// Close disconnects every client and waits for their goroutines.
func (f *Fleet) Close() {
	f.cancel()
	var wg sync.WaitGroup
	for _, c := range f.clients {
		wg.Go(c.Disconnect)
	}
	wg.Wait()
}

// Stats returns the fleet's counters.
func (f *Fleet) Stats() Stats {
	f.mu.Lock()
	last := f.lastStream
	f.mu.Unlock()
	return Stats{
		Clients:         len(f.clients),
		Connected:       int(f.connected.Load()),
		Served:          int(f.served.Load()),
		Streams:         f.streams.Load(),
		StreamErrors:    f.streamErrors.Load(),
		Responses:       f.responses.Load(),
		ACKs:            f.acks.Load(),
		NACKs:           f.nacks.Load(),
		Problems:        f.problemsCount.Load(),
		LastStreamError: last,
	}
}

// Problems returns the first problems found (up to Options.MaxProblems);
// Stats counts all of them.
func (f *Fleet) Problems() []Problem {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Problem(nil), f.problems...)
}

// pollEvery is how often Wait looks at the clients.
const pollEvery = 20 * time.Millisecond

// Wait returns once ok holds for every client, or an error saying how
// many it did not hold for when ctx ends.
func (f *Fleet) Wait(ctx context.Context, ok func(*Client) bool) error {
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		pending, first := 0, -1
		for _, c := range f.clients {
			if !ok(c) {
				if pending == 0 {
					first = c.index
				}
				pending++
			}
		}
		if pending == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("xdsload: %d of %d clients not there yet (first: client %d): %w", pending, len(f.clients), first, ctx.Err())
		case <-tick.C:
		}
	}
}

// WaitServed waits until every client is Served.
func (f *Fleet) WaitServed(ctx context.Context) error {
	return f.Wait(ctx, (*Client).Served)
}

func (f *Fleet) problem(client int, kind ProblemKind, detail string) {
	f.problemsCount.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.problems) < f.opts.MaxProblems {
		f.problems = append(f.problems, Problem{Client: client, Kind: kind, Detail: detail, At: time.Now()})
	}
}

func (f *Fleet) streamEnded(err error) {
	f.streamErrors.Add(1)
	if err == nil {
		return
	}
	f.mu.Lock()
	f.lastStream = err.Error()
	f.mu.Unlock()
}

// jitter returns a random duration in [0, n).
func (f *Fleet) jitter(n int64) int64 {
	if n <= 0 {
		return 0
	}
	return rand.Int64N(n)
}
