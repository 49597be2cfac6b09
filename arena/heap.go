package arena

import (
	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/driver"
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
// Invariants (checked by check): the blocks cover the range without gaps;
// no two free blocks touch, nor two holes; a hole is exactly uncommitted
// memory and every other block is committed; a block is in the free lists
// exactly when it is free and in the hole list exactly when it is a hole;
// every used block is indexed under its offset. The heap's owner holds the
// lock.
type heap struct {
	s     *Sparse
	q, cs uint64

	head, tail *block
	free       tlsf
	freeBytes  uint64
	holes      *block // linked through fprev/fnext
	used       map[uint64]*block
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

// block is [off, off+size) of a heap's range.
type block struct {
	off, size    uint64
	state        blockState
	req          uint64 // bytes asked for (used blocks)
	prev, next   *block // address order
	fprev, fnext *block // free list, or hole list
	lentTo       *stitched
}

func (b *block) end() uint64 { return b.off + b.size }

func newHeap(s *Sparse, q uint64) *heap {
	h := &heap{s: s, q: q, cs: s.ChunkSize(), used: map[uint64]*block{}}
	hole := &block{off: 0, size: s.Max()}
	h.head, h.tail = hole, hole
	h.addHole(hole)
	return h
}

// alignedStart is the first offset at or after off whose address is a
// multiple of align.
func (h *heap) alignedStart(off, align uint64) uint64 {
	base := uint64(h.s.Base())
	return alignUp(base+off, align) - base
}

// startIn chooses where in the free block b (which holds fp bytes at an
// align-aligned start) a request goes: at b's low end or its high end,
// whichever touches fewer of the chunks lying wholly inside b — chunks no
// live block pins yet, which could go back to the device. A request that
// fits in the part of a chunk b shares with a live neighbour goes there.
// Ties go to the low end.
func (h *heap) startIn(b *block, fp, align uint64) uint64 {
	lo := h.alignedStart(b.off, align)
	base := uint64(h.s.Base())
	hi := alignDown(base+b.end()-fp, align) - base
	if hi <= lo || hi+fp > b.end() {
		return lo
	}
	if h.pins(b, hi, fp) < h.pins(b, lo, fp) {
		return hi
	}
	return lo
}

// pins counts the chunks lying wholly inside b that [s, s+fp) touches.
func (h *heap) pins(b *block, s, fp uint64) uint64 {
	lo, hi := max(alignUp(b.off, h.cs), alignDown(s, h.cs)), min(alignDown(b.end(), h.cs), alignUp(s+fp, h.cs))
	if lo >= hi {
		return 0
	}
	return (hi - lo) / h.cs
}

// place carves [start, start+fp) — inside the free block b — out of b as
// a used block, and returns its address.
func (h *heap) place(b *block, start, fp, req uint64) driver.Addr {
	h.removeFree(b)
	h.carve(b, start, start+fp, h.addFree)
	b.state, b.req = blockUsed, req
	h.used[b.off] = b
	return h.s.Base() + driver.Addr(b.off)
}

// usedAt returns the used block starting at p, or nil.
func (h *heap) usedAt(p driver.Addr) *block {
	base := h.s.Base()
	if p < base {
		return nil
	}
	return h.used[uint64(p-base)]
}

// release frees the used block b, merging it with free neighbours.
func (h *heap) release(b *block) {
	b.req = 0
	delete(h.used, b.off)
	h.addFree(h.coalesce(b, blockFree))
}

// carve shrinks b, which is on no list, to [lo, hi) inside it; what lay
// before and after goes to new blocks, listed by add.
func (h *heap) carve(b *block, lo, hi uint64, add func(*block)) {
	if lo > b.off {
		front := &block{off: b.off, size: lo - b.off}
		h.linkBefore(front, b)
		add(front)
	}
	if hi < b.end() {
		back := &block{off: hi, size: b.end() - hi}
		h.linkAfter(back, b)
		add(back)
	}
	b.off, b.size = lo, hi-lo
}

// blockAt returns the block holding off (a walk of the list: for error
// messages only).
func (h *heap) blockAt(off uint64) *block {
	for b := h.head; b != nil; b = b.next {
		if off < b.end() {
			return b
		}
	}
	return nil
}

// check verifies the heap's invariants; it takes the range's lock.
// It returns what the used blocks hold and were asked for, and how many
// blocks each stitch has lent.
func (h *heap) check(fail func(format string, args ...any)) (held, allocated uint64, lent map[*stitched]int) {
	lent = map[*stitched]int{}
	holes, nused := 0, 0
	var at, free uint64
	var prev *block
	h.s.mu.Lock()
	for b := h.head; b != nil; b = b.next {
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
		if prev != nil && prev.state == b.state && (b.state == blockFree || b.state == blockHole) {
			fail("arena: %s blocks at %#x and %#x touch", b.state, prev.off, b.off)
		}
		switch b.state {
		case blockFree:
			free += b.size
		case blockHole:
			holes++
		case blockUsed:
			nused++
			allocated += b.req
			held += b.size
			if h.used[b.off] != b {
				fail("arena: used block at %#x is not indexed", b.off)
			}
		case blockLent:
			if b.lentTo == nil || b.off%h.cs != 0 || b.size%h.cs != 0 {
				fail("arena: lent block at %#x belongs to no stitch, or is not whole chunks", b.off)
			}
			lent[b.lentTo]++
		}
		at, prev = b.end(), b
	}
	h.s.mu.Unlock()
	if h.tail != prev {
		fail("arena: tail is not the last block")
	}
	if at != h.s.Max() {
		fail("arena: blocks end at %#x, the range is %#x long", at, h.s.Max())
	}
	if nused != len(h.used) {
		fail("arena: %d used blocks, %d indexed", nused, len(h.used))
	}
	listed := uint64(0)
	for fl := range h.free.heads {
		for sl := range h.free.heads[fl] {
			for b := h.free.heads[fl][sl]; b != nil; b = b.fnext {
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
	inList := 0
	for b := h.holes; b != nil; b = b.fnext {
		if b.state != blockHole {
			fail("arena: block at %#x is in the hole list but is %s", b.off, b.state)
		}
		inList++
	}
	if inList != holes {
		fail("arena: %d holes, %d in the hole list", holes, inList)
	}
	return held, allocated, lent
}

// Block list, free-list and hole-list helpers.

func (h *heap) addFree(b *block) {
	b.state = blockFree
	h.free.insert(b, h.q)
	h.freeBytes += b.size
}

func (h *heap) removeFree(b *block) {
	h.free.remove(b, h.q)
	h.freeBytes -= b.size
}

func (h *heap) addHole(b *block) {
	b.state = blockHole
	b.fprev, b.fnext = nil, h.holes
	if h.holes != nil {
		h.holes.fprev = b
	}
	h.holes = b
}

func (h *heap) removeHole(b *block) {
	if b.fprev != nil {
		b.fprev.fnext = b.fnext
	} else {
		h.holes = b.fnext
	}
	if b.fnext != nil {
		b.fnext.fprev = b.fprev
	}
	b.fprev, b.fnext = nil, nil
}

// coalesce merges b — newly free, or a new hole: state says which — with
// its neighbours in that state (taking them off their list) and returns
// the merged block, not yet listed.
func (h *heap) coalesce(b *block, state blockState) *block {
	remove := h.removeFree
	if state == blockHole {
		remove = h.removeHole
	}
	if p := b.prev; p != nil && p.state == state {
		remove(p)
		p.size += b.size
		h.unlink(b)
		b = p
	}
	if n := b.next; n != nil && n.state == state {
		remove(n)
		b.size += n.size
		h.unlink(n)
	}
	return b
}

func (h *heap) linkAfter(b, prev *block) {
	b.prev = prev
	if prev == nil {
		b.next, h.head = h.head, b
	} else {
		b.next, prev.next = prev.next, b
	}
	if b.next != nil {
		b.next.prev = b
	} else {
		h.tail = b
	}
}

func (h *heap) linkBefore(b, next *block) { h.linkAfter(b, next.prev) }

func (h *heap) unlink(b *block) {
	if b.prev != nil {
		b.prev.next = b.next
	} else {
		h.head = b.next
	}
	if b.next != nil {
		b.next.prev = b.prev
	} else {
		h.tail = b.prev
	}
	b.prev, b.next = nil, nil
}

// notAllocated explains why off, in the heap's range, is no live
// allocation's start.
func (h *heap) notAllocated(what string, off uint64) error {
	b := h.blockAt(off)
	switch {
	case b == nil || b.state == blockFree || b.state == blockHole:
		return errors.WithHint(errors.Wrapf(driver.ErrNotAllocated, "%s: that memory is free (freed twice?)", what),
			"free each allocation once")
	case b.state == blockLent:
		return errors.Wrapf(driver.ErrNotAllocated, "%s: that memory is lent to a stitched allocation; free that one", what)
	}
	return errors.Wrapf(driver.ErrNotAllocated, "%s: it points inside the allocation at %s; free takes its start",
		what, h.s.Base()+driver.Addr(b.off))
}
