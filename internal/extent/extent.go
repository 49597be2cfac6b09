// Package extent keeps the free parts of a linear space — a device heap's
// offsets, a simulated address space, a reservation being carved — and hands
// out aligned pieces first-fit from the lowest address, so that pieces taken
// one after another lie side by side (which lets the kernel merge their
// mappings).
//
// Every operation costs O(log n) in the number of free extents: the free
// extents are a ranges.List, whose summaries of the largest extent under
// each subtree let first-fit descend one path instead of walking the list.
//
// It owns only numbers: it never touches memory. It is not safe for
// concurrent use; its owner holds the lock.
package extent

import (
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/internal/ranges"
)

// Set is the free space of [base, limit). Invariant: the free extents are
// sorted, non-empty, lie inside [base, limit), and neither overlap nor
// touch (touching extents are merged).
type Set struct {
	base, limit uint64
	free        ranges.List[uint64, struct{}]
	inUse       uint64
}

// New returns a Set whose whole range [base, base+size) is free.
func New(base, size uint64) *Set {
	s := Make(base, size)
	return &s
}

// Make is New as a value, for an owner that keeps its Set in a field of
// its own (one allocation fewer).
func Make(base, size uint64) Set {
	s := Set{base: base, limit: base + size}
	if size > 0 {
		s.free.Insert(base, base+size, struct{}{})
	}
	return s
}

// InUse is the number of bytes handed out and not yet returned.
func (s *Set) InUse() uint64 { return s.inUse }

// Largest is the size of the largest free extent.
func (s *Set) Largest() uint64 { return s.free.Largest() }

// alignMisses is how many extents long enough but misaligned for a request
// Alloc tries before it asks for room for any alignment.
const alignMisses = 4

// Alloc takes size bytes starting at a multiple of align (a power of two,
// 0 or 1 for none) from the lowest free extent that fits. ok is false when
// none fits; the set is then unchanged.
//
// An extent at least size long can still be too short once its start is
// aligned: after alignMisses such extents, Alloc takes the lowest extent,
// further on, of at least size+align-1 bytes, which holds an aligned piece
// whatever its start. So a request costs O(log n) however the free space
// is cut up, and is first-fit but for that bounded detour.
func (s *Set) Alloc(size, align uint64) (start uint64, ok bool) {
	if size == 0 {
		return 0, false
	}
	if align == 0 {
		align = 1
	}
	want := size
	for i, misses := s.free.FirstFit(0, want), 0; i < s.free.Len(); i = s.free.FirstFit(i+1, want) {
		e := s.free.At(i)
		at := alignUp(e.Start, align)
		if at >= e.Start && at < e.End && e.End-at >= size {
			s.take(i, at, at+size)
			return at, true
		}
		if misses++; misses == alignMisses {
			if want = size + align - 1; want < size {
				return 0, false // no extent is that long
			}
		}
	}
	return 0, false
}

// AllocAt takes exactly [start, start+size) if all of it is free.
func (s *Set) AllocAt(start, size uint64) bool {
	end := start + size
	if size == 0 || end < start {
		return false
	}
	i, ok := s.free.Find(start)
	if !ok || s.free.At(i).End < end {
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
	i, ok := s.free.Insert(start, end, struct{}{})
	if !ok {
		e := s.free.At(i)
		return errors.AssertionFailedf("extent: free of [%#x, %#x) overlaps free [%#x, %#x)", start, end, e.Start, e.End)
	}
	// Merge with the neighbours it touches.
	if i+1 < s.free.Len() && s.free.At(i+1).Start == end {
		next := s.free.At(i + 1).End
		s.free.Delete(i+1, i+2)
		s.free.SetBounds(i, start, next)
		end = next
	}
	if i > 0 && s.free.At(i-1).End == start {
		prev := s.free.At(i - 1).Start
		s.free.Delete(i, i+1)
		s.free.SetBounds(i-1, prev, end)
	}
	s.inUse -= size
	return nil
}

// IsFree reports whether all of [start, start+size) is free.
func (s *Set) IsFree(start, size uint64) bool {
	i, ok := s.free.Find(start)
	return ok && s.free.At(i).End >= start+size
}

// Check verifies the invariant on Set and returns every violation found.
func (s *Set) Check() error {
	errs := s.free.Check()
	var free uint64
	for i, e := range s.free.All() {
		if e.Start < s.base || e.End > s.limit {
			errs = errors.CombineErrors(errs, errors.AssertionFailedf("extent: free extent [%#x, %#x) outside [%#x, %#x)", e.Start, e.End, s.base, s.limit))
		}
		if i > 0 && s.free.At(i-1).End == e.Start {
			errs = errors.CombineErrors(errs, errors.AssertionFailedf("extent: free extents %d and %d touch", i-1, i))
		}
		free += e.Size()
	}
	if free+s.inUse != s.limit-s.base {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf("extent: free %d + in use %d != size %d", free, s.inUse, s.limit-s.base))
	}
	return errs
}

// take removes [start, end) from free extent i, which contains it.
func (s *Set) take(i int, start, end uint64) {
	e := *s.free.At(i)
	switch {
	case e.Start == start && e.End == end:
		s.free.Delete(i, i+1)
	case e.Start == start:
		s.free.SetBounds(i, end, e.End)
	case e.End == end:
		s.free.SetBounds(i, e.Start, start)
	default:
		s.free.SetBounds(i, e.Start, start)
		s.free.Insert(end, e.End, struct{}{})
	}
	s.inUse += end - start
}

func alignUp(x, align uint64) uint64 { return (x + align - 1) &^ (align - 1) }
