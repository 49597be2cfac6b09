//go:build !linux

package host

import (
	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/driver"
)

// Driver is the host driver; on this platform it cannot be created.
type Driver struct{ driver.Driver }

// New reports that the host driver needs Linux (memfd, fallocate,
// MADV_POPULATE and MAP_FIXED_NOREPLACE).
func New(Options) (*Driver, error) {
	return nil, errors.Wrap(driver.ErrUnsupported, "host: the host driver needs Linux")
}
