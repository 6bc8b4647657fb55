package stream

import (
	"fmt"
	"maps"
	"unique"

	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
	"github.com/estuary-mesh/estuary/sdk"
)

// decodeEndpoints converts wire endpoints into the compact form, or says
// which endpoint refers outside the event's shared tables. Shared label and
// port sets are decoded once and shared by every endpoint that refers to
// them; strings that many endpoints repeat are interned.
func decodeEndpoints(m *registryv1.EndpointsReplaced) (*EndpointSet, string) {
	in := m.GetEndpoints()
	set := &EndpointSet{Endpoints: make([]Endpoint, len(in))}
	var labels mapCache[string]
	var ports mapCache[uint32]
	var network, locality, account stringCache
	labelSets, portSets := m.GetLabelSets(), m.GetPortSets()
	strs := make([]string, len(m.GetStrings()))
	for i, s := range m.GetStrings() {
		strs[i] = intern(s)
	}
	for i, p := range in {
		e := &set.Endpoints[i]
		e.Address = p.GetAddress()
		if extra := p.GetAdditionalAddresses(); len(extra) > 0 {
			e.Additional = &extra
		}
		switch n := p.GetLabelSet(); {
		case n == 0:
			e.Labels = labels.share(p.GetLabels())
		case int(n) <= len(labelSets):
			e.Labels = labelSets[n-1].GetEntries()
		default:
			return nil, outOfRange(i, e.Address, "label_set", n, len(labelSets), "label sets")
		}
		switch n := p.GetPortSet(); {
		case n == 0:
			e.TargetPorts = ports.share(p.GetTargetPorts())
		case int(n) <= len(portSets):
			e.TargetPorts = portSets[n-1].GetEntries()
		default:
			return nil, outOfRange(i, e.Address, "port_set", n, len(portSets), "port sets")
		}
		var ok bool
		if e.Network, ok = ref(strs, p.GetNetworkRef(), p.GetNetwork(), &network); !ok {
			return nil, outOfRange(i, e.Address, "network_ref", p.GetNetworkRef(), len(strs), "strings")
		}
		if e.Locality, ok = ref(strs, p.GetLocalityRef(), p.GetLocality(), &locality); !ok {
			return nil, outOfRange(i, e.Address, "locality_ref", p.GetLocalityRef(), len(strs), "strings")
		}
		if e.ServiceAccount, ok = ref(strs, p.GetServiceAccountRef(), p.GetServiceAccount(), &account); !ok {
			return nil, outOfRange(i, e.Address, "service_account_ref", p.GetServiceAccountRef(), len(strs), "strings")
		}
		e.WorkloadName = p.GetWorkloadName()
		e.Weight = p.GetWeight()
		e.TLSMode = sdk.TLSMode(p.GetTlsMode())
		e.Health = sdk.Health(p.GetHealth())
	}
	return set, ""
}

// ref resolves a 1-based reference into strs, or interns direct when the
// reference is 0. ok is false when the reference is out of range.
func ref(strs []string, n uint32, direct string, c *stringCache) (s string, ok bool) {
	switch {
	case n == 0:
		return c.intern(direct), true
	case int(n) <= len(strs):
		return strs[n-1], true
	}
	return "", false
}

func outOfRange(i int, addr, field string, n uint32, have int, table string) string {
	return fmt.Sprintf("endpoint %d (%s): %s %d is out of range: the event has %d %s", i, addr, field, n, have, table)
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

// mapCache shares equal label or port maps among the endpoints of one
// set. Endpoints of a workload usually repeat the same few maps, so a short
// list of recent distinct maps catches nearly all repeats without hashing.
type mapCache[V comparable] struct {
	recent [4]map[string]V
	n      int
}

func (c *mapCache[V]) share(m map[string]V) map[string]V {
	if len(m) == 0 {
		return nil
	}
	for _, x := range c.recent {
		if x != nil && maps.Equal(x, m) {
			return x
		}
	}
	c.recent[c.n%len(c.recent)] = m
	c.n++
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
