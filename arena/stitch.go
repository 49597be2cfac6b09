package arena

import (
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// Stitching, as GMLake does: when a request fits no free block and
// committing more would take the allocator past its budget, but its free
// blocks hold enough whole chunks, those physical chunks are mapped side by
// side in a second range (the stitch range, a Sparse that borrows them) and
// the request is served there — no copy and no new memory, one map event.
// While the stitched allocation lives, the chunks' own ranges are lent to
// it (neither free nor allocatable, and pinned in the allocator's range so
// they cannot be given back); Free unmaps the stitch and returns them.

// stitched is an allocation served by stitching: [off, off+size) of the
// stitch range maps, back to back, the chunks of the lent blocks parts.
type stitched struct {
	off, size uint64
	parts     []bref // slots of the large heap
	req       uint64
}

// stitchAt returns the stitched allocation starting at p, or nil.
func (al *Allocator) stitchAt(p driver.Addr) *stitched {
	if al.st == nil || !al.st.Range().Contains(p) {
		return nil
	}
	return al.stitches[uint64(p-al.st.Base())]
}

// stitchLocked serves fp bytes by stitching whole free chunks. ok is false
// when they are too few (or the stitch range has no room): nothing
// changed. The chunks come from the free blocks with the fewest whole
// chunks first — chunks stranded between live blocks, the least use to a
// contiguous request — and the last block gives whole chunks up to the
// size needed, so the stitched allocation may be a little larger than
// asked.
func (al *Allocator) stitchLocked(fp, req uint64) (driver.Addr, bool, error) {
	if al.st == nil || fp < al.cs {
		return 0, false, nil
	}
	want := alignUp(fp, al.cs)
	h := al.heaps[large]
	if h.chunky.bytes < want {
		return 0, false, nil
	}
	var picks []take
	var got uint64
	h.chunky.ascending(&h.slab, func(r bref) bool {
		b := h.at(r)
		hi := b.whi
		if got+hi-b.wlo > want {
			c, _ := h.s.chunkAt(b.wlo + want - got - 1)
			hi = c.end
		}
		picks = append(picks, take{h, r, b.wlo, hi})
		got += hi - b.wlo
		return got < want
	})
	if got < want || len(picks) < 2 && h.at(picks[0].b).size >= fp {
		return 0, false, nil // one free block holds it: the free lists are the way
	}
	off, ok := al.stFree.Alloc(got, al.cs)
	if !ok {
		return 0, false, nil
	}
	var offs []uint64
	for _, p := range picks {
		offs = h.s.chunkStarts(offs, p.lo, p.hi)
	}
	if err := al.st.borrow(off, h.s, offs); err != nil {
		return 0, false, errors.CombineErrors(errors.Wrap(err, "arena: stitching"), al.stFree.Free(off, got))
	}
	st := &stitched{off: off, size: got, req: req}
	for _, p := range picks {
		st.parts = append(st.parts, h.lend(p, st))
	}
	al.stitches[off] = st
	al.held += got
	al.stats.Stitches++
	return al.st.Base() + driver.Addr(off), true, nil
}

// lend cuts t's chunks out of its free block and marks them lent to st.
func (h *heap) lend(t take, st *stitched) bref {
	h.removeFree(t.b)
	h.carve(t.b, t.lo, t.hi, h.addFree)
	b := h.at(t.b)
	b.state, b.lent = blockLent, st.off+1
	return t.b
}

// unstitchLocked unmaps a stitched allocation and returns its chunks'
// ranges to the free space.
func (al *Allocator) unstitchLocked(st *stitched) error {
	if err := al.st.Decommit(st.off, st.size); err != nil {
		return errors.WithAssertionFailure(errors.Wrapf(err, "arena: free of the stitched allocation at %s", al.st.Base()+driver.Addr(st.off)))
	}
	if err := al.stFree.Free(st.off, st.size); err != nil {
		return errors.WithAssertionFailure(err)
	}
	h := al.heaps[large]
	for _, part := range st.parts {
		h.at(part).lent = 0
		h.addFree(h.coalesce(part, blockFree))
	}
	delete(al.stitches, st.off)
	al.held -= st.size
	al.stats.Allocated -= st.req
	return nil
}
