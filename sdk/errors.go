package sdk

import (
	"errors"
	"fmt"
)

// ErrUnknownInstance is returned when an update names an instance that was
// never set with SetInstance.
var ErrUnknownInstance = errors.New("unknown instance")

// ErrUnknownService is returned when endpoints are set for a service that
// was never upserted.
var ErrUnknownService = errors.New("unknown service")

func sprintf(format string, args ...any) string { return fmt.Sprintf(format, args...) }
