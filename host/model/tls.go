package model

// ClusterTLS is what one cluster of a view does about TLS towards its
// endpoints, and why. The xDS cluster builder makes the decision this
// describes and builds the cluster from it; `estuary explain` and
// `estuary proxy-config clusters` print it, so the reason shown is the
// one the config was built from, never a replay of it.
type ClusterTLS struct {
	Cluster string `json:"cluster"`
	// TLS is what the cluster carries: ISTIO_MUTUAL (a transport_socket
	// with Istio mTLS for every endpoint), AUTO (transport_socket_matches:
	// endpoints whose EDS metadata has tlsMode: istio over Istio mTLS, the
	// rest in plain text), or NONE.
	TLS string `json:"tls"`
	// SNI the client sends: outbound_.PORT_.SUBSET_.HOST. For an
	// east-west gateway's cluster it is the SNI its filter chain matches.
	SNI string `json:"sni,omitempty"`
	// SANs are the SPIFFE IDs the client accepts from the endpoints.
	SANs []string `json:"sans,omitempty"`
	// MeshMode is plugins.hcl mesh { mtls }; Mode is the mode that
	// applied to the service: its override, or the mesh's.
	MeshMode string `json:"mesh_mode"`
	Mode     string `json:"mode"`
	// Override is the service's own mode, when its registry set one;
	// OverrideSource says which instance reported it and where the
	// plugin read it.
	Override       string `json:"override,omitempty"`
	OverrideSource string `json:"override_source,omitempty"`
	// Reason says, in words, why TLS is what it is.
	Reason string `json:"reason"`
	// Served is what the xDS server holds for the node, decoded from the
	// cluster itself; absent when asked for a view with no connected node.
	Served *ServedTLS `json:"served,omitempty"`
}

// ServedTLS is the TLS of a cluster as the xDS server holds it.
type ServedTLS struct {
	TLS string `json:"tls"`
	SNI string `json:"sni,omitempty"`
}

// What a cluster carries for TLS (ClusterTLS.TLS).
const (
	ClusterTLSMutual = "ISTIO_MUTUAL"
	ClusterTLSAuto   = "AUTO"
	ClusterTLSNone   = "NONE"
)
