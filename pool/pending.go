package pool

import (
	"slices"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/stream"
)

// pendingSet holds a pool's pending frees indexed by the stream they were
// freed on, each stream's list sorted by capacity (ties in the order of the
// frees). A malloc on stream s finds the smallest block of its own stream
// that fits by binary search, and looks at another stream's blocks only
// while they could beat it (smaller, or usable without a wait where the
// best so far needs one) — so its cost grows with the number of streams
// holding pending frees (a binary search in each, a few for the usual
// handful of streams), not with the number of frees, and it takes no
// event's lock for a block that cannot win.
//
// Invariants (checked by check): every list is non-empty, sorted, and holds
// only frees of one stream, the stream of no other list. A list's stream is
// that of its entries.
type pendingSet struct {
	lists [][]pendingFree // in the order their stream's first pending free came
}

// pendingFree is a block freed in stream order and not yet reused or
// given back to the allocator.
type pendingFree struct {
	addr driver.Addr
	cap  uint64
	st   *stream.Stream
	pos  uint64        // the free's position in st
	ev   *stream.Event // recorded on st right after the free
}

// pendingAt names an entry: lists[list][i].
type pendingAt struct{ list, i int }

// len counts the pending frees (a sum over the few streams holding any).
func (ps *pendingSet) len() int {
	n := 0
	for _, list := range ps.lists {
		n += len(list)
	}
	return n
}

// listOf is the index of st's list, or -1.
func (ps *pendingSet) listOf(st *stream.Stream) int {
	for l, list := range ps.lists {
		if len(list) > 0 && list[0].st == st {
			return l
		}
	}
	return -1
}

func (ps *pendingSet) at(a pendingAt) *pendingFree { return &ps.lists[a.list][a.i] }

// add records pf, after every pending free of its stream of the same
// capacity.
func (ps *pendingSet) add(pf pendingFree) {
	l := ps.listOf(pf.st)
	if l < 0 {
		ps.lists = append(ps.lists, []pendingFree{pf})
		return
	}
	ps.lists[l] = slices.Insert(ps.lists[l], ps.fitting(l, pf.cap+1), pf)
}

// take removes the entry at a and returns it.
func (ps *pendingSet) take(a pendingAt) pendingFree {
	pf := ps.lists[a.list][a.i]
	ps.lists[a.list] = slices.Delete(ps.lists[a.list], a.i, a.i+1)
	if len(ps.lists[a.list]) == 0 {
		ps.lists = slices.Delete(ps.lists, a.list, a.list+1)
	}
	return pf
}

// fitting is the first entry of list l whose capacity is at least size
// (len of the list if none): entries from there on fit, the smallest
// first. (A binary search written out: slices.BinarySearchFunc's
// comparison closure showed in the pool benchmark's profile.)
func (ps *pendingSet) fitting(l int, size uint64) int {
	list := ps.lists[l]
	lo, hi := 0, len(list)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if list[m].cap < size {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// all calls fn for every entry, stream by stream.
func (ps *pendingSet) all(fn func(pf *pendingFree)) {
	for l := range ps.lists {
		for i := range ps.lists[l] {
			fn(&ps.lists[l][i])
		}
	}
}

// filter keeps the entries keep returns true for (called once each, stream
// by stream), in their order.
func (ps *pendingSet) filter(keep func(pf *pendingFree) bool) {
	for l := 0; l < len(ps.lists); {
		list := ps.lists[l]
		kept := list[:0]
		for i := range list {
			if keep(&list[i]) {
				kept = append(kept, list[i])
			}
		}
		clear(list[len(kept):])
		if len(kept) == 0 {
			ps.lists = slices.Delete(ps.lists, l, l+1)
			continue
		}
		ps.lists[l] = kept
		l++
	}
}

// clear removes every entry.
func (ps *pendingSet) clear() { ps.lists = nil }

// check verifies the invariants in the type's doc.
func (ps *pendingSet) check(fail func(format string, args ...any)) {
	for l, list := range ps.lists {
		if len(list) == 0 {
			fail("pool: pending list %d is empty", l)
			continue
		}
		st := list[0].st
		if ps.listOf(st) != l {
			fail("pool: %s has two pending lists", st)
		}
		for i, pf := range list {
			if pf.st != st {
				fail("pool: a free on %s is in the list of %s", pf.st, st)
			}
			if i > 0 && list[i-1].cap > pf.cap {
				fail("pool: the pending list of %s is not sorted by capacity", st)
			}
		}
	}
}
