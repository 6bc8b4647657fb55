// Package wire converts between the SDK's hand-written types and the
// generated protocol types. It is the only place in sdk/ that sees them.
package wire

import (
	"maps"

	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
)

// ClusterAddresses converts a per-cluster address map, sorted by cluster.
func ClusterAddresses(m map[string][]string) []*registryv1.ClusterAddresses {
	if len(m) == 0 {
		return nil
	}
	out := make([]*registryv1.ClusterAddresses, 0, len(m))
	for _, c := range sortedKeys(m) {
		out = append(out, &registryv1.ClusterAddresses{Cluster: c, Addresses: m[c]})
	}
	return out
}

// ClusterAddressesMap is the inverse of ClusterAddresses.
func ClusterAddressesMap(in []*registryv1.ClusterAddresses) map[string][]string {
	if len(in) == 0 {
		return nil
	}
	out := make(map[string][]string, len(in))
	for _, c := range in {
		out[c.GetCluster()] = c.GetAddresses()
	}
	return out
}

// NodePorts converts per-cluster node ports, sorted by cluster.
func NodePorts(m map[string]map[uint32]uint32) []*registryv1.ClusterNodePorts {
	if len(m) == 0 {
		return nil
	}
	out := make([]*registryv1.ClusterNodePorts, 0, len(m))
	for _, c := range sortedKeys(m) {
		out = append(out, &registryv1.ClusterNodePorts{Cluster: c, Ports: m[c]})
	}
	return out
}

// NodePortsMap is the inverse of NodePorts.
func NodePortsMap(in []*registryv1.ClusterNodePorts) map[string]map[uint32]uint32 {
	if len(in) == 0 {
		return nil
	}
	out := make(map[string]map[uint32]uint32, len(in))
	for _, c := range in {
		out[c.GetCluster()] = maps.Clone(c.GetPorts())
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	// small maps: insertion sort keeps this allocation-free beyond keys
	for i := 1; i < len(keys); i++ {
		for j := i; j > 0 && keys[j] < keys[j-1]; j-- {
			keys[j], keys[j-1] = keys[j-1], keys[j]
		}
	}
	return keys
}
