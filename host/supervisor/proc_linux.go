package supervisor

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
)

// dieWithParent has the kernel kill the plugin if the host dies without
// stopping it (SIGKILL, OOM). The SDK also watches its parent, for plugins
// started some other way.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// execFromFile makes cmd run the binary open as f, the file that was
// checked and hashed, rather than whatever is at its path by now: f
// becomes one of the child's descriptors (3 and up, where os/exec puts
// ExtraFiles) and the kernel executes /proc/self/fd/N of the child. The
// descriptor stays open in the plugin, read-only on its own binary, which
// is also what lets a script's interpreter open it.
func execFromFile(cmd *exec.Cmd, f *os.File) {
	cmd.ExtraFiles = append(cmd.ExtraFiles, f)
	cmd.Path = fmt.Sprintf("/proc/self/fd/%d", 2+len(cmd.ExtraFiles))
}

// runningImage is what a bundled plugin runs: the host's own image, as
// the kernel holds it, not the file at the host's path, which an upgrade
// may have replaced since the host started.
func runningImage(string) string { return "/proc/self/exe" }
