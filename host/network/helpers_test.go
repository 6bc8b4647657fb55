package network_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/estuary-mesh/estuary/host/meshtest"
	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/host/network"
	"github.com/estuary-mesh/estuary/host/pipeline"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// received is what a view receives for echo's port 8080 through the
// endpoint pipeline: the effect of the manager's networks and gateways.
func received(t *testing.T, w *meshtest.World, m *network.Manager, v model.View) string {
	t.Helper()
	groups, err := pipeline.New(w.Agg, m, nil).Endpoints(v, model.ClusterName(8080, "", echo), nil)
	if err != nil {
		t.Fatal(err)
	}
	return meshtest.Render(groups)
}
