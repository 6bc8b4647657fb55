package plugin

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/estuary-mesh/estuary/host/config"
	"github.com/estuary-mesh/estuary/host/registry"
	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
	"github.com/estuary-mesh/estuary/sdk"
)

const (
	benchBatchSize = 1000
	benchServices  = 100
)

// BenchmarkBoundaryThroughput measures endpoint updates per second applied
// into the host's replica, in batches of 1,000 endpoints: across a real
// process boundary (go-plugin, AutoMTLS, Unix socket) and through an
// in-process gRPC connection. One op is one batch.
func BenchmarkBoundaryThroughput(b *testing.B) {
	b.Run("process", func(b *testing.B) {
		store := registry.NewStore(nil)
		done := waitFor(store, "done.bench")
		sup := NewSupervisor(context.Background(), Options{}, hclog.NewNullLogger(), store, nil)
		body := fmt.Sprintf("batches = %d\nsize = %d\nservices = %d\n", b.N, benchBatchSize, benchServices)
		p := selfPlugin(b, "bench", "bench", body)
		b.ResetTimer()
		start := time.Now()
		if diags := sup.Apply(&config.File{Plugins: []*config.Plugin{p}}); diags.HasErrors() {
			b.Fatal(diags)
		}
		<-done
		reportThroughput(b, store, start)
		b.StopTimer()
		sup.Stop()
	})
	b.Run("in-process", func(b *testing.B) {
		store := registry.NewStore(nil)
		done := waitFor(store, "done.bench")
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		rc, _, err := sdk.ServeTest(ctx, benchFactory, nil)
		if err != nil {
			b.Fatal(err)
		}
		client := goplugin.NewClient(&goplugin.ClientConfig{
			HandshakeConfig:  sdk.Handshake,
			Plugins:          goplugin.PluginSet{sdk.PluginName: &sdk.GRPCPlugin{}},
			Reattach:         rc,
			AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
			Logger:           hclog.NewNullLogger(),
			GRPCDialOptions:  []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(sdk.MaxMessageBytes))},
		})
		defer client.Kill()
		cp, err := client.Client()
		if err != nil {
			b.Fatal(err)
		}
		raw, err := cp.Dispense(sdk.PluginName)
		if err != nil {
			b.Fatal(err)
		}
		rpc := raw.(registryv1.RegistryClient)
		b.ResetTimer()
		start := time.Now()
		cfg := fmt.Sprintf(`{"batches": %d, "size": %d, "services": %d}`, b.N, benchBatchSize, benchServices)
		if _, err := rpc.Configure(ctx, &registryv1.ConfigureRequest{ConfigJson: []byte(cfg)}); err != nil {
			b.Fatal(err)
		}
		stream, err := rpc.Watch(ctx, &registryv1.WatchRequest{})
		if err != nil {
			b.Fatal(err)
		}
		sess := store.NewSession("bench")
		go func() {
			for {
				resp, err := stream.Recv()
				if err != nil {
					return
				}
				if err := sess.Apply(resp); err != nil {
					panic(err)
				}
			}
		}()
		<-done
		reportThroughput(b, store, start)
	})
}

// waitFor returns a channel closed once hostname appears in the store.
func waitFor(store *registry.Store, hostname string) <-chan struct{} {
	ch := make(chan struct{})
	closed := false
	store.Subscribe(func(c registry.Change) {
		if _, ok := c.Services[hostname]; ok && !closed {
			closed = true
			close(ch)
		}
	})
	return ch
}

func reportThroughput(b *testing.B, store *registry.Store, start time.Time) {
	elapsed := time.Since(start)
	applied := store.EndpointUpdates()
	b.ReportMetric(float64(applied)/elapsed.Seconds(), "endpoints/s")
	b.ReportMetric(float64(applied)/float64(b.N*benchBatchSize), "applied/sent")
}
