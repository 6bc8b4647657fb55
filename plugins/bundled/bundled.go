// Package bundled lists the registry plugins built into the estuary binary.
// They still run out of process: the host re-executes itself as
// `estuary plugin NAME`.
package bundled

import (
	"github.com/estuary-mesh/estuary/plugins/static"
	"github.com/estuary-mesh/estuary/sdk"
)

// Factories are the bundled plugins by name.
var Factories = map[string]sdk.Factory{
	"static": static.Factory,
}
