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
// naming the default namespace and partition works on CE; another
// namespace or partition leaves the instance unhealthy, its message
// quoting Consul's reason, instead of an empty catalog that looks fine.
func TestEnterpriseSettingsOnCE(t *testing.T) {
	c := startConsul(t)
	register(t, c.Client(), api.AgentServiceRegistration{ID: "web-1", Name: "web", Address: "10.1.0.1", Port: 8080}, api.HealthPassing)

	h := sdktest.Start(t, Factory)
	h.Configure(t, agentConfig(c.Addr, `namespace = "default"`, `partition = "default"`), sdk.MeshSettings{})
	w := h.Watch(t)
	w.WaitFor(t, wait, "web in the default namespace", func(r *sdktest.Replica) bool {
		return slices.Equal(endpointsOf(r, "web.service.consul"), []string{"10.1.0.1"})
	})

	for _, tc := range []struct{ attr, want string }{
		{`namespace = "team-a"`, "Namespaces are a Consul Enterprise feature"},
		{`partition = "part-a"`, "Partitions are a Consul Enterprise feature"},
	} {
		t.Run(tc.attr, func(t *testing.T) {
			h := sdktest.Start(t, Factory)
			h.Configure(t, agentConfig(c.Addr, tc.attr), sdk.MeshSettings{})
			w := h.Watch(t)
			w.WaitFor(t, wait, "dc1 unhealthy, quoting Consul", func(r *sdktest.Replica) bool {
				healthy, msg, known := healthOf(r)
				return known && !healthy && strings.Contains(msg, tc.want)
			})
		})
	}
}
