package pipeline

import (
	"testing"

	"github.com/estuary-mesh/estuary/host/meshtest"
	"github.com/estuary-mesh/estuary/host/model"
	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
)

// TestClusterLocal: an instance that marks a service cluster-local gives
// its endpoints only to views of its cluster; other instances' endpoints
// of the hostname, not so marked, go everywhere.
func TestClusterLocal(t *testing.T) {
	w := meshtest.New(t)
	local := func(cluster string) *registryv1.Service {
		s := meshtest.EchoService(cluster)
		s.ClusterLocal = true
		return s
	}
	w.Add(meshtest.Instance{Plugin: "k1", Cluster: "cluster1", Services: []*registryv1.Service{local("cluster1")},
		Endpoints: map[string][]*registryv1.Endpoint{meshtest.Echo: {meshtest.Endpoint("10.1.0.1", "", false)}}})
	w.Add(meshtest.Instance{Plugin: "k2", Cluster: "cluster2", Services: []*registryv1.Service{local("cluster2")},
		Endpoints: map[string][]*registryv1.Endpoint{meshtest.Echo: {meshtest.Endpoint("10.2.0.1", "", false)}}})
	w.Add(meshtest.Instance{Plugin: "vm", Cluster: "vms", Services: []*registryv1.Service{meshtest.EchoService("vms")},
		Endpoints: map[string][]*registryv1.Endpoint{meshtest.Echo: {meshtest.Endpoint("10.3.0.1", "", false)}}})
	p := New(w.Agg, w.Manager(""), nil)
	c, ok := ParseCluster(model.KindProxyless, model.ClusterName(8080, "", meshtest.Echo))
	if !ok {
		t.Fatal("cluster name does not parse")
	}
	for _, tc := range []struct {
		cluster string
		want    []string
	}{
		{"cluster1", []string{"10.1.0.1", "10.3.0.1"}},
		{"cluster2", []string{"10.2.0.1", "10.3.0.1"}},
		{"vms", []string{"10.3.0.1"}},
		{"", []string{"10.1.0.1", "10.2.0.1", "10.3.0.1"}}, // no CLUSTER_ID: confined nowhere
	} {
		groups, err := p.Build(&Scratch{}, model.View{Cluster: tc.cluster}, c, nil)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, g := range groups {
			for _, e := range g.Endpoints {
				got = append(got, e.Address)
			}
		}
		if len(got) != len(tc.want) {
			t.Errorf("view cluster %q gets %v, want %v", tc.cluster, got, tc.want)
			continue
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("view cluster %q gets %v, want %v", tc.cluster, got, tc.want)
				break
			}
		}
	}
}
