package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/host/pipeline"
)

// TestExplainAgreesWithProxyConfig runs the two-networks example and
// connects the nodes it describes: a proxyless client on each network
// (grpc-go's own xDS client) and each network's east-west gateway (an ADS
// stream, since no Envoy runs here). For every EDS cluster each of them
// has, `estuary explain endpoint` must say the node is sent exactly the
// endpoints `estuary proxy-config endpoints` shows the xDS server holds
// for it: the same addresses, ports, weights, localities and networks.
// For the gateways, what arrived over the wire must be proxy-config's too.
//
// It checks explain against what is served; TestExamplesRun checks that
// what is served is what the example promises.
func TestExplainAgreesWithProxyConfig(t *testing.T) {
	example, err := os.ReadFile("../../../examples/two-networks/plugins.hcl")
	if err != nil {
		t.Fatal(err)
	}
	h := startHostFile(t, func(xds, admin string) string {
		return string(example) + fmt.Sprintf("\nxds {\n  listen         = %q\n  debounce_after = \"10ms\"\n}\nadmin {\n  listen = %q\n}\n", xds, admin)
	})
	const echo = "echo.default.svc.cluster.local"
	nodes := []struct {
		name, id, network, cluster string
		router                     bool
	}{
		{"client on network1", "sidecar~127.0.0.2~east-client.default~default.svc.cluster.local", "network1", "cluster1", false},
		{"client on network2", "sidecar~127.0.0.3~west-client.default~default.svc.cluster.local", "network2", "cluster2", false},
		{"east-west gateway of network1", "router~127.0.0.11~istio-eastwestgateway-1.istio-system~istio-system.svc.cluster.local", "network1", "cluster1", true},
		{"east-west gateway of network2", "router~127.0.0.12~istio-eastwestgateway-2.istio-system~istio-system.svc.cluster.local", "network2", "cluster2", true},
	}
	compared, gateways := 0, 0
	for _, n := range nodes {
		var clusters []string
		var wire map[string][]string
		if n.router {
			wire = routerEndpoints(t, h.xds, n.id, n.network, n.cluster)
			clusters = slices.Sorted(maps.Keys(wire))
			if !slices.Contains(clusters, model.SNIClusterName(8080, "", echo)) {
				t.Fatalf("%s has clusters %v, not echo's", n.name, clusters)
			}
		} else {
			xdsConn(t, h.xds, n.id, echo+":8080", n.network, n.cluster).Connect()
			h.eventually(n.name+" to acknowledge its endpoints", 30*time.Second, func() bool { return h.ackedEDS(n.id) })
			clusters = []string{model.ClusterName(8080, "", echo)}
		}
		for _, c := range clusters {
			explained, held := h.explained(n.id, c), h.held(n.id, c)
			t.Logf("%s, %s: %d endpoints", n.name, c, len(held))
			if !slices.Equal(explained, held) {
				t.Errorf("%s, %s: explain says the node is sent:\n  %s\nproxy-config shows it holds:\n  %s",
					n.name, c, strings.Join(explained, "\n  "), strings.Join(held, "\n  "))
			}
			if wire != nil && !slices.Equal(wire[c], endpointsOnly(held)) {
				t.Errorf("%s, %s: received %v over ADS, proxy-config shows %v", n.name, c, wire[c], held)
			}
			compared += len(explained)
			for _, e := range explained {
				if strings.Contains(e, ":15443 ") {
					gateways++
				}
			}
		}
	}
	// Guard against agreeing on nothing: the example sends endpoints, and
	// to one of its clients a gateway in place of some.
	if compared == 0 || gateways == 0 {
		t.Errorf("compared %d endpoints, %d of them gateways", compared, gateways)
	}
}

// explained runs `estuary explain endpoint --json` and lists what it says
// the node is sent, as "ADDR:PORT w=W locality=L network=N", sorted.
func (h *host) explained(node, cluster string) []string {
	h.t.Helper()
	out := h.estuary("explain", "endpoint", "--node", node, "--cluster", cluster, "--json")
	var ex pipeline.Explanation
	if err := json.Unmarshal(out, &ex); err != nil {
		h.t.Fatalf("explain output: %v\n%s", err, out)
	}
	rows := []string{}
	for _, r := range ex.Result {
		rows = append(rows, fmt.Sprintf("%s w=%d locality=%s network=%s", r.Endpoint, r.Weight, r.Locality, r.Network))
	}
	slices.Sort(rows)
	return rows
}

// held runs `estuary proxy-config endpoints --json` and lists what the
// xDS server holds for the node, as explained lists it.
func (h *host) held(node, cluster string) []string {
	h.t.Helper()
	out := h.estuary("proxy-config", "endpoints", "--node", node, "--cluster", cluster, "--json")
	var eps []model.EndpointRow
	if err := json.Unmarshal(out, &eps); err != nil {
		h.t.Fatalf("proxy-config output: %v\n%s", err, out)
	}
	rows := []string{}
	for _, r := range eps {
		// proxy-config prints region/zone/subzone in full.
		rows = append(rows, fmt.Sprintf("%s w=%d locality=%s network=%s", r.Endpoint, r.Weight, strings.TrimRight(r.Locality, "/"), r.Network))
	}
	slices.Sort(rows)
	return rows
}

// endpointsOnly keeps "ADDR:PORT w=W" of held's rows.
func endpointsOnly(rows []string) []string {
	out := []string{}
	for _, r := range rows {
		f := strings.Fields(r)
		out = append(out, f[0]+" "+f[1])
	}
	return out
}

// estuary runs the binary against the host's admin server.
func (h *host) estuary(args ...string) []byte {
	h.t.Helper()
	args = append(args, "--admin", strings.TrimPrefix(h.admin, "http://"))
	out, err := exec.Command(estuaryBin, args...).Output()
	if err != nil {
		h.t.Fatalf("estuary %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// ackedEDS reports whether a connected node has acknowledged endpoints.
func (h *host) ackedEDS(node string) bool {
	var streams []struct {
		Node  string `json:"node"`
		Types map[string]struct {
			State     string `json:"state"`
			Resources int    `json:"resources_last_sent"`
		} `json:"types"`
	}
	h.getJSON("/debug/adsz", &streams)
	for _, s := range streams {
		if eds := s.Types["eds"]; s.Node == node && eds.State == "ACK" && eds.Resources > 0 {
			return true
		}
	}
	return false
}

// routerEndpoints connects an east-west gateway of network in cluster over
// ADS, takes every cluster (wildcard CDS) and the endpoints of those that
// are EDS, acknowledging each response as Envoy does, and returns the
// endpoints by cluster as "ADDR:PORT w=W", sorted. The stream stays open
// until the test ends, so the node stays connected.
func routerEndpoints(t *testing.T, xdsAddr, id, network, cluster string) map[string][]string {
	t.Helper()
	return adsEndpoints(t, xdsAddr, id, map[string]any{"NETWORK": network, "REQUESTED_NETWORK_VIEW": network, "CLUSTER_ID": cluster})
}

// adsEndpoints is routerEndpoints for any node: id and metadata md.
func adsEndpoints(t *testing.T, xdsAddr, id string, md map[string]any) map[string][]string {
	t.Helper()
	// The stream lives until the test ends, so that the node stays
	// connected; only the wait for the first answers is bounded.
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	timeout := time.AfterFunc(30*time.Second, cancel)
	defer timeout.Stop()
	stream := openADS(t, ctx, xdsAddr)
	meta, err := structpb.NewStruct(md)
	if err != nil {
		t.Fatal(err)
	}
	node := &corev3.Node{Id: id, Metadata: meta}
	send := func(req *discoveryv3.DiscoveryRequest) {
		t.Helper()
		req.Node = node
		if err := stream.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ClusterType})
	var edsNames []string
	out := map[string][]string{}
	for got := false; !got; {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("ADS: %v", err)
		}
		ack := &discoveryv3.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(), VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}
		switch resp.GetTypeUrl() {
		case resourcev3.ClusterType:
			send(ack)
			if edsNames != nil {
				continue // the set was taken already; this config is static
			}
			edsNames = []string{}
			for _, r := range resp.GetResources() {
				var c clusterv3.Cluster
				if err := r.UnmarshalTo(&c); err != nil {
					t.Fatal(err)
				}
				if c.GetType() == clusterv3.Cluster_EDS {
					edsNames = append(edsNames, c.GetName())
				}
			}
			if len(edsNames) == 0 {
				t.Fatalf("%s has no EDS cluster", id) // an empty list would subscribe to every CLA
			}
			send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: edsNames})
		case resourcev3.EndpointType:
			ack.ResourceNames = edsNames
			send(ack)
			for _, r := range resp.GetResources() {
				var cla endpointv3.ClusterLoadAssignment
				if err := r.UnmarshalTo(&cla); err != nil {
					t.Fatal(err)
				}
				eps := []string{}
				for _, le := range cla.GetEndpoints() {
					for _, lb := range le.GetLbEndpoints() {
						sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
						eps = append(eps, fmt.Sprintf("%s:%d w=%d", sa.GetAddress(), sa.GetPortValue(), lb.GetLoadBalancingWeight().GetValue()))
					}
				}
				slices.Sort(eps)
				out[cla.GetClusterName()] = eps
			}
			got = true
		}
	}
	for _, n := range edsNames {
		if _, ok := out[n]; !ok {
			t.Fatalf("no endpoints for cluster %s over ADS", n)
		}
	}
	return out
}
