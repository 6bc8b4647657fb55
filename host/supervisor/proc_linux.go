package supervisor

import (
	"os/exec"
	"syscall"
)

// dieWithParent has the kernel kill the plugin if the host dies without
// stopping it (SIGKILL, OOM). The SDK also watches its parent, for plugins
// started some other way.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
