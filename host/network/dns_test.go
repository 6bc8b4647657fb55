package network_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/miekg/dns"

	"github.com/estuary-mesh/estuary/host/meshtest"
	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/host/network"
	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
)

// dnsServer is a DNS server on 127.0.0.1 whose answers the test sets.
type dnsServer struct {
	addr string
	srv  *dns.Server

	mu      sync.Mutex
	answers map[string][]string // FQDN -> IPs
	ttl     uint32
	rcode   int // answer with this code instead (e.g. SERVFAIL)
	queries map[string]int
	drop    map[string]bool // FQDNs whose queries are read and never answered
}

func startDNS(t *testing.T) *dnsServer {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &dnsServer{addr: pc.LocalAddr().String(), answers: map[string][]string{}, queries: map[string]int{}, drop: map[string]bool{}}
	started := make(chan struct{})
	s.srv = &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(s.serve), NotifyStartedFunc: func() { close(started) }}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.srv.ActivateAndServe()
	}()
	<-started
	t.Cleanup(func() {
		_ = s.srv.Shutdown()
		<-done
	})
	return s
}

func (s *dnsServer) serve(w dns.ResponseWriter, r *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(r)
	s.mu.Lock()
	q := r.Question[0]
	s.queries[q.Name+" "+dns.TypeToString[q.Qtype]]++
	if s.drop[q.Name] {
		s.mu.Unlock()
		return // a server that times out: the query is read, never answered
	}
	if s.rcode != dns.RcodeSuccess {
		m.Rcode = s.rcode
	} else {
		for _, a := range s.answers[q.Name] {
			ip := netip.MustParseAddr(a)
			hdr := dns.RR_Header{Name: q.Name, Class: dns.ClassINET, Ttl: s.ttl}
			switch {
			case ip.Is4() && q.Qtype == dns.TypeA:
				hdr.Rrtype = dns.TypeA
				m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: ip.AsSlice()})
			case ip.Is6() && q.Qtype == dns.TypeAAAA:
				hdr.Rrtype = dns.TypeAAAA
				m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr, AAAA: ip.AsSlice()})
			}
		}
	}
	s.mu.Unlock()
	_ = w.WriteMsg(m)
}

func (s *dnsServer) set(name string, ttl uint32, rcode int, ips ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.answers[dns.Fqdn(name)] = ips
	s.ttl, s.rcode = ttl, rcode
}

// count is how often name was asked for A.
func (s *dnsServer) count(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queries[dns.Fqdn(name)+" A"]
}

func eventually(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func gatewayAddrs(m *network.Manager) []string {
	var out []string
	for _, g := range m.AllGateways() {
		out = append(out, g.String())
	}
	return out
}

// TestDNSGateway: a gateway given by DNS name is resolved by the host (A
// and AAAA, one gateway per address), re-resolved after its TTL, kept when
// DNS fails, and dropped when the config no longer names it. Every change
// of answer is a gateway change: Generation moves on and a full push is
// requested.
func TestDNSGateway(t *testing.T) {
	srv := startDNS(t)
	const name = "gw.network2.example.com"
	srv.set(name, 0, dns.RcodeSuccess, "10.0.0.1", "fd00::1")

	w := meshtest.New(t)
	m := network.New(w.Agg, hclog.NewNullLogger(), network.Options{MinTTL: 20 * time.Millisecond, MaxTTL: 2 * time.Second})
	var pushes atomic.Int64
	m.Subscribe(func(c model.Change) {
		if c.Full {
			pushes.Add(1)
		}
	})
	withGateway := meshtest.Networks(t, fmt.Sprintf(`
  dns_servers = [%q]
  network "network2" {
    endpoints { from_cidr = "10.2.0.0/16" }
    gateway {
      address = "%s"
      port    = 15443
    }
  }
`, srv.addr, name))
	w.Add(meshtest.Instance{Plugin: "west", Cluster: "c2", Services: []*registryv1.Service{echoService("c2")},
		Endpoints: map[string][]*registryv1.Endpoint{echo: {ep("10.2.0.1", "", true)}}})
	remote := func() string { return received(t, w, m, model.View{Network: "network1"}) }

	// Until the name resolves (the resolver is not running yet), network2
	// has a gateway with no address: its endpoints are dropped, never sent
	// as they are.
	m.Apply(withGateway)
	if got := remote(); got != "" || !m.MultiNetwork() {
		t.Errorf("before resolution (multi-network %v) a node on network1 got:\n%s", m.MultiNetwork(), got)
	}
	if st := m.Status(); st.Pending["network2"] == "" {
		t.Errorf("network2 is not reported pending: %+v", st.Pending)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		if err := m.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
		close(done)
	}()
	defer func() {
		cancel()
		<-done
	}()

	// Resolves: A and AAAA, one gateway each, TTL 0 clamped up to MinTTL.
	eventually(t, "the gateway name to resolve", func() bool {
		return slices.Equal(gatewayAddrs(m), []string{"10.0.0.1:15443", "[fd00::1]:15443"})
	})
	gen, before := m.Generation(), pushes.Load()
	if before == 0 {
		t.Error("resolving the name requested no push")
	}
	st := m.Status().DNS
	if len(st) != 1 || st[0].Name != name || st[0].TTL != "20ms" {
		t.Errorf("dns status = %+v, want %s with TTL clamped to 20ms", st, name)
	}
	// One group of two gateways: scale 2, the endpoint's 2 splits 1 and 1.
	if got, want := remote(), "locality=us-east1/us-east1-b priority=0 weight=2\n  10.0.0.1:15443 w=1 net=network2 cluster= tls=istio\n  fd00::1:15443 w=1 net=network2 cluster= tls=istio\n"; got != want {
		t.Errorf("node on network1 got:\n%s\nwant:\n%s", got, want)
	}

	// Re-resolves after the TTL: a new address is a gateway change.
	srv.set(name, 0, dns.RcodeSuccess, "10.0.0.2", "fd00::1")
	eventually(t, "the new address", func() bool {
		return slices.Equal(gatewayAddrs(m), []string{"10.0.0.2:15443", "[fd00::1]:15443"})
	})
	if m.Generation() == gen || pushes.Load() == before {
		t.Errorf("a changed answer did not move the generation (%d) or push (%d)", m.Generation(), pushes.Load())
	}

	// DNS fails: the last answer stays, through several attempts.
	gen, before = m.Generation(), pushes.Load()
	srv.set(name, 0, dns.RcodeServerFailure, "10.0.0.3")
	n := srv.count(name)
	eventually(t, "three more attempts while DNS fails", func() bool { return srv.count(name) >= n+3 })
	if got := gatewayAddrs(m); !slices.Equal(got, []string{"10.0.0.2:15443", "[fd00::1]:15443"}) {
		t.Errorf("after DNS failures gateways = %v, want the last answer", got)
	}
	if m.Generation() != gen || pushes.Load() != before {
		t.Error("a failed resolution changed the generation or pushed")
	}
	if st := m.Status().DNS; len(st) != 1 || st[0].Error == "" {
		t.Errorf("dns status does not show the failure: %+v", st)
	}

	// An answer with no address at all (the name lost its records) keeps
	// the last answer too.
	srv.set(name, 0, dns.RcodeSuccess)
	n = srv.count(name)
	eventually(t, "two more attempts with empty answers", func() bool { return srv.count(name) >= n+2 })
	if got := gatewayAddrs(m); len(got) != 2 {
		t.Errorf("after empty answers gateways = %v", got)
	}

	// A long TTL is clamped to MaxTTL.
	srv.set(name, 7200, dns.RcodeSuccess, "10.0.0.4")
	eventually(t, "the long-TTL answer", func() bool { return slices.Equal(gatewayAddrs(m), []string{"10.0.0.4:15443"}) })
	if st := m.Status().DNS; st[0].TTL != "2s" {
		t.Errorf("TTL 7200s gave %s, want the 2s maximum", st[0].TTL)
	}

	// Removed from the config: gone at once, and no longer resolved.
	before = pushes.Load()
	m.Apply(meshtest.Networks(t, fmt.Sprintf(`dns_servers = [%q]`, srv.addr)))
	if got := m.AllGateways(); len(got) != 0 {
		t.Errorf("gateways after removal = %v", got)
	}
	if pushes.Load() == before {
		t.Error("removing the gateway requested no push")
	}
	if st := m.Status().DNS; len(st) != 0 {
		t.Errorf("the name is still resolved: %+v", st)
	}
	// No gateway left: multi-network is off, endpoints pass unchanged (an
	// unset weight leaves the pipeline as 1, which it means to Envoy). The
	// config no longer places 10.2.0.1 on network2 either.
	if got, want := remote(), "locality=us-east1/us-east1-b priority=0 weight=0\n  10.2.0.1:8080 w=1 net= cluster=c2 tls=istio\n"; got != want {
		t.Errorf("with no gateway, node got:\n%s\nwant:\n%s", got, want)
	}
}
