// Package cachingmodel is a model of PyTorch's CUDA caching allocator as
// it runs by default (c10/cuda/CUDACachingAllocator.cpp: one stream, no
// expandable segments, no max_split_size, no rounding to powers of two):
// the baseline that allocator workloads without PyTorch's own segment
// events are measured against, run on the same events in the same
// process. It owns only its books (segments, their blocks, the free
// pools); it allocates no device memory and calls no driver.
//
// Its rules, those of the source:
//
//   - a request is rounded up to a multiple of 512 B (at least 512 B);
//     one of at most 1 MiB comes from the small pool, any other from the
//     large one;
//   - the smallest free block of the pool that holds it is taken (ties:
//     the oldest segment, then the lowest offset), and split when what
//     is left is at least 512 B (small pool) or more than 1 MiB (large
//     pool): a remainder too small to split stays with the allocation;
//   - with no such block a segment is allocated (cudaMalloc): 2 MiB for
//     the small pool, 20 MiB for a large request under 10 MiB, else the
//     request rounded up to 2 MiB;
//   - a freed block merges with the free blocks beside it in its segment;
//     segments are never given back but when an allocation finds the
//     device full: every segment with no live block is released
//     (cudaFree) and the allocation tried once more (its OOM path).
//
// Reserved memory is the segments' sum, what PyTorch's memory snapshots
// call reserved. Invariants, which Check verifies: each segment's blocks
// tile it in address order with no two free blocks adjacent; each pool
// holds exactly its segments' free blocks, sorted; reserved is the sum of
// the segments, never above the capacity. A refused call changes nothing
// but what the OOM path releases, which it reports.
//
// Cost: a pool is an ordered tree (pool.go), so an allocation or a free
// costs the logarithm of the free blocks, as PyTorch's std::set does; the
// OOM path walks the pools, as PyTorch's release of cached blocks does.
package cachingmodel

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/vmarena/vmarena/internal/errors"
	"github.com/vmarena/vmarena/internal/units"
)

// The allocator's constants (CUDACachingAllocator.cpp's kMinBlockSize,
// kSmallSize, kSmallBuffer, kLargeBuffer, kMinLargeAlloc, kRoundLarge).
const (
	MinBlock    = 512
	SmallSize   = units.MiB
	SmallBuffer = 2 * units.MiB
	LargeBuffer = 20 * units.MiB
	MinLarge    = 10 * units.MiB
	RoundLarge  = 2 * units.MiB
)

var (
	// ErrOutOfMemory: the device cannot hold the request even after the
	// segments with nothing live were released.
	ErrOutOfMemory = errors.New("cachingmodel: out of memory")
	// ErrInvalid: a request of 0 bytes, an id already live, or a free of
	// an id not live.
	ErrInvalid = errors.New("cachingmodel: invalid request")
)

// Segment is a segment made (cudaMalloc) or, when Released, given back
// (cudaFree). Addr is the model's own: segments are placed one after
// another in a space of their own, never reused, aligned to 2 MiB.
type Segment struct {
	Released   bool
	Addr, Size uint64
}

// Model is the allocator's books for one device of a capacity. The zero
// Model is not usable: New makes one. Not safe for concurrent use.
type Model struct {
	capacity       uint64
	reserved, peak uint64
	next           uint64 // the next segment's address
	segs           int    // segments made, for their order
	small, large   pool
	live           map[int64]*block
	// Mallocs and Releases count segments made and given back, OOMs the
	// allocations that found the device full (served after the release
	// or not).
	Mallocs, Releases, OOMs int
}

// block is a block of a segment: free or an allocation's.
type block struct {
	seg        *segment
	off, size  uint64
	free       bool
	prev, next *block
}

type segment struct {
	id         int
	addr, size uint64
	small      bool
}

// New returns an empty model of a device of capacity bytes.
func New(capacity uint64) *Model {
	return &Model{capacity: capacity, live: map[int64]*block{}}
}

// Reserved is the bytes the segments hold now; Peak the most they held.
func (m *Model) Reserved() uint64 { return m.reserved }

// Peak is the most bytes the segments held at once.
func (m *Model) Peak() uint64 { return m.peak }

// Live counts the allocations live.
func (m *Model) Live() int { return len(m.live) }

// Rounded is the size a request of size bytes takes: a multiple of
// MinBlock, at least MinBlock (0 for a size that cannot be rounded).
func Rounded(size uint64) uint64 {
	if size > ^uint64(0)-MinBlock {
		return 0
	}
	return max(MinBlock, (size+MinBlock-1)/MinBlock*MinBlock)
}

// SegmentSize is the size of the segment a request of size bytes, when
// no free block holds it, makes (0 for a size that cannot be rounded).
func SegmentSize(size uint64) uint64 {
	size = Rounded(size)
	switch {
	case size == 0:
		return 0
	case size <= SmallSize:
		return SmallBuffer
	case size < MinLarge:
		return LargeBuffer
	case size > ^uint64(0)-RoundLarge:
		return 0
	}
	return (size + RoundLarge - 1) / RoundLarge * RoundLarge
}

// The pages of PyTorch's expandable segments: the small pool's segments
// map pages of SmallBuffer, the large pool's of LargeBuffer.
//
// ExpandablePages is how many pages an expandable segment maps (or
// unmaps) for size bytes of segment: pages of SmallBuffer when size is at
// most SmallBuffer, else of LargeBuffer, each its own cuMemCreate and
// cuMemMap (cuMemUnmap and cuMemRelease going back). It is how a
// segment's driver calls are priced here, a cudaMalloc segment's
// included: as expandable segments would make them.
func ExpandablePages(size uint64) uint64 {
	page := uint64(LargeBuffer)
	if size <= SmallBuffer {
		page = SmallBuffer
	}
	return size/page + min(1, size%page) // ceil, without overflow
}

func less(a, b *block) int {
	return cmp.Or(cmp.Compare(a.size, b.size), cmp.Compare(a.seg.id, b.seg.id), cmp.Compare(a.off, b.off))
}

func (m *Model) pool(small bool) *pool {
	if small {
		return &m.small
	}
	return &m.large
}

func (m *Model) insert(b *block) { m.pool(b.seg.small).insert(b) }

func (m *Model) remove(b *block) {
	if !m.pool(b.seg.small).remove(b) {
		panic(errors.AssertionFailedf("cachingmodel: a free block not in its pool"))
	}
}

// Alloc serves request id of size bytes, appending to segs the segments
// it released (the OOM path) and made, in that order, and returning it.
// A size of 0 or an id already live is ErrInvalid and changes nothing;
// ErrOutOfMemory returns the segments released before it gave up.
func (m *Model) Alloc(id int64, size uint64, segs []Segment) ([]Segment, error) {
	if _, ok := m.live[id]; ok {
		return segs, errors.Wrapf(ErrInvalid, "cachingmodel: allocation %d is live already", id)
	}
	if size == 0 {
		return segs, errors.Wrapf(ErrInvalid, "cachingmodel: allocation %d of 0 bytes", id)
	}
	rounded, segSize := Rounded(size), SegmentSize(size)
	small := rounded != 0 && rounded <= SmallSize
	var b *block
	if rounded != 0 {
		b = m.pool(small).ceil(&block{seg: &segment{id: -1}, size: rounded})
	}
	if b != nil {
		m.remove(b)
	} else {
		if segSize == 0 || segSize > m.capacity-m.reserved {
			m.OOMs++
			segs = m.releaseEmpty(segs)
			if segSize == 0 || segSize > m.capacity-m.reserved {
				return segs, errors.Wrapf(ErrOutOfMemory, "cachingmodel: allocation %d of %d bytes: %d of %d reserved", id, size, m.reserved, m.capacity)
			}
		}
		s := &segment{id: m.segs, addr: m.next, size: segSize, small: small}
		m.segs++
		m.Mallocs++
		m.next += (segSize + RoundLarge - 1) / RoundLarge * RoundLarge
		b = &block{seg: s, size: s.size}
		m.reserved += s.size
		m.peak = max(m.peak, m.reserved)
		segs = append(segs, Segment{Addr: s.addr, Size: s.size})
	}
	if left := b.size - rounded; (small && left >= MinBlock) || (!small && left > SmallSize) {
		rest := &block{seg: b.seg, off: b.off + rounded, size: left, free: true, prev: b, next: b.next}
		if b.next != nil {
			b.next.prev = rest
		}
		b.next, b.size = rest, rounded
		m.insert(rest)
	}
	b.free = false
	m.live[id] = b
	return segs, nil
}

// Free frees allocation id's block, merging it with its free neighbours.
// An id not live is ErrInvalid and changes nothing.
func (m *Model) Free(id int64) error {
	b, ok := m.live[id]
	if !ok {
		return errors.Wrapf(ErrInvalid, "cachingmodel: free of allocation %d, not live", id)
	}
	delete(m.live, id)
	b.free = true
	if n := b.next; n != nil && n.free {
		m.remove(n)
		b.size += n.size
		b.next = n.next
		if n.next != nil {
			n.next.prev = b
		}
	}
	if p := b.prev; p != nil && p.free {
		m.remove(p)
		p.size += b.size
		p.next = b.next
		if b.next != nil {
			b.next.prev = p
		}
		b = p
	}
	m.insert(b)
	return nil
}

// releaseEmpty releases every segment that holds no live block (one free
// block of the segment's size), appending them to segs in pool order.
func (m *Model) releaseEmpty(segs []Segment) []Segment {
	for _, small := range []bool{true, false} {
		p := m.pool(small)
		for _, b := range p.blocks() {
			if b.off != 0 || b.size != b.seg.size {
				continue
			}
			m.remove(b)
			m.reserved -= b.size
			m.Releases++
			segs = append(segs, Segment{Released: true, Addr: b.seg.addr, Size: b.seg.size})
		}
	}
	return segs
}

// Check verifies the invariants of the package doc, walking every block:
// for tests.
func (m *Model) Check() error {
	heads := map[*segment]*block{}
	inPool := map[*block]bool{}
	for _, small := range []bool{true, false} {
		p := m.pool(small).blocks()
		if len(p) != m.pool(small).n || !slices.IsSortedFunc(p, less) {
			return fmt.Errorf("cachingmodel: the small=%v pool is not sorted", small)
		}
		for _, b := range p {
			if !b.free || b.seg.small != small {
				return fmt.Errorf("cachingmodel: the small=%v pool holds a live block or another pool's", small)
			}
			inPool[b] = true
		}
	}
	var reserved uint64
	visit := func(b *block) {
		for b.prev != nil {
			b = b.prev
		}
		heads[b.seg] = b
	}
	for b := range inPool {
		visit(b)
	}
	for _, b := range m.live {
		if b.free {
			return fmt.Errorf("cachingmodel: a live allocation's block is free")
		}
		visit(b)
	}
	free := 0
	for s, b := range heads {
		var off uint64
		for ; b != nil; b = b.next {
			if b.seg != s || b.off != off || (b.next != nil && b.next.prev != b) {
				return fmt.Errorf("cachingmodel: segment %d's blocks do not tile it", s.id)
			}
			if b.free {
				free++
				if !inPool[b] {
					return fmt.Errorf("cachingmodel: a free block of segment %d is in no pool", s.id)
				}
				if b.next != nil && b.next.free {
					return fmt.Errorf("cachingmodel: two free blocks of segment %d side by side", s.id)
				}
			}
			off += b.size
		}
		if off != s.size {
			return fmt.Errorf("cachingmodel: segment %d's blocks sum to %d of %d", s.id, off, s.size)
		}
		reserved += s.size
	}
	switch {
	case free != len(inPool):
		return fmt.Errorf("cachingmodel: %d free blocks pooled, %d in segments", len(inPool), free)
	case reserved != m.reserved || reserved > m.capacity || m.peak < reserved:
		return fmt.Errorf("cachingmodel: reserved %d, the segments %d, peak %d, capacity %d", m.reserved, reserved, m.peak, m.capacity)
	}
	return nil
}
