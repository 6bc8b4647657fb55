package consul

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/sdktest"
	"github.com/estuary-mesh/estuary/testbed"
)

// peerPair is two independent Consul clusters on loopback, peered
// through the peering API: local (dc1, where the plugin points) knows the
// other as peer "cluster-b"; exporter (dc2) knows local as "cluster-a".
type peerPair struct {
	local, exporter *testbed.Consul
}

func startPeerPair(t *testing.T) peerPair {
	t.Helper()
	p := peerPair{local: startConsul(t, testbed.ConsulPeering("dc1")), exporter: startConsul(t, testbed.ConsulPeering("dc2"))}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	tok, _, err := p.local.Client().Peerings().GenerateToken(ctx, api.PeeringGenerateTokenRequest{PeerName: "cluster-b"}, nil)
	if err != nil {
		t.Fatalf("generate a peering token on dc1: %v", err)
	}
	if _, _, err := p.exporter.Client().Peerings().Establish(ctx, api.PeeringEstablishRequest{PeerName: "cluster-a", PeeringToken: tok.PeeringToken}, nil); err != nil {
		t.Fatalf("establish the peering from dc2: %v", err)
	}
	// Poll until both sides say ACTIVE.
	for _, side := range []struct {
		c    *testbed.Consul
		name string
	}{{p.local, "cluster-b"}, {p.exporter, "cluster-a"}} {
		var last *api.Peering
		for ctx.Err() == nil {
			last, _, err = side.c.Client().Peerings().Read(ctx, side.name, nil)
			if err == nil && last != nil && last.State == api.PeeringStateActive {
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
		if last == nil || last.State != api.PeeringStateActive {
			t.Fatalf("peering %s never became active on %s: %+v (%v)", side.name, side.c.Addr, last, err)
		}
	}
	return p
}

// export makes dc2 export services to its peer cluster-a.
func (p peerPair) export(t *testing.T, services ...string) {
	t.Helper()
	entry := &api.ExportedServicesConfigEntry{Name: "default"}
	for _, s := range services {
		entry.Services = append(entry.Services, api.ExportedService{Name: s, Consumers: []api.ServiceConsumer{{Peer: "cluster-a"}}})
	}
	if _, _, err := p.exporter.Client().ConfigEntries().Set(entry, nil); err != nil {
		t.Fatalf("write the exported-services config entry on dc2: %v", err)
	}
}

func peerInstance(r *sdktest.Replica) *sdktest.Instance {
	return r.Instance(sdk.ProviderConsul, "cluster-b")
}

func peerEndpoints(r *sdktest.Replica, host string) []string {
	var out []string
	if in := peerInstance(r); in != nil {
		for _, e := range in.Endpoints[host] {
			out = append(out, e.Address)
		}
	}
	slices.Sort(out)
	return out
}

// TestPeeredServices: services a cluster peer exports are their own
// instance, Cluster = the peer's name, next to the local datacenter's,
// whether the peer is named or found by "*". They follow the exporter:
// an instance registered there appears, one deregistered leaves, and an
// unexported service goes.
func TestPeeredServices(t *testing.T) {
	p := startPeerPair(t)
	local, exporter := p.local.Client(), p.exporter.Client()
	register(t, local, api.AgentServiceRegistration{ID: "web-1", Name: "web", Address: "10.1.0.1", Port: 8080}, api.HealthPassing)
	register(t, exporter, api.AgentServiceRegistration{ID: "billing-1", Name: "billing", Address: "10.2.0.1", Port: 9000}, api.HealthPassing)
	register(t, exporter, api.AgentServiceRegistration{ID: "secret-1", Name: "secret", Address: "10.2.0.9", Port: 9000}, api.HealthPassing)
	p.export(t, "billing")

	for _, peers := range []string{`["cluster-b"]`, `["*"]`} {
		t.Run("peers = "+peers, func(t *testing.T) {
			h := sdktest.Start(t, Factory)
			h.Configure(t, agentConfig(p.local.Addr, "peers = "+peers), sdk.MeshSettings{})
			w := h.Watch(t)
			w.WaitFor(t, wait, "billing from the peer, web from dc1", func(r *sdktest.Replica) bool {
				return slices.Equal(peerEndpoints(r, "billing.service.consul"), []string{"10.2.0.1"}) &&
					slices.Equal(endpointsOf(r, "web.service.consul"), []string{"10.1.0.1"})
			})
			w.With(func(r *sdktest.Replica) {
				in := peerInstance(r)
				if !in.Properties.ClusterScoped {
					t.Errorf("the peer's instance is not cluster-scoped: %+v", in.Properties)
				}
				if in.Services["secret.service.consul"] != nil || in.Services["web.service.consul"] != nil {
					t.Errorf("the peer's instance holds services it does not export: %v", keys(in.Services))
				}
				if dc1(r).Services["billing.service.consul"] != nil {
					t.Error("dc1's instance holds the peer's service")
				}
				if svc := in.Services["billing.service.consul"]; svc == nil || len(svc.Ports) != 1 || svc.Ports[0].Number != 9000 {
					t.Errorf("billing from the peer: %+v", svc)
				}
				if in.Health == nil || !in.Health.Healthy || in.Health.Message != "peer cluster-b: watching 1 services" {
					t.Errorf("peer health: %+v", in.Health)
				}
			})
		})
	}

	h := sdktest.Start(t, Factory)
	h.Configure(t, agentConfig(p.local.Addr, `peers = ["cluster-b"]`), sdk.MeshSettings{})
	w := h.Watch(t)
	w.WaitFor(t, wait, "billing from the peer", func(r *sdktest.Replica) bool {
		return slices.Equal(peerEndpoints(r, "billing.service.consul"), []string{"10.2.0.1"})
	})
	// The exporter gains an instance, loses one, then stops exporting.
	register(t, exporter, api.AgentServiceRegistration{ID: "billing-2", Name: "billing", Address: "10.2.0.2", Port: 9000}, api.HealthPassing)
	w.WaitFor(t, wait, "a second billing instance", func(r *sdktest.Replica) bool {
		return slices.Equal(peerEndpoints(r, "billing.service.consul"), []string{"10.2.0.1", "10.2.0.2"})
	})
	deregister(t, exporter, "billing-1")
	w.WaitFor(t, wait, "billing-1 gone", func(r *sdktest.Replica) bool {
		return slices.Equal(peerEndpoints(r, "billing.service.consul"), []string{"10.2.0.2"})
	})
	p.export(t, "secret")
	w.WaitFor(t, wait, "billing unexported, secret exported", func(r *sdktest.Replica) bool {
		in := peerInstance(r)
		return in != nil && in.Services["billing.service.consul"] == nil &&
			slices.Equal(peerEndpoints(r, "secret.service.consul"), []string{"10.2.0.9"})
	})
}

// TestUnknownPeer: a peer the agent has no peering with is an unhealthy
// instance whose health says so, not an empty one that looks fine.
func TestUnknownPeer(t *testing.T) {
	c := startConsul(t, testbed.ConsulPeering("dc1"))
	h := sdktest.Start(t, Factory)
	h.Configure(t, agentConfig(c.Addr, `peers = ["nobody"]`), sdk.MeshSettings{})
	w := h.Watch(t)
	w.WaitFor(t, wait, "peer nobody unhealthy, naming the missing peering", func(r *sdktest.Replica) bool {
		in := r.Instance(sdk.ProviderConsul, "nobody")
		return in != nil && in.Health != nil && !in.Health.Healthy &&
			strings.Contains(in.Health.Message, `peer nobody: list services: no such peering: the agent has no peering "nobody"`)
	})
}
