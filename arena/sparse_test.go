package arena

import (
	"fmt"

	"github.com/vmarena/vmarena/internal/errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/internal/leakcheck"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// parity places chunk i on device i mod 2, then the other.
type parity struct{}

func (parity) Order(_ uint64, i int, _ []uint64) []driver.DeviceID {
	return []driver.DeviceID{driver.DeviceID(i % 2), driver.DeviceID(1 - i%2)}
}
func (parity) String() string { return "by parity" }

func (e *env) sparse(t testing.TB, opts SparseOptions) *Sparse {
	t.Helper()
	s, err := NewSparse(e.space, e.mem, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestCommitDecommitAnywhere: chunks come and go in any order, holes and
// all; the range's books, the page table and the device's usage agree at
// each step, and bytes written survive commits and decommits elsewhere.
func TestCommitDecommitAnywhere(t *testing.T) { onEveryDriver(t, commitDecommitAnywhere) }

func commitDecommitAnywhere(t *testing.T, d backend) {
	e := d.env(t, 16*g)
	s := e.sparse(t, SparseOptions{Max: 16 * g, ChunkSize: g})
	require.NoError(t, s.Commit(4*g, 2*g))
	require.NoError(t, s.Commit(10*g, g))
	require.NoError(t, s.Commit(0, g))
	require.Equal(t, 4*g, s.Committed())
	require.Equal(t, []Extent{{0, g, 0, false}, {4 * g, 2 * g, 0, false}, {10 * g, g, 0, false}}, s.Layout())
	require.NoError(t, s.Write(0, 5*g, []byte("kept")))
	require.NoError(t, s.Commit(0, 12*g), "commits the holes only")
	require.Equal(t, 12*g, s.Committed())
	require.Equal(t, 6, s.Stats().MapEvents, "three commits of one range each, then one filling three holes: an event per hole")
	require.NoError(t, s.Decommit(2*g, 2*g))
	require.NoError(t, s.Decommit(8*g, 4*g))
	require.NoError(t, s.Decommit(14*g, 2*g), "nothing committed there: nothing to do")
	require.Equal(t, 6*g, s.Committed())
	require.Equal(t, 6*g, e.used(t, 0))
	buf := make([]byte, 4)
	require.NoError(t, s.Read(0, 5*g, buf))
	require.Equal(t, "kept", string(buf))
	drivertest.RequireIs(t, s.Read(0, 2*g, buf), driver.ErrAccessDenied, "not committed")
	st := s.Stats()
	require.Equal(t, 2, st.Decommits)
	require.Equal(t, 6*g, st.DecommittedBytes)
	require.Equal(t, 12*g, st.PeakCommitted)
	require.NoError(t, s.Check())
}

// TestSparseBadInput: every refusal, each leaving the range as it was.
func TestSparseBadInput(t *testing.T) { onEveryDriver(t, sparseBadInput) }

func sparseBadInput(t *testing.T, d backend) {
	e := d.env(t, 6*g)
	for _, c := range []struct {
		name     string
		opts     SparseOptions
		sentinel error
		mentions string
	}{
		{"zero max", SparseOptions{ChunkSize: g}, driver.ErrInvalid, "Max is zero"},
		{"unknown device", SparseOptions{Max: g, ChunkSize: g, Device: 7}, driver.ErrNoDevice, "device 7"},
		{"odd chunk", SparseOptions{Max: 4 * g, ChunkSize: g + 4096}, driver.ErrMisaligned, "granularity"},
		{"max chunk", SparseOptions{Max: 4 * g, ChunkSize: g, MaxChunk: g / 2}, driver.ErrMisaligned, "MaxChunk"},
		{"on full", SparseOptions{Max: 4 * g, ChunkSize: g, OnFull: 9}, driver.ErrInvalid, "OnFull"},
		{"access", SparseOptions{Max: 4 * g, ChunkSize: g, Access: []driver.DeviceID{3}}, driver.ErrNoDevice, "device 3"},
	} {
		_, err := NewSparse(e.space, e.mem, c.opts)
		drivertest.RequireIs(t, err, c.sentinel, c.mentions)
	}
	_, err := NewSparse(nil, e.mem, SparseOptions{Max: g})
	drivertest.RequireIs(t, err, driver.ErrInvalid, "nil")
	require.Empty(t, e.space.Reservations(), "failed NewSparse reserved nothing")

	s := e.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g, MaxChunk: 2 * g})
	require.NoError(t, s.Commit(0, 4*g)) // two chunks of 2 granules
	v, err := s.View(0, 10)
	require.NoError(t, err)
	state := func() (SparseStats, []Extent, uint64) {
		require.NoError(t, s.Check())
		return s.Stats(), s.Layout(), e.used(t, 0)
	}
	for _, c := range []struct {
		name     string
		call     func() error
		sentinel error
		mentions string
	}{
		{"commit zero", func() error { return s.Commit(0, 0) }, driver.ErrInvalid, "zero"},
		{"commit misaligned", func() error { return s.Commit(g/2, g) }, driver.ErrMisaligned, "whole chunks"},
		{"commit past max", func() error { return s.Commit(6*g, 4*g) }, driver.ErrNotReserved, "past the range's end"},
		{"commit wrapping", func() error { return s.Commit(2*g, ^uint64(0)-g+1) }, driver.ErrNotReserved, ""},
		{"commit out of memory", func() error { return s.Commit(4*g, 4*g) }, driver.ErrOutOfMemory, "needed 256 KiB more committed"},
		{"decommit half a chunk", func() error { return s.Decommit(2*g, g) }, driver.ErrPartial, "cuts the chunk"},
		{"decommit under a view", func() error { return s.Decommit(0, 2*g) }, driver.ErrBusy, "view"},
		{"view uncommitted", func() error { _, err := s.View(4*g, 1); return err }, driver.ErrNotMapped, "not committed"},
		{"view wrapping", func() error { _, err := s.View(1, ^uint64(0)); return err }, driver.ErrNotMapped, ""},
		{"grant uncommitted", func() error { return s.Grant(1, 4*g, 2*g, driver.AccessRead) }, driver.ErrNotMapped, "not committed"},
		{"grant half a chunk", func() error { return s.Grant(1, 0, g, driver.AccessRead) }, driver.ErrPartial, "cuts"},
		{"grant unknown device", func() error { return s.Grant(4, 0, 2*g, driver.AccessRead) }, driver.ErrNoDevice, ""},
		{"grant bad access", func() error { return s.Grant(1, 0, 2*g, 9) }, driver.ErrInvalid, ""},
		{"set access unknown device", func() error { return s.SetAccess(4, driver.AccessRead) }, driver.ErrNoDevice, ""},
		{"move unknown device", func() error { return s.Move(0, 2*g, 4) }, driver.ErrNoDevice, ""},
		{"move uncommitted", func() error { return s.Move(4*g, 2*g, 1) }, driver.ErrNotMapped, ""},
		{"move under a view", func() error { return s.Move(0, 2*g, 1) }, driver.ErrBusy, "1 live view(s) pin the chunk at 0x0"},
		{"revoke write under a view", func() error { return s.Grant(0, 0, 2*g, driver.AccessRead) }, driver.ErrBusy, "live view"},
		{"set access to none under a view", func() error { return s.SetAccess(0, driver.AccessNone) }, driver.ErrBusy, "live view"},
		{"read unknown device", func() error { return s.Read(5, 0, make([]byte, 1)) }, driver.ErrNoDevice, ""},
		{"write past the end", func() error { return s.Write(0, 8*g-1, make([]byte, 2)) }, driver.ErrAccessDenied, "past"},
		{"write without access", func() error { return s.Write(1, 0, make([]byte, 2)) }, driver.ErrAccessDenied, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.sentinel == nil {
				return
			}
			st, l, u := state()
			drivertest.RequireIs(t, c.call(), c.sentinel, c.mentions)
			st2, l2, u2 := state()
			require.Equal(t, st, st2)
			require.Equal(t, l, l2)
			require.Equal(t, u, u2)
		})
	}
	// Moving more than the target device holds: refused, nothing made.
	other := e.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g, Device: 1})
	require.NoError(t, other.Commit(0, 5*g))
	st, l, _ := state()
	drivertest.RequireIs(t, s.Move(2*g, 2*g, 1), driver.ErrOutOfMemory, "device 1")
	st2, l2, _ := state()
	require.Equal(t, st, st2)
	require.Equal(t, l, l2)
	require.Equal(t, 5*g, e.used(t, 1))

	drivertest.RequireIs(t, s.Close(), driver.ErrBusy, "view")
	require.NoError(t, v.Release())
	drivertest.RequireIs(t, v.Release(), driver.ErrClosed)
	require.NoError(t, s.Close())
	for _, call := range []func() error{
		func() error { return s.Commit(0, g) }, func() error { return s.Decommit(0, g) },
		func() error { return s.Grant(0, 0, g, driver.AccessRead) }, func() error { return s.SetAccess(0, driver.AccessRead) },
		func() error { return s.Move(0, g, 1) }, s.Close, func() error { _, err := s.View(0, 1); return err },
		func() error { return s.Read(0, 0, make([]byte, 1)) }, func() error { _, err := s.DeviceAt(0); return err },
	} {
		drivertest.RequireIs(t, call(), driver.ErrClosed, "closed range")
	}
	require.Zero(t, e.used(t, 0))
}

// TestGrantAndSetAccess: SetAccess reaches every chunk, now and later;
// Grant only the range and device named; a refusal part-way puts back
// what changed.
func TestGrantAndSetAccess(t *testing.T) { onEveryDriver(t, grantAndSetAccess) }

func grantAndSetAccess(t *testing.T, d backend) {
	e := d.env(t, 16*g)
	s := e.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g})
	require.NoError(t, s.Commit(0, 2*g))
	require.NoError(t, s.SetAccess(1, driver.AccessRead))
	require.NoError(t, s.Commit(4*g, g))
	for _, off := range []uint64{0, g, 4 * g} {
		acc, err := s.AccessAt(1, off)
		require.NoError(t, err)
		require.Equal(t, driver.AccessRead, acc, "offset %#x", off)
	}
	require.NoError(t, s.Grant(1, g, g, driver.AccessReadWrite))
	require.NoError(t, s.Write(1, g, []byte{7}))
	drivertest.RequireIs(t, s.Write(1, 0, []byte{7}), driver.ErrAccessDenied)
	require.NoError(t, s.Grant(1, 0, 2*g, driver.AccessNone))
	drivertest.RequireIs(t, s.Read(1, g, make([]byte, 1)), driver.ErrAccessDenied)
	acc, err := s.AccessAt(1, 4*g)
	require.NoError(t, err)
	require.Equal(t, driver.AccessRead, acc, "a grant elsewhere leaves the chunk at 4 alone")
	require.NoError(t, s.Check())
}

// TestMoveKeepsBytesAndAccess: a move changes the device behind the same
// addresses and nothing else; it refuses chunks a live view covers.
func TestMoveKeepsBytesAndAccess(t *testing.T) { onEveryDriver(t, moveKeepsBytesAndAccess) }

func moveKeepsBytesAndAccess(t *testing.T, d backend) {
	d.SkipMixedDevices(t) // the range places chunks on both devices
	e := d.env(t, 16*g)
	s := e.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g, Placement: parity{}, Access: []driver.DeviceID{0, 1}})
	require.NoError(t, s.Commit(0, 4*g))
	require.Equal(t, []Extent{{0, g, 0, false}, {g, g, 1, false}, {2 * g, g, 0, false}, {3 * g, g, 1, false}}, s.Layout())
	v, err := s.View(0, 4*g)
	require.NoError(t, err)
	b := make([]byte, 4*g)
	for i := range b {
		b[i] = byte(i * 7)
	}
	e.writeView(t, v, 0, b)
	before := s.Stats()
	drivertest.RequireIs(t, s.Move(0, 4*g, 1), driver.ErrBusy, "live view")
	require.Equal(t, before, s.Stats())
	require.NoError(t, v.Release())
	require.NoError(t, s.Grant(0, g, g, driver.AccessRead))
	// The chunk at 2g is mapped with no access for any device: the host
	// cannot read it in place, so the move copies it through a mapping of
	// its own (the others are read where the range maps them).
	for dev := range driver.DeviceID(2) {
		require.NoError(t, s.Grant(dev, 2*g, g, driver.AccessNone))
	}
	require.NoError(t, s.Move(0, 4*g, 1))
	require.Equal(t, []Extent{{0, 4 * g, 1, false}}, s.Layout())
	acc, err := s.AccessAt(0, 2*g)
	require.NoError(t, err)
	require.Equal(t, driver.AccessNone, acc, "no access moved with the chunk")
	for dev := range driver.DeviceID(2) {
		require.NoError(t, s.Grant(dev, 2*g, g, driver.AccessReadWrite))
	}
	v, err = s.View(0, 4*g)
	require.NoError(t, err)
	b = e.readView(t, v, 0, len(b))
	for i := range b {
		require.Equal(t, byte(i*7), b[i], "byte %d through a view after the move", i)
	}
	acc, err = s.AccessAt(0, g)
	require.NoError(t, err)
	require.Equal(t, driver.AccessRead, acc, "grants move with the chunk")
	require.Equal(t, 4*g, e.used(t, 1))
	require.Zero(t, e.used(t, 0))
	st := s.Stats()
	require.Equal(t, 1, st.Moves)
	require.Equal(t, st.Chunks, st.Creates-st.Releases, "the moved-to chunks count as the range's creates, the old as its releases")
	require.NoError(t, v.Release())
	require.NoError(t, s.Check())
}

// TestBorrowPinsTheLender: a chunk borrowed by another range cannot be
// decommitted, moved or closed in its owner until given back.
func TestBorrowPinsTheLender(t *testing.T) { onEveryDriver(t, borrowPinsTheLender) }

func borrowPinsTheLender(t *testing.T, d backend) {
	e := d.env(t, 16*g)
	lender := e.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g})
	borrower := e.sparse(t, SparseOptions{Max: 8 * g, ChunkSize: g})
	require.NoError(t, lender.Commit(0, 4*g))
	require.NoError(t, lender.Write(0, 3*g, []byte("shared")))
	require.NoError(t, borrower.borrow(2*g, lender, []uint64{3 * g, g}))
	buf := make([]byte, 6)
	require.NoError(t, borrower.Read(0, 2*g, buf))
	require.Equal(t, "shared", string(buf), "the borrower maps the lender's chunk")
	require.Equal(t, 2*g, borrower.Stats().Borrowed)
	require.Zero(t, borrower.Committed(), "borrowed memory is the lender's")
	drivertest.RequireIs(t, lender.Decommit(0, 4*g), driver.ErrBusy, "lent")
	drivertest.RequireIs(t, lender.Move(g, g, 1), driver.ErrBusy, "lent")
	drivertest.RequireIs(t, lender.Close(), driver.ErrBusy, "lent")
	drivertest.RequireIs(t, borrower.Move(2*g, g, 1), driver.ErrInvalid, "borrowed")
	require.NoError(t, borrower.Decommit(0, 8*g))
	require.NoError(t, lender.Decommit(0, 4*g))
	require.Zero(t, e.used(t, 0))
	require.NoError(t, lender.Check())
	require.NoError(t, borrower.Check())
}

// TestSparseModel runs random commit/decommit/view (plain or read-only)/
// grant/move/read/write/borrow sequences against a model of the chunks, comparing after every
// step.
func TestSparseModel(t *testing.T) {
	onEveryDriver(t, func(t *testing.T, d backend) {
		d.SkipMixedDevices(t) // the model places chunks on both devices
		readPins := 0
		for seed := uint64(0); seed < 12; seed++ {
			t.Run(fmt.Sprint(seed), func(t *testing.T) {
				r := runSparseModel(t, d, sparseOps(rand.New(rand.NewPCG(seed, 9)), 250))
				require.Greater(t, r.commits, 5)
				require.Greater(t, r.decommits, 3)
				require.Greater(t, r.moves, 0)
				require.Greater(t, r.borrows, 0)
				readPins += r.readPins
			})
		}
		require.Positive(t, readPins, "a read-only view refused a grant")
	})
}

func sparseOps(rng *rand.Rand, n int) []byte {
	b := make([]byte, 1+4*n)
	for i := range b {
		b[i] = byte(rng.UintN(256))
	}
	return b
}

// sparseRun counts what a run did; readPins the grants a read-only view
// refused.
type sparseRun struct{ commits, decommits, moves, borrows, readPins int }

// mchunk is the model of one chunk: [start, end) in chunk units. lent is
// -1 for a chunk the range owns, else the lender's chunk it borrows.
type mchunk struct {
	start, end int
	dev        driver.DeviceID
	access     [2]driver.Access
	lent       int
}

func runSparseModel(t *testing.T, d backend, data []byte) (r sparseRun) {
	const (
		n        = 16 // chunks of the range
		capacity = 7  // chunks per device
	)
	if len(data) == 0 {
		return r
	}
	cfg := data[0]
	data = data[1:]
	e := d.env(t, capacity*g)
	opts := SparseOptions{Max: n * g, ChunkSize: g, MaxChunk: g * (1 + uint64(cfg%2))}
	if cfg&2 != 0 {
		opts.Placement, opts.Access = parity{}, []driver.DeviceID{0}
	}
	s := e.sparse(t, opts)
	// lender lends its chunks (one granule each, on device 1, committed on
	// first use) to s; lenderChunks[k] says whether chunk k is committed,
	// lenderBytes[k] its first byte.
	const lenderN = 2
	lender := e.sparse(t, SparseOptions{Max: lenderN * g, ChunkSize: g, Device: 1})
	var lenderChunks [lenderN]bool
	var lenderBytes [lenderN]byte
	var chunks []mchunk // sorted by start
	def := [2]driver.Access{driver.AccessReadWrite, driver.AccessNone}
	bytes := map[int]byte{} // first byte of each committed unit that was written
	type mview struct {
		v        *View
		lo, hi   int
		readOnly bool
	}
	var views []mview
	used := func(d driver.DeviceID) (u int) {
		for _, c := range chunks {
			if c.dev == d && c.lent < 0 {
				u += c.end - c.start
			}
		}
		if d == 1 {
			for _, on := range lenderChunks {
				if on {
					u++
				}
			}
		}
		return u
	}
	lentOut := func(k int) bool {
		for _, c := range chunks {
			if c.lent == k {
				return true
			}
		}
		return false
	}
	at := func(unit int) int {
		for i, c := range chunks {
			if c.start <= unit && unit < c.end {
				return i
			}
		}
		return -1
	}
	// pinned reports whether a view covers [lo, hi); pinnedBy whether one
	// of a kind does, read-only or not.
	pinnedBy := func(lo, hi int, readOnly bool) bool {
		for _, v := range views {
			if v.lo < hi && lo < v.hi && v.readOnly == readOnly {
				return true
			}
		}
		return false
	}
	pinned := func(lo, hi int) bool { return pinnedBy(lo, hi, false) || pinnedBy(lo, hi, true) }
	span := func(x, y byte) (lo, hi int) {
		lo = int(x) % n
		return lo, min(n, lo+1+int(y)%4)
	}
	for i := 0; i+4 <= len(data) && i < 4*200; i += 4 {
		op, x, y, z := data[i]%10, data[i+1], data[i+2], data[i+3]
		lo, hi := span(x, y)
		if (op == 2 || op == 5 || op == 6) && x%2 == 0 && len(chunks) > 0 {
			// Often, exactly a chunk (or two) the range holds.
			k := int(y) % len(chunks)
			lo, hi = chunks[k].start, chunks[k].end
			if k+1 < len(chunks) && z%2 == 0 && chunks[k+1].start == hi {
				hi = chunks[k+1].end
			}
		}
		off, size := uint64(lo)*g, uint64(hi-lo)*g
		step := fmt.Sprintf("step %d: op %d [%d, %d)", i/4, op, lo, hi)
		switch op {
		case 0, 1: // commit
			var pieces []mchunk
			for u := lo; u < hi; {
				if at(u) >= 0 {
					u++
					continue
				}
				end := u + 1
				for end < hi && at(end) < 0 && end-u < int(opts.MaxChunk/g) {
					end++
				}
				pieces = append(pieces, mchunk{start: u, end: end, access: def, lent: -1})
				u = end
			}
			free := [2]int{capacity - used(0), capacity - used(1)}
			ok := true
			for k := range pieces {
				order := []driver.DeviceID{0}
				if opts.Placement != nil {
					order = parity{}.Order(0, pieces[k].start, nil)
				}
				placed := false
				for _, d := range order {
					if free[d] >= pieces[k].end-pieces[k].start {
						pieces[k].dev, placed = d, true
						free[d] -= pieces[k].end - pieces[k].start
						break
					}
				}
				ok = ok && placed
			}
			err := s.Commit(off, size)
			if !ok {
				requireStep(t, err, driver.ErrOutOfMemory, step)
				break
			}
			require.NoError(t, err, step)
			chunks = append(chunks, pieces...)
			slices.SortFunc(chunks, func(a, b mchunk) int { return a.start - b.start })
			r.commits++
		case 2: // decommit
			err := s.Decommit(off, size)
			var partial bool
			for _, c := range chunks {
				if c.start < hi && lo < c.end && (c.start < lo || c.end > hi) {
					partial = true
				}
			}
			switch {
			case partial:
				requireStep(t, err, driver.ErrPartial, step)
			case pinned(lo, hi):
				requireStep(t, err, driver.ErrBusy, step)
			default:
				require.NoError(t, err, step)
				chunks = slices.DeleteFunc(chunks, func(c mchunk) bool { return lo <= c.start && c.end <= hi })
				for u := lo; u < hi; u++ {
					delete(bytes, u)
				}
				r.decommits++
			}
		case 3: // view, read-only for odd z
			readOnly := z%2 == 1
			view := s.View
			if readOnly {
				view = s.ViewReadOnly
			}
			v, err := view(off, size)
			whole := true
			for u := lo; u < hi; u++ {
				whole = whole && at(u) >= 0
			}
			if !whole {
				requireStep(t, err, driver.ErrNotMapped, step)
				break
			}
			require.NoError(t, err, step)
			views = append(views, mview{v, lo, hi, readOnly})
		case 4: // release a view
			if len(views) > 0 {
				k := int(x) % len(views)
				require.NoError(t, views[k].v.Release(), step)
				views = slices.Delete(views, k, k+1)
			}
		case 5: // grant
			dev, acc := driver.DeviceID(z%2), []driver.Access{driver.AccessNone, driver.AccessRead, driver.AccessReadWrite}[z/2%3]
			err := s.Grant(dev, off, size, acc)
			whole, cut, unwritten, unread := true, false, false, false
			for u := lo; u < hi; u++ {
				whole = whole && at(u) >= 0
			}
			for _, c := range chunks {
				cut = cut || c.start < hi && lo < c.end && (c.start < lo || c.end > hi)
				if lo <= c.start && c.end <= hi {
					// A live view keeps its chunks writable by some device,
					// a read-only view readable.
					after := c.access
					after[dev] = acc
					was, is := c.access[0]|c.access[1], after[0]|after[1]
					unwritten = unwritten || pinnedBy(c.start, c.end, false) &&
						was.Allows(driver.AccessReadWrite) && !is.Allows(driver.AccessReadWrite)
					unread = unread || pinnedBy(c.start, c.end, true) &&
						was.Allows(driver.AccessRead) && !is.Allows(driver.AccessRead)
				}
			}
			switch {
			case !whole:
				requireStep(t, err, driver.ErrNotMapped, step)
			case cut:
				requireStep(t, err, driver.ErrPartial, step)
			case unwritten || unread:
				requireStep(t, err, driver.ErrBusy, step)
				if !unwritten {
					r.readPins++
				}
			default:
				require.NoError(t, err, step)
				for k := range chunks {
					if lo <= chunks[k].start && chunks[k].end <= hi {
						chunks[k].access[dev] = acc
					}
				}
			}
		case 6: // move
			to := driver.DeviceID(z % 2)
			err := s.Move(off, size, to)
			whole, cut, need := true, false, 0
			var refused error // the first chunk to move that cannot: borrowed, or under a view
			for u := lo; u < hi; u++ {
				whole = whole && at(u) >= 0
			}
			for _, c := range chunks {
				cut = cut || c.start < hi && lo < c.end && (c.start < lo || c.end > hi)
				if lo <= c.start && c.end <= hi && c.dev != to {
					need += c.end - c.start
					switch {
					case refused != nil:
					case c.lent >= 0:
						refused = driver.ErrInvalid
					case pinned(c.start, c.end):
						refused = driver.ErrBusy
					}
				}
			}
			switch {
			case !whole:
				requireStep(t, err, driver.ErrNotMapped, step)
			case cut:
				requireStep(t, err, driver.ErrPartial, step)
			case refused != nil:
				requireStep(t, err, refused, step)
			case need > capacity-used(to):
				requireStep(t, err, driver.ErrOutOfMemory, step)
			default:
				require.NoError(t, err, step)
				for k := range chunks {
					if lo <= chunks[k].start && chunks[k].end <= hi {
						chunks[k].dev = to
					}
				}
				if need > 0 {
					r.moves++
				}
			}
		case 7, 8: // write or read one byte at the start of unit lo, for device z%2
			dev := driver.DeviceID(z % 2)
			c := at(lo)
			want := driver.AccessRead
			if op == 7 {
				want = driver.AccessReadWrite
			}
			allowed := c >= 0 && chunks[c].access[dev].Allows(want)
			buf := []byte{z}
			var err error
			if op == 7 {
				err = s.Write(dev, off, buf)
			} else {
				err = s.Read(dev, off, buf)
			}
			if !allowed {
				requireStep(t, err, driver.ErrAccessDenied, step)
				break
			}
			require.NoError(t, err, step)
			if op == 7 {
				bytes[lo] = z
				if k := chunks[c].lent; k >= 0 { // the lender's byte, seen wherever it is borrowed
					lenderBytes[k] = z
					for _, o := range chunks {
						if o.lent == k {
							bytes[o.start] = z
						}
					}
				}
			} else {
				require.Equal(t, bytes[lo], buf[0], "%s: the byte read", step)
			}
		case 9: // borrow one of the lender's chunks at lo, or give it back in the lender
			k := int(z) % lenderN
			if x%2 == 1 {
				err := lender.Decommit(uint64(k)*g, g)
				if lentOut(k) {
					requireStep(t, err, driver.ErrBusy, step)
					break
				}
				require.NoError(t, err, step)
				lenderChunks[k], lenderBytes[k] = false, 0
				break
			}
			if !lenderChunks[k] {
				err := lender.Commit(uint64(k)*g, g)
				if used(1) >= capacity {
					requireStep(t, err, driver.ErrOutOfMemory, step)
					break
				}
				require.NoError(t, err, step)
				lenderChunks[k] = true
			}
			err := s.Borrow(off, lender, uint64(k)*g, g)
			if at(lo) >= 0 {
				requireStep(t, err, driver.ErrOverlap, step)
				break
			}
			require.NoError(t, err, step)
			chunks = append(chunks, mchunk{start: lo, end: lo + 1, dev: 1, access: def, lent: k})
			slices.SortFunc(chunks, func(a, b mchunk) int { return a.start - b.start })
			bytes[lo] = lenderBytes[k]
			r.borrows++
		}
		// Compare.
		var want []Extent
		for _, c := range chunks {
			b := c.lent >= 0
			if k := len(want); k > 0 && want[k-1].Device == c.dev && want[k-1].Borrowed == b && want[k-1].Offset+want[k-1].Size == uint64(c.start)*g {
				want[k-1].Size += uint64(c.end-c.start) * g
				continue
			}
			want = append(want, Extent{Offset: uint64(c.start) * g, Size: uint64(c.end-c.start) * g, Device: c.dev, Borrowed: b})
		}
		require.Equal(t, want, s.Layout(), step)
		for d := driver.DeviceID(0); d < 2; d++ {
			require.Equal(t, uint64(used(d))*g, e.used(t, d), "%s: device %d", step, d)
		}
		for _, c := range chunks {
			for d := driver.DeviceID(0); d < 2; d++ {
				acc, err := s.AccessAt(d, uint64(c.start)*g)
				require.NoError(t, err, step)
				require.Equal(t, c.access[d], acc, "%s: device %d at chunk %d", step, d, c.start)
			}
		}
		require.NoError(t, s.Check(), step)
		require.NoError(t, lender.Check(), step)
	}
	for _, v := range views {
		require.NoError(t, v.v.Release())
	}
	require.NoError(t, s.Close())
	require.NoError(t, lender.Close(), "s gave back what it borrowed when it closed")
	require.Zero(t, e.used(t, 0)+e.used(t, 1))
	return r
}

// requireStep fails t unless err is marked want, naming the model's step.
func requireStep(t testing.TB, err, want error, step string) {
	t.Helper()
	require.Truef(t, errors.Is(err, want), "%s: want an error marked %q, got %v", step, want, err)
}

// FuzzSparseModel fuzzes the core's model: the operation decoder and the
// sequences it yields.
func FuzzSparseModel(f *testing.F) {
	for seed := uint64(0); seed < 4; seed++ {
		f.Add(sparseOps(rand.New(rand.NewPCG(seed, 3)), 60))
	}
	ds := fuzzDrivers(f, 2, 7*g) // runSparseModel's machine
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, d := range ds {
			if d.OneDevice {
				continue // the model places chunks on both devices
			}
			_ = runSparseModel(t, d, data)
		}
	})
}

// TestSparseNoLeaks: a range that committed, moved, lent and decommitted,
// closed, leaves descriptors, mappings and resident memory as they were.
func TestSparseNoLeaks(t *testing.T) {
	work := func() {
		drv, err := host.New(host.Options{Devices: 2, Capacity: 16 * g, Granularity: g})
		require.NoError(t, err)
		space, mem := vaspace.New(drv), physical.New(drv)
		s, err := NewSparse(space, mem, SparseOptions{Max: 16 * g, ChunkSize: g})
		require.NoError(t, err)
		b, err := NewSparse(space, mem, SparseOptions{Max: 16 * g, ChunkSize: g})
		require.NoError(t, err)
		require.NoError(t, s.Commit(2*g, 6*g))
		require.NoError(t, s.Write(0, 3*g, []byte{1}))
		require.NoError(t, s.Move(2*g, 2*g, 1))
		require.NoError(t, b.borrow(0, s, []uint64{6 * g}))
		require.NoError(t, b.Close())
		require.NoError(t, s.Decommit(4*g, 2*g))
		require.NoError(t, s.Close())
		require.Empty(t, space.Reservations())
		require.NoError(t, drv.Close())
	}
	leakcheck.Require(t, 3, work)
}
