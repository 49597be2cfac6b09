//go:build !unix

package physical

import (
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// closeFD closes an exported descriptor (driver.HandlePOSIXFD): no driver
// makes one on this platform.
func closeFD(fd int) error {
	return errors.Wrapf(driver.ErrUnsupported, "physical: close of descriptor %d: POSIX descriptors are not shared on this platform", fd)
}
