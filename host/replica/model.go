// Package registry is the host's in-memory replica of every plugin
// instance. Plugins stream their state into it (snapshot, then deltas); the
// aggregate registry and the xDS server read it without ever calling a
// plugin.
//
// The replica is built for many endpoints: an Endpoint is a flat value of
// about a hundred bytes, strings shared by many endpoints (network,
// locality, service account) are interned, and endpoints of one set that
// carry equal labels share one label map. An endpoint set is
// immutable once published, so readers take a pointer and read it without
// locks.
package replica

import (
	"maps"
	"unique"

	"github.com/estuary-mesh/estuary/sdk"
)

// InstanceKey identifies an instance in the host: the plugin block's label
// from plugins.hcl plus the instance's own (Provider, Cluster). Two plugins
// that report the same Provider and Cluster never overwrite each other.
type InstanceKey struct {
	Plugin   string `json:"plugin"`
	Provider string `json:"provider"`
	Cluster  string `json:"cluster"`
}

func (k InstanceKey) String() string { return k.Plugin + ":" + k.Provider + "/" + k.Cluster }

// Service is a service as one instance reports it. It is immutable once
// stored.
type Service = sdk.Service

// Endpoint is one address serving a service, in the replica's compact form.
type Endpoint struct {
	Address string `json:"address"`
	// Labels is shared between endpoints with equal labels: never modify it.
	Labels map[string]string `json:"labels,omitempty"`
	// TargetPorts is shared like Labels: never modify it.
	TargetPorts map[string]uint32 `json:"target_ports,omitempty"`
	// Network is the endpoint's own network ("" if it has none).
	Network string `json:"network,omitempty"`
	// Locality is "region/zone/subzone".
	Locality       string      `json:"locality,omitempty"`
	ServiceAccount string      `json:"service_account,omitempty"`
	WorkloadName   string      `json:"workload_name,omitempty"`
	Weight         uint32      `json:"weight"`
	TLSMode        sdk.TLSMode `json:"tls_mode"`
	Health         sdk.Health  `json:"health"`
}

// TargetPort returns the port the endpoint serves service port p on.
func (e *Endpoint) TargetPort(p sdk.Port) uint32 {
	if tp, ok := e.TargetPorts[p.Name]; ok {
		return tp
	}
	return p.Number
}

// EndpointSet is the endpoints one instance reports for one service. It is
// immutable once published.
type EndpointSet struct {
	Endpoints []Endpoint
}

// Len returns the number of endpoints; a nil set has none.
func (s *EndpointSet) Len() int {
	if s == nil {
		return 0
	}
	return len(s.Endpoints)
}

// intern returns the canonical copy of s, so that the many endpoints that
// name the same network, locality or service account share one string. The
// unique package forgets a value once no handle to it is left, so sets
// decoded after a garbage collection may get a new copy: one per distinct
// value per collection, never one per endpoint.
func intern(s string) string {
	if s == "" {
		return ""
	}
	return unique.Make(s).Value()
}

// labelCache shares equal label and port maps among the endpoints of one
// set. Endpoints of a workload usually repeat the same few maps, so a short
// list of recent distinct maps catches nearly all repeats without hashing.
type labelCache struct {
	labels [4]map[string]string
	ports  [4]map[string]uint32
	nl, np int
}

func (c *labelCache) labelsFor(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	for _, x := range c.labels {
		if x != nil && maps.Equal(x, m) {
			return x
		}
	}
	c.labels[c.nl%len(c.labels)] = m
	c.nl++
	return m
}

func (c *labelCache) portsFor(m map[string]uint32) map[string]uint32 {
	if len(m) == 0 {
		return nil
	}
	for _, x := range c.ports {
		if x != nil && maps.Equal(x, m) {
			return x
		}
	}
	c.ports[c.np%len(c.ports)] = m
	c.np++
	return m
}

// stringCache remembers the last string it interned, so a run of endpoints
// with the same network or locality costs one comparison each.
type stringCache struct{ last string }

func (c *stringCache) intern(s string) string {
	if s == c.last {
		return c.last
	}
	c.last = intern(s)
	return c.last
}
