package consul

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/estuary-mesh/estuary/testbed"
)

// TestMain checks that no watch, HTTP connection or test agent outlives
// the tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testbed.GoleakOptions()...) }
