package sim_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/units"
)

// TestConformance runs the driver conformance suite against sim drivers of
// the smallest and the usual granularity, and against one of real GPU size,
// where the fill-to-capacity tests skip.
func TestConformance(t *testing.T) {
	for _, c := range []struct {
		name string
		opts sim.Options
	}{
		{"2x256KiB-gran4KiB", sim.Options{Devices: 2, Granularity: 4 * units.KiB, Capacity: 64 * 4 * units.KiB}},
		{"3x64MiB-gran2MiB", sim.Options{Devices: 3, Granularity: 2 * units.MiB, Capacity: 32 * 2 * units.MiB}},
		{"8x80GiB", sim.Options{Devices: 8}},
	} {
		t.Run(c.name, func(t *testing.T) {
			drivertest.Run(t, func(t *testing.T) driver.Driver {
				d, err := sim.New(c.opts)
				require.NoError(t, err)
				t.Cleanup(func() {
					if err := sim.TearDown(d); err != nil {
						t.Errorf("tear down: %v", err)
					}
				})
				return d
			})
		})
	}
}

// TestSyncDevice: SyncDevice returns only after the work queued on the
// driver's streams at the call has run; a device the driver lacks is
// ErrNoDevice (drivertest.SyncDeviceWaits).
func TestSyncDevice(t *testing.T) {
	d, err := sim.New(sim.Options{Devices: 2, Capacity: 4 << 20})
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	drivertest.SyncDeviceWaits(t, d, -1, 2)
}
