package arena

import "math/bits"

// The indexes of free blocks that growth, giving back and stitching
// search: index chunkyIndex holds the free blocks with whole chunks inside
// (keyed by the bytes of those chunks), edgeIndex the free blocks beside a
// hole (keyed by their size). Each is a sizeList linked through the
// block's links[index].
const (
	chunkyIndex = iota
	edgeIndex
)

// A sizeList is a set of a heap's blocks bucketed by a size, as the TLSF
// free lists are (tlsf.go: a power of two, then sixteenths of it): insert
// and remove are O(1), and a walk from the largest bucket down or from the
// smallest up meets blocks in size order to within a sixteenth. A block's
// key must not change while it is listed.
type sizeList struct {
	index    int    // which of a block's links and listed marks
	unit     uint64 // the key's unit (a block's key is a multiple of it)
	flBitmap uint64
	slBitmap [flCount]uint32
	heads    [flCount][slCount]bref
	n        int
	bytes    uint64 // the sum of the keys
}

// key is what b is bucketed by.
func (l *sizeList) key(b *block) uint64 {
	if l.index == chunkyIndex {
		return b.whi - b.wlo
	}
	return b.size
}

func (l *sizeList) insert(sl *slab, r bref) {
	b := sl.at(r)
	k := l.key(b)
	f, s := bucket(max(k/l.unit, 1))
	lk := &b.links[l.index]
	lk[0], lk[1] = 0, l.heads[f][s]
	if lk[1] != 0 {
		sl.at(lk[1]).links[l.index][0] = r
	}
	l.heads[f][s] = r
	l.flBitmap |= 1 << f
	l.slBitmap[f] |= 1 << s
	b.listed[l.index] = true
	l.n++
	l.bytes += k
}

func (l *sizeList) remove(sl *slab, r bref) {
	b := sl.at(r)
	k := l.key(b)
	f, s := bucket(max(k/l.unit, 1))
	lk := &b.links[l.index]
	if lk[0] != 0 {
		sl.at(lk[0]).links[l.index][1] = lk[1]
	} else {
		l.heads[f][s] = lk[1]
	}
	if lk[1] != 0 {
		sl.at(lk[1]).links[l.index][0] = lk[0]
	}
	lk[0], lk[1] = 0, 0
	if l.heads[f][s] == 0 {
		l.slBitmap[f] &^= 1 << s
		if l.slBitmap[f] == 0 {
			l.flBitmap &^= 1 << f
		}
	}
	b.listed[l.index] = false
	l.n--
	l.bytes -= k
}

// descending calls fn with the listed blocks, the largest buckets first,
// until it returns false. fn must not change the list.
func (l *sizeList) descending(sl *slab, fn func(r bref) bool) {
	for fm := l.flBitmap; fm != 0; {
		f := bits.Len64(fm) - 1
		fm &^= 1 << f
		for sm := l.slBitmap[f]; sm != 0; {
			s := bits.Len32(sm) - 1
			sm &^= 1 << s
			for r := l.heads[f][s]; r != 0; r = sl.at(r).links[l.index][1] {
				if !fn(r) {
					return
				}
			}
		}
	}
}

// ascending calls fn with the listed blocks, the smallest buckets first,
// until it returns false. fn must not change the list.
func (l *sizeList) ascending(sl *slab, fn func(r bref) bool) {
	for fm := l.flBitmap; fm != 0; {
		f := bits.TrailingZeros64(fm)
		fm &^= 1 << f
		for sm := l.slBitmap[f]; sm != 0; {
			s := bits.TrailingZeros32(sm)
			sm &^= 1 << s
			for r := l.heads[f][s]; r != 0; r = sl.at(r).links[l.index][1] {
				if !fn(r) {
					return
				}
			}
		}
	}
}

// check verifies that every listed block is marked listed, in its bucket,
// and counted.
func (l *sizeList) check(sl *slab, fail func(format string, args ...any)) {
	n, bytes := 0, uint64(0)
	for f := range l.heads {
		for s := range l.heads[f] {
			if (l.heads[f][s] != 0) != (l.slBitmap[f]&(1<<s) != 0) {
				fail("arena: index %d: bucket %d/%d and its bitmap disagree", l.index, f, s)
			}
			prev := bref(0)
			for r := l.heads[f][s]; r != 0; r = sl.at(r).links[l.index][1] {
				b := sl.at(r)
				if !b.listed[l.index] || b.links[l.index][0] != prev {
					fail("arena: index %d: block at %#x is linked but not marked, or linked back wrong", l.index, b.off)
				}
				if bf, bs := bucket(max(l.key(b)/l.unit, 1)); bf != f || bs != s {
					fail("arena: index %d: block at %#x is in the wrong bucket", l.index, b.off)
				}
				n++
				bytes += l.key(b)
				prev = r
			}
		}
		if (l.slBitmap[f] != 0) != (l.flBitmap&(1<<f) != 0) {
			fail("arena: index %d: level %d and its bitmap disagree", l.index, f)
		}
	}
	if n != l.n || bytes != l.bytes {
		fail("arena: index %d lists %d blocks of %d bytes, counts %d of %d", l.index, n, bytes, l.n, l.bytes)
	}
}
