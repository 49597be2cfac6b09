package arena

import (
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/ranges"
)

// A heap is one Sparse range of an allocator and the blocks that tile it.
// An allocator has two: one for small requests (at most half a chunk) and
// one for the rest, so that small allocations share chunks among
// themselves instead of pinning, one by one, chunks between large ones —
// the reason PyTorch keeps small blocks in segments of their own.
//
// Every byte of the range lies in one block, in address order:
//
//	used  a live allocation; committed throughout
//	free  committed throughout, not allocated (in the TLSF lists)
//	hole  not committed; starts and ends on chunk boundaries
//	lent  whole free chunks mapped into a stitched allocation
//
// Committed memory is physical chunks of any whole number of ChunkSize
// bytes (the range's slots): a commit gives an allocation's interior one
// chunk of its own (grow.go), so that a large allocation costs one driver
// create and map, not one per ChunkSize. Chunks go back, move and are lent
// whole: the whole chunks inside a free block, [wlo, whi), are what it can
// give.
//
// Invariants (checked by check): the blocks cover the range without gaps;
// no two free blocks touch, nor two holes; a hole is exactly uncommitted
// memory and every other block is committed; a block is in the free lists
// exactly when it is free, and in the hole list exactly when it is a hole;
// a free block's [wlo, whi) is the span of the chunks lying wholly inside
// it, and it is in the chunky index exactly when that span is not empty,
// and in the edge index exactly when a hole is beside it; every used block
// is indexed under its offset. The heap's owner holds the lock.
//
// No operation walks the heap: alloc and free are O(1) in the free lists
// and the offset index, and the indexes that growth, giving back and
// stitching search — the holes by address (a ranges.List, first-fit by
// size), the free blocks holding whole chunks by the bytes of those, the
// free blocks beside a hole by size (sizeList: TLSF's buckets) — are
// edited in O(1) or O(log n) as blocks change.
//
// The records stay off the garbage collector's pointer graph: blocks live
// in a slab and name each other by slot (bref), the lists are slots, and
// used blocks are found by offset in an index of flat arrays
// (offindex.go). An alloc or a free makes no Go allocation once the slab
// and the index have grown to the live set, and the collector never scans
// them, however many allocations are live.
type heap struct {
	s     *Sparse
	q, cs uint64
	base  uint64 // s.Base(): the range never moves

	slab
	head, tail bref
	free       tlsf
	freeBytes  uint64
	holes      ranges.List[uint64, bref] // the holes, by address
	chunky     sizeList                  // free blocks with whole chunks, by their bytes
	edges      sizeList                  // free blocks beside a hole, by size
	used       offIndex
	bins       bins // the bins small requests are served from (bins.go)
	// held is the allocator's live set and max its Max, which size the
	// chunks a commit lets allocations share (edgeChunk); the allocator's
	// lock guards held.
	held *uint64
	max  uint64
	// strandRoom says whether the allocator may strand n more chunks of
	// bytes in all (placeAt; nil: never).
	strandRoom func(n int, bytes uint64) bool
}

type blockState uint8

const (
	blockFree blockState = iota
	blockUsed
	blockHole
	blockLent
)

func (s blockState) String() string {
	return [...]string{"free", "used", "hole", "lent"}[s]
}

// block is [off, off+size) of a heap's range. Its links are slots of the
// heap's slab (0: none).
type block struct {
	off, size uint64
	req       uint64 // bytes asked for (used blocks)
	lent      uint64 // lent blocks: the stitch's offset + 1
	// wlo and whi bound the chunks lying wholly inside a free block (equal
	// when there are none).
	wlo, whi     uint64
	prev, next   bref       // address order
	fprev, fnext bref       // the free list
	links        [2][2]bref // the chunky and edge indexes: prev, next
	bin          uint32     // used blocks that are bins: the bin (bins.go)
	state        blockState
	listed       [2]bool // in the chunky, the edge index
}

func (b *block) end() uint64 { return b.off + b.size }

// bref names a block by its slot in a heap's slab; 0 names none.
type bref uint32

// A slab holds a heap's blocks in one slice; slots of dropped blocks are
// reused first. It holds no pointers, so the collector never scans it.
// make may move the slice: a *block from at is valid only until the next
// make (carve re-fetches after making).
type slab struct {
	blocks []block // slot 0 is never used
	spare  bref    // dropped slots, linked through next
}

// at is the block in slot r (not 0).
func (sl *slab) at(r bref) *block { return &sl.blocks[r] }

// make returns the slot of a new block [off, off+size), on no list.
func (sl *slab) make(off, size uint64) bref {
	r := sl.spare
	if r != 0 {
		sl.spare = sl.blocks[r].next
		sl.blocks[r] = block{off: off, size: size}
		return r
	}
	if len(sl.blocks) == 0 {
		sl.blocks = append(sl.blocks, block{}) // slot 0: no block
	}
	// A slot fits 32 bits: 2^32 blocks would take 224 GiB of records
	// before the first one overflowed.
	sl.blocks = append(sl.blocks, block{off: off, size: size})
	return bref(len(sl.blocks) - 1)
}

// drop gives slot r back for reuse.
func (sl *slab) drop(r bref) {
	sl.blocks[r] = block{next: sl.spare}
	sl.spare = r
}

func newHeap(s *Sparse, q uint64) *heap {
	h := &heap{s: s, q: q, cs: s.ChunkSize(), base: uint64(s.Base())}
	h.chunky = sizeList{index: chunkyIndex, unit: h.cs}
	h.edges = sizeList{index: edgeIndex, unit: q}
	hole := h.make(0, s.Max())
	h.head, h.tail = hole, hole
	h.addHole(hole)
	return h
}

// alignedStart is the first offset at or after off whose address is a
// multiple of align.
func (h *heap) alignedStart(off, align uint64) uint64 {
	return alignUp(h.base+off, align) - h.base
}

// A placement is where in a free block a request goes, and what it does
// to the whole free chunks there.
type placement struct {
	start  uint64
	pinned uint64 // bytes of whole free chunks the request touches
	split  bool   // it would cover a large chunk (over edgeChunk) in part
	pin    span   // the whole free chunks it touches
	// strand are the chunks over edgeChunk it covers in part without
	// splitting them (at most two: the first and the last it touches).
	strand  [2]span
	strands int
}

// better reports whether p is a better placement than q: one that splits
// no chunk, then one that pins fewer bytes of whole free chunks (chunks no
// live block holds yet, which could go back or move), then the lower.
func (p placement) better(q placement) bool {
	if p.split != q.split {
		return !p.split
	}
	if p.pinned != q.pinned {
		return p.pinned < q.pinned
	}
	return p.start < q.start
}

// placeAt describes the request [s, s+fp) in the free block b.
func (h *heap) placeAt(b *block, s, fp uint64) placement {
	p := placement{start: s}
	lo, hi := max(b.wlo, s), min(b.whi, s+fp)
	if lo >= hi {
		return p
	}
	first, last := h.s.chunksAt(lo, hi-1)
	p.pin, p.pinned = span{first.start, last.end}, last.end-first.start
	// A chunk larger than edgeChunk should lie in the request's
	// interior: one allocation covers it whole, or none (grow.go says
	// why). One the request covers in part is stranded — its free rest
	// is still served, but it cannot go back until it is wholly free
	// again — and the allocator lets a bounded amount be (strandRoom):
	// past that the request splits the chunk, giving it back and
	// committing its own.
	in := span{alignUp(s, h.cs), alignDown(s+fp, h.cs)}
	edge := h.edgeChunk()
	var bytes uint64
	if first.size() > edge && (first.start < in.start || first == last && first.end > in.end) {
		p.strand[p.strands], bytes = first, first.size()
		p.strands++
	}
	if last != first && last.size() > edge && last.end > in.end {
		p.strand[p.strands], bytes = last, bytes+last.size()
		p.strands++
	}
	if p.strands > 0 && (h.strandRoom == nil || !h.strandRoom(p.strands, bytes)) {
		p.split, p.strands = true, 0
	}
	return p
}

// startIn chooses where in the free block b (which holds fp bytes at an
// align-aligned start) a request goes, among b's low end, its high end, and
// the placements that line the request's interior up with the first or
// the last whole free chunk of b: the best by placement.better. A request
// that fits in the part of a chunk b shares with a live neighbour goes
// there; one that covers a freed allocation's chunk exactly goes back onto
// it.
func (h *heap) startIn(b *block, fp, align uint64) placement {
	lo := h.alignedStart(b.off, align)
	if b.wlo >= b.whi || lo+fp <= b.wlo {
		return placement{start: lo} // nothing to pin at the low end
	}
	best := h.placeAt(b, lo, fp)
	if best.pinned == 0 {
		return best
	}
	try := func(s uint64) {
		if s >= b.off && s+fp <= b.end() && s+fp > s && (h.base+s)%align == 0 {
			if p := h.placeAt(b, s, fp); p.better(best) {
				best = p
			}
		}
	}
	try(alignDown(h.base+b.end()-fp, align) - h.base)
	if !best.split && best.pinned == 0 {
		return best
	}
	first, last := h.s.chunksAt(b.wlo, b.whi-1)
	// The interior starts where the first chunk does, or ends where the
	// last one does: the request's head or tail lies before or after it.
	if fp >= first.size() {
		try(alignDown(h.base+first.start-(fp-first.size())%h.cs, align) - h.base)
		try(first.start)
	}
	if fp >= last.size() && last.end >= fp {
		try(alignDown(h.base+last.end-fp, align) - h.base)
	}
	return best
}

// place carves [start, start+fp) — inside the free block r — out of it as
// a used block, and returns its address.
func (h *heap) place(r bref, start, fp, req uint64) driver.Addr {
	h.removeFree(r)
	h.carve(r, start, start+fp, h.addFree)
	b := h.at(r)
	b.state, b.req = blockUsed, req
	h.used.put(b.off, r)
	return driver.Addr(h.base + b.off)
}

// usedAt returns the used block starting at p, or 0; a bin is no
// allocation's block (liveAt finds those in bins).
func (h *heap) usedAt(p driver.Addr) bref {
	if uint64(p) < h.base {
		return 0
	}
	if r := h.used.get(uint64(p) - h.base); r != 0 && h.at(r).bin == 0 {
		return r
	}
	return 0
}

// release frees the used block r, merging it with free neighbours, and
// returns the free block it is now part of.
func (h *heap) release(r bref) bref {
	b := h.at(r)
	b.req = 0
	h.used.del(b.off)
	m := h.coalesce(r, blockFree)
	h.addFree(m)
	return m
}

// carve shrinks r, which is on no list, to [lo, hi) inside it; what lay
// before and after goes to new blocks, listed by add.
func (h *heap) carve(r bref, lo, hi uint64, add func(bref)) {
	off, end := h.at(r).off, h.at(r).end()
	if lo > off {
		front := h.make(off, lo-off) // may move the slab: no *block held across
		h.linkAfter(front, h.at(r).prev)
		add(front)
	}
	if hi < end {
		back := h.make(hi, end-hi)
		h.linkAfter(back, r)
		add(back)
	}
	b := h.at(r)
	b.off, b.size = lo, hi-lo
}

// blockAt returns the block holding off, or 0 (a walk of the list: for
// error messages only).
func (h *heap) blockAt(off uint64) bref {
	for r := h.head; r != 0; r = h.at(r).next {
		if off < h.at(r).end() {
			return r
		}
	}
	return 0
}

// wholeChunks returns the span of the chunks lying wholly inside
// [off, end), all committed (empty when there are none).
func (h *heap) wholeChunks(off, end uint64) span {
	if alignUp(off, h.cs) >= alignDown(end, h.cs) {
		return span{} // no chunk boundary pair inside: no whole chunk
	}
	return h.s.wholeSpan(off, end)
}

// check verifies the heap's invariants; it takes the range's lock.
// It returns what the used blocks hold and were asked for, and how many
// blocks each stitch (by offset) has lent.
func (h *heap) check(fail func(format string, args ...any)) (held, allocated uint64, lent map[uint64]int) {
	lent = map[uint64]int{}
	holes, nused := 0, 0
	var at, free uint64
	var prev bref
	h.s.mu.Lock()
	for r := h.head; r != 0; r = h.at(r).next {
		b := h.at(r)
		if b.prev != prev {
			fail("arena: block at %#x has a wrong back link", b.off)
		}
		if b.off != at || b.size == 0 || b.size%h.q != 0 {
			fail("arena: block [%#x, +%d) where %#x was expected, size a positive multiple of %d", b.off, b.size, at, h.q)
		}
		gaps := h.s.holesLocked(b.off, b.end())
		if b.state == blockHole {
			if len(gaps) != 1 || gaps[0] != (span{b.off, b.end()}) || b.off%h.cs != 0 || b.size%h.cs != 0 {
				fail("arena: hole [%#x, %#x) is not whole uncommitted chunks", b.off, b.end())
			}
		} else if len(gaps) > 0 {
			fail("arena: %s block [%#x, %#x) is not committed at [%#x, %#x)", b.state, b.off, b.end(), gaps[0].start, gaps[0].end)
		}
		if prev != 0 && h.at(prev).state == b.state && (b.state == blockFree || b.state == blockHole) {
			fail("arena: %s blocks at %#x and %#x touch", b.state, h.at(prev).off, b.off)
		}
		switch b.state {
		case blockFree:
			free += b.size
			if w := h.s.wholeSpanLocked(b.off, b.end()); w != (span{b.wlo, b.whi}) && (w.size() > 0 || b.wlo < b.whi) {
				fail("arena: free block [%#x, %#x) records whole chunks [%#x, %#x), they are [%#x, %#x)", b.off, b.end(), b.wlo, b.whi, w.start, w.end)
			}
			if b.listed[chunkyIndex] != (b.wlo < b.whi) {
				fail("arena: free block at %#x with whole chunks [%#x, %#x) is listed %v in the chunky index", b.off, b.wlo, b.whi, b.listed[chunkyIndex])
			}
			if edge := h.besideHole(b); b.listed[edgeIndex] != edge {
				fail("arena: free block at %#x beside a hole %v is listed %v in the edge index", b.off, edge, b.listed[edgeIndex])
			}
		case blockHole:
			holes++
		case blockUsed:
			nused++
			allocated += b.req
			held += b.size
			if h.used.get(b.off) != r {
				fail("arena: used block at %#x is not indexed", b.off)
			}
		case blockLent:
			if b.lent == 0 || b.off%h.cs != 0 || b.size%h.cs != 0 {
				fail("arena: lent block at %#x belongs to no stitch, or is not whole chunks", b.off)
			}
			lent[b.lent-1]++
		}
		if b.state != blockUsed && b.bin != 0 {
			fail("arena: %s block at %#x is marked a bin", b.state, b.off)
		}
		if b.state != blockLent && b.lent != 0 {
			fail("arena: %s block at %#x is marked lent", b.state, b.off)
		}
		if b.state != blockFree && (b.listed != [2]bool{} || b.wlo != b.whi) {
			fail("arena: %s block at %#x is in an index of free blocks", b.state, b.off)
		}
		at, prev = b.end(), r
	}
	h.s.mu.Unlock()
	if h.tail != prev {
		fail("arena: tail is not the last block")
	}
	if at != h.s.Max() {
		fail("arena: blocks end at %#x, the range is %#x long", at, h.s.Max())
	}
	h.used.check(fail)
	if nused != h.used.len() {
		fail("arena: %d used blocks, %d indexed", nused, h.used.len())
	}
	listed := uint64(0)
	for fl := range h.free.heads {
		for sl := range h.free.heads[fl] {
			for r := h.free.heads[fl][sl]; r != 0; r = h.at(r).fnext {
				b := h.at(r)
				if b.state != blockFree {
					fail("arena: block at %#x is listed free but is %s", b.off, b.state)
				}
				if f, s := bucket(b.size / h.q); f != fl || s != sl {
					fail("arena: free block at %#x is in the wrong list", b.off)
				}
				listed += b.size
			}
		}
	}
	if listed != free || free != h.freeBytes {
		fail("arena: free blocks hold %d bytes, the lists %d, the count %d", free, listed, h.freeBytes)
	}
	if err := h.holes.Check(); err != nil {
		fail("arena: the hole list: %v", err)
	}
	for _, it := range h.holes.All() {
		if b := h.at(it.Val); b.state != blockHole || b.off != it.Start || b.end() != it.End {
			fail("arena: the hole list has [%#x, %#x) for the %s block [%#x, %#x)", it.Start, it.End, b.state, b.off, b.end())
		}
	}
	if h.holes.Len() != holes {
		fail("arena: %d holes, %d in the hole list", holes, h.holes.Len())
	}
	h.chunky.check(&h.slab, fail)
	h.edges.check(&h.slab, fail)
	return held, allocated, lent
}

// Block list, free-list and hole-list helpers.

// addFree lists r as free: in the free lists, and in the chunky and edge
// indexes when it holds whole chunks or lies beside a hole.
func (h *heap) addFree(r bref) {
	b := h.at(r)
	b.state = blockFree
	h.free.insert(&h.slab, r, h.q)
	h.freeBytes += b.size
	w := h.wholeChunks(b.off, b.end())
	b = h.at(r)
	b.wlo, b.whi = w.start, w.end
	if w.start < w.end {
		h.chunky.insert(&h.slab, r)
	}
	h.refreshEdge(r)
}

// removeFree takes r off every list of free blocks.
func (h *heap) removeFree(r bref) {
	h.free.remove(&h.slab, r, h.q)
	h.freeBytes -= h.at(r).size
	if h.at(r).listed[chunkyIndex] {
		h.chunky.remove(&h.slab, r)
	}
	if h.at(r).listed[edgeIndex] {
		h.edges.remove(&h.slab, r)
	}
	b := h.at(r)
	b.wlo, b.whi = 0, 0
}

// refreshEdge puts the free block r in the edge index, or takes it out,
// as a hole lies beside it or not.
func (h *heap) refreshEdge(r bref) {
	b := h.at(r)
	edge := h.besideHole(b)
	switch {
	case edge && !b.listed[edgeIndex]:
		h.edges.insert(&h.slab, r)
	case !edge && b.listed[edgeIndex]:
		h.edges.remove(&h.slab, r)
	}
}

// besideHole reports whether a hole lies beside b.
func (h *heap) besideHole(b *block) bool {
	return b.prev != 0 && h.at(b.prev).state == blockHole || b.next != 0 && h.at(b.next).state == blockHole
}

// addHole lists r as a hole, and the free blocks beside it as edges.
func (h *heap) addHole(r bref) {
	b := h.at(r)
	b.state = blockHole
	b.fprev, b.fnext = 0, 0
	h.holes.Insert(b.off, b.end(), r) // the blocks tile the range: it fits (check says so)
	for _, n := range [2]bref{b.prev, b.next} {
		if n != 0 && h.at(n).state == blockFree {
			h.refreshEdge(n)
		}
	}
}

// removeHole takes r off the hole list. The free blocks beside it are
// merged with it or listed again by the caller (commit, coalesce).
func (h *heap) removeHole(r bref) {
	off := h.at(r).off
	if it := h.holes.Get(off); it != nil && it.Val == r {
		h.holes.DeleteStart(off)
	} // else the books are broken already: check reports the hole list
}

// coalesce merges r — newly free, or a new hole: state says which — with
// its neighbours in that state (taking them off their list, and dropping
// the slots merged away) and returns the merged block, not yet listed.
func (h *heap) coalesce(r bref, state blockState) bref {
	remove := h.removeFree
	if state == blockHole {
		remove = h.removeHole
	}
	if p := h.at(r).prev; p != 0 && h.at(p).state == state {
		remove(p)
		h.at(p).size += h.at(r).size
		h.unlink(r)
		h.drop(r)
		r = p
	}
	if n := h.at(r).next; n != 0 && h.at(n).state == state {
		remove(n)
		h.at(r).size += h.at(n).size
		h.unlink(n)
		h.drop(n)
	}
	return r
}

// linkAfter puts r after prev in address order (first when prev is 0).
func (h *heap) linkAfter(r, prev bref) {
	b := h.at(r)
	b.prev = prev
	if prev == 0 {
		b.next, h.head = h.head, r
	} else {
		p := h.at(prev)
		b.next, p.next = p.next, r
	}
	if b.next != 0 {
		h.at(b.next).prev = r
	} else {
		h.tail = r
	}
}

func (h *heap) unlink(r bref) {
	b := h.at(r)
	if b.prev != 0 {
		h.at(b.prev).next = b.next
	} else {
		h.head = b.next
	}
	if b.next != 0 {
		h.at(b.next).prev = b.prev
	} else {
		h.tail = b.prev
	}
	b.prev, b.next = 0, 0
}

// notAllocated explains why off, in the heap's range, is no live
// allocation's start, for the call op, what naming it with its address.
func (h *heap) notAllocated(op, what string, off uint64) error {
	r := h.blockAt(off)
	var b *block
	if r != 0 {
		b = h.at(r)
	}
	switch {
	case b == nil || b.state == blockFree || b.state == blockHole:
		return freedError(op, what+": that memory is free")
	case b.state == blockLent:
		return errors.Wrapf(driver.ErrNotAllocated, "%s: that memory is lent to a stitched allocation; %s that one", what, op)
	}
	return errors.Wrapf(driver.ErrNotAllocated, "%s: it points inside the allocation at %s; %s takes its start",
		what, driver.Addr(h.base+b.off), op)
}
