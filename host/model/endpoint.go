package model

import "github.com/estuary-mesh/estuary/sdk"

// LbEndpoint is one endpoint a view receives, before encoding.
type LbEndpoint struct {
	Address string
	// AdditionalAddresses are the endpoint's other IPs (a dual-stack
	// pod's), served on Port too. Shared with the registry replica: never
	// modified. A gateway that replaces the endpoint has none.
	AdditionalAddresses []string
	Port                uint32
	// Weight is the load-balancing weight. The endpoint pipeline never
	// leaves it 0; an encoder sends 0 as 1, as Envoy requires.
	Weight  uint32
	Health  sdk.Health
	Network string
	Cluster string
	TLSMode sdk.TLSMode
}

// LocalityGroup is the endpoints of one locality.
type LocalityGroup struct {
	Locality string // "region/zone/subzone"
	// Weight of the locality; 0 means the sum of its endpoints' weights.
	Weight    uint32
	Priority  uint32
	Endpoints []LbEndpoint
}

// EndpointRow is one endpoint a node holds, decoded from what the xDS
// server would send it: `estuary proxy-config endpoints` prints these, and
// `estuary explain` compares its own result with them.
type EndpointRow struct {
	Cluster  string `json:"cluster"`
	Endpoint string `json:"endpoint"`
	// AdditionalAddresses are the endpoint's other addresses (dual stack),
	// as ADDR:PORT.
	AdditionalAddresses []string `json:"additional_addresses,omitempty"`
	Health              string   `json:"health"`
	Weight              uint32   `json:"weight"`
	Locality            string   `json:"locality"`
	// Priority is the locality's priority (0, the first, without
	// locality failover).
	Priority uint32 `json:"priority"`
	Network  string `json:"network,omitempty"`
	// Registry is the cluster of the registry the endpoint came from (or,
	// for a gateway, the gateway's cluster).
	Registry string `json:"registry_cluster,omitempty"`
	TLSMode  string `json:"tls_mode,omitempty"`
}
