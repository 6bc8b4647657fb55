package pipeline

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/estuary-mesh/estuary/host/meshtest"
	"github.com/estuary-mesh/estuary/host/model"
)

// TestNetworkz checks /debug/networkz: the overview, which rule placed an
// endpoint, and the explanation of a cluster for a view.
func TestNetworkz(t *testing.T) {
	w, m := meshtest.ThreeNetworks(t)
	srv := httptest.NewServer(New(w.Agg, m, nil).Handler(nil))
	defer srv.Close()
	get := func(path string, v any) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s", path, resp.Status)
		}
		if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
			t.Fatal(err)
		}
	}
	var st struct {
		MultiNetwork bool     `json:"multi_network"`
		ScaleFactor  uint32   `json:"scale_factor"`
		Precedence   []string `json:"precedence"`
		Gateways     []struct{ Address, Source string }
		Networks     []struct{ Name string }
	}
	get("/debug/networkz", &st)
	if !st.MultiNetwork || st.ScaleFactor != 1 || len(st.Gateways) != 2 || len(st.Networks) != 2 || len(st.Precedence) != 4 {
		t.Errorf("networkz = %+v", st)
	}

	var origins []struct {
		Hostname string
		Network  string
		Rule     string
	}
	for addr, want := range map[string]string{
		"10.1.0.1": "network1 3: from_registry",
		"10.1.0.9": "network2 1: the endpoint's own network",
		"10.2.0.3": "network2 2: the registry's default network",
		"10.3.0.1": "network3 4: from_cidr",
		"10.7.0.1": " none: no rule matched, the network is unknown",
	} {
		get("/debug/networkz?endpoint="+addr, &origins)
		if len(origins) != 1 || origins[0].Network+" "+origins[0].Rule != want || origins[0].Hostname != meshtest.Echo {
			t.Errorf("endpoint %s: %+v, want %q", addr, origins, want)
		}
	}

	var ex Explanation
	get("/debug/networkz?explain="+model.ClusterName(8080, "", meshtest.Echo)+"&network=network1", &ex)
	var got []string
	for _, e := range ex.Endpoints {
		got = append(got, fmt.Sprintf("%s %s/%s %s [%s] %s", e.Endpoint, e.Instance.Cluster, e.Network, e.Rule, e.Arithmetic, e.Decision))
	}
	want := []string{
		"10.1.0.1:8080 cluster1/network1 3: from_registry [weight unset → scale factor 1] kept: on the node's network",
		"10.1.0.9:8080 cluster1/network2 1: the endpoint's own network [weight unset → scale factor 1; 1 / 1 gateways (its network's) = 1 to each] replaced by gateways",
		"10.2.0.1:8080 cluster2/network2 2: the registry's default network [weight unset → scale factor 1; 1 / 1 gateways (its network and cluster's) = 1 to each] replaced by gateways",
		"10.2.0.2:8080 cluster2/network2 2: the registry's default network [weight unset → scale factor 1; 1 / 1 gateways (its network and cluster's) = 1 to each] replaced by gateways",
		"10.2.0.3:8080 cluster2/network2 2: the registry's default network [weight unset → scale factor 1] dropped: on another network and not in Istio mTLS mode, which a gateway requires",
		"10.3.0.1:8080 vms/network3 4: from_cidr [weight unset → scale factor 1] kept: its network has no gateway",
		"10.7.0.1:8080 vms/ none: no rule matched, the network is unknown [weight unset → scale factor 1] kept: on the node's network",
	}
	if !slices.Equal(got, want) {
		t.Errorf("explained endpoints:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	got = nil
	for _, r := range ex.Result {
		got = append(got, fmt.Sprintf("%s w=%d gateway=%v %s", r.Endpoint, r.Weight, r.Gateway, r.Arithmetic))
	}
	want = []string{
		"10.1.0.1:8080 w=1 gateway=false as the endpoint",
		"10.3.0.1:8080 w=1 gateway=false as the endpoint",
		"10.7.0.1:8080 w=1 gateway=false as the endpoint",
		"192.168.2.1:15443 w=3 gateway=true 1 (10.1.0.9:8080) + 1 (10.2.0.1:8080) + 1 (10.2.0.2:8080) = 3",
	}
	if !slices.Equal(got, want) {
		t.Errorf("explained result:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	resp, err := http.Get(srv.URL + "/debug/networkz?explain=outbound|9999||" + meshtest.Echo)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("explain of a missing port: %s", resp.Status)
	}
}
