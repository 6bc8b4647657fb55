// Package replica is the host's in-memory replica of every plugin
// instance. Plugins stream their state into it (snapshot, then deltas); the
// aggregate registry and the xDS server read it without ever calling a
// plugin.
//
// The replica trusts nothing it has not checked, and checks nothing itself:
// batches reach it through the SDK's plugin client (sdk/pluginclient),
// which validates each one whole against the protocol and the plugin's
// capabilities. The replica applies a batch atomically: readers see all of
// it or none of it, and subscribers hear of it once.
//
// The replica is built for many endpoints: an Endpoint is a flat value of
// about a hundred bytes, strings shared by many endpoints (network,
// locality, service account) are interned, and endpoints of one set that
// carry equal labels share one label map. An endpoint set is
// immutable once published, so readers take a pointer and read it without
// locks.
package replica

import (
	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/pluginclient"
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

// Endpoint is one address serving a service, in the compact form the
// plugin client decodes it into: strings many endpoints share (network,
// locality, service account) are interned, and endpoints with equal labels
// or target ports share one map. Never modify its maps.
type Endpoint = pluginclient.Endpoint

// EndpointSet is the endpoints one instance reports for one service. It is
// immutable once published.
type EndpointSet = pluginclient.EndpointSet
