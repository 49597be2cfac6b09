package sleep

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/mapping"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// TestTagDriverBooks: a tag's driver keeps books (driver.Books) as the
// other drivers do: its chunks, mappings and reservations, asleep as
// awake. So the Checks of the layers over it compare with them: a chunk
// released through the tag's driver behind physical memory's back, or
// behind a page table's, is reported (it passed both Checks when the tag
// had no books), and so is a real chunk released behind the tag's own.
func TestTagDriverBooks(t *testing.T) {
	d := openHost(t, 64*kib)
	td := newTagDriver(d, "weights")
	var _ driver.Books = td
	space := vaspace.New(td)
	mem := physical.New(td)
	res, err := space.Reserve(16*kib, 0)
	require.NoError(t, err)
	tab, err := mapping.New(res, mem)
	require.NoError(t, err)
	c, err := mem.Create(0, 4*kib, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, tab.Map(res.Base(), c))

	size, err := td.ReservationAt(res.Base())
	require.NoError(t, err)
	require.Equal(t, uint64(16*kib), size)
	h, size, err := td.MappingAt(res.Base())
	require.NoError(t, err)
	require.Equal(t, uint64(4*kib), size)
	dev, size, err := td.ChunkInfo(h)
	require.NoError(t, err)
	require.Equal(t, driver.DeviceID(0), dev)
	require.Equal(t, uint64(4*kib), size)
	n, bytes, err := td.Mapped(res.Base(), 16*kib)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, uint64(4*kib), bytes)
	_, _, err = td.MappingAt(res.Base() + driver.Addr(4*kib))
	drivertest.RequireIs(t, err, driver.ErrNotMapped)
	_, _, err = td.MappingAt(res.Base() + driver.Addr(16*kib))
	drivertest.RequireIs(t, err, driver.ErrNotReserved)
	_, err = td.ReservationAt(res.Base() + driver.Addr(4*kib))
	drivertest.RequireIs(t, err, driver.ErrNotReserved)
	require.NoError(t, mem.Check())
	require.NoError(t, tab.Check())
	require.NoError(t, td.check())

	// Asleep, the books stand: the allocator's view is unchanged.
	require.NoError(t, td.sleep())
	h2, _, err := td.MappingAt(res.Base())
	require.NoError(t, err)
	require.Equal(t, h, h2)
	require.NoError(t, mem.Check())
	require.NoError(t, td.wake())

	// A chunk released through the tag's driver behind physical's back.
	c2, err := mem.Create(0, 4*kib, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, mem.Check())
	require.NoError(t, td.Release(c2.Handle()))
	// Both of physical's comparisons see it: the device's bytes (Used),
	// and the handle the tag's books no longer hold (a detail of the
	// combined error).
	err = mem.Check()
	require.ErrorContains(t, err, "released through the driver")
	require.Contains(t, fmt.Sprintf("%+v", err), fmt.Sprintf("does not hold handle %d", c2.Handle()))

	// A real chunk released behind the tag's back: the tag's check says so.
	td.mu.Lock()
	real := td.chunks[h].real
	td.mu.Unlock()
	require.NoError(t, tab.Unmap(res.Base()))
	require.NoError(t, td.check())
	require.NoError(t, d.Release(real))
	require.ErrorContains(t, td.check(), "released behind the tag's back")
}
