// Command estuary-plugin-consul serves the Consul registry as a standalone
// plugin binary. The estuary binary bundles the same plugin.
package main

import (
	"github.com/estuary-mesh/estuary/plugins/consul"
	"github.com/estuary-mesh/estuary/sdk"
)

func main() { sdk.Serve(consul.Factory) }
