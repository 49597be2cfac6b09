package ledger

import (
	"math"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// handles is the ledger's chunks by handle: a dense table of slots, where
// a map keyed by handle would scatter its entries over memory.
//
// A handle is a slot's index plus one in its low 32 bits (so no handle is
// zero) and the slot's generation in its high 32 bits. A slot whose chunk
// is forgotten goes on a free list, and the next chunk takes the slot the
// last one left (LIFO: the slot a create takes is the one a release just
// touched, still in the cache) with its generation one higher, so no
// handle is ever issued twice: a released handle names its slot at an old
// generation and is refused, as one never issued is. A slot at the last
// generation is retired instead of freed. The first chunk of each slot has
// generation zero: until a slot is reused, handles count up 1, 2, 3….
// The table names at most 2³²−1 slots, far more chunks than the records
// of them would fit in memory; it does not check for more.
type handles struct {
	slots []handleSlot
	free  []uint32 // indices of empty slots, the most recently emptied last
}

type handleSlot struct {
	c   *Chunk // nil while the slot is empty
	gen uint32 // the generation of the chunk in it, or of the last one
}

func handleOf(i int, gen uint32) driver.Handle {
	return driver.Handle(gen)<<32 | driver.Handle(uint32(i)+1)
}

// split returns h's slot index and generation; ok is false for a handle
// that names no slot of the table.
func (t *handles) split(h driver.Handle) (i int, gen uint32, ok bool) {
	lo := uint32(h)
	if lo == 0 || int(lo) > len(t.slots) {
		return 0, 0, false
	}
	return int(lo) - 1, uint32(h >> 32), true
}

// next is the handle add would give the next chunk.
func (t *handles) next() driver.Handle {
	if n := len(t.free); n > 0 {
		i := t.free[n-1]
		return handleOf(int(i), t.slots[i].gen+1)
	}
	return handleOf(len(t.slots), 0)
}

// add records c under c.Handle, which next returned.
func (t *handles) add(c *Chunk) {
	if n := len(t.free); n > 0 {
		i := t.free[n-1]
		t.free = t.free[:n-1]
		t.slots[i] = handleSlot{c: c, gen: t.slots[i].gen + 1}
		return
	}
	t.slots = append(t.slots, handleSlot{c: c})
}

// get returns the recorded chunk h, or nil; issued says whether h was
// ever given to a chunk.
func (t *handles) get(h driver.Handle) (c *Chunk, issued bool) {
	i, gen, ok := t.split(h)
	if !ok {
		return nil, false
	}
	s := &t.slots[i]
	if s.gen == gen {
		return s.c, true // nil: forgotten, its slot not yet reused
	}
	return nil, gen < s.gen
}

// remove forgets c, which is recorded.
func (t *handles) remove(c *Chunk) {
	i, _, _ := t.split(c.Handle)
	s := &t.slots[i]
	s.c = nil
	if s.gen < math.MaxUint32 {
		t.free = append(t.free, uint32(i))
	}
}

// all yields every recorded chunk, by slot.
func (t *handles) all(yield func(*Chunk) bool) {
	for _, s := range t.slots {
		if s.c != nil && !yield(s.c) {
			return
		}
	}
}

// check returns what is wrong with the table: a chunk under a handle not
// its own, or an empty slot neither free (once) nor retired.
func (t *handles) check(name string) error {
	var errs error
	fail := func(format string, args ...any) {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf(format, args...))
	}
	free := make(map[uint32]bool, len(t.free))
	for _, i := range t.free {
		switch {
		case int(i) >= len(t.slots):
			fail("%s: free slot %d of %d", name, i, len(t.slots))
		case free[i]:
			fail("%s: slot %d is free twice", name, i)
		case t.slots[i].c != nil:
			fail("%s: slot %d is free but holds chunk %d", name, i, t.slots[i].c.Handle)
		}
		free[i] = true
	}
	for i, s := range t.slots {
		if s.c == nil {
			if !free[uint32(i)] && s.gen != math.MaxUint32 {
				fail("%s: slot %d is empty, neither free nor retired", name, i)
			}
			continue
		}
		if h := handleOf(i, s.gen); s.c.Handle != h {
			fail("%s: chunk %d recorded under handle %d", name, s.c.Handle, h)
		}
	}
	return errs
}
