package sim_test

import (
	"math"
	"runtime"
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

// TestCloseRacingMap: drivertest.CloseRacingMap.
func TestCloseRacingMap(t *testing.T) {
	d, err := sim.New(sim.Options{Devices: 1, Capacity: 4 << 20})
	require.NoError(t, err)
	drivertest.CloseRacingMap(t, d)
}

// TestCloseFromHostFuncWhileClosing: a host function that Close waits for
// may call Close too, and gets ErrClosed at once.
func TestCloseFromHostFuncWhileClosing(t *testing.T) {
	d, err := sim.New(sim.Options{Devices: 1, Capacity: 4 << 20})
	require.NoError(t, err)
	drivertest.CloseFromHostFunc(t, d, "sim")
}

// TestHostAllocBounded: HostAlloc lends at most Options.HostMemory of host
// buffers, live ones together, and
// refuses past it with ErrOutOfMemory, naming the bound, rather than
// asking Go for a buffer it cannot make (a size near 2^64 panicked, one of
// 2^44 ended the process out of memory); a buffer freed makes room again,
// and a refusal changes nothing. By default the bound is the machine's
// memory.
func TestHostAllocBounded(t *testing.T) {
	d, err := sim.New(sim.Options{Capacity: 64 * units.MiB, HostMemory: units.MiB})
	require.NoError(t, err)
	for _, size := range []uint64{math.MaxUint64, math.MaxInt, 1 << 62, 1 << 44, units.MiB + 1} {
		_, err := d.HostAlloc(size)
		require.ErrorIs(t, err, driver.ErrOutOfMemory, "%d bytes", size)
		require.ErrorContains(t, err, "of at most 1 MiB")
	}
	a, err := d.HostAlloc(600 * units.KiB)
	require.NoError(t, err)
	_, err = d.HostAlloc(600 * units.KiB)
	require.ErrorIs(t, err, driver.ErrOutOfMemory)
	b, err := d.HostAlloc(400 * units.KiB)
	require.NoError(t, err)
	require.NoError(t, d.HostFree(a))
	a, err = d.HostAlloc(600 * units.KiB)
	require.NoError(t, err, "the freed buffer's room")
	require.NoError(t, d.HostFree(a))
	require.NoError(t, d.HostFree(b))
	require.NoError(t, d.Close())

	// By default, no more than the machine has (Linux: its physical
	// memory): a buffer that size is never lent.
	if runtime.GOOS != "linux" {
		return
	}
	d, err = sim.New(sim.Options{})
	require.NoError(t, err)
	for _, size := range []uint64{math.MaxUint64, 1 << 62, 1 << 50} {
		_, err := d.HostAlloc(size)
		require.ErrorIs(t, err, driver.ErrOutOfMemory, "%d bytes", size)
	}
	require.NoError(t, d.Close())
}
