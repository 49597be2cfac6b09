// Package sections keeps the disjoint ranges of one fixed span of
// addresses (a reservation) in a dense directory of equal sections, each a
// small internal/ranges list: a book a page table or a driver's ledger
// consults by address on every map and unmap.
//
// Why: a key lookup in one ranges.List of n ranges descends log64(n)
// nodes, each a binary search over a node of about two kilobytes; at half
// a million mappings (a KV cache of 256 sequences of 32k tokens, 2 MiB
// pages) that is three levels, all cold when the lookups land far apart,
// and each of the three books under a commit (the arena's, the page
// table's, the driver's) pays them. Here the section holding an address is
// found by a shift (one cache line of the directory), and a section holds
// the ranges that start in it — a few dozen at most when the section spans
// a few dozen granules — so the descent is one small node, whatever the
// number of ranges: a lookup costs O(1) in the table's size, an edit O(log)
// of a section's.
//
// A range that runs past the end of its section is kept in the section of
// its start, and named as the cover of each later section whose first
// address it holds (at most one range covers an address): Get, Add and
// Between look at one section and its cover. Adding or deleting such a
// range updates the covers of the sections it spans: O(size ÷ section)
// on top of the descent, for the rare range larger than a section.
//
// Iteration walks the sections in order; All and Check cost O(sections +
// n), and Between over [x, end) the sections it crosses. Like ranges.List
// it owns only numbers and the values it is given, and is not safe for
// concurrent use.
package sections

import (
	"iter"
	"math/bits"

	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/internal/ranges"
)

// maxSections bounds the directory (320 KiB at 40 bytes a section): a
// larger span gets larger sections, each then a small B+ tree of its own.
// 8192 sections of 64 granules of 2 MiB are a terabyte.
const maxSections = 1 << 13

// perSection is the number of granules a section spans: ranges of one
// granule each fill one leaf of ranges.List.
const perSection = 64

// List is the ranges inside [base, base+size), sorted and disjoint. The
// zero List holds nothing and refuses every Add; make one with New.
type List[K ~uint64, V any] struct {
	base  K
	size  uint64
	shift uint
	secs  []section[K, V]
	n     int
}

// section is the ranges that start inside it, and cover: the range that
// starts before it and holds its first address (End 0: none).
type section[K ~uint64, V any] struct {
	list  ranges.List[K, V]
	cover ranges.Item[K, V]
}

// New returns an empty List for [base, base+size), whose ranges are
// mostly multiples of gran bytes (gran > 0).
func New[K ~uint64, V any](base K, size, gran uint64) *List[K, V] {
	l := &List[K, V]{base: base, size: size}
	span := max(gran, 1) * perSection
	l.shift = uint(bits.Len64(span - 1))
	nsec := 1
	if size > 0 {
		for l.shift < 63 && (size-1)>>l.shift >= maxSections {
			l.shift++
		}
		nsec = int((size-1)>>l.shift) + 1
	}
	l.secs = make([]section[K, V], nsec)
	return l
}

// Len is the number of ranges.
func (l *List[K, V]) Len() int {
	if l == nil {
		return 0
	}
	return l.n
}

// sec is the section holding x, clamped to the directory.
func (l *List[K, V]) sec(x K) int {
	if x <= l.base {
		return 0
	}
	return int(min(uint64(x-l.base)>>l.shift, uint64(len(l.secs)-1)))
}

// inside reports whether [start, end) lies in the list's span.
func (l *List[K, V]) inside(start, end K) bool {
	return start >= l.base && end > start && uint64(end-l.base) <= l.size
}

// Get returns the range holding x, or nil. The pointer is valid until the
// list next changes.
func (l *List[K, V]) Get(x K) *ranges.Item[K, V] {
	if l == nil || l.n == 0 || x < l.base || uint64(x-l.base) >= l.size {
		return nil
	}
	s := &l.secs[l.sec(x)]
	if it := s.list.Get(x); it != nil {
		return it
	}
	if s.cover.End > x && s.cover.Start <= x {
		return &s.cover
	}
	return nil
}

// Add adds [start, end) with value v. ok is false and nothing changes when
// a range overlaps it (in the way is that range) or when it is empty or
// outside the list's span (in the way is nil).
func (l *List[K, V]) Add(start, end K, v V) (inTheWay *ranges.Item[K, V], ok bool) {
	if l == nil || !l.inside(start, end) {
		return nil, false
	}
	k0, k1 := l.sec(start), l.sec(end-1)
	s := &l.secs[k0]
	if s.cover.End > start {
		return &s.cover, false
	}
	// A range larger than a section: the sections it reaches into must
	// hold nothing in its way (their covers are s's, or none).
	for k := k0 + 1; k <= k1; k++ {
		if o := l.secs[k].list.Overlap(start, end); o != nil {
			if o2 := s.list.Overlap(start, end); o2 != nil {
				return o2, false // the first in the way
			}
			return o, false
		}
	}
	if o, ok := s.list.Add(start, end, v); !ok {
		return o, false
	}
	for k := k0 + 1; k <= k1; k++ {
		l.secs[k].cover = ranges.Item[K, V]{Start: start, End: end, Val: v}
	}
	l.n++
	return nil, true
}

// DeleteStart deletes the range that starts at start; ok is false, and
// nothing changes, when no range starts there.
func (l *List[K, V]) DeleteStart(start K) (it ranges.Item[K, V], ok bool) {
	if l == nil || l.n == 0 || start < l.base || uint64(start-l.base) >= l.size {
		return it, false
	}
	k0 := l.sec(start)
	if it, ok = l.secs[k0].list.DeleteStart(start); !ok {
		return it, false
	}
	for k := k0 + 1; k <= l.sec(it.End-1); k++ {
		l.secs[k].cover = ranges.Item[K, V]{}
	}
	l.n--
	return it, true
}

// Between iterates over the ranges that overlap [x, end), in order. The
// list must not change while it runs.
func (l *List[K, V]) Between(x, end K) iter.Seq[*ranges.Item[K, V]] {
	return func(yield func(*ranges.Item[K, V]) bool) {
		if l == nil || l.n == 0 || end <= x || end <= l.base || uint64(max(x, l.base)-l.base) >= l.size {
			return
		}
		x = max(x, l.base)
		k := l.sec(x)
		if c := &l.secs[k].cover; c.End > x && c.Start < end {
			if !yield(c) {
				return
			}
		}
		for it := range l.secs[k].list.After(x) {
			if it.Start >= end || !yield(it) {
				return
			}
		}
		for k++; k < len(l.secs) && l.base+K(uint64(k)<<l.shift) < end; k++ {
			for _, it := range l.secs[k].list.All() {
				if it.Start >= end || !yield(it) {
					return
				}
			}
		}
	}
}

// All iterates over every range in order, with its index. The list must
// not change while it runs.
func (l *List[K, V]) All() iter.Seq2[int, *ranges.Item[K, V]] {
	return func(yield func(int, *ranges.Item[K, V]) bool) {
		if l == nil || l.n == 0 {
			return
		}
		i := 0
		for k := range l.secs {
			for _, it := range l.secs[k].list.All() {
				if !yield(i, it) {
					return
				}
				i++
			}
		}
	}
}

// First returns the first range, or nil.
func (l *List[K, V]) First() *ranges.Item[K, V] {
	for _, it := range l.All() {
		return it
	}
	return nil
}

// Clear drops every range.
func (l *List[K, V]) Clear() {
	if l == nil {
		return
	}
	clear(l.secs)
	l.n = 0
}

// Check verifies the invariants: every section's list (ranges.List.Check),
// each range inside the span and in the section of its start, the ranges
// sorted and disjoint across sections, each section's cover the range
// before it that holds its first address, and the count.
func (l *List[K, V]) Check() error {
	if l == nil {
		return nil
	}
	var errs error
	fail := func(format string, args ...any) {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf(format, args...))
	}
	var prev *ranges.Item[K, V]
	n := 0
	for k := range l.secs {
		s := &l.secs[k]
		first := l.base + K(uint64(k)<<l.shift)
		var want ranges.Item[K, V]
		if prev != nil && prev.End > first {
			want = *prev
		}
		if s.cover.Start != want.Start || s.cover.End != want.End {
			fail("sections: section %d (at %#x) is covered by [%#x, %#x), want [%#x, %#x)", k, first, s.cover.Start, s.cover.End, want.Start, want.End)
		}
		if err := s.list.Check(); err != nil {
			errs = errors.CombineErrors(errs, errors.Wrapf(err, "sections: section %d", k))
		}
		for _, it := range s.list.All() {
			if !l.inside(it.Start, it.End) {
				fail("sections: [%#x, %#x) lies outside [%#x, +%#x)", it.Start, it.End, l.base, l.size)
			} else if l.sec(it.Start) != k {
				fail("sections: [%#x, %#x) is in section %d, not %d", it.Start, it.End, k, l.sec(it.Start))
			}
			if prev != nil && prev.End > it.Start {
				fail("sections: [%#x, %#x) overlaps [%#x, %#x)", prev.Start, prev.End, it.Start, it.End)
			}
			prev = it
			n++
		}
	}
	if n != l.n {
		fail("sections: %d ranges counted, %d listed", l.n, n)
	}
	return errs
}
