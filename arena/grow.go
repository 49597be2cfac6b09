package arena

import (
	"math"
	"math/bits"
	"slices"

	"github.com/vmarena/vmarena/internal/errors"

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
// up to the bound (fewer, larger commits). Free gives nothing back: memory
// freed and reused soon costs no driver call.
//
// Driver calls are priced too (a create is about 190 µs on an A100, a map
// 1.5 µs, an unmap 26 µs, an access grant 36 µs: DESIGN.md), so:
//
//   - Where a request goes, whole free chunks lying elsewhere move first
//     (relocate.go: an unmap and a map a chunk, no new memory) before any
//     chunk is created: memory freed in one place and needed in another
//     costs no create, and committed memory does not grow.
//   - What must be created is cut so that the request's interior — the
//     whole chunks of ChunkSize it covers — is one chunk of its own, and
//     what lies beside it (the request's ends, which neighbours share, and
//     the commit ahead) is at most edgeChunk a chunk: a large allocation
//     costs one create and one map, and when it is freed its chunk is
//     wholly free, to move or give back whole. After a large request, the
//     commit ahead is cut for more like it (cut says how), and what is
//     left in pieces that double from edgeChunk, so that it costs a few
//     creates, not one an edgeChunk.
//   - The new chunks of a commit get their access in one call a device.
//   - A request that lands on part of a free chunk larger than edgeChunk
//     strands it (strand.go: no driver call) while the stranded chunks
//     stay within the slack, and only past that splits it (gives it back
//     and commits its own chunks: an unmap, a release, creates, a map and
//     a grant).
//
// When a commit needs more than the budget allows and no free chunk can
// move, the allocator stitches (stitch.go) when there is no hole with room
// for the request at all, and otherwise commits beyond the budget (the
// free bytes it would have given back are in partly used chunks, which
// cannot go).

// budget is the most the allocator may hold committed when its live set is
// held bytes: held plus the release threshold, or by default plus its
// slack, max(one chunk, held/SlackDivisor), held/256 unless set.
//
// Why 1/256: peak committed is at most the peak live set plus this slack
// plus the free bytes of partly used chunks, which cannot go back. The
// slack is the part the allocator chooses; at 0.4% it leaves most of a 1%
// overhead for that fragmentation, whatever the workload's scale. A larger
// slack means fewer, larger commits and fewer exchanges of free memory for
// new (a sweep with vmarena replay --slack-divisor over the bundled
// traces: 1/64 halves the map and unmap events of a 38 GiB training step,
// and lets peak committed reach 1.6% above peak allocated on other
// traces).
func (al *Allocator) budget(held uint64) uint64 {
	if al.threshold != 0 {
		return satAdd(held, al.threshold)
	}
	return satAdd(held, max(al.cs, held/al.slackDiv))
}

// Free chunks kept for reuse. Free gives nothing back, and a commit gives
// back free chunks down to a budget; the budget of that give-back is
// keepBudget, which is budget plus a share of the distance from the live
// set to its high-water mark:
//
//	keepBudget(held) = budget(held) + (high − held)/keepDivisor
//
// So after a peak, while the live set is below it, a commit elsewhere
// gives back fewer of the chunks just freed, and a request of the size of
// one freed later finds it mapped: no create, no unmap, no release. At the
// high-water mark the share is nothing, so what is kept adds nothing to
// the bound on peak committed (held plus slack at the peak). Only the
// give-back reads it: the commit ahead of need, stranding and splitting go
// by budget, so the kept share never commits memory. high decays towards
// the live set by 1/2^keepDecayShift of the distance each Alloc and Free,
// so a peak long past stops holding memory; and when memory runs out
// (the device, or Max) every free chunk, kept or not, goes back before a
// request is refused (growLocked's drained try).
//
// keepDivisor: a sweep over the bundled traces and the synthetic workloads
// (go test ./arena -run TestSyntheticWorkloads): 1/1 and 1/2 keep enough
// whole free chunks lying about that requests split them (a 1 GiB trace
// went from 66 creates to 111 at 1/2), 1/8 keeps what is cheap to keep
// without that (docs/arena.md, "The allocator's driver calls", has what
// keeping more costs).
const (
	keepDivisor    = 8
	keepDecayShift = 16
)

// keepBudget is the most the allocator keeps committed, when it must
// commit more for a live set of held bytes, before it gives free chunks
// back: budget plus a share of the distance to the high-water mark.
func (al *Allocator) keepBudget(held uint64) uint64 {
	b := al.budget(held)
	if al.high > held && al.keepDiv > 0 {
		b = satAdd(b, (al.high-held)/al.keepDiv)
	}
	return b
}

// noteHeld moves the high-water mark after a change of the live set: up to
// it, or a step of the distance down towards it.
func (al *Allocator) noteHeld() {
	if al.held >= al.high {
		al.high = al.held
		return
	}
	al.high -= (al.high - al.held) >> keepDecayShift
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

// uses is the span the plan's request and commit take: what moving and
// giving back free chunks must leave alone (the region's other free
// neighbour may go).
func (g growPlan) uses(fp uint64) span {
	return span{min(g.start, g.lo), max(g.start+fp, g.hi)}
}

// planScan is how many of the largest free blocks beside holes planGrow
// looks at.
const planScan = 16

// planGrow finds a place for fp bytes aligned to align that needs little
// new memory: in a hole, using as much as it can of the free blocks on
// either side (the free tail before the last hole is the common case). It
// looks at the holes beside the planScan largest free blocks that border
// one, and at the lowest hole long enough by itself, and takes the one
// that needs the least; ties go to the lower address. So its cost does not
// grow with the number of holes: it is the exact best but for a hole whose
// free neighbours are all smaller than those of planScan others. ok is
// false when no hole has room (the address space is used up).
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
	try := func(hole bref) {
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
	n := 0
	h.edges.descending(&h.slab, func(e bref) bool {
		b := h.at(e)
		if b.prev != 0 && h.at(b.prev).state == blockHole {
			try(b.prev)
		}
		if b.next != 0 && h.at(b.next).state == blockHole {
			try(b.next)
		}
		n++
		return n < planScan
	})
	// Holes start on chunk boundaries: the lowest one of the request's
	// chunks holds it at most alignments, the lowest one longer by the
	// alignment at any.
	if i := h.holes.FirstFit(0, alignUp(fp, h.cs)); i < h.holes.Len() {
		try(h.holes.At(i).Val)
	}
	if i := h.holes.FirstFit(0, satAdd(alignUp(fp, h.cs), align)); i < h.holes.Len() {
		try(h.holes.At(i).Val)
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

// edgeChunk is the largest chunk that several allocations may share: the
// chunks a commit creates beside a request's interior (its ends, which
// neighbours share, and the memory committed ahead of need). A partly
// used chunk cannot go back, so what it strands is bounded by its size:
// 1/edgeDivisor of the live set keeps that a small part of the slack the
// budget allows (held/256) at every scale, while a commit for a large live
// set costs few creates. Below that it is 2 MiB — a GPU's large page,
// PyTorch's small-pool segment: at a 64 KiB granularity smaller chunks
// would cost a driver create each 64 KiB — unless the allocator's Max
// is so small that 2 MiB is more than 1/edgeDivisor of it; and never
// below ChunkSize.
func (h *heap) edgeChunk() uint64 {
	share := min(2*units.MiB, h.max/edgeDivisor)
	if h.held != nil {
		share = max(share, *h.held/edgeDivisor)
	}
	if share <= h.cs {
		return h.cs
	}
	return uint64(1) << (bits.Len64(share) - 1) / h.cs * h.cs
}

// edgeDivisor: see edgeChunk. (A sweep of it on the random-lifetimes
// replay: at 1/1024 peak committed passes 1% above peak allocated; at
// 1/4096 it stays within 0.5%.)
const edgeDivisor = 4096

// cut cuts a hole to commit for the request [start, start+fp) into chunks:
// the request's interior (the whole chunks of ChunkSize it covers) one
// chunk; before it, pieces of at most edgeChunk; after a request of two
// chunks or more, the interiors of more like it while they fit, then
// pieces that double from edgeChunk; after a smaller one, pieces of at
// most edgeChunk.
func (h *heap) cut(start, fp uint64) func(span) []span {
	return func(hole span) []span {
		edge := h.edgeChunk()
		var parts []span
		add := func(lo, hi uint64) {
			for lo < hi {
				n := min(hi-lo, edge)
				parts = append(parts, span{lo, lo + n})
				lo += n
			}
		}
		in := span{max(hole.start, alignUp(start, h.cs)), min(hole.end, alignDown(start+fp, h.cs))}
		if in.start >= in.end {
			add(hole.start, hole.end)
			return parts
		}
		// The parts beside the interior are cut from the interior outward,
		// so that the chunk a neighbour shares with the request is one
		// ChunkSize: it pins the least.
		var before []span
		for hi := in.start; hi > hole.start; {
			n := min(hi-hole.start, edge)
			before = append(before, span{hi - n, hi})
			hi -= n
		}
		slices.Reverse(before)
		parts = append(before, in)
		at := in.end
		if fp >= 2*h.cs {
			// What lies after is cut for requests like this one packed
			// after it — tensors of one shape come in runs: the granule two
			// of them share, then the next one's interior, while they fit.
			for p := start + fp; p+fp <= hole.end; p += fp {
				g0, g1, i1 := alignDown(p, h.cs), alignUp(p, h.cs), alignDown(p+fp, h.cs)
				if g0 < at || i1 <= g1 {
					break
				}
				if g0 > at {
					add(at, g0)
				}
				if g1 > g0 {
					parts = append(parts, span{g0, g1})
				}
				parts = append(parts, span{g1, i1})
				at = i1
			}
			// What is left, too short for one more, is cut in pieces that
			// double: edgeChunk, edgeChunk, then each as large as all the
			// pieces before it. A request like this one covering it costs
			// a few creates, not one an edgeChunk; one of another size
			// that covers a piece in part splits that piece alone, no
			// larger than what the request covers before it.
			for done := uint64(0); at < hole.end; {
				n := min(max(edge, done), hole.end-at)
				parts = append(parts, span{at, at + n})
				at += n
				done += n
			}
		}
		add(at, hole.end)
		return parts
	}
}

// commitPlan commits the plan's chunks, cut for the request, and turns them
// from hole into free memory, merged with the free blocks beside them; it
// returns the free block that now holds the request's place.
func (h *heap) commitPlan(g growPlan, fp uint64) (bref, error) {
	if g.need() == 0 {
		hole := h.at(g.hole)
		for _, r := range [2]bref{hole.prev, hole.next} {
			if b := h.at(r); r != 0 && b.state == blockFree && b.off <= g.start && g.start < b.end() {
				return r, nil
			}
		}
		return 0, errors.AssertionFailedf("arena: a plan at %#x needs no memory, but no free block beside its hole holds it", g.start)
	}
	if err := h.s.commitCut(g.lo, g.need(), h.cut(g.start, fp)); err != nil {
		return 0, err
	}
	return h.filled(g.hole, g.lo, g.hi), nil
}

// serveMovedLocked serves fp bytes in a free block that moving chunks
// made, after giving back free chunks down to the budget and the share
// kept for reuse, leaving the request's own; it reports false when no free
// block holds the request.
func (al *Allocator) serveMovedLocked(h *heap, fp, align, req uint64) (driver.Addr, bool, error) {
	find := func() (bref, placement) {
		r := h.free.find(&h.slab, (fp+align-al.q)/al.q, al.q)
		if r == 0 {
			return 0, placement{}
		}
		return r, h.startIn(h.at(r), fp, align)
	}
	r, pl := find()
	if r == 0 {
		return 0, false, nil
	}
	if over, keep := al.committed(), al.keepBudget(al.held+fp); over > keep {
		gave, err := al.releaseLocked(over-keep, h, span{alignDown(pl.start, h.cs), alignUp(pl.start+fp, h.cs)})
		if err != nil {
			return 0, false, err
		}
		if gave > 0 {
			if r, pl = find(); r == 0 {
				return 0, false, nil
			}
		}
	}
	p, err := al.serveLocked(h, r, pl, fp, align, req)
	return p, err == nil, err
}

// filled turns [lo, hi) of the hole r, now committed, into free memory
// merged with the free blocks beside it, and returns that free block.
func (h *heap) filled(r bref, lo, hi uint64) bref {
	h.removeHole(r)
	h.carve(r, lo, hi, h.addHole)
	m := h.coalesce(r, blockFree)
	h.addFree(m)
	return m
}

// growLocked serves fp bytes that no free block of h holds: in one of its
// holes, with whole free chunks moved from elsewhere and new memory as the
// budget allows; when the device (or Max) is full, it tries again without
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
	stitched, relocated := false, false
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
			// No hole has room: stitching needs none; giving back free
			// memory merges holes.
			if p, ok, err := stitch(); err != nil || ok {
				return p, err
			}
			if try < drained {
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
		if g.need() > 0 && try < drained && !relocated {
			// Whole free chunks elsewhere go where the request goes first
			// (once: what moved is beside the plan's free block, and moving
			// again could only move it away).
			relocated = true
			moved, err := al.relocateLocked(h, g, fp)
			if err != nil {
				return 0, err
			}
			if moved > 0 {
				if g, ok = h.planGrow(fp, align); !ok {
					// What moved filled the hole whole (chunks large
					// beside the address space leave few holes): merged
					// with the plan's free block, it holds the request.
					// What could not move goes back first, as below.
					if p, ok, err := al.serveMovedLocked(h, fp, align, req); err != nil || ok {
						return p, err
					}
					try-- // plan again at this try, as if no hole had room
					continue
				}
			}
		}
		// A request that would split a large free chunk beside the hole
		// splits it now, before a plan that passes the budget commits:
		// given back after the commit, it would add to the peak in
		// between.
		for n := 0; n < 2 && g.need() > 0 && try < drained && al.committed()+g.need() > al.budget(al.held+fp); n++ {
			gave, err := al.splitFirst(h, g, fp)
			if err != nil {
				return 0, err
			}
			if !gave {
				break
			}
			if g, ok = h.planGrow(fp, align); !ok {
				return 0, errors.AssertionFailedf("arena: no plan for %d bytes after giving back a chunk beside the hole of one", fp)
			}
		}
		budget := al.budget(al.held + fp)
		committed := al.committed()
		if over, keep := committed+g.need(), al.keepBudget(al.held+fp); over > keep && try < drained {
			// What could not move goes back, down to the budget and the
			// share kept for reuse: whole free chunks too large to move
			// here, or lying in the way.
			gave, err := al.releaseLocked(over-keep, h, g.uses(fp))
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
			b, cerr := h.commitPlan(g, fp)
			if cerr == nil {
				if g.need() > 0 {
					al.stats.Grows++
					al.stats.PeakCommitted = max(al.stats.PeakCommitted, committed+g.need())
				}
				return al.serveLocked(h, b, h.placeAt(h.at(b), g.start, fp), fp, align, req)
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

// serveLocked hands out fp bytes at pl in the free block r — splitting
// first when pl says so.
func (al *Allocator) serveLocked(h *heap, r bref, pl placement, fp, align, req uint64) (driver.Addr, error) {
	if pl.split {
		return al.splitLocked(h, r, pl.pin, pl.start, fp, align, req)
	}
	al.held += fp
	for _, c := range pl.strand[:pl.strands] {
		al.strand(h, c)
	}
	return h.place(r, pl.start, fp, req), nil
}

// splitLocked serves fp bytes at start in the free block r, where they
// would cover in part the whole free chunks pin, one of them larger than
// edgeChunk: it gives those chunks back and commits the request's own
// chunks in their place (a chunk cannot be given back in part). Should
// giving back fail, it grows as if no free block fitted.
func (al *Allocator) splitLocked(h *heap, r bref, pin span, start, fp, align, req uint64) (driver.Addr, error) {
	if err := h.decommit(r, pin.start, pin.end); err != nil {
		return al.growLocked(h, fp, align, req)
	}
	al.stats.Splits++
	hole := h.holeAt(pin.start)
	if hole == 0 {
		return 0, errors.AssertionFailedf("arena: gave back [%#x, %#x) to split it, and no hole is there", pin.start, pin.end)
	}
	g := growPlan{hole: hole, start: start, left: true,
		lo: max(pin.start, alignDown(start, h.cs)), hi: min(pin.end, alignUp(start+fp, h.cs))}
	if g.lo > g.hi {
		g.lo = g.hi
	}
	// Room for one more request like this one stays committed after it,
	// cut for it: where the next of a run of equal requests packs, as it
	// would have in the chunk given back (the rest of it goes) — as far as
	// the budget allows, as any commit ahead of need.
	g.hi = min(pin.end, g.hi+alignUp(fp, h.cs))
	b, err := h.commitPlan(g, fp)
	if err != nil {
		return al.growLocked(h, fp, align, req)
	}
	al.held += fp
	return h.place(b, start, fp, req), nil
}

// splitFirst gives back the whole free chunks of a free block beside the
// plan's hole that the plan's request would cover in part and so split
// (placeAt says which: a chunk larger than edgeChunk, past what may be
// stranded), as splitLocked would once the request is placed; it reports
// whether it gave any back, after which the plan must be made again (the
// hole has changed).
func (al *Allocator) splitFirst(h *heap, g growPlan, fp uint64) (bool, error) {
	hole := h.at(g.hole)
	for _, r := range [2]bref{hole.prev, hole.next} {
		if r == 0 {
			continue
		}
		b := h.at(r)
		if b.state != blockFree || max(b.wlo, g.start) >= min(b.whi, g.start+fp) {
			continue
		}
		if pl := h.placeAt(b, g.start, fp); pl.split {
			if err := h.decommit(r, pl.pin.start, pl.pin.end); err != nil {
				return false, err
			}
			al.stats.Splits++
			return true, nil
		}
	}
	return false, nil
}

// take is whole free chunks [lo, hi) at the high end of the free block b
// of h, chosen to move or give back.
type take struct {
	h      *heap
	b      bref
	lo, hi uint64
}

// takeLargest chooses whole free chunks of the heaps hs, leaving out what
// lies in keep in the heap kh, until want bytes or more are chosen, or
// none are left, or more would pass limit bytes in all: the free blocks
// with the most whole chunks first (to a sixteenth), from their high end,
// so that few calls move or give back much. It chooses, changing nothing.
func takeLargest(hs []*heap, want uint64, kh *heap, keep span, limit uint64) ([]take, uint64) {
	var takes []take
	var got uint64
	for _, h := range hs {
		h.chunky.descending(&h.slab, func(r bref) bool {
			b := h.at(r)
			lo, hi := b.wlo, b.whi
			if h == kh && lo < keep.end && keep.start < hi {
				// A free block overlaps the kept region only at one of its
				// ends: keep out of it.
				var w span
				if lo < keep.start {
					w = h.s.wholeSpan(lo, min(hi, keep.start))
				} else if keep.end < hi {
					w = h.s.wholeSpan(keep.end, hi)
				}
				if w.start >= w.end {
					return true
				}
				lo, hi = w.start, w.end
			}
			if cut := h.s.chunkCut(lo, hi, want-got, limit-got); cut < hi {
				takes = append(takes, take{h, r, cut, hi})
				got += hi - cut
			}
			return got < want && got < limit
		})
		if got >= want {
			break
		}
	}
	return takes, got
}

// relocateLocked moves whole free chunks of one of the allocator's heaps
// (h's own first), outside what the plan uses, next to the plan's free
// block in its hole — up to what the plan needs, and as much as the hole
// holds — and returns the bytes moved (0 when there are none to move). A
// chunk much larger than the need stays where it is: covering it in part
// would split it again. All or nothing: when the driver refuses, the
// chunks are where they were and the error says why.
func (al *Allocator) relocateLocked(h *heap, g growPlan, fp uint64) (uint64, error) {
	hole := h.at(g.hole)
	room := hole.end() - g.lo // growing to the right from g.lo
	if !g.left {
		room = g.hi - hole.off // growing to the left from g.hi
	}
	limit := min(room, g.need()+h.edgeChunk())
	takes, got := takeLargest([]*heap{h}, g.need(), h, g.uses(fp), limit)
	for _, o := range al.distinct() {
		if got > 0 {
			break
		}
		if o != h {
			takes, got = takeLargest([]*heap{o}, g.need(), nil, span{}, limit)
		}
	}
	if got == 0 {
		return 0, nil
	}
	at := g.lo
	if !g.left {
		at = g.hi - got
	}
	src := takes[0].h
	var offs []uint64
	for _, t := range takes {
		offs = src.s.chunkStarts(offs, t.lo, t.hi)
	}
	if _, err := relocate(h.s, at, src.s, offs); err != nil {
		return 0, errors.Wrap(err, "moving free chunks to where the request goes")
	}
	for _, t := range takes {
		src.vacate(t.b, t.lo, t.hi)
	}
	// The books of the destination: the hole gets the moved memory, merged
	// with the plan's free block. (A vacate beside the hole may have merged
	// it with another: find it again.)
	hr := h.holeAt(at)
	if hr == 0 {
		return 0, errors.AssertionFailedf("arena: relocated %d bytes to %#x, where no hole is", got, at)
	}
	h.filled(hr, at, at+got)
	al.stats.Relocations++
	al.stats.RelocatedBytes += got
	return got, nil
}

// holeAt returns the hole holding off, or 0.
func (h *heap) holeAt(off uint64) bref {
	if it := h.holes.Get(off); it != nil {
		return it.Val
	}
	return 0
}

// vacate turns [lo, hi), whole chunks inside the free block b that the
// range no longer maps (moved elsewhere or given back), into a hole
// between what is left of b on either side.
func (h *heap) vacate(b bref, lo, hi uint64) {
	h.removeFree(b)
	h.carve(b, lo, hi, h.addFree)
	h.addHole(h.coalesce(b, blockHole))
}

// releaseLocked gives back whole free chunks of both heaps — leaving out
// keep in the heap kh — the largest runs first and from their high end, so
// few calls give back much, until want bytes have gone or none are left.
// It returns what it gave back.
func (al *Allocator) releaseLocked(want uint64, kh *heap, keep span) (uint64, error) {
	takes, _ := takeLargest(al.distinct(), want, kh, keep, math.MaxUint64)
	var gave uint64
	for _, t := range takes {
		if err := t.h.decommit(t.b, t.lo, t.hi); err != nil {
			return gave, err
		}
		gave += t.hi - t.lo
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
	h.vacate(b, lo, hi)
	return errors.Wrap(err, "arena: allocator giving back free memory")
}

// Trim gives every wholly free chunk back to the device, wherever it lies.
func (al *Allocator) Trim() error {
	if al.unmade() {
		return unmade("Allocator.Trim", "NewAllocator")
	}
	return al.TrimTo(0)
}

// TrimTo gives wholly free chunks back while more than keep bytes are
// committed (as cuMemPoolTrimTo: until keep or fewer are, or nothing more
// can go). It never gives back memory behind live allocations.
func (al *Allocator) TrimTo(keep uint64) error {
	if al.unmade() {
		return unmade("Allocator.TrimTo", "NewAllocator")
	}
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
