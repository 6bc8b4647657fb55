package consul

import (
	"slices"
	"testing"

	"github.com/hashicorp/consul/api"
)

// TestScopeHostnames: the default scope keeps today's hostnames; another
// namespace or partition adds Consul Enterprise's DNS labels, so one
// service name in two namespaces is two hostnames.
func TestScopeHostnames(t *testing.T) {
	for _, tc := range []struct {
		sc           scope
		suffix, want string
	}{
		{defaultScope, "service.consul", "web.service.consul"},
		{scope{"default", "team-a"}, "service.consul", "web.service.team-a.ns.consul"},
		{scope{"p1", "default"}, "service.consul", "web.service.p1.ap.consul"},
		{scope{"P1", "Team-A"}, "service.consul", "web.service.team-a.ns.p1.ap.consul"},
		{scope{"default", "team-a"}, "west.consul", "web.team-a.ns.west.consul"},
		{defaultScope, "west.consul", "web.west.consul"},
	} {
		if got := hostname("Web", tc.sc.hostSuffix(tc.suffix)); got != tc.want {
			t.Errorf("%+v with %q: %s, want %s", tc.sc, tc.suffix, got, tc.want)
		}
	}
	if defaultScope.key("web") != "web" || (scope{"default", "team-a"}).key("web") == "web" {
		t.Error("keys: the default scope's must be the service name, another's must differ")
	}
}

// TestScopeQuery: the defaults are never sent (Consul CE refuses them).
func TestScopeQuery(t *testing.T) {
	q := &api.QueryOptions{Namespace: "stale", Partition: "stale"}
	defaultScope.apply(q)
	if q.Namespace != "" || q.Partition != "" {
		t.Errorf("default scope sends ns %q partition %q", q.Namespace, q.Partition)
	}
	scope{"p1", "team-a"}.apply(q)
	if q.Namespace != "team-a" || q.Partition != "p1" {
		t.Errorf("ns %q partition %q", q.Namespace, q.Partition)
	}
}

// TestScopeUnion: "*" adds what the agent lists to what the block
// names, case-insensitively once each, "default" first.
func TestScopeUnion(t *testing.T) {
	if got := union([]string{"zeta"}, []string{"alpha", "default", "ZETA"}); !slices.Equal(got, []string{"default", "alpha", "zeta"}) {
		t.Errorf("union = %v", got)
	}
	if got := union(nil, nil); !slices.Equal(got, []string{"default"}) {
		t.Errorf("empty union = %v, want the default", got)
	}
}

// TestConvertInScope: a service of another namespace is converted as the
// datacenter builds its options: Consul's namespace as the Istio one,
// the scoped hostname, and notices that name the namespace.
func TestConvertInScope(t *testing.T) {
	sc := scope{"p1", "team-a"}
	o := convertOptions{datacenter: "dc1", domainSuffix: sc.hostSuffix("service.consul"), namespace: sc.namespace, scope: inScope(sc)}
	v := convert("web", []*api.ServiceEntry{inst("n1", "10.0.0.1", api.AgentService{Port: 8080, Meta: map[string]string{"protocol": "bogus"}})}, o)
	if v.service == nil || v.service.Hostname != "web.service.team-a.ns.p1.ap.consul" || v.service.Namespace != "team-a" || v.service.Name != "web" {
		t.Fatalf("service %+v", v.service)
	}
	if len(v.notices) != 1 || v.notices[0].Subject != "service web in partition p1, namespace team-a, instance n1/web-n1" {
		t.Errorf("notices %+v", v.notices)
	}
}
