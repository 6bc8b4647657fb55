package network

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"go.yaml.in/yaml/v3"
)

// Istio's meshNetworks file, read unchanged for users migrating from Istio:
//
//	networks:
//	  network1:
//	    endpoints:
//	    - fromRegistry: cluster1
//	    - fromCidr: 192.168.100.0/22
//	    gateways:
//	    - address: 192.168.100.1
//	      port: 15443
//	      locality: us-east-1a
//	    - registryServiceName: istio-eastwestgateway.istio-system.svc.cluster.local
//	      port: 15443
//
// Field names are accepted in both of the spellings Istio's own decoder
// (protobuf JSON) accepts: fromRegistry and from_registry. The file is
// walked as YAML nodes so every problem points at its line and column.

// DecodeMeshNetworks reads a meshNetworks document. The networks it returns
// are checked one by one; what spans networks is checked by Decode.
func DecodeMeshNetworks(filename string, src []byte) ([]*Network, hcl.Diagnostics) {
	var doc yaml.Node
	if err := yaml.Unmarshal(src, &doc); err != nil {
		return nil, hcl.Diagnostics{errorAt(yamlErrorRange(filename, err), "Invalid meshNetworks YAML", "%s.", strings.TrimPrefix(err.Error(), "yaml: "))}
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil, nil // an empty file: no networks
	}
	d := &yamlDecoder{file: filename}
	root := d.deref(doc.Content[0])
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return nil, nil
	}
	var out []*Network
	d.mapping(root, "the meshNetworks document", func(key, val *yaml.Node) {
		if key.Value != "networks" {
			d.unknown(key, "meshNetworks", "networks")
			return
		}
		val = d.deref(val)
		if val.Tag == "!!null" {
			return
		}
		seen := map[string]*yaml.Node{}
		d.mapping(val, "networks", func(k, v *yaml.Node) {
			if prev, dup := seen[k.Value]; dup {
				d.errorf(k, "Duplicate network", "Network %q is already declared at line %d.", k.Value, prev.Line)
				return
			}
			seen[k.Value] = k
			out = append(out, d.network(k, v))
		})
	})
	return out, d.diags
}

type yamlDecoder struct {
	file  string
	diags hcl.Diagnostics
}

func (d *yamlDecoder) rng(n *yaml.Node) hcl.Range {
	p := hcl.Pos{Line: n.Line, Column: n.Column}
	return hcl.Range{Filename: d.file, Start: p, End: p}
}

func (d *yamlDecoder) errorf(n *yaml.Node, summary, detail string, args ...any) {
	d.diags = append(d.diags, errorAt(d.rng(n), summary, detail, args...))
}

func (d *yamlDecoder) deref(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

// mapping calls fn for each key and value of a mapping node.
func (d *yamlDecoder) mapping(n *yaml.Node, what string, fn func(k, v *yaml.Node)) {
	n = d.deref(n)
	if n.Kind != yaml.MappingNode {
		d.errorf(n, "Invalid meshNetworks YAML", "%s must be a mapping, not %s.", what, kindName(n))
		return
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		fn(n.Content[i], n.Content[i+1])
	}
}

func (d *yamlDecoder) sequence(n *yaml.Node, what string, fn func(v *yaml.Node)) {
	n = d.deref(n)
	if n.Tag == "!!null" {
		return
	}
	if n.Kind != yaml.SequenceNode {
		d.errorf(n, "Invalid meshNetworks YAML", "%s must be a list, not %s.", what, kindName(n))
		return
	}
	for _, v := range n.Content {
		fn(d.deref(v))
	}
}

func (d *yamlDecoder) unknown(key *yaml.Node, in string, want ...string) {
	d.errorf(key, "Unknown field", "%s has no field %q (fields: %s).", in, key.Value, strings.Join(want, ", "))
}

func (d *yamlDecoder) str(n *yaml.Node, what string) (string, bool) {
	n = d.deref(n)
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		d.errorf(n, "Invalid meshNetworks YAML", "%s must be a string, not %s.", what, kindName(n))
		return "", false
	}
	return n.Value, true
}

// field maps a key to its canonical (proto) name: Istio's decoder accepts
// the JSON name and the proto name of a field.
func field(key string, names ...string) string {
	for _, n := range names {
		if key == n || key == snakeToCamel(n) {
			return n
		}
	}
	return ""
}

func snakeToCamel(s string) string {
	parts := strings.Split(s, "_")
	for i := 1; i < len(parts); i++ {
		if parts[i] != "" {
			parts[i] = strings.ToUpper(parts[i][:1]) + parts[i][1:]
		}
	}
	return strings.Join(parts, "")
}

func (d *yamlDecoder) network(key, val *yaml.Node) *Network {
	n := &Network{Name: key.Value, Range: d.rng(key)}
	val = d.deref(val)
	if val.Tag == "!!null" {
		return n
	}
	d.mapping(val, fmt.Sprintf("network %q", n.Name), func(k, v *yaml.Node) {
		switch field(k.Value, "endpoints", "gateways") {
		case "endpoints":
			d.sequence(v, "endpoints", func(e *yaml.Node) {
				if r := d.endpointRule(e); r != nil {
					n.Endpoints = append(n.Endpoints, *r)
				}
			})
		case "gateways":
			d.sequence(v, "gateways", func(g *yaml.Node) {
				if gw := d.gateway(g); gw != nil {
					n.Gateways = append(n.Gateways, *gw)
				}
			})
		default:
			d.unknown(k, "a network", "endpoints", "gateways")
		}
	})
	return n
}

func (d *yamlDecoder) endpointRule(n *yaml.Node) *EndpointRule {
	var reg, cidr string
	var regNode, cidrNode *yaml.Node
	ok := true
	d.mapping(n, "an endpoints entry", func(k, v *yaml.Node) {
		switch field(k.Value, "from_registry", "from_cidr") {
		case "from_registry":
			var good bool
			reg, good = d.str(v, "fromRegistry")
			ok = ok && good
			regNode = d.deref(v)
		case "from_cidr":
			var good bool
			cidr, good = d.str(v, "fromCidr")
			ok = ok && good
			cidrNode = d.deref(v)
		default:
			d.unknown(k, "an endpoints entry", "fromRegistry", "fromCidr")
			ok = false
		}
	})
	if !ok {
		return nil
	}
	switch {
	case regNode != nil && cidrNode != nil:
		d.errorf(cidrNode, "Both fromRegistry and fromCidr are set", "An endpoints entry takes one of them; write two entries for both.")
		return nil
	case regNode == nil && cidrNode == nil:
		d.errorf(n, "Empty endpoints entry", "Set fromRegistry or fromCidr.")
		return nil
	}
	at := regNode
	if cidrNode != nil {
		at = cidrNode
	}
	r, diags := endpointRule(reg, cidr, d.rng(at), true)
	d.diags = append(d.diags, diags...)
	return r
}

func (d *yamlDecoder) gateway(n *yaml.Node) *GatewayConfig {
	g := &GatewayConfig{Range: d.rng(n)}
	var hasAddr, hasName, hasPort bool
	var port float64
	var rAddr, rName, rPort, rLoc hcl.Range
	ok := true
	str := func(v *yaml.Node, what string, dst *string) {
		s, good := d.str(v, what)
		*dst = s
		ok = ok && good
	}
	d.mapping(n, "a gateways entry", func(k, v *yaml.Node) {
		v = d.deref(v)
		switch field(k.Value, "address", "registry_service_name", "port", "locality") {
		case "address":
			hasAddr, rAddr = true, d.rng(v)
			str(v, "address", &g.Address)
		case "registry_service_name":
			hasName, rName = true, d.rng(v)
			str(v, "registryServiceName", &g.RegistryServiceName)
		case "locality":
			rLoc = d.rng(v)
			str(v, "locality", &g.Locality)
		case "port":
			rPort = d.rng(v)
			// protobuf JSON accepts a number or a numeric string.
			f, err := strconv.ParseFloat(v.Value, 64)
			if v.Kind != yaml.ScalarNode || err != nil {
				d.errorf(v, "Invalid gateway port", "%q is not a port number.", v.Value)
				ok = false
				return
			}
			port, hasPort = f, true
		default:
			d.unknown(k, "a gateways entry", "address", "registryServiceName", "port", "locality")
			ok = false
		}
	})
	if !ok {
		return nil
	}
	d.diags = append(d.diags, checkGateway(g, hasAddr, hasName, port, hasPort, d.rng(n), rAddr, rName, rPort, rLoc)...)
	return g
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "null"
		}
		return fmt.Sprintf("%q", n.Value)
	}
	return "an empty value"
}

var yamlLine = regexp.MustCompile(`line (\d+)`)

// yamlErrorRange finds the line a YAML syntax error names.
func yamlErrorRange(file string, err error) hcl.Range {
	p := hcl.Pos{Line: 1, Column: 1}
	if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
		p.Line, _ = strconv.Atoi(m[1])
	}
	return hcl.Range{Filename: file, Start: p, End: p}
}

// meshNetworksDoc is the meshNetworks document as Istio writes it.
type meshNetworksDoc struct {
	Networks map[string]meshNetwork `yaml:"networks"`
}

type meshNetwork struct {
	Endpoints []meshEndpoint `yaml:"endpoints"`
	Gateways  []meshGateway  `yaml:"gateways"`
}

type meshEndpoint struct {
	FromCidr     string `yaml:"fromCidr,omitempty"`
	FromRegistry string `yaml:"fromRegistry,omitempty"`
}

type meshGateway struct {
	RegistryServiceName string `yaml:"registryServiceName,omitempty"`
	Address             string `yaml:"address,omitempty"`
	Port                uint32 `yaml:"port"`
	Locality            string `yaml:"locality,omitempty"`
}

// MarshalMeshNetworks writes the config's networks as an Istio meshNetworks
// document, for going back to Istio or comparing with it.
func MarshalMeshNetworks(cfg *Config) ([]byte, error) {
	doc := meshNetworksDoc{Networks: map[string]meshNetwork{}}
	for _, n := range cfg.Networks {
		mn := meshNetwork{Endpoints: []meshEndpoint{}, Gateways: []meshGateway{}}
		for _, r := range n.Endpoints {
			if r.FromRegistry != "" {
				mn.Endpoints = append(mn.Endpoints, meshEndpoint{FromRegistry: r.FromRegistry})
			} else {
				mn.Endpoints = append(mn.Endpoints, meshEndpoint{FromCidr: r.FromCIDR.String()})
			}
		}
		for _, g := range n.Gateways {
			mn.Gateways = append(mn.Gateways, meshGateway{RegistryServiceName: g.RegistryServiceName, Address: g.Address, Port: g.Port, Locality: g.Locality})
		}
		doc.Networks[n.Name] = mn
	}
	out, err := yaml.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("network: marshal meshNetworks: %w", err)
	}
	return out, nil
}
