package arena

import (
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
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
