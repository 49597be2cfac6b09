package arena

import "math/bits"

// Free blocks are kept in TLSF (two-level segregated fit) lists: the first
// level splits sizes by powers of two, the second splits each power into 16
// equal ranges. Finding a free block that fits, inserting and removing one
// are O(1): two bitmaps say which lists are non-empty. TLSF is a good fit,
// not an exact best fit — a request is rounded up to the next list boundary
// so that any block found fits — and its fragmentation stays close to best
// fit (Masmano et al., ECRTS 2004). Sizes here count quanta (the policy's
// start alignment), so every block size is a whole number of them.

const (
	slBits  = 4
	slCount = 1 << slBits
	flCount = 64
)

type tlsf struct {
	flBitmap uint64
	slBitmap [flCount]uint32
	heads    [flCount][slCount]bref // list heads, slots of the heap's slab
}

// bucket maps a size in quanta (u >= 1) to its list.
func bucket(u uint64) (fl, sl int) {
	fl = bits.Len64(u) - 1
	if fl < slBits {
		return fl, int(u<<(slBits-fl)) & (slCount - 1)
	}
	return fl, int(u>>(fl-slBits)) & (slCount - 1)
}

func (t *tlsf) insert(sl *slab, r bref, q uint64) {
	b := sl.at(r)
	f, l := bucket(b.size / q)
	b.fprev, b.fnext = 0, t.heads[f][l]
	if b.fnext != 0 {
		sl.at(b.fnext).fprev = r
	}
	t.heads[f][l] = r
	t.flBitmap |= 1 << f
	t.slBitmap[f] |= 1 << l
}

func (t *tlsf) remove(sl *slab, r bref, q uint64) {
	b := sl.at(r)
	f, l := bucket(b.size / q)
	if b.fprev != 0 {
		sl.at(b.fprev).fnext = b.fnext
	} else {
		t.heads[f][l] = b.fnext
	}
	if b.fnext != 0 {
		sl.at(b.fnext).fprev = b.fprev
	}
	b.fprev, b.fnext = 0, 0
	if t.heads[f][l] == 0 {
		t.slBitmap[f] &^= 1 << l
		if t.slBitmap[f] == 0 {
			t.flBitmap &^= 1 << f
		}
	}
}

// find returns a free block of at least u quanta of q bytes, or 0: the
// first exact fit among the first few in the request's own list, else the
// smallest of those that fit, else the smallest of the first few in the
// next non-empty list (each of which fits). Looking at a few rather than
// the head alone leaves fewer odd fragments behind (a best fit, not merely
// a good one); stopping at an exact fit, which none can beat, keeps the
// common case — a request the size of a recent free — O(1) in time and in
// cache lines touched.
func (t *tlsf) find(sl *slab, u, q uint64) bref {
	f, l := bucket(u)
	var best bref
	var bestB *block
	n := 0
	for r := t.heads[f][l]; r != 0 && n < fitScan; {
		b := sl.at(r)
		if b.size == u*q {
			return r // an exact fit: none is smaller (below the first 16 sizes, every block of a list is one)
		}
		if b.size/q >= u && (best == 0 || b.size < bestB.size || b.size == bestB.size && b.off < bestB.off) {
			best, bestB = r, b
		}
		r = b.fnext
		n++
	}
	if best != 0 {
		return best
	}
	// Every block of a later list fits: take the smallest of its first few.
	if l+1 < slCount {
		best = t.search(f, l+1)
	} else {
		best = t.search(f+1, 0)
	}
	if best == 0 {
		return 0
	}
	bestB = sl.at(best)
	n = 0
	for r := bestB.fnext; r != 0 && n < fitScan; {
		b := sl.at(r)
		if b.size < bestB.size || b.size == bestB.size && b.off < bestB.off {
			best, bestB = r, b
		}
		r = b.fnext
		n++
	}
	return best
}

// fitScan is how many blocks of a list find compares.
const fitScan = 16

// search returns the head of the first non-empty list at or after (fl, sl).
func (t *tlsf) search(fl, sl int) bref {
	if fl >= flCount {
		return 0
	}
	if m := t.slBitmap[fl] & (^uint32(0) << sl); m != 0 {
		return t.heads[fl][bits.TrailingZeros32(m)]
	}
	if fl+1 >= flCount {
		return 0
	}
	m := t.flBitmap & (^uint64(0) << (fl + 1))
	if m == 0 {
		return 0
	}
	f := bits.TrailingZeros64(m)
	return t.heads[f][bits.TrailingZeros32(t.slBitmap[f])]
}

// largest returns the size of the largest free block, in bytes.
func (t *tlsf) largest(sl *slab) uint64 {
	if t.flBitmap == 0 {
		return 0
	}
	fl := 63 - bits.LeadingZeros64(t.flBitmap)
	l := 31 - bits.LeadingZeros32(t.slBitmap[fl])
	var m uint64
	for r := t.heads[fl][l]; r != 0; r = sl.at(r).fnext {
		m = max(m, sl.at(r).size)
	}
	return m
}
