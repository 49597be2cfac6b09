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

// Relocation: chunks a range owns are unmapped where they lie and mapped
// side by side elsewhere — in the same range or another one on the same
// physical memory — keeping their memory. A driver creates memory slowly
// (cuMemCreate is about 190 µs for 2 MiB on an A100) and maps it quickly
// (cuMemMap about 1.5 µs, cuMemUnmap about 26 µs): an allocator that must
// commit where a request goes while whole free chunks sit elsewhere moves
// them there, an unmap and a map a chunk, rather than releasing them and
// creating new ones. Committed memory does not change; no byte is copied
// (what the chunks held is free memory to their owner).

// relocated is one chunk on its way: where it was and its slot there.
type relocated struct {
	off uint64
	sl  *slot
}

// relocate moves the chunks src owns at the offsets srcOffs (each the
// start of a chunk src owns, with no view and no borrower) to lie side by
// side in dst from off, in that order, where dst must be uncommitted
// throughout: src unmaps them (one unmap event a run of adjacent ones),
// dst maps them (one map event) and grants its access over them in one
// call a device. It returns the bytes moved. On failure nothing changes in
// either range: the chunks are mapped back where they were, with the
// access they had. Only the package's own allocator uses it: a bad
// argument is a broken invariant. The caller holds neither range's locks.
func relocate(dst *Sparse, off uint64, src *Sparse, srcOffs []uint64) (uint64, error) {
	what := func() string {
		return fmt.Sprintf("arena: relocate %d chunk(s) to offset %#x", len(srcOffs), off)
	}
	if len(srcOffs) == 0 || dst.mem != src.mem {
		return 0, errors.AssertionFailedf("%s: at least one chunk, between ranges of one physical memory", what())
	}
	src.ops.Lock()
	if dst != src {
		// Two ranges' ops: the allocator that owns both is the only
		// caller, under its own lock, so no other order is ever taken.
		dst.ops.Lock()
		defer dst.ops.Unlock()
	}
	defer src.ops.Unlock()
	moved, err := src.unmapForRelocation(what, srcOffs)
	if err != nil {
		return 0, err
	}
	total, err := dst.mapRelocated(what, off, moved)
	if err != nil {
		return 0, errors.CombineErrors(err, src.mapBack(what, moved))
	}
	return total, nil
}

// unmapForRelocation unmaps the owned, unpinned chunks at offs and drops
// them from the range's books. The caller holds ops.
func (s *Sparse) unmapForRelocation(what func() string, offs []uint64) ([]relocated, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, s.errClosed("relocate")
	}
	moved := make([]relocated, 0, len(offs))
	for _, o := range offs {
		it := s.slots.Get(o)
		if it == nil || it.Start != o {
			return nil, errors.AssertionFailedf("%s: no chunk starts at %#x", what(), o)
		}
		sl := it.Val
		if sl.lender != nil || sl.views > 0 || sl.borrowers.Load() > 0 {
			return nil, errors.AssertionFailedf("%s: the chunk at %#x is borrowed, viewed or lent", what(), o)
		}
		moved = append(moved, relocated{o, sl})
	}
	for i, m := range moved {
		if err := s.tab.Unmap(s.Base() + driver.Addr(m.off)); err != nil {
			return nil, errors.CombineErrors(errors.Wrapf(err, "%s", what()), s.remapLocked(what, moved[:i]))
		}
		s.stats.ChunkUnmaps++
	}
	prev := uint64(0)
	for i, m := range moved {
		if i == 0 || m.off != prev {
			s.stats.UnmapEvents++
		}
		prev = m.off + m.sl.c.Size()
		s.slots.DeleteStart(m.off)
		s.owned -= m.sl.c.Size()
	}
	if invariants.Enabled {
		invariants.Fail("arena: relocate out", s.checkLocked())
	}
	return moved, nil
}

// remapLocked maps moved chunks back at their offsets with their own
// access, undoing an unmap part-way; their slots are still listed.
func (s *Sparse) remapLocked(what func() string, moved []relocated) error {
	var errs error
	for _, m := range moved {
		if mapped, err := s.mapBackAt(what, m); !mapped {
			errs = errors.CombineErrors(errs, errors.AssertionFailedf("%s: mapping the chunk at %#x back failed: %v", what(), m.off, err))
		} else {
			errs = errors.CombineErrors(errs, err)
		}
	}
	return errs
}

// mapBackAt maps the chunk of m back at its offset and grants it the
// access its slot had. mapped is false when the driver would not map it;
// a grant that fails (an assertion failure: it had that access there a
// moment ago) leaves it mapped.
func (s *Sparse) mapBackAt(what func() string, m relocated) (mapped bool, errs error) {
	at := s.Base() + driver.Addr(m.off)
	if err := s.tab.Map(at, m.sl.c); err != nil {
		return false, err
	}
	s.stats.ChunkMaps++
	for d, acc := range m.sl.access {
		if acc == driver.AccessNone {
			continue
		}
		if err := s.tab.SetAccess(at, m.sl.c.Size(), driver.DeviceID(d), acc); err != nil {
			errs = errors.CombineErrors(errs, errors.AssertionFailedf("%s: granting the chunk at %#x back failed: %v", what(), m.off, err))
		}
	}
	return true, errs
}

// mapRelocated maps the chunks of moved side by side from off, which must
// be uncommitted throughout, grants the range's access over them, and
// lists them as owned. On failure it unmaps what it mapped. The caller
// holds ops.
func (s *Sparse) mapRelocated(what func() string, off uint64, moved []relocated) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, s.errClosed("relocate")
	}
	var total uint64
	for _, m := range moved {
		total += m.sl.c.Size()
	}
	if err := s.checkSpan(what, off, total); err != nil {
		return 0, errors.WithAssertionFailure(err)
	}
	if holes := s.holesLocked(off, off+total); len(holes) != 1 || holes[0] != (span{off, off + total}) {
		return 0, errors.AssertionFailedf("%s: [%#x, +%s) is not wholly uncommitted", what(), off, units.Bytes(total))
	}
	cs := make([]*physical.Chunk, len(moved))
	for i, m := range moved {
		cs[i] = m.sl.c
	}
	if _, err := s.adoptLocked(what, off, total, cs); err != nil {
		return 0, err
	}
	s.stats.Relocations++
	s.stats.RelocatedBytes += total
	if invariants.Enabled {
		invariants.Fail("arena: relocate in", s.checkLocked())
	}
	return total, nil
}

// adoptLocked maps chunks cs (total bytes in all) side by side from off,
// which the caller has checked is wholly uncommitted, grants the range's
// access over them and lists them as owned (one map event); it returns
// their slots. On failure it unmaps what it mapped and nothing changed.
// Relocation and HandOver bring chunks in this way. The caller holds ops
// and mu.
func (s *Sparse) adoptLocked(what func() string, off, total uint64, cs []*physical.Chunk) ([]*slot, error) {
	undo := func(cause error, mapped int) error {
		at := off
		for _, c := range cs[:mapped] {
			cause = errors.CombineErrors(cause, s.tab.Unmap(s.Base()+driver.Addr(at)))
			s.stats.ChunkUnmaps++
			at += c.Size()
		}
		return errors.Wrapf(cause, "%s", what())
	}
	at := off
	for i, c := range cs {
		if err := s.tab.Map(s.Base()+driver.Addr(at), c); err != nil {
			return nil, undo(err, i)
		}
		s.stats.ChunkMaps++
		at += c.Size()
	}
	if err := s.grantNewLocked(span{off, off + total}); err != nil {
		return nil, undo(err, len(cs))
	}
	run := make([]ranges.Item[uint64, *slot], len(cs))
	slots := make([]*slot, len(cs))
	at = off
	for i, c := range cs {
		slots[i] = &slot{c: c, access: slices.Clone(s.access)}
		run[i] = ranges.Item[uint64, *slot]{Start: at, End: at + c.Size(), Val: slots[i]}
		at += c.Size()
	}
	if _, ok := s.slots.InsertRun(run); !ok {
		return nil, errors.AssertionFailedf("%s: the chunks brought in overlap the range's", what())
	}
	s.owned += total
	s.stats.PeakCommitted = max(s.stats.PeakCommitted, s.owned)
	s.stats.MapEvents++
	return slots, nil
}

// mapBack returns chunks that unmapForRelocation took but another range
// could not map to where they were, with the access they had. A chunk the
// driver will not map back is released (its memory goes back; the error
// says so). The caller holds ops.
func (s *Sparse) mapBack(what func() string, moved []relocated) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs error
	for _, m := range moved {
		mapped, err := s.mapBackAt(what, m)
		if !mapped {
			errs = errors.CombineErrors(errs, errors.Wrapf(err, "%s: the chunk at %#x could not be mapped back, and is released", what(), m.off))
			s.releaseLost(m.sl.c)
			continue
		}
		errs = errors.CombineErrors(errs, err)
		if _, ok := s.slots.Add(m.off, m.off+m.sl.c.Size(), m.sl); !ok {
			errs = errors.CombineErrors(errs, errors.AssertionFailedf("%s: the chunk at %#x is in the way mapping back", what(), m.off))
		}
		s.owned += m.sl.c.Size()
	}
	return errs
}

// releaseLost releases a chunk no range maps any more, or keeps it for the
// next Decommit or Close when the driver refuses. The caller holds ops.
func (s *Sparse) releaseLost(c *physical.Chunk) {
	s.stats.Releases++
	if err := c.Release(); err != nil {
		s.unreleased = append(s.unreleased, c)
	}
}

// chunkAt returns the chunk of the range holding off.
func (s *Sparse) chunkAt(off uint64) (span, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.chunkAtLocked(off)
}

func (s *Sparse) chunkAtLocked(off uint64) (span, bool) {
	it := s.slots.Get(off)
	if it == nil {
		return span{}, false
	}
	return span{it.Start, it.End}, true
}

// chunksAt returns the chunks holding a and b (empty spans for none), under
// one lock.
func (s *Sparse) chunksAt(a, b uint64) (span, span) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ca, _ := s.chunkAtLocked(a)
	cb, _ := s.chunkAtLocked(b)
	return ca, cb
}

// chunkStarts appends to offs the starts of the chunks of the range in
// [start, end), which must be whole chunks.
func (s *Sparse) chunkStarts(offs []uint64, start, end uint64) []uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, it := range s.slots.From(s.slots.Search(start)) {
		if it.Start >= end {
			break
		}
		offs = append(offs, it.Start)
	}
	return offs
}

// wholeSpan returns the span of the chunks lying wholly inside
// [off, end), which is committed throughout (empty when there are none).
func (s *Sparse) wholeSpan(off, end uint64) span {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.wholeSpanLocked(off, end)
}

func (s *Sparse) wholeSpanLocked(off, end uint64) span {
	if off >= end {
		return span{}
	}
	lo, hi := off, end
	if it := s.slots.Get(off); it != nil && it.Start != off {
		lo = it.End
	}
	if it := s.slots.Get(end - 1); it != nil && it.End != end {
		hi = it.Start
	}
	if lo >= hi {
		return span{}
	}
	return span{lo, hi}
}

// chunkCut returns the lowest chunk boundary c in [lo, hi) — whole chunks
// — such that the chunks of [c, hi) hold at least want bytes, but not
// more than most (hi when the last chunk alone holds more): what taking
// want bytes from hi down takes. When all of [lo, hi) holds less than
// want, it is the lowest boundary within most.
func (s *Sparse) chunkCut(lo, hi, want, most uint64) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	i, ok := s.slots.Find(hi - 1)
	if !ok {
		return hi
	}
	cut := hi
	for _, it := range s.slots.Backward(i + 1) {
		if it.Start < lo || hi-it.Start > most {
			return cut
		}
		if cut = it.Start; hi-cut >= want {
			return cut
		}
	}
	return cut
}
