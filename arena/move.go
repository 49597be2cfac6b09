package arena

import (
	"fmt"
	"slices"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/invariants"
	"github.com/vmarena/vmarena/internal/ranges"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
)

// Borrowing: a range may map chunks that another range owns — the
// allocator's stitch range maps whole free chunks of the allocator's main
// range side by side, a migration maps the chunks it moves into its scratch
// range to copy them, and a caller may lend a range's chunks to another
// (Borrow: the KV cache maps a prefix store's pages into many sequences).
// The lender's slot is pinned (borrowers) while borrowed, so it cannot be
// decommitted, moved or closed under the borrower; decommitting the
// borrowed slot gives it back. A borrower holds its own ops while it pins
// (under the lender's mu alone) and maps (under its own mu alone); giving
// back is an atomic unpin, so no two ranges' mu are ever held together.

// Borrow maps the chunks that lender owns in [lenderOff, lenderOff+n) —
// whole chunks of lender, all committed, none itself borrowed — side by
// side in s from off, with s's access. The same physical memory is then
// reachable at both addresses, no byte is copied and no memory committed:
// the chunks stay lender's (counted in its Committed, in s's Borrowed),
// pinned there — lender cannot decommit, move or close them — until s
// gives them back by decommitting the borrowed range (or closing).
//
// It refuses, changing nothing in either range: a nil or zero range or
// lender, or s itself as lender (ErrInvalid); a closed range (ErrClosed);
// ranges of different physical memory or drivers (ErrInvalid); n zero
// (ErrInvalid); off, lenderOff or n not whole chunks, or a lender chunk
// whose size is not a multiple of s's ChunkSize (ErrMisaligned); a span
// past s's end (ErrNotReserved); lender's span not all committed
// (ErrNotMapped) or cutting a chunk (ErrPartial); a lender chunk that is
// itself borrowed (ErrInvalid: borrow it from its owner); and a span of s
// that is not wholly uncommitted (ErrOverlap). One map event.
func (s *Sparse) Borrow(off uint64, lender *Sparse, lenderOff, n uint64) error {
	what := func() string {
		return fmt.Sprintf("arena: borrow [%#x, +%s) of another range at offset %#x", lenderOff, units.Bytes(n), off)
	}
	if err := s.checkLender(what, lender); err != nil {
		return err
	}
	if n == 0 {
		return errors.Wrapf(driver.ErrInvalid, "%s: size is zero", what())
	}
	s.ops.Lock()
	defer s.ops.Unlock()
	// s's layout cannot change while its ops is held: what is checked
	// here still holds when the chunks are mapped below.
	if err := s.checkVacant(what, off, n); err != nil {
		return err
	}
	lent, err := lender.pinRange(what, lenderOff, n, s.opts.ChunkSize)
	if err != nil {
		return err
	}
	return s.mapBorrowed(what, off, lender, lent, driver.AccessReadWrite)
}

// checkLender refuses, for Borrow and BorrowEach, a range or lender not
// made by NewSparse, s itself as lender, and a lender of another memory.
func (s *Sparse) checkLender(what func() string, lender *Sparse) error {
	if s == nil || s.res == nil {
		return errors.Wrapf(driver.ErrInvalid, "%s: the borrowing range is nil or not made by NewSparse", what())
	}
	if lender == nil || lender.res == nil {
		return errors.Wrapf(driver.ErrInvalid, "%s: the lender is nil or not made by NewSparse", what())
	}
	if lender == s {
		return errors.WithHint(errors.Wrapf(driver.ErrInvalid, "%s: a range cannot borrow from itself", what()),
			"map the memory of another range; within one range, commit")
	}
	if lender.mem != s.mem {
		return errors.Wrapf(driver.ErrInvalid, "%s: the lender's chunks are of another physical memory (or driver) than the range's", what())
	}
	return nil
}

// lendable refuses to lend it, a chunk of the range, to a borrower whose
// chunk size is cs: one itself borrowed, or not a multiple of cs.
func lendable(what func() string, it *ranges.Item[uint64, *slot], cs uint64) error {
	if it.Val.lender != nil {
		return errors.WithHint(
			errors.Wrapf(driver.ErrInvalid, "%s: the lender's chunk at %#x is itself borrowed from another range", what(), it.Start),
			"borrow it from the range that owns it")
	}
	if it.Size()%cs != 0 {
		return errors.Wrapf(driver.ErrMisaligned, "%s: the lender's chunk at %#x is %s, not a multiple of the borrowing range's chunk size %s",
			what(), it.Start, units.Bytes(it.Size()), units.Bytes(cs))
	}
	return nil
}

// BorrowEach is Borrow of chunks that need not lie side by side in
// lender: it maps the chunks lender owns starting at each of lenderOffs,
// in that order, side by side in s from off, with s's access — at most
// most: AccessRead maps them read-only for every device the range lets
// write — granted over the whole run in one driver call a device (one map
// call a chunk, as always). The KV cache maps a page of each of a
// prompt's prefix store units, which lie a unit apart in the store, into
// one layer's region, read-only, in one map event and one grant.
//
// It refuses, changing nothing in either range, what Borrow refuses, an
// offset of lenderOffs where no chunk lender owns starts (ErrNotMapped)
// or none at all (ErrInvalid), a most that is neither AccessRead nor
// AccessReadWrite (ErrInvalid), and read-only access on a driver that
// cannot grant it (the driver's error, ErrUnsupported). One map event.
func (s *Sparse) BorrowEach(off uint64, lender *Sparse, lenderOffs []uint64, most driver.Access) error {
	what := func() string {
		return fmt.Sprintf("arena: borrow %d chunk(s) of another range at offset %#x", len(lenderOffs), off)
	}
	if err := s.checkLender(what, lender); err != nil {
		return err
	}
	if len(lenderOffs) == 0 {
		return errors.Wrapf(driver.ErrInvalid, "%s: no chunk named", what())
	}
	if most != driver.AccessRead && most != driver.AccessReadWrite {
		return errors.Wrapf(driver.ErrInvalid, "%s: access at most %s: read or read-write", what(), most)
	}
	s.ops.Lock()
	defer s.ops.Unlock()
	if s.Closed() {
		return s.errClosed("borrow")
	}
	lent, err := lender.pinEach(what, lenderOffs, s.opts.ChunkSize)
	if err != nil {
		return err
	}
	return s.mapBorrowed(what, off, lender, lent, most)
}

// pinEach pins, for a borrower whose chunk size is cs, the chunks the
// range owns starting at offs, and returns their slots; on failure
// (a named offset no owned chunk starts at) nothing is pinned.
func (s *Sparse) pinEach(what func() string, offs []uint64, cs uint64) ([]*slot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, driver.Closed(what() + ": the lender is closed")
	}
	lent := make([]*slot, len(offs))
	for i, o := range offs {
		j, ok := s.slots.Find(o)
		if !ok || s.slots.At(j).Start != o {
			return nil, errors.Wrapf(driver.ErrNotMapped, "%s: no chunk of the lender starts at %#x", what(), o)
		}
		it := s.slots.At(j)
		if err := lendable(what, it, cs); err != nil {
			return nil, err
		}
		lent[i] = it.Val
	}
	for _, sl := range lent {
		sl.borrowers.Add(1)
	}
	return lent, nil
}

// checkVacant refuses, for Borrow, a closed range or a span [off, off+n)
// that is not whole chunks of the range, all uncommitted.
func (s *Sparse) checkVacant(what func() string, off, n uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return s.errClosed("borrow")
	}
	if err := s.checkSpan(what, off, n); err != nil {
		return err
	}
	if holes := s.holesLocked(off, off+n); len(holes) != 1 || holes[0] != (span{off, off + n}) {
		return errors.WithHint(
			errors.Wrapf(driver.ErrOverlap, "%s: [%#x, +%s) of the borrowing range is not wholly uncommitted", what(), off, units.Bytes(n)),
			"decommit the span first, or borrow into a hole")
	}
	return nil
}

// pinRange pins the chunks the range owns in [off, off+n), for a borrower
// whose chunk size is cs, and returns their slots. On failure nothing is
// pinned.
func (s *Sparse) pinRange(what func() string, off, n, cs uint64) ([]*slot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, driver.Closed(what() + ": the lender is closed")
	}
	lenderWhat := func() string { return what() + ": the lender's span" }
	lo, hi, err := s.chunksLocked(lenderWhat, off, n)
	if err != nil {
		return nil, err
	}
	lent := make([]*slot, 0, hi-lo)
	for i := lo; i < hi; i++ {
		it := s.slots.At(i)
		if err := lendable(what, it, cs); err != nil {
			return nil, err
		}
		lent = append(lent, it.Val)
	}
	for _, sl := range lent {
		sl.borrowers.Add(1)
	}
	return lent, nil
}

// borrow maps the chunks lender holds at the offsets srcOffs (each the
// start of a chunk the lender owns) side by side in s from off, with s's
// access. One map event. On failure nothing changes in either range.
// Only the package's own callers use it (stitching, migration): a bad
// argument is a broken invariant.
func (s *Sparse) borrow(off uint64, lender *Sparse, srcOffs []uint64) error {
	s.ops.Lock()
	defer s.ops.Unlock()
	what := func() string { return fmt.Sprintf("arena: borrow %d chunk(s) at offset %#x", len(srcOffs), off) }
	if s.Closed() {
		return s.errClosed("borrow")
	}
	if lender == s || len(srcOffs) == 0 {
		return errors.AssertionFailedf("%s: a range borrows from another range, at least one chunk", what())
	}
	lent, err := lender.pin(srcOffs)
	if err != nil {
		return errors.Wrapf(err, "%s", what())
	}
	return s.mapBorrowed(what, off, lender, lent, driver.AccessReadWrite)
}

// mapBorrowed is mapBorrowedLocked under s's mu (the caller holds its
// ops), checked after in invariants builds.
func (s *Sparse) mapBorrowed(what func() string, off uint64, lender *Sparse, lent []*slot, most driver.Access) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.mapBorrowedLocked(what, off, lender, lent, most)
	if invariants.Enabled {
		invariants.Fail("arena: borrow", s.checkLocked())
	}
	return err
}

// mapBorrowedLocked maps the pinned slots lent of lender side by side from
// off, with the range's access, at most most for every device. On failure
// it unmaps what it mapped and unpins them all.
func (s *Sparse) mapBorrowedLocked(what func() string, off uint64, lender *Sparse, lent []*slot, most driver.Access) error {
	made := make([]uint64, 0, len(lent))
	undo := func(cause error) error {
		for i := len(made) - 1; i >= 0; i-- {
			cause = errors.CombineErrors(cause, s.tab.Unmap(s.Base()+driver.Addr(made[i])))
			s.stats.ChunkUnmaps++
		}
		for _, l := range lent {
			cause = errors.CombineErrors(cause, unpinLent(l))
		}
		return errors.Wrapf(cause, "%s", what())
	}
	var total uint64
	for _, l := range lent {
		total += l.c.Size()
	}
	if err := s.checkSpan(what, off, total); err != nil {
		return undo(err)
	}
	if holes := s.holesLocked(off, off+total); len(holes) != 1 || holes[0] != (span{off, off + total}) {
		return undo(errors.Wrapf(driver.ErrOverlap, "%s: [%#x, +%s) is not wholly uncommitted", what(), off, units.Bytes(total)))
	}
	access := slices.Clone(s.access)
	for d := range access {
		access[d] &= most
	}
	slots := make([]*slot, len(lent))
	at := off
	for i, l := range lent {
		c := l.c
		if err := s.tab.Map(s.Base()+driver.Addr(at), c); err != nil {
			return undo(err)
		}
		s.stats.ChunkMaps++
		made = append(made, at)
		sl := newSlot(c, len(access)) // slot and access row in one allocation
		copy(sl.access, access)
		sl.lender, sl.lentFrom = lender, l
		slots[i] = sl
		at += c.Size()
	}
	// The access over the whole run, one call a device.
	if err := s.grantRowLocked(span{off, off + total}, access); err != nil {
		return undo(err)
	}
	run := make([]ranges.Item[uint64, *slot], len(slots))
	at = off
	for i, sl := range slots {
		run[i] = ranges.Item[uint64, *slot]{Start: at, End: at + sl.c.Size(), Val: sl}
		at += sl.c.Size()
	}
	if _, ok := s.slots.InsertRun(run); !ok {
		return errors.AssertionFailedf("%s: the borrowed chunks overlap the range's", what())
	}
	s.borrowed += total
	s.stats.MapEvents++
	return nil
}

// pin marks the owned chunks starting at offs as lent and returns their
// slots. On failure nothing is pinned.
func (s *Sparse) pin(offs []uint64) ([]*slot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, s.errClosed("lend")
	}
	lent := make([]*slot, len(offs))
	for i, o := range offs {
		j, ok := s.slots.Find(o)
		if !ok || s.slots.At(j).Start != o || s.slots.At(j).Val.lender != nil {
			return nil, errors.AssertionFailedf("arena: lend the chunk at %#x: no chunk the range owns starts there", o)
		}
		lent[i] = s.slots.At(j).Val
	}
	for _, sl := range lent {
		sl.borrowers.Add(1)
	}
	return lent, nil
}

// unpin ends the borrow of sl, a borrowed slot, in its lender.
func unpin(sl *slot) error { return unpinLent(sl.lentFrom) }

// unpinLent ends one borrow of a lender's slot. It takes no lock: a pinned
// slot stays in its lender's list, with its chunk, until unpinned.
func unpinLent(l *slot) error {
	if l.borrowers.Add(-1) < 0 {
		l.borrowers.Add(1)
		return errors.AssertionFailedf("arena: give back %s: it is not lent", l.c)
	}
	return nil
}

// disown unmaps the chunk the range owns at off and hands it to the caller,
// unreleased: the migration's scratch range gives its new chunks to the
// range they move into.
func (s *Sparse) disown(off uint64) (*physical.Chunk, error) {
	s.ops.Lock()
	defer s.ops.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	j, ok := s.slots.Find(off)
	if !ok || s.slots.At(j).Start != off || s.slots.At(j).Val.lender != nil || s.slots.At(j).Val.views > 0 || s.slots.At(j).Val.borrowers.Load() > 0 {
		return nil, errors.AssertionFailedf("arena: disown the chunk at %#x: no unpinned chunk the range owns starts there", off)
	}
	sl := s.slots.At(j).Val
	if err := s.tab.Unmap(s.Base() + driver.Addr(off)); err != nil {
		return nil, err
	}
	s.stats.ChunkUnmaps++
	s.slots.Delete(j, j+1)
	s.owned -= sl.c.Size()
	return sl.c, nil
}

// moved is one chunk a Move replaces.
type moved struct {
	off, size uint64 // where it lies in the range
	at        uint64 // where the old chunk lies in the scratch range (when borrowed); the new one lies at total+at
	old       *physical.Chunk
	fresh     *physical.Chunk
	readable  bool // the host may read the old chunk where the range maps it: the copy reads it there
}

// Move moves the backing of [off, off+n) — whole chunks, all committed and
// owned by the range — to device to, at the same addresses: it creates new
// chunks on to, copies the bytes into them while writes are held off, then,
// with reads held off too, unmaps the old chunks, maps the new ones in
// their place with the same access, and releases the old ones. Chunks
// already on to stay. Read and Write are ordered with it.
//
// A chunk that a live view covers is not moved: the move is refused
// (ErrBusy, naming the chunk), as Decommit refuses, because between the
// unmap and the map a load or store through the view's bytes (a tensor's
// At or Set) would fault, and one during the copy would be lost. Release
// the views first.
//
// On any failure — to out of memory, a range not committed or not whole
// chunks, a chunk lent to another range or pinned by a view — nothing
// changes and the new chunks are released. The bytes go through the host
// (HostMapper, or the driver's Read and Write); on a driver whose devices
// are all simulated there are no bytes, and only the backing moves.
func (s *Sparse) Move(off, n uint64, to driver.DeviceID) error {
	if s.unmade() {
		return unmade("Sparse.Move", "NewSparse")
	}
	s.ops.Lock()
	defer s.ops.Unlock()
	_ = s.closeStale() // what stays pinned is refused below, as lent
	what := func() string {
		return fmt.Sprintf("arena: move [%#x, +%s) to device %d", off, units.Bytes(n), to)
	}
	ms, err := s.planMove(what, off, n, to)
	if err != nil || len(ms) == 0 {
		return err
	}
	scratch, err := s.prepareMove(what, ms, to)
	if err != nil {
		return err
	}
	s.writing.Lock()
	defer s.writing.Unlock()
	if err := s.copyMove(scratch, ms); err != nil {
		return errors.CombineErrors(errors.Wrapf(err, "%s", what()), s.dropScratch(scratch))
	}
	var total uint64
	for _, m := range ms {
		total += m.size
	}
	for i := range ms {
		if ms[i].fresh, err = scratch.disown(total + ms[i].at); err != nil {
			for _, m := range ms[:i] {
				err = errors.CombineErrors(err, m.fresh.Release())
			}
			return errors.CombineErrors(errors.Wrapf(err, "%s", what()), s.dropScratch(scratch))
		}
	}
	releaseFresh := func(cause error) error {
		for _, m := range ms {
			cause = errors.CombineErrors(cause, m.fresh.Release())
		}
		return cause
	}
	if err := s.dropScratch(scratch); err != nil {
		return releaseFresh(errors.Wrapf(err, "%s: closing the scratch range", what()))
	}
	s.moving.Lock()
	defer s.moving.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	// Borrow pins under mu alone: another range may have borrowed a chunk
	// since planMove looked. Such a chunk stays (its borrower maps it).
	// Views pin under mu alone too: a view made since planMove looked
	// refuses the move as one made before it does.
	for _, m := range ms {
		j, ok := s.slots.Find(m.off)
		if !ok {
			return releaseFresh(errors.AssertionFailedf("%s: the chunk at %#x went away during the move", what(), m.off))
		}
		if sl := s.slots.At(j).Val; sl.borrowers.Load() > 0 {
			return releaseFresh(errors.Wrapf(driver.ErrBusy, "%s: the chunk at %#x was lent to another range meanwhile", what(), m.off))
		} else if sl.views > 0 {
			return releaseFresh(errViewsPinMove(what, m.off, sl.views))
		}
	}
	if err := s.swapLocked(ms); err != nil {
		return releaseFresh(errors.Wrapf(err, "%s", what()))
	}
	var errs error
	for _, m := range ms {
		errs = errors.CombineErrors(errs, m.old.Release())
		s.stats.Releases++
	}
	// The fresh chunks, created by the scratch range, are the range's
	// own now: counted as its creates, as the old ones as its releases.
	s.stats.Creates += len(ms)
	s.stats.Moves++
	s.stats.MovedBytes += total
	if invariants.Enabled {
		invariants.Fail("arena: move", s.checkLocked())
	}
	if errs != nil {
		return errors.WithAssertionFailure(errors.Wrapf(errs, "%s: releasing the old chunks", what()))
	}
	return nil
}

// errViewsPinMove is the refusal of a move of the chunk at off, which n
// live views pin: its old chunk is unmapped before the new one is mapped
// in its place, and a load or store through a view in between would
// fault.
func errViewsPinMove(what func() string, off uint64, n int) error {
	return errors.WithHint(
		errors.Wrapf(driver.ErrBusy, "%s: %d live view(s) pin the chunk at %#x", what(), n, off),
		"release the views (and the tensors over them) of the memory being moved first")
}

// planMove checks the request and lists the chunks to move.
func (s *Sparse) planMove(what func() string, off, n uint64, to driver.DeviceID) ([]moved, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, s.errClosed("move")
	}
	if err := driver.CheckDevice(what, to, len(s.devs)); err != nil {
		return nil, err
	}
	lo, hi, err := s.chunksLocked(what, off, n)
	if err != nil {
		return nil, err
	}
	var ms []moved
	var total uint64
	for i := lo; i < hi; i++ {
		it := s.slots.At(i)
		sl := it.Val
		switch {
		case sl.dev() == to:
			continue
		case sl.lender != nil:
			return nil, errors.Wrapf(driver.ErrInvalid, "%s: the chunk at %#x is borrowed from another range; move it there", what(), it.Start)
		case sl.borrowers.Load() > 0:
			return nil, errors.Wrapf(driver.ErrBusy, "%s: the chunk at %#x is lent to another range", what(), it.Start)
		case sl.views > 0:
			return nil, errViewsPinMove(what, it.Start, sl.views)
		}
		readable := false
		for _, a := range sl.access {
			readable = readable || a.Allows(driver.AccessRead)
		}
		ms = append(ms, moved{off: it.Start, size: it.Size(), at: total, old: sl.c, readable: readable})
		total += it.Size()
	}
	if len(ms) == 0 {
		return nil, nil
	}
	if !s.drv.Supports(driver.FeatureHostAccess) && !s.simulated() {
		return nil, errors.Wrapf(driver.ErrUnsupported, "%s: the %s driver cannot copy the bytes (no host access)", what(), s.drv.Name())
	}
	if free := s.freeLocked()[to]; free < total {
		return nil, errors.WithHintf(
			errors.Wrapf(driver.ErrOutOfMemory, "%s: %d chunk(s) need %s on device %d, which has %s free",
				what(), len(ms), units.Bytes(total), to, units.Bytes(free)),
			"decommit or free memory on device %d, or move less", to)
	}
	return ms, nil
}

// simulated reports whether every device of the driver is simulated: there
// are no bytes to copy.
func (s *Sparse) simulated() bool {
	for _, d := range s.devs {
		if d.Kind != driver.KindSim {
			return false
		}
	}
	return true
}

// prepareMove makes the scratch range of a move: the new chunks on to at
// [total+at, +size), and — where there are bytes to copy and the host
// cannot read an old chunk where the range maps it — that old chunk
// borrowed at [at, +size), all read-write for to. An old chunk the host
// can read is read in place: mapping it a second time would fill page
// tables for memory the copy touches once. On failure nothing is left
// behind.
func (s *Sparse) prepareMove(what func() string, ms []moved, to driver.DeviceID) (*Sparse, error) {
	var total, largest uint64
	for _, m := range ms {
		total += m.size
		largest = max(largest, m.size)
	}
	scratch, err := NewSparse(s.space, s.mem, SparseOptions{Max: 2 * total, ChunkSize: s.opts.ChunkSize,
		MaxChunk: largest, Device: to, Access: []driver.DeviceID{to}})
	if err != nil {
		return nil, errors.Wrapf(err, "%s: scratch range", what())
	}
	for _, m := range ms {
		// One commit per chunk: each new chunk has its old one's size.
		if err := scratch.Commit(total+m.at, m.size); err != nil {
			return nil, errors.CombineErrors(errors.Wrapf(err, "%s", what()), s.dropScratch(scratch))
		}
	}
	if !s.simulated() {
		_, direct := s.drv.(driver.HostMapper)
		for _, m := range ms {
			if direct && m.readable {
				continue
			}
			if err := scratch.borrow(m.at, s, []uint64{m.off}); err != nil {
				return nil, errors.CombineErrors(errors.Wrapf(err, "%s", what()), s.dropScratch(scratch))
			}
		}
	}
	return scratch, nil
}

// dropScratch closes a move's scratch range. When that fails — the driver
// refused an unmap, so the scratch range still maps, and pins, chunks of
// s — s keeps it, and its next Move, Decommit or Close closes it first:
// the move fails, and once the driver unmaps nothing of it is left. The
// caller holds s.ops.
func (s *Sparse) dropScratch(scratch *Sparse) error {
	if err := scratch.Close(); err != nil {
		s.stale = append(s.stale, scratch)
		return err
	}
	return nil
}

// closeStale closes the scratch ranges failed moves left, keeping those
// that still cannot close. The caller holds s.ops.
func (s *Sparse) closeStale() error {
	var errs error
	kept := s.stale[:0]
	for _, sc := range s.stale {
		if err := sc.Close(); err != nil {
			errs = errors.CombineErrors(errs, err)
			kept = append(kept, sc)
		}
	}
	clear(s.stale[len(kept):])
	s.stale = kept
	return errs
}

// copyMove copies each old chunk into its new one, each byte once: from
// where the range maps it when the host may read it there, else from its
// borrowed mapping in the scratch range. Writers are held off.
func (s *Sparse) copyMove(scratch *Sparse, ms []moved) error {
	if s.simulated() {
		return nil
	}
	var total uint64
	for _, m := range ms {
		total += m.size
	}
	base := scratch.Base()
	if hm, ok := s.drv.(driver.HostMapper); ok {
		for _, m := range ms {
			from := base + driver.Addr(m.at)
			if m.readable {
				from = s.Base() + driver.Addr(m.off)
			}
			src, err := hm.HostBytes(from, m.size)
			if err != nil {
				return err
			}
			dst, err := hm.HostBytes(base+driver.Addr(total+m.at), m.size)
			if err != nil {
				return err
			}
			copy(dst, src)
		}
		return nil
	}
	to := scratch.opts.Device
	buf := make([]byte, min(largestOf(ms), 64<<20))
	for _, m := range ms {
		for o := uint64(0); o < m.size; o += uint64(len(buf)) {
			b := buf[:min(uint64(len(buf)), m.size-o)]
			if err := scratch.tab.Read(to, base+driver.Addr(m.at+o), b); err != nil {
				return err
			}
			if err := scratch.tab.Write(to, base+driver.Addr(total+m.at+o), b); err != nil {
				return err
			}
		}
	}
	return nil
}

func largestOf(ms []moved) uint64 {
	var m uint64
	for _, x := range ms {
		m = max(m, x.size)
	}
	return m
}

// swapLocked replaces each moved chunk's mapping by its new chunk's, with
// the same access. On failure it puts back what it had swapped.
func (s *Sparse) swapLocked(ms []moved) error {
	for j, m := range ms {
		if err := s.replaceLocked(m.off, m.fresh); err != nil {
			var rerr error
			for b := j - 1; b >= 0; b-- {
				rerr = errors.CombineErrors(rerr, s.replaceLocked(ms[b].off, ms[b].old))
			}
			if rerr != nil {
				rerr = errors.WithAssertionFailure(errors.Wrap(rerr, "arena: putting back a failed move"))
			}
			return errors.CombineErrors(err, rerr)
		}
	}
	return nil
}

// replaceLocked maps c at off in place of the chunk there, with that slot's
// access. On failure the slot is as it was.
func (s *Sparse) replaceLocked(off uint64, c *physical.Chunk) error {
	j, _ := s.slots.Find(off)
	sl := s.slots.At(j).Val
	at := s.Base() + driver.Addr(off)
	put := func(c *physical.Chunk) error {
		if err := s.tab.Map(at, c); err != nil {
			return err
		}
		s.stats.ChunkMaps++
		for d, acc := range sl.access {
			if acc == driver.AccessNone {
				continue
			}
			if err := s.tab.SetAccess(at, c.Size(), driver.DeviceID(d), acc); err != nil {
				s.stats.ChunkUnmaps++
				return errors.CombineErrors(err, s.tab.Unmap(at))
			}
		}
		return nil
	}
	if err := s.tab.Unmap(at); err != nil {
		return err
	}
	s.stats.ChunkUnmaps++
	if err := put(c); err != nil {
		return errors.CombineErrors(err, put(sl.c))
	}
	sl.c = c
	return nil
}
