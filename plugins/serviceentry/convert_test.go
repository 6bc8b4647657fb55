package serviceentry

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/estuary-mesh/estuary/sdk"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/convert")

// goldenCluster is the instance cluster of the golden conversions.
const goldenCluster = "cluster1"

// TestConvertGolden converts each testdata/convert/*.yaml file (decoded as
// the directory source does) and compares services, endpoints and notices
// with the .golden file next to it. Run with -update to rewrite them.
func TestConvertGolden(t *testing.T) {
	inputs, err := filepath.Glob("testdata/convert/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(inputs) == 0 {
		t.Fatal("no inputs in testdata/convert")
	}
	for _, in := range inputs {
		name := strings.TrimSuffix(filepath.Base(in), ".yaml")
		t.Run(name, func(t *testing.T) {
			src, err := os.ReadFile(in)
			if err != nil {
				t.Fatal(err)
			}
			st := resolveFile(in, decodeFile(in, src, "default"), nil)
			snap, notices := build(goldenCluster, st.objects)
			got := renderGolden(t, snap, append(st.notices, notices...))
			golden := strings.TrimSuffix(in, ".yaml") + ".golden"
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run the test with -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("conversion of %s differs from %s (run with -update to accept):\n--- got\n%s\n--- want\n%s", in, golden, got, want)
			}
		})
	}
}

// The golden format: readable names instead of enum numbers, endpoints
// under their service.
type goldenView struct {
	Services []goldenService `json:"services"`
	Notices  []sdk.Notice    `json:"notices,omitempty"`
}

type goldenService struct {
	Hostname     string              `json:"hostname"`
	Namespace    string              `json:"namespace"`
	Name         string              `json:"name"`
	Ports        []goldenPort        `json:"ports,omitempty"`
	VIPs         map[string][]string `json:"vips,omitempty"`
	Labels       map[string]string   `json:"labels,omitempty"`
	Resolution   string              `json:"resolution"`
	MeshExternal bool                `json:"meshExternal"`
	ExportTo     []string            `json:"exportTo,omitempty"`
	SANs         []string            `json:"subjectAltNames,omitempty"`
	MTLSMode     string              `json:"mtlsMode,omitempty"`
	MTLSSource   string              `json:"mtlsModeSource,omitempty"`
	// LocalityFailover is "on" or "off"; empty when the mesh decides.
	LocalityFailover string           `json:"localityFailover,omitempty"`
	Endpoints        []goldenEndpoint `json:"endpoints,omitempty"`
}

type goldenPort struct {
	Name     string `json:"name"`
	Number   uint32 `json:"number"`
	Protocol string `json:"protocol"`
}

type goldenEndpoint struct {
	Address        string            `json:"address"`
	TargetPorts    map[string]uint32 `json:"targetPorts,omitempty"`
	Labels         map[string]string `json:"labels,omitempty"`
	Network        string            `json:"network,omitempty"`
	Locality       string            `json:"locality,omitempty"`
	Weight         uint32            `json:"weight,omitempty"`
	TLSMode        string            `json:"tlsMode"`
	ServiceAccount string            `json:"serviceAccount,omitempty"`
	WorkloadName   string            `json:"workloadName,omitempty"`
	Health         string            `json:"health,omitempty"` // only when not healthy
}

func renderGolden(t *testing.T, snap sdk.Snapshot, notices []sdk.Notice) []byte {
	t.Helper()
	sortNotices(notices)
	v := goldenView{Notices: notices}
	for _, s := range snap.Services {
		gs := goldenService{
			Hostname: s.Hostname, Namespace: s.Namespace, Name: s.Name, VIPs: s.VIPs, Labels: s.Labels,
			Resolution: s.Resolution.String(), MeshExternal: s.MeshExternal, ExportTo: s.ExportTo, SANs: s.SubjectAltNames,
			MTLSMode: s.MTLSMode.String(), MTLSSource: s.MTLSModeSource,
		}
		if s.LocalityFailover != sdk.LocalityFailoverMesh {
			gs.LocalityFailover = s.LocalityFailover.String()
		}
		for _, p := range s.Ports {
			gs.Ports = append(gs.Ports, goldenPort{Name: p.Name, Number: p.Number, Protocol: p.Protocol})
		}
		for _, e := range snap.Endpoints[s.Hostname] {
			gs.Endpoints = append(gs.Endpoints, goldenEndpoint{
				Address: e.Address, TargetPorts: e.TargetPorts, Labels: e.Labels, Network: e.Network,
				Locality: e.Locality.String(), Weight: e.Weight, TLSMode: e.TLSMode.String(),
				ServiceAccount: e.ServiceAccount, WorkloadName: e.WorkloadName,
			})
			if e.Health != sdk.HealthHealthy {
				gs.Endpoints[len(gs.Endpoints)-1].Health = e.Health.String()
			}
		}
		v.Services = append(v.Services, gs)
	}
	out, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(out, '\n')
}
