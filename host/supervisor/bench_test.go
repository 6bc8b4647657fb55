package supervisor

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"

	"github.com/estuary-mesh/estuary/host/config"
	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/host/replica"
	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/pluginclient"
)

const (
	benchBatchSize = 1000
	benchBatches   = 1000 // one million endpoints per op
)

// BenchmarkBoundaryThroughput measures endpoint updates applied into the
// host's replica per second, in batches of 1,000 endpoints, across a real
// process boundary (go-plugin, AutoMTLS, Unix socket) and through an
// in-process gRPC connection. Each op streams 1,000 batches into 1,000
// distinct services, so nothing can be coalesced; the clock runs from the
// first applied batch to the last, leaving out process start.
func BenchmarkBoundaryThroughput(b *testing.B) {
	body := fmt.Sprintf("batches = %d\nsize = %d\nservices = %d\n", benchBatches, benchBatchSize, benchBatches)
	b.Run("process", func(b *testing.B) {
		p := selfPlugin(b, "bench", "bench", body)
		var total time.Duration
		for b.Loop() {
			store := replica.NewStore(nil)
			clock := newApplyClock(store, benchBatches*benchBatchSize)
			sup := NewSupervisor(Options{}, hclog.NewNullLogger(), store, nil)
			stop := run(b, sup)
			if diags := sup.Apply(&config.File{Plugins: []*config.Plugin{p}}); diags.HasErrors() {
				b.Fatal(diags)
			}
			total += clock.wait(b)
			stop()
		}
		reportThroughput(b, total)
	})
	b.Run("in-process", func(b *testing.B) {
		var total time.Duration
		for b.Loop() {
			store := replica.NewStore(nil)
			clock := newApplyClock(store, benchBatches*benchBatchSize)
			ctx, cancel := context.WithCancel(context.Background())
			rc, _, err := sdk.ServeTest(ctx, benchFactory, nil)
			if err != nil {
				b.Fatal(err)
			}
			client := goplugin.NewClient(&goplugin.ClientConfig{
				HandshakeConfig:  sdk.Handshake,
				Plugins:          pluginclient.PluginSet(),
				Reattach:         rc,
				AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
				Logger:           hclog.NewNullLogger(),
				GRPCDialOptions:  sdk.ClientDialOptions(),
			})
			cp, err := client.Client()
			if err != nil {
				b.Fatal(err)
			}
			raw, err := cp.Dispense(sdk.PluginName)
			if err != nil {
				b.Fatal(err)
			}
			pc := raw.(*pluginclient.Client)
			cfg := fmt.Sprintf(`{"batches": %d, "size": %d, "services": %d}`, benchBatches, benchBatchSize, benchBatches)
			if _, err := pc.Configure(ctx, &pluginclient.ConfigureRequest{ConfigJSON: []byte(cfg)}); err != nil {
				b.Fatal(err)
			}
			stream, err := pc.Watch(ctx, &pluginclient.WatchRequest{})
			if err != nil {
				b.Fatal(err)
			}
			sess := store.NewSession("bench")
			go func() {
				for {
					batch, err := stream.Recv()
					var perr *pluginclient.ProtocolError
					if errors.As(err, &perr) {
						panic(err)
					}
					if err != nil {
						return
					}
					sess.ApplyBatch(batch)
				}
			}()
			total += clock.wait(b)
			cancel()
			client.Kill()
		}
		reportThroughput(b, total)
	})
}

// applyClock times a store from its first applied endpoint set until it
// has applied want endpoints.
type applyClock struct {
	mu          sync.Mutex
	first, last time.Time
	done        chan struct{}
}

func newApplyClock(store *replica.Store, want uint64) *applyClock {
	c := &applyClock{done: make(chan struct{})}
	store.Subscribe(func(model.Change) {
		n := store.EndpointUpdates()
		c.mu.Lock()
		defer c.mu.Unlock()
		if n > 0 && c.first.IsZero() {
			c.first = time.Now()
		}
		if n >= want && c.last.IsZero() {
			c.last = time.Now()
			close(c.done)
		}
	})
	return c
}

func (c *applyClock) wait(b *testing.B) time.Duration {
	select {
	case <-c.done:
	case <-time.After(2 * time.Minute):
		b.Fatal("the replica never received every endpoint")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last.Sub(c.first)
}

func reportThroughput(b *testing.B, total time.Duration) {
	// The first batch starts the clock, so it is not counted.
	n := float64(b.N) * float64(benchBatches-1) * benchBatchSize
	b.ReportMetric(n/total.Seconds(), "endpoints/s")
	b.ReportMetric(float64(total.Nanoseconds())/n, "ns/endpoint")
}
