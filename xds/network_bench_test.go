package xds

import (
	"fmt"
	"testing"
	"time"

	"github.com/estuary-mesh/estuary/host/meshtest"
	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/host/pipeline"
	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
)

// benchWorld spreads each shape over four registry clusters on four
// networks: every other endpoint (counted over the whole mesh) is on
// network1, the client's; the rest rotate over network2..4, each placed by
// a different rule (registry default, from_registry, from_cidr) so the
// generator and the manager do the work real meshes cause. Every endpoint
// has a locality (of three), a weight and TLS mode istio.
func benchWorld(b *testing.B, endpoints, services int) *meshtest.World {
	w := meshtest.New(b)
	defaults := []string{"", "network2", "", ""}
	per := make([]map[string][]*registryv1.Endpoint, 4)
	svcs := make([]*registryv1.Service, services)
	for i := range 4 {
		per[i] = map[string][]*registryv1.Endpoint{}
	}
	k := 0
	for s := range services {
		host := fmt.Sprintf("svc%d.default.svc.cluster.local", s)
		svcs[s] = &registryv1.Service{Hostname: host, Namespace: "default", Ports: []*registryv1.Port{{Name: "grpc", Number: 8080, Protocol: "GRPC"}}}
		for range endpoints {
			inst := 0
			if k%2 == 1 {
				inst = 1 + (k/2)%3
			}
			per[inst][host] = append(per[inst][host], &registryv1.Endpoint{
				Address:  fmt.Sprintf("10.%d.%d.%d", inst+1, (k/250)%250, k%250),
				Locality: []string{"us-east1/us-east1-b", "us-east1/us-east1-c", "us-west1/us-west1-a"}[k%3],
				Weight:   uint32(1 + k%3),
				TlsMode:  registryv1.TLSMode_TLS_MODE_ISTIO,
				Labels:   map[string]string{"app": "svc"},
			})
			k++
		}
	}
	for i := range 4 {
		w.Add(meshtest.Instance{Plugin: fmt.Sprintf("p%d", i+1), Cluster: fmt.Sprintf("c%d", i+1), DefaultNetwork: defaults[i],
			Services: svcs, Endpoints: per[i]})
	}
	return w
}

// Networks: c1 and c3 by from_registry, c2 by its registry default, c4 by
// from_cidr. Three gateways, one into each remote network.
const benchMultiNetwork = `
  network "network1" {
    endpoints { from_registry = "c1" }
  }
  network "network2" {
    gateway {
      address = "192.168.2.1"
      port    = 15443
    }
  }
  network "network3" {
    endpoints { from_registry = "c3" }
    gateway {
      address = "192.168.3.1"
      port    = 15443
    }
  }
  network "network4" {
    endpoints { from_cidr = "10.4.0.0/16" }
    gateway {
      address = "192.168.4.1"
      port    = 15443
    }
  }
`

var benchView = model.View{Kind: model.KindProxyless, Network: "network1", Cluster: "c1"}

// BenchmarkEDSNetworks builds every CLA of a shape from scratch, in fresh
// memory, through the endpoint pipeline and the CLA encoder:
//
//   - mode=single: no networks config (the single-network baseline);
//   - mode=multi: the network manager's networks, 4 networks, 3
//     gateways, half the endpoints remote and replaced by gateways. It
//     also reports single-ns/endpoint, the baseline measured in the same
//     iterations, and x-single, the ratio of the two (target: at most 2);
//   - mode=locality: one network, locality failover on and a client in
//     us-east1/us-east1-b, so the three localities get priorities 0, 1
//     and 2; x-single as in multi mode.
func BenchmarkEDSNetworks(b *testing.B) {
	for _, sh := range edsShapes {
		shape := fmt.Sprintf("endpoints=%d/services=%d", sh.endpoints, sh.services)
		for _, mode := range []string{"single", "multi", "locality"} {
			b.Run("mode="+mode+"/"+shape, func(b *testing.B) {
				w := benchWorld(b, sh.endpoints, sh.services)
				eds := pipeline.New(w.Agg, nil, nil)
				view := benchView
				switch mode {
				case "multi":
					eds = pipeline.New(w.Agg, w.Manager(benchMultiNetwork), nil)
				case "locality":
					eds.SetLocality(pipeline.LocalityPolicy{Enabled: true})
					view.Locality = "us-east1/us-east1-b"
				}
				hosts := make([]string, sh.services)
				names := make([]string, sh.services)
				for i := range hosts {
					hosts[i] = fmt.Sprintf("svc%d.default.svc.cluster.local", i)
					names[i] = model.ClusterName(8080, "", hosts[i])
				}
				// Check the shape once: in multi mode the remote half arrives
				// as gateway endpoints.
				total, viaGateway := 0, 0
				for _, name := range names {
					groups, err := eds.Endpoints(view, name, nil)
					if err != nil {
						b.Fatal(err)
					}
					if last := len(groups) - 1; mode == "locality" && groups[last].Priority != uint32(last) {
						b.Fatalf("%d groups, last priority %d; want one priority per locality", len(groups), groups[last].Priority)
					}
					for _, g := range groups {
						for _, e := range g.Endpoints {
							total++
							if e.Port == 15443 {
								viaGateway++
							}
						}
					}
				}
				if mode != "multi" && (total != sh.endpoints*sh.services || viaGateway != 0) {
					b.Fatalf("%d endpoints (%d gateways), want %d", total, viaGateway, sh.endpoints*sh.services)
				}
				if mode == "multi" && (viaGateway == 0 || total-viaGateway != sh.endpoints*sh.services/2) {
					b.Fatalf("%d endpoints, %d of them gateways; want %d local ones", total, viaGateway, sh.endpoints*sh.services/2)
				}
				var enc claEncoder
				build := func(eds *pipeline.Pipeline) {
					for _, name := range names {
						groups, _ := eds.Endpoints(view, name, nil)
						if len(enc.encode(name, groups)) == 0 {
							b.Fatal("empty CLA")
						}
					}
				}
				// In multi mode every iteration also builds the shape without
				// the filter, untimed, and times it aside: x-single compares
				// the two under the same machine load, which on a shared
				// machine moves more than the difference measured.
				single := pipeline.New(w.Agg, nil, nil)
				var singleTime time.Duration
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					if mode != "single" {
						b.StopTimer()
						start := time.Now()
						build(single)
						singleTime += time.Since(start)
						b.StartTimer()
					}
					build(eds)
				}
				endpoints := float64(b.N * sh.endpoints * sh.services)
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/endpoints, "ns/endpoint")
				if mode != "single" {
					b.ReportMetric(float64(singleTime.Nanoseconds())/endpoints, "single-ns/endpoint")
					b.ReportMetric(float64(b.Elapsed())/float64(singleTime), "x-single")
				}
			})
		}
	}
}
