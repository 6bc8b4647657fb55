package consul

import (
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/consul/api"

	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/sdktest"
)

// TestEnterpriseSettingsOnCE: Consul CE refuses every namespace and
// partition parameter. "default" is therefore never sent, so a block
// naming the default namespace and partition works on CE, singular or
// in lists, and "*" finds the default alone (CE has no /v1/namespaces
// or /v1/partitions, and says so with a 404 the plugin recognises).
// Another namespace or partition leaves the instance unhealthy, its
// message naming it and quoting Consul's reason, instead of an empty
// catalog that looks fine, while the block's other namespaces keep
// being served.
func TestEnterpriseSettingsOnCE(t *testing.T) {
	c := startConsul(t)
	register(t, c.Client(), api.AgentServiceRegistration{ID: "web-1", Name: "web", Address: "10.1.0.1", Port: 8080}, api.HealthPassing)

	for _, attrs := range [][]string{
		{`namespace = "default"`, `partition = "default"`},
		{`namespaces = ["default"]`, `partitions = ["default"]`},
		{`namespaces = ["*"]`},
		{`namespaces = ["*"]`, `partitions = ["*"]`},
	} {
		t.Run(strings.Join(attrs, ","), func(t *testing.T) {
			h := sdktest.Start(t, Factory)
			h.Configure(t, agentConfig(c.Addr, attrs...), sdk.MeshSettings{})
			w := h.Watch(t)
			w.WaitFor(t, wait, "web in the default namespace, as without the attributes", func(r *sdktest.Replica) bool {
				healthy, msg, _ := healthOf(r)
				return slices.Equal(endpointsOf(r, "web.service.consul"), []string{"10.1.0.1"}) &&
					healthy && msg == "datacenter dc1: watching 2 services" && dc1(r).Synced // web and consul
			})
			w.With(func(r *sdktest.Replica) {
				if got := keys(dc1(r).Services); !slices.Equal(got, []string{"consul.service.consul", "web.service.consul"}) {
					t.Errorf("services %v, want the default namespace's, named as without the attributes", got)
				}
				if ns := dc1(r).Services["web.service.consul"].Namespace; ns != "default" {
					t.Errorf("namespace %q", ns)
				}
			})
		})
	}

	for _, tc := range []struct{ attrs, want string }{
		{`namespace = "team-a"`, `datacenter dc1: list services of namespace team-a: HTTP 400 Bad Request: Invalid query parameter: "ns" - Namespaces are a Consul Enterprise feature`},
		{`partition = "part-a"`, `datacenter dc1: list services of partition part-a: HTTP 400 Bad Request: Invalid query parameter: "partition" - Partitions are a Consul Enterprise feature`},
		{`namespaces = ["default", "team-a"]`, `datacenter dc1: list services of 1 of 2 namespaces failing, first namespace team-a: HTTP 400 Bad Request: Invalid query parameter: "ns" - Namespaces are a Consul Enterprise feature`},
		{"namespaces = [\"*\", \"team-a\"]\npartitions = [\"default\", \"part-a\"]", `datacenter dc1: list services of 3 of 4 namespaces failing, first namespace team-a: HTTP 400 Bad Request: Invalid query parameter: "ns" - Namespaces are a Consul Enterprise feature`},
	} {
		t.Run(tc.attrs, func(t *testing.T) {
			h := sdktest.Start(t, Factory)
			h.Configure(t, agentConfig(c.Addr, tc.attrs), sdk.MeshSettings{})
			w := h.Watch(t)
			w.WaitFor(t, wait, "dc1 unhealthy, naming the namespace and quoting Consul", func(r *sdktest.Replica) bool {
				healthy, msg, known := healthOf(r)
				return known && !healthy && strings.HasPrefix(msg, tc.want)
			})
			if !strings.Contains(tc.attrs, "default") {
				return
			}
			// The default namespace of the same block is served, and the
			// instance synced, while the others fail.
			w.WaitFor(t, wait, "web of the default namespace served beside the failing ones", func(r *sdktest.Replica) bool {
				return slices.Equal(endpointsOf(r, "web.service.consul"), []string{"10.1.0.1"}) && dc1(r).Synced
			})
			register(t, c.Client(), api.AgentServiceRegistration{ID: "api-1", Name: "api", Address: "10.1.0.2", Port: 9090}, api.HealthPassing)
			t.Cleanup(func() { deregister(t, c.Client(), "api-1") })
			w.WaitFor(t, wait, "a new service of the default namespace, still watched", func(r *sdktest.Replica) bool {
				healthy, msg, _ := healthOf(r)
				return slices.Equal(endpointsOf(r, "api.service.consul"), []string{"10.1.0.2"}) && !healthy && strings.HasPrefix(msg, tc.want)
			})
		})
	}
}
