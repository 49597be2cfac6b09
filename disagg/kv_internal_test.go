package disagg

import (
	"testing"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
)

// TestDevCopyNeedsStreams: a device cache's rows on a driver with no
// streams (or none) cannot be copied for a host model: ErrUnsupported.
func TestDevCopyNeedsStreams(t *testing.T) {
	_, err := newDevCopy(nil, 0)
	drivertest.RequireIs(t, err, driver.ErrUnsupported, "no streams")
}
