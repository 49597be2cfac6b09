package physical

import "github.com/vmarena/vmarena/driver"

// table is a Memory's chunks by handle. The drivers of this module issue
// handles whose low 32 bits are a slot index plus one, the slots dense
// and the one a release emptied taken by the next create
// (driver/internal/ledger): a chunk lives in dense at that index, so the
// books a create, a lookup and a return touch are the ones the last
// touched, where a map keyed by handle would scatter them over memory
// once there are a million. A handle that does not fit — its index far
// beyond the chunks there are, or its place taken by a live chunk (a
// driver that numbers its handles otherwise) — goes in the map instead:
// any handles work, only not as fast.
type table struct {
	dense []*Chunk
	other map[driver.Handle]*Chunk
	n     int // chunks in both
}

// denseSlack is how far past twice the chunks listed a handle's index may
// lie and still grow dense to it: dense is never longer than twice the
// most chunks listed at once and the slack, however a driver numbers its
// handles.
const denseSlack = 1024

// index is the index in dense that h names, or -1.
func index(h driver.Handle) int {
	return int(uint32(h)) - 1
}

// get returns the chunk listed under h, or nil.
func (t *table) get(h driver.Handle) *Chunk {
	if i := index(h); i >= 0 && i < len(t.dense) {
		if c := t.dense[i]; c != nil && c.handle == h {
			return c
		}
	}
	if len(t.other) == 0 {
		return nil
	}
	return t.other[h]
}

// add lists c, whose handle is listed nowhere.
func (t *table) add(c *Chunk) {
	i := index(c.handle)
	if i >= len(t.dense) && uint64(i) < 2*uint64(t.n)+denseSlack {
		t.dense = append(t.dense, make([]*Chunk, i+1-len(t.dense))...)
	}
	t.n++
	if i >= 0 && i < len(t.dense) && t.dense[i] == nil {
		t.dense[i] = c
		return
	}
	if t.other == nil {
		t.other = map[driver.Handle]*Chunk{}
	}
	t.other[c.handle] = c
}

// remove takes c, which is listed, off the list.
func (t *table) remove(c *Chunk) {
	t.n--
	if i := index(c.handle); i >= 0 && i < len(t.dense) && t.dense[i] == c {
		t.dense[i] = nil
		return
	}
	delete(t.other, c.handle)
}

// all yields every listed chunk: dense by index, then the others in no
// order.
func (t *table) all(yield func(*Chunk) bool) {
	for _, c := range t.dense {
		if c != nil && !yield(c) {
			return
		}
	}
	for _, c := range t.other {
		if !yield(c) {
			return
		}
	}
}
