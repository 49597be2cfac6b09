package arena

import (
	"github.com/vmarena/vmarena/internal/errors"
)

// Stranded chunks: a chunk larger than edgeChunk that a live block covers
// in part.
//
// A commit cuts memory so that a large request's interior is one chunk of
// its own and what several requests share is at most edgeChunk (grow.go).
// When a large chunk is freed whole and a smaller request then lands on
// part of it, the allocator either splits it — gives it back and commits
// the request's own chunks: an unmap, a release, a create or two, a map
// and a grant — or lets the request strand it: no driver call, and the
// chunk's free rest is served to later requests as any free memory is,
// but the chunk cannot go back or move until it is wholly free again, so
// its free rest may sit committed at a peak.
//
// The allocator strands while the stranded chunks' bytes stay within the
// slack its budget allows beyond the live set (max(one chunk,
// live/SlackDivisor) by default), and splits past it: so stranding adds
// at most the slack to peak committed, the same bound the budget's own
// free memory has, and never more than maxStrands chunks are stranded at
// once. A stranded chunk is one of maxStrands entries, not a mark on the
// blocks: each free checks the few entries of its heap against the free
// block it made, so the books are exact and no operation walks the heap.
//
// Invariant (checkStrands): every entry is a committed chunk of its heap,
// larger than a ChunkSize, that no free block holds whole; their bytes
// sum to stranded.

// maxStrands is the most chunks stranded at once. Each is larger than
// edgeChunk, at least live/edgeDivisor, and together at most the slack,
// live/SlackDivisor: with the defaults sixteen at most reach the slack.
const maxStrands = edgeDivisor / 256

// stranded is one stranded chunk: [c.start, c.end) of the heap h.
type stranded struct {
	h *heap
	c span
}

// strandRoom says whether n more chunks of bytes in all may be stranded.
func (al *Allocator) strandRoom(n int, bytes uint64) bool {
	return al.nstrands+n <= maxStrands && al.stranded+bytes <= al.budget(al.held)-al.held
}

// strand records the chunk c of h, whole and free until now, as stranded
// by a request placed on part of it.
func (al *Allocator) strand(h *heap, c span) {
	al.stats.Strands++
	al.strands[al.nstrands] = stranded{h, c}
	al.nstrands++
	al.stranded += c.size()
}

// unstrand forgets the chunks of h that the free block m, just made by a
// free, holds whole: they may go back or move again.
func (al *Allocator) unstrand(h *heap, m bref) {
	b := h.at(m)
	for i := 0; i < al.nstrands; {
		if st := al.strands[i]; st.h == h && b.wlo <= st.c.start && st.c.end <= b.whi {
			al.stranded -= st.c.size()
			al.nstrands--
			al.strands[i] = al.strands[al.nstrands]
			al.strands[al.nstrands] = stranded{}
			continue
		}
		i++
	}
}

// checkStrands verifies the stranded chunks' invariant; the caller holds
// the allocator's lock.
func (al *Allocator) checkStrands() error {
	var errs error
	var sum uint64
	for _, st := range al.strands[:al.nstrands] {
		sum += st.c.size()
		h := st.h
		first, last := h.s.chunksAt(st.c.start, st.c.end-1)
		if first != st.c || last != st.c || st.c.size() <= h.cs {
			errs = errors.CombineErrors(errs, errors.AssertionFailedf("arena: stranded [%#x, %#x) is not one chunk larger than %d", st.c.start, st.c.end, h.cs))
		}
		if r := h.blockAt(st.c.start); r != 0 {
			if b := h.at(r); b.state == blockFree && b.wlo <= st.c.start && st.c.end <= b.whi {
				errs = errors.CombineErrors(errs, errors.AssertionFailedf("arena: stranded [%#x, %#x) lies whole in a free block", st.c.start, st.c.end))
			}
		}
	}
	if sum != al.stranded || al.nstrands > maxStrands {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf("arena: %d stranded chunks hold %d bytes, the count says %d", al.nstrands, sum, al.stranded))
	}
	return errs
}
