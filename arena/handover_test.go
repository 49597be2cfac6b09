package arena

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
)

// TestHandOverKeepsTheMapping: HandOver makes the new owner own the
// chunks — mapped in it, counted in its Committed — while the giver keeps
// them mapped at the same offsets as borrowed: a byte written through one
// address is read through the other, nothing is committed, and the
// chunks outlive the giver's mapping (the owner decommits them last).
func TestHandOverKeepsTheMapping(t *testing.T) { onEveryDriver(t, handOverKeepsTheMapping) }

func handOverKeepsTheMapping(t *testing.T, d backend) {
	e := d.env(t, 16*g)
	giver := e.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g})
	owner := e.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g})
	require.NoError(t, giver.Commit(0, 4*g))
	require.NoError(t, giver.Write(0, g+7, []byte("kept")))
	v, err := giver.ViewReadOnly(g, g)
	require.NoError(t, err)
	require.NoError(t, giver.HandOver(g, 2*g, owner, 5*g))
	buf := make([]byte, 4)
	require.NoError(t, owner.Read(0, 5*g+7, buf))
	require.Equal(t, "kept", string(buf))
	require.NoError(t, giver.Read(0, g+7, buf))
	require.Equal(t, "kept", string(buf), "still mapped where it was")
	require.NoError(t, owner.Write(0, 6*g, []byte("both")))
	require.NoError(t, giver.Read(0, 2*g, buf))
	require.Equal(t, "both", string(buf), "one chunk behind both addresses")
	require.Equal(t, []Extent{{0, g, 0, false}, {g, 2 * g, 0, true}, {3 * g, g, 0, false}}, giver.Layout())
	gs, os := giver.Stats(), owner.Stats()
	require.Equal(t, 2*g, gs.Committed)
	require.Equal(t, 2*g, gs.Borrowed)
	require.Equal(t, 2*g, os.Committed)
	require.Equal(t, 4*g, e.used(t, 0), "nothing new committed")
	require.NoError(t, v.Release(), "a view over handed-over chunks stays live")
	drivertest.RequireIs(t, owner.Decommit(5*g, 2*g), driver.ErrBusy, "lent")
	require.NoError(t, giver.Decommit(0, 4*g))
	require.Equal(t, 2*g, e.used(t, 0), "the owner's chunks outlive the giver's mapping")
	require.NoError(t, owner.Read(0, 5*g+7, buf))
	require.Equal(t, "kept", string(buf))
	require.NoError(t, owner.Decommit(5*g, 2*g))
	require.Zero(t, e.used(t, 0))
	require.NoError(t, giver.Check())
	require.NoError(t, owner.Check())
}

// TestHandOverBadInput: every refusal of HandOver, each leaving both
// ranges' layouts and the device as they were.
func TestHandOverBadInput(t *testing.T) { onEveryDriver(t, handOverBadInput) }

func handOverBadInput(t *testing.T, d backend) {
	e := d.env(t, 16*g)
	giver := e.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g, MaxChunk: 2 * g})
	owner := e.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g})
	big := e.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: 4 * g})
	lender := e.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g})
	borrower := e.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g})
	require.NoError(t, giver.Commit(0, 4*g)) // chunks [0, 2g) and [2g, 4g)
	require.NoError(t, owner.Commit(6*g, g))
	require.NoError(t, lender.Commit(0, g))
	require.NoError(t, borrower.Borrow(0, lender, 0, g))
	require.NoError(t, lender.Commit(2*g, g))
	closed := e.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g})
	require.NoError(t, closed.Close())

	layouts := func() string {
		return fmt.Sprint(giver.Layout(), owner.Layout(), big.Layout(), lender.Layout(), borrower.Layout(), e.used(t, 0))
	}
	before := layouts()
	for _, c := range []struct {
		name     string
		from, to *Sparse
		off, n   uint64
		toOff    uint64
		want     error
		fragment string
	}{
		{"nil giver", nil, owner, 0, 2 * g, 0, driver.ErrInvalid, ""},
		{"nil owner", giver, nil, 0, 2 * g, 0, driver.ErrInvalid, "nil"},
		{"itself", giver, giver, 0, 2 * g, 4 * g, driver.ErrInvalid, "itself"},
		{"zero size", giver, owner, 0, 0, 0, driver.ErrInvalid, ""},
		{"closed giver", closed, owner, 0, g, 0, driver.ErrClosed, ""},
		{"closed owner", giver, closed, 0, 2 * g, 0, driver.ErrClosed, ""},
		{"not committed", giver, owner, 4 * g, g, 0, driver.ErrNotMapped, ""},
		{"cuts a chunk", giver, owner, 0, g, 0, driver.ErrPartial, ""},
		{"borrowed", borrower, owner, 0, g, 0, driver.ErrInvalid, "borrowed"},
		{"lent", lender, owner, 0, g, 0, driver.ErrBusy, "lent"},
		{"owner's chunk size", giver, big, 0, 2 * g, 0, driver.ErrMisaligned, ""},
		{"owner's span taken", giver, owner, 0, 2 * g, 5 * g, driver.ErrOverlap, "uncommitted"},
		{"owner's span past its end", giver, owner, 0, 2 * g, 7 * g, driver.ErrNotReserved, ""},
		{"owner's span misaligned", giver, owner, 0, 2 * g, g / 2, driver.ErrMisaligned, ""},
	} {
		err := c.from.HandOver(c.off, c.n, c.to, c.toOff)
		t.Log(c.name)
		drivertest.RequireIs(t, err, c.want, c.fragment)
		require.Equal(t, before, layouts(), c.name+": nothing changed")
	}
	for _, s := range []*Sparse{giver, owner, big, lender, borrower} {
		require.NoError(t, s.Check())
	}
}

// TestHandOverEach: spans apart in the giver go side by side in the new
// owner in one call, all or none: a bad span, or spans that overlap,
// change nothing.
func TestHandOverEach(t *testing.T) { onEveryDriver(t, handOverEach) }

func handOverEach(t *testing.T, d backend) {
	e := d.env(t, 16*g)
	giver := e.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g})
	owner := e.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g})
	require.NoError(t, giver.Commit(0, g))
	require.NoError(t, giver.Commit(4*g, g))
	require.NoError(t, giver.Write(0, 4*g+3, []byte("far")))
	before := fmt.Sprint(giver.Layout(), owner.Layout())
	drivertest.RequireIs(t, giver.HandOverEach([]uint64{0, 2 * g}, g, owner, 0), driver.ErrNotMapped)
	drivertest.RequireIs(t, giver.HandOverEach([]uint64{0, 0}, g, owner, 0), driver.ErrOverlap, "overlap")
	drivertest.RequireIs(t, giver.HandOverEach(nil, g, owner, 0), driver.ErrInvalid, "nothing")
	require.Equal(t, before, fmt.Sprint(giver.Layout(), owner.Layout()), "all or none")
	require.NoError(t, giver.HandOverEach([]uint64{4 * g, 0}, g, owner, 2*g))
	buf := make([]byte, 3)
	require.NoError(t, owner.Read(0, 2*g+3, buf))
	require.Equal(t, "far", string(buf), "in the order named")
	require.Equal(t, []Extent{{2 * g, 2 * g, 0, false}}, owner.Layout())
	require.Equal(t, []Extent{{0, g, 0, true}, {4 * g, g, 0, true}}, giver.Layout())
	require.NoError(t, giver.Close(), "closing gives back too")
	require.NoError(t, owner.Decommit(2*g, 2*g))
	require.Zero(t, e.used(t, 0))
	require.NoError(t, owner.Check())
}
