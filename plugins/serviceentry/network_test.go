package serviceentry

import (
	"fmt"
	"testing"

	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/sdktest"
)

// TestMeshNetworkIsTheHostClusterOnly checks that mesh.network is the
// default network of the host's own cluster only: an instance whose
// cluster_id is another cluster gets its own network setting or none (the
// host's networks block then decides), never mesh.network.
func TestMeshNetworkIsTheHostClusterOnly(t *testing.T) {
	mesh := sdk.MeshSettings{DomainSuffix: "cluster.local", ClusterID: "cluster1", Network: "network1"}
	for _, tc := range []struct{ name, config, cluster, want string }{
		{"the host's cluster inherits mesh.network", `cluster_id = "cluster1"`, "cluster1", "network1"},
		{"cluster_id unset is the host's cluster", ``, "cluster1", "network1"},
		{"another cluster does not inherit it", `cluster_id = "vms"`, "vms", ""},
		{"another cluster keeps its own network", "cluster_id = \"vms\"\nnetwork = \"vm-network\"", "vms", "vm-network"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := sdktest.Start(t, Factory)
			h.Configure(t, fmt.Sprintf("dir = %q\n%s\n", t.TempDir(), tc.config), mesh)
			w := h.Watch(t)
			w.WaitFor(t, wait, "the instance", func(r *sdktest.Replica) bool { return instance(r, tc.cluster) != nil })
			w.With(func(r *sdktest.Replica) {
				if got := instance(r, tc.cluster).Properties.DefaultNetwork; got != tc.want {
					t.Errorf("default network = %q, want %q", got, tc.want)
				}
			})
		})
	}
}
