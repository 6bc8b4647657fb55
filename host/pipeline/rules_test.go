package pipeline

import (
	"errors"
	"slices"
	"testing"

	"github.com/estuary-mesh/estuary/host/meshtest"
	"github.com/estuary-mesh/estuary/host/model"
	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
	"github.com/estuary-mesh/estuary/sdk"
)

// TestEndpointNetworkPrecedence: the four rules in order, first match wins,
// and Build places endpoints by them.
func TestEndpointNetworkPrecedence(t *testing.T) {
	w, m := meshtest.ThreeNetworks(t)
	// A second config makes every rule able to answer, to see which wins.
	m.Apply(meshtest.Networks(t, `
  network "by-registry" {
    endpoints { from_registry = "cluster2" }
    endpoints { from_registry = "vms" }
  }
  network "by-cidr" {
    endpoints { from_cidr = "10.0.0.0/8" }
  }
`))
	tests := []struct {
		name                       string
		cluster, def, own, address string
		want                       string
		rule                       Rule
	}{
		{"own network beats everything", "cluster2", "network2", "mine", "10.2.0.1", "mine", RuleEndpoint},
		{"registry default beats from_registry", "cluster2", "network2", "", "10.2.0.1", "network2", RuleRegistryDefault},
		{"from_registry beats from_cidr", "vms", "", "", "10.3.0.1", "by-registry", RuleFromRegistry},
		{"from_cidr", "cluster1", "", "", "10.1.0.1", "by-cidr", RuleFromCIDR},
		{"nothing matches", "cluster1", "", "", "192.0.2.1", "", RuleNone},
		{"a DNS name matches no range", "cluster1", "", "", "db.example.com", "", RuleNone},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, rule := placeEndpoint(m.Snapshot(), tt.own, tt.def, tt.cluster, tt.address)
			if n != tt.want || rule != tt.rule {
				t.Errorf("placeEndpoint = %q by %v, want %q by %v", n, rule, tt.want, tt.rule)
			}
		})
	}

	// Build places endpoints by the same rules, and says which.
	tr := &Trace{}
	groups, err := New(w.Agg, m, nil).Endpoints(model.View{}, model.ClusterName(8080, "", meshtest.Echo), tr)
	if err != nil {
		t.Fatal(err)
	}
	var got, rules []string
	for _, g := range groups {
		for _, e := range g.Endpoints {
			got = append(got, e.Address+"="+e.Network)
		}
	}
	for _, e := range tr.Endpoints {
		rules = append(rules, e.Endpoint+" "+e.Rule.String())
	}
	want := []string{"10.1.0.1=by-cidr", "10.1.0.9=network2", "10.2.0.1=network2", "10.2.0.2=network2", "10.2.0.3=network2", "10.3.0.1=by-registry", "10.7.0.1=by-registry"}
	if !slices.Equal(got, want) {
		t.Errorf("Build placed:\n%v\nwant:\n%v", got, want)
	}
	wantRules := []string{
		"10.1.0.1:8080 4: from_cidr", "10.1.0.9:8080 1: the endpoint's own network",
		"10.2.0.1:8080 2: the registry's default network", "10.2.0.2:8080 2: the registry's default network", "10.2.0.3:8080 2: the registry's default network",
		"10.3.0.1:8080 3: from_registry", "10.7.0.1:8080 3: from_registry",
	}
	if !slices.Equal(rules, wantRules) {
		t.Errorf("traced rules:\n%v\nwant:\n%v", rules, wantRules)
	}
}

// TestRouterDecision: what an east-west gateway forwards to.
func TestRouterDecision(t *testing.T) {
	gw1 := model.View{Kind: model.KindRouter, Network: "network1", Networks: "network1"}
	for _, tt := range []struct {
		view    model.View
		network string
		tls     sdk.TLSMode
		want    Decision
	}{
		{gw1, "network1", sdk.TLSModeIstio, Forwarded},
		{gw1, "", sdk.TLSModeIstio, Forwarded},
		{gw1, "network1", sdk.TLSModeDisabled, DroppedPlain},
		{gw1, "network2", sdk.TLSModeIstio, DroppedView},
		{model.View{Kind: model.KindRouter, Network: "network1"}, "network2", sdk.TLSModeIstio, DroppedRemote},
		{model.View{Kind: model.KindRouter}, "network2", sdk.TLSModeIstio, Forwarded},
	} {
		if got := routerDecision(tt.view, tt.network, "10.0.0.1", tt.tls); got != tt.want {
			t.Errorf("%v, endpoint on %q tls %v: %v, want %v", tt.view, tt.network, tt.tls, got, tt.want)
		}
	}
}

// TestMissingClusters: a cluster a view cannot have is an error that says
// why, never an empty result.
func TestMissingClusters(t *testing.T) {
	w, m := meshtest.ThreeNetworks(t)
	w.Upsert("east", "cluster1", &registryv1.Service{Hostname: "db.example.com", Resolution: registryv1.Resolution_RESOLUTION_DNS,
		Ports: []*registryv1.Port{{Name: "tcp", Number: 5432}}})
	p := New(w.Agg, m, nil)
	router := model.View{Kind: model.KindRouter, Network: "network1"}
	for _, tt := range []struct {
		view model.View
		name string
		want error
	}{
		{model.View{}, model.SNIClusterName(8080, "", meshtest.Echo), ErrClusterName},
		{router, model.ClusterName(8080, "", meshtest.Echo), ErrClusterName},
		{model.View{}, model.ClusterName(8080, "", "nope.example.com"), ErrNoService},
		{model.View{}, model.ClusterName(5432, "", "db.example.com"), ErrNotStatic},
		{router, model.SNIClusterName(9999, "", meshtest.Echo), ErrNoPort},
	} {
		if _, err := p.Endpoints(tt.view, tt.name, &Trace{}); !errors.Is(err, tt.want) {
			t.Errorf("%s for %s: %v, want %v", tt.name, tt.view, err, tt.want)
		}
	}
}
