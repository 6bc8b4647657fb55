// Package aggregate merges every registry instance into one view of the
// mesh. Instances are ordered as their plugins are in plugins.hcl, and by
// first appearance within a plugin.
//
// Services with the same hostname merge into one: attributes (namespace,
// ports, resolution, ...) come from the first instance in order; VIPs,
// external addresses and node ports are kept per cluster from every
// instance; endpoints are the union over all instances, each keeping its
// instance. When instances disagree on attributes the first wins and the
// conflict is recorded. Nothing here depends on which provider an instance
// has: what differs between providers is data on the instance.
package aggregate

import (
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/host/replica"
	"github.com/estuary-mesh/estuary/sdk"
)

// Service is a merged service.
type Service struct {
	// Service holds the attributes of the first instance that has the
	// hostname, with VIPs, external addresses and node ports merged per
	// cluster over all instances.
	*sdk.Service
	// Instances are the instances that report the service, in order.
	Instances []replica.InstanceKey
	// Conflicts records where later instances disagree with the first.
	Conflicts []Conflict
}

// Conflict is a disagreement between instances about a service.
type Conflict struct {
	Hostname string              `json:"hostname"`
	Field    string              `json:"field"`
	Winner   replica.InstanceKey `json:"winner"`
	Loser    replica.InstanceKey `json:"loser"`
	Detail   string              `json:"detail"`
}

// EndpointSource is one instance's endpoints of a service.
type EndpointSource struct {
	Instance   *replica.Instance
	Properties sdk.InstanceProperties
	Set        *replica.EndpointSet
}

// Registry is the aggregate view over a replica.Store.
type Registry struct {
	store *replica.Store

	mu     sync.Mutex
	merged map[string]*Service // cache; a missing entry is recomputed
	gen    uint64              // bumped on every invalidation

	// versions count changes per hostname (service or endpoints); epoch
	// is the counter's value at the last full change. Both come from one
	// counter, so HostVersion never repeats for different data.
	versionsMu sync.RWMutex
	counter    uint64
	epoch      uint64
	versions   map[string]uint64

	subsMu sync.Mutex
	subs   []func(model.Change)

	conflicts prometheus.Gauge
}

// New builds the aggregate over store and follows its changes.
func New(store *replica.Store, reg prometheus.Registerer) *Registry {
	r := &Registry{
		store:    store,
		merged:   map[string]*Service{},
		versions: map[string]uint64{},
		conflicts: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "estuary_aggregate_conflicts",
			Help: "Attribute conflicts between instances that report the same hostname (the first instance wins).",
		}),
	}
	if reg != nil {
		reg.MustRegister(r.conflicts)
	}
	store.Subscribe(r.onChange)
	return r
}

// Subscribe registers fn for every change, after the aggregate's own view
// has been updated. In the host the network manager is the one
// subscriber; the xDS server follows the network manager, never the
// aggregate, so it cannot see a change before the gateways account for it.
func (r *Registry) Subscribe(fn func(model.Change)) {
	r.subsMu.Lock()
	defer r.subsMu.Unlock()
	r.subs = append(r.subs, fn)
}

func (r *Registry) onChange(c model.Change) {
	r.versionsMu.Lock()
	r.counter++
	if c.Full {
		r.epoch = r.counter
		clear(r.versions)
	}
	for h := range c.Services {
		r.versions[h] = r.counter
	}
	r.versionsMu.Unlock()
	r.mu.Lock()
	r.gen++
	if c.Full {
		clear(r.merged)
	} else {
		for h, attrs := range c.Services {
			if attrs {
				delete(r.merged, h)
			}
		}
	}
	r.mu.Unlock()
	r.subsMu.Lock()
	subs := slices.Clone(r.subs)
	r.subsMu.Unlock()
	for _, fn := range subs {
		fn(c)
	}
}

// HostVersion changes whenever the service or endpoints of hostname may
// have changed. Read it before reading the data it guards: a change in
// between then only causes a needless rebuild later, never a stale one.
func (r *Registry) HostVersion(hostname string) uint64 {
	r.versionsMu.RLock()
	defer r.versionsMu.RUnlock()
	return max(r.versions[hostname], r.epoch)
}

// Store returns the underlying replica.
func (r *Registry) Store() *replica.Store { return r.store }

// Services returns every merged service, sorted by hostname.
func (r *Registry) Services() []*Service {
	instances := r.store.Instances()
	hosts := map[string]struct{}{}
	for _, in := range instances {
		for _, h := range in.Hostnames() {
			hosts[h] = struct{}{}
		}
	}
	out := make([]*Service, 0, len(hosts))
	for _, h := range slices.Sorted(maps.Keys(hosts)) {
		if s := r.service(h, instances); s != nil {
			out = append(out, s)
		}
	}
	n := 0
	for _, s := range out {
		n += len(s.Conflicts)
	}
	r.conflicts.Set(float64(n))
	return out
}

// GetService returns the merged service with the hostname, or nil.
func (r *Registry) GetService(hostname string) *Service {
	return r.service(hostname, nil)
}

func (r *Registry) service(hostname string, instances []*replica.Instance) *Service {
	r.mu.Lock()
	s, ok := r.merged[hostname]
	gen := r.gen
	r.mu.Unlock()
	if ok {
		return s
	}
	if instances == nil {
		instances = r.store.Instances()
	}
	s = merge(hostname, instances)
	if s != nil {
		r.mu.Lock()
		// A change that arrived while merging may have made s stale.
		if r.gen == gen {
			r.merged[hostname] = s
		}
		r.mu.Unlock()
	}
	return s
}

func merge(hostname string, instances []*replica.Instance) *Service {
	var out *Service
	for _, in := range instances {
		svc := in.Service(hostname)
		if svc == nil {
			continue
		}
		if out == nil {
			cp := *svc
			cp.VIPs = cloneAddrs(svc.VIPs)
			cp.ExternalAddresses = cloneAddrs(svc.ExternalAddresses)
			cp.NodePorts = maps.Clone(svc.NodePorts)
			out = &Service{Service: &cp, Instances: []replica.InstanceKey{in.Key}}
			continue
		}
		out.Instances = append(out.Instances, in.Key)
		winner := out.Instances[0]
		conflict := func(field, detail string) {
			out.Conflicts = append(out.Conflicts, Conflict{Hostname: hostname, Field: field, Winner: winner, Loser: in.Key, Detail: detail})
		}
		if !slices.Equal(out.Ports, svc.Ports) {
			conflict("ports", fmt.Sprintf("%v kept, %v ignored", out.Ports, svc.Ports))
		}
		if out.Namespace != svc.Namespace {
			conflict("namespace", fmt.Sprintf("%q kept, %q ignored", out.Namespace, svc.Namespace))
		}
		if out.Resolution != svc.Resolution {
			conflict("resolution", fmt.Sprintf("%s kept, %s ignored", out.Resolution, svc.Resolution))
		}
		if out.MeshExternal != svc.MeshExternal {
			conflict("mesh_external", fmt.Sprintf("%v kept, %v ignored", out.MeshExternal, svc.MeshExternal))
		}
		if out.MTLSMode != svc.MTLSMode {
			conflict("mtls_mode", fmt.Sprintf("%q kept, %q ignored", out.MTLSMode, svc.MTLSMode))
		}
		if !slices.Equal(out.ExportTo, svc.ExportTo) {
			conflict("export_to", fmt.Sprintf("%q kept, %q ignored", out.ExportTo, svc.ExportTo))
		}
		mergeAddrs(&out.VIPs, svc.VIPs)
		mergeAddrs(&out.ExternalAddresses, svc.ExternalAddresses)
		for c, ports := range svc.NodePorts {
			if out.NodePorts == nil {
				out.NodePorts = map[string]map[uint32]uint32{}
			}
			if _, ok := out.NodePorts[c]; !ok {
				out.NodePorts[c] = ports
			}
		}
	}
	return out
}

func cloneAddrs(m map[string][]string) map[string][]string {
	if m == nil {
		return nil
	}
	out := make(map[string][]string, len(m))
	for k, v := range m {
		out[k] = slices.Clone(v)
	}
	return out
}

// mergeAddrs adds the per-cluster addresses of src to dst, keeping order
// and dropping repeats.
func mergeAddrs(dst *map[string][]string, src map[string][]string) {
	for c, addrs := range src {
		if *dst == nil {
			*dst = map[string][]string{}
		}
		for _, a := range addrs {
			if !slices.Contains((*dst)[c], a) {
				(*dst)[c] = append((*dst)[c], a)
			}
		}
	}
}

// EndpointSources returns each instance's endpoints of a service, in order.
// The sets are immutable; callers must not modify them.
func (r *Registry) EndpointSources(hostname string) []EndpointSource {
	return r.AppendEndpointSources(nil, hostname)
}

// AppendEndpointSources appends the sources of a service to dst, so a
// caller on a hot path can pass a buffer of its own.
func (r *Registry) AppendEndpointSources(dst []EndpointSource, hostname string) []EndpointSource {
	for _, in := range r.store.Instances() {
		if set := in.Endpoints(hostname); set.Len() > 0 {
			dst = append(dst, EndpointSource{Instance: in, Properties: in.Properties(), Set: set})
		}
	}
	return dst
}

// NetworkGateways returns the gateways every instance reports, in instance
// order, without repeats.
func (r *Registry) NetworkGateways() []sdk.NetworkGateway {
	var out []sdk.NetworkGateway
	for _, in := range r.store.Instances() {
		for _, g := range in.Gateways() {
			if !slices.Contains(out, g) {
				out = append(out, g)
			}
		}
	}
	return out
}
