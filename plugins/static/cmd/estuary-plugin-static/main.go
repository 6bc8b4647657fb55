// Command estuary-plugin-static serves the static registry as a standalone
// plugin binary. The estuary binary bundles the same plugin.
package main

import (
	"github.com/estuary-mesh/estuary/plugins/static"
	"github.com/estuary-mesh/estuary/sdk"
)

func main() { sdk.Serve(static.Factory) }
