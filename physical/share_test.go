package physical_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
)

// TestShareErrors: the refusals of Export, SetAllowedPIDs and Import in
// one process, each leaving the memory's books as they were. (Moving a
// handle to another process is package ipc's, tested there.)
func TestShareErrors(t *testing.T) {
	d, err := host.New(host.Options{Devices: 1, Capacity: 8 * units.MiB, Granularity: 64 * units.KiB})
	require.NoError(t, err)
	defer d.Close()
	m := physical.New(d)
	c, err := m.Create(0, 128*units.KiB, driver.ChunkOptions{Shareable: true})
	require.NoError(t, err)
	books := func() (physical.Usage, int) {
		require.NoError(t, m.Check())
		u, err := m.Usage(0)
		require.NoError(t, err)
		return u, len(m.Chunks())
	}
	u0, n0 := books()

	drivertest.RequireIs(t, c.SetAllowedPIDs(1), driver.ErrInvalid, "not exported")
	require.False(t, c.Allowed(1), "an unexported chunk allows nobody")
	_, ok := c.Exported()
	require.False(t, ok)

	// A 0 on the allow-list would admit every peer in a PID namespace we
	// cannot see (SO_PEERCRED reports 0 for them): refused, not exported.
	for _, pids := range [][]int{{0}, {7, 0}, {-1}} {
		_, err := c.Export(pids...)
		drivertest.RequireIs(t, err, driver.ErrInvalid, "on the allow-list")
		_, ok := c.Exported()
		require.False(t, ok, "a refused export exports nothing")
	}

	sh, err := c.Export(7)
	require.NoError(t, err)
	drivertest.RequireIs(t, c.SetAllowedPIDs(8, 0), driver.ErrInvalid, "process ID 0")
	require.True(t, c.Allowed(7), "a refused SetAllowedPIDs keeps the list")
	require.True(t, c.Allowed(7))
	require.NoError(t, c.SetAllowedPIDs(8))
	require.False(t, c.Allowed(7))
	require.True(t, c.Allowed(8))

	_, err = m.Import(sh, 3)
	drivertest.RequireIs(t, err, driver.ErrNoDevice, "device 3")
	bad := sh
	bad.Type = driver.HandleToken
	_, err = m.Import(bad, 0)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "handle type")
	bad = sh
	bad.Size++
	_, err = m.Import(bad, 0)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "not a memory file")
	u1, n1 := books()
	require.Equal(t, u0, u1)
	require.Equal(t, n0, n1)

	// An import in the same process is a chunk of its own, booked as one.
	imp, err := m.Import(sh, 0)
	require.NoError(t, err)
	require.True(t, imp.Imported())
	require.False(t, c.Imported())
	u2, _ := books()
	require.Equal(t, u0.Used+imp.Size(), u2.Used)
	require.NoError(t, imp.Release())

	plain, err := m.Create(0, 64*units.KiB, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, plain.Release())
	_, err = plain.Export()
	drivertest.RequireIs(t, err, driver.ErrBadHandle, "released")

	require.NoError(t, m.Close())
	_, err = m.Import(sh, 0)
	drivertest.RequireIs(t, err, driver.ErrClosed)
	_, err = c.Export()
	drivertest.RequireIs(t, err, driver.ErrClosed)
}

// TestShareUnsupported: a driver that cannot share (sim) says so.
func TestShareUnsupported(t *testing.T) {
	d, err := sim.New(sim.Options{})
	require.NoError(t, err)
	defer d.Close()
	m := physical.New(d)
	c, err := m.Create(0, 2*units.MiB, driver.ChunkOptions{Shareable: true})
	require.NoError(t, err)
	_, err = c.Export(1)
	drivertest.RequireIs(t, err, driver.ErrUnsupported, "cannot share chunks")
	_, err = m.Import(driver.Shareable{Type: driver.HandlePOSIXFD, FD: 0, Size: 2 * units.MiB}, 0)
	drivertest.RequireIs(t, err, driver.ErrUnsupported, "cannot share chunks")
	require.NoError(t, c.Release())
}
