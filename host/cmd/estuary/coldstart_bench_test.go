package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/estuary-mesh/estuary/sdk"
)

// BenchmarkColdStart measures `estuary run` until its replica holds
// 100,000 endpoints from one plugin (1,000 services × 100) and it is ready.
// The plugin is this test binary, run as an external plugin.
func BenchmarkColdStart(b *testing.B) {
	const services, perService = 1000, 100
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	block := fmt.Sprintf(`plugin "bulk" {
  path   = %q
  sha256 = %q
  env    = { ESTUARY_TEST_PLUGIN = "bulk" }
  config {
    services  = %d
    endpoints = %d
  }
}
`, self, sha256File(b, self), services, perService)
	for b.Loop() {
		start := time.Now()
		h := startHost(b, block)
		elapsed := time.Since(start)
		var sync struct {
			Instances []struct {
				Endpoints int `json:"endpoints"`
			} `json:"instances"`
		}
		h.getJSON("/debug/syncz", &sync)
		if len(sync.Instances) != 1 || sync.Instances[0].Endpoints != services*perService {
			b.Fatalf("replica holds %+v, want %d endpoints", sync, services*perService)
		}
		b.ReportMetric(elapsed.Seconds(), "s/cold-start")
		h.signal(15)
		<-h.exited
	}
}

func sha256File(tb testing.TB, path string) string {
	f, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		tb.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// bulkFactory publishes `services` services of `endpoints` endpoints each,
// then reports synced.
func bulkFactory(rt sdk.Runtime) sdk.Plugin { return &bulkPlugin{rt: rt} }

type bulkPlugin struct{ rt sdk.Runtime }

func (p *bulkPlugin) Describe(context.Context, *sdk.DescribeRequest) (*sdk.DescribeResponse, error) {
	return &sdk.DescribeResponse{Name: "bulk", Version: "test", ConfigSchema: &sdk.Schema{Attributes: []sdk.Attribute{
		{Name: "services", Type: "number", Required: true}, {Name: "endpoints", Type: "number", Required: true},
	}}}, nil
}

func (p *bulkPlugin) Configure(_ context.Context, req *sdk.ConfigureRequest) (*sdk.ConfigureResponse, error) {
	var cfg struct{ Services, Endpoints int }
	if err := req.Decode(&cfg); err != nil {
		return nil, err
	}
	id := sdk.InstanceID{Provider: "Bulk", Cluster: "cluster1"}
	st := p.rt.State
	st.SetInstance(id, sdk.InstanceProperties{DefaultNetwork: "network1"})
	labels := map[string]string{"app": "bulk", "version": "v1"}
	for i := range cfg.Services {
		host := "svc" + strconv.Itoa(i) + ".bulk.svc.cluster.local"
		if err := st.UpsertService(id, &sdk.Service{Hostname: host, Namespace: "bulk", Ports: []sdk.Port{{Name: "http", Number: 80, Protocol: "HTTP"}}}); err != nil {
			return nil, err
		}
		eps := make([]sdk.Endpoint, cfg.Endpoints)
		for j := range eps {
			eps[j] = sdk.Endpoint{
				Address: fmt.Sprintf("10.%d.%d.%d", i/256, i%256, j), Labels: labels,
				Locality: sdk.Locality{Region: "r1", Zone: "z1"}, TLSMode: sdk.TLSModeIstio,
				WorkloadName: fmt.Sprintf("bulk-%d-%d", i, j),
			}
		}
		if err := st.SetEndpoints(id, host, eps); err != nil {
			return nil, err
		}
	}
	return &sdk.ConfigureResponse{}, st.MarkSynced(id)
}
