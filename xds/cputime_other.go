//go:build !linux

package xds

import "time"

// threadCPU is not measured here: the push's CPU time is reported only
// on Linux (estuary_xds_push_cpu_seconds stays empty).
func threadCPU() (time.Duration, bool) { return 0, false }
