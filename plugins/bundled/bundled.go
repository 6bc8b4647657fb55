// Package bundled lists the registry plugins built into the estuary binary.
// They still run out of process: the host re-executes itself as
// `estuary plugin NAME`.
package bundled

import (
	"github.com/estuary-mesh/estuary/plugins/consul"
	"github.com/estuary-mesh/estuary/plugins/kubernetes"
	"github.com/estuary-mesh/estuary/plugins/serviceentry"
	"github.com/estuary-mesh/estuary/plugins/static"
	"github.com/estuary-mesh/estuary/sdk"
)

// Factories are the bundled plugins by name.
var Factories = map[string]sdk.Factory{
	"consul":       consul.Factory,
	"kubernetes":   kubernetes.Factory,
	"serviceentry": serviceentry.Factory,
	"static":       static.Factory,
}
