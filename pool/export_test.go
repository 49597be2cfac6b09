package pool

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/stream"
	"github.com/vmarena/vmarena/vaspace"
)

// TestExportPointer: a live allocation of a shareable pool is described
// by its offset and size and the chunks under it (offset, size, handle,
// a shareable handle); each export counts an import that keeps FreeAsync
// off the pointer until released.
func TestExportPointer(t *testing.T) {
	pe := newPoolEnv(t, Props{Shareable: true, MaxSize: 32 * g}, true, true, true)
	a, err := pe.p.MallocAsync(100, pe.a)
	require.NoError(t, err)
	b, err := pe.p.MallocAsync(7*g, pe.a) // after a: on eight granules
	require.NoError(t, err)

	xb, err := pe.p.ExportPointer(b)
	require.NoError(t, err)
	require.Equal(t, uint64(b-pe.p.Base()), xb.Offset)
	require.Equal(t, 7*g, xb.Size)
	// The granule it shares with a, its interior in one chunk, the
	// granule it ends in.
	require.Len(t, xb.Chunks, 3, "the allocation lies on three chunks")
	for i, size := range []uint64{g, 6 * g, g} {
		require.Equal(t, size, xb.Chunks[i].Size)
	}
	require.LessOrEqual(t, xb.Chunks[0].Offset, xb.Offset)
	require.GreaterOrEqual(t, xb.Chunks[2].Offset+xb.Chunks[2].Size, xb.Offset+xb.Size, "they cover the allocation")
	covered := xb.Chunks[0].Offset
	for _, ch := range xb.Chunks {
		require.Equal(t, covered, ch.Offset, "chunks back to back")
		require.NotZero(t, ch.ID)
		require.Equal(t, driver.HandlePOSIXFD, ch.Shareable.Type)
		require.Positive(t, ch.Shareable.FD)
		require.Equal(t, ch.Size, ch.Shareable.Size)
		covered += ch.Size
	}
	require.LessOrEqual(t, xb.Chunks[0].Offset, xb.Offset)
	require.GreaterOrEqual(t, covered, xb.Offset+xb.Size)
	require.NotEqual(t, xb.Chunks[0].ID, xb.Chunks[1].ID)

	// Twice: the same chunks, handles exported once; two imports counted.
	again, err := pe.p.ExportPointer(b)
	require.NoError(t, err)
	require.Equal(t, xb, again)
	drivertest.RequireIs(t, pe.p.FreeAsync(b, pe.a), driver.ErrBusy, "2 other process(es)")
	require.NoError(t, pe.p.ReleaseImport(b))
	drivertest.RequireIs(t, pe.p.FreeAsync(b, pe.a), driver.ErrBusy, "1 other process(es)")
	require.NoError(t, pe.p.ReleaseImport(b))
	require.NoError(t, pe.p.FreeAsync(b, pe.a))

	// Bad input: an error, and the counts unchanged.
	imports := func() map[driver.Addr]int {
		pe.p.mu.Lock()
		defer pe.p.mu.Unlock()
		out := map[driver.Addr]int{}
		for k, v := range pe.p.imports {
			out[k] = v
		}
		return out
	}
	before := imports()
	_, err = pe.p.ExportPointer(b)
	drivertest.RequireIs(t, err, driver.ErrNotAllocated, "live allocation")
	_, err = pe.p.ExportPointer(a + 1)
	drivertest.RequireIs(t, err, driver.ErrNotAllocated, "live allocation")
	drivertest.RequireIs(t, pe.p.ReleaseImport(a), driver.ErrNotAllocated, "no process imported it")
	require.Equal(t, before, imports())
	require.NoError(t, pe.p.Check())

	off, size, err := pe.p.Offset(a)
	require.NoError(t, err)
	require.Equal(t, uint64(a-pe.p.Base()), off)
	require.Equal(t, uint64(100), size)
	_, _, err = pe.p.Offset(b)
	drivertest.RequireIs(t, err, driver.ErrNotAllocated)
	require.NoError(t, pe.p.FreeAsync(a, pe.a))
	require.NoError(t, pe.a.Synchronize())
}

// TestExportPointerNeedsShareable: a pool created without Shareable has
// nothing to export, and says so.
func TestExportPointerNeedsShareable(t *testing.T) {
	pe := newPoolEnv(t, Props{MaxSize: 8 * g}, true, true, true)
	a, err := pe.p.MallocAsync(64, pe.a)
	require.NoError(t, err)
	_, err = pe.p.ExportPointer(a)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "without Props.Shareable")
	require.NoError(t, pe.p.FreeAsync(a, pe.a), "no import was counted")
	require.NoError(t, pe.a.Synchronize())
}

// TestBytes: a live allocation's memory, on a driver that has it; a
// pointer that is not one, or a driver without memory, is an error.
func TestBytes(t *testing.T) {
	pe := newPoolEnv(t, Props{MaxSize: 8 * g}, true, true, true)
	a, err := pe.p.MallocAsync(100, pe.a)
	require.NoError(t, err)
	require.NoError(t, pe.a.Synchronize())
	b, err := pe.p.Bytes(a)
	require.NoError(t, err)
	require.Len(t, b, 100)
	b[0] = 42
	got := make([]byte, 1)
	require.NoError(t, pe.a.CopyDtoH(got, a))
	require.NoError(t, pe.a.Synchronize())
	require.Equal(t, byte(42), got[0])
	_, err = pe.p.Bytes(a + 256)
	drivertest.RequireIs(t, err, driver.ErrNotAllocated)
	require.NoError(t, pe.p.FreeAsync(a, pe.a))
	_, err = pe.p.Bytes(a)
	drivertest.RequireIs(t, err, driver.ErrNotAllocated, "freed")
	require.NoError(t, pe.a.Synchronize())

	d, err := sim.New(sim.Options{Devices: 1, Capacity: units.GiB})
	require.NoError(t, err)
	defer d.Close()
	p, err := New(vaspace.New(d), physical.New(d), Props{})
	require.NoError(t, err)
	s, err := stream.New(d, 0)
	require.NoError(t, err)
	defer s.Destroy()
	x, err := p.MallocAsync(64, s)
	require.NoError(t, err)
	_, err = p.Bytes(x)
	drivertest.RequireIs(t, err, driver.ErrUnsupported, "not addressable from the host")
	require.NoError(t, p.FreeAsync(x, s))
	require.NoError(t, s.Synchronize())
	require.NoError(t, p.Destroy())
}
