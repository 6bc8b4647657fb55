package main

import (
	"github.com/hashicorp/hcl/v2"

	"github.com/estuary-mesh/estuary/host/config"
	"github.com/estuary-mesh/estuary/host/network"
)

// loadNetworks decodes and validates the networks block of a plugins.hcl
// (and the meshNetworks file it names). `estuary validate`, start-up and
// every reload go through it.
func loadNetworks(f *config.File) (*network.Config, hcl.Diagnostics) {
	return network.Decode(f.Networks, f.Filename)
}
