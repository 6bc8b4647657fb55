// Command estuary-plugin-kubernetes serves the Kubernetes multicluster
// registry as a standalone plugin binary.
package main

import (
	"github.com/estuary-mesh/estuary/plugins/kubernetes"
	"github.com/estuary-mesh/estuary/sdk"
)

func main() { sdk.Serve(kubernetes.Factory) }
