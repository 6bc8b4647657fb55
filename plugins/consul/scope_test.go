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
