package tensor

import (
	"fmt"
	"math"
	"slices"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/invariants"
	"github.com/vmarena/vmarena/internal/lockrank"
	"github.com/vmarena/vmarena/internal/sentinel"
	"github.com/vmarena/vmarena/internal/units"
)

// Growable is a tensor of shape [rows, rowShape...] that grows along its
// first axis inside an arena of its own: row r lies at byte r*RowBytes of
// the arena, and the arena's base never moves, so every tensor handed out
// (by AppendRows or Tensor) stays valid, and keeps reading the same
// elements, as more rows are appended, until Release.
//
// Invariants (checked by Check): the arena's Len is at least
// Rows()*RowBytes() (exactly, unless someone else grew the arena against
// NewGrowable's rule; AppendRows then refuses);
// the Growable holds one live arena view, cover, of all its rows (none
// while there are no rows), replaced by a longer one at each append —
// earlier tensors keep their bytes, which stay mapped under the new cover —
// and the storage of every tensor handed out lies inside cover. One view,
// however many appends: the arena's Shrink and Check stay cheap.
// Safe for concurrent use (element access aside, as for any tensor).
type Growable struct {
	a        *arena.Arena
	dt       DType
	rowShape []int
	rowBytes int

	mu       lockrank.Mutex[lockrank.TensorGrowable]
	rows     int
	cover    *arena.View // a live view of all rows, or nil when there are none
	coverB   []byte      // cover's bytes
	storages []*storage  // every storage handed out, each inside cover
	whole    *Tensor     // the last Tensor(), over rows rows, or nil
	released bool
}

// NewGrowable makes a growable tensor of dt with rows of rowShape (no dims:
// each row is one element) in a, which must be empty (Len 0): from now on
// the arena belongs to the Growable and nothing else may grow or shrink it.
// Rows of zero elements are refused (ErrInvalid).
func NewGrowable(a *arena.Arena, dt DType, rowShape ...int) (*Growable, error) {
	what := func() string { return fmt.Sprintf("tensor: growable %s tensor of rows %v", dt, rowShape) }
	if a == nil {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: the arena is nil", what())
	}
	if a.Closed() {
		return nil, driver.Closed(what() + ": the arena is closed (or was not made by arena.New)")
	}
	if !dt.Valid() {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: %s is not a defined dtype", what(), dt)
	}
	n, err := numElements(rowShape)
	if err != nil {
		return nil, sentinel.Mark(errors.Wrapf(err, "%s", what()), driver.ErrInvalid)
	}
	if n == 0 {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: a row has no elements", what())
	}
	if n > math.MaxInt/dt.Size() {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: a row of %d elements overflows an int of bytes", what(), n)
	}
	if l := a.Len(); l != 0 {
		return nil, errors.WithHint(
			errors.Wrapf(driver.ErrInvalid, "%s: the arena is %s long, not empty", what(), units.Bytes(l)),
			"give the growable an arena of its own")
	}
	rowShape = slices.Clone(rowShape)
	if rowShape == nil {
		rowShape = []int{}
	}
	return &Growable{a: a, dt: dt, rowShape: rowShape, rowBytes: n * dt.Size()}, nil
}

// DType is the element type.
func (g *Growable) DType() DType {
	if g.unmade() {
		return 0
	}
	return g.dt
}

// RowShape is the shape of one row (a copy).
func (g *Growable) RowShape() []int {
	if g.unmade() {
		return nil
	}
	return slices.Clone(g.rowShape)
}

// RowBytes is the size of one row in bytes.
func (g *Growable) RowBytes() int {
	if g.unmade() {
		return 0
	}
	return g.rowBytes
}

// Base is the address of row 0: the arena's base, fixed for the
// Growable's life.
func (g *Growable) Base() driver.Addr {
	if g.unmade() {
		return 0
	}
	return g.a.Base()
}

// Rows is the number of rows appended so far.
func (g *Growable) Rows() int {
	if g.unmade() {
		return 0
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.rows
}

func (g *Growable) shape(rows int) []int { return append([]int{rows}, g.rowShape...) }

// AppendRows grows the arena by n rows (n >= 1) and returns a tensor of
// shape [n, rowShape...] viewing just the new rows; their contents are
// whatever the arena's memory holds (zero for fresh memory on the host
// driver). If the arena cannot grow, its error is returned and nothing
// changes. The length check and the grow are one arena call
// (arena.Arena.ResizeFrom): if someone else grew or shrank the arena
// against NewGrowable's rule, AppendRows refuses (ErrBusy) rather than
// hand out bytes another caller holds.
func (g *Growable) AppendRows(n int) (*Tensor, error) {
	if g.unmade() {
		return nil, unmade("Growable.AppendRows", "NewGrowable")
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	defer g.checkAfter("appendRows")
	what := func() string {
		return fmt.Sprintf("tensor: append %d rows of %v to a growable %s tensor of %d rows", n, g.rowShape, g.dt, g.rows)
	}
	if g.released {
		return nil, driver.Closed(what() + ": the growable was released")
	}
	if n < 1 {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: %d rows, at least 1 must be appended", what(), n)
	}
	if n > (math.MaxInt-g.rows*g.rowBytes)/g.rowBytes {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: the rows' bytes overflow an int", what())
	}
	off := uint64(g.rows * g.rowBytes)
	size := uint64(n * g.rowBytes)
	// One arena call checks the length and grows: a caller growing the
	// arena behind the Growable's back cannot get the new rows' bytes.
	if err := g.a.ResizeFrom(off, off+size); err != nil {
		return nil, errors.Wrapf(err, "%s", what())
	}
	undo := func(err error, v *arena.View) (*Tensor, error) {
		if v != nil {
			err = errors.CombineErrors(err, v.Release())
		}
		return nil, errors.CombineErrors(err, g.a.ResizeFrom(off+size, off))
	}
	v, err := g.a.View(0, off+size)
	if err != nil {
		return undo(errors.Wrapf(err, "%s", what()), nil)
	}
	b, err := v.Bytes()
	if err != nil {
		return undo(errors.Wrapf(err, "%s", what()), v)
	}
	st := &storage{bytes: b[off : off+size : off+size], addr: v.Addr() + driver.Addr(off), holder: "a Growable (release the Growable)"}
	t, err := newOn(st, g.dt, g.shape(n), what)
	if err != nil {
		return undo(err, v)
	}
	if g.cover != nil {
		if err := g.cover.Release(); err != nil {
			return undo(errors.WithAssertionFailure(err), v)
		}
	}
	g.cover, g.coverB = v, b
	g.storages = append(g.storages, st)
	g.rows += n
	return t, nil
}

// Tensor returns all rows so far as one tensor of shape [Rows(),
// rowShape...]; its Addr is Base. It stays valid after later appends (it
// keeps seeing the rows it had then) until Release. Each call after the
// rows changed records one more small storage (no arena view) until Release.
func (g *Growable) Tensor() (*Tensor, error) {
	if g.unmade() {
		return nil, unmade("Growable.Tensor", "NewGrowable")
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	what := func() string {
		return fmt.Sprintf("tensor: all %d rows of a growable %s tensor of rows %v", g.rows, g.dt, g.rowShape)
	}
	if g.released {
		return nil, driver.Closed(what() + ": the growable was released")
	}
	if g.whole != nil && g.whole.shape[0] == g.rows {
		return g.whole, nil
	}
	st := &storage{addr: g.a.Base(), holder: "a Growable (release the Growable)"}
	if g.rows > 0 {
		st.bytes = g.coverB[: g.rows*g.rowBytes : g.rows*g.rowBytes]
	}
	t, err := newOn(st, g.dt, g.shape(g.rows), what)
	if err != nil {
		return nil, err
	}
	g.storages = append(g.storages, st)
	g.whole = t
	return t, nil
}

// Release ends every arena view the Growable made: every tensor it handed
// out, and every view of them, refuses to touch memory from now on
// (ErrClosed), and the accesses in flight through them end first (it
// waits for them, so it must not be called from inside one). It waits
// without holding the Growable's lock, so such an access may still call
// the Growable meanwhile (AppendRows and Tensor then answer ErrClosed).
// The arena keeps its length and memory; closing it is the caller's.
// Releasing twice is ErrClosed.
func (g *Growable) Release() error {
	if g.unmade() {
		return unmade("Growable.Release", "NewGrowable")
	}
	g.mu.Lock()
	if g.released {
		g.mu.Unlock()
		return driver.Closed("tensor: release of a growable tensor: already released")
	}
	g.released = true
	storages, cover := g.storages, g.cover
	for _, st := range storages {
		st.released.Store(true)
	}
	g.cover, g.coverB, g.storages, g.whole = nil, nil, nil, nil
	g.checkAfter("release")
	g.mu.Unlock()
	// No new access starts now; the ones in flight may call g, so the
	// lock is not held while they end, before the cover does.
	for _, st := range storages {
		drain(&st.using)
	}
	if cover != nil {
		if err := cover.Release(); err != nil {
			return errors.Wrap(err, "tensor: release of a growable tensor")
		}
	}
	return nil
}

// Check verifies the Growable's invariants and reports every one that does
// not hold.
func (g *Growable) Check() error {
	if g.unmade() {
		return unmade("Growable.Check", "NewGrowable")
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.checkLocked()
}

// checkAfter runs checkLocked after a change, in builds with the
// invariants tag; the lock is held.
func (g *Growable) checkAfter(op string) {
	if invariants.Enabled {
		invariants.Fail("tensor: growable "+op, g.checkLocked())
	}
}

// checkLocked is Check with the lock held: what every change runs in
// builds with the invariants tag.
func (g *Growable) checkLocked() error {
	var errs error
	fail := func(format string, args ...any) {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf("tensor: growable: "+format, args...))
	}
	if g.released {
		return errs
	}
	end := uint64(g.rows * g.rowBytes)
	if l := g.a.Len(); l < end {
		fail("the arena is %d bytes long, %d rows of %d take %d", l, g.rows, g.rowBytes, end)
	}
	if (g.cover == nil) != (g.rows == 0) {
		fail("%d rows, cover view %v", g.rows, g.cover)
	}
	if g.cover != nil {
		if g.cover.Offset() != 0 || g.cover.Len() != end {
			fail("the cover view [%#x, +%d) is not the %d rows", g.cover.Offset(), g.cover.Len(), g.rows)
		}
		if b, err := g.cover.Bytes(); err != nil || len(b) != len(g.coverB) || len(b) > 0 && &b[0] != &g.coverB[0] {
			fail("the cover's bytes changed (%v)", err)
		}
	}
	for i, st := range g.storages {
		if st.released.Load() {
			fail("storage %d released before the growable", i)
		}
		lo := uint64(st.addr - g.a.Base())
		if lo+uint64(len(st.bytes)) > end || len(st.bytes) > 0 && &st.bytes[0] != &g.coverB[lo] {
			fail("storage %d [%#x, +%d) is not inside the cover", i, lo, len(st.bytes))
		}
	}
	if g.whole != nil && g.whole.shape[0] > g.rows {
		fail("the whole tensor has %d rows, the growable %d", g.whole.shape[0], g.rows)
	}
	return errs
}
