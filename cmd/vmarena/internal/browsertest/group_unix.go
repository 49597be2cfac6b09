//go:build unix

package browsertest

import (
	"os/exec"
	"syscall"
)

// group starts cmd in a process group of its own and makes its
// cancellation kill the whole group.
func group(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
}
