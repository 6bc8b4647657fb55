package pipeline

import (
	"strings"
	"testing"

	"github.com/estuary-mesh/estuary/host/meshtest"
	"github.com/estuary-mesh/estuary/host/model"
	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
	"github.com/estuary-mesh/estuary/sdk"
)

// istioRule is the failover rule of Istio's own tests of
// applyLocalityFailover, whose client is region1/zone1/subzone1.
var istioRule = []FailoverRule{{From: "region1", To: "region2"}}

// TestRawPriorityIsIstios holds rawPriority to Istio's table: 0 for the
// same subzone, 1 the same zone, 2 the same region, 3 another region (the
// failover rule's, or any without a rule for the client's region), 4 a
// region other than the rule's.
func TestRawPriorityIsIstios(t *testing.T) {
	client := sdk.ParseLocality("region1/zone1/subzone1")
	tests := []struct {
		ep    string
		rules []FailoverRule
		want  int
	}{
		{"region1/zone1/subzone1", istioRule, 0},
		{"region1/zone1/subzone2", istioRule, 1},
		{"region1/zone1", istioRule, 1}, // no subzone is another subzone
		{"region1/zone2/subzone1", istioRule, 2},
		{"region2/zone1/subzone1", istioRule, 3},
		{"region3/zone1/subzone1", istioRule, 4},
		{"", istioRule, 4}, // no locality: another region, not the rule's
		{"region3/zone1/subzone1", nil, 3},
		{"", nil, 3},
		// A rule for another client region does not apply.
		{"region3/zone1", []FailoverRule{{From: "region9", To: "region2"}}, 3},
		// The first rule for the client's region decides.
		{"region3/zone1", []FailoverRule{{From: "region1", To: "region3"}, {From: "region1", To: "region2"}}, 3},
	}
	for _, tt := range tests {
		got, why := rawPriority(client, sdk.ParseLocality(tt.ep), tt.rules, true)
		if got != tt.want {
			t.Errorf("endpoint %q, rules %v: raw priority %d (%s), want %d", tt.ep, tt.rules, got, why, tt.want)
		}
	}
	// A client with no subzone matches endpoints with none at 0.
	if got, _ := rawPriority(sdk.ParseLocality("region1/zone1"), sdk.ParseLocality("region1/zone1"), nil, false); got != 0 {
		t.Errorf("region1/zone1 to itself: %d, want 0", got)
	}
}

// localityWorld serves echo from one endpoint in each locality given, in
// cluster1 on one network; endpoint i has address 10.0.0.i+1.
func localityWorld(t *testing.T, lf registryv1.LocalityFailover, localities ...string) *Pipeline {
	w := meshtest.New(t)
	svc := meshtest.EchoService("cluster1")
	svc.LocalityFailover = lf
	var eps []*registryv1.Endpoint
	for i, l := range localities {
		e := meshtest.Endpoint("10.0.0."+string(rune('1'+i)), "", true)
		e.Locality = l
		eps = append(eps, e)
	}
	w.Add(meshtest.Instance{Plugin: "static", Cluster: "cluster1", Services: []*registryv1.Service{svc},
		Endpoints: map[string][]*registryv1.Endpoint{meshtest.Echo: eps}})
	return New(w.Agg, nil, nil)
}

func priorities(t *testing.T, p *Pipeline, v model.View) string {
	t.Helper()
	groups, err := p.Endpoints(v, "outbound|8080||"+meshtest.Echo, nil)
	if err != nil {
		t.Fatal(err)
	}
	var b []string
	for _, g := range groups {
		b = append(b, g.Locality+"="+string(rune('0'+g.Priority)))
	}
	return strings.Join(b, " ")
}

// TestPrioritiesFollowIstio runs Build over Istio's test fixtures and
// checks the priorities sent: consecutive from 0, the groups in
// priority order.
func TestPrioritiesFollowIstio(t *testing.T) {
	client := model.View{Kind: model.KindProxyless, Locality: "region1/zone1/subzone1"}
	on := LocalityPolicy{Enabled: true, Failover: istioRule}
	tests := []struct {
		name       string
		localities []string
		lf         registryv1.LocalityFailover
		policy     LocalityPolicy
		view       model.View
		want       string
	}{{
		name:       "all priorities",
		localities: []string{"region3/zone1/subzone1", "region2/zone1/subzone1", "region1/zone2/subzone1", "region1/zone1/subzone2", "region1/zone1/subzone1"},
		policy:     on, view: client,
		want: "region1/zone1/subzone1=0 region1/zone1/subzone2=1 region1/zone2/subzone1=2 region2/zone1/subzone1=3 region3/zone1/subzone1=4",
	}, {
		name:       "priorities with gaps are made consecutive",
		localities: []string{"region2/zone1/subzone1", "region1/zone1/subzone2"},
		policy:     on, view: client,
		want: "region1/zone1/subzone2=0 region2/zone1/subzone1=1",
	}, {
		name:       "an endpoint without locality comes after the rule's region",
		localities: []string{"", "region2/zone1/subzone1", "region1/zone1/subzone2"},
		policy:     on, view: client,
		want: "region1/zone1/subzone2=0 region2/zone1/subzone1=1 =2",
	}, {
		name:       "without rules every other region shares a priority",
		localities: []string{"region3/zone1", "region2/zone1", "region1/zone1/subzone1"},
		policy:     LocalityPolicy{Enabled: true}, view: client,
		want: "region1/zone1/subzone1=0 region2/zone1=1 region3/zone1=1",
	}, {
		name:       "mesh off, the service opts in",
		localities: []string{"region2/zone1", "region1/zone1/subzone1"},
		lf:         registryv1.LocalityFailover_LOCALITY_FAILOVER_ON,
		policy:     LocalityPolicy{Failover: istioRule}, view: client,
		want: "region1/zone1/subzone1=0 region2/zone1=1",
	}, {
		name:       "mesh on, the service opts out",
		localities: []string{"region2/zone1", "region1/zone1/subzone1"},
		lf:         registryv1.LocalityFailover_LOCALITY_FAILOVER_OFF,
		policy:     on, view: client,
		want: "region1/zone1/subzone1=0 region2/zone1=0",
	}, {
		name:       "a view without locality: one priority",
		localities: []string{"region2/zone1", "region1/zone1/subzone1"},
		policy:     on, view: model.View{Kind: model.KindProxyless},
		want: "region1/zone1/subzone1=0 region2/zone1=0",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := localityWorld(t, tt.lf, tt.localities...)
			p.SetLocality(tt.policy)
			if got := priorities(t, p, tt.view); got != tt.want {
				t.Errorf("got  %s\nwant %s", got, tt.want)
			}
		})
	}
}

// TestGatewaysKeepTheirLocalityPriority: endpoints on another network,
// replaced by their network's gateway, keep the priority of their
// locality. The gateway stands in once per locality group, with the
// weights of that group's endpoints only, so a zone's failover is not
// blurred into another zone's share.
func TestGatewaysKeepTheirLocalityPriority(t *testing.T) {
	w := meshtest.New(t)
	ep := func(addr, network, locality string, weight uint32) *registryv1.Endpoint {
		e := meshtest.Endpoint(addr, network, true)
		e.Locality, e.Weight = locality, weight
		return e
	}
	w.Add(meshtest.Instance{Plugin: "east", Cluster: "cluster1", DefaultNetwork: "network1",
		Services: []*registryv1.Service{meshtest.EchoService("cluster1")},
		Endpoints: map[string][]*registryv1.Endpoint{meshtest.Echo: {
			ep("10.1.0.1", "", "region2/zone1", 0),
		}}})
	w.Add(meshtest.Instance{Plugin: "west", Cluster: "cluster2", DefaultNetwork: "network2",
		Services: []*registryv1.Service{meshtest.EchoService("cluster2")},
		Endpoints: map[string][]*registryv1.Endpoint{meshtest.Echo: {
			ep("10.2.0.1", "", "region1/zone1", 1),
			ep("10.2.0.2", "", "region1/zone1", 2),
			ep("10.2.0.3", "", "region2/zone1", 3),
		}},
		Gateways: []*registryv1.NetworkGateway{meshtest.Gateway("network2", "cluster2", "192.168.2.1", 15443)}})
	p := New(w.Agg, w.Manager(""), nil)
	p.SetLocality(LocalityPolicy{Enabled: true})
	v := model.View{Kind: model.KindProxyless, Network: "network1", Cluster: "cluster1", Locality: "region1/zone1"}
	tr := &Trace{}
	groups, err := p.Endpoints(v, "outbound|8080||"+meshtest.Echo, tr)
	if err != nil {
		t.Fatal(err)
	}
	// One gateway: scale factor 1. region1/zone1 is all remote: the
	// gateway gets 1 + 2 = 3, at the client's own zone's priority, 0.
	// region2/zone1: the local endpoint (unset, 1) and the gateway for
	// 10.2.0.3 alone (3), at priority 1.
	want := `locality=region1/zone1 priority=0 weight=3
  192.168.2.1:15443 w=3 net=network2 cluster=cluster2 tls=istio
locality=region2/zone1 priority=1 weight=4
  10.1.0.1:8080 w=1 net=network1 cluster=cluster1 tls=istio
  192.168.2.1:15443 w=3 net=network2 cluster=cluster2 tls=istio
`
	if got := meshtest.Render(groups); got != want {
		t.Errorf("got:\n%swant:\n%s", got, want)
	}
	// The trace says the same, in the order sent, with the reasons.
	var res []string
	for _, r := range tr.Result {
		res = append(res, r.Endpoint+"@"+string(rune('0'+r.Priority)))
	}
	if got, want := strings.Join(res, " "), "192.168.2.1:15443@0 10.1.0.1:8080@1 192.168.2.1:15443@1"; got != want {
		t.Errorf("trace result %s, want %s", got, want)
	}
	if tr.ClientLocality != "region1/zone1" || len(tr.Priorities) != 2 ||
		tr.Priorities[0].Match != "same region, zone and subzone" || tr.Priorities[1].Match != "another region" || tr.Priorities[1].Raw != 3 {
		t.Errorf("trace priorities for %q: %+v", tr.ClientLocality, tr.Priorities)
	}
}
