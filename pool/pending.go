package pool

import (
	"cmp"
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
// only frees of its stream; streams and lists correspond one to one; n
// counts every entry.
type pendingSet struct {
	streams []*stream.Stream // in the order their first pending free came
	lists   [][]pendingFree  // lists[i]: streams[i]'s frees
	n       int
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

func (ps *pendingSet) len() int { return ps.n }

// listOf is the index of st's list, or -1.
func (ps *pendingSet) listOf(st *stream.Stream) int {
	return slices.Index(ps.streams, st)
}

func (ps *pendingSet) at(a pendingAt) *pendingFree { return &ps.lists[a.list][a.i] }

// add records pf, after every pending free of its stream of the same
// capacity.
func (ps *pendingSet) add(pf pendingFree) {
	l := ps.listOf(pf.st)
	if l < 0 {
		ps.streams = append(ps.streams, pf.st)
		ps.lists = append(ps.lists, nil)
		l = len(ps.lists) - 1
	}
	list := ps.lists[l]
	i, _ := slices.BinarySearchFunc(list, pf.cap+1, func(e pendingFree, c uint64) int { return cmp.Compare(e.cap, c) })
	ps.lists[l] = slices.Insert(list, i, pf)
	ps.n++
}

// take removes the entry at a and returns it.
func (ps *pendingSet) take(a pendingAt) pendingFree {
	pf := ps.lists[a.list][a.i]
	ps.lists[a.list] = slices.Delete(ps.lists[a.list], a.i, a.i+1)
	ps.n--
	if len(ps.lists[a.list]) == 0 {
		ps.drop(a.list)
	}
	return pf
}

// drop removes the list l, which is empty, keeping the others' order.
func (ps *pendingSet) drop(l int) {
	ps.streams = slices.Delete(ps.streams, l, l+1)
	ps.lists = slices.Delete(ps.lists, l, l+1)
}

// fitting is the first entry of list l whose capacity is at least size
// (len of the list if none): entries from there on fit, the smallest
// first.
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
		ps.n -= len(list) - len(kept)
		ps.lists[l] = kept
		if len(kept) == 0 {
			ps.drop(l)
			continue
		}
		l++
	}
}

// clear removes every entry.
func (ps *pendingSet) clear() { *ps = pendingSet{} }

// check verifies the invariants in the type's doc.
func (ps *pendingSet) check(fail func(format string, args ...any)) {
	if len(ps.streams) != len(ps.lists) {
		fail("pool: %d streams with pending frees, %d lists", len(ps.streams), len(ps.lists))
		return
	}
	n := 0
	for l, list := range ps.lists {
		if len(list) == 0 {
			fail("pool: the pending list of %s is empty", ps.streams[l])
		}
		if slices.Index(ps.streams, ps.streams[l]) != l {
			fail("pool: %s has two pending lists", ps.streams[l])
		}
		for i, pf := range list {
			if pf.st != ps.streams[l] {
				fail("pool: a free on %s is in the list of %s", pf.st, ps.streams[l])
			}
			if i > 0 && list[i-1].cap > pf.cap {
				fail("pool: the pending list of %s is not sorted by capacity", ps.streams[l])
			}
		}
		n += len(list)
	}
	if n != ps.n {
		fail("pool: %d pending frees, counted %d", n, ps.n)
	}
}
