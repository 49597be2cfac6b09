package arena

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/physical"
)

// TestBorrowSharesMemory: Borrow maps the lender's chunks at the
// borrower's addresses — a byte written through one is read through the
// other — without committing anything; decommitting the borrowed range
// gives them back, after which the lender may decommit them.
func TestBorrowSharesMemory(t *testing.T) { onEveryDriver(t, borrowSharesMemory) }

func borrowSharesMemory(t *testing.T, d backend) {
	e := d.env(t, 16*g)
	lender := e.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g, MaxChunk: 2 * g})
	borrower := e.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g})
	require.NoError(t, lender.Commit(0, 4*g)) // two chunks of 2 granules
	require.NoError(t, lender.Write(0, 2*g+5, []byte("lent")))
	require.NoError(t, borrower.Borrow(5*g, lender, 2*g, 2*g))
	buf := make([]byte, 4)
	require.NoError(t, borrower.Read(0, 5*g+5, buf))
	require.Equal(t, "lent", string(buf))
	require.NoError(t, borrower.Write(0, 6*g, []byte("back")))
	require.NoError(t, lender.Read(0, 3*g, buf))
	require.Equal(t, "back", string(buf), "one physical chunk behind both addresses")
	require.Equal(t, []Extent{{5 * g, 2 * g, 0, true}}, borrower.Layout())
	st := borrower.Stats()
	require.Equal(t, 2*g, st.Borrowed)
	require.Zero(t, st.Committed)
	require.Equal(t, 1, st.MapEvents)
	require.Equal(t, 4*g, e.used(t, 0), "nothing new committed")

	// A second borrower of the same chunk: pinned twice.
	other := e.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g})
	require.NoError(t, other.Borrow(0, lender, 2*g, 2*g))
	require.NoError(t, borrower.Decommit(5*g, 2*g))
	drivertest.RequireIs(t, lender.Decommit(2*g, 2*g), driver.ErrBusy, "lent")
	require.NoError(t, other.Close(), "closing gives back too")
	require.NoError(t, lender.Decommit(2*g, 2*g))
	require.Equal(t, 2*g, e.used(t, 0))
	for _, s := range []*Sparse{lender, borrower, other} {
		require.NoError(t, s.Check())
	}
}

// TestBorrowBadInput: every refusal of Borrow, each leaving both ranges,
// and the devices, as they were.
func TestBorrowBadInput(t *testing.T) { onEveryDriver(t, borrowBadInput) }

func borrowBadInput(t *testing.T, d backend) {
	e := d.env(t, 16*g)
	lender := e.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g, MaxChunk: 2 * g})
	big := e.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: 2 * g})
	s := e.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g})
	require.NoError(t, lender.Commit(0, 4*g)) // chunks [0, 2g) and [2g, 4g)
	require.NoError(t, lender.Commit(6*g, g)) // a chunk of one granule at 6g
	require.NoError(t, s.Commit(7*g, g))
	require.NoError(t, big.Commit(0, 2*g))
	middle := e.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g})
	require.NoError(t, middle.Borrow(0, lender, 0, 2*g)) // middle's [0, 2g) is borrowed

	other := newEnv(t, 16*g)
	foreign, err := NewSparse(other.space, other.mem, SparseOptions{Max: 8 * g, ChunkSize: g})
	require.NoError(t, err)
	t.Cleanup(func() { _ = foreign.Close() })
	require.NoError(t, foreign.Commit(0, g))
	sameDriverOtherMemory, err := NewSparse(e.space, physical.New(e.drv), SparseOptions{Max: 8 * g, ChunkSize: g})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sameDriverOtherMemory.Close() })
	closed := e.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g})
	require.NoError(t, closed.Close())

	type state struct {
		st     [3]SparseStats
		layout [3][]Extent
		used   uint64
	}
	snap := func() state {
		var x state
		for i, r := range []*Sparse{s, lender, middle} {
			require.NoError(t, r.Check())
			x.st[i], x.layout[i] = r.Stats(), r.Layout()
		}
		x.used = e.used(t, 0)
		return x
	}
	for _, c := range []struct {
		name     string
		call     func() error
		sentinel error
		mentions string
	}{
		{"nil borrower", func() error { return (*Sparse)(nil).Borrow(0, lender, 0, 2*g) }, driver.ErrInvalid, "borrowing range is nil"},
		{"zero borrower", func() error { return (&Sparse{}).Borrow(0, lender, 0, 2*g) }, driver.ErrInvalid, "not made by NewSparse"},
		{"nil lender", func() error { return s.Borrow(0, nil, 0, 2*g) }, driver.ErrInvalid, "lender is nil"},
		{"zero lender", func() error { return s.Borrow(0, &Sparse{}, 0, 2*g) }, driver.ErrInvalid, "lender is nil"},
		{"itself", func() error { return s.Borrow(0, s, 7*g, g) }, driver.ErrInvalid, "from itself"},
		{"other driver", func() error { return s.Borrow(0, foreign, 0, g) }, driver.ErrInvalid, "another physical memory"},
		{"other memory", func() error { return s.Borrow(0, sameDriverOtherMemory, 0, g) }, driver.ErrInvalid, "another physical memory"},
		{"closed lender", func() error { return s.Borrow(0, closed, 0, g) }, driver.ErrClosed, "lender is closed"},
		{"zero size", func() error { return s.Borrow(0, lender, 0, 0) }, driver.ErrInvalid, "size is zero"},
		{"misaligned offset", func() error { return s.Borrow(g/2, lender, 0, 2*g) }, driver.ErrMisaligned, "whole chunks"},
		{"misaligned size", func() error { return s.Borrow(0, lender, 0, 2*g+g/2) }, driver.ErrMisaligned, "whole chunks"},
		{"misaligned lender offset", func() error { return s.Borrow(0, lender, g/2, g) }, driver.ErrMisaligned, "lender's span"},
		{"past the end", func() error { return s.Borrow(6*g, lender, 0, 4*g) }, driver.ErrNotReserved, "past the range's end"},
		{"wrapping", func() error { return s.Borrow(2*g, lender, 0, ^uint64(0)-g+1) }, driver.ErrNotReserved, ""},
		{"uncommitted in the lender", func() error { return s.Borrow(0, lender, 4*g, 2*g) }, driver.ErrNotMapped, "not committed"},
		{"cutting a lender chunk", func() error { return s.Borrow(0, lender, 0, g) }, driver.ErrPartial, "cuts the chunk"},
		{"a borrowed chunk", func() error { return s.Borrow(0, middle, 0, 2*g) }, driver.ErrInvalid, "itself borrowed"},
		{"chunk smaller than the borrower's", func() error { return big.Borrow(2*g, lender, 6*g, g) }, driver.ErrMisaligned, ""},
		{"overlapping the borrower", func() error { return s.Borrow(6*g, lender, 0, 2*g) }, driver.ErrOverlap, "not wholly uncommitted"},
		{"overlapping partly", func() error { return s.Borrow(5*g, lender, 0, 4*g) }, driver.ErrNotReserved, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := snap()
			drivertest.RequireIs(t, c.call(), c.sentinel, c.mentions)
			require.Equal(t, before, snap())
		})
	}
	// The lender's chunks are not pinned by any refusal: it can give them
	// all back but the one middle borrows.
	require.NoError(t, lender.Decommit(2*g, 2*g))
	require.NoError(t, lender.Decommit(6*g, g))
	drivertest.RequireIs(t, lender.Decommit(0, 2*g), driver.ErrBusy, "lent")
	require.NoError(t, middle.Close())
	require.NoError(t, s.Close())
	drivertest.RequireIs(t, s.Borrow(0, lender, 0, 2*g), driver.ErrClosed, "closed range")
}

// TestBorrowEachOther: two ranges that borrow from each other, borrowing
// and giving back at the same time from several goroutines, do not
// deadlock (no range's lock is held while the other's is taken) and end
// with nothing pinned.
func TestBorrowEachOther(t *testing.T) { onEveryDriver(t, borrowEachOther) }

func borrowEachOther(t *testing.T, d backend) {
	e := d.env(t, 32*g)
	a := e.sparse(t, SparseOptions{Max: 16 * g, ChunkSize: g})
	b := e.sparse(t, SparseOptions{Max: 16 * g, ChunkSize: g})
	require.NoError(t, a.Commit(0, 4*g))
	require.NoError(t, b.Commit(0, 4*g))
	rounds := 200
	if testing.Short() {
		rounds = 50
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, pair := range [][2]*Sparse{{a, b}, {b, a}} {
		borrower, lender := pair[0], pair[1]
		for k := uint64(0); k < 4; k++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < rounds; i++ {
					if err := borrower.Borrow((8+2*k)*g, lender, k*g, g); err != nil {
						t.Errorf("borrow %d: %v", k, err)
						return
					}
					if err := borrower.Decommit((8+2*k)*g, g); err != nil {
						t.Errorf("give back %d: %v", k, err)
						return
					}
				}
			}()
		}
	}
	go func() { wg.Wait(); close(done) }()
	<-done
	require.NoError(t, a.Check())
	require.NoError(t, b.Check())
	require.NoError(t, a.Decommit(0, 4*g), "nothing left pinned")
	require.NoError(t, b.Decommit(0, 4*g))
}

// TestMoveAndBorrowRace: a Move and Borrows of the same chunk at the same
// time (Borrow pins under the lender's mu alone, so it can come between
// the move's plan and its swap): each either happens or is refused with
// ErrBusy, the borrower always reads the chunk's bytes, and no chunk is
// released while a borrower maps it.
func TestMoveAndBorrowRace(t *testing.T) { onEveryDriver(t, moveAndBorrowRace) }

func moveAndBorrowRace(t *testing.T, d backend) {
	d.SkipMixedDevices(t) // the borrower's range meets the chunk on both devices
	e := d.env(t, 16*g)
	s := e.sparse(t, SparseOptions{Max: 4 * g, ChunkSize: g, Access: []driver.DeviceID{0, 1}})
	b := e.sparse(t, SparseOptions{Max: 4 * g, ChunkSize: g})
	require.NoError(t, s.Commit(0, g))
	require.NoError(t, s.Write(0, 0, []byte("kept")))
	rounds := 100
	var wg sync.WaitGroup
	var borrowed int
	wg.Add(2)
	go func() {
		defer wg.Done()
		for i := 0; i < rounds; i++ {
			if err := s.Move(0, g, driver.DeviceID(i%2)); err != nil && !errors.Is(err, driver.ErrBusy) {
				t.Errorf("move: %v", err)
				return
			}
		}
	}()
	go func() {
		defer wg.Done()
		buf := make([]byte, 4)
		for i := 0; i < rounds; i++ {
			err := b.Borrow(0, s, 0, g)
			if errors.Is(err, driver.ErrBusy) {
				continue
			}
			if err != nil {
				t.Errorf("borrow: %v", err)
				return
			}
			borrowed++
			if err := b.Read(0, 0, buf); err != nil || string(buf) != "kept" {
				t.Errorf("read through the borrower: %q, %v", buf, err)
			}
			if err := b.Decommit(0, g); err != nil {
				t.Errorf("give back: %v", err)
				return
			}
		}
	}()
	wg.Wait()
	require.Positive(t, borrowed)
	require.NoError(t, s.Check())
	require.NoError(t, b.Check())
	buf := make([]byte, 4)
	require.NoError(t, s.Read(0, 0, buf))
	require.Equal(t, "kept", string(buf))
	require.Equal(t, g, e.used(t, 0)+e.used(t, 1))
}
