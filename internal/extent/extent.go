// Package extent keeps the free parts of a linear space — a device heap's
// offsets, a simulated address space, a reservation being carved — and hands
// out aligned pieces first-fit from the lowest address, so that pieces taken
// one after another lie side by side (which lets the kernel merge their
// mappings).
//
// It owns only numbers: it never touches memory. It is not safe for
// concurrent use; its owner holds the lock.
package extent

import (
	"sort"

	"github.com/cockroachdb/errors"
)

// An extent is [start, end): start inclusive, end exclusive, never empty.
type extent struct{ start, end uint64 }

// Set is the free space of [base, limit). Invariant: free is sorted by
// start, its extents are non-empty, lie inside [base, limit), and neither
// overlap nor touch (touching extents are merged).
type Set struct {
	base, limit uint64
	free        []extent
	inUse       uint64
}

// New returns a Set whose whole range [base, base+size) is free.
func New(base, size uint64) *Set {
	s := &Set{base: base, limit: base + size}
	if size > 0 {
		s.free = []extent{{base, base + size}}
	}
	return s
}

// InUse is the number of bytes handed out and not yet returned.
func (s *Set) InUse() uint64 { return s.inUse }

// Largest is the size of the largest free extent.
func (s *Set) Largest() uint64 {
	var m uint64
	for _, e := range s.free {
		m = max(m, e.end-e.start)
	}
	return m
}

// Alloc takes size bytes starting at a multiple of align (a power of two,
// 0 or 1 for none) from the lowest free extent that fits. ok is false when
// none fits; the set is then unchanged.
func (s *Set) Alloc(size, align uint64) (start uint64, ok bool) {
	if size == 0 {
		return 0, false
	}
	if align == 0 {
		align = 1
	}
	for i, e := range s.free {
		at := alignUp(e.start, align)
		if at < e.start || at >= e.end || e.end-at < size {
			continue
		}
		s.take(i, at, at+size)
		return at, true
	}
	return 0, false
}

// AllocAt takes exactly [start, start+size) if all of it is free.
func (s *Set) AllocAt(start, size uint64) bool {
	end := start + size
	if size == 0 || end < start {
		return false
	}
	i := s.find(start)
	if i < 0 || s.free[i].end < end {
		return false
	}
	s.take(i, start, end)
	return true
}

// Free returns [start, start+size), which must have been handed out. A
// range outside the set or overlapping free space is an assertion failure
// (a double free in the caller) and changes nothing.
func (s *Set) Free(start, size uint64) error {
	end := start + size
	if size == 0 || end < start || start < s.base || end > s.limit {
		return errors.AssertionFailedf("extent: free of [%#x, %#x) outside [%#x, %#x)", start, end, s.base, s.limit)
	}
	// i is the first free extent that starts at or after end.
	i := sort.Search(len(s.free), func(i int) bool { return s.free[i].start >= end })
	if i > 0 && s.free[i-1].end > start {
		return errors.AssertionFailedf("extent: free of [%#x, %#x) overlaps free [%#x, %#x)",
			start, end, s.free[i-1].start, s.free[i-1].end)
	}
	joinPrev := i > 0 && s.free[i-1].end == start
	joinNext := i < len(s.free) && s.free[i].start == end
	switch {
	case joinPrev && joinNext:
		s.free[i-1].end = s.free[i].end
		s.free = append(s.free[:i], s.free[i+1:]...)
	case joinPrev:
		s.free[i-1].end = end
	case joinNext:
		s.free[i].start = start
	default:
		s.free = append(s.free, extent{})
		copy(s.free[i+1:], s.free[i:])
		s.free[i] = extent{start, end}
	}
	s.inUse -= size
	return nil
}

// IsFree reports whether all of [start, start+size) is free.
func (s *Set) IsFree(start, size uint64) bool {
	i := s.find(start)
	return i >= 0 && s.free[i].end >= start+size
}

// Check verifies the invariant on Set and returns every violation found.
func (s *Set) Check() error {
	var errs error
	var free uint64
	for i, e := range s.free {
		if e.start >= e.end || e.start < s.base || e.end > s.limit {
			errs = errors.CombineErrors(errs, errors.AssertionFailedf("extent: bad free extent [%#x, %#x)", e.start, e.end))
		}
		if i > 0 && s.free[i-1].end >= e.start {
			errs = errors.CombineErrors(errs, errors.AssertionFailedf("extent: free extents %d and %d overlap or touch", i-1, i))
		}
		free += e.end - e.start
	}
	if free+s.inUse != s.limit-s.base {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf("extent: free %d + in use %d != size %d", free, s.inUse, s.limit-s.base))
	}
	return errs
}

// find returns the index of the free extent containing addr, or -1.
func (s *Set) find(addr uint64) int {
	i := sort.Search(len(s.free), func(i int) bool { return s.free[i].end > addr })
	if i < len(s.free) && s.free[i].start <= addr {
		return i
	}
	return -1
}

// take removes [start, end) from free extent i, which contains it.
func (s *Set) take(i int, start, end uint64) {
	e := s.free[i]
	switch {
	case e.start == start && e.end == end:
		s.free = append(s.free[:i], s.free[i+1:]...)
	case e.start == start:
		s.free[i].start = end
	case e.end == end:
		s.free[i].end = start
	default:
		s.free = append(s.free, extent{})
		copy(s.free[i+2:], s.free[i+1:])
		s.free[i] = extent{e.start, start}
		s.free[i+1] = extent{end, e.end}
	}
	s.inUse += end - start
}

func alignUp(x, align uint64) uint64 { return (x + align - 1) &^ (align - 1) }
