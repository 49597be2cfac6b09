package arena

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/mapping"
)

// TestRangeKeepsItsReservation: the range's reservation is the range's.
// The caller who passed the Space in cannot free it through the Space
// (Reservations()[i].Free) nor close the Space under the range: both are
// refused (ErrBusy, naming the owner) and change nothing; the range goes
// on, passes Check and closes, and then the Space closes. A reservation
// unreserved through the driver (nothing mapped) is reported by the
// range's Check, and the range still closes. (Before, the Free went
// through with nothing committed, the range's Check still passed and its
// Close failed for ever.)
func TestRangeKeepsItsReservation(t *testing.T) {
	e := newEnv(t, 8*g)
	s := e.sparse(t, SparseOptions{Max: 4 * g, ChunkSize: g})
	rs := e.space.Reservations()
	require.Len(t, rs, 1)
	res := rs[0]
	require.Equal(t, s.Range(), res.Range())

	drivertest.RequireIs(t, res.Free(), driver.ErrBusy, "kept by an arena range")
	drivertest.RequireIs(t, e.space.Close(), driver.ErrBusy, "kept by an arena range")
	require.False(t, res.Freed())
	require.Equal(t, []Extent(nil), s.Layout())
	require.NoError(t, s.Check())
	require.NoError(t, e.space.Check())
	require.NoError(t, s.Commit(0, g), "the range goes on")
	require.NoError(t, s.Write(0, 0, []byte("kept")))
	buf := make([]byte, 4)
	require.NoError(t, s.Read(0, 0, buf))
	require.Equal(t, "kept", string(buf))
	require.NoError(t, s.Close())
	require.True(t, res.Freed())
	require.NoError(t, e.space.Close())

	// Unreserved through the driver, behind everyone's back.
	f := newEnv(t, 8*g)
	u := f.sparse(t, SparseOptions{Max: 4 * g, ChunkSize: g})
	require.NoError(t, f.drv.Unreserve(u.Range().Base, u.Range().Size))
	err := u.Check()
	require.True(t, errors.HasAssertionFailure(err), "%v", err)
	require.ErrorContains(t, err, "behind the space's back")
	require.Error(t, u.Commit(0, g), "nothing maps into a range the driver no longer reserves")
	drivertest.RequireIs(t, u.Close(), driver.ErrNotReserved, "no longer holds the range")
	require.True(t, u.Closed(), "the range closed all the same")
	require.NoError(t, u.Check())
	require.NoError(t, f.mem.Check())
	require.NoError(t, f.space.Close())
}

// TestAllocatorCheckSeesForeignMappings: a caller who reaches an
// allocator's reservations through the Space cannot lay a table of its
// own over one (mapping.New refuses, ErrBusy naming the owner), and a
// chunk mapped into one through the driver fails the allocator's Check
// (its ranges' tables compare themselves with the driver's own record);
// once unmapped, Check passes and the allocator closes. (Before, the
// second table mapped foreign chunks into the allocator's range and the
// allocator's Check passed.)
func TestAllocatorCheckSeesForeignMappings(t *testing.T) {
	e := newEnv(t, 16*g)
	al, err := NewAllocator(e.space, e.mem, AllocatorOptions{Max: 4 * g, ChunkSize: g})
	require.NoError(t, err)
	p, err := al.Alloc(100, 0)
	require.NoError(t, err)
	rs := e.space.Reservations()
	require.NotEmpty(t, rs)
	for _, res := range rs {
		_, err := mapping.New(res, e.mem)
		drivertest.RequireIs(t, err, driver.ErrBusy, "kept by an arena range")
	}
	require.NoError(t, al.Check())

	res := rs[len(rs)-1]
	h, err := e.drv.Create(0, g, driver.ChunkOptions{})
	require.NoError(t, err)
	at := res.Base() + driver.Addr(res.Size()-g)
	require.NoError(t, e.drv.Map(at, h))
	err = al.Check()
	require.True(t, errors.HasAssertionFailure(err), "%v", err)
	require.ErrorContains(t, err, "behind this table's back")
	require.NoError(t, e.drv.Unmap(at, g))
	require.NoError(t, e.drv.Release(h))
	require.NoError(t, al.Check())
	require.NoError(t, al.Free(p))
	require.NoError(t, al.Close())
	require.NoError(t, e.mem.Check())
}
