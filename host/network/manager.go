package network

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/estuary-mesh/estuary/host/aggregate"
	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/host/replica"
)

// Options tune the manager; the zero value is what production uses.
type Options struct {
	// MinTTL and MaxTTL clamp the TTL of gateway DNS answers (30s and 1h
	// by default). Tests lower MinTTL to see re-resolution quickly.
	MinTTL, MaxTTL time.Duration
	// DNSTimeout bounds one DNS query (2s by default).
	DNSTimeout time.Duration
	// ResolvConf is read for DNS servers when the config names none
	// (/etc/resolv.conf by default).
	ResolvConf string
}

// Gateway is one east-west gateway with a resolved IP.
type Gateway struct {
	Network  string `json:"network"`
	Cluster  string `json:"cluster,omitempty"`
	Address  string `json:"address"`
	Port     uint32 `json:"port"`
	Locality string `json:"locality,omitempty"`
	// Source says where the gateway comes from: the config (with its
	// position), a registry_service_name, or a registry instance.
	Source string `json:"source"`
	// Hostname is the DNS name the address was resolved from, if any.
	Hostname string `json:"hostname,omitempty"`
}

func (g Gateway) String() string {
	return net.JoinHostPort(g.Address, strconv.FormatUint(uint64(g.Port), 10))
}

// same reports whether two gateways are the same for EDS.
func (g Gateway) same(o Gateway) bool {
	return g.Network == o.Network && g.Cluster == o.Cluster && g.Address == o.Address && g.Port == o.Port
}

// Manager is the network manager: it keeps the networks config and the
// gateways that lead into each network, and publishes both as an immutable
// Snapshot. The endpoint pipeline (host/pipeline) reads the snapshot to
// place endpoints on networks and replace remote ones by gateways; the
// manager itself decides nothing about endpoints.
//
// Gateways are the union of the config's `address` gateways, its
// `registry_service_name` gateways and the gateways the registries report;
// gateways given by DNS name are resolved by the host. Whenever networks or
// gateways change, Generation moves on.
//
// The manager is the stage between the aggregate and the xDS server: it
// follows the aggregate and hands every change on to its subscribers only
// after it has recomputed the gateways for it, widened to Full when they
// moved. A change of its own (config, DNS answers) goes on as Full. So a
// subscriber never acts on a registry change before the gateways are
// current.
type Manager struct {
	agg    *aggregate.Registry
	logger hclog.Logger
	res    *resolver
	opts   Options

	mu       sync.Mutex // serialises recomputation
	cfg      *Config
	svcNames map[string]bool // registry_service_name hostnames
	snap     atomic.Pointer[Snapshot]
	gen      atomic.Uint64

	subsMu sync.Mutex
	subs   []func(model.Change)
}

// New builds a manager over the aggregate registry and follows its
// changes. Call Apply with the config and Run to resolve DNS names.
func New(agg *aggregate.Registry, logger hclog.Logger, opts Options) *Manager {
	if opts.MinTTL <= 0 {
		opts.MinTTL = DefaultMinTTL
	}
	if opts.MaxTTL <= 0 {
		opts.MaxTTL = DefaultMaxTTL
	}
	opts.MaxTTL = max(opts.MaxTTL, opts.MinTTL)
	if opts.DNSTimeout <= 0 {
		opts.DNSTimeout = DefaultDNSTimeout
	}
	if opts.ResolvConf == "" {
		opts.ResolvConf = "/etc/resolv.conf"
	}
	m := &Manager{agg: agg, logger: logger.Named("network"), opts: opts, cfg: &Config{}}
	m.res = newResolver(m.logger.Named("dns"), opts.MinTTL, opts.MaxTTL, opts.DNSTimeout, func() { m.recomputeAndPublish("dns answer changed") })
	m.res.setServers(systemDNSServers(opts.ResolvConf))
	agg.Subscribe(m.onRegistryChange)
	m.recompute("start")
	return m
}

// Run resolves gateway DNS names until ctx ends, then returns nil.
func (m *Manager) Run(ctx context.Context) error {
	m.res.run(ctx)
	return nil
}

// Subscribe registers fn to receive every registry change after the
// manager has recomputed gateways for it (Full if they changed), and a Full
// change whenever the config or a DNS answer changes networks or gateways.
// The host's xDS server subscribes here, not to the aggregate.
func (m *Manager) Subscribe(fn func(model.Change)) {
	m.subsMu.Lock()
	defer m.subsMu.Unlock()
	m.subs = append(m.subs, fn)
}

func (m *Manager) publish(c model.Change) {
	m.subsMu.Lock()
	subs := slices.Clone(m.subs)
	m.subsMu.Unlock()
	for _, fn := range subs {
		fn(c)
	}
}

// Apply replaces the networks config. The config must be valid (see
// Decode); on a reload with errors the host keeps the running config by
// not calling Apply.
func (m *Manager) Apply(cfg *Config) {
	if cfg == nil {
		cfg = &Config{}
	}
	servers := cfg.DNSServers
	if len(servers) == 0 {
		servers = systemDNSServers(m.opts.ResolvConf)
	}
	m.res.setServers(servers)
	m.mu.Lock()
	m.cfg = cfg
	m.svcNames = map[string]bool{}
	for _, n := range cfg.Networks {
		for _, g := range n.Gateways {
			if g.RegistryServiceName != "" {
				m.svcNames[strings.TrimSuffix(g.RegistryServiceName, ".")] = true
			}
		}
	}
	m.mu.Unlock()
	m.recomputeAndPublish("config applied")
}

// onRegistryChange recomputes gateways when registries may have changed
// theirs: on a full change (instances or reported gateways changed) or a
// change of a service that a registry_service_name names. Then it hands the
// change on, widened to Full if the gateways moved: every endpoint of a
// remote network may now be reached another way.
func (m *Manager) onRegistryChange(c model.Change) {
	if c.Full || m.namesGateway(c) {
		if m.recompute("registry changed") {
			c.Full = true
		}
	}
	m.publish(c)
}

// namesGateway reports whether a change touches the attributes of a
// service that a registry_service_name names.
func (m *Manager) namesGateway(c model.Change) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for h, attrs := range c.Services {
		if attrs && m.svcNames[h] {
			return true
		}
	}
	return false
}

// recomputeAndPublish recomputes after a change of the manager's own and
// hands it on as Full when anything moved.
func (m *Manager) recomputeAndPublish(reason string) {
	if m.recompute(reason) {
		m.publish(model.Change{Full: true})
	}
}

// recompute rebuilds the snapshot and, when anything that affects what
// clients receive changed, moves the generation on and reports true.
func (m *Manager) recompute(reason string) bool {
	m.mu.Lock()
	s := m.build()
	old := m.snap.Load()
	changed := old == nil || !s.sameAs(old)
	if changed {
		s.gen = m.gen.Add(1)
	} else {
		s.gen = old.gen
	}
	m.snap.Store(s)
	m.res.setNames(s.dnsNames)
	m.mu.Unlock()
	if changed {
		m.logger.Info("networks changed", "reason", reason, "generation", s.gen, "gateways", len(s.gateways), "multi_network", s.multi, "scale_factor", s.scale)
	}
	return changed
}

// Snapshot is an immutable view of networks and gateways: the EDS path
// loads it once per cluster and reads it without locks. A nil Snapshot is
// a mesh without networks config: one network, no gateway.
type Snapshot struct {
	gen        uint64
	cfg        *Config
	byRegistry map[string]string // registry cluster -> network
	cidrs      []cidrRule
	// gateways are sorted by address, then port (then network, cluster),
	// so emitting them in index order emits them sorted.
	gateways     []Gateway
	byNetwork    map[string][]int32
	byNetCluster map[netCluster][]int32
	// pending are networks with configured gateways none of which has an
	// address yet (DNS not answered, LoadBalancer not provisioned): their
	// endpoints are dropped for other networks rather than sent as is.
	pending  map[string]string
	scale    uint32
	multi    bool
	dnsNames []string
	// notes are problems operators should see in /debug/networkz.
	notes []string
}

type cidrRule struct {
	prefix  netip.Prefix
	network string
}

type netCluster struct{ network, cluster string }

// sameAs reports whether two snapshots give every client the same result.
func (s *Snapshot) sameAs(o *Snapshot) bool {
	return s.cfg.Equal(o.cfg) && slices.EqualFunc(s.gateways, o.gateways, Gateway.same) &&
		len(s.pending) == len(o.pending) && samePending(s.pending, o.pending)
}

func samePending(a, b map[string]string) bool {
	for k := range a {
		if _, ok := b[k]; !ok {
			return false
		}
	}
	return true
}

func (m *Manager) build() *Snapshot {
	cfg := m.cfg
	s := &Snapshot{
		cfg: cfg, byRegistry: map[string]string{}, byNetwork: map[string][]int32{},
		byNetCluster: map[netCluster][]int32{}, pending: map[string]string{}, scale: 1,
	}
	for _, n := range cfg.Networks {
		for _, r := range n.Endpoints {
			if r.FromRegistry != "" {
				s.byRegistry[r.FromRegistry] = n.Name
			} else {
				s.cidrs = append(s.cidrs, cidrRule{r.FromCIDR, n.Name})
			}
		}
	}
	// Longest prefix first; overlaps across networks are refused by
	// validation, so the order only matters for speed and determinism.
	slices.SortStableFunc(s.cidrs, func(a, b cidrRule) int { return cmp.Compare(b.prefix.Bits(), a.prefix.Bits()) })

	var cands []Gateway
	wanted := map[string]string{} // network -> why it has no gateway address yet
	instances := m.agg.Store().Instances()
	for _, n := range cfg.Networks {
		for _, g := range n.Gateways {
			src := "config " + position(g.Range)
			if g.Address != "" {
				cands = append(cands, Gateway{Network: n.Name, Address: g.Address, Port: g.Port, Locality: g.Locality, Source: src})
				continue
			}
			found := false
			for _, r := range n.Endpoints {
				if r.FromRegistry == "" {
					continue
				}
				for _, addr := range serviceGatewayAddresses(instances, r.FromRegistry, g.RegistryServiceName) {
					found = true
					cands = append(cands, Gateway{Network: n.Name, Cluster: r.FromRegistry, Address: addr.address, Port: g.Port,
						Locality: g.Locality, Source: fmt.Sprintf("%s registry_service_name %s (%s in cluster %s)", src, g.RegistryServiceName, addr.kind, r.FromRegistry)})
				}
			}
			if !found {
				why := fmt.Sprintf("registry_service_name %s (%s) has no external address or VIP in the registries of network %s yet", g.RegistryServiceName, position(g.Range), n.Name)
				s.notes = append(s.notes, why)
				wanted[n.Name] = why
			}
		}
	}
	for _, in := range instances {
		for _, g := range in.Gateways() {
			if g.Network == "" {
				s.notes = append(s.notes, fmt.Sprintf("instance %s reports gateway %s:%d without a network; ignored", in.Key, g.Address, g.Port))
				continue
			}
			cands = append(cands, Gateway{Network: g.Network, Cluster: g.Cluster, Address: g.Address, Port: g.Port,
				Locality: g.Locality.String(), Source: "registry " + in.Key.String()})
		}
	}
	for _, c := range cands {
		if ip, err := netip.ParseAddr(c.Address); err == nil {
			c.Address = ip.Unmap().String()
			s.gateways = append(s.gateways, c)
			continue
		}
		name := strings.TrimSuffix(strings.ToLower(c.Address), ".")
		if !slices.Contains(s.dnsNames, name) {
			s.dnsNames = append(s.dnsNames, name)
		}
		addrs, ok := m.res.lookup(name)
		if !ok {
			if _, seen := wanted[c.Network]; !seen {
				wanted[c.Network] = fmt.Sprintf("gateway %s (%s) is not resolved yet", c.Address, c.Source)
			}
			continue
		}
		for _, a := range addrs {
			g := c
			g.Hostname, g.Address = c.Address, a.String()
			s.gateways = append(s.gateways, g)
		}
	}
	slices.Sort(s.dnsNames)
	slices.SortStableFunc(s.gateways, func(a, b Gateway) int {
		return cmp.Or(cmp.Compare(a.Address, b.Address), cmp.Compare(a.Port, b.Port), cmp.Compare(a.Network, b.Network), cmp.Compare(a.Cluster, b.Cluster))
	})
	s.gateways = slices.CompactFunc(s.gateways, Gateway.same)
	for i, g := range s.gateways {
		s.byNetwork[g.Network] = append(s.byNetwork[g.Network], int32(i))
		k := netCluster{g.Network, g.Cluster}
		s.byNetCluster[k] = append(s.byNetCluster[k], int32(i))
	}
	for n, why := range wanted {
		if len(s.byNetwork[n]) == 0 {
			s.pending[n] = why
		}
	}
	lcm := uint64(1)
	for _, idx := range s.byNetwork {
		lcm = lcmOf(lcm, uint64(len(idx)))
	}
	for _, idx := range s.byNetCluster {
		lcm = lcmOf(lcm, uint64(len(idx)))
	}
	s.scale = uint32(min(lcm, math.MaxUint32))
	s.multi = len(s.gateways) > 0 || len(s.pending) > 0
	return s
}

type gatewayAddress struct{ address, kind string }

// serviceGatewayAddresses finds the addresses of a registry_service_name
// gateway in the instances of one registry cluster: the service's external
// addresses there (LoadBalancer ingress, externalIPs), which are what other
// networks can reach; only when it has none, its VIPs there, which is how
// registries without load balancers (static, Consul) publish a gateway.
func serviceGatewayAddresses(instances []*replica.Instance, cluster, hostname string) []gatewayAddress {
	hostname = strings.TrimSuffix(hostname, ".")
	var out []gatewayAddress
	for _, in := range instances {
		if in.Key.Cluster != cluster {
			continue
		}
		svc := in.Service(hostname)
		if svc == nil {
			continue
		}
		if ext := svc.ExternalAddresses[cluster]; len(ext) > 0 {
			for _, a := range ext {
				out = append(out, gatewayAddress{a, "external address"})
			}
			continue
		}
		for _, a := range svc.VIPs[cluster] {
			if p, err := netip.ParsePrefix(a); err == nil && p.Bits() != p.Addr().BitLen() {
				continue // a VIP range is not an address
			}
			out = append(out, gatewayAddress{strings.TrimSuffix(a, "/32"), "VIP"})
		}
	}
	return out
}

func lcmOf(a, b uint64) uint64 {
	if b == 0 {
		return a
	}
	x, y := a, b
	for y != 0 {
		x, y = y, x%y
	}
	return min(a/x*b, math.MaxUint32)
}

// Generation changes whenever networks or gateways change.
func (m *Manager) Generation() uint64 { return m.snap.Load().gen }

// MultiNetwork reports whether multi-network is on: there is at least one
// gateway (counting configured gateways whose address is not known yet).
func (m *Manager) MultiNetwork() bool { return m.snap.Load().multi }

// ScaleFactor is the least common multiple of the sizes of every gateway
// group, by network and by network and cluster: endpoint weights are
// multiplied by it so that they split evenly among any group's gateways.
func (m *Manager) ScaleFactor() uint32 { return m.snap.Load().scale }

// Gateways returns the gateways for an endpoint of network in cluster: those
// of the network and cluster, or, when none match both, those of the
// network. They are sorted by address, then port.
func (m *Manager) Gateways(network, cluster string) []Gateway {
	s := m.snap.Load()
	idx, _ := s.SelectGateways(network, cluster)
	out := make([]Gateway, len(idx))
	for i, j := range idx {
		out[i] = s.gateways[j]
	}
	return out
}

// AllGateways returns every gateway, sorted by address, then port.
func (m *Manager) AllGateways() []Gateway { return slices.Clone(m.snap.Load().gateways) }

// Config returns the config in effect.
func (m *Manager) Config() *Config { return m.snap.Load().cfg }

// Snapshot returns the networks and gateways in effect. Read everything
// one decision needs from the same snapshot.
func (m *Manager) Snapshot() *Snapshot { return m.snap.Load() }

// Generation changes whenever networks or gateways change; 0 for nil.
func (s *Snapshot) Generation() uint64 {
	if s == nil {
		return 0
	}
	return s.gen
}

// MultiNetwork reports whether there is at least one gateway, counting
// configured gateways whose address is not known yet.
func (s *Snapshot) MultiNetwork() bool { return s != nil && s.multi }

// ScaleFactor is the least common multiple of the sizes of every gateway
// group (see Manager.ScaleFactor); 1 for nil.
func (s *Snapshot) ScaleFactor() uint32 {
	if s == nil {
		return 1
	}
	return s.scale
}

// RegistryNetwork returns the network whose from_registry names the
// registry cluster. Validation refuses a registry in two networks.
func (s *Snapshot) RegistryNetwork(cluster string) (string, bool) {
	if s == nil {
		return "", false
	}
	n, ok := s.byRegistry[cluster]
	return n, ok
}

// CIDRNetwork returns the network whose from_cidr contains address, which
// must be an IP; a DNS name is in no range. Validation refuses ranges of
// two networks that overlap.
func (s *Snapshot) CIDRNetwork(address string) (string, bool) {
	if s == nil || len(s.cidrs) == 0 {
		return "", false
	}
	ip, err := netip.ParseAddr(address)
	if err != nil {
		return "", false
	}
	ip = ip.Unmap()
	for _, c := range s.cidrs {
		if c.prefix.Contains(ip) {
			return c.network, true
		}
	}
	return "", false
}

// SelectGateways returns, as indexes for Gateway, the gateways for an
// endpoint of network in cluster: those of the network and cluster
// (byCluster), or, when none match both, those of the network. They are
// sorted by address, then port. The slice is shared: do not modify it.
func (s *Snapshot) SelectGateways(network, cluster string) (idx []int32, byCluster bool) {
	if s == nil {
		return nil, false
	}
	if g := s.byNetCluster[netCluster{network, cluster}]; len(g) > 0 {
		return g, true
	}
	return s.byNetwork[network], false
}

// NumGateways is the number of gateways; indexes run from 0 to it.
func (s *Snapshot) NumGateways() int {
	if s == nil {
		return 0
	}
	return len(s.gateways)
}

// Gateway returns gateway i. It is shared: do not modify it.
func (s *Snapshot) Gateway(i int32) *Gateway { return &s.gateways[i] }

// Pending reports why network's configured gateways have no address yet
// (a DNS name not resolved, a LoadBalancer not provisioned), if they have
// none.
func (s *Snapshot) Pending(network string) (string, bool) {
	if s == nil {
		return "", false
	}
	why, ok := s.pending[network]
	return why, ok
}
