//go:build !unix

package browsertest

import "os/exec"

// group leaves cmd as it is: cancellation kills the browser alone.
func group(*exec.Cmd) {}
