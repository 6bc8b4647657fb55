package pipeline

import "errors"

// Errors Build and Endpoints wrap: the cluster asked for does not exist
// for the view, and why.
var (
	// ErrClusterName: the name is not an EDS cluster name of the view.
	ErrClusterName = errors.New("not an EDS cluster name")
	// ErrNoService: no registry has the cluster's service.
	ErrNoService = errors.New("no service")
	// ErrNotStatic: the service's endpoints are not IPs known to the
	// registries (DNS, passthrough); the client resolves them, so no EDS
	// cluster has them.
	ErrNotStatic = errors.New("not an EDS service")
	// ErrNoPort: the service has no such port.
	ErrNoPort = errors.New("no such port")
)
