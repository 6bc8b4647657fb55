package network_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/miekg/dns"

	"github.com/estuary-mesh/estuary/host/meshtest"
	"github.com/estuary-mesh/estuary/host/network"
)

// blackhole is a DNS server that times out: a UDP socket on 127.0.0.1
// that reads every query and answers none.
func blackhole(t *testing.T) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 1500)
		for {
			if _, _, err := pc.ReadFrom(buf); errors.Is(err, net.ErrClosed) {
				return
			}
		}
	}()
	t.Cleanup(func() { pc.Close(); <-done })
	return pc.LocalAddr().String()
}

// runManager runs m until the test ends.
func runManager(t *testing.T, m *network.Manager) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := m.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
}

// gatewaysConfig names one gateway per network, by DNS name.
func gatewaysConfig(t *testing.T, servers []string, names ...string) string {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "  dns_servers = [%s]\n", strings.Join(quoted(servers), ", "))
	for i, n := range names {
		fmt.Fprintf(&b, "  network \"network%d\" {\n    endpoints { from_cidr = \"10.%d.0.0/16\" }\n    gateway {\n      address = %q\n      port = 15443\n    }\n  }\n", i+2, i+2, n)
	}
	return b.String()
}

func quoted(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = fmt.Sprintf("%q", s)
	}
	return out
}

// TestDNSTimeouts: DNS servers that time out, not only fail (issue 11.7).
//   - A name whose server stops answering keeps its last answer through
//     every timed-out attempt, without a push; the status says "timeout".
//   - While one name's queries hang (a timeout far longer than the test),
//     another name's new answer still arrives: resolutions do not queue
//     behind each other.
//   - With a first server that never answers, a name resolves from the
//     second one.
//
// Fails if: a timeout drops or changes a gateway, one hung query holds up
// the others, or the resolver never moves on to the next server.
func TestDNSTimeouts(t *testing.T) {
	const gw1, gw2 = "gw.network2.example.com", "gw.network3.example.com"

	t.Run("last answer kept", func(t *testing.T) {
		srv := startDNS(t)
		srv.set(gw1, 0, dns.RcodeSuccess, "10.0.0.1")
		w := meshtest.New(t)
		m := network.New(w.Agg, hclog.NewNullLogger(), network.Options{MinTTL: 20 * time.Millisecond, DNSTimeout: 200 * time.Millisecond})
		m.Apply(meshtest.Networks(t, gatewaysConfig(t, []string{srv.addr}, gw1)))
		runManager(t, m)
		eventually(t, "the name to resolve", func() bool { return slices.Equal(gatewayAddrs(m), []string{"10.0.0.1:15443"}) })
		gen := m.Generation()

		srv.mu.Lock()
		srv.drop[dns.Fqdn(gw1)] = true
		srv.mu.Unlock()
		n := srv.count(gw1)
		eventually(t, "three timed-out attempts", func() bool { return srv.count(gw1) >= n+3 })
		if got := gatewayAddrs(m); !slices.Equal(got, []string{"10.0.0.1:15443"}) || m.Generation() != gen {
			t.Errorf("after DNS timeouts: gateways %v, generation %d (was %d); want the last answer, unchanged", got, m.Generation(), gen)
		}
		if st := m.Status().DNS; len(st) != 1 || !strings.Contains(st[0].Error, "timeout") {
			t.Errorf("dns status does not show the timeout: %+v", st)
		}
	})

	t.Run("a hung name holds no other", func(t *testing.T) {
		srv := startDNS(t)
		srv.set(gw1, 0, dns.RcodeSuccess, "10.0.0.1")
		srv.set(gw2, 0, dns.RcodeSuccess, "10.0.1.1")
		w := meshtest.New(t)
		m := network.New(w.Agg, hclog.NewNullLogger(), network.Options{MinTTL: 20 * time.Millisecond, DNSTimeout: time.Hour})
		m.Apply(meshtest.Networks(t, gatewaysConfig(t, []string{srv.addr}, gw1, gw2)))
		runManager(t, m)
		eventually(t, "both names to resolve", func() bool {
			return slices.Equal(gatewayAddrs(m), []string{"10.0.0.1:15443", "10.0.1.1:15443"})
		})
		srv.mu.Lock()
		srv.drop[dns.Fqdn(gw1)] = true
		srv.mu.Unlock()
		n := srv.count(gw1)
		eventually(t, "gw1's query to hang", func() bool { return srv.count(gw1) > n })
		srv.set(gw2, 0, dns.RcodeSuccess, "10.0.1.2")
		eventually(t, "gw2's new answer while gw1 hangs", func() bool {
			return slices.Equal(gatewayAddrs(m), []string{"10.0.0.1:15443", "10.0.1.2:15443"})
		})
	})

	t.Run("next server", func(t *testing.T) {
		srv := startDNS(t)
		srv.set(gw1, 0, dns.RcodeSuccess, "10.0.0.5")
		w := meshtest.New(t)
		m := network.New(w.Agg, hclog.NewNullLogger(), network.Options{MinTTL: 20 * time.Millisecond, DNSTimeout: 200 * time.Millisecond})
		m.Apply(meshtest.Networks(t, gatewaysConfig(t, []string{blackhole(t), srv.addr}, gw1)))
		runManager(t, m)
		eventually(t, "the name from the second server", func() bool { return slices.Equal(gatewayAddrs(m), []string{"10.0.0.5:15443"}) })
	})
}
