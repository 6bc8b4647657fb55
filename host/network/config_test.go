package network_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	"sigs.k8s.io/yaml"

	"github.com/estuary-mesh/estuary/host/config"
	"github.com/estuary-mesh/estuary/host/meshtest"
	"github.com/estuary-mesh/estuary/host/network"
)

func TestDecode(t *testing.T) {
	cfg := meshtest.Networks(t, `
  dns_servers = ["10.0.0.2", "[fd00::53]:5353"]
  network "network1" {
    endpoints {
      from_registry = "cluster1"
    }
    endpoints {
      from_cidr = "192.168.100.0/22"
    }
    gateway {
      address  = "192.168.100.1"
      port     = 15443
      locality = "us-east-1/us-east-1a"
    }
    gateway {
      registry_service_name = "istio-eastwestgateway.istio-system.svc.cluster.local"
      port                  = 15443
    }
  }
  network "network0" {
    gateway {
      address = "gw.example.com."
      port    = 443
    }
  }
`)
	got := describe(cfg)
	want := `network0: gateways [address gw.example.com.:443]
network1: endpoints [from_registry cluster1 from_cidr 192.168.100.0/22] gateways [address 192.168.100.1:15443 registry_service_name istio-eastwestgateway.istio-system.svc.cluster.local port 15443]
dns: [10.0.0.2:53 [fd00::53]:5353]
`
	if got != want {
		t.Errorf("decoded:\n%s\nwant:\n%s", got, want)
	}
	if n := cfg.Network("network1"); n == nil || n.Gateways[0].Locality != "us-east-1/us-east-1a" || n.Range.Start.Line != 4 {
		t.Errorf("network1 = %+v", n)
	}
}

// describe renders a config one network a line.
func describe(cfg *network.Config) string {
	var b strings.Builder
	for _, n := range cfg.Networks {
		fmt.Fprintf(&b, "%s:", n.Name)
		if len(n.Endpoints) > 0 {
			fmt.Fprintf(&b, " endpoints %v", n.Endpoints)
		}
		if len(n.Gateways) > 0 {
			fmt.Fprintf(&b, " gateways %v", n.Gateways)
		}
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, "dns: %v\n", cfg.DNSServers)
	return b.String()
}

// TestValidation checks that each problem is reported, at its exact
// position in plugins.hcl (the networks block starts on line 1, so the
// body's first line is line 2).
func TestValidation(t *testing.T) {
	tests := []struct {
		name string
		body string
		want []string
	}{{
		name: "overlapping CIDRs across networks",
		body: `network "a" {
  endpoints { from_cidr = "10.0.0.0/8" }
}
network "b" {
  endpoints { from_cidr = "10.20.0.0/16" }
  endpoints { from_cidr = "172.16.0.0/12" }
}
network "c" {
  endpoints { from_cidr = "172.16.5.0/24" }
}`,
		want: []string{
			`plugins.hcl:6:27: error: Overlapping CIDR ranges: from_cidr 10.20.0.0/16 overlaps 10.0.0.0/8 of network "a" at plugins.hcl:3:27; an address must belong to one network`,
			`plugins.hcl:10:27: error: Overlapping CIDR ranges: from_cidr 172.16.5.0/24 overlaps 172.16.0.0/12 of network "b" at plugins.hcl:7:27; an address must belong to one network`,
		},
	}, {
		name: "overlapping CIDRs inside one network are fine",
		body: `network "a" {
  endpoints { from_cidr = "10.0.0.0/8" }
  endpoints { from_cidr = "10.1.0.0/16" }
}`,
	}, {
		name: "the same from_registry in two networks",
		body: `network "a" {
  endpoints { from_registry = "cluster1" }
}
network "b" {
  endpoints { from_registry = "cluster2" }
  endpoints { from_registry = "cluster1" }
}`,
		want: []string{
			`plugins.hcl:7:31: error: Registry in two networks: from_registry "cluster1" is already in network "a" at plugins.hcl:3:31; a registry's endpoints are on one network`,
		},
	}, {
		name: "bad CIDRs",
		body: `network "a" {
  endpoints { from_cidr = "10.0.0.0/33" }
  endpoints { from_cidr = "192.168.100.1/22" }
  endpoints { from_cidr = "10.0.0.1" }
}`,
		want: []string{
			`plugins.hcl:3:27: error: Invalid from_cidr: "10.0.0.0/33" is not a CIDR range such as 192.168.100.0/22`,
			`plugins.hcl:4:27: error: Invalid from_cidr: "192.168.100.1/22" has host bits set; did you mean "192.168.100.0/22"?`,
			`plugins.hcl:5:27: error: Invalid from_cidr: "10.0.0.1" is not a CIDR range such as 192.168.100.0/22`,
		},
	}, {
		name: "bad endpoints blocks",
		body: `network "a" {
  endpoints {}
  endpoints {
    from_registry = "c1"
    from_cidr     = "10.0.0.0/8"
  }
}`,
		want: []string{
			`plugins.hcl:3:3: error: Empty endpoints block: Set from_registry = "CLUSTER" or from_cidr = "CIDR"`,
			`plugins.hcl:6:5: error: Both from_registry and from_cidr are set: An endpoints block takes one of from_registry and from_cidr; write two blocks for both`,
		},
	}, {
		name: "bad gateways",
		body: `network "a" {
  endpoints { from_registry = "c1" }
  gateway {
    port = 15443
  }
  gateway {
    address = "eastwest"
    port    = 70000
  }
  gateway {
    address = "10.0.0.1"
    port    = 0
  }
  gateway {
    registry_service_name = "istio-eastwestgateway"
    port                  = 15443.5
  }
  gateway {
    address               = "10.0.0.1"
    registry_service_name = "gw.istio-system.svc.cluster.local"
    port                  = 15443
  }
  gateway {
    address  = "gw-.example.com"
    locality = "us//a"
  }
}`,
		want: []string{
			`plugins.hcl:4:3: error: Gateway without address: Set address = "IP or DNS name" or registry_service_name = "FQDN"`,
			`plugins.hcl:8:15: error: Invalid gateway address: "eastwest" is neither an IP address nor a fully qualified DNS name: a single label; a fully qualified name has a domain`,
			`plugins.hcl:9:15: error: Invalid gateway port: 70000 is not a port number between 1 and 65535`,
			`plugins.hcl:13:15: error: Invalid gateway port: 0 is not a port number between 1 and 65535`,
			`plugins.hcl:16:29: error: Invalid registry_service_name: "istio-eastwestgateway" is not a fully qualified service hostname (NAME.NAMESPACE.svc.DOMAIN): a single label; a fully qualified name has a domain`,
			`plugins.hcl:17:29: error: Invalid gateway port: 15443.5 is not a port number between 1 and 65535`,
			`plugins.hcl:21:29: error: Both address and registry_service_name are set: A gateway is either an address or a registry service; write two gateways for both`,
			`plugins.hcl:25:16: error: Invalid gateway address: "gw-.example.com" is neither an IP address nor a fully qualified DNS name: label "gw-" starts or ends with '-'`,
			`plugins.hcl:24:3: error: Missing gateway port: Set port, usually 15443`,
			`plugins.hcl:26:16: error: Invalid locality: "us//a" is not REGION[/ZONE[/SUBZONE]]`,
		},
	}, {
		name: "registry_service_name needs a from_registry",
		body: `network "a" {
  endpoints { from_cidr = "10.0.0.0/8" }
  gateway {
    registry_service_name = "gw.istio-system.svc.cluster.local"
    port                  = 15443
  }
}`,
		want: []string{
			`plugins.hcl:4:3: error: registry_service_name without from_registry: Network "a" has no endpoints { from_registry = ... } rule, so there is no registry to find "gw.istio-system.svc.cluster.local" in`,
		},
	}, {
		name: "one gateway address in two networks",
		body: `network "a" {
  gateway {
    address = "10.0.0.1"
    port    = 15443
  }
}
network "b" {
  gateway {
    address = "10.0.0.1"
    port    = 15443
  }
}`,
		want: []string{
			`plugins.hcl:9:3: error: Gateway in two networks: Gateway 10.0.0.1:15443 is already a gateway of network "a" at plugins.hcl:3:3; a gateway leads into one network`,
		},
	}, {
		name: "duplicate network, unknown argument, bad DNS server",
		body: `dns_servers = ["dns.example.com"]
network "a" {}
network "a" {
  mtu = 1400
}`,
		want: []string{
			`plugins.hcl:2:15: error: Invalid DNS server: "dns.example.com": not IP or IP:PORT; want an IP, optionally with :PORT`,
			`plugins.hcl:5:3: error: Unsupported argument: An argument named "mtu" is not expected here`,
			`plugins.hcl:4:9: error: Duplicate network: Network "a" is already declared at plugins.hcl:3:9`,
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, diags := meshtest.ParseNetworks(tt.body)
			got := lines(config.Format(diags))
			if !slices.Equal(got, tt.want) {
				t.Errorf("got:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}

func lines(s string) []string {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// TestMeshNetworksFile reads Istio's meshNetworks YAML through
// `networks { file = ... }` and checks it against Istio's own decoder.
func TestMeshNetworksFile(t *testing.T) {
	path, err := filepath.Abs("testdata/meshNetworks.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg := meshtest.Networks(t, fmt.Sprintf("file = %q", path))
	want := `network1: endpoints [from_registry cluster1 from_cidr 192.168.100.0/22] gateways [address 192.168.100.1:15443 registry_service_name istio-eastwestgateway.istio-system.svc.cluster.local port 15443]
network2: endpoints [from_registry cluster2 from_cidr 10.20.0.0/16] gateways [address gateway.network2.example.com:443]
vm-network: endpoints [from_cidr 2001:db8::/64] gateways [address [2001:db8::1]:15443]
dns: []
`
	if got := describe(cfg); got != want {
		t.Errorf("decoded:\n%s\nwant:\n%s", got, want)
	}
	if cfg.File != path {
		t.Errorf("File = %q", cfg.File)
	}
	src, _ := os.ReadFile(path)
	if got, want := normalize(t, istioDecode(t, src)), normalizeConfig(cfg); got != want {
		t.Errorf("Istio reads the file as:\n%s\nEstuary as:\n%s", got, want)
	}
}

// TestMeshNetworksRoundTrip: YAML -> config -> YAML -> config gives the
// same config, and Istio's decoder reads what Estuary writes as Estuary
// read the original.
func TestMeshNetworksRoundTrip(t *testing.T) {
	src, err := os.ReadFile("testdata/meshNetworks.yaml")
	if err != nil {
		t.Fatal(err)
	}
	nets, diags := network.DecodeMeshNetworks("meshNetworks.yaml", src)
	if diags.HasErrors() {
		t.Fatal(config.Format(diags))
	}
	first := &network.Config{Networks: nets}
	out, err := network.MarshalMeshNetworks(first)
	if err != nil {
		t.Fatal(err)
	}
	nets2, diags := network.DecodeMeshNetworks("out.yaml", out)
	if diags.HasErrors() {
		t.Fatalf("%s\nin:\n%s", config.Format(diags), out)
	}
	second := &network.Config{Networks: nets2}
	sortNets(first)
	sortNets(second)
	if !first.Equal(second) {
		t.Errorf("round trip changed the config:\n%s\nvs\n%s\nYAML:\n%s", describe(first), describe(second), out)
	}
	if got, want := normalize(t, istioDecode(t, out)), normalize(t, istioDecode(t, src)); got != want {
		t.Errorf("Istio reads the written file as:\n%s\nand the original as:\n%s", got, want)
	}
}

func sortNets(c *network.Config) {
	slices.SortFunc(c.Networks, func(a, b *network.Network) int { return strings.Compare(a.Name, b.Name) })
}

// TestMeshNetworksErrors: problems in the YAML file point at its lines.
func TestMeshNetworksErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name, yaml, hcl string
		want            []string
	}{{
		name: "unknown fields, bad values",
		yaml: `networks:
  network1:
    endpoints:
    - fromRegistry: cluster1
    - fromCIDR: 10.0.0.0/8
    gateways:
    - address: 10.0.0.1
      port: https
    - registryServiceName: gw
      port: 15443
  network2:
    endpoints:
    - fromRegistry: cluster1
    weight: 3
`,
		want: []string{
			`F:5:7: error: Unknown field: an endpoints entry has no field "fromCIDR" (fields: fromRegistry, fromCidr)`,
			`F:8:13: error: Invalid gateway port: "https" is not a port number`,
			`F:9:28: error: Invalid registry_service_name: "gw" is not a fully qualified service hostname (NAME.NAMESPACE.svc.DOMAIN): a single label; a fully qualified name has a domain`,
			`F:14:5: error: Unknown field: a network has no field "weight" (fields: endpoints, gateways)`,
			`F:13:21: error: Registry in two networks: from_registry "cluster1" is already in network "network1" at F:4:21; a registry's endpoints are on one network`,
		},
	}, {
		name: "syntax error",
		yaml: "networks:\n  network1:\n    endpoints: [\n",
		want: []string{`F:3:1: error: Invalid meshNetworks YAML: line 3: did not find expected node content`},
	}, {
		name: "a network in the file and in plugins.hcl, overlapping",
		yaml: `networks:
  network1:
    endpoints:
    - fromCidr: 10.1.0.0/16
`,
		hcl: `network "network1" {
  endpoints { from_cidr = "10.0.0.0/8" }
}
`,
		want: []string{`F:2:3: error: Duplicate network: Network "network1" is already declared at plugins.hcl:2:9`},
	}, {
		// Istio's mesh config reference and Helm values write this; Istio
		// masks it (net.ParseCIDR), so Estuary reads it too, and says so.
		name: "Istio's reference fromCidr with host bits set",
		yaml: `networks:
  network1:
    endpoints:
    - fromCidr: "192.168.0.1/24"
`,
		want: []string{`F:4:17: warning: fromCidr has host bits set: "192.168.0.1/24" has host bits set; read as "192.168.0.0/24", as Istio does`},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := write(strings.ReplaceAll(tt.name, " ", "_")+".yaml", tt.yaml)
			_, diags := meshtest.ParseNetworks(tt.hcl + fmt.Sprintf("file = %q", p))
			got := lines(strings.ReplaceAll(config.Format(diags), p, "F"))
			if !slices.Equal(got, tt.want) {
				t.Errorf("got:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
	p := write("hostbits.yaml", "networks:\n  network1:\n    endpoints:\n    - fromCidr: 192.168.0.1/24\n")
	cfg, diags := meshtest.ParseNetworks(fmt.Sprintf("file = %q", p))
	if diags.HasErrors() || cfg == nil || !strings.Contains(describe(cfg), "from_cidr 192.168.0.0/24") {
		t.Errorf("host bits in meshNetworks: %s, %v", config.Format(diags), cfg)
	}
	_, diags = meshtest.ParseNetworks(`file = "missing.yaml"`)
	if got := config.Format(diags); !strings.HasPrefix(got, "plugins.hcl:2:8: error: Cannot read meshNetworks file: open missing.yaml") {
		t.Errorf("missing file: %s", got)
	}
}

// istioDecode reads meshNetworks YAML the way istiod does: YAML to JSON,
// then protobuf JSON into Istio's own type.
func istioDecode(t *testing.T, src []byte) *meshv1alpha1.MeshNetworks {
	t.Helper()
	js, err := yaml.YAMLToJSON(src)
	if err != nil {
		t.Fatal(err)
	}
	var mn meshv1alpha1.MeshNetworks
	if err := protojson.Unmarshal(js, &mn); err != nil {
		t.Fatalf("Istio's decoder: %v\n%s", err, js)
	}
	return &mn
}

func normalize(t *testing.T, mn *meshv1alpha1.MeshNetworks) string {
	var b strings.Builder
	names := make([]string, 0, len(mn.GetNetworks()))
	for n := range mn.GetNetworks() {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, name := range names {
		n := mn.GetNetworks()[name]
		fmt.Fprintf(&b, "%s:", name)
		for _, e := range n.GetEndpoints() {
			if r := e.GetFromRegistry(); r != "" {
				fmt.Fprintf(&b, " registry=%s", r)
			} else {
				fmt.Fprintf(&b, " cidr=%s", e.GetFromCidr())
			}
		}
		for _, g := range n.GetGateways() {
			fmt.Fprintf(&b, " gw(%s%s port=%d loc=%s)", g.GetAddress(), g.GetRegistryServiceName(), g.GetPort(), g.GetLocality())
		}
		b.WriteByte('\n')
	}
	return b.String()
}

func normalizeConfig(cfg *network.Config) string {
	var b strings.Builder
	for _, n := range cfg.Networks {
		fmt.Fprintf(&b, "%s:", n.Name)
		for _, e := range n.Endpoints {
			if e.FromRegistry != "" {
				fmt.Fprintf(&b, " registry=%s", e.FromRegistry)
			} else {
				fmt.Fprintf(&b, " cidr=%s", e.FromCIDR)
			}
		}
		for _, g := range n.Gateways {
			fmt.Fprintf(&b, " gw(%s%s port=%d loc=%s)", g.Address, g.RegistryServiceName, g.Port, g.Locality)
		}
		b.WriteByte('\n')
	}
	return b.String()
}
