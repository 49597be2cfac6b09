package host

import (
	"testing"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/internal/units"
)

// TestConformance runs the whole driver conformance suite on the host
// driver: two devices of 64 granules of 64 KiB, so fill-to-capacity tests
// run for real.
func TestConformance(t *testing.T) {
	drivertest.Run(t, func(t *testing.T) driver.Driver {
		return newTest(t, Options{Devices: 2, Capacity: 4 * units.MiB, Granularity: 64 * units.KiB})
	})
}

// TestConformanceDefaultGranularity runs it again at the GPU-like 2 MiB
// granularity.
func TestConformanceDefaultGranularity(t *testing.T) {
	if testing.Short() {
		t.Skip("the 64 KiB run covers the same rules")
	}
	drivertest.Run(t, func(t *testing.T) driver.Driver {
		return newTest(t, Options{Devices: 3, Capacity: 64 * units.MiB})
	})
}
