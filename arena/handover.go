package arena

import (
	"fmt"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/invariants"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
)

// Handing over: a range gives chunks it owns to another range and keeps
// them mapped where they are, now borrowed from the new owner. The KV
// cache forks a sequence this way: the pages the parent wrote in its own
// slot become prefix store pages, which the parent keeps mapping and
// the child maps too, with no byte copied. Ownership decides lifetime
// (the owner decommits, and only once no borrower maps it), so a page
// outlives whichever of its mappers goes first.

// HandOver gives to the chunks s owns in [off, off+n) — whole chunks,
// none lent or itself borrowed — mapping them side by side in to from
// toOff (which must be wholly uncommitted there), with to's access: they
// are to's from then on (counted in its Committed, released or pooled by
// its decommit), and stay mapped at off in s, with the access they had,
// as borrowed from to (pinned there until s gives them back by
// decommitting or closing). Views over them in s stay live: the memory
// under them does not change. No byte is copied, no memory committed:
// Committed moves from s to to. One map event in to, one map call a
// chunk, one access grant a device.
//
// It refuses, changing nothing in either range: a nil or zero range, or s
// itself as to (ErrInvalid); a closed range (ErrClosed); ranges of
// different physical memory (ErrInvalid); n zero (ErrInvalid); a span not
// whole chunks s owns (ErrNotMapped, ErrPartial), a chunk of it lent to
// another range (ErrBusy) or borrowed (ErrInvalid), or whose size is not
// a multiple of to's ChunkSize (ErrMisaligned); a span of to past its end
// (ErrNotReserved), misaligned (ErrMisaligned) or not wholly uncommitted
// (ErrOverlap). A driver failure part-way unmaps what it mapped in to.
//
// Locks: s's ops, then to's ops (the caller keeps every hand-over between
// two ranges in one direction, as the KV cache does from its slots to its
// store); s's and to's mu one after the other, never together.
func (s *Sparse) HandOver(off, n uint64, to *Sparse, toOff uint64) error {
	return s.HandOverEach([]uint64{off}, n, to, toOff)
}

// HandOverEach is HandOver of several spans of n bytes of s, from each of
// offs, mapped side by side in to from toOff, in that order: all or none
// (a KV cache unit of several regions, which lie apart in a slot and side
// by side in the store, goes in one call). It refuses what HandOver
// refuses of any span, no span at all (ErrInvalid), and spans that
// overlap (ErrOverlap), changing nothing.
func (s *Sparse) HandOverEach(offs []uint64, n uint64, to *Sparse, toOff uint64) error {
	what := func() string {
		return fmt.Sprintf("arena: hand %d span(s) of %s from %#x over to another range at offset %#x", len(offs), units.Bytes(n), offs, toOff)
	}
	if s == nil || s.res == nil || to == nil || to.res == nil {
		return errors.Wrapf(driver.ErrInvalid, "%s: a range is nil or not made by NewSparse", what())
	}
	if to == s {
		return errors.WithHint(errors.Wrapf(driver.ErrInvalid, "%s: a range cannot hand chunks over to itself", what()),
			"hand them over to another range of the same physical memory")
	}
	if to.mem != s.mem {
		return errors.Wrapf(driver.ErrInvalid, "%s: the ranges are of different physical memory (or drivers)", what())
	}
	if n == 0 || len(offs) == 0 {
		return errors.Wrapf(driver.ErrInvalid, "%s: nothing to hand over", what())
	}
	s.ops.Lock()
	defer s.ops.Unlock()
	to.ops.Lock()
	defer to.ops.Unlock()
	given, err := s.handable(what, offs, n, to.opts.ChunkSize)
	if err != nil {
		return err
	}
	taken, err := to.takeOver(what, toOff, given)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, sl := range given {
		sl.lender, sl.lentFrom = to, taken[i]
		taken[i].borrowers.Add(1)
	}
	total := uint64(len(offs)) * n
	s.owned -= total
	s.borrowed += total
	if invariants.Enabled {
		invariants.Fail("arena: hand over", s.checkLocked())
	}
	return nil
}

// handable returns the slots of the chunks s owns in the spans of n
// bytes from each of offs, in order, for a new owner whose chunk size is
// cs, or why they cannot be handed over. The caller holds ops: they stay
// so until it lets go.
func (s *Sparse) handable(what func() string, offs []uint64, n, cs uint64) ([]*slot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, s.errClosed("hand over")
	}
	var given []*slot
	seen := map[*slot]bool{}
	for _, off := range offs {
		lo, hi, err := s.chunksLocked(what, off, n)
		if err != nil {
			return nil, err
		}
		for i := lo; i < hi; i++ {
			if seen[s.slots.At(i).Val] {
				return nil, errors.Wrapf(driver.ErrOverlap, "%s: the spans overlap at %#x", what(), s.slots.At(i).Start)
			}
			seen[s.slots.At(i).Val] = true
		}
		g, err := s.handableRunLocked(what, lo, hi, cs)
		if err != nil {
			return nil, err
		}
		given = append(given, g...)
	}
	return given, nil
}

// handableRunLocked is handable's check of s's chunks [lo, hi).
func (s *Sparse) handableRunLocked(what func() string, lo, hi int, cs uint64) ([]*slot, error) {
	given := make([]*slot, 0, hi-lo)
	for i := lo; i < hi; i++ {
		it := s.slots.At(i)
		switch {
		case it.Val.lender != nil:
			return nil, errors.Wrapf(driver.ErrInvalid, "%s: the chunk at %#x is borrowed from another range: only its owner hands it over", what(), it.Start)
		case it.Val.borrowers.Load() > 0:
			return nil, errors.Wrapf(driver.ErrBusy, "%s: the chunk at %#x is lent to another range", what(), it.Start)
		case it.Size()%cs != 0:
			return nil, errors.Wrapf(driver.ErrMisaligned, "%s: the chunk at %#x is %s, not a multiple of the new owner's chunk size %s",
				what(), it.Start, units.Bytes(it.Size()), units.Bytes(cs))
		}
		given = append(given, it.Val)
	}
	return given, nil
}

// takeOver maps the chunks of given side by side from off, which must be
// wholly uncommitted, grants the range's access over them, and lists them
// as owned; it returns their new slots. On failure it unmaps what it
// mapped and nothing changed. The caller holds ops.
func (s *Sparse) takeOver(what func() string, off uint64, given []*slot) ([]*slot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, driver.Closed(what() + ": the new owner is closed")
	}
	var total uint64
	for _, g := range given {
		total += g.c.Size()
	}
	if err := s.checkSpan(what, off, total); err != nil {
		return nil, err
	}
	if holes := s.holesLocked(off, off+total); len(holes) != 1 || holes[0] != (span{off, off + total}) {
		return nil, errors.WithHint(
			errors.Wrapf(driver.ErrOverlap, "%s: [%#x, +%s) of the new owner is not wholly uncommitted", what(), off, units.Bytes(total)),
			"decommit the span first, or hand over into a hole")
	}
	cs := make([]*physical.Chunk, len(given))
	for i, g := range given {
		cs[i] = g.c
	}
	taken, err := s.adoptLocked(what, off, total, cs)
	if err != nil {
		return nil, err
	}
	if invariants.Enabled {
		invariants.Fail("arena: take over", s.checkLocked())
	}
	return taken, nil
}
