package network

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
)

// Config is the decoded networks block: the networks of plugins.hcl and of
// an Istio meshNetworks file, merged and validated.
type Config struct {
	// Networks are sorted by name.
	Networks []*Network
	// DNSServers are the resolvers (HOST:PORT) asked for gateways given by
	// DNS name; empty means the nameservers of /etc/resolv.conf.
	DNSServers []string
	// File is the meshNetworks file that was read, if any.
	File string
}

// Network is one network: the rules that place endpoints on it and the
// gateways that reach it from other networks.
type Network struct {
	Name      string
	Endpoints []EndpointRule
	Gateways  []GatewayConfig
	// Range is where the network is declared.
	Range hcl.Range
}

// EndpointRule places endpoints on a network: those of a registry cluster
// (FromRegistry) or those whose IP is in a range (FromCIDR). Exactly one is
// set.
type EndpointRule struct {
	FromRegistry string
	FromCIDR     netip.Prefix
	Range        hcl.Range
}

// GatewayConfig is a gateway written in the config: an address (an IP or a
// DNS name the host resolves) or the name of a service whose external
// addresses are the gateway's, in the registries of the network's
// from_registry rules. Exactly one of Address and RegistryServiceName is set.
type GatewayConfig struct {
	Address             string
	RegistryServiceName string
	Port                uint32
	// Locality is "region/zone/subzone"; it is reported in debug views.
	Locality string
	Range    hcl.Range
}

func (r EndpointRule) String() string {
	if r.FromRegistry != "" {
		return "from_registry " + r.FromRegistry
	}
	return "from_cidr " + r.FromCIDR.String()
}

func (g GatewayConfig) String() string {
	if g.RegistryServiceName != "" {
		return "registry_service_name " + g.RegistryServiceName + " port " + strconv.FormatUint(uint64(g.Port), 10)
	}
	return "address " + net.JoinHostPort(g.Address, strconv.FormatUint(uint64(g.Port), 10))
}

// Equal reports whether two configs place endpoints and gateways the same
// way (positions aside).
func (c *Config) Equal(o *Config) bool {
	if c == nil || o == nil {
		return c == o
	}
	return slices.Equal(c.DNSServers, o.DNSServers) && slices.EqualFunc(c.Networks, o.Networks, func(a, b *Network) bool {
		return a.Name == b.Name &&
			slices.EqualFunc(a.Endpoints, b.Endpoints, func(x, y EndpointRule) bool {
				return x.FromRegistry == y.FromRegistry && x.FromCIDR == y.FromCIDR
			}) &&
			slices.EqualFunc(a.Gateways, b.Gateways, func(x, y GatewayConfig) bool {
				return x.Address == y.Address && x.RegistryServiceName == y.RegistryServiceName && x.Port == y.Port && x.Locality == y.Locality
			})
	})
}

// Network returns the network with the name, or nil.
func (c *Config) Network(name string) *Network {
	if c == nil {
		return nil
	}
	for _, n := range c.Networks {
		if n.Name == name {
			return n
		}
	}
	return nil
}

var networksSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{{Name: "file"}, {Name: "dns_servers"}},
	Blocks:     []hcl.BlockHeaderSchema{{Type: "network", LabelNames: []string{"name"}}},
}

var networkSchema = &hcl.BodySchema{
	Blocks: []hcl.BlockHeaderSchema{{Type: "endpoints"}, {Type: "gateway"}},
}

var endpointsSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{{Name: "from_registry"}, {Name: "from_cidr"}},
}

var gatewaySchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "address"}, {Name: "registry_service_name"}, {Name: "port"}, {Name: "locality"},
	},
}

// Decode reads the body of plugins.hcl's networks block (nil when the
// block is absent) and validates it, together with the meshNetworks file
// it names. filename is plugins.hcl's path: a relative file is read from
// its directory. Every problem is reported, each at its position.
//
//	networks {
//	  file        = "mesh-networks.yaml"   # Istio meshNetworks, unchanged
//	  dns_servers = ["10.0.0.2:53"]        # default: /etc/resolv.conf
//	  network "network1" {
//	    endpoints { from_registry = "cluster1" }
//	    endpoints { from_cidr = "192.168.100.0/22" }
//	    gateway { address = "192.168.100.1"  port = 15443  locality = "us-east-1/us-east-1a" }
//	    gateway { registry_service_name = "istio-eastwestgateway.istio-system.svc.cluster.local"  port = 15443 }
//	  }
//	}
func Decode(body hcl.Body, filename string) (*Config, hcl.Diagnostics) {
	cfg := &Config{}
	if body == nil {
		return cfg, nil
	}
	content, diags := body.Content(networksSchema)
	if a, ok := content.Attributes["dns_servers"]; ok {
		var servers []string
		if d := gohcl.DecodeExpression(a.Expr, nil, &servers); d.HasErrors() {
			diags = append(diags, d...)
		} else {
			for _, s := range servers {
				addr, err := dnsServerAddr(s)
				if err != nil {
					diags = append(diags, errorAt(a.Expr.Range(), "Invalid DNS server", "%q: %v; want an IP, optionally with :PORT.", s, err))
					continue
				}
				cfg.DNSServers = append(cfg.DNSServers, addr)
			}
		}
	}
	for _, b := range content.Blocks {
		n, d := decodeNetwork(b)
		diags = append(diags, d...)
		cfg.Networks = append(cfg.Networks, n)
	}
	if a, ok := content.Attributes["file"]; ok {
		var file string
		if d := gohcl.DecodeExpression(a.Expr, nil, &file); d.HasErrors() {
			diags = append(diags, d...)
		} else {
			if !filepath.IsAbs(file) {
				file = filepath.Join(filepath.Dir(filename), file)
			}
			cfg.File = file
			src, err := os.ReadFile(file)
			if err != nil {
				diags = append(diags, errorAt(a.Expr.Range(), "Cannot read meshNetworks file", "%v.", err))
			} else {
				nets, d := DecodeMeshNetworks(file, src)
				diags = append(diags, d...)
				cfg.Networks = append(cfg.Networks, nets...)
			}
		}
	}
	diags = append(diags, validate(cfg)...)
	slices.SortStableFunc(cfg.Networks, func(a, b *Network) int { return cmp.Compare(a.Name, b.Name) })
	return cfg, diags
}

func decodeNetwork(b *hcl.Block) (*Network, hcl.Diagnostics) {
	n := &Network{Name: b.Labels[0], Range: b.LabelRanges[0]}
	content, diags := b.Body.Content(networkSchema)
	for _, blk := range content.Blocks {
		switch blk.Type {
		case "endpoints":
			r, d := decodeEndpointRule(blk)
			diags = append(diags, d...)
			if r != nil {
				n.Endpoints = append(n.Endpoints, *r)
			}
		case "gateway":
			g, d := decodeGateway(blk)
			diags = append(diags, d...)
			if g != nil {
				n.Gateways = append(n.Gateways, *g)
			}
		}
	}
	return n, diags
}

func decodeEndpointRule(b *hcl.Block) (*EndpointRule, hcl.Diagnostics) {
	content, diags := b.Body.Content(endpointsSchema)
	reg, hasReg := content.Attributes["from_registry"]
	cidr, hasCIDR := content.Attributes["from_cidr"]
	switch {
	case hasReg && hasCIDR:
		return nil, append(diags, errorAt(cidr.NameRange, "Both from_registry and from_cidr are set",
			"An endpoints block takes one of from_registry and from_cidr; write two blocks for both."))
	case !hasReg && !hasCIDR:
		return nil, append(diags, errorAt(b.DefRange, "Empty endpoints block", "Set from_registry = \"CLUSTER\" or from_cidr = \"CIDR\"."))
	}
	var s string
	a := reg
	if hasCIDR {
		a = cidr
	}
	if d := gohcl.DecodeExpression(a.Expr, nil, &s); d.HasErrors() {
		return nil, append(diags, d...)
	}
	if hasReg {
		r, d := endpointRule(s, "", a.Expr.Range(), false)
		return r, append(diags, d...)
	}
	r, d := endpointRule("", s, a.Expr.Range(), false)
	return r, append(diags, d...)
}

// endpointRule checks one rule of either source. istio is set for a rule
// read from Istio's meshNetworks format, where a range with host bits set
// is what Istio accepts (net.ParseCIDR masks it): it is read masked, with a
// warning naming the prefix used. In Estuary's own HCL it is an error, as
// it most likely is a typo.
func endpointRule(fromRegistry, fromCIDR string, rng hcl.Range, istio bool) (*EndpointRule, hcl.Diagnostics) {
	if fromCIDR == "" && fromRegistry == "" {
		return nil, hcl.Diagnostics{errorAt(rng, "Empty endpoints rule", "from_registry and from_cidr must not be empty.")}
	}
	if fromRegistry != "" {
		return &EndpointRule{FromRegistry: fromRegistry, Range: rng}, nil
	}
	p, err := parseCIDR(fromCIDR)
	var hostBits *hostBitsError
	if istio && errors.As(err, &hostBits) {
		r := rng
		return &EndpointRule{FromCIDR: hostBits.masked, Range: rng}, hcl.Diagnostics{{
			Severity: hcl.DiagWarning, Summary: "fromCidr has host bits set",
			Detail:  fmt.Sprintf("%q has host bits set; read as %q, as Istio does.", fromCIDR, hostBits.masked.String()),
			Subject: &r,
		}}
	}
	if err != nil {
		return nil, hcl.Diagnostics{errorAt(rng, "Invalid from_cidr", "%v", err)}
	}
	return &EndpointRule{FromCIDR: p, Range: rng}, nil
}

// hostBitsError is a range whose address is not its network's.
type hostBitsError struct {
	given  string
	masked netip.Prefix
}

func (e *hostBitsError) Error() string {
	return fmt.Sprintf("%q has host bits set; did you mean %q?", e.given, e.masked.String())
}

// parseCIDR accepts a prefix with no host bits set: 192.168.100.1/22 is
// refused with the prefix it probably means, since Istio silently masks it.
func parseCIDR(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not a CIDR range such as 192.168.100.0/22", s)
	}
	if m := p.Masked(); m != p {
		return netip.Prefix{}, &hostBitsError{given: s, masked: m}
	}
	return p, nil
}

func decodeGateway(b *hcl.Block) (*GatewayConfig, hcl.Diagnostics) {
	content, diags := b.Body.Content(gatewaySchema)
	g := &GatewayConfig{Range: b.DefRange}
	str := func(name string, dst *string) {
		if a, ok := content.Attributes[name]; ok {
			diags = append(diags, gohcl.DecodeExpression(a.Expr, nil, dst)...)
		}
	}
	str("address", &g.Address)
	str("registry_service_name", &g.RegistryServiceName)
	str("locality", &g.Locality)
	var rAddr, rName, rPort, rLoc hcl.Range
	if a, ok := content.Attributes["address"]; ok {
		rAddr = a.Expr.Range()
	}
	if a, ok := content.Attributes["registry_service_name"]; ok {
		rName = a.Expr.Range()
	}
	if a, ok := content.Attributes["locality"]; ok {
		rLoc = a.Expr.Range()
	}
	var port float64
	portOK := false
	if a, ok := content.Attributes["port"]; ok {
		rPort = a.Expr.Range()
		d := gohcl.DecodeExpression(a.Expr, nil, &port)
		diags = append(diags, d...)
		portOK = !d.HasErrors()
	}
	if diags.HasErrors() {
		return nil, diags
	}
	_, hasAddr := content.Attributes["address"]
	_, hasName := content.Attributes["registry_service_name"]
	d := checkGateway(g, hasAddr, hasName, port, portOK, b.DefRange, rAddr, rName, rPort, rLoc)
	return g, append(diags, d...)
}

// checkGateway validates a gateway of either source and sets its Port.
func checkGateway(g *GatewayConfig, hasAddr, hasName bool, port float64, hasPort bool, block, rAddr, rName, rPort, rLoc hcl.Range) hcl.Diagnostics {
	var diags hcl.Diagnostics
	switch {
	case hasAddr && hasName:
		diags = append(diags, errorAt(rName, "Both address and registry_service_name are set",
			"A gateway is either an address or a registry service; write two gateways for both."))
	case !hasAddr && !hasName:
		diags = append(diags, errorAt(block, "Gateway without address", "Set address = \"IP or DNS name\" or registry_service_name = \"FQDN\"."))
	case hasAddr:
		if _, err := netip.ParseAddr(g.Address); err != nil {
			if err := checkFQDN(g.Address); err != nil {
				diags = append(diags, errorAt(rAddr, "Invalid gateway address", "%q is neither an IP address nor a fully qualified DNS name: %v.", g.Address, err))
			}
		}
	case hasName:
		if err := checkFQDN(g.RegistryServiceName); err != nil {
			diags = append(diags, errorAt(rName, "Invalid registry_service_name", "%q is not a fully qualified service hostname (NAME.NAMESPACE.svc.DOMAIN): %v.", g.RegistryServiceName, err))
		}
	}
	switch {
	case !hasPort:
		diags = append(diags, errorAt(block, "Missing gateway port", "Set port, usually 15443."))
	case port < 1 || port > math.MaxUint16 || port != math.Trunc(port):
		diags = append(diags, errorAt(rPort, "Invalid gateway port", "%v is not a port number between 1 and 65535.", port))
	default:
		g.Port = uint32(port)
	}
	if g.Locality != "" {
		if parts := strings.Split(g.Locality, "/"); len(parts) > 3 || slices.Contains(parts, "") {
			diags = append(diags, errorAt(rLoc, "Invalid locality", "%q is not REGION[/ZONE[/SUBZONE]].", g.Locality))
		}
	}
	return diags
}

// checkFQDN accepts a DNS name of at least two labels, with an optional
// trailing dot.
func checkFQDN(s string) error {
	name := strings.TrimSuffix(s, ".")
	if name == "" {
		return fmt.Errorf("empty name")
	}
	if len(name) > 253 {
		return fmt.Errorf("longer than 253 characters")
	}
	labels := strings.Split(name, ".")
	if len(labels) < 2 {
		return fmt.Errorf("a single label; a fully qualified name has a domain")
	}
	for _, l := range labels {
		if l == "" || len(l) > 63 {
			return fmt.Errorf("label %q must have 1 to 63 characters", l)
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return fmt.Errorf("label %q starts or ends with '-'", l)
		}
		for _, c := range l {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return fmt.Errorf("label %q has the character %q", l, c)
			}
		}
	}
	if _, err := strconv.Atoi(labels[len(labels)-1]); err == nil {
		return fmt.Errorf("the last label is numeric")
	}
	return nil
}

// validate checks what spans networks: names, CIDR overlaps, registries
// and gateways claimed twice. Istio only warns about these and lets map
// order decide; here each is an error at the later position, naming the
// earlier one.
func validate(cfg *Config) hcl.Diagnostics {
	var diags hcl.Diagnostics
	type seenCIDR struct {
		network string
		rule    EndpointRule
	}
	names := map[string]*Network{}
	registries := map[string]seenCIDR{}
	var cidrs []seenCIDR
	gateways := map[string]seenCIDR{}
	for _, n := range cfg.Networks {
		if n.Name == "" {
			diags = append(diags, errorAt(n.Range, "Empty network name", "Give the network a name, such as \"network1\"."))
		}
		if prev, dup := names[n.Name]; dup {
			diags = append(diags, errorAt(n.Range, "Duplicate network", "Network %q is already declared at %s.", n.Name, position(prev.Range)))
			continue
		}
		names[n.Name] = n
		hasRegistry := false
		for _, r := range n.Endpoints {
			if r.FromRegistry != "" {
				hasRegistry = true
				if prev, dup := registries[r.FromRegistry]; dup && prev.network != n.Name {
					diags = append(diags, errorAt(r.Range, "Registry in two networks",
						"from_registry %q is already in network %q at %s; a registry's endpoints are on one network.", r.FromRegistry, prev.network, position(prev.rule.Range)))
					continue
				}
				registries[r.FromRegistry] = seenCIDR{n.Name, r}
				continue
			}
			for _, prev := range cidrs {
				if prev.network != n.Name && prev.rule.FromCIDR.Overlaps(r.FromCIDR) {
					diags = append(diags, errorAt(r.Range, "Overlapping CIDR ranges",
						"from_cidr %s overlaps %s of network %q at %s; an address must belong to one network.", r.FromCIDR, prev.rule.FromCIDR, prev.network, position(prev.rule.Range)))
				}
			}
			cidrs = append(cidrs, seenCIDR{n.Name, r})
		}
		for _, g := range n.Gateways {
			if g.RegistryServiceName != "" && !hasRegistry {
				diags = append(diags, errorAt(g.Range, "registry_service_name without from_registry",
					"Network %q has no endpoints { from_registry = ... } rule, so there is no registry to find %q in.", n.Name, g.RegistryServiceName))
			}
			if g.Address == "" || g.Port == 0 {
				continue
			}
			key := net.JoinHostPort(g.Address, strconv.FormatUint(uint64(g.Port), 10))
			if prev, dup := gateways[key]; dup && prev.network != n.Name {
				diags = append(diags, errorAt(g.Range, "Gateway in two networks",
					"Gateway %s is already a gateway of network %q at %s; a gateway leads into one network.", key, prev.network, position(prev.rule.Range)))
				continue
			}
			gateways[key] = seenCIDR{network: n.Name, rule: EndpointRule{Range: g.Range}}
		}
	}
	return diags
}

// dnsServerAddr normalises a DNS server to IP:PORT (port 53 by default).
func dnsServerAddr(s string) (string, error) {
	if ip, err := netip.ParseAddr(s); err == nil {
		return netip.AddrPortFrom(ip, 53).String(), nil
	}
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return "", fmt.Errorf("not IP or IP:PORT")
	}
	return ap.String(), nil
}

func errorAt(rng hcl.Range, summary, detail string, args ...any) *hcl.Diagnostic {
	r := rng
	return &hcl.Diagnostic{Severity: hcl.DiagError, Summary: summary, Detail: fmt.Sprintf(detail, args...), Subject: &r}
}

// position renders where a range starts as FILE:LINE:COL.
func position(r hcl.Range) string {
	return fmt.Sprintf("%s:%d:%d", r.Filename, r.Start.Line, r.Start.Column)
}
