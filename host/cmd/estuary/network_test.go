package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
)

// startBackendOn is startBackend on another loopback address: it stands in
// for an east-west gateway, answering with its name.
func startBackendOn(t *testing.T, name, ip string) *backend {
	t.Helper()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	b := &backend{name: name, port: ln.Addr().(*net.TCPAddr).Port}
	s := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(s, b)
	go s.Serve(ln)
	t.Cleanup(s.Stop)
	return b
}

// twoNetworks is two static registries, cluster1 on network1 (the client's)
// and cluster2 on network2, plus a networks block whose gateway into
// network2 is gw. cluster1's registry reports network1's gateway itself.
//
// Weights by hand (one gateway per network: scale factor 1):
//
//	b1 unset -> 1, b2 2 -> 2, on network1: kept
//	10.2.0.1 unset -> 1, 10.2.0.2 3 -> 3, mTLS: replaced by gw, 1 + 3 = 4
//	10.2.0.3 plain text: dropped
func twoNetworks(b1, b2 *backend, gwIP string, gw *backend, extra string) string {
	return fmt.Sprintf(`plugin "east" {
  bundled = "static"
  config {
    cluster = "cluster1"
    network = "network1"
    service "echo.default.svc.cluster.local" {
      port "grpc" {
        number   = 8080
        protocol = "GRPC"
      }
      endpoint {
        address  = "127.0.0.1"
        name     = "b1"
        ports    = { grpc = %d }
        locality = "us-east1/us-east1-b"
        tls_mode = "istio"
      }
      endpoint {
        address  = "127.0.0.1"
        name     = "b2"
        ports    = { grpc = %d }
        locality = "us-east1/us-east1-b"
        weight   = 2
      }
    }
    gateway {
      network = "network1"
      address = "127.0.0.11"
      port    = 15443
    }
  }
}
plugin "west" {
  bundled = "static"
  config {
    cluster = "cluster2"
    network = "network2"
    service "echo.default.svc.cluster.local" {
      port "grpc" {
        number   = 8080
        protocol = "GRPC"
      }
      endpoint {
        address  = "10.2.0.1"
        locality = "us-east1/us-east1-b"
        tls_mode = "istio"
      }
      endpoint {
        address  = "10.2.0.2"
        locality = "us-east1/us-east1-b"
        tls_mode = "istio"
        weight   = 3
      }
      endpoint {
        address  = "10.2.0.3"
        locality = "us-east1/us-east1-b"
      }
    }
  }
}
networks {
  network "network1" {
    endpoints { from_registry = "cluster1" }
  }
  network "network2" {
    endpoints { from_registry = "cluster2" }
    gateway {
      address  = %q
      port     = %d
      locality = "us-east1/us-east1-b"
    }
  }
%s}
`, b1.port, b2.port, gwIP, gw.port, extra)
}

// proxyEndpoints reads what a node receives for a cluster, as
// "ADDR:PORT w=W net=N".
func (h *host) proxyEndpoints(node, cluster string) []string {
	var rows []struct {
		Endpoint string `json:"endpoint"`
		Weight   uint32 `json:"weight"`
		Network  string `json:"network"`
	}
	h.getJSON("/debug/proxyendpointz?node="+node+"&cluster="+cluster, &rows)
	var out []string
	for _, r := range rows {
		out = append(out, fmt.Sprintf("%s w=%d net=%s", r.Endpoint, r.Weight, r.Network))
	}
	slices.Sort(out)
	return out
}

// TestMultiNetworkEndToEnd: a gRPC xDS client on network1 gets network1's
// endpoints and network2's gateway (never network2's pod addresses) with
// the right weights, its calls reach both, and a change of gateway reaches
// it with a full push. A bad networks block on reload keeps the old one.
func TestMultiNetworkEndToEnd(t *testing.T) {
	b1, b2 := startBackend(t, "b1"), startBackend(t, "b2")
	gw2 := startBackendOn(t, "gw2", "127.0.0.12")
	h := startHost(t, twoNetworks(b1, b2, "127.0.0.12", gw2, ""))
	const node = "sidecar~127.0.0.1~mn-client.default~default.svc.cluster.local"
	const cluster = "outbound|8080||echo.default.svc.cluster.local"
	c := xdsClient(t, h.xds, node, "echo.default.svc.cluster.local:8080")

	// Real calls: network1's pods and network2's gateway answer.
	waitServedBy(t, c, "b1", "b2", "gw2")
	want := []string{
		fmt.Sprintf("127.0.0.12:%d w=4 net=network2", gw2.port),
		fmt.Sprintf("127.0.0.1:%d w=1 net=network1", b1.port),
		fmt.Sprintf("127.0.0.1:%d w=2 net=network1", b2.port),
	}
	slices.Sort(want)
	if got := h.proxyEndpoints(node, cluster); !slices.Equal(got, want) {
		t.Fatalf("node on network1 receives:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// /debug/networkz: both gateway sources, and which rule placed an endpoint.
	var st struct {
		MultiNetwork bool   `json:"multi_network"`
		ScaleFactor  uint32 `json:"scale_factor"`
		Gateways     []struct {
			Network, Address, Source string
		}
	}
	h.getJSON("/debug/networkz", &st)
	var gws []string
	for _, g := range st.Gateways {
		gws = append(gws, g.Network+" "+g.Address+" "+strings.Fields(g.Source)[0])
	}
	if !st.MultiNetwork || st.ScaleFactor != 1 || !slices.Equal(gws, []string{"network1 127.0.0.11 registry", "network2 127.0.0.12 config"}) {
		t.Errorf("networkz: multi %v scale %d gateways %v", st.MultiNetwork, st.ScaleFactor, gws)
	}
	var origins []struct{ Network, Rule string }
	h.getJSON("/debug/networkz?endpoint=10.2.0.2", &origins)
	if len(origins) != 1 || origins[0].Network != "network2" || !strings.Contains(origins[0].Rule, "registry's default") {
		t.Errorf("10.2.0.2 placed by %+v, want network2 by the registry default", origins)
	}

	// estuary explain endpoint: origin, decision and arithmetic per endpoint.
	out, err := exec.Command(estuaryBin, "explain", "endpoint", "--node", node, "--cluster", cluster,
		"--admin", strings.TrimPrefix(h.admin, "http://")).CombinedOutput()
	if err != nil {
		t.Fatalf("explain: %v\n%s", err, out)
	}
	for _, s := range []string{
		"multi-network on, weight scale factor 1",
		"10.2.0.2:8080  locality us-east1/us-east1-b  tls istio",
		"origin:   instance west:Static/cluster2, cluster cluster2, network network2 by rule 2: the registry's default network",
		fmt.Sprintf("decision: replaced by gateways 127.0.0.12:%d", gw2.port),
		"weights:  weight 3 × scale factor 1 = 3; 3 / 1 gateways (its network's) = 3 to each",
		"decision: dropped: on another network and not in Istio mTLS mode",
		"gateway: 1 (10.2.0.1:8080) + 3 (10.2.0.2:8080) = 4",
		"This matches what the xDS server holds for the node.",
	} {
		if !strings.Contains(string(out), s) {
			t.Errorf("explain output lacks %q:\n%s", s, out)
		}
	}

	if !regexp.MustCompile(fmt.Sprintf(`(?m)^127\.0\.0\.12:%d +4 +us-east1/us-east1-b +network2 `, gw2.port)).Match(out) {
		t.Errorf("explain does not list the gateway with weight 4:\n%s", out)
	}

	// A new gateway for network2, by reload: it reaches the client with a
	// full push.
	gw2b := startBackendOn(t, "gw2b", "127.0.0.13")
	mark := len(h.log.String())
	h.rewrite(twoNetworks(b1, b2, "127.0.0.13", gw2b, ""))
	h.signal(syscall.SIGHUP)
	waitServedBy(t, c, "b1", "b2", "gw2b")
	want[0] = fmt.Sprintf("127.0.0.13:%d w=4 net=network2", gw2b.port)
	slices.Sort(want)
	if got := h.proxyEndpoints(node, cluster); !slices.Equal(got, want) {
		t.Errorf("after the gateway change the node receives:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if log := h.log.String()[mark:]; !strings.Contains(log, "networks changed") || !strings.Contains(log, "push: full=true") {
		t.Errorf("no network change followed by a full push in the log:\n%s", log)
	}

	// A bad networks block on reload is rejected: the running gateways stay.
	mark = len(h.log.String())
	h.rewrite(twoNetworks(b1, b2, "127.0.0.12", gw2, `  network "network3" {
    endpoints { from_registry = "cluster2" }
  }
`))
	h.signal(syscall.SIGHUP)
	h.eventually("the reload to be rejected", 20*time.Second, func() bool {
		return strings.Contains(h.log.String()[mark:], "reload rejected")
	})
	if log := h.log.String()[mark:]; !strings.Contains(log, `Registry in two networks: from_registry "cluster2" is already in network "network2"`) {
		t.Errorf("the rejection does not say why:\n%s", log)
	}
	if got := h.proxyEndpoints(node, cluster); !slices.Equal(got, want) {
		t.Errorf("after a rejected reload the node receives:\n%s\nwant the previous:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	waitServedBy(t, c, "b1", "b2", "gw2b")
}

// TestValidateNetworks: `estuary validate` checks the networks block and the
// meshNetworks file it names, each problem at its position.
func TestValidateNetworks(t *testing.T) {
	dir := t.TempDir()
	yaml := filepath.Join(dir, "mesh-networks.yaml")
	if err := os.WriteFile(yaml, []byte("networks:\n  network9:\n    endpoints:\n    - fromCidr: 10.0.0.0/16\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "plugins.hcl")
	src := `plugin "static" {}
networks {
  file = "mesh-networks.yaml"
  network "network1" {
    endpoints { from_cidr = "10.0.0.0/8" }
    gateway {
      address = "gateway"
      port    = 15443
    }
  }
}
`
	if err := os.WriteFile(cfg, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(estuaryBin, "validate", "-config", cfg).CombinedOutput()
	if code := exitCode(err); code != 1 {
		t.Fatalf("validate exited %d:\n%s", code, out)
	}
	for _, s := range []string{
		cfg + `:7:17: error: Invalid gateway address: "gateway" is neither an IP address nor a fully qualified DNS name`,
		yaml + `:4:17: error: Overlapping CIDR ranges: from_cidr 10.0.0.0/16 overlaps 10.0.0.0/8 of network "network1" at ` + cfg + ":5:29",
		"2 error(s)",
	} {
		if !strings.Contains(string(out), s) {
			t.Errorf("validate output lacks %q:\n%s", s, out)
		}
	}
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	return -1
}
