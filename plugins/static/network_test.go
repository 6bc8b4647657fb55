package static

import (
	"testing"
	"time"

	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/sdktest"
)

// TestMeshNetworkIsTheHostClusterOnly checks that mesh.network is the
// default network of the host's own cluster only: an instance of another
// cluster gets its network from its own config or none (the host's networks
// block then decides), never mesh.network.
func TestMeshNetworkIsTheHostClusterOnly(t *testing.T) {
	mesh := sdk.MeshSettings{DomainSuffix: "cluster.local", ClusterID: "cluster1", Network: "network1"}
	for _, tc := range []struct{ name, config, cluster, want string }{
		{"the host's cluster inherits mesh.network", `cluster = "cluster1"`, "cluster1", "network1"},
		{"cluster unset is the host's cluster", ``, "cluster1", "network1"},
		{"another cluster does not inherit it", `cluster = "cluster2"`, "cluster2", ""},
		{"another cluster keeps its own network", "cluster = \"cluster2\"\nnetwork = \"network2\"", "cluster2", "network2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := sdktest.Start(t, Factory)
			h.Configure(t, tc.config, mesh)
			w := h.Watch(t)
			w.WaitFor(t, 30*time.Second, "the instance", func(r *sdktest.Replica) bool {
				return r.Instance(sdk.ProviderStatic, tc.cluster) != nil
			})
			w.With(func(r *sdktest.Replica) {
				if got := r.Instance(sdk.ProviderStatic, tc.cluster).Properties.DefaultNetwork; got != tc.want {
					t.Errorf("default network = %q, want %q", got, tc.want)
				}
			})
		})
	}
}
