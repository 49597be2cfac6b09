package arena

import (
	"math/bits"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// Small requests of the default policy — footprints of 256 B to 4 KiB —
// are served from bins: 64 KiB used blocks of the small heap, each cut
// into slots of one size class (a multiple of 256 B, so no byte is lost
// to rounding beyond the policy's own). It is the layout of PyTorch's
// small pool and of the slab allocators (jemalloc's slabs, mimalloc's
// pages): a bin's record is one cache line — which slots are used, how
// many, what they were asked for in all — and the bytes each live slot's
// request falls short of its class sit in one flat array, a byte a slot.
// An alloc that a bin serves touches its class's current bin (a line the
// last alloc of the class touched) and one pad byte; a free finds its
// bin in an index of bin starts (one entry a 64 KiB of small
// allocations, small enough for the caches to hold at a million live)
// and touches the bin's line and one pad byte. Neither walks, allocates
// or touches the heap's block records; only a bin's making and its
// emptying do, as one allocation and one free of the heap.
//
// A bin is made when its class has none with a free slot, and given back
// to the heap the moment its last slot is freed, so a wholly free bin
// never holds memory: Trim, the budget and the out-of-memory retry see
// what they see without bins. Bins with free slots are kept per class on
// a list, the one freed into most recently first.
//
// Invariants (checked by check): every bin is a used block of the heap of
// binBytes whose bin mark names it, indexed under its start's 64 KiB
// window, and no other used block is marked; its used count is the
// number of its used slots, none past its slot count, and its request
// sum is its used slots' class size less their pads; it is on its
// class's list exactly when it has a free slot; the live count is the
// sum of the used counts.
type bins struct {
	on    bool
	slabs []binSlab // slot 0 is never used
	spare uint32    // dropped slots, linked through next
	n     int       // bins
	live  int       // used slots in all
	pads  []uint8   // binSlots per bin: its slot size less the request
	index offIndex  // bin start >> binShift → bin
	heads [binClasses + 1]uint32
}

// binSlab is one bin's record: one cache line.
type binSlab struct {
	off        uint64           // the bin's offset in the heap's range
	used       [binWords]uint64 // used slots
	prev, next uint32           // its class's list of bins with free slots
	blk        bref             // its block in the heap
	reqs       uint32           // the requests of its used slots, in all
	nused      uint16
	nslots     uint16
	class      uint8 // slot size in binUnits
	listed     bool
}

const (
	binShift   = 16
	binBytes   = 1 << binShift // a bin's size, and the window it is indexed by
	binUnit    = 256           // slot sizes are multiples of it
	binClasses = 16            // slot sizes 256 B to 4 KiB
	binMaxSlot = binClasses * binUnit
	binSlots   = binBytes / binUnit // the most slots of a bin
	binWords   = binSlots / 64
)

// binsFor says whether a heap of quantum q and chunks of cs bytes serves
// small requests from bins: the default policy's quantum (a pad fits a
// byte), and chunks of at least four bins, so that a bin never pins a
// chunk on its own.
func binsFor(q, cs uint64, shareable bool) bool {
	return q == binUnit && cs >= 4*binBytes && !shareable
}

// binClass is the class a request of footprint fp aligned to align is
// served in, or 0 when no bin serves it.
func (bs *bins) class(fp, align uint64) int {
	if !bs.on || fp > binMaxSlot || align > binUnit {
		return 0
	}
	return int(fp / binUnit)
}

// find returns the bin holding off, or 0.
func (bs *bins) find(off uint64) uint32 {
	if bs.n == 0 {
		return 0
	}
	w := off >> binShift
	if id := uint32(bs.index.get(w)); id != 0 && off >= bs.slabs[id].off {
		return id
	}
	if w > 0 {
		if id := uint32(bs.index.get(w - 1)); id != 0 && off < bs.slabs[id].off+binBytes {
			return id
		}
	}
	return 0
}

// slotAt returns the used slot of bin id starting at off, or -1.
func (bs *bins) slotAt(id uint32, off uint64) int {
	s := &bs.slabs[id]
	sz := uint64(s.class) * binUnit
	rel := off - s.off
	if rel%sz != 0 || rel/sz >= uint64(s.nslots) {
		return -1
	}
	i := int(rel / sz)
	if s.used[i/64]&(1<<(i%64)) == 0 {
		return -1
	}
	return i
}

// req is what the used slot i of bin id was asked for.
func (bs *bins) req(id uint32, i int) uint64 {
	return uint64(bs.slabs[id].class)*binUnit - uint64(bs.pads[int(id)*binSlots+i])
}

// liveAt returns the offset and request of the live allocation a bin
// holds at off, if one starts there.
func (bs *bins) liveAt(off uint64) (uint64, uint64, bool) {
	id := bs.find(off)
	if id == 0 {
		return 0, 0, false
	}
	i := bs.slotAt(id, off)
	if i < 0 {
		return 0, 0, false
	}
	return off, bs.req(id, i), true
}

// take hands out a free slot of bin id for a request of req bytes and
// returns its offset.
func (bs *bins) take(id uint32, req uint64) uint64 {
	s := &bs.slabs[id]
	i := 0
	for w := range s.used {
		if m := ^s.used[w]; m != 0 {
			i = w*64 + bits.TrailingZeros64(m)
			break
		}
	}
	sz := uint64(s.class) * binUnit
	s.used[i/64] |= 1 << (i % 64)
	s.nused++
	s.reqs += uint32(req)
	bs.pads[int(id)*binSlots+i] = uint8(sz - req)
	bs.live++
	if s.nused == s.nslots {
		bs.unlist(id)
	}
	return s.off + uint64(i)*sz
}

// put frees the used slot i of bin id and returns its request; the
// caller gives the bin back when none of its slots is used.
func (bs *bins) put(id uint32, i int) uint64 {
	req := bs.req(id, i)
	s := &bs.slabs[id]
	s.used[i/64] &^= 1 << (i % 64)
	s.nused--
	s.reqs -= uint32(req)
	bs.live--
	if !s.listed {
		bs.list(id)
	}
	return req
}

// list puts bin id first on its class's list.
func (bs *bins) list(id uint32) {
	s := &bs.slabs[id]
	h := &bs.heads[s.class]
	s.prev, s.next, s.listed = 0, *h, true
	if *h != 0 {
		bs.slabs[*h].prev = id
	}
	*h = id
}

// unlist takes bin id off its class's list.
func (bs *bins) unlist(id uint32) {
	s := &bs.slabs[id]
	if s.prev != 0 {
		bs.slabs[s.prev].next = s.next
	} else {
		bs.heads[s.class] = s.next
	}
	if s.next != 0 {
		bs.slabs[s.next].prev = s.prev
	}
	s.prev, s.next, s.listed = 0, 0, false
}

// add records a new bin of class c over the block blk at off, with no
// slot used, and lists it.
func (bs *bins) add(off uint64, blk bref, c int) uint32 {
	id := bs.spare
	if id != 0 {
		bs.spare = bs.slabs[id].next
	} else {
		if len(bs.slabs) == 0 {
			bs.slabs = append(bs.slabs, binSlab{})
		}
		bs.slabs = append(bs.slabs, binSlab{})
		id = uint32(len(bs.slabs) - 1)
		for len(bs.pads) < len(bs.slabs)*binSlots {
			bs.pads = append(bs.pads, make([]uint8, binSlots)...)
		}
	}
	bs.slabs[id] = binSlab{off: off, blk: blk, class: uint8(c), nslots: uint16(binBytes / (uint64(c) * binUnit))}
	bs.index.put(off>>binShift, bref(id))
	bs.n++
	bs.list(id)
	return id
}

// drop forgets the empty bin id and returns its block.
func (bs *bins) drop(id uint32) bref {
	bs.unlist(id)
	s := &bs.slabs[id]
	blk := s.blk
	bs.index.del(s.off >> binShift)
	bs.slabs[id] = binSlab{next: bs.spare}
	bs.spare = id
	bs.n--
	return blk
}

// binAllocLocked serves a request of req bytes in class c from a bin of
// the heap h, making one if the class has none with a free slot.
func (al *Allocator) binAllocLocked(h *heap, c int, req uint64) (driver.Addr, error) {
	bs := &h.bins
	id := bs.heads[c]
	if id == 0 {
		var err error
		if id, err = al.newBinLocked(h, c); err != nil {
			return 0, err
		}
	}
	return driver.Addr(h.base + bs.take(id, req)), nil
}

// newBinLocked makes a bin of class c: a used block of binBytes placed as
// any request of that size would be.
func (al *Allocator) newBinLocked(h *heap, c int) (uint32, error) {
	p, err := al.placeLocked(h, binBytes, al.q, 0)
	if err != nil {
		return 0, errors.Wrapf(err, "a bin of %s slots", units.Bytes(uint64(c)*binUnit))
	}
	off := uint64(p) - h.base
	r := h.used.get(off)
	if uint64(p) < h.base || r == 0 {
		return 0, errors.AssertionFailedf("arena: a bin's block at %s is not a used block of the small heap", p)
	}
	id := h.bins.add(off, r, c)
	h.at(r).bin = id
	return id, nil
}

// binFreeLocked frees the live slot at off of bin id, if one starts
// there, giving the bin back to the heap once it is empty; ok is false
// (and nothing changes) otherwise.
func (al *Allocator) binFreeLocked(h *heap, id uint32, off uint64) bool {
	bs := &h.bins
	i := bs.slotAt(id, off)
	if i < 0 {
		return false
	}
	al.stats.Allocated -= bs.put(id, i)
	if bs.slabs[id].nused == 0 {
		r := bs.drop(id)
		h.at(r).bin = 0
		al.held -= binBytes
		al.unstrand(h, h.release(r))
	}
	return true
}

// notAllocated explains why off, inside bin id, is no live allocation's
// start, for the call op, what naming it with its address.
func (bs *bins) notAllocated(base uint64, op, what string, id uint32, off uint64) error {
	s := &bs.slabs[id]
	sz := uint64(s.class) * binUnit
	start := s.off + (off-s.off)/sz*sz
	if start == off || bs.slotAt(id, start) < 0 {
		return freedError(op, what+": that memory is free")
	}
	return errors.Wrapf(driver.ErrNotAllocated, "%s: it points inside the allocation at %s; %s takes its start",
		what, driver.Addr(base+start), op)
}

// check verifies the invariants in the type's doc and returns what the
// live slots were asked for.
func (bs *bins) check(h *heap, fail func(format string, args ...any)) (allocated uint64) {
	n, live, marked := 0, 0, 0
	listed := map[uint32]bool{}
	for c := 1; c <= binClasses; c++ {
		prev := uint32(0)
		for id := bs.heads[c]; id != 0; id = bs.slabs[id].next {
			s := &bs.slabs[id]
			if listed[id] || !s.listed || s.prev != prev || int(s.class) != c {
				fail("arena: bin %d on the list of class %d is linked wrong, twice, or of class %d", id, c, s.class)
				break
			}
			listed[id] = true
			prev = id
		}
	}
	h.used.all(func(off uint64, r bref) {
		if h.at(r).bin != 0 {
			marked++
		}
	})
	for id := 1; id < len(bs.slabs); id++ {
		s := &bs.slabs[id]
		if s.nslots == 0 {
			continue // a dropped slot
		}
		n++
		sz := uint64(s.class) * binUnit
		if s.class == 0 || s.class > binClasses || uint64(s.nslots) != binBytes/sz {
			fail("arena: bin %d has class %d and %d slots", id, s.class, s.nslots)
			continue
		}
		if b := h.at(s.blk); h.used.get(s.off) != s.blk || b.state != blockUsed || b.off != s.off || b.size != binBytes || b.bin != uint32(id) {
			fail("arena: bin %d at %#x is not its used block of %d bytes", id, s.off, binBytes)
		}
		if got := uint32(bs.index.get(s.off >> binShift)); got != uint32(id) {
			fail("arena: bin %d at %#x is indexed as bin %d", id, s.off, got)
		}
		used, reqs := 0, uint64(0)
		for i := range binSlots {
			if s.used[i/64]&(1<<(i%64)) == 0 {
				continue
			}
			if i >= int(s.nslots) {
				fail("arena: bin %d uses slot %d of %d", id, i, s.nslots)
				continue
			}
			used++
			reqs += bs.req(uint32(id), i)
		}
		if used != int(s.nused) || reqs != uint64(s.reqs) || used == 0 {
			fail("arena: bin %d uses %d slots for %d bytes, counts %d for %d", id, used, reqs, s.nused, s.reqs)
		}
		if listed[uint32(id)] != (used < int(s.nslots)) {
			fail("arena: bin %d with %d of %d slots used is listed %v", id, used, s.nslots, listed[uint32(id)])
		}
		live += used
		allocated += reqs
	}
	if n != bs.n || live != bs.live || marked != n || bs.index.len() != n {
		fail("arena: %d bins of %d live slots, %d blocks marked, %d indexed; counted %d of %d", n, live, marked, bs.index.len(), bs.n, bs.live)
	}
	bs.index.check(fail)
	return allocated
}

// liveAt returns the offset and request of the live allocation starting
// at p in the heap, a bin's slot or a used block of its own.
func (h *heap) liveAt(p driver.Addr) (off, req uint64, ok bool) {
	if uint64(p) < h.base {
		return 0, 0, false
	}
	off = uint64(p) - h.base
	if id := h.bins.find(off); id != 0 {
		return h.bins.liveAt(off)
	}
	if r := h.usedAt(p); r != 0 {
		return off, h.at(r).req, true
	}
	return 0, 0, false
}

// allLive calls fn with the offset of every live allocation in the heap,
// in no particular order; fn must not change the heap. (A walk: for
// reports and tests.)
func (h *heap) allLive(fn func(off uint64)) {
	bs := &h.bins
	h.used.all(func(off uint64, r bref) {
		id := h.at(r).bin
		if id == 0 {
			fn(off)
			return
		}
		s := &bs.slabs[id]
		sz := uint64(s.class) * binUnit
		for i := range int(s.nslots) {
			if s.used[i/64]&(1<<(i%64)) != 0 {
				fn(s.off + uint64(i)*sz)
			}
		}
	})
}
