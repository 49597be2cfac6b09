// Package ranges keeps a sorted list of disjoint half-open ranges, each with
// a value: the one piece of sorted-range bookkeeping the library shares —
// the carved ranges of a reservation, the mappings of a page table, the
// chunks of a growable range, free extents, the live spans a replay
// verifies.
//
// A List is a counted B+ tree: every operation costs O(log n) whatever the
// number of ranges — finding the range that holds an address, inserting,
// deleting, reaching the i-th range by index — and walking k ranges in
// order costs O(k + log n). Nothing moves the tail of the list on an edit:
// a page table of a million mappings maps and unmaps as fast as one of a
// thousand. Each inner node keeps, for each child, the number of ranges
// under it, the start of its first range and the size of its largest, so
// that indexing, searching and a first-fit by size (FirstFit) descend one
// path. The operations by key — Get, Overlap, Add, AddRun, DeleteStart,
// After — descend by key, once for one range, and count nothing: the hot
// paths of the books above (a page table's map and unmap, a range's
// commit and decommit) use them, not indices.
//
// It owns only numbers and the values it is given: it never touches memory
// and is not safe for concurrent use (its owner holds the lock). It never
// lets two ranges overlap: Insert refuses and names the one in the way.
package ranges

import (
	"iter"
	"slices"

	"github.com/vmarena/vmarena/internal/errors"
)

// Item is one range [Start, End) and its value. Start < End always.
type Item[K ~uint64, V any] struct {
	Start, End K
	Val        V
}

// Size is End - Start.
func (it Item[K, V]) Size() uint64 { return uint64(it.End - it.Start) }

// The B+ tree's node sizes. A leaf holds minItems to maxItems ranges and an
// inner node minKids to maxKids children, but for the root, which holds at
// least one. 64 ranges of 24 bytes move in one leaf at most on an insert:
// cheaper than the cache misses of a deeper tree.
const (
	maxItems = 64
	minItems = maxItems / 2
	maxKids  = 64
	minKids  = maxKids / 2
)

// List is a list of ranges sorted by Start. Invariant: every item is
// non-empty and ends at or before the next one starts. The zero List is
// empty and ready to use.
//
// Invariants of the tree (checked by Check): every leaf is at the same
// depth; every node but the root holds between the minimum and the maximum
// of its kind; a leaf links to its neighbours in order; each child's
// summary (count, first start, largest size) is that of the ranges under
// it; n is the number of ranges.
type List[K ~uint64, V any] struct {
	root *node[K, V]
	n    int
}

// node is a leaf (kids nil: items holds its ranges, prev and next its
// neighbouring leaves) or an inner node (kids holds its children). Only
// the root may be empty: a leaf, once the list's last range went.
type node[K ~uint64, V any] struct {
	items      []Item[K, V]
	kids       []kid[K, V]
	prev, next *node[K, V]
}

// kid is one child of an inner node and the summary of the ranges under
// it.
type kid[K ~uint64, V any] struct {
	n     *node[K, V]
	count int
	first K
	big   uint64
}

func (n *node[K, V]) leaf() bool { return n.kids == nil }

// size is the number of entries (ranges or children) the node holds.
func (n *node[K, V]) size() int {
	if n.leaf() {
		return len(n.items)
	}
	return len(n.kids)
}

// summary computes the kid entry of n from its entries.
func (n *node[K, V]) summary() kid[K, V] {
	k := kid[K, V]{n: n}
	if n.leaf() {
		k.count = len(n.items)
		if len(n.items) > 0 {
			k.first = n.items[0].Start
		}
		for i := range n.items {
			k.big = max(k.big, n.items[i].Size())
		}
		return k
	}
	if len(n.kids) > 0 {
		k.first = n.kids[0].first
	}
	for i := range n.kids {
		k.count += n.kids[i].count
		k.big = max(k.big, n.kids[i].big)
	}
	return k
}

// largestAfter is the size of n's largest range, when n's largest was
// big before one of that size went: big again as soon as another of that
// size shows (ranges of one size — a page table's, a range's chunks — stop
// at the first), else the largest of all.
func (n *node[K, V]) largestAfter(big uint64) uint64 {
	var most uint64
	if n.leaf() {
		for i := range n.items {
			sz := n.items[i].Size()
			if sz == big {
				return big
			}
			most = max(most, sz)
		}
		return most
	}
	for i := range n.kids {
		if n.kids[i].big == big {
			return big
		}
		most = max(most, n.kids[i].big)
	}
	return most
}

// firstStart is the start of n's first range (n is not empty).
func (n *node[K, V]) firstStart() K {
	if n.leaf() {
		return n.items[0].Start
	}
	return n.kids[0].first
}

// newLeaf makes a leaf with room for c ranges (it grows to maxItems+1).
func newLeaf[K ~uint64, V any](c int) *node[K, V] {
	return &node[K, V]{items: make([]Item[K, V], 0, c)}
}

func newInner[K ~uint64, V any]() *node[K, V] {
	return &node[K, V]{kids: make([]kid[K, V], 0, maxKids+1)}
}

// Len is the number of ranges.
func (l *List[K, V]) Len() int { return l.n }

// kidAt returns the child of the inner node n holding its i-th range
// and that range's index under the child.
func (n *node[K, V]) kidAt(i int) (k, j int) {
	for ; i >= n.kids[k].count; k++ {
		i -= n.kids[k].count
	}
	return k, i
}

// leafAt returns the leaf holding the i-th range (0 <= i < Len) and the
// range's index in it.
func (l *List[K, V]) leafAt(i int) (*node[K, V], int) {
	n := l.root
	for !n.leaf() {
		var k int
		k, i = n.kidAt(i)
		n = n.kids[k].n
	}
	return n, i
}

// At returns a pointer to the i-th range in address order, so its value can
// be changed in place; the pointer is valid until the list next changes.
// Changing Start or End through it is the caller's bug (Check finds it):
// SetBounds changes them.
func (l *List[K, V]) At(i int) *Item[K, V] {
	if i < 0 || i >= l.n {
		panic(errors.AssertionFailedf("ranges: index %d out of %d ranges", i, l.n))
	}
	lf, j := l.leafAt(i)
	return &lf.items[j]
}

// lastKid returns the last child of the inner node n whose first range
// starts at or before x, or -1 when none does. A plain binary search: the
// hot paths of a page table run it on every level.
func (n *node[K, V]) lastKid(x K) int {
	lo, hi := 0, len(n.kids)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if n.kids[m].first > x {
			hi = m
		} else {
			lo = m + 1
		}
	}
	return lo - 1
}

// upTo returns how many ranges of the leaf n start at or before x.
func (n *node[K, V]) upTo(x K) int {
	lo, hi := 0, len(n.items)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if n.items[m].Start > x {
			hi = m
		} else {
			lo = m + 1
		}
	}
	return lo
}

// leafFor returns the leaf where a range starting at x is or belongs and
// how many of its ranges start at or before x: the last leaf whose first
// range starts at or before x (the first leaf when none does). The
// ranges before the leaf's all start before x; those after it, after.
func (l *List[K, V]) leafFor(x K) (*node[K, V], int) {
	n := l.root
	for !n.leaf() {
		n = n.kids[max(0, n.lastKid(x))].n
	}
	return n, n.upTo(x)
}

// startsAtOrBefore returns how many ranges start at or before x, and a
// pointer to the last of them (nil when none).
func (l *List[K, V]) startsAtOrBefore(x K) (int, *Item[K, V]) {
	if l.root == nil {
		return 0, nil
	}
	n, rank := l.root, 0
	for !n.leaf() {
		// The last child whose first range starts at or before x (the
		// first child when none does: nothing starts at or before x).
		k := n.lastKid(x)
		if k < 0 {
			return rank, nil
		}
		for j := range k {
			rank += n.kids[j].count
		}
		n = n.kids[k].n
	}
	p := n.upTo(x)
	if p == 0 {
		return rank, nil
	}
	return rank + p, &n.items[p-1]
}

// Get returns the range holding x, or nil. Like the other key-based
// operations (Overlap, Add, DeleteStart) it descends one path of the tree
// and counts nothing; the pointer is valid until the list next changes.
func (l *List[K, V]) Get(x K) *Item[K, V] {
	if l.root == nil {
		return nil
	}
	n, p := l.leafFor(x)
	if p == 0 || n.items[p-1].End <= x {
		return nil
	}
	return &n.items[p-1]
}

// Overlap returns the first range that overlaps [start, end), or nil
// (always nil for an empty range).
func (l *List[K, V]) Overlap(start, end K) *Item[K, V] {
	if l.root == nil || start >= end {
		return nil
	}
	n, p := l.leafFor(start)
	return n.overlapAt(p, start, end)
}

// overlapAt returns the range overlapping [start, end), or nil, where p
// is the place of start in the leaf n (upTo): the range before it, if it
// reaches past start, else the next one — here or first in the next leaf —
// if it starts before end.
func (n *node[K, V]) overlapAt(p int, start, end K) *Item[K, V] {
	if p > 0 && n.items[p-1].End > start {
		return &n.items[p-1]
	}
	var next *Item[K, V]
	switch {
	case p < len(n.items):
		next = &n.items[p]
	case n.next != nil:
		next = &n.next.items[0]
	}
	if next != nil && next.Start < end {
		return next
	}
	return nil
}

// Add adds [start, end) with value v, like Insert, but returns no index:
// ok is false, nothing changes and in the way is the range that overlaps
// it (nil for an empty range). It descends the tree once: the leaf where
// the range belongs says what is in the way (the summaries above change
// only on the way back up).
func (l *List[K, V]) Add(start, end K, v V) (inTheWay *Item[K, V], ok bool) {
	if start >= end {
		return nil, false
	}
	if o := l.add(Item[K, V]{start, end, v}); o != nil {
		return o, false
	}
	return nil, true
}

// AddRun adds the ranges of run, which must be sorted, disjoint and lie
// together in one gap of the list, like InsertRun, but returns no index
// (and so counts nothing on the way down): ok is false and nothing
// changes when run does not fit one gap.
func (l *List[K, V]) AddRun(run []Item[K, V]) (ok bool) {
	for j, it := range run {
		if it.Start >= it.End || j > 0 && run[j-1].End > it.Start {
			return false
		}
	}
	switch len(run) {
	case 0:
		return true
	case 1:
		return l.add(run[0]) == nil
	}
	if l.Overlap(run[0].Start, run[len(run)-1].End) != nil {
		return false
	}
	for _, it := range run {
		l.insert(it)
	}
	return true
}

// DeleteStart removes the range that starts at start and returns it; ok
// is false, and nothing changes, when no range starts there. It descends
// the tree once: the leaf says whether the range is there before anything
// changes, and the summaries change on the way back up.
func (l *List[K, V]) DeleteStart(start K) (it Item[K, V], ok bool) {
	if l.root == nil {
		return it, false
	}
	if it, ok = removeStart(l.root, start); !ok {
		return it, false
	}
	l.n--
	if !l.root.leaf() && len(l.root.kids) == 1 {
		l.root = l.root.kids[0].n
	}
	return it, true
}

// removeStart removes the range under n that starts at start, if there is
// one, going down the path leafFor takes.
func removeStart[K ~uint64, V any](n *node[K, V], start K) (Item[K, V], bool) {
	if n.leaf() {
		p := n.upTo(start)
		if p == 0 || n.items[p-1].Start != start {
			return Item[K, V]{}, false
		}
		it := n.items[p-1]
		n.items = slices.Delete(n.items, p-1, p)
		return it, true
	}
	k := max(0, n.lastKid(start))
	it, ok := removeStart(n.kids[k].n, start)
	if ok {
		n.deleted(k, it)
	}
	return it, ok
}

// remove removes one range, which the list holds: at each inner node pick
// names the child it lies under, at its leaf its index there.
func (l *List[K, V]) remove(pick func(n *node[K, V]) int) Item[K, V] {
	it := removeUnder(l.root, pick)
	l.n--
	if !l.root.leaf() && len(l.root.kids) == 1 {
		l.root = l.root.kids[0].n
	}
	return it
}

func removeUnder[K ~uint64, V any](n *node[K, V], pick func(n *node[K, V]) int) Item[K, V] {
	p := pick(n)
	if n.leaf() {
		it := n.items[p]
		n.items = slices.Delete(n.items, p, p+1)
		return it
	}
	it := removeUnder(n.kids[p].n, pick)
	n.deleted(p, it)
	return it
}

// deleted updates the summary of child k of n after it lost the range it,
// and refills the child if it fell below its minimum.
func (n *node[K, V]) deleted(k int, it Item[K, V]) {
	c := n.kids[k].n
	e := &n.kids[k]
	e.count--
	if e.count > 0 {
		if it.Start == e.first {
			e.first = c.firstStart()
		}
		if it.Size() == e.big {
			e.big = c.largestAfter(e.big)
		}
	}
	if c.size() < minOf(c) {
		n.rebalance(k)
	}
}

// Search returns the index of the first range that ends after x: the range
// holding x if there is one, else the first range after x (Len if none).
func (l *List[K, V]) Search(x K) int {
	c, last := l.startsAtOrBefore(x)
	if last != nil && last.End > x {
		return c - 1
	}
	return c
}

// Find returns the index of the range holding x.
func (l *List[K, V]) Find(x K) (int, bool) {
	c, last := l.startsAtOrBefore(x)
	if last != nil && last.End > x {
		return c - 1, true
	}
	return c, false
}

// Overlapping returns the indices [lo, hi) of the ranges that overlap
// [start, end).
func (l *List[K, V]) Overlapping(start, end K) (lo, hi int) {
	lo = l.Search(start)
	if end <= start {
		return lo, lo
	}
	hi, _ = l.startsAtOrBefore(end - 1)
	return lo, max(lo, hi)
}

// Insert adds [start, end) with value v and returns its index. If the range
// is empty or overlaps a range already listed, nothing changes, ok is false
// and i is the index of the range in the way (Len for an empty range).
func (l *List[K, V]) Insert(start, end K, v V) (i int, ok bool) {
	if start >= end {
		return l.n, false
	}
	i = l.Search(start)
	if i < l.n && l.At(i).Start < end {
		return i, false
	}
	l.insert(Item[K, V]{start, end, v})
	return i, true
}

// insert adds it, which overlaps nothing (the caller checked).
func (l *List[K, V]) insert(it Item[K, V]) {
	if o := l.add(it); o != nil {
		panic(errors.AssertionFailedf("ranges: [%d, %d) overlaps [%d, %d)", it.Start, it.End, o.Start, o.End))
	}
}

// add adds it (not empty) unless a range overlaps it, and returns that
// range (nil when it was added).
func (l *List[K, V]) add(it Item[K, V]) (inTheWay *Item[K, V]) {
	if l.root == nil {
		l.root = newLeaf[K, V](2) // most lists stay short: grow as needed
	}
	right, o := l.insertInto(l.root, it)
	if o != nil {
		return o
	}
	if right != nil {
		root := newInner[K, V]()
		root.kids = append(root.kids, l.root.summary(), right.summary())
		l.root = root
	}
	l.n++
	return nil
}

// insertInto adds it under n and returns the new right sibling of n when
// n had to split; or, changing nothing, the range in the way of it. The
// leaf it reaches is leafFor's, so it finds what Overlap would.
func (l *List[K, V]) insertInto(n *node[K, V], it Item[K, V]) (right *node[K, V], inTheWay *Item[K, V]) {
	if n.leaf() {
		p := n.upTo(it.Start)
		if in := n.overlapAt(p, it.Start, it.End); in != nil {
			return nil, in
		}
		n.items = slices.Insert(n.items, p, it)
		if len(n.items) <= maxItems {
			return nil, nil
		}
		right := newLeaf[K, V](maxItems + 1)
		right.items = append(right.items, n.items[len(n.items)/2:]...)
		clear(n.items[len(n.items)/2:])
		n.items = n.items[:len(n.items)/2]
		right.prev, right.next = n, n.next
		if n.next != nil {
			n.next.prev = right
		}
		n.next = right
		return right, nil
	}
	k := max(0, n.lastKid(it.Start))
	right, o := l.insertInto(n.kids[k].n, it)
	if o != nil {
		return nil, o
	}
	if right == nil {
		c := &n.kids[k]
		c.count++
		c.first = min(c.first, it.Start)
		c.big = max(c.big, it.Size())
		return nil, nil
	}
	n.kids[k] = n.kids[k].n.summary()
	n.kids = slices.Insert(n.kids, k+1, right.summary())
	if len(n.kids) <= maxKids {
		return nil, nil
	}
	sib := newInner[K, V]()
	sib.kids = append(sib.kids, n.kids[len(n.kids)/2:]...)
	clear(n.kids[len(n.kids)/2:])
	n.kids = n.kids[:len(n.kids)/2]
	return sib, nil
}

// InsertRun adds the ranges of run, which must be sorted, disjoint and lie
// together in one gap of the list (between two neighbouring ranges). It
// returns the index of the first; ok is false and nothing changes when run
// does not fit one gap.
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
	if i < l.n && l.At(i).Start < run[len(run)-1].End {
		return i, false
	}
	for _, it := range run {
		l.insert(it)
	}
	return i, true
}

// Delete removes the ranges [lo, hi) of the list (by index).
func (l *List[K, V]) Delete(lo, hi int) {
	if lo < 0 || hi > l.n || lo > hi {
		panic(errors.AssertionFailedf("ranges: delete [%d, %d) of %d ranges", lo, hi, l.n))
	}
	if lo == 0 && hi == l.n {
		l.Clear()
		return
	}
	for i := hi - 1; i >= lo; i-- {
		j := i // the index under the node pick is at
		l.remove(func(n *node[K, V]) int {
			if n.leaf() {
				return j
			}
			k, under := n.kidAt(j)
			j = under
			return k
		})
	}
}

func minOf[K ~uint64, V any](n *node[K, V]) int {
	if n.leaf() {
		return minItems
	}
	return minKids
}

// rebalance refills the child k of n, which is below its minimum, from a
// neighbour: by taking one entry when the neighbour can spare it, else by
// merging the two.
func (n *node[K, V]) rebalance(k int) {
	l, r := k-1, k
	if k == 0 {
		l, r = 0, 1
	}
	if r >= len(n.kids) { // an only child: the root collapses it
		return
	}
	a, b := n.kids[l].n, n.kids[r].n
	switch {
	case a.size()+b.size() <= maxOf(a):
		// Merge b into a.
		if a.leaf() {
			a.items = append(a.items, b.items...)
			a.next = b.next
			if b.next != nil {
				b.next.prev = a
			}
		} else {
			a.kids = append(a.kids, b.kids...)
		}
		n.kids[l] = a.summary()
		n.kids = slices.Delete(n.kids, r, r+1)
		return
	case a.size() > b.size():
		// Move a's last entry to the front of b.
		if a.leaf() {
			b.items = slices.Insert(b.items, 0, a.items[len(a.items)-1])
			a.items = slices.Delete(a.items, len(a.items)-1, len(a.items))
		} else {
			b.kids = slices.Insert(b.kids, 0, a.kids[len(a.kids)-1])
			a.kids = slices.Delete(a.kids, len(a.kids)-1, len(a.kids))
		}
	default:
		// Move b's first entry to the end of a.
		if a.leaf() {
			a.items = append(a.items, b.items[0])
			b.items = slices.Delete(b.items, 0, 1)
		} else {
			a.kids = append(a.kids, b.kids[0])
			b.kids = slices.Delete(b.kids, 0, 1)
		}
	}
	n.kids[l], n.kids[r] = a.summary(), b.summary()
}

func maxOf[K ~uint64, V any](n *node[K, V]) int {
	if n.leaf() {
		return maxItems
	}
	return maxKids
}

// SetBounds changes the i-th range to [start, end), which must be
// non-empty and overlap neither neighbour; ok is false, and nothing
// changes, otherwise.
func (l *List[K, V]) SetBounds(i int, start, end K) bool {
	if i < 0 || i >= l.n || start >= end {
		return false
	}
	if i > 0 && l.At(i-1).End > start || i+1 < l.n && l.At(i+1).Start < end {
		return false
	}
	l.setBounds(l.root, i, start, end)
	return true
}

func (l *List[K, V]) setBounds(n *node[K, V], i int, start, end K) {
	if n.leaf() {
		n.items[i].Start, n.items[i].End = start, end
		return
	}
	k, j := n.kidAt(i)
	l.setBounds(n.kids[k].n, j, start, end)
	n.kids[k] = n.kids[k].n.summary()
}

// Largest is the size of the largest range (0 when there is none).
func (l *List[K, V]) Largest() uint64 {
	if l.root == nil {
		return 0
	}
	return l.root.summary().big
}

// FirstFit returns the index of the first range at or after index from
// whose size is at least size (Len if none), descending only into
// subtrees that hold one.
func (l *List[K, V]) FirstFit(from int, size uint64) int {
	if l.root == nil || from >= l.n {
		return l.n
	}
	if i, ok := firstFit(l.root, 0, max(from, 0), size); ok {
		return i
	}
	return l.n
}

func firstFit[K ~uint64, V any](n *node[K, V], base, from int, size uint64) (int, bool) {
	if n.leaf() {
		for j := max(0, from-base); j < len(n.items); j++ {
			if n.items[j].Size() >= size {
				return base + j, true
			}
		}
		return 0, false
	}
	for k := range n.kids {
		c := &n.kids[k]
		if base+c.count > from && c.big >= size {
			if i, ok := firstFit(c.n, base, from, size); ok {
				return i, true
			}
		}
		base += c.count
	}
	return 0, false
}

// All iterates over the ranges in address order. The list must not change
// while it runs.
func (l *List[K, V]) All() iter.Seq2[int, *Item[K, V]] { return l.From(0) }

// From iterates over the ranges from index i on, in address order, at
// O(1) a range after the first. The list must not change while it runs.
func (l *List[K, V]) From(i int) iter.Seq2[int, *Item[K, V]] {
	return func(yield func(int, *Item[K, V]) bool) {
		if i < 0 || i >= l.n {
			return
		}
		lf, j := l.leafAt(i)
		for ; lf != nil; lf, j = lf.next, 0 {
			for ; j < len(lf.items); j++ {
				if !yield(i, &lf.items[j]) {
					return
				}
				i++
			}
		}
	}
}

// After iterates over the ranges that end after x, in address order: the
// one holding x, if any, then those after it — what From(Search(x))
// iterates, without the indices, and so with one descent by key and no
// counting. The list must not change while it runs.
func (l *List[K, V]) After(x K) iter.Seq[*Item[K, V]] {
	return func(yield func(*Item[K, V]) bool) {
		if l.root == nil {
			return
		}
		lf, j := l.leafFor(x)
		if j > 0 && lf.items[j-1].End > x {
			j--
		}
		for ; lf != nil; lf, j = lf.next, 0 {
			for ; j < len(lf.items); j++ {
				if !yield(&lf.items[j]) {
					return
				}
			}
		}
	}
}

// Backward iterates over the ranges below index i, last first. The list
// must not change while it runs.
func (l *List[K, V]) Backward(i int) iter.Seq2[int, *Item[K, V]] {
	return func(yield func(int, *Item[K, V]) bool) {
		i = min(i, l.n)
		if i <= 0 {
			return
		}
		i--
		lf, j := l.leafAt(i)
		for ; lf != nil; lf = lf.prev {
			for ; j >= 0; j-- {
				if !yield(i, &lf.items[j]) {
					return
				}
				i--
			}
			if lf.prev != nil {
				j = len(lf.prev.items) - 1
			}
		}
	}
}

// Clear empties the list. A list that fitted one leaf keeps it, so that
// a list emptied and filled again — a page table whose last mapping goes
// and comes back — allocates nothing.
func (l *List[K, V]) Clear() {
	if l.root != nil && l.root.leaf() {
		clear(l.root.items)
		l.root.items = l.root.items[:0]
	} else {
		l.root = nil
	}
	l.n = 0
}

// Check verifies the invariants and returns every violation, as assertion
// failures naming the ranges.
func (l *List[K, V]) Check() error {
	var errs error
	fail := func(format string, args ...any) {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf(format, args...))
	}
	if l.root == nil {
		if l.n != 0 {
			fail("ranges: an empty tree counts %d ranges", l.n)
		}
		return errs
	}
	// The shape and the summaries.
	var leaves []*node[K, V]
	depth := -1
	var walk func(n *node[K, V], d int, root bool)
	walk = func(n *node[K, V], d int, root bool) {
		lo, hi := minOf(n), maxOf(n)
		if root && n.leaf() {
			lo = min(1, l.n) // an emptied list keeps its leaf
		} else if root {
			lo = 2 // an only child becomes the root
		}
		if s := n.size(); s < lo || s > hi {
			fail("ranges: a node at depth %d holds %d entries, not %d to %d", d, s, lo, hi)
		}
		if n.leaf() {
			if depth >= 0 && d != depth {
				fail("ranges: leaves at depths %d and %d", depth, d)
			}
			depth = d
			leaves = append(leaves, n)
			return
		}
		for k := range n.kids {
			c := n.kids[k]
			if c.n == nil {
				fail("ranges: a nil child at depth %d", d)
				continue
			}
			if want := c.n.summary(); want.count != c.count || want.first != c.first || want.big != c.big {
				fail("ranges: child %d at depth %d is summarised as %d ranges from %#x, largest %d; it holds %d from %#x, largest %d",
					k, d, c.count, c.first, c.big, want.count, want.first, want.big)
			}
			walk(c.n, d+1, false)
		}
	}
	walk(l.root, 0, true)
	for j, lf := range leaves {
		var prev, next *node[K, V]
		if j > 0 {
			prev = leaves[j-1]
		}
		if j+1 < len(leaves) {
			next = leaves[j+1]
		}
		if lf.prev != prev || lf.next != next {
			fail("ranges: leaf %d of %d is linked out of order", j, len(leaves))
		}
	}
	// The ranges themselves.
	count := 0
	var prev *Item[K, V]
	for _, lf := range leaves {
		for j := range lf.items {
			it := &lf.items[j]
			if it.Start >= it.End {
				errs = errors.CombineErrors(errs, errors.AssertionFailedf("ranges: range %d [%#x, %#x) is empty", count, it.Start, it.End))
			}
			if prev != nil && prev.End > it.Start {
				errs = errors.CombineErrors(errs, errors.AssertionFailedf("ranges: ranges %d [%#x, %#x) and %d [%#x, %#x) overlap or are out of order",
					count-1, prev.Start, prev.End, count, it.Start, it.End))
			}
			prev = it
			count++
		}
	}
	if count != l.n {
		fail("ranges: the tree holds %d ranges and counts %d", count, l.n)
	}
	return errs
}
