package acl

import (
	"testing"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/internal/acceltest"
	"github.com/vmarena/vmarena/driver/internal/standin"
	"github.com/vmarena/vmarena/internal/units"
)

// vendor is this driver as the tests shared with the other accelerator
// driver see it (driver/internal/acceltest).
var vendor = acceltest.Vendor[*Driver]{
	Standin: standin.ACL,
	Open: func(path string, capacity uint64) (*Driver, error) {
		return Open(Options{Library: path, Capacity: capacity})
	},
	TearDown: (*Driver).tearDown,
	Probe:    probeGranularity,
	Device:   "NPU",
}

// The conformance suite learns that reservations bind one NPU.
var _ drivertest.OneDeviceBinder = (*Driver)(nil)

// small is the stand-in the conformance suite runs on: two devices of 64
// granules of 64 KiB, so fill-to-capacity tests run for real.
var small = standin.Config{Devices: 2, Capacity: 4 * units.MiB, MinGranularity: 64 * units.KiB, RecommendedGranularity: 2 * units.MiB}

// openStandin opens the driver with opts over a fresh stand-in, torn down
// and checked for leaks when the test ends (acceltest.Vendor.OpenStandin).
func openStandin(t *testing.T, cfg standin.Config, opts Options) (*Driver, *standin.Lib) {
	t.Helper()
	return vendor.OpenStandin(t, cfg, func(path string) (*Driver, error) {
		opts.Library = path
		return Open(opts)
	})
}

// probeGranularity is the largest minimum granularity of the machine's
// own devices, or why there is none.
func probeGranularity() (uint64, error) {
	rep, err := Probe("")
	if err != nil {
		return 0, err
	}
	var gran uint64
	for _, d := range rep.Devices {
		gran = max(gran, d.MinGranularity)
	}
	if gran == 0 {
		return 0, errNoVMM(rep.Library)
	}
	return gran, nil
}

// TestConformanceWithoutGroups: the suite over stand-ins each lacking one
// group of symbols.
func TestConformanceWithoutGroups(t *testing.T) { vendor.ConformanceWithoutGroups(t, small) }

// TestCloseLeavesNothing: a full open-use-close leaves the process's
// descriptors and mappings as it found them, and the library holding
// nothing.
func TestCloseLeavesNothing(t *testing.T) { vendor.CloseLeavesNothing(t, small) }

// TestHardwareConformance runs the conformance suite on the machine's own
// NPUs: `go test ./driver/acl -run Hardware -v`; it skips where there are
// fewer than two.
func TestHardwareConformance(t *testing.T) { vendor.HardwareConformance(t) }

// TestHardwareSmoke is the round trip on each of the machine's NPUs.
func TestHardwareSmoke(t *testing.T) { vendor.HardwareSmoke(t) }

// TestConformance runs the whole suite on the AscendCL driver over the
// stand-in, waiting for streams with events.
func TestConformance(t *testing.T) {
	vendor.Conformance(t, small, func(path string) (*Driver, error) { return Open(Options{Library: path, Wait: WaitEvent}) })
}

// TestConformanceWaitSync runs it again waiting with
// aclrtSynchronizeStream, at ACL_HBM_MEM_HUGE's 2 MiB granularity, on three
// NPUs.
func TestConformanceWaitSync(t *testing.T) {
	if testing.Short() {
		t.Skip("the event run covers the same rules")
	}
	cfg := standin.Config{Devices: 3, Capacity: 64 * units.MiB, MinGranularity: 2 * units.MiB, RecommendedGranularity: 2 * units.MiB}
	vendor.Conformance(t, cfg, func(path string) (*Driver, error) { return Open(Options{Library: path, Wait: WaitSync}) })
}

func errNoVMM(lib string) error {
	return errors.Newf("AscendCL runtime %s has no NPU with virtual memory management", lib)
}

// TestCloseRacingMap: a chunk mapped while Close runs makes Close refuse,
// changing nothing, or is refused because the driver closed.
func TestCloseRacingMap(t *testing.T) { vendor.CloseRacingMap(t, small) }
