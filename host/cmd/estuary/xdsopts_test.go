package main

import (
	"testing"

	"github.com/estuary-mesh/estuary/host/config"
)

// TestXDSOptionsUnknownTypes: max_unknown_types = 0 means "refuse every
// unknown type" in plugins.hcl, while xds.Limits reads zero as "the
// default"; the command passes a negative limit for it.
func TestXDSOptionsUnknownTypes(t *testing.T) {
	for _, tt := range []struct{ hcl, want int }{{0, -1}, {1, 1}, {4, 4}} {
		if got := xdsOptions(config.XDS{MaxUnknownTypes: tt.hcl}).Limits.MaxUnknownTypes; got != tt.want {
			t.Errorf("max_unknown_types = %d: xds limit %d, want %d", tt.hcl, got, tt.want)
		}
	}
}
