//go:build !linux

package supervisor

import "os/exec"

// dieWithParent relies on the SDK's parent watch where the kernel offers no
// parent-death signal.
func dieWithParent(*exec.Cmd) {}
