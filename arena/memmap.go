package arena

import (
	"cmp"
	"fmt"
	"slices"
)

// The allocator's memory map: a read-only copy of how its ranges are laid
// out, for reports and debugging. Nothing in it reaches back into the
// allocator.

// BlockKind is what a stretch of an allocator's range holds.
type BlockKind uint8

const (
	// BlockUsed is a live allocation, committed throughout.
	BlockUsed BlockKind = iota
	// BlockFree is committed memory no allocation uses.
	BlockFree
	// BlockUncommitted is address space with no memory behind it: never
	// committed, or given back to the device.
	BlockUncommitted
	// BlockLent is whole free chunks of the large heap lent to a stitched
	// allocation: mapped a second time, side by side, in the stitch range.
	BlockLent
	// BlockStitched is a stitched allocation in the stitch range: the
	// chunks of the blocks it borrows, mapped back to back.
	BlockStitched
)

func (k BlockKind) String() string {
	if int(k) < len(blockKindNames) {
		return blockKindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

var blockKindNames = [...]string{"used", "free", "uncommitted", "lent", "stitched"}

// MapBlock is a stretch [Offset, Offset+Size) of one of the allocator's
// ranges.
type MapBlock struct {
	// Range indexes the range in the list Ranges returns: the heaps' (small
	// requests, then large; one for a shareable allocator), then the stitch
	// range's.
	Range int
	// Offset is in bytes from the range's base.
	Offset, Size uint64
	Kind         BlockKind
	// Requested is what the allocation asked for (BlockUsed and
	// BlockStitched); Size is what it takes.
	Requested uint64
}

// MemoryMap returns a copy of the allocator's layout: each range in the
// order Ranges lists them, tiled in address order from offset 0 to its
// end. A heap's blocks are reported as they are (two neighbouring live
// allocations are two blocks); the stitch range is its stitched
// allocations with uncommitted stretches between them. A closed allocator
// has none. It walks every block and allocates the copy: a report's call,
// not a hot path's.
func (al *Allocator) MemoryMap() []MapBlock {
	if al.Closed() { // nil, zero or closed: nothing to draw
		return nil
	}
	al.mu.Lock()
	defer al.mu.Unlock()
	if al.closed {
		return nil
	}
	var out []MapBlock
	hs := al.distinct()
	for i, h := range hs {
		for r := h.head; r != 0; r = h.at(r).next {
			b := h.at(r)
			mb := MapBlock{Range: i, Offset: b.off, Size: b.size}
			switch b.state {
			case blockUsed:
				mb.Kind, mb.Requested = BlockUsed, b.req
				if b.bin != 0 {
					mb.Requested = uint64(h.bins.slabs[b.bin].reqs)
				}
			case blockFree:
				mb.Kind = BlockFree
			case blockHole:
				mb.Kind = BlockUncommitted
			case blockLent:
				mb.Kind = BlockLent
			}
			out = append(out, mb)
		}
	}
	if al.st == nil {
		return out
	}
	sts := make([]*stitched, 0, len(al.stitches))
	for _, st := range al.stitches {
		sts = append(sts, st)
	}
	slices.SortFunc(sts, func(a, b *stitched) int { return cmp.Compare(a.off, b.off) })
	at, rg := uint64(0), len(hs)
	for _, st := range sts {
		if st.off > at {
			out = append(out, MapBlock{Range: rg, Offset: at, Size: st.off - at, Kind: BlockUncommitted})
		}
		out = append(out, MapBlock{Range: rg, Offset: st.off, Size: st.size, Kind: BlockStitched, Requested: st.req})
		at = st.off + st.size
	}
	if end := al.st.Max(); at < end {
		out = append(out, MapBlock{Range: rg, Offset: at, Size: end - at, Kind: BlockUncommitted})
	}
	return out
}
