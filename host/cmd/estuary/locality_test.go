package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	"github.com/estuary-mesh/estuary/host/model"
)

// zoned is a backend in a locality, healthy or not.
type zoned struct {
	b        *backend
	ip       string
	locality string
	healthy  bool
}

// localityConfig is a whole plugins.hcl: locality failover off for the
// mesh, on for echo, which the zoned backends serve; other (one backend
// in each zone, never opted in) shows the mesh's setting.
func localityConfig(xdsAddr, admin string, eps []zoned) string {
	var b strings.Builder
	fmt.Fprintf(&b, `mesh {
  cluster_id        = "cluster1"
  locality_failover = false
  failover {
    from = "region1"
    to   = "region2"
  }
}
xds {
  listen         = %q
  debounce_after = "10ms"
}
admin { listen = %q }
plugin "static" {
  config {
    cluster = "cluster1"
    network = "network1"
    service "echo.default.svc.cluster.local" {
      locality_failover = true
      port "grpc" {
        number   = 8080
        protocol = "GRPC"
      }
`, xdsAddr, admin)
	for _, e := range eps {
		fmt.Fprintf(&b, "      endpoint {\n        address = %q\n        name = %q\n        ports = { grpc = %d }\n        locality = %q\n        healthy = %v\n      }\n",
			e.ip, e.b.name, e.b.port, e.locality, e.healthy)
	}
	b.WriteString(`    }
    service "other.default.svc.cluster.local" {
      port "grpc" {
        number   = 8080
        protocol = "GRPC"
      }
`)
	for _, e := range eps {
		fmt.Fprintf(&b, "      endpoint {\n        address = %q\n        ports = { grpc = %d }\n        locality = %q\n      }\n", e.ip, e.b.port, e.locality)
	}
	b.WriteString("    }\n  }\n}\n")
	return b.String()
}

// localityConn is xdsConn for a proxyless node that announces a
// locality in its bootstrap, as grpc-go sends it in the xDS Node.
func localityConn(t *testing.T, xdsAddr, nodeID, target, region, zone string) *grpc.ClientConn {
	t.Helper()
	return dialXDS(t, xdsAddr, target, fmt.Sprintf(`{"id": %q, "locality": {"region": %q, "zone": %q}, "metadata": {"GENERATOR": "grpc", "NETWORK": "network1", "CLUSTER_ID": "cluster1"}}`,
		nodeID, region, zone))
}

// TestLocalityFailoverWithProxylessGRPC: a real grpc-go client in
// region1/zone-a, a service with backends in zone-a, zone-b (same region)
// and region2. Calls stay in zone-a; when zone-a's endpoints turn
// unhealthy, or leave the registry, calls fail over to zone-b; when zone-b
// goes too, to region2 (the failover rule's region); when zone-a returns,
// calls come back to it. A service that does not opt in is spread over
// every zone, as the mesh says.
func TestLocalityFailoverWithProxylessGRPC(t *testing.T) {
	a1 := zoned{startBackendOn(t, "a1", "127.0.0.11"), "127.0.0.11", "region1/zone-a", true}
	a2 := zoned{startBackendOn(t, "a2", "127.0.0.12"), "127.0.0.12", "region1/zone-a", true}
	b1 := zoned{startBackendOn(t, "b1", "127.0.0.21"), "127.0.0.21", "region1/zone-b", true}
	r2 := zoned{startBackendOn(t, "r2", "127.0.0.31"), "127.0.0.31", "region2/zone-x", true}
	var xdsAddr, adminAddr string
	h := startHostFile(t, func(x, a string) string {
		xdsAddr, adminAddr = x, a
		return localityConfig(x, a, []zoned{a1, a2, b1, r2})
	})
	apply := func(eps ...zoned) {
		h.write(localityConfig(xdsAddr, adminAddr, eps))
		h.signal(syscall.SIGHUP)
	}
	node := "sidecar~127.0.0.1~client.default~default.svc.cluster.local"
	c := testgrpc.NewTestServiceClient(localityConn(t, h.xds, node, "echo.default.svc.cluster.local:8080", "region1", "zone-a"))

	waitServedBy(t, c, "a1", "a2")

	// What the node holds: priorities 0, 1, 2 for echo; one for other.
	var rows []model.EndpointRow
	if err := json.Unmarshal(h.estuary("proxy-config", "endpoints", "--node", node, "--json"), &rows); err != nil {
		t.Fatal(err)
	}
	prio := map[string]uint32{}
	for _, r := range rows {
		prio[r.Cluster+" "+strings.TrimRight(r.Locality, "/")] = r.Priority
	}
	want := map[string]uint32{
		"outbound|8080||echo.default.svc.cluster.local region1/zone-a":  0,
		"outbound|8080||echo.default.svc.cluster.local region1/zone-b":  1,
		"outbound|8080||echo.default.svc.cluster.local region2/zone-x":  2,
		"outbound|8080||other.default.svc.cluster.local region1/zone-a": 0,
		"outbound|8080||other.default.svc.cluster.local region1/zone-b": 0,
		"outbound|8080||other.default.svc.cluster.local region2/zone-x": 0,
	}
	for k, p := range want {
		if got, ok := prio[k]; !ok || got != p {
			t.Errorf("%s: priority %d (present %v), want %d; all: %v", k, got, ok, p, prio)
		}
	}

	// explain shows the decision and why.
	out := string(h.estuary("explain", "endpoint", "--node", node, "--cluster", "outbound|8080||echo.default.svc.cluster.local"))
	for _, w := range []string{
		"PRIORITIES RELATIVE TO THE CLIENT'S LOCALITY region1/zone-a",
		"priority 1  region1/zone-b: same region",
		"priority 2  region2/zone-x: another region, the failover rule's (region1 → region2)",
		"This matches what the xDS server holds",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("explain lacks %q:\n%s", w, out)
		}
	}

	// /debug/configz shows the setting the host runs with.
	if _, body := h.get("/debug/configz"); !strings.Contains(string(body), `"locality_failover": false`) || !strings.Contains(string(body), `"to": "region2"`) {
		t.Errorf("/debug/configz lacks the locality failover setting:\n%s", body)
	}

	// zone-a unhealthy: zone-b, not region2.
	down := func(z zoned) zoned { z.healthy = false; return z }
	apply(down(a1), down(a2), b1, r2)
	waitServedBy(t, c, "b1")
	// zone-a back.
	apply(a1, a2, b1, r2)
	waitServedBy(t, c, "a1", "a2")
	// zone-a leaves the registry, then zone-b too: region2.
	apply(b1, r2)
	waitServedBy(t, c, "b1")
	apply(r2)
	waitServedBy(t, c, "r2")
	// One zone-a endpoint returns: everything goes to it.
	apply(a2, b1, r2)
	waitServedBy(t, c, "a2")
}
