// Package static is the registry of services, endpoints and gateways written
// by hand inside the plugin's HCL `config { }` block. One plugin block is one
// instance, with Provider "Static" and the block's `cluster` as Cluster; two
// clusters take two blocks (`plugin "east" { bundled = "static" ... }`).
package static

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"sync"

	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/istio"
)

// Version of the plugin.
const Version = "0.1.0"

// Factory builds the plugin.
func Factory(rt sdk.Runtime) sdk.Plugin { return &plugin{state: rt.State} }

type plugin struct {
	state *sdk.State
	mu    sync.Mutex
	id    sdk.InstanceID // current instance, zero before the first Configure
	// built are the services of the last accepted block, so that a reload
	// builds only those that changed.
	built *builtServices
}

// builtServices holds each service built from a block, by its JSON and
// the cluster it was built for: a service's result depends on nothing
// else. Only services built without a diagnostic are kept.
type builtServices struct {
	cluster  string
	services map[string]builtService
}

type builtService struct {
	svc *sdk.Service
	eps []sdk.Endpoint
}

var _ sdk.Plugin = (*plugin)(nil)

func (p *plugin) Describe(context.Context, *sdk.DescribeRequest) (*sdk.DescribeResponse, error) {
	return &sdk.DescribeResponse{
		Name:         "static",
		Version:      Version,
		Capabilities: []sdk.Capability{sdk.CapabilityReconfigure, sdk.CapabilityGateways, sdk.CapabilityInstanceSet},
		ConfigSchema: schema,
	}, nil
}

var endpointSchema = sdk.Schema{Attributes: []sdk.Attribute{
	{Name: "address", Type: "string", Required: true, Description: "IP address (or DNS name for DNS resolution)"},
	{Name: "ports", Type: "map(number)", Description: "service port name to target port"},
	{Name: "labels", Type: "map(string)"},
	{Name: "locality", Type: "string", Description: "region/zone/subzone"},
	{Name: "weight", Type: "number"},
	{Name: "tls_mode", Type: "string", Description: `"istio" or "disabled"`},
	{Name: "network", Type: "string", Description: "overrides the registry's network"},
	{Name: "service_account", Type: "string"},
	{Name: "healthy", Type: "bool", Description: "false marks the endpoint unhealthy"},
	{Name: "name", Type: "string", Description: "workload name, for debugging"},
}}

var schema = &sdk.Schema{
	Attributes: []sdk.Attribute{
		{Name: "cluster", Type: "string", Description: "the instance's cluster identity; defaults to mesh.cluster_id"},
		{Name: "network", Type: "string", Description: "default network of the endpoints; default mesh.network when cluster is mesh.cluster_id, else none (the networks block decides)"},
	},
	Blocks: []sdk.Block{
		{TypeName: "service", Labels: []string{"hostname"}, Body: sdk.Schema{
			Attributes: []sdk.Attribute{
				{Name: "namespace", Type: "string"},
				{Name: "name", Type: "string", Description: "short name; defaults to the hostname's first label"},
				{Name: "addresses", Type: "list(string)", Description: "virtual IPs in this cluster"},
				{Name: "resolution", Type: "string", Description: "STATIC (default), NONE, DNS or DNS_ROUND_ROBIN"},
				{Name: "mesh_external", Type: "bool"},
				{Name: "labels", Type: "map(string)"},
				{Name: "export_to", Type: "list(string)"},
				{Name: "mtls_mode", Type: "string", Description: "STRICT, PERMISSIVE or DISABLE: this service's workload mTLS mode, over mesh.mtls"},
				{Name: "locality_failover", Type: "bool", Description: "overrides mesh.locality_failover for this service: clients get its endpoints in priorities by locality"},
			},
			Blocks: []sdk.Block{
				{TypeName: "port", Labels: []string{"name"}, Body: sdk.Schema{Attributes: []sdk.Attribute{
					{Name: "number", Type: "number", Required: true},
					{Name: "protocol", Type: "string", Description: "Istio's protocol names, any case: HTTP, HTTP2, GRPC, GRPC-Web, HTTPS, TLS, TCP, ... (default TCP)"},
				}}},
				{TypeName: "endpoint", Body: endpointSchema},
			},
		}},
		{TypeName: "gateway", Body: sdk.Schema{Attributes: []sdk.Attribute{
			{Name: "network", Type: "string", Required: true},
			{Name: "address", Type: "string", Required: true},
			{Name: "port", Type: "number", Required: true},
			{Name: "locality", Type: "string"},
			{Name: "cluster", Type: "string", Description: "defaults to the registry's cluster"},
		}}},
	},
}

type config struct {
	Cluster *string `json:"cluster"`
	Network *string `json:"network"`
	// Services are decoded one by one, each only if it changed.
	Services []json.RawMessage `json:"service"`
	Gateways []gatewayConfig   `json:"gateway"`
}

type serviceConfig struct {
	Hostname     string            `json:"hostname"`
	Namespace    *string           `json:"namespace"`
	Name         *string           `json:"name"`
	Addresses    []string          `json:"addresses"`
	Resolution   *string           `json:"resolution"`
	MeshExternal *bool             `json:"mesh_external"`
	Labels       map[string]string `json:"labels"`
	ExportTo     []string          `json:"export_to"`
	MTLSMode     *string           `json:"mtls_mode"`
	Locality     *bool             `json:"locality_failover"`
	Ports        []portConfig      `json:"port"`
	Endpoints    []endpointConfig  `json:"endpoint"`
}

type portConfig struct {
	Name     string  `json:"name"`
	Number   float64 `json:"number"`
	Protocol *string `json:"protocol"`
}

type endpointConfig struct {
	Address        string             `json:"address"`
	Ports          map[string]float64 `json:"ports"`
	Labels         map[string]string  `json:"labels"`
	Locality       *string            `json:"locality"`
	Weight         *float64           `json:"weight"`
	TLSMode        *string            `json:"tls_mode"`
	Network        *string            `json:"network"`
	ServiceAccount *string            `json:"service_account"`
	Healthy        *bool              `json:"healthy"`
	Name           *string            `json:"name"`
}

type gatewayConfig struct {
	Network  string  `json:"network"`
	Address  string  `json:"address"`
	Port     float64 `json:"port"`
	Locality *string `json:"locality"`
	Cluster  *string `json:"cluster"`
}

// Configure replaces the instance with the config's content. It starts no
// goroutine and waits for nothing but its short critical section, and
// gives up at once when ctx has ended.
func (p *plugin) Configure(ctx context.Context, req *sdk.ConfigureRequest) (*sdk.ConfigureResponse, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("static: configure: %w", err)
	}
	var cfg config
	if err := req.Decode(&cfg); err != nil {
		return nil, fmt.Errorf("static: decode config: %w", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	id, props, snap, built, diags := build(&cfg, req.Mesh, p.built)
	if diags.HasErrors() {
		return &sdk.ConfigureResponse{Diagnostics: diags}, nil
	}
	p.built = built
	if p.id != (sdk.InstanceID{}) && p.id != id {
		p.state.RemoveInstance(p.id)
	}
	p.id = id
	p.state.SetInstance(id, props)
	p.state.InstanceSetComplete() // its one instance is the whole set
	if err := p.state.ReplaceInstance(id, snap); err != nil {
		return nil, fmt.Errorf("static: %w", err)
	}
	if err := p.state.SetHealth(id, sdk.InstanceHealth{Healthy: true}); err != nil {
		return nil, err
	}
	if err := p.state.MarkSynced(id); err != nil {
		return nil, err
	}
	return &sdk.ConfigureResponse{Diagnostics: diags}, nil
}

// build converts the config into one instance's snapshot, collecting every
// problem with the path to its attribute. Services prev holds unchanged
// are taken from it; it returns what the next build may take.
func build(cfg *config, mesh sdk.MeshSettings, prev *builtServices) (sdk.InstanceID, sdk.InstanceProperties, sdk.Snapshot, *builtServices, sdk.Diagnostics) {
	var diags sdk.Diagnostics
	cluster := sdk.ValueOr(cfg.Cluster, mesh.ClusterID)
	if prev == nil || prev.cluster != cluster {
		prev = &builtServices{}
	}
	next := &builtServices{cluster: cluster, services: make(map[string]builtService, len(cfg.Services))}
	if cluster == "" {
		diags.Errorf([]string{"cluster"}, "cluster must not be empty")
	}
	id := sdk.InstanceID{Provider: sdk.ProviderStatic, Cluster: cluster}
	props := sdk.InstanceProperties{DefaultNetwork: sdk.ValueOr(cfg.Network, mesh.NetworkOf(cluster))}
	snap := sdk.Snapshot{Endpoints: map[string][]sdk.Endpoint{}}
	seen := map[string]bool{}
	for i, raw := range cfg.Services {
		path := []string{"service", strconv.Itoa(i)}
		b, ok := prev.services[string(raw)]
		if !ok {
			var sc serviceConfig
			if err := json.Unmarshal(raw, &sc); err != nil {
				diags.Errorf(path, "cannot decode the service: %v", err)
				continue
			}
			var sd sdk.Diagnostics
			b.svc, b.eps = buildService(&sc, cluster, path, &sd)
			if len(sd) > 0 {
				diags = append(diags, sd...) // and built again next time, to report them again
			} else {
				next.services[string(raw)] = b
			}
		} else {
			next.services[string(raw)] = b
		}
		if seen[b.svc.Hostname] {
			diags.Errorf(path, "service %q is declared twice", b.svc.Hostname)
			continue
		}
		seen[b.svc.Hostname] = true
		snap.Services = append(snap.Services, b.svc)
		snap.Endpoints[b.svc.Hostname] = b.eps
	}
	for i, gc := range cfg.Gateways {
		path := []string{"gateway", strconv.Itoa(i)}
		port, ok := portNumber(gc.Port)
		if !ok {
			diags.Errorf(at(path, "port"), "gateway port %v is not between 1 and 65535", gc.Port)
		}
		if gc.Address == "" {
			diags.Errorf(at(path, "address"), "gateway address must not be empty")
		}
		snap.Gateways = append(snap.Gateways, sdk.NetworkGateway{
			Network: gc.Network, Cluster: sdk.ValueOr(gc.Cluster, cluster), Address: gc.Address, Port: port,
			Locality: sdk.ParseLocality(sdk.ValueOr(gc.Locality, "")),
		})
	}
	return id, props, snap, next, diags
}

func buildService(sc *serviceConfig, cluster string, path []string, diags *sdk.Diagnostics) (*sdk.Service, []sdk.Endpoint) {
	if sc.Hostname == "" {
		diags.Errorf(path, "service hostname must not be empty")
	}
	svc := &sdk.Service{
		Hostname:     sc.Hostname,
		Namespace:    sdk.ValueOr(sc.Namespace, "default"),
		Name:         sdk.ValueOr(sc.Name, firstLabel(sc.Hostname)),
		Labels:       sc.Labels,
		MeshExternal: sdk.ValueOr(sc.MeshExternal, false),
		ExportTo:     sc.ExportTo,
		// nil follows the mesh: the host resolves it against mesh.locality_failover.
		LocalityFailover: sdk.LocalityFailoverOf(sc.Locality),
	}
	if len(sc.Addresses) > 0 {
		svc.VIPs = map[string][]string{cluster: sc.Addresses}
	}
	for j, a := range sc.Addresses {
		if _, err := netip.ParseAddr(a); err != nil {
			if _, err := netip.ParsePrefix(a); err != nil {
				diags.Errorf(at(path, "addresses", strconv.Itoa(j)), "address %q is not an IP or CIDR", a)
			}
		}
	}
	if sc.MTLSMode != nil {
		m, err := sdk.ParseMTLSMode(*sc.MTLSMode)
		if err != nil || m == sdk.MTLSModeUnset {
			diags.Errorf(at(path, "mtls_mode"), "mtls_mode %q is not one of STRICT, PERMISSIVE, DISABLE", *sc.MTLSMode)
		}
		svc.MTLSMode, svc.MTLSModeSource = m, "attribute mtls_mode"
	}
	if sc.Resolution != nil {
		r, err := sdk.ParseResolution(*sc.Resolution)
		if err != nil {
			diags.Errorf(at(path, "resolution"), "%v", err)
		}
		svc.Resolution = r
	}
	portNames := map[string]bool{}
	for j, pc := range sc.Ports {
		n, ok := portNumber(pc.Number)
		if !ok {
			diags.Errorf(at(path, "port", strconv.Itoa(j), "number"), "port %q: number %v is not between 1 and 65535", pc.Name, pc.Number)
		}
		if portNames[pc.Name] {
			diags.Errorf(at(path, "port", strconv.Itoa(j)), "port %q is declared twice", pc.Name)
		}
		portNames[pc.Name] = true
		proto := istio.TCP
		if pc.Protocol != nil {
			if proto = istio.ParseProtocol(*pc.Protocol); !proto.Known() {
				diags.Errorf(at(path, "port", strconv.Itoa(j), "protocol"), "port %q: unknown protocol %q (known: %s)", pc.Name, *pc.Protocol, istio.KnownProtocols())
			}
		}
		svc.Ports = append(svc.Ports, sdk.Port{Name: pc.Name, Number: n, Protocol: string(proto)})
	}
	eps := make([]sdk.Endpoint, 0, len(sc.Endpoints))
	for j, ec := range sc.Endpoints {
		epath := at(path, "endpoint", strconv.Itoa(j))
		eps = append(eps, buildEndpoint(&ec, svc, portNames, epath, diags))
	}
	return svc, eps
}

func buildEndpoint(ec *endpointConfig, svc *sdk.Service, portNames map[string]bool, path []string, diags *sdk.Diagnostics) sdk.Endpoint {
	ep := sdk.Endpoint{
		Address:        ec.Address,
		Labels:         ec.Labels,
		Network:        sdk.ValueOr(ec.Network, ""),
		Locality:       sdk.ParseLocality(sdk.ValueOr(ec.Locality, "")),
		ServiceAccount: sdk.ValueOr(ec.ServiceAccount, ""),
		WorkloadName:   sdk.ValueOr(ec.Name, ""),
	}
	static := svc.Resolution == sdk.ResolutionStatic || svc.Resolution == sdk.ResolutionPassthrough
	if _, err := netip.ParseAddr(ec.Address); err != nil && static {
		diags.Errorf(at(path, "address"), "endpoint address %q is not an IP address (resolution %s)", ec.Address, svc.Resolution)
	}
	if len(ec.Ports) > 0 {
		ep.TargetPorts = make(map[string]uint32, len(ec.Ports))
	}
	for name, n := range ec.Ports {
		if !portNames[name] {
			diags.Errorf(at(path, "ports"), "endpoint maps port %q, which service %q does not declare", name, svc.Hostname)
		}
		tp, ok := portNumber(n)
		if !ok {
			diags.Errorf(at(path, "ports"), "target port %v for %q is not between 1 and 65535", n, name)
		}
		ep.TargetPorts[name] = tp
	}
	if ec.Weight != nil {
		if *ec.Weight < 0 || *ec.Weight > 1<<32-1 || *ec.Weight != float64(uint32(*ec.Weight)) {
			diags.Errorf(at(path, "weight"), "weight %v is not a whole number between 0 and 4294967295", *ec.Weight)
		}
		ep.Weight = uint32(*ec.Weight)
	}
	if ec.TLSMode != nil {
		m, err := sdk.ParseTLSMode(*ec.TLSMode)
		if err != nil {
			diags.Errorf(at(path, "tls_mode"), "%v", err)
		}
		ep.TLSMode = m
	}
	if ec.Healthy != nil && !*ec.Healthy {
		ep.Health = sdk.HealthUnhealthy
	}
	return ep
}

func portNumber(f float64) (uint32, bool) {
	if f < 1 || f > 65535 || f != float64(uint32(f)) {
		return 0, false
	}
	return uint32(f), true
}

func firstLabel(host string) string {
	for i := range len(host) {
		if host[i] == '.' {
			return host[:i]
		}
	}
	return host
}

// at returns path extended by more, never sharing path's backing array.
func at(path []string, more ...string) []string { return slices.Concat(path, more) }
