package acl

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/internal/standin"
	"github.com/vmarena/vmarena/internal/units"
)

// small is the stand-in the conformance suite runs on: two NPUs of 64
// granules of 64 KiB, so fill-to-capacity tests run for real.
var small = standin.Config{Devices: 2, Capacity: 4 * units.MiB, MinGranularity: 64 * units.KiB, RecommendedGranularity: 2 * units.MiB}

// openStandin opens the driver over a fresh stand-in; when the test ends
// it is torn down whatever is left, and the stand-in must then hold
// nothing: every reservation, allocation, mapping, stream, event, pinned
// buffer, context, device set and token the driver made was given back to
// "AscendCL".
func openStandin(t *testing.T, cfg standin.Config, opts Options) (*Driver, *standin.Lib) {
	t.Helper()
	lib := standin.Open(t, standin.ACL, cfg)
	opts.Library = lib.Path()
	d, err := Open(opts)
	require.NoError(t, err)
	t.Cleanup(func() {
		if err := d.tearDown(); err != nil {
			t.Errorf("tear down the AscendCL driver: %v", err)
		}
		for _, what := range standin.LiveKinds {
			if n := lib.Live(what); n != 0 {
				t.Errorf("after tear down the AscendCL stand-in still holds %d %s", n, what)
			}
		}
	})
	return d, lib
}

// TestConformance runs the whole driver conformance suite on the AscendCL
// driver over the stand-in, waiting for streams with events.
func TestConformance(t *testing.T) {
	drivertest.Run(t, func(t *testing.T) driver.Driver {
		d, _ := openStandin(t, small, Options{Wait: WaitEvent})
		return d
	})
}

// TestConformanceWaitSync runs the suite again waiting with
// aclrtSynchronizeStream, at ACL_HBM_MEM_HUGE's 2 MiB granularity, on
// three NPUs.
func TestConformanceWaitSync(t *testing.T) {
	if testing.Short() {
		t.Skip("the event run covers the same rules")
	}
	cfg := standin.Config{Devices: 3, Capacity: 64 * units.MiB, MinGranularity: 2 * units.MiB, RecommendedGranularity: 2 * units.MiB}
	drivertest.Run(t, func(t *testing.T) driver.Driver {
		d, _ := openStandin(t, cfg, Options{Wait: WaitSync})
		return d
	})
}

// TestConformanceWithoutGroups runs the suite over stand-ins that each lack
// one group of symbols (all but virtual memory management, without which
// there is no driver; "hostfunc" is CUDA's and changes nothing here): a missing group makes its feature unsupported, and
// every rule of the contract still holds for the rest.
func TestConformanceWithoutGroups(t *testing.T) {
	if testing.Short() {
		t.Skip("TestMissingSymbols covers each group's own feature")
	}
	for _, group := range standin.OmitGroups {
		if group == "vmm" {
			continue
		}
		t.Run(group, func(t *testing.T) {
			cfg := small
			cfg.Omit = []string{group}
			drivertest.Run(t, func(t *testing.T) driver.Driver {
				d, _ := openStandin(t, cfg, Options{})
				return d
			})
		})
	}
}
