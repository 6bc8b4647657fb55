package consul

import (
	"testing"

	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/sdktest"
)

// TestMeshNetworkIsTheHostClusterOnly checks that mesh.network is the
// default network of the datacenter that is the host's own cluster only:
// another datacenter gets the plugin's network setting or none (the host's
// networks block then decides), never mesh.network.
func TestMeshNetworkIsTheHostClusterOnly(t *testing.T) {
	c := startConsul(t)
	for _, tc := range []struct{ name, meshCluster, extra, want string }{
		{"the host's cluster inherits mesh.network", "dc1", ``, "network1"},
		{"another cluster does not inherit it", "cluster1", ``, ""},
		{"another cluster keeps its own network", "cluster1", `network = "consul-net"`, "consul-net"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := sdktest.Start(t, Factory)
			h.Configure(t, agentConfig(c.Addr, tc.extra), sdk.MeshSettings{DomainSuffix: "cluster.local", ClusterID: tc.meshCluster, Network: "network1"})
			w := h.Watch(t)
			w.WaitFor(t, wait, "the dc1 instance", func(r *sdktest.Replica) bool { return dc1(r) != nil })
			w.With(func(r *sdktest.Replica) {
				if got := dc1(r).Properties.DefaultNetwork; got != tc.want {
					t.Errorf("default network = %q, want %q", got, tc.want)
				}
			})
		})
	}
}
