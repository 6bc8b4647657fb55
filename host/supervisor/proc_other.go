//go:build !linux

package supervisor

import (
	"os"
	"os/exec"
)

// dieWithParent relies on the SDK's parent watch where the kernel offers no
// parent-death signal.
func dieWithParent(*exec.Cmd) {}

// execFromFile runs the binary by its path where there is no
// /proc/self/fd: a binary swapped in between the check and the start
// would run. Estuary's supported platform is Linux.
func execFromFile(*exec.Cmd, *os.File) {}

// runningImage is the host's path where there is no /proc/self/exe.
func runningImage(self string) string { return self }
