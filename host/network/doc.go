// Package network is the host's network manager: it keeps the networks
// config and works out which east-west gateways lead into each network.
// The endpoint pipeline (host/pipeline) reads both, from one immutable
// Snapshot, to place every endpoint on its network and to make sure a
// client never gets an address on a network it cannot reach, only that
// network's gateways, weighted as the endpoints behind them would be.
//
// # Networks
//
// Networks come from the `networks { }` block of plugins.hcl and, for users
// migrating from Istio, from a meshNetworks YAML file it names (see Decode
// and DecodeMeshNetworks). Validation is stricter than Istio's, which only
// warns and lets map order decide: a registry in two networks, CIDR ranges
// of two networks that overlap, bad ranges, ports and host names are errors,
// each at its file:line:col. One exception keeps Istio's own files
// working: a meshNetworks fromCidr with host bits set (192.168.0.1/24, as
// Istio's reference writes it) is read masked, with a warning naming the
// prefix used; in HCL it stays an error.
//
// # Which network an endpoint is on
//
// The pipeline decides it, with the config's answers for rules 3 and 4
// (Snapshot.RegistryNetwork, Snapshot.CIDRNetwork). Highest precedence
// first (the order Istio's code applies, which its API comment states the
// other way round):
//
//  1. the endpoint's own network (topology.istio.io/network on its pod or
//     WorkloadEntry, or the endpoint's network field);
//  2. the registry's default for its cluster (the label on the system
//     namespace, or the plugin's network setting);
//  3. the network whose from_registry names the endpoint's cluster;
//  4. the network whose from_cidr contains the endpoint's IP.
//
// /debug/networkz?endpoint=IP says which rule decided, for every endpoint
// with that IP.
//
// # Gateways
//
// The union of the config's `address` gateways, its `registry_service_name`
// gateways (the service's external addresses in the cluster of each of the
// network's from_registry rules, or its VIPs there when it has none) and the
// gateways registries report. Gateways given by DNS name are resolved by the
// host: A and AAAA in parallel, one gateway per address, re-resolved when the
// answer's TTL (clamped to [30s, 1h]) runs out, the last answer kept when DNS
// fails. Any change of networks or gateways moves Generation on and requests
// a full xDS push.
package network
