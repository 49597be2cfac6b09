package memsvg

import "sort"

// How granules become cells. A cell draws per granules (1, or the least
// power of two that keeps the picture within MaxCells); a stretch of
// minGap cells or more with nothing mapped is drawn as one bar (a gap)
// rather than cell by cell, so a 64 GiB reservation with three granules
// mapped is three cells and two bars, at one granule a cell. Everything
// here costs the spans and the cells drawn, never the granules of a
// range: a terabyte reservation is as cheap as a megabyte one.

// minGap is the fewest cells of nothing but reserved granules drawn as one
// bar.
const minGap = 16

// cell is what one cell draws: granules [g0, g1) of a range; or, when gap
// is set, a stretch of reserved granules drawn as one bar.
type cell struct {
	g0, g1 uint64
	gap    bool
	// state is the most accessible state of its granules; chunk, device,
	// start and access are those of the first granule in that state
	// (unused when reserved).
	state    State
	chunk    uint64
	device   int
	start    uint64 // where the chunk's mapping begins in the range
	access   []Access
	released bool
	// aliased: some granule is of a chunk mapped twice or more; mixed:
	// its granules are not all of one state and one mapping.
	aliased, mixed bool
	counts         Counts
}

// piece is cells [c0, c1) of a range: drawn one by one, or as one gap.
type piece struct {
	c0, c1 uint64
	gap    bool
}

// pieces cuts range r, at per granules a cell, into the stretches drawn
// cell by cell (those with memory, and short reserved ones between) and
// the gaps, in address order.
func (r *Range) pieces(gran, per uint64) []piece {
	ncells := (r.Size/gran + per - 1) / per
	var out []piece
	add := func(c0, c1 uint64, gap bool) {
		if c0 >= c1 {
			return
		}
		if n := len(out); n > 0 && !gap && !out[n-1].gap && out[n-1].c1 == c0 {
			out[n-1].c1 = c1
			return
		}
		out = append(out, piece{c0, c1, gap})
	}
	at := uint64(0) // cells before at are placed
	for _, s := range r.Spans {
		if s.State == Reserved {
			continue
		}
		c0 := s.Offset / gran / per
		c1 := ((s.Offset+s.Size)/gran + per - 1) / per
		if c0 > at {
			add(at, c0, c0-at >= minGap)
		}
		add(max(at, c0), c1, false)
		at = max(at, c1)
	}
	add(at, ncells, ncells-at >= minGap)
	return out
}

// drawn is how many cells range r draws at per granules a cell, gaps not
// counted.
func (r *Range) drawn(gran, per uint64) uint64 {
	var n uint64
	for _, pc := range r.pieces(gran, per) {
		if !pc.gap {
			n += pc.c1 - pc.c0
		}
	}
	return n
}

// cells lays range r out at per granules a cell: its cells and gaps in
// address order (the last cell may be short). aliased says which chunks
// are mapped more than once.
func (r *Range) cells(gran, per uint64, aliased map[uint64]bool) []cell {
	n := r.Size / gran
	pcs := r.pieces(gran, per)
	var cs []cell
	// first[i] is the index in cs of the first cell of pieces[i].
	first := make([]int, len(pcs))
	for i, pc := range pcs {
		first[i] = len(cs)
		if pc.gap {
			g0, g1 := pc.c0*per, min(n, pc.c1*per)
			cs = append(cs, cell{g0: g0, g1: g1, gap: true, counts: Counts{Reserved: g1 - g0}})
			continue
		}
		for c := pc.c0; c < pc.c1; c++ {
			g0, g1 := c*per, min(n, (c+1)*per)
			cs = append(cs, cell{g0: g0, g1: g1, counts: Counts{Reserved: g1 - g0}})
		}
	}
	// maps[k] counts the mappings met in cell k, up to 2; last[k] is the
	// last one met.
	maps := make([]uint8, len(cs))
	last := make([]uint64, len(cs))
	for _, s := range r.Spans {
		if s.State == Reserved {
			continue // counted reserved already
		}
		g0, g1 := s.Offset/gran, (s.Offset+s.Size)/gran
		c0 := g0 / per
		i := sort.Search(len(pcs), func(i int) bool { return pcs[i].c1 > c0 })
		if i == len(pcs) || pcs[i].gap {
			continue // cannot be: a span with memory is in no gap
		}
		for k := first[i] + int(c0-pcs[i].c0); k < len(cs) && !cs[k].gap && cs[k].g0 < g1; k++ {
			c := &cs[k]
			if c.g1 <= g0 {
				continue
			}
			m := min(g1, c.g1) - max(g0, c.g0)
			c.counts.Reserved -= m
			c.counts.add(s.State, m)
			start := s.Offset - s.ChunkOffset
			if maps[k] == 0 || (maps[k] == 1 && last[k] != start) {
				maps[k]++
				last[k] = start
			}
			c.aliased = c.aliased || aliased[s.Chunk]
			if s.State > c.state {
				c.state, c.chunk, c.device, c.start, c.access, c.released = s.State, s.Chunk, s.Device, start, s.Access, s.Released
			}
		}
	}
	for k := range cs {
		c := &cs[k]
		full := c.g1 - c.g0
		c.mixed = maps[k] > 1 || (c.counts.Reserved != full && c.counts.Mapped != full && c.counts.Accessible != full)
	}
	return cs
}

// perCell is how many granules a cell draws: 1, or the least power of two
// that keeps the picture within MaxCells drawn.
func (p *Picture) perCell() uint64 {
	var most uint64 // granules of the largest range: past it, a range is one cell
	for _, r := range p.Ranges {
		most = max(most, r.Size/p.Granule)
	}
	per := uint64(1)
	for per < most && drawnAt(p, per) > MaxCells {
		per *= 2
	}
	return per
}

// drawnAt is the number of cells the picture draws at per granules a
// cell, gaps not counted.
func drawnAt(p *Picture, per uint64) uint64 {
	var n uint64
	for i := range p.Ranges {
		n += p.Ranges[i].drawn(p.Granule, per)
	}
	return n
}
