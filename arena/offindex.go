package arena

import "math/bits"

// offIndex maps the offsets of a heap's used blocks to their slots: an
// open-addressing table with linear probing, holding no pointers, so the
// garbage collector never walks it however many allocations are live, and
// a lookup is one probe sequence in a flat array (Free's path). Keys are
// stored plus one, so that zero marks an empty slot; deletion shifts the
// entries after it back (no tombstones), so probe sequences stay short
// under any mix of puts and deletes.
//
// Invariants (checked by check): every key sits in the run of occupied
// slots that starts at its home slot; n counts the keys; the load stays at
// most 3/4.
type offIndex struct {
	slots []indexSlot
	n     int
	shift uint8 // 64 - log2(len(slots))
}

// indexSlot is a key and its value side by side: a lookup touches one
// cache line, not one in each of two arrays.
type indexSlot struct {
	key uint64 // offset + 1; 0 is an empty slot
	val bref
}

// minIndexSlots is the smallest table; it is made on the first put.
const minIndexSlots = 64

// home is the slot key's probe sequence starts at (Fibonacci hashing: the
// high bits of the product, which every bit of the key moves).
func (x *offIndex) home(key uint64) uint64 {
	return (key * 0x9E3779B97F4A7C15) >> x.shift
}

// get returns the slot recorded for off, or 0.
func (x *offIndex) get(off uint64) bref {
	if x.n == 0 {
		return 0
	}
	key, mask := off+1, uint64(len(x.slots)-1)
	for i := x.home(key); ; i = (i + 1) & mask {
		switch x.slots[i].key {
		case key:
			return x.slots[i].val
		case 0:
			return 0
		}
	}
}

// put records r for off, replacing any record of it.
func (x *offIndex) put(off uint64, r bref) {
	if (x.n+1)*4 > len(x.slots)*3 {
		x.resize(max(minIndexSlots, 2*len(x.slots)))
	}
	key, mask := off+1, uint64(len(x.slots)-1)
	for i := x.home(key); ; i = (i + 1) & mask {
		switch x.slots[i].key {
		case key:
			x.slots[i].val = r
			return
		case 0:
			x.slots[i] = indexSlot{key, r}
			x.n++
			return
		}
	}
}

// del removes off's record and reports whether there was one.
func (x *offIndex) del(off uint64) bool {
	if x.n == 0 {
		return false
	}
	key, mask := off+1, uint64(len(x.slots)-1)
	i := x.home(key)
	for ; x.slots[i].key != key; i = (i + 1) & mask {
		if x.slots[i].key == 0 {
			return false
		}
	}
	// Shift back each later entry of the run whose home does not lie
	// cyclically in (i, j]: with i empty it would no longer be found.
	for j := (i + 1) & mask; x.slots[j].key != 0; j = (j + 1) & mask {
		k := x.home(x.slots[j].key)
		if (j-k)&mask >= (j-i)&mask {
			x.slots[i] = x.slots[j]
			i = j
		}
	}
	x.slots[i] = indexSlot{}
	x.n--
	if x.n*8 < len(x.slots) && len(x.slots) > minIndexSlots {
		x.resize(len(x.slots) / 2)
	}
	return true
}

// resize rehashes into a table of slots entries (a power of two).
func (x *offIndex) resize(slots int) {
	old := x.slots
	x.slots = make([]indexSlot, slots)
	x.shift = uint8(65 - bits.Len64(uint64(slots)))
	mask := uint64(slots - 1)
	for _, e := range old {
		if e.key == 0 {
			continue
		}
		i := x.home(e.key)
		for x.slots[i].key != 0 {
			i = (i + 1) & mask
		}
		x.slots[i] = e
	}
}

// len is the number of records.
func (x *offIndex) len() int { return x.n }

// all calls fn for every record, in no particular order; fn must not
// change the index.
func (x *offIndex) all(fn func(off uint64, r bref)) {
	for _, e := range x.slots {
		if e.key != 0 {
			fn(e.key-1, e.val)
		}
	}
}

// check verifies the invariants in the type's doc.
func (x *offIndex) check(fail func(format string, args ...any)) {
	if len(x.slots) == 0 {
		if x.n != 0 {
			fail("arena: used-block index counts %d records in no table", x.n)
		}
		return
	}
	mask := uint64(len(x.slots) - 1)
	n := 0
	for j, e := range x.slots {
		if e.key == 0 {
			continue
		}
		n++
		for i := x.home(e.key); i != uint64(j); i = (i + 1) & mask {
			if x.slots[i].key == 0 {
				fail("arena: used-block index: offset %#x is out of its probe run", e.key-1)
				break
			}
		}
	}
	if n != x.n || n*4 > len(x.slots)*3 {
		fail("arena: used-block index holds %d records, counts %d, in %d slots", n, x.n, len(x.slots))
	}
}
