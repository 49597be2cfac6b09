//go:build unix

package physical

import "golang.org/x/sys/unix"

// closeFD closes an exported descriptor (driver.HandlePOSIXFD).
func closeFD(fd int) error { return unix.Close(fd) }
