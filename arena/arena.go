package arena

import (
	"fmt"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/invariants"
	"github.com/vmarena/vmarena/internal/lockrank"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// Options configure an arena.
type Options struct {
	// Device is the device whose memory backs the arena (when Placement is
	// nil).
	Device driver.DeviceID
	// Max is the most the arena can grow to: the address space reserved up
	// front, rounded up to a whole number of chunks.
	Max uint64
	// ChunkSize is the unit memory is committed in (default: the device's
	// recommended granularity); a multiple of the driver's granularity.
	ChunkSize uint64
	// MaxChunk is the largest chunk one Grow creates (default 512 ×
	// ChunkSize, 1 GiB at 2 MiB; ChunkSize when a Placement spreads the
	// arena over devices). A grow needing more maps several chunks.
	MaxChunk uint64
	// Access lists the devices given read-write access to the arena's
	// memory (default: Device alone; none when a Placement is given —
	// grant ranges with Grant).
	Access []driver.DeviceID
	// Placement chooses the device of each chunk (default: Device alone);
	// OnFull what a grow does when the placement's first choice is full.
	// Package multidev has the policies that spread an arena over devices.
	Placement Placement
	OnFull    OnFull
	// Shareable makes every chunk exportable to other processes.
	Shareable bool
}

// Arena is growable memory with a fixed base: a Sparse whose committed
// part is always a prefix [0, Committed) of which [0, Len) is in use.
// Invariants (checked by Check): the chunks cover [0, Committed) without a
// gap; Len <= Committed <= Max; every live view lies inside [0, Len).
// Safe for concurrent use.
type Arena struct {
	s *Sparse

	// mu guards length; it is taken before the Sparse's locks.
	mu     lockrank.Mutex[lockrank.Arena]
	length uint64
}

// Stats describe an arena: its range's figures, its length and maximum.
type Stats struct {
	SparseStats
	Len, Max uint64
}

// New reserves opts.Max of address space for an arena. No memory is
// committed until it grows.
func New(space *vaspace.Space, mem *physical.Memory, opts Options) (*Arena, error) {
	so := SparseOptions{Max: opts.Max, ChunkSize: opts.ChunkSize, MaxChunk: opts.MaxChunk, Device: opts.Device,
		Placement: opts.Placement, OnFull: opts.OnFull, Access: opts.Access, Shareable: opts.Shareable}
	if so.MaxChunk == 0 && so.Placement == nil && space != nil && space.Driver() != nil {
		cs := so.ChunkSize
		if devs := space.Driver().Devices(); cs == 0 && opts.Device >= 0 && int(opts.Device) < len(devs) {
			cs = devs[opts.Device].RecommendedGranularity
		}
		so.MaxChunk = 512 * cs
	}
	s, err := NewSparse(space, mem, so)
	if err != nil {
		return nil, errors.Wrap(err, "arena: new arena")
	}
	return &Arena{s: s}, nil
}

// Base is the arena's first address; it never changes.
func (a *Arena) Base() driver.Addr {
	if a.unmade() {
		return 0
	}
	return a.s.Base()
}

// Max is the most the arena can grow to.
func (a *Arena) Max() uint64 {
	if a.unmade() {
		return 0
	}
	return a.s.Max()
}

// ChunkSize is the unit memory is committed in.
func (a *Arena) ChunkSize() uint64 {
	if a.unmade() {
		return 0
	}
	return a.s.ChunkSize()
}

// Device is the device whose memory backs the arena when it has no
// placement spreading it over several.
func (a *Arena) Device() driver.DeviceID {
	if a.unmade() {
		return 0
	}
	return a.s.opts.Device
}

// Placement is the arena's placement policy.
func (a *Arena) Placement() Placement {
	if a.unmade() {
		return nil
	}
	return a.s.Placement()
}

// Len is the arena's length: [Base, Base+Len) is usable.
func (a *Arena) Len() uint64 {
	if a.unmade() {
		return 0
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.length
}

// Committed is how many bytes of chunks back the arena (Len rounded up to
// whole chunks, plus any not yet trimmed).
func (a *Arena) Committed() uint64 {
	if a.unmade() {
		return 0
	}
	return a.s.Committed()
}

// Stats returns the arena's figures.
func (a *Arena) Stats() Stats {
	if a.unmade() {
		return Stats{}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return Stats{SparseStats: a.s.Stats(), Len: a.length, Max: a.s.Max()}
}

// HostAddressable reports whether views of the arena can give bytes
// (View.Bytes): the driver's memory is addressable from this process.
func (a *Arena) HostAddressable() bool {
	if a.unmade() {
		return false
	}
	return a.s.HostAddressable()
}

func (a *Arena) errClosed(op string) error {
	return driver.Closed("arena: " + op + " on a closed arena")
}

// Grow lengthens the arena by n bytes, committing chunks at its end when
// Len passes what is committed. It costs the chunks it maps, not the
// arena's size. A grow the devices cannot hold is refused before anything
// is mapped, and one that runs out part-way unmaps what it mapped: the
// arena is as it was, and the error says how much was asked and how much
// the device had.
func (a *Arena) Grow(n uint64) error {
	if a.unmade() {
		return unmade("Arena.Grow", "New")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.growLocked(n)
}

func (a *Arena) growLocked(n uint64) error {
	if a.s.Closed() {
		return a.errClosed("grow")
	}
	if n == 0 {
		return nil
	}
	what := func() string {
		return fmt.Sprintf("arena: grow by %s from %s (committed %s, max %s)",
			units.Bytes(n), units.Bytes(a.length), units.Bytes(a.s.Committed()), units.Bytes(a.s.Max()))
	}
	newLen := a.length + n
	if newLen < a.length || newLen > a.s.Max() {
		return errors.WithHint(
			errors.Wrapf(driver.ErrOutOfMemory, "%s: past the arena's maximum", what()),
			"create the arena with a larger Max: address space is cheap")
	}
	if end := a.s.Committed(); newLen > end {
		cs := a.s.ChunkSize()
		need := (newLen - end + cs - 1) / cs * cs
		if err := a.s.Commit(end, need); err != nil {
			return errors.Wrapf(err, "%s", what())
		}
	}
	a.length = newLen
	a.checkAfter("grow")
	return nil
}

// checkAfter runs Check after a change in invariants builds.
func (a *Arena) checkAfter(op string) {
	if invariants.Enabled {
		invariants.Fail("arena: "+op, a.checkLocked())
	}
}

// Shrink shortens the arena by n bytes. The chunks stay committed (a later
// Grow reuses them) until Trim. It refuses, changing nothing, when a live
// view reaches past the new end.
func (a *Arena) Shrink(n uint64) error {
	if a.unmade() {
		return unmade("Arena.Shrink", "New")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.s.Closed() {
		return a.errClosed("shrink")
	}
	return a.shrinkLocked(n)
}

func (a *Arena) shrinkLocked(n uint64) error {
	if n > a.length {
		return errors.Wrapf(driver.ErrInvalid, "arena: shrink by %s: the arena is only %s long", units.Bytes(n), units.Bytes(a.length))
	}
	newLen := a.length - n
	if v := a.s.viewPast(newLen); v != nil {
		return errors.WithHint(
			errors.Wrapf(driver.ErrBusy, "arena: shrink to %s: the live %s reaches past it", units.Bytes(newLen), v),
			"release the views of the memory being given up first")
	}
	a.length = newLen
	a.checkAfter("shrink")
	return nil
}

// viewPast returns a live view that reaches past end, or nil.
func (s *Sparse) viewPast(end uint64) *View {
	s.mu.Lock()
	defer s.mu.Unlock()
	for v := range s.views {
		if v.off+v.n > end {
			return v
		}
	}
	return nil
}

// Resize grows or shrinks the arena to n bytes.
func (a *Arena) Resize(n uint64) error {
	if a.unmade() {
		return unmade("Arena.Resize", "New")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.s.Closed() {
		return a.errClosed("resize")
	}
	if n >= a.length {
		return a.growLocked(n - a.length)
	}
	return a.shrinkLocked(a.length - n)
}

// Trim decommits the chunks lying wholly past Len and returns their memory
// to the device. A chunk that Len reaches into stays whole.
func (a *Arena) Trim() error {
	if a.unmade() {
		return unmade("Arena.Trim", "New")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.s.Closed() {
		return a.errClosed("trim")
	}
	cut, end := a.s.chunkEndAtOrAfter(a.length), a.s.Committed()
	if cut >= end {
		return nil
	}
	if err := a.s.Decommit(cut, end-cut); err != nil {
		return errors.Wrap(err, "arena: trim")
	}
	a.checkAfter("trim")
	return nil
}

// chunkEndAtOrAfter returns the first chunk boundary at or after off: off
// itself, or the end of the chunk holding it.
func (s *Sparse) chunkEndAtOrAfter(off uint64) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i, ok := s.slots.Find(off); ok && s.slots.At(i).Start < off {
		return s.slots.At(i).End
	}
	return off
}

// Append grows the arena by n bytes starting at the next multiple of align
// (0 or 1: no padding; otherwise a power of two) and returns a live view of
// them, in one step: a caller growing the arena at the same time cannot end
// up with the same bytes. On a driver whose memory this process addresses
// (HostAddressable) the bytes are for writing through the view: memory no
// device may write is refused before anything grows (ErrAccessDenied). On
// failure nothing changes.
func (a *Arena) Append(n, align uint64) (*View, error) {
	if a.unmade() {
		return nil, unmade("Arena.Append", "New")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.s.Closed() {
		return nil, a.errClosed("append")
	}
	if n == 0 {
		return nil, errors.Wrap(driver.ErrInvalid, "arena: append of zero bytes")
	}
	if err := driver.CheckAlign(func() string { return "arena: append" }, align); err != nil {
		return nil, err
	}
	off := a.length
	if align > 1 {
		off = alignUp(a.length, align)
	}
	if off < a.length || off+n < off {
		return nil, errors.Wrapf(driver.ErrOutOfMemory, "arena: append of %s: past the arena's maximum", units.Bytes(n))
	}
	if a.s.HostAddressable() {
		if err := a.s.appendWritable(off, off+n); err != nil {
			return nil, err
		}
	}
	old := a.length
	if err := a.growLocked(off - a.length + n); err != nil {
		return nil, err
	}
	v, err := a.s.View(off, n)
	if err != nil {
		a.length = old
		return nil, errors.WithAssertionFailure(err)
	}
	return v, nil
}

// appendWritable refuses (ErrAccessDenied) an append of [off, end) of an
// arena that no device could write: the chunks committed there now by
// their own access, what lies past them by the access new chunks get.
func (s *Sparse) appendWritable(off, end uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	what := func() string { return fmt.Sprintf("arena: append [%#x, +%s)", off, units.Bytes(end-off)) }
	if err := s.writableLocked(what, off, end); err != nil {
		return err
	}
	if end > s.owned && !writable(s.access) {
		return errors.WithHint(
			errors.Wrapf(driver.ErrAccessDenied, "%s: the memory the arena commits is not writable by any device", what()),
			"grant a device read-write access first (SetAccess)")
	}
	return nil
}

// ResizeFrom resizes the arena from exactly from bytes to to bytes, in one
// step, as Resize does; if the arena is not from bytes long — someone else
// grew or shrank it — it refuses (ErrBusy) and nothing changes. It is how
// an owner that keeps its own count of the arena's length (a
// tensor.Growable) grows it without losing bytes to a caller growing it at
// the same time.
func (a *Arena) ResizeFrom(from, to uint64) error {
	if a.unmade() {
		return unmade("Arena.ResizeFrom", "New")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.s.Closed() {
		return a.errClosed("resize")
	}
	if a.length != from {
		return errors.Wrapf(driver.ErrBusy, "arena: resize from %s to %s: the arena is %s long (someone else resized it)",
			units.Bytes(from), units.Bytes(to), units.Bytes(a.length))
	}
	if to >= from {
		return a.growLocked(to - from)
	}
	return a.shrinkLocked(from - to)
}

// View returns a live view of [off, off+n), which must lie inside Len.
func (a *Arena) View(off, n uint64) (*View, error) {
	if a.unmade() {
		return nil, unmade("Arena.View", "New")
	}
	return a.view(off, n, false)
}

// ViewReadOnly returns a live read-only view of [off, off+n), which must
// lie inside Len: see Sparse.ViewReadOnly. The memory under it may be
// read-only, and the caller must guard the writes through its bytes.
func (a *Arena) ViewReadOnly(off, n uint64) (*View, error) {
	if a.unmade() {
		return nil, unmade("Arena.ViewReadOnly", "New")
	}
	return a.view(off, n, true)
}

func (a *Arena) view(off, n uint64, readOnly bool) (*View, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.s.Closed() {
		return nil, a.errClosed("view")
	}
	if n == 0 {
		return nil, errors.Wrap(driver.ErrInvalid, "arena: view of zero bytes")
	}
	if off+n < off || off+n > a.length {
		return nil, errors.Wrapf(driver.ErrNotMapped, "arena: view [%#x, +%s): the arena is %s long",
			off, units.Bytes(n), units.Bytes(a.length))
	}
	if readOnly {
		return a.s.ViewReadOnly(off, n)
	}
	return a.s.View(off, n)
}

// SetAccess sets what dev may do with the arena's memory, on every chunk
// committed now and every chunk committed later. If a chunk refuses, the
// chunks already changed are set back and nothing changes. It refuses
// (ErrBusy) to leave memory under a live view (a tensor) writable by no
// device; see Sparse.SetAccess.
func (a *Arena) SetAccess(dev driver.DeviceID, acc driver.Access) error {
	if a.unmade() {
		return unmade("Arena.SetAccess", "New")
	}
	return a.s.SetAccess(dev, acc)
}

// Access reports what dev gets on the chunks the arena commits.
func (a *Arena) Access(dev driver.DeviceID) driver.Access {
	if a.unmade() {
		return 0
	}
	return a.s.Access(dev)
}

// Grant sets what dev may do over [off, off+n), whole chunks, all
// committed; see Sparse.Grant.
func (a *Arena) Grant(dev driver.DeviceID, off, n uint64, acc driver.Access) error {
	if a.unmade() {
		return unmade("Arena.Grant", "New")
	}
	return a.s.Grant(dev, off, n, acc)
}

// WholeChunks reports whether [off, off+n) is whole chunks, all committed:
// nil, or the error Grant and Move give for such a range.
func (a *Arena) WholeChunks(off, n uint64) error {
	if a.unmade() {
		return unmade("Arena.WholeChunks", "New")
	}
	return a.s.WholeChunks(off, n)
}

// AccessAt reports what dev may do at offset off.
func (a *Arena) AccessAt(dev driver.DeviceID, off uint64) (driver.Access, error) {
	if a.unmade() {
		return 0, unmade("Arena.AccessAt", "New")
	}
	if a.s.Closed() {
		return driver.AccessNone, a.errClosed("access")
	}
	return a.s.AccessAt(dev, off)
}

// Layout lists the committed memory as maximal runs on one device.
func (a *Arena) Layout() []Extent {
	if a.unmade() {
		return nil
	}
	return a.s.Layout()
}

// DeviceAt reports the device whose memory backs offset off.
func (a *Arena) DeviceAt(off uint64) (driver.DeviceID, error) {
	if a.unmade() {
		return 0, unmade("Arena.DeviceAt", "New")
	}
	if a.s.Closed() {
		return 0, a.errClosed("device at")
	}
	return a.s.DeviceAt(off)
}

// Read copies len(p) bytes at offset off into p on behalf of dev, which
// must have read access; [off, off+len(p)) must lie inside Len.
func (a *Arena) Read(dev driver.DeviceID, off uint64, p []byte) error {
	if a.unmade() {
		return unmade("Arena.Read", "New")
	}
	if err := a.inside("read", dev, off, len(p)); err != nil {
		return err
	}
	return a.s.Read(dev, off, p)
}

// Write copies p to offset off on behalf of dev, which must have read-write
// access; [off, off+len(p)) must lie inside Len.
func (a *Arena) Write(dev driver.DeviceID, off uint64, p []byte) error {
	if a.unmade() {
		return unmade("Arena.Write", "New")
	}
	if err := a.inside("write", dev, off, len(p)); err != nil {
		return err
	}
	return a.s.Write(dev, off, p)
}

func (a *Arena) inside(op string, dev driver.DeviceID, off uint64, n int) error {
	if a.s.Closed() {
		return a.errClosed(op)
	}
	what := func() string { return fmt.Sprintf("arena: %s %d bytes at offset %#x", op, n, off) }
	if err := a.s.checkDevice(what, dev); err != nil {
		return err
	}
	length := a.Len()
	if end := off + uint64(n); n > 0 && (end < off || end > length) {
		return errors.Wrapf(driver.ErrAccessDenied, "arena: %s %d bytes at offset %#x: past the arena's length %s",
			op, n, off, units.Bytes(length))
	}
	return nil
}

// Move moves the backing of [off, off+n) — whole committed chunks — to
// device to at the same addresses; see Sparse.Move. A chunk under a live
// view (a tensor) is not moved: ErrBusy.
func (a *Arena) Move(off, n uint64, to driver.DeviceID) error {
	if a.unmade() {
		return unmade("Arena.Move", "New")
	}
	return a.s.Move(off, n, to)
}

// Close unmaps every chunk and frees the reservation. It refuses while
// views are live. When the driver refuses an unmap part-way, the chunks
// already given back are gone from the end of the arena, and Len shrinks
// to what is left; Close may be called again.
func (a *Arena) Close() error {
	if a.unmade() {
		return unmade("Arena.Close", "New")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.s.Close(); err != nil {
		if a.s.Closed() {
			return a.errClosed("close")
		}
		a.length = min(a.length, a.s.Committed())
		return err
	}
	a.length = 0
	return nil
}

// Closed reports whether the arena is closed.
// A zero Arena, not made by New, reports itself closed.
func (a *Arena) Closed() bool { return a == nil || a.s == nil || a.s.Closed() }

// Check verifies the arena's invariants, its range's and its page table's.
func (a *Arena) Check() error {
	if a.unmade() {
		return unmade("Arena.Check", "New")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.s.mu.Lock()
	errs := a.prefixLocked()
	a.s.mu.Unlock()
	return errors.CombineErrors(errs, a.s.Check())
}

// checkLocked is Check without the driver, for invariants builds; a.mu is
// held.
func (a *Arena) checkLocked() error {
	a.s.mu.Lock()
	defer a.s.mu.Unlock()
	return errors.CombineErrors(a.prefixLocked(), a.s.checkLocked())
}

// prefixLocked checks the arena's own invariants: the committed chunks are
// a prefix, Len lies inside it, every view inside Len. a.mu and a.s.mu are
// held.
func (a *Arena) prefixLocked() error {
	s := a.s
	var errs error
	fail := func(format string, args ...any) {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf(format, args...))
	}
	if s.closed {
		return nil
	}
	if holes := s.holesLocked(0, s.owned); len(holes) > 0 {
		fail("arena: the committed chunks are not the prefix [0, %#x): a hole at [%#x, %#x)", s.owned, holes[0].start, holes[0].end)
	}
	if s.borrowed > 0 {
		fail("arena: an arena borrows %d bytes", s.borrowed)
	}
	if a.length > s.owned || s.owned > s.opts.Max {
		fail("arena: len %d, committed %d, max %d out of order", a.length, s.owned, s.opts.Max)
	}
	for v := range s.views {
		if v.off+v.n > a.length {
			fail("arena: %s past len %d", v, a.length)
		}
	}
	return errs
}
