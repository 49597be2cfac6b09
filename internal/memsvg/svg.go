package memsvg

import (
	"bytes"
	"cmp"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/vmarena/vmarena/internal/atomicfile"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/internal/units"
)

// The picture's geometry, in pixels. A range is a grid of at most maxCols
// cells a row, each row labelled on the left with the offset it starts at.
const (
	margin      = 16
	gutter      = 104 // the row labels' column
	maxCols     = 64
	gridW       = 1024 // a row of cells is at most this wide
	minCell     = 14
	maxCell     = 48
	lineH       = 16
	swatch      = 14
	wrapAt      = 110 // characters of a note line
	titleWrapAt = 96  // and of a title line
	listMax     = 24  // chunk and alias lines listed before "and N more"
	charW       = 7   // an estimate of a 12px character's width, for the picture's width
	titleCW     = 9   // the same for the title's
	cellFont    = 11
)

// Colours: reserved is grey; a device has a hue, pale where mapped and
// strong where accessible; an alias is outlined in aliasColour.
const (
	reservedFill   = "#e4e4e4"
	reservedStroke = "#c8c8c8"
	aliasColour    = "#d4006a"
	boundaryColour = "#1a1a1a"
)

// deviceHues are the hues of devices 0 to 7, far apart; further devices
// step round the wheel.
var deviceHues = []float64{210, 28, 130, 280, 350, 175, 50, 320}

func deviceHue(d int) float64 {
	if d >= 0 && d < len(deviceHues) {
		return deviceHues[d]
	}
	return float64((d * 47) % 360)
}

// Fill is the colour of a cell in state s of a chunk on device dev
// (ignored when reserved), as "#rrggbb".
func Fill(s State, dev int) string {
	switch s {
	case Mapped:
		return hsl(deviceHue(dev), 0.55, 0.82)
	case Accessible:
		return hsl(deviceHue(dev), 0.65, 0.42)
	}
	return reservedFill
}

// hsl is the colour of hue h (degrees), saturation s and lightness l
// (0 to 1) as "#rrggbb".
func hsl(h, s, l float64) string {
	c := (1 - math.Abs(2*l-1)) * s
	hp := math.Mod(h, 360) / 60
	x := c * (1 - math.Abs(math.Mod(hp, 2)-1))
	var r, g, b float64
	switch {
	case hp < 1:
		r, g = c, x
	case hp < 2:
		r, g = x, c
	case hp < 3:
		g, b = c, x
	case hp < 4:
		g, b = x, c
	case hp < 5:
		r, b = x, c
	default:
		r, b = c, x
	}
	m := l - c/2
	to := func(v float64) int { return int(math.Round((v + m) * 255)) }
	return fmt.Sprintf("#%02x%02x%02x", to(r), to(g), to(b))
}

// esc is s escaped for XML text and attribute values.
func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s)) // a strings.Builder does not fail
	return b.String()
}

// offset formats a byte offset in human units: "+0 B", "+32 GiB".
func offset(n uint64) string { return "+" + units.Bytes(n) }

// times is "once", "twice", "3 times".
func times(n int) string {
	switch n {
	case 1:
		return "once"
	case 2:
		return "twice"
	}
	return fmt.Sprintf("%d times", n)
}

// wrap breaks s into lines of at most width characters at spaces (a word
// longer than width is a line of its own).
func wrap(s string, width int) []string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(s) {
		if line != "" && len(line)+1+len(w) > width {
			lines = append(lines, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += w
	}
	if line != "" || len(lines) == 0 {
		lines = append(lines, line)
	}
	return lines
}

// canvas is the SVG being written: its body, the next free y, and the
// width its content needs.
type canvas struct {
	b     bytes.Buffer
	y     int
	width int
}

func (c *canvas) printf(format string, args ...any) { fmt.Fprintf(&c.b, format, args...) }

// need widens the picture to hold x.
func (c *canvas) need(x int) { c.width = max(c.width, x) }

// text writes a line of text at (x, y) (y is the baseline), of class
// class, and widens the picture for it.
func (c *canvas) text(x, y int, class, attrs, s string) {
	c.printf(`<text class="%s" x="%d" y="%d"%s>%s</text>`+"\n", class, x, y, attrs, esc(s))
	cw := charW
	if class == "title" {
		cw = titleCW
	}
	if !strings.Contains(attrs, `text-anchor="end"`) {
		c.need(x + cw*len([]rune(s)) + margin)
	}
}

// line writes a line of text at the left margin and moves down a line.
func (c *canvas) line(class, attrs, s string) {
	c.y += lineH
	c.text(margin, c.y, class, attrs, s)
}

// Write draws p as a self-contained SVG document on w. It refuses (and
// writes nothing) a picture whose spans are not on its granules or
// overlap.
func Write(w io.Writer, p Picture) error {
	if err := p.check(); err != nil {
		return err
	}
	chunks := p.chunks()
	aliased := map[uint64]bool{}
	released := false
	for _, ch := range chunks {
		aliased[ch.chunk] = ch.aliased()
		released = released || ch.released
	}
	per := p.perCell()
	cells := make([][]cell, len(p.Ranges))
	// A row is maxCols cells, or half as many (and each twice as large,
	// room for its chunk's label) when the picture has few.
	widest, rowCols := 1, maxCols
	if drawnAt(&p, per) <= MaxCells/2 {
		rowCols = maxCols / 2
	}
	for i := range p.Ranges {
		cells[i] = p.Ranges[i].cells(p.Granule, per, aliased)
		run := 0 // cells since the last gap
		for _, ce := range cells[i] {
			if ce.gap {
				run = 0
				continue
			}
			run++
			widest = max(widest, min(rowCols, run))
		}
	}
	px := min(maxCell, max(minCell, gridW/widest))

	c := &canvas{y: margin, width: 480}
	for _, l := range wrap(p.Title, titleWrapAt) {
		c.y += 20
		c.text(margin, c.y, "title", ` font-size="16" font-weight="bold"`, l)
	}
	c.y += 8
	if len(p.Ranges) == 0 {
		c.line("empty", "", "No reservation is live: nothing to draw.")
	}
	for i := range p.Ranges {
		drawRange(c, &p, i, cells[i], per, widest, px)
	}
	drawLegend(c, &p, chunks, colours(cells), released)
	gaps := false
	for _, cs := range cells {
		for _, ce := range cs {
			gaps = gaps || ce.gap
		}
	}
	drawCaption(c, &p, per, gaps)
	c.y += margin

	if _, err := fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?>`+"\n"+
		`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n"+
		"<title>%s</title>\n"+`<rect x="0" y="0" width="%d" height="%d" fill="#ffffff"/>`+"\n",
		c.width, c.y, c.width, c.y, esc(p.Title), c.width, c.y); err != nil {
		return err
	}
	if _, err := w.Write(c.b.Bytes()); err != nil {
		return err
	}
	_, err := io.WriteString(w, "</svg>\n")
	return err
}

// WriteFile writes p to the file path, replacing it; a write that fails
// leaves path as it was (no half-written picture).
func WriteFile(path string, p Picture) error {
	var b bytes.Buffer
	if err := Write(&b, p); err != nil {
		return err
	}
	return errors.Wrap(atomicfile.Write(path, b.Bytes(), 0o644), "memsvg") // whole or not at all
}

// drawRange draws range i: a heading, its cells in rows of cols, each
// row labelled with the offset it starts at, a gap as a bar of its own,
// the end, the granule counts and the marks.
func drawRange(c *canvas, p *Picture, i int, cs []cell, per uint64, cols, px int) {
	r := &p.Ranges[i]
	n := r.Size / p.Granule
	c.y += 10
	c.line("range", ` font-weight="bold"`, fmt.Sprintf("%s: %s at %#x, %d granules of %s",
		r.Name, units.Bytes(r.Size), r.Base, n, units.Bytes(p.Granule)))
	// marks[k] is the marks on cell k, numbered from 1 across the range.
	marks := map[int][]int{}
	for j, m := range r.Marks {
		g := m.Offset / p.Granule
		if k := sort.Search(len(cs), func(k int) bool { return cs[k].g1 > g }); k < len(cs) {
			marks[k] = append(marks[k], j+1)
		}
	}
	rowGap := 3
	if len(marks) > 0 {
		rowGap = 14
	}
	const gapH = 20
	barW := max(cols*px, 360)
	x0 := margin + gutter
	y := c.y + rowGap + 4 // the top of the current row
	label := func(y, h int, g uint64) {
		c.text(x0-8, y+h/2+4, "axis", ` text-anchor="end" font-family="monospace"`, offset(g*p.Granule))
	}
	mark := func(k, x, y int) {
		if ms := marks[k]; len(ms) > 0 {
			c.printf(`<path class="mark" d="M%d %dl4 -7h-8z" fill="#000000"/>`+"\n", x, y-1)
			c.text(x+5, y-3, "mark", ` font-size="10"`, markNumbers(ms))
		}
	}
	col := 0
	for k := range cs {
		ce := &cs[k]
		if ce.gap {
			if col > 0 {
				y, col = y+px+rowGap, 0
			}
			label(y, gapH, ce.g0)
			c.printf(`<rect class="gap" x="%d" y="%d" width="%d" height="%d" fill="#f7f7f7" stroke="%s" stroke-dasharray="4 3"><title>%s</title></rect>`+"\n",
				x0+1, y+1, barW-2, gapH-2, reservedStroke, esc(tooltip(p, ce)))
			c.text(x0+barW/2, y+gapH/2+4, "gap-text", ` text-anchor="middle" fill="#555555"`,
				fmt.Sprintf("… %s reserved (%d granules) …", units.Bytes((ce.g1-ce.g0)*p.Granule), ce.g1-ce.g0))
			mark(k, x0+8, y)
			y += gapH + rowGap
			continue
		}
		if col == cols {
			y, col = y+px+rowGap, 0
		}
		if col == 0 {
			label(y, px, ce.g0)
		}
		var prev *cell
		if col > 0 {
			prev = &cs[k-1]
		}
		x := x0 + col*px
		drawCell(c, p, ce, prev, x, y, px)
		mark(k, x+px/2, y)
		col++
	}
	if col > 0 {
		y += px + rowGap
	}
	c.text(x0-8, y+10, "axis", ` text-anchor="end" font-family="monospace"`, offset(r.Size))
	c.text(x0, y+10, "axis", ` fill="#555555"`, "(end)")
	c.need(x0 + barW + margin)
	c.y = y + 14
	k := r.count(p.Granule)
	c.line("counts", "", fmt.Sprintf("%d granules: %d reserved, %d mapped, %d accessible", k.Total(), k.Reserved, k.Mapped, k.Accessible))
	for j, m := range r.Marks {
		c.line("mark-list", "", fmt.Sprintf("%d: %s (%s)", j+1, m.Text, offset(m.Offset)))
	}
}

func markNumbers(ms []int) string {
	s := make([]string, len(ms))
	for i, m := range ms {
		s[i] = fmt.Sprint(m)
	}
	return strings.Join(s, ",")
}

// drawCell draws one cell at (x, y): its fill, an outline where aliased or
// released, a bar on its left where a mapping begins, the chunk's label
// where there is room, and a tooltip saying all of it.
func drawCell(c *canvas, p *Picture, ce *cell, prev *cell, x, y, px int) {
	stroke := ` stroke="` + reservedStroke + `" stroke-width="1"`
	switch {
	case ce.aliased:
		stroke = ` stroke="` + aliasColour + `" stroke-width="3"`
	case ce.state != Reserved:
		stroke = ""
	}
	if ce.released && ce.state != Reserved {
		if stroke == "" {
			stroke = ` stroke="` + boundaryColour + `" stroke-width="1.5"`
		}
		stroke += ` stroke-dasharray="3 2"`
	}
	class := "cell " + ce.state.String()
	if ce.aliased {
		class += " alias"
	}
	c.printf(`<rect class="%s" x="%d" y="%d" width="%d" height="%d" fill="%s"%s><title>%s</title></rect>`+"\n",
		class, x+1, y+1, px-2, px-2, Fill(ce.state, ce.device), stroke, esc(tooltip(p, ce)))
	if ce.state == Reserved {
		return
	}
	begins := prev == nil || prev.state == Reserved || prev.chunk != ce.chunk || prev.start != ce.start
	if begins {
		c.printf(`<line class="boundary" x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"/>`+"\n",
			x, y, x, y+px, boundaryColour)
	}
	label := fmt.Sprintf("c%d", ce.chunk)
	if begins && px >= 22 && len(label)*cellFont*6/10 <= px-4 {
		colour := "#ffffff"
		if ce.state == Mapped {
			colour = "#1a1a1a"
		}
		c.printf(`<text class="chunk" x="%d" y="%d" font-size="%d" text-anchor="middle" fill="%s">%s</text>`+"\n",
			x+px/2, y+px/2+4, cellFont, colour, esc(label))
	}
}

// tooltip says what a cell holds.
func tooltip(p *Picture, ce *cell) string {
	var b strings.Builder
	from, to := ce.g0*p.Granule, ce.g1*p.Granule
	switch {
	case ce.g1-ce.g0 == 1:
		fmt.Fprintf(&b, "%s (%s): %s", offset(from), units.Bytes(p.Granule), ce.state)
	case !ce.mixed:
		fmt.Fprintf(&b, "%s to %s (%d granules): all %s", offset(from), offset(to), ce.g1-ce.g0, ce.state)
	default:
		fmt.Fprintf(&b, "%s to %s (%d granules): %d reserved, %d mapped, %d accessible; the most accessible is %s",
			offset(from), offset(to), ce.g1-ce.g0, ce.counts.Reserved, ce.counts.Mapped, ce.counts.Accessible, ce.state)
	}
	if ce.state == Reserved {
		return b.String()
	}
	fmt.Fprintf(&b, ", chunk %d on device %d, mapped from %s", ce.chunk, ce.device, offset(ce.start))
	if ce.aliased {
		b.WriteString(" (aliased: mapped elsewhere too)")
	}
	if ce.released {
		b.WriteString(" (handle released)")
	}
	var acc []string
	for d, a := range ce.access {
		if a != NoAccess {
			acc = append(acc, fmt.Sprintf("device %d %s", d, a))
		}
	}
	if len(acc) == 0 {
		b.WriteString("; no device may access it")
	} else {
		b.WriteString("; " + strings.Join(acc, ", "))
	}
	if ce.mixed {
		b.WriteString("; other granules of the cell differ")
	}
	return b.String()
}

// drawLegend draws what the colours and marks mean, and lists the
// aliased chunks, then the others.
func drawLegend(c *canvas, p *Picture, chunks []chunkMaps, shown []colour, released bool) {
	c.y += 12
	c.line("legend-title", ` font-weight="bold"`, "Legend")
	item := func(fill, stroke, label string) {
		c.y += lineH + 4
		c.printf(`<rect class="legend-swatch" x="%d" y="%d" width="%d" height="%d" fill="%s"%s/>`+"\n",
			margin, c.y-swatch+2, swatch, swatch, fill, stroke)
		c.text(margin+swatch+8, c.y, "legend", "", label)
	}
	item(reservedFill, ` stroke="`+reservedStroke+`"`, "reserved: address space with no memory behind it")
	for _, k := range shown {
		if k.state == Mapped {
			item(Fill(Mapped, k.device), "", fmt.Sprintf("a chunk on device %d, mapped: no device may access it yet", k.device))
		} else {
			item(Fill(Accessible, k.device), "", fmt.Sprintf("a chunk on device %d, accessible: some device may read it", k.device))
		}
	}
	if len(chunks) > 0 {
		item("#ffffff", "", "a dark bar on the left: a mapping begins; cN: chunk N")
		c.printf(`<line class="legend-bar" x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"/>`+"\n",
			margin+1, c.y-swatch+2, margin+1, c.y+2, boundaryColour)
	}
	var aliases []chunkMaps
	for _, ch := range chunks {
		if ch.aliased() {
			aliases = append(aliases, ch)
		}
	}
	// The most mapped first: a person looks for the widest sharing.
	slices.SortStableFunc(aliases, func(a, b chunkMaps) int { return cmp.Compare(len(b.places), len(a.places)) })
	if len(aliases) > 0 {
		item("#ffffff", ` stroke="`+aliasColour+`" stroke-width="3"`, "outlined: a chunk mapped at two places or more (aliased)")
	}
	if released {
		item("#ffffff", ` stroke="`+boundaryColour+`" stroke-dasharray="3 2"`, "dashed: the chunk's handle is released; its memory stays while it is mapped")
	}
	place := func(pl place) string {
		s := offset(pl.start)
		if len(p.Ranges) > 1 {
			s += " of " + p.Ranges[pl.rng].Name
		}
		return s
	}
	describe := func(ch chunkMaps) string {
		at := make([]string, len(ch.places))
		for i, pl := range ch.places {
			at[i] = place(pl)
		}
		return fmt.Sprintf("chunk %d (device %d) mapped %s: at %s", ch.chunk, ch.device, times(len(ch.places)), joinAnd(at))
	}
	c.y += 6
	for i, ch := range aliases {
		if i == listMax {
			c.line("alias-more", "", fmt.Sprintf("and %d more aliased chunks", len(aliases)-listMax))
			break
		}
		c.line("alias", ` fill="`+aliasColour+`"`, describe(ch))
	}
	listed := 0
	for _, ch := range chunks {
		if ch.aliased() {
			continue
		}
		if listed == listMax {
			c.line("chunk-more", "", fmt.Sprintf("and %d more chunks", len(chunks)-len(aliases)-listMax))
			break
		}
		c.line("chunk-list", "", fmt.Sprintf("chunk %d (device %d): %s at %s", ch.chunk, ch.device, units.Bytes(ch.places[0].size), place(ch.places[0])))
		listed++
	}
}

// colour is what a cell's fill says: a state, and a device unless
// reserved.
type colour struct {
	state  State
	device int
}

// colours lists the colours of the cells but reserved, by device, then
// mapped before accessible.
func colours(cells [][]cell) []colour {
	seen := map[colour]bool{}
	var out []colour
	for _, cs := range cells {
		for _, ce := range cs {
			if k := (colour{ce.state, ce.device}); ce.state != Reserved && !seen[k] {
				seen[k] = true
				out = append(out, k)
			}
		}
	}
	slices.SortFunc(out, func(a, b colour) int { return cmp.Or(cmp.Compare(a.device, b.device), cmp.Compare(a.state, b.state)) })
	return out
}

// joinAnd joins "a", "b and c".
func joinAnd(s []string) string {
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}

// drawCaption counts the granules of every state, says how many granules
// a cell draws, and adds the notes.
func drawCaption(c *canvas, p *Picture, per uint64, gaps bool) {
	k := p.Counts()
	c.y += 8
	ranges := "1 range"
	if len(p.Ranges) != 1 {
		ranges = fmt.Sprintf("%d ranges", len(p.Ranges))
	}
	c.line("caption", "", fmt.Sprintf("%d granules of %s in %s: %d reserved, %d mapped, %d accessible.",
		k.Total(), units.Bytes(p.Granule), ranges, k.Reserved, k.Mapped, k.Accessible))
	if per > 1 {
		c.line("caption", "", fmt.Sprintf("Each cell draws %d granules (%s), coloured by its most accessible granule; its tooltip counts them.",
			per, units.Bytes(per*p.Granule)))
	}
	if gaps {
		c.line("caption", "", fmt.Sprintf("A dashed bar stands for %d cells or more with nothing mapped.", minGap))
	}
	for _, n := range p.Notes {
		for _, l := range wrap(n, wrapAt) {
			c.line("note", "", l)
		}
	}
}
