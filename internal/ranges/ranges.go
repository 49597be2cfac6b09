// Package ranges keeps a sorted list of disjoint half-open ranges, each with
// a value: the one piece of sorted-range bookkeeping the library shares —
// the carved ranges of a reservation, the mappings of a page table, the
// chunks of a growable range, free extents, the live spans a replay
// verifies.
//
// It owns only numbers and the values it is given: it never touches memory
// and is not safe for concurrent use (its owner holds the lock). It never
// lets two ranges overlap: Insert refuses and names the one in the way.
package ranges

import (
	"iter"
	"slices"
	"sort"

	"github.com/cockroachdb/errors"
)

// Item is one range [Start, End) and its value. Start < End always.
type Item[K ~uint64, V any] struct {
	Start, End K
	Val        V
}

// Size is End - Start.
func (it Item[K, V]) Size() uint64 { return uint64(it.End - it.Start) }

// List is a list of ranges sorted by Start. Invariant: every item is
// non-empty and ends at or before the next one starts.
type List[K ~uint64, V any] struct {
	items []Item[K, V]
}

// Len is the number of ranges.
func (l *List[K, V]) Len() int { return len(l.items) }

// At returns a pointer to the i-th range in address order, so its value can
// be changed in place; the pointer is valid until the list next changes.
// Changing Start or End through it is the caller's bug (Check finds it).
func (l *List[K, V]) At(i int) *Item[K, V] { return &l.items[i] }

// Search returns the index of the first range that ends after x: the range
// holding x if there is one, else the first range after x (Len if none).
func (l *List[K, V]) Search(x K) int {
	return sort.Search(len(l.items), func(i int) bool { return l.items[i].End > x })
}

// Find returns the index of the range holding x.
func (l *List[K, V]) Find(x K) (int, bool) {
	i := l.Search(x)
	return i, i < len(l.items) && l.items[i].Start <= x
}

// Overlapping returns the indices [lo, hi) of the ranges that overlap
// [start, end).
func (l *List[K, V]) Overlapping(start, end K) (lo, hi int) {
	lo = l.Search(start)
	hi = lo + sort.Search(len(l.items)-lo, func(i int) bool { return l.items[lo+i].Start >= end })
	return lo, hi
}

// Insert adds [start, end) with value v and returns its index. If the range
// is empty or overlaps a range already listed, nothing changes, ok is false
// and i is the index of the range in the way (Len for an empty range).
func (l *List[K, V]) Insert(start, end K, v V) (i int, ok bool) {
	if start >= end {
		return len(l.items), false
	}
	i = l.Search(start)
	if i < len(l.items) && l.items[i].Start < end {
		return i, false
	}
	l.items = slices.Insert(l.items, i, Item[K, V]{start, end, v})
	return i, true
}

// InsertRun adds the ranges of run, which must be sorted, disjoint and lie
// together in one gap of the list (between two neighbouring ranges), in one
// move of the tail. It returns the index of the first; ok is false and
// nothing changes when run does not fit one gap.
func (l *List[K, V]) InsertRun(run []Item[K, V]) (i int, ok bool) {
	if len(run) == 0 {
		return l.Len(), true
	}
	for j, it := range run {
		if it.Start >= it.End || j > 0 && run[j-1].End > it.Start {
			return j, false
		}
	}
	i = l.Search(run[0].Start)
	if i < len(l.items) && l.items[i].Start < run[len(run)-1].End {
		return i, false
	}
	l.items = slices.Insert(l.items, i, run...)
	return i, true
}

// Delete removes the ranges [lo, hi) of the list (by index).
func (l *List[K, V]) Delete(lo, hi int) { l.items = slices.Delete(l.items, lo, hi) }

// All iterates over the ranges in address order. The list must not change
// while it runs.
func (l *List[K, V]) All() iter.Seq2[int, *Item[K, V]] {
	return func(yield func(int, *Item[K, V]) bool) {
		for i := range l.items {
			if !yield(i, &l.items[i]) {
				return
			}
		}
	}
}

// Clear empties the list.
func (l *List[K, V]) Clear() { l.items = nil }

// Check verifies the invariant and returns every violation, as assertion
// failures naming the ranges.
func (l *List[K, V]) Check() error {
	var errs error
	for i, it := range l.items {
		if it.Start >= it.End {
			errs = errors.CombineErrors(errs, errors.AssertionFailedf("ranges: range %d [%#x, %#x) is empty", i, it.Start, it.End))
		}
		if i > 0 && l.items[i-1].End > it.Start {
			errs = errors.CombineErrors(errs, errors.AssertionFailedf("ranges: ranges %d [%#x, %#x) and %d [%#x, %#x) overlap or are out of order",
				i-1, l.items[i-1].Start, l.items[i-1].End, i, it.Start, it.End))
		}
	}
	return errs
}
