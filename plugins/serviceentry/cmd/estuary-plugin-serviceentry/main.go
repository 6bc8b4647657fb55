// Command estuary-plugin-serviceentry serves the Istio ServiceEntry registry
// as a standalone plugin binary. The estuary binary bundles the same plugin.
package main

import (
	"github.com/estuary-mesh/estuary/plugins/serviceentry"
	"github.com/estuary-mesh/estuary/sdk"
)

func main() { sdk.Serve(serviceentry.Factory) }
