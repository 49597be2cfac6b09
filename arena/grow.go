package arena

import (
	"cmp"
	"math"
	"slices"

	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// How the allocator commits and gives back memory.
//
// The live set is held: the bytes of the used blocks and stitched
// allocations. Whenever the allocator must commit more, it keeps
//
//	committed <= held + slack(held)
//
// where slack is the release threshold (automatic: held/256, at least one
// chunk). So committed memory never runs ahead of what is live by more
// than the slack: at the peak of any workload, peak committed is at most
// the peak live set plus its slack, plus the free bytes of partly used
// chunks, which cannot go back. Below the bound it commits ahead of need,
// up to the bound (fewer, larger commits); at the bound it first stitches,
// or gives back whole free chunks elsewhere — only as many as the new
// commit needs — and only then commits. Free gives nothing back: memory
// freed and reused soon costs no driver call, and memory freed and never
// reused goes back the next time committing needs the room (or on Trim).

// budget is the most the allocator may hold committed when its live set is
// held bytes: held plus the release threshold, or by default plus its
// slack, max(one chunk, held/SlackDivisor), held/256 unless set.
//
// Why 1/256: peak committed is at most the peak live set plus this slack
// plus the free bytes of partly used chunks, which cannot go back. The
// slack is the part the allocator chooses; at 0.4% it leaves most of a 1%
// overhead for that fragmentation, whatever the workload's scale. A larger
// slack means fewer, larger commits and fewer exchanges of free memory for
// new (the closing note of issue 9 has the sweep, made with vmarena replay
// --slack-divisor: 1/64 halves the map and unmap events of a 38 GiB
// training step, and lets peak committed reach 1.6% above peak allocated
// on other traces).
func (al *Allocator) budget(held uint64) uint64 {
	if al.threshold != 0 {
		return satAdd(held, al.threshold)
	}
	return satAdd(held, max(al.cs, held/al.slackDiv))
}

// growPlan is where a request that no free block fits goes: at start, in
// the hole, whose chunks [lo, hi) are committed for it (none when the
// request fits the free blocks beside the hole after all).
type growPlan struct {
	hole   bref
	start  uint64
	lo, hi uint64
	left   bool // the request starts in or before the hole: grow ahead to the right
}

func (g growPlan) need() uint64 { return g.hi - g.lo }

// region is the span the plan uses in h: the hole and the free blocks
// beside it.
func (g growPlan) region(h *heap) span {
	hole := h.at(g.hole)
	r := span{hole.off, hole.end()}
	if p := hole.prev; p != 0 && h.at(p).state == blockFree {
		r.start = h.at(p).off
	}
	if n := hole.next; n != 0 && h.at(n).state == blockFree {
		r.end = h.at(n).end()
	}
	return r
}

// planGrow finds, over every hole, the place for fp bytes aligned to align
// that needs the least new memory: in the hole, using as much as it can of
// the free blocks on either side (the free tail before the last hole is the
// common case). Ties go to the lower address. ok is false when no hole has
// room (the address space is used up).
func (h *heap) planGrow(fp, align uint64) (best growPlan, ok bool) {
	base := h.base
	consider := func(r bref, start uint64, left bool) {
		hole := h.at(r)
		lo, hi := max(hole.off, alignDown(start, h.cs)), min(hole.end(), alignUp(start+fp, h.cs))
		if lo > hi {
			lo = hi
		}
		g := growPlan{hole: r, start: start, lo: lo, hi: hi, left: left}
		if !ok || g.need() < best.need() || g.need() == best.need() && start < best.start {
			best, ok = g, true
		}
	}
	for hole := h.holes; hole != 0; hole = h.at(hole).fnext {
		r := growPlan{hole: hole}.region(h)
		if s := h.alignedStart(r.start, align); s >= r.start && s+fp >= s && s+fp <= r.end {
			consider(hole, s, true)
		}
		if r.size() >= fp {
			if s := alignDown(base+r.end-fp, align) - base; s >= r.start && s+fp <= r.end {
				consider(hole, s, false)
			}
		}
	}
	return best, ok
}

// extend grows the plan's commit ahead of need by up to more bytes, in
// whole chunks, within its hole of h.
func (g *growPlan) extend(h *heap, more uint64) {
	more = alignDown(more, h.cs)
	hole := h.at(g.hole)
	if g.left {
		g.hi += min(more, hole.end()-g.hi)
	} else {
		g.lo -= min(more, g.lo-hole.off)
	}
}

// commitPlan commits the plan's chunks and turns them from hole into free
// memory, merged with the free blocks beside them; it returns the free
// block that now holds the request's place.
func (h *heap) commitPlan(g growPlan) (bref, error) {
	if g.need() == 0 {
		hole := h.at(g.hole)
		for _, r := range [2]bref{hole.prev, hole.next} {
			if b := h.at(r); r != 0 && b.state == blockFree && b.off <= g.start && g.start < b.end() {
				return r, nil
			}
		}
		return 0, errors.AssertionFailedf("arena: a plan at %#x needs no memory, but no free block beside its hole holds it", g.start)
	}
	if err := h.s.Commit(g.lo, g.need()); err != nil {
		return 0, err
	}
	h.removeHole(g.hole)
	h.carve(g.hole, g.lo, g.hi, h.addHole)
	m := h.coalesce(g.hole, blockFree)
	h.addFree(m)
	return m, nil
}

// growLocked serves fp bytes that no free block of h holds: with new
// memory in one of its holes, after stitching or giving back what the
// budget asks; when the device (or Max) is full, it tries again without
// committing ahead, then after giving back all free memory.
func (al *Allocator) growLocked(h *heap, fp, align, req uint64) (driver.Addr, error) {
	const (
		ahead   = iota // commit ahead of need, up to the budget
		exact          // out of memory with ahead: commit just what is needed
		drained        // out of memory again: all free memory given back first
	)
	if al.held+fp > al.max {
		return 0, errors.WithHint(
			errors.Wrapf(driver.ErrOutOfMemory, "%s live and %s more would pass the allocator's maximum %s",
				units.Bytes(al.held), units.Bytes(fp), units.Bytes(al.max)),
			"free allocations, or create the allocator with a larger Max")
	}
	stitched := false
	stitch := func() (driver.Addr, bool, error) {
		if stitched || h != al.heaps[large] {
			return 0, false, nil
		}
		stitched = true
		return al.stitchLocked(fp, req)
	}
	for try := ahead; ; try++ {
		g, ok := h.planGrow(fp, align)
		if !ok {
			if try < drained {
				// The address space is used up: giving back free memory
				// merges holes.
				if _, err := al.releaseLocked(math.MaxUint64, nil, span{}); err != nil {
					return 0, err
				}
				try = drained - 1
				continue
			}
			return 0, errors.WithHint(
				errors.Wrapf(driver.ErrOutOfMemory, "no room for %s in the allocator's address space of %s",
					units.Bytes(fp), units.Bytes(h.s.Max())),
				"create the allocator with a larger AddressSpace")
		}
		budget := al.budget(al.held + fp)
		committed := al.committed()
		if over := committed + g.need(); over > budget && try < drained {
			if p, ok, err := stitch(); err != nil || ok {
				return p, err
			}
			gave, err := al.releaseLocked(over-budget, h, g.region(h))
			if err != nil {
				return 0, err
			}
			if gave > 0 {
				g, _ = h.planGrow(fp, align) // the region was kept, so a plan exists
				committed = al.committed()
			}
		}
		if try == ahead && g.need() > 0 && committed+g.need() < min(budget, al.max) {
			g.extend(h, min(budget, al.max)-committed-g.need())
		}
		var err error
		if committed+g.need() > al.max {
			err = errors.WithHint(
				errors.Wrapf(driver.ErrOutOfMemory, "needed %s more committed, the allocator holds %s of its maximum %s (%s live)",
					units.Bytes(g.need()), units.Bytes(committed), units.Bytes(al.max), units.Bytes(al.held)),
				"free allocations, or create the allocator with a larger Max")
		} else {
			b, cerr := h.commitPlan(g)
			if cerr == nil {
				if g.need() > 0 {
					al.stats.Grows++
					al.stats.PeakCommitted = max(al.stats.PeakCommitted, committed+g.need())
				}
				al.held += fp
				return h.place(b, g.start, fp, req), nil
			}
			err = errors.Wrapf(cerr, "the allocator holds %s committed, %s live", units.Bytes(committed), units.Bytes(al.held))
		}
		if !errors.Is(err, driver.ErrOutOfMemory) || try == drained {
			return 0, err
		}
		if try == exact {
			al.stats.OOMRetries++
			if p, ok, serr := stitch(); serr != nil || ok {
				return p, serr
			}
			if _, err := al.releaseLocked(math.MaxUint64, nil, span{}); err != nil {
				return 0, err
			}
		}
	}
}

// freeRun is the whole free chunks [lo, hi) of the free block b of h.
type freeRun struct {
	h      *heap
	b      bref
	lo, hi uint64
}

// freeRuns lists the whole free chunks of every free block of h, one run
// per block, leaving out what lies in keep.
func (h *heap) freeRuns(keep span) []freeRun {
	var runs []freeRun
	fl, _ := bucket(max(h.cs/h.q, 1))
	for f := fl; f < flCount; f++ {
		for sl := range slCount {
			for r := h.free.heads[f][sl]; r != 0; r = h.at(r).fnext {
				b := h.at(r)
				lo, hi := alignUp(b.off, h.cs), alignDown(b.end(), h.cs)
				if keep.start < keep.end && lo < keep.end && keep.start < hi {
					// A free block overlaps the kept region only at one of
					// its ends: keep out of it.
					if lo < keep.start {
						hi = alignDown(keep.start, h.cs)
					} else {
						lo = alignUp(keep.end, h.cs)
					}
				}
				if lo < hi {
					runs = append(runs, freeRun{h, r, lo, hi})
				}
			}
		}
	}
	return runs
}

// releaseLocked gives back whole free chunks of both heaps — leaving out
// keep in the heap kh — the largest runs first and from their high end, so
// few calls give back much, until want bytes have gone or none are left.
// It returns what it gave back.
func (al *Allocator) releaseLocked(want uint64, kh *heap, keep span) (uint64, error) {
	var runs []freeRun
	for _, h := range al.distinct() {
		k := span{}
		if h == kh {
			k = keep
		}
		runs = append(runs, h.freeRuns(k)...)
	}
	slices.SortFunc(runs, func(a, b freeRun) int {
		return cmp.Or(cmp.Compare(b.hi-b.lo, a.hi-a.lo), cmp.Compare(a.lo, b.lo))
	})
	var gave uint64
	for _, r := range runs {
		if gave >= want {
			break
		}
		take := min(r.hi-r.lo, alignUp(want-gave, al.cs))
		if err := r.h.decommit(r.b, r.hi-take, r.hi); err != nil {
			return gave, err
		}
		gave += take
	}
	return gave, nil
}

// decommit gives back [lo, hi), whole chunks inside the free block b, which
// becomes a hole between what is left of b on either side. When the
// driver refuses part-way, the range has given back the end of [lo, hi)
// (it unmaps last first): that part becomes the hole, and the error is
// returned.
func (h *heap) decommit(b bref, lo, hi uint64) error {
	err := h.s.Decommit(lo, hi-lo)
	if err != nil {
		if lo = h.s.committedEnd(lo, hi); lo == hi {
			return errors.Wrap(err, "arena: allocator giving back free memory")
		}
	}
	h.removeFree(b)
	h.carve(b, lo, hi, h.addFree)
	h.addHole(h.coalesce(b, blockHole))
	return errors.Wrap(err, "arena: allocator giving back free memory")
}

// Trim gives every wholly free chunk back to the device, wherever it lies.
func (al *Allocator) Trim() error { return al.TrimTo(0) }

// TrimTo gives wholly free chunks back while more than keep bytes are
// committed (as cuMemPoolTrimTo: until keep or fewer are, or nothing more
// can go). It never gives back memory behind live allocations.
func (al *Allocator) TrimTo(keep uint64) error {
	al.mu.Lock()
	defer al.mu.Unlock()
	if al.closed {
		return al.errClosed("trim")
	}
	c := al.committed()
	if c <= keep {
		return nil
	}
	_, err := al.releaseLocked(c-keep, nil, span{})
	al.checkAfter("trim")
	return err
}
