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
	heads    [flCount][slCount]*block
}

// bucket maps a size in quanta (u >= 1) to its list.
func bucket(u uint64) (fl, sl int) {
	fl = bits.Len64(u) - 1
	if fl < slBits {
		return fl, int(u<<(slBits-fl)) & (slCount - 1)
	}
	return fl, int(u>>(fl-slBits)) & (slCount - 1)
}

func (t *tlsf) insert(b *block, q uint64) {
	fl, sl := bucket(b.size / q)
	b.fprev, b.fnext = nil, t.heads[fl][sl]
	if b.fnext != nil {
		b.fnext.fprev = b
	}
	t.heads[fl][sl] = b
	t.flBitmap |= 1 << fl
	t.slBitmap[fl] |= 1 << sl
}

func (t *tlsf) remove(b *block, q uint64) {
	fl, sl := bucket(b.size / q)
	if b.fprev != nil {
		b.fprev.fnext = b.fnext
	} else {
		t.heads[fl][sl] = b.fnext
	}
	if b.fnext != nil {
		b.fnext.fprev = b.fprev
	}
	b.fprev, b.fnext = nil, nil
	if t.heads[fl][sl] == nil {
		t.slBitmap[fl] &^= 1 << sl
		if t.slBitmap[fl] == 0 {
			t.flBitmap &^= 1 << fl
		}
	}
}

// find returns a free block of at least u quanta of q bytes, or nil: the
// smallest of the first few in the request's own list that fit, else the
// smallest of the first few in the next non-empty list (each of which
// fits). Looking at a few rather than the head alone costs little and
// leaves fewer odd fragments behind (a best fit, not merely a good one).
func (t *tlsf) find(u, q uint64) *block {
	fl, sl := bucket(u)
	var best *block
	n := 0
	for b := t.heads[fl][sl]; b != nil && n < fitScan; b = b.fnext {
		if b.size/q >= u && (best == nil || b.size < best.size || b.size == best.size && b.off < best.off) {
			best = b
		}
		n++
	}
	if best != nil {
		return best
	}
	// Every block of a later list fits: take the smallest of its first few.
	if sl+1 < slCount {
		best = t.search(fl, sl+1)
	} else {
		best = t.search(fl+1, 0)
	}
	if best == nil {
		return nil
	}
	n = 0
	for b := best.fnext; b != nil && n < fitScan; b = b.fnext {
		if b.size < best.size || b.size == best.size && b.off < best.off {
			best = b
		}
		n++
	}
	return best
}

// fitScan is how many blocks of a list find compares.
const fitScan = 16

// search returns the head of the first non-empty list at or after (fl, sl).
func (t *tlsf) search(fl, sl int) *block {
	if fl >= flCount {
		return nil
	}
	if m := t.slBitmap[fl] & (^uint32(0) << sl); m != 0 {
		return t.heads[fl][bits.TrailingZeros32(m)]
	}
	if fl+1 >= flCount {
		return nil
	}
	m := t.flBitmap & (^uint64(0) << (fl + 1))
	if m == 0 {
		return nil
	}
	f := bits.TrailingZeros64(m)
	return t.heads[f][bits.TrailingZeros32(t.slBitmap[f])]
}

// largest returns the size of the largest free block, in bytes.
func (t *tlsf) largest() uint64 {
	if t.flBitmap == 0 {
		return 0
	}
	fl := 63 - bits.LeadingZeros64(t.flBitmap)
	sl := 31 - bits.LeadingZeros32(t.slBitmap[fl])
	var m uint64
	for b := t.heads[fl][sl]; b != nil; b = b.fnext {
		m = max(m, b.size)
	}
	return m
}
