package memsvg_test

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/memsvg"
	"github.com/vmarena/vmarena/internal/memsvg/svgtest"
	"github.com/vmarena/vmarena/internal/units"
)

const g = 2 * units.MiB

// render writes p and reads it back as a person would look at it.
func render(t *testing.T, p memsvg.Picture) (*svgtest.Doc, []byte) {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, memsvg.Write(&b, p))
	return svgtest.Parse(t, b.Bytes()), b.Bytes()
}

// twoDevices is a 64-granule range: a chunk of device 0 mapped at 0 (its
// first granule accessible to both devices, the second to none), a chunk of
// device 1 at 2 accessible to device 1, and chunk 3 of device 0 mapped
// twice, at 8 and at 20, accessible at 8 only.
func twoDevices() memsvg.Picture {
	rw, r, none := memsvg.ReadWrite, memsvg.Read, memsvg.NoAccess
	return memsvg.Picture{
		Title:   "two devices",
		Granule: g,
		Ranges: []memsvg.Range{{
			Name: "the reservation", Base: 0x7f0000000000, Size: 64 * g,
			Spans: []memsvg.Span{
				{Offset: 0, Size: g, State: memsvg.Accessible, Chunk: 1, Device: 0, Access: []memsvg.Access{rw, r}},
				{Offset: g, Size: g, State: memsvg.Mapped, Chunk: 1, Device: 0, ChunkOffset: g, Access: []memsvg.Access{none, none}},
				{Offset: 2 * g, Size: 2 * g, State: memsvg.Accessible, Chunk: 2, Device: 1, Access: []memsvg.Access{none, rw}},
				{Offset: 8 * g, Size: 2 * g, State: memsvg.Accessible, Chunk: 3, Device: 0, Access: []memsvg.Access{r, none}},
				{Offset: 20 * g, Size: 2 * g, State: memsvg.Mapped, Chunk: 3, Device: 0, Access: []memsvg.Access{none, none}},
			},
			Marks: []memsvg.Mark{{Offset: 8 * g, Text: "the alias"}},
		}},
		Notes: []string{"a note"},
	}
}

// TestWrite: a well-formed SVG whose root has a size and a viewBox, the
// title, the range's heading, its axis in human units, its counts, the
// legend of each colour drawn, and as many cells of each colour as there
// are granules in that state on that device; reserved granules are
// reserved cells or counted in a gap bar.
func TestWrite(t *testing.T) {
	p := twoDevices()
	d, _ := render(t, p)
	require.Equal(t, "two devices", d.Title)
	require.Equal(t, []string{"two devices"}, d.Texts["title"])
	require.Equal(t, []string{"the reservation: 128 MiB at 0x7f0000000000, 64 granules of 2 MiB"}, d.Texts["range"])
	require.Equal(t, []string{"64 granules: 56 reserved, 3 mapped, 5 accessible"}, d.Texts["counts"])
	require.Equal(t, memsvg.Counts{Reserved: 56, Mapped: 3, Accessible: 5}, d.Counts(t))
	require.Equal(t, memsvg.Counts{Reserved: 56, Mapped: 3, Accessible: 5}, p.Counts())
	require.Equal(t, []string{"+0 B", "+44 MiB", "+128 MiB", "(end)"}, d.Texts["axis"], "each row's offset, the gap's, the end")
	require.Equal(t, []string{"1: the alias (+16 MiB)"}, d.Texts["mark-list"])
	require.Equal(t, []string{"a note"}, d.Texts["note"])

	byFill := d.CellsByFill()
	for _, tc := range []struct {
		label string
		cells int
	}{
		{"a chunk on device 0, mapped: no device may access it yet", 3},
		{"a chunk on device 0, accessible: some device may read it", 3},
		{"a chunk on device 1, accessible: some device may read it", 2},
	} {
		fill, ok := d.Swatches[tc.label]
		require.True(t, ok, "the legend has %q: %v", tc.label, d.Swatches)
		require.Equal(t, tc.cells, byFill[fill], "cells coloured as %q", tc.label)
	}
	for _, label := range []string{
		"reserved: address space with no memory behind it",
		"a dark bar on the left: a mapping begins; cN: chunk N",
		"outlined: a chunk mapped at two places or more (aliased)",
	} {
		require.Contains(t, d.Swatches, label)
	}
	for _, label := range []string{ // nothing drawn so
		"a chunk on device 1, mapped: no device may access it yet",
		"dashed: the chunk's handle is released; its memory stays while it is mapped",
	} {
		require.NotContains(t, d.Swatches, label)
	}
	reserved := uint64(byFill[d.Swatches["reserved: address space with no memory behind it"]])
	for _, gap := range d.Gaps {
		reserved += gap
	}
	require.Equal(t, uint64(56), reserved, "reserved cells and gap bars")
	require.Equal(t, []uint64{42}, d.Gaps, "the 42 reserved granules at the end are a bar; the shorter runs are cells")
	require.Len(t, d.Cells, 64-42)
	require.Equal(t, memsvg.Fill(memsvg.Mapped, 0), d.Swatches["a chunk on device 0, mapped: no device may access it yet"])
	require.Contains(t, d.Texts["chunk"], "c2", "cells are labelled with their chunk")
	require.True(t, d.Has("caption", "A dashed bar stands for 16 cells or more with nothing mapped."))
	for _, c := range d.Cells {
		require.NotEmpty(t, c.Tooltip, "every cell has a tooltip")
	}
	require.Contains(t, d.Cells[0].Tooltip, "+0 B (2 MiB): accessible, chunk 1 on device 0, mapped from +0 B; device 0 read-write, device 1 read")
}

// TestAliases: a chunk mapped at two places has its cells outlined and a
// legend line saying where; one mapped at three is listed first.
func TestAliases(t *testing.T) {
	d, _ := render(t, twoDevices())
	require.Equal(t, []string{"chunk 3 (device 0) mapped twice: at +16 MiB and +40 MiB"}, d.Aliases())
	aliased := 0
	for _, c := range d.Cells {
		if strings.Contains(c.Class, "alias") {
			aliased++
			require.Contains(t, c.Tooltip, "chunk 3 ")
		}
	}
	require.Equal(t, 4, aliased, "both mappings of chunk 3, two granules each")
	require.True(t, d.Has("chunk-list", "chunk 1 (device 0): 4 MiB at +0 B"))

	p := twoDevices()
	p.Ranges = append(p.Ranges, memsvg.Range{Name: "another", Base: 0x7f1000000000, Size: 4 * g, Spans: []memsvg.Span{
		{Offset: g, Size: g, State: memsvg.Mapped, Chunk: 2, Device: 1, ChunkOffset: g},
		{Offset: 3 * g, Size: g, State: memsvg.Mapped, Chunk: 2, Device: 1, ChunkOffset: g},
	}})
	d, _ = render(t, p)
	require.Equal(t, []string{
		"chunk 2 (device 1) mapped 3 times: at +4 MiB of the reservation, +0 B of another and +4 MiB of another",
		"chunk 3 (device 0) mapped twice: at +16 MiB of the reservation and +40 MiB of the reservation",
	}, d.Aliases())
}

// TestCap: a range of many granules with memory throughout is drawn a
// few granules a cell, within MaxCells, and the caption says so; a huge
// range with little mapped is drawn a granule a cell, its reserved
// stretches as bars; either picture stays small. (How fast is
// BenchmarkCap's to say.)
func TestCap(t *testing.T) {
	const n = 100_000
	p := memsvg.Picture{Title: "busy", Granule: g, Ranges: []memsvg.Range{{Name: "r", Size: n * g}}}
	for i := uint64(0); i < n; i += 3 {
		p.Ranges[0].Spans = append(p.Ranges[0].Spans, memsvg.Span{Offset: i * g, Size: g, State: memsvg.State(1 + i%2), Chunk: i, Access: []memsvg.Access{memsvg.Read}})
	}
	d, data := render(t, p)
	require.LessOrEqual(t, len(d.Cells), memsvg.MaxCells)
	require.Greater(t, len(d.Cells), memsvg.MaxCells/2)
	require.Equal(t, "Each cell draws 128 granules (256 MiB), coloured by its most accessible granule; its tooltip counts them.", d.Texts["caption"][1])
	require.Equal(t, memsvg.Counts{Reserved: n - 33334, Mapped: 16667, Accessible: 16667}, d.Counts(t), "the counts are of granules, not cells")
	require.Less(t, len(data), 400_000)
	require.Contains(t, d.Cells[0].Tooltip, "+0 B to +256 MiB (128 granules): 85 reserved, 22 mapped, 21 accessible; the most accessible is accessible")

	huge := memsvg.Picture{Title: "huge", Granule: 64 * units.KiB, Ranges: []memsvg.Range{{Name: "1 TiB", Size: units.TiB, Spans: []memsvg.Span{
		{Offset: units.GiB, Size: 128 * units.KiB, State: memsvg.Mapped, Chunk: 1},
	}}}}
	d, data = render(t, huge)
	require.Len(t, d.Cells, 2)
	require.Equal(t, []uint64{units.GiB / (64 * units.KiB), (units.TiB-units.GiB)/(64*units.KiB) - 2}, d.Gaps)
	require.Less(t, len(data), 10_000)
}

// TestEscape: text is escaped, so a title, a range name or a mark with
// markup reads back as written and the document stays well-formed.
func TestEscape(t *testing.T) {
	p := twoDevices()
	p.Title = `<b>"bold" & 'quoted'</b>`
	p.Ranges[0].Name = "a <range> & more"
	p.Ranges[0].Marks = []memsvg.Mark{{Offset: 0, Text: "</text><script>alert(1)</script>"}}
	p.Notes = []string{"1 < 2 && 3 > 2"}
	d, data := render(t, p)
	require.Equal(t, p.Title, d.Title)
	require.Equal(t, []string{p.Title}, d.Texts["title"])
	require.True(t, d.Has("range", "a <range> & more: 128 MiB"))
	require.Equal(t, []string{"1: </text><script>alert(1)</script> (+0 B)"}, d.Texts["mark-list"])
	require.Equal(t, []string{"1 < 2 && 3 > 2"}, d.Texts["note"])
	require.NotContains(t, string(data), "<script>")
}

// TestDeterministic: the same picture gives the same bytes.
func TestDeterministic(t *testing.T) {
	_, a := render(t, twoDevices())
	for range 5 {
		_, b := render(t, twoDevices())
		require.Equal(t, a, b)
	}
}

// TestEmpty: a picture of no reservation says so, and counts nothing.
func TestEmpty(t *testing.T) {
	d, _ := render(t, memsvg.Picture{Title: "freed", Granule: g})
	require.Equal(t, []string{"No reservation is live: nothing to draw."}, d.Texts["empty"])
	require.Equal(t, memsvg.Counts{}, d.Counts(t))
	require.Empty(t, d.Cells)
}

// TestRefuses: a picture that cannot be drawn truthfully is an error
// naming the fault, and nothing is written.
func TestRefuses(t *testing.T) {
	for _, tc := range []struct {
		change func(p *memsvg.Picture)
		says   string
	}{
		{func(p *memsvg.Picture) { p.Granule = 0 }, "granule is 0"},
		{func(p *memsvg.Picture) { p.Ranges[0].Size = 3 }, "not a multiple of the 2097152-byte granule"},
		{func(p *memsvg.Picture) { p.Ranges[0].Spans[1].Offset = 0 }, "overlaps or precedes"},
		{func(p *memsvg.Picture) { p.Ranges[0].Spans[0].Size = 100 }, "not on 2097152-byte granules"},
		{func(p *memsvg.Picture) { p.Ranges[0].Spans[4].Offset = 63 * g }, "runs past"},
		{func(p *memsvg.Picture) { p.Ranges[0].Spans[2].ChunkOffset = 4 * g }, "the chunk would begin before the range"},
	} {
		p := twoDevices()
		tc.change(&p)
		var b bytes.Buffer
		err := memsvg.Write(&b, p)
		require.ErrorContains(t, err, tc.says)
		require.Zero(t, b.Len())
	}
}

// TestFill: every device's two colours differ from each other, from
// reserved and from every other device's.
func TestFill(t *testing.T) {
	seen := map[string]string{memsvg.Fill(memsvg.Reserved, 0): "reserved"}
	for dev := range 8 {
		for _, s := range []memsvg.State{memsvg.Mapped, memsvg.Accessible} {
			f := memsvg.Fill(s, dev)
			require.Regexp(t, `^#[0-9a-f]{6}$`, f)
			what := fmt.Sprintf("%s on device %d", s, dev)
			require.NotContains(t, seen, f, "%s has the colour of %s", what, seen[f])
			seen[f] = what
		}
	}
}

// TestBook: the book follows a driver's calls: a reservation, chunks
// mapped, access granted over part of one, an alias, a release, an unmap,
// and ignores calls that do not fit; its picture is the map; it is safe
// for concurrent use.
func TestBook(t *testing.T) {
	b := memsvg.NewBook(2, g)
	b.Reserve(0x1000_0000_0000, 16*g)
	b.Reserve(0x2000_0000_0000, 4*g)
	b.Create(7, 1, 2*g)
	b.Create(8, 0, g)
	b.Map(0x1000_0000_0000+2*g, 7)
	b.Map(0x1000_0000_0000+4*g, 8)
	b.Map(0x2000_0000_0000, 7) // an alias in the other reservation
	b.SetAccess(0x1000_0000_0000+3*g, 2*g, 0, memsvg.ReadWrite)
	b.Release(7)
	b.Unmap(0x1000_0000_0000 + 4*g)
	b.Unmap(0x1000_0000_0000 + 9*g) // nothing there
	b.Map(0x1000_0000_0000+2*g, 8)  // over a mapping
	b.Map(0x1000_0000_0000, 99)     // no such chunk
	b.SetAccess(0x1000_0000_0000, g, 5, memsvg.Read)
	p := b.Picture("the book")
	require.Equal(t, memsvg.Picture{Title: "the book", Granule: g, Ranges: []memsvg.Range{
		{Name: "reservation 0x100000000000", Base: 0x1000_0000_0000, Size: 16 * g, Spans: []memsvg.Span{
			{Offset: 2 * g, Size: g, State: memsvg.Mapped, Chunk: 7, Device: 1, Released: true, Access: []memsvg.Access{0, 0}},
			{Offset: 3 * g, Size: g, State: memsvg.Accessible, Chunk: 7, Device: 1, ChunkOffset: g, Released: true, Access: []memsvg.Access{memsvg.ReadWrite, 0}},
		}},
		{Name: "reservation 0x200000000000", Base: 0x2000_0000_0000, Size: 4 * g, Spans: []memsvg.Span{
			{Offset: 0, Size: 2 * g, State: memsvg.Mapped, Chunk: 7, Device: 1, Released: true, Access: []memsvg.Access{0, 0}},
		}},
	}}, p)
	d, _ := render(t, p)
	require.Equal(t, []string{"chunk 7 (device 1) mapped twice: at +4 MiB of reservation 0x100000000000 and +0 B of reservation 0x200000000000"}, d.Aliases())
	require.Contains(t, d.Swatches, "dashed: the chunk's handle is released; its memory stays while it is mapped")

	b.Unmap(0x2000_0000_0000)
	b.Unreserve(0x2000_0000_0000)
	require.Len(t, b.Picture("").Ranges, 1)

	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			base := uint64(0x3000_0000_0000 + i*0x100_0000_0000)
			b.Reserve(base, 8*g)
			for h := range uint64(50) {
				b.Create(1000*uint64(i+1)+h, i%2, g)
				b.Map(base+(h%8)*g, 1000*uint64(i+1)+h)
				b.SetAccess(base, 8*g, i%2, memsvg.Read)
				_ = b.Picture("meanwhile")
				b.Unmap(base + (h%8)*g)
			}
		}()
	}
	wg.Wait()
	require.Len(t, b.Picture("").Ranges, 5)
}
