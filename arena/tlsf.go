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

// find returns a free block of at least u quanta of q bytes, or nil.
func (t *tlsf) find(u, q uint64) *block {
	fl, sl := bucket(u)
	// Round up to the next list boundary: every block there fits.
	if fl >= slBits {
		r := u + (1 << (fl - slBits)) - 1
		if r >= u {
			fl, sl = bucket(r)
		}
	}
	if b := t.search(fl, sl); b != nil {
		return b
	}
	// The request's own list may still hold a block that fits: scan it
	// rather than grow the arena for want of one.
	fl, sl = bucket(u)
	for b := t.heads[fl][sl]; b != nil; b = b.fnext {
		if b.size/q >= u {
			return b
		}
	}
	return nil
}

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
