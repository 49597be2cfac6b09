// Package memsvg draws the memory map of reservations as a self-contained
// SVG picture: every granule in one of the three memory states (reserved,
// mapped, accessible; the driver package names them), coloured by its
// state and by the device of the chunk behind it, chunks labelled and
// their boundaries drawn, and a chunk mapped at two places or more (an
// alias) outlined and listed. Offsets are in human units; a caption counts
// the granules of each state. Book keeps a memory map from the calls that
// change a driver's, and makes the Picture of it.
//
// It takes plain data (a Picture), never the library's types, so that it
// sits below every layer and anything may draw with it. It owns only the
// numbers it is given: it never touches memory. Its output is
// deterministic (the same Picture gives the same bytes) and bounded: past
// MaxCells granules, several are drawn to a cell, and the caption says so.
package memsvg

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/vmarena/vmarena/internal/errors"
)

// State is the state of a granule, as the driver package names them.
type State uint8

const (
	// Reserved: address space only, no memory behind it.
	Reserved State = iota
	// Mapped: a chunk backs it, no device may touch it yet.
	Mapped
	// Accessible: mapped, and readable or read-write for some device.
	Accessible
)

func (s State) String() string {
	switch s {
	case Reserved:
		return "reserved"
	case Mapped:
		return "mapped"
	case Accessible:
		return "accessible"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// Access is what a device may do at a granule.
type Access uint8

const (
	NoAccess Access = iota
	Read
	ReadWrite
)

func (a Access) String() string {
	switch a {
	case NoAccess:
		return "none"
	case Read:
		return "read"
	case ReadWrite:
		return "read-write"
	}
	return fmt.Sprintf("access(%d)", uint8(a))
}

// Span is a stretch [Offset, Offset+Size) of a range in one state, backed
// (unless reserved) by one chunk, with the same access throughout.
// Offset and Size are multiples of the picture's granule.
type Span struct {
	Offset, Size uint64
	State        State
	// Chunk names the chunk behind the span (its handle: "chunk 7"),
	// Device is the device it lives on, and ChunkOffset is where in the
	// chunk the span starts. Two spans of one chunk whose Offset -
	// ChunkOffset differ are two mappings of it: an alias. Unused when
	// reserved.
	Chunk       uint64
	Device      int
	ChunkOffset uint64
	// Released says that the chunk's handle is released: its memory stays
	// while it is mapped.
	Released bool
	// Access is what each device may do (index = device); nil when
	// reserved.
	Access []Access
}

// Mark labels an offset of a range: "slot 3", "head".
type Mark struct {
	Offset uint64
	Text   string
}

// Range is one reservation as drawn. Spans are in address order and do
// not overlap; what they leave uncovered of [0, Size) is reserved.
// Invariant (checked by Write): Size and every span's bounds are
// multiples of the picture's granule, and the spans lie inside.
type Range struct {
	Name  string // "reservation 0x7f0000000000", or what the caller calls it
	Base  uint64
	Size  uint64
	Spans []Span
	Marks []Mark
}

// MaxCells is how many cells a picture draws at most: a picture of more
// granules draws 2, 4, 8... granules to a cell, enough to stay under it.
const MaxCells = 1024

// Picture is what Write draws: a title, the ranges, a line or two of notes
// under the caption.
type Picture struct {
	Title string
	// Granule is the unit of the map, in bytes: the drivers' granularity.
	Granule uint64
	Ranges  []Range
	Notes   []string
}

// check refuses a picture Write cannot draw truthfully, naming the first
// fault.
func (p *Picture) check() error {
	if p.Granule == 0 {
		return errors.New("memsvg: the picture's granule is 0")
	}
	for i, r := range p.Ranges {
		if r.Size%p.Granule != 0 {
			return errors.Newf("memsvg: range %d (%s) is %d bytes, not a multiple of the %d-byte granule", i, r.Name, r.Size, p.Granule)
		}
		at := uint64(0)
		for j, s := range r.Spans {
			switch {
			case s.Size == 0 || s.Offset%p.Granule != 0 || s.Size%p.Granule != 0:
				return errors.Newf("memsvg: range %d span %d [%#x, +%#x) is empty or not on %d-byte granules", i, j, s.Offset, s.Size, p.Granule)
			case s.Offset < at:
				return errors.Newf("memsvg: range %d span %d at %#x overlaps or precedes the span before it, which ends at %#x", i, j, s.Offset, at)
			case s.Offset+s.Size > r.Size || s.Offset+s.Size < s.Offset:
				return errors.Newf("memsvg: range %d span %d [%#x, +%#x) runs past the range's %d bytes", i, j, s.Offset, s.Size, r.Size)
			case s.State > Accessible:
				return errors.Newf("memsvg: range %d span %d has no state %d", i, j, s.State)
			case s.State != Reserved && s.ChunkOffset > s.Offset:
				return errors.Newf("memsvg: range %d span %d at %#x starts %#x into its chunk: the chunk would begin before the range", i, j, s.Offset, s.ChunkOffset)
			}
			at = s.Offset + s.Size
		}
	}
	return nil
}

// Counts are granules by state.
type Counts struct {
	Reserved, Mapped, Accessible uint64
}

// Total is the granules counted.
func (c Counts) Total() uint64 { return c.Reserved + c.Mapped + c.Accessible }

func (c *Counts) add(s State, n uint64) {
	switch s {
	case Mapped:
		c.Mapped += n
	case Accessible:
		c.Accessible += n
	default:
		c.Reserved += n
	}
}

// count is the granules of r by state (spans not checked).
func (r *Range) count(gran uint64) Counts {
	c := Counts{Reserved: r.Size / gran}
	for _, s := range r.Spans {
		c.Reserved -= s.Size / gran
		c.add(s.State, s.Size/gran)
	}
	return c
}

// Counts is the picture's granules by state, over every range.
func (p *Picture) Counts() Counts {
	var c Counts
	for i := range p.Ranges {
		rc := p.Ranges[i].count(p.Granule)
		c.Reserved += rc.Reserved
		c.Mapped += rc.Mapped
		c.Accessible += rc.Accessible
	}
	return c
}

// place is one mapping of a chunk: where in which range it starts, and how
// much of it the spans show.
type place struct {
	rng   int
	start uint64 // offset in the range where the chunk's mapping begins
	size  uint64
}

// chunkMaps is a chunk and its mappings in the picture, in address order.
type chunkMaps struct {
	chunk    uint64
	device   int
	released bool
	places   []place
}

// aliased says whether the chunk is mapped at two places or more.
func (c *chunkMaps) aliased() bool { return len(c.places) > 1 }

// chunks lists the chunks the picture shows, each with its mappings, in
// the order of their first mapping. The spans of one mapping (its access
// changing along it) add up to one place.
func (p *Picture) chunks() []chunkMaps {
	byChunk := map[uint64]*chunkMaps{}
	for i, r := range p.Ranges {
		for _, s := range r.Spans {
			if s.State == Reserved {
				continue
			}
			c := byChunk[s.Chunk]
			if c == nil {
				c = &chunkMaps{chunk: s.Chunk, device: s.Device}
				byChunk[s.Chunk] = c
			}
			c.released = c.released || s.Released
			start := s.Offset - s.ChunkOffset
			if n := len(c.places); n > 0 && c.places[n-1].rng == i && c.places[n-1].start == start {
				c.places[n-1].size += s.Size
				continue
			}
			c.places = append(c.places, place{rng: i, start: start, size: s.Size})
		}
	}
	out := make([]chunkMaps, 0, len(byChunk))
	for _, c := range byChunk {
		out = append(out, *c)
	}
	// In address order: by where each is first mapped.
	slices.SortFunc(out, func(a, b chunkMaps) int {
		return cmp.Or(cmp.Compare(a.places[0].rng, b.places[0].rng), cmp.Compare(a.places[0].start, b.places[0].start), cmp.Compare(a.chunk, b.chunk))
	})
	return out
}
