package report

import (
	"bytes"
	"fmt"
	"html"
	"image/color"
	"math"
	"strconv"
	"strings"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/internal/series"
)

// MaxPoints is the most points a series is drawn with: a longer one is
// thinned first, each stretch keeping its highest and lowest point
// (internal/series), so peaks stay on the chart.
const MaxPoints = 2000

// Unit is what an axis's values count.
type Unit uint8

const (
	// Count is a plain number.
	Count Unit = iota
	// Bytes are drawn in the largest binary unit the axis reaches (B, KiB,
	// MiB, GiB or TiB), named in its label.
	Bytes
	// Seconds are drawn as they are, "s" in the label.
	Seconds
)

// Axis says what an axis shows: Label names the quantity ("memory"); the
// unit is added to it ("memory (GiB)").
type Axis struct {
	Label string
	Unit  Unit
}

// scale is the axis's unit for values up to most: the divisor and the
// label.
func (a Axis) scale(most float64) (div float64, label string) {
	switch a.Unit {
	case Bytes:
		div, name := 1.0, "B"
		for i, u := range []string{"KiB", "MiB", "GiB", "TiB"} {
			if s := math.Ldexp(1, 10*(i+1)); most >= s {
				div, name = s, u
			}
		}
		return div, a.Label + " (" + name + ")"
	case Seconds:
		return 1, a.Label + " (s)"
	}
	return 1, a.Label
}

// Series is a named line: Y[i] at X[i]. A series of Steps holds each
// value until the next point (drawn as steps, not slopes). Width is the
// line's width in points (0: DefaultWidth): series are drawn in order,
// each over those before, so a chart whose lines may coincide draws the
// earlier ones wider, to show at the edges of those drawn over them.
type Series struct {
	Name  string
	X, Y  []float64
	Steps bool
	Width float64
}

// DefaultWidth is a line's width in points where its Series gives none.
const DefaultWidth = 1.6

// width is the series' line width.
func (s Series) width() float64 {
	if s.Width > 0 {
		return s.Width
	}
	return DefaultWidth
}

// LineChart draws series as lines over shared axes, with a legend.
type LineChart struct {
	Title   string
	X, Y    Axis
	Series  []Series
	Caption string
}

// The size of a chart, and of its legend's column on the right, in
// points (1/72 inch).
const (
	chartWidth  = 720
	chartHeight = 259.2
	legendWidth = 187.2
)

// The font sizes, in points, of a chart's title, its axes' labels (and
// the legend's), and its tick labels.
const (
	titleSize = 13
	labelSize = 11
	tickSize  = 10
)

// lineColors are the series' colours in order (gonum's plotutil soft
// palette, which the charts were first drawn with), and lineDashes their
// dash patterns in points, so that lines stay told apart in grey.
var (
	lineColors = []string{"rgb(241,90,96)", "rgb(122,195,106)", "rgb(90,155,212)", "rgb(250,167,91)",
		"rgb(158,103,171)", "rgb(206,112,88)", "rgb(215,127,180)"}
	lineDashes = []string{"", "6,2", "2,2", "1,1", "5,2,1,2", "10,2,2,2,2,2,2,2", "10,2,2,2"}
)

func (c LineChart) caption() string { return c.Caption }

func (c LineChart) svg() ([]byte, error) {
	var mostX, mostY float64
	nonNegative := true
	for _, s := range c.Series {
		if len(s.X) != len(s.Y) {
			return nil, errors.Newf("chart %q: series %q has %d x values and %d y values", c.Title, s.Name, len(s.X), len(s.Y))
		}
		for i := range s.X {
			mostX, mostY = math.Max(mostX, math.Abs(s.X[i])), math.Max(mostY, math.Abs(s.Y[i]))
			nonNegative = nonNegative && s.Y[i] >= 0
		}
	}
	divX, labelX := c.X.scale(mostX)
	divY, labelY := c.Y.scale(mostY)
	type line struct {
		xs, ys []float64
		i      int
		steps  bool
	}
	var lines []line
	xr, yr := newSpan(), newSpan()
	for i, s := range c.Series {
		if len(s.X) == 0 {
			continue
		}
		xs, ys := series.Thin(s.X, s.Y, MaxPoints)
		for j := range xs {
			xs[j], ys[j] = xs[j]/divX, ys[j]/divY
			xr.add(xs[j])
			yr.add(ys[j])
		}
		lines = append(lines, line{xs: xs, ys: ys, i: i, steps: s.Steps})
	}
	if nonNegative {
		yr.add(0) // amounts are read from zero
	}
	xr.settle()
	yr.settle()
	xt, yt := niceTicks(xr.min, xr.max), niceTicks(yr.min, yr.max)
	f := newFrame(c.Title, labelX, labelY, chartHeight, xr, yr, xt, tickLabels(yt))
	var b bytes.Buffer
	f.open(&b)
	f.grid(&b, xt, yt)
	for _, l := range lines {
		var d strings.Builder
		for j := range l.xs {
			x, y := f.px(l.xs[j]), f.py(l.ys[j])
			switch {
			case j == 0:
				fmt.Fprintf(&d, "M%s %s", num(x), num(y))
			case l.steps:
				fmt.Fprintf(&d, "H%sV%s", num(x), num(y))
			default:
				fmt.Fprintf(&d, "L%s %s", num(x), num(y))
			}
		}
		fmt.Fprintf(&b, `<path d="%s" fill="none" stroke="%s" stroke-width="%s"%s/>`+"\n", d.String(), lineColor(l.i), num(c.Series[l.i].width()), dashAttr(l.i))
	}
	f.axes(&b, xt, yt)
	var entries []legendEntry
	for _, l := range lines {
		entries = append(entries, legendEntry{name: c.Series[l.i].Name, stroke: lineColor(l.i), dash: lineDashes[l.i%len(lineDashes)],
			width: c.Series[l.i].width()})
	}
	f.legend(&b, entries)
	b.WriteString("</svg>")
	return b.Bytes(), nil
}

func lineColor(i int) string { return lineColors[i%len(lineColors)] }

func dashAttr(i int) string {
	if d := lineDashes[i%len(lineDashes)]; d != "" {
		return ` stroke-dasharray="` + d + `"`
	}
	return ""
}

// span is the range of values an axis shows.
type span struct{ min, max float64 }

func newSpan() span { return span{min: math.Inf(1), max: math.Inf(-1)} }

func (s *span) add(v float64) { s.min, s.max = math.Min(s.min, v), math.Max(s.max, v) }

// settle makes the span drawable: an empty one is [0, 1], a single value
// v is [v, v+1] (or [v-1, v] for a negative one).
func (s *span) settle() {
	switch {
	case s.min > s.max:
		s.min, s.max = 0, 1
	case s.min == s.max && s.min < 0:
		s.min--
	case s.min == s.max:
		s.max++
	}
}

// tick is a marked value on an axis and its label.
type tick struct {
	Value float64
	Label string
}

func tickLabels(ts []tick) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.Label
	}
	return out
}

// niceTicks marks about six round values (1, 2 or 5 times a power of ten
// apart) between min and max, labelled with as many decimals as the step
// needs.
func niceTicks(min, max float64) []tick {
	if !(max > min) || math.IsInf(max-min, 0) {
		return []tick{{Value: min, Label: strconv.FormatFloat(min, 'g', 4, 64)}}
	}
	raw := (max - min) / 6
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{2, 5, 10} {
		if raw/mag > m*0.75 {
			step = m * mag
		}
	}
	decimals := 0
	if step < 1 {
		decimals = int(math.Ceil(-math.Log10(step) - 1e-9))
	}
	var ticks []tick
	for v := math.Ceil(min/step) * step; v <= max+step*1e-9; v += step {
		if math.Abs(v) < step*1e-9 {
			v = 0 // no "-0"
		}
		ticks = append(ticks, tick{Value: v, Label: strconv.FormatFloat(v, 'f', decimals, 64)})
	}
	return ticks
}

// textWidth is about how wide s is drawn at size points: Liberation Sans
// (metric-compatible with Arial and Helvetica) averages a little over half
// an em a character; digits are 0.556 em.
func textWidth(s string, size float64) float64 {
	return float64(len([]rune(s))) * 0.56 * size
}

// frame is a chart's drawing area: the title on top, the axes' labels
// and tick labels left and below, the plot in the middle, and a column
// on the right for the legend. Values map linearly onto the plot.
type frame struct {
	title, labelX, labelY string
	height                float64
	xr, yr                span
	// The plot's edges, in points from the top left.
	left, right, top, bottom float64
}

// Margins, in points.
const (
	pad      = 4  // at the drawing's edges
	tickLen  = 5  // a tick's mark
	gap      = 3  // between a tick's mark and its label
	titleH   = 30 // the title's band
	rightGap = 12 // between the plot and the legend's column
)

func newFrame(title, labelX, labelY string, height float64, xr, yr span, xTicks []tick, yLabels []string) *frame {
	widest := 0.0
	for _, l := range yLabels {
		widest = math.Max(widest, textWidth(l, tickSize))
	}
	left := pad + widest + gap + tickLen
	if labelY != "" {
		left += labelSize + 6
	}
	right := chartWidth - legendWidth - pad
	if n := len(xTicks); n > 0 { // room for half the last tick label
		right -= textWidth(xTicks[n-1].Label, tickSize) / 2
	}
	return &frame{title: title, labelX: labelX, labelY: labelY, height: height, xr: xr, yr: yr,
		left: left, right: right, top: titleH, bottom: height - (pad + labelSize + 6 + tickSize + gap + tickLen)}
}

func (f *frame) px(v float64) float64 {
	return f.left + (v-f.xr.min)/(f.xr.max-f.xr.min)*(f.right-f.left)
}

func (f *frame) py(v float64) float64 {
	return f.bottom - (v-f.yr.min)/(f.yr.max-f.yr.min)*(f.bottom-f.top)
}

// open writes the <svg> tag, for inlining in HTML: no XML prologue, no
// namespace declarations (the HTML parser gives <svg> its namespace),
// labelled for screen readers; then the white ground and the title.
func (f *frame) open(b *bytes.Buffer) {
	fmt.Fprintf(b, `<svg role="img" aria-label="%s" width="%spt" height="%spt" viewBox="0 0 %s %s" font-family="Liberation Sans, Arial, Helvetica, sans-serif">`+"\n",
		esc(f.title), num(chartWidth), num(f.height), num(chartWidth), num(f.height))
	fmt.Fprintf(b, `<rect width="%s" height="%s" fill="#fff"/>`+"\n", num(chartWidth), num(f.height))
	text(b, (f.left+f.right)/2, pad+titleSize+4, titleSize, "middle", "", f.title)
}

// grid draws light lines at the ticks.
func (f *frame) grid(b *bytes.Buffer, xt, yt []tick) {
	var d strings.Builder
	for _, t := range xt {
		x := f.px(t.Value)
		fmt.Fprintf(&d, "M%s %sV%s", num(x), num(f.top), num(f.bottom))
	}
	for _, t := range yt {
		y := f.py(t.Value)
		fmt.Fprintf(&d, "M%s %sH%s", num(f.left), num(y), num(f.right))
	}
	if d.Len() > 0 {
		fmt.Fprintf(b, `<path d="%s" stroke="#808080" stroke-width="0.25" fill="none"/>`+"\n", d.String())
	}
}

// axes draws the x axis below the plot and the y axis left of it, their
// ticks, tick labels and labels.
func (f *frame) axes(b *bytes.Buffer, xt, yt []tick) {
	d := fmt.Sprintf("M%s %sH%sM%s %sV%s", num(f.left), num(f.bottom), num(f.right), num(f.left), num(f.bottom), num(f.top))
	for _, t := range xt {
		d += fmt.Sprintf("M%s %sv%d", num(f.px(t.Value)), num(f.bottom), tickLen)
	}
	for _, t := range yt {
		d += fmt.Sprintf("M%s %sh-%d", num(f.left), num(f.py(t.Value)), tickLen)
	}
	fmt.Fprintf(b, `<path d="%s" stroke="#000" stroke-width="0.5" fill="none"/>`+"\n", d)
	for _, t := range xt {
		text(b, f.px(t.Value), f.bottom+tickLen+gap+tickSize, tickSize, "middle", "", t.Label)
	}
	for _, t := range yt {
		text(b, f.left-tickLen-gap, f.py(t.Value)+tickSize*0.35, tickSize, "end", "", t.Label)
	}
	if f.labelX != "" {
		text(b, (f.left+f.right)/2, f.height-pad-2, labelSize, "middle", "", f.labelX)
	}
	if f.labelY != "" {
		x, y := float64(pad+labelSize), (f.top+f.bottom)/2
		text(b, x, y, labelSize, "middle", fmt.Sprintf("rotate(-90 %s %s)", num(x), num(y)), f.labelY)
	}
}

// legendEntry is a line of the legend: a stroke (and its dashes) or a
// filled swatch, and the name.
type legendEntry struct {
	name         string
	stroke, dash string
	width        float64
	fill         string
}

// legend draws the entries in a column right of the plot, top down.
func (f *frame) legend(b *bytes.Buffer, entries []legendEntry) {
	const thumb, row = 28, labelSize * 1.6
	x := chartWidth - legendWidth + rightGap
	for i, e := range entries {
		y := titleH + row*float64(i) + row/2 // the row's middle
		if e.fill != "" {
			fmt.Fprintf(b, `<path d="M%s %sh%dv%sh-%dZ" fill="%s"/>`+"\n", num(x), num(y-labelSize/2), thumb, num(labelSize), thumb, e.fill)
		} else {
			dash := ""
			if e.dash != "" {
				dash = ` stroke-dasharray="` + e.dash + `"`
			}
			fmt.Fprintf(b, `<path d="M%s %sh%d" stroke="%s" stroke-width="%s" fill="none"%s/>`+"\n", num(x), num(y), thumb, e.stroke, num(e.width), dash)
		}
		text(b, x+thumb+5, y+labelSize*0.35, labelSize, "start", "", e.name)
	}
}

// text writes s at (x, y), y its baseline, anchored start, middle or end.
func text(b *bytes.Buffer, x, y, size float64, anchor, transform, s string) {
	tr := ""
	if transform != "" {
		tr = ` transform="` + transform + `"`
	}
	fmt.Fprintf(b, `<text x="%s" y="%s" font-size="%s" text-anchor="%s"%s>%s</text>`+"\n", num(x), num(y), num(size), anchor, tr, esc(s))
}

func esc(s string) string { return html.EscapeString(s) }

// num writes v with at most two decimals, as SVG reads it.
func num(v float64) string {
	s := strconv.FormatFloat(v, 'f', 2, 64)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	if s == "-0" || s == "" {
		return "0"
	}
	return s
}

// cssColor writes c as an SVG colour.
func cssColor(c color.Color) string {
	r, g, b, _ := color.RGBAModel.Convert(c).RGBA()
	return fmt.Sprintf("rgb(%d,%d,%d)", r>>8, g>>8, b>>8)
}

// MemoryMap draws ranges of address space as horizontal bars, one a row,
// each stretch coloured by its kind, with a legend of the kinds.
type MemoryMap struct {
	Title string
	// Kinds lists the kinds of stretch in the legend's order.
	Kinds []Kind
	Rows  []MapRow
	// Caption is the text under the map.
	Caption string
}

// Kind is a kind of stretch: its name, and its colour (nil: the next of a
// fixed palette).
type Kind struct {
	Name  string
	Color color.Color
}

// MapRow is one range: its stretches in address order, offsets in bytes
// from the range's start.
type MapRow struct {
	Name     string
	Segments []Segment
}

// Segment is [Offset, Offset+Size) of a row, of the kind named Kind.
type Segment struct {
	Offset, Size uint64
	Kind         string
}

// MaxSegments is the most stretches a row is drawn with: a row of more
// (after merging neighbours of one kind) is cut into MaxSegments equal
// bins, each drawn in the kind that holds most of its bytes — finer than
// a pixel either way.
const MaxSegments = 600

// mapPalette colours kinds given no colour, in order.
var mapPalette = []color.Color{
	color.RGBA{R: 0x3b, G: 0x6e, B: 0xc4, A: 0xff}, // blue
	color.RGBA{R: 0x7c, G: 0xc8, B: 0x7a, A: 0xff}, // green
	color.RGBA{R: 0xee, G: 0x8a, B: 0x3c, A: 0xff}, // orange
	color.RGBA{R: 0xd8, G: 0xd8, B: 0xd8, A: 0xff}, // light grey
	color.RGBA{R: 0x95, G: 0x6c, B: 0xb4, A: 0xff}, // purple
	color.RGBA{R: 0xd6, G: 0x5f, B: 0x5f, A: 0xff}, // red
}

func (m MemoryMap) caption() string { return m.Caption }

func (m MemoryMap) svg() ([]byte, error) {
	colors := map[string]string{}
	for i, k := range m.Kinds {
		c := k.Color
		if c == nil {
			c = mapPalette[i%len(mapPalette)]
		}
		colors[k.Name] = cssColor(c)
	}
	var most uint64
	rows := make([][]Segment, len(m.Rows))
	for i, r := range m.Rows {
		for _, s := range r.Segments {
			if _, ok := colors[s.Kind]; !ok {
				return nil, errors.Newf("memory map %q: row %q has a segment of kind %q, not one of its kinds", m.Title, r.Name, s.Kind)
			}
			most = max(most, s.Offset+s.Size)
		}
		rows[i] = coarsen(merge(r.Segments), MaxSegments)
	}
	div, labelX := Axis{Label: "offset in the range", Unit: Bytes}.scale(float64(most))
	xr := span{min: 0, max: math.Max(float64(most)/div, 1e-9)}
	yr := span{min: -0.5, max: math.Max(float64(len(m.Rows))-0.5, 0.5)}
	// The rows are the y axis's ticks, the first on top.
	yt := make([]tick, len(m.Rows))
	for i, r := range m.Rows {
		yt[i] = tick{Value: float64(len(m.Rows) - 1 - i), Label: r.Name}
	}
	xt := niceTicks(xr.min, xr.max)
	height := math.Max(float64(len(m.Rows))*36+93.6, 158.4)
	f := newFrame(m.Title, labelX, "", height, xr, yr, xt, tickLabels(yt))
	var b bytes.Buffer
	f.open(&b)
	const half = 0.35 // half a bar's height, in rows
	for i := range m.Rows {
		y := float64(len(m.Rows) - 1 - i)
		paths := map[string]*strings.Builder{}
		for _, s := range rows[i] {
			x0, x1 := f.px(float64(s.Offset)/div), f.px(float64(s.Offset+s.Size)/div)
			d := paths[s.Kind]
			if d == nil {
				d = &strings.Builder{}
				paths[s.Kind] = d
			}
			fmt.Fprintf(d, "M%s %sH%sV%sH%sZ", num(x0), num(f.py(y+half)), num(x1), num(f.py(y-half)), num(x0))
		}
		for _, k := range m.Kinds {
			if d := paths[k.Name]; d != nil {
				fmt.Fprintf(&b, `<path d="%s" fill="%s"/>`+"\n", d.String(), colors[k.Name])
			}
		}
	}
	f.axes(&b, xt, yt)
	entries := make([]legendEntry, len(m.Kinds))
	for i, k := range m.Kinds {
		entries[i] = legendEntry{name: k.Name, fill: colors[k.Name]}
	}
	f.legend(&b, entries)
	b.WriteString("</svg>")
	return b.Bytes(), nil
}

// merge joins neighbouring segments of one kind.
func merge(segs []Segment) []Segment {
	var out []Segment
	for _, s := range segs {
		if s.Size == 0 {
			continue
		}
		if n := len(out); n > 0 && out[n-1].Kind == s.Kind && out[n-1].Offset+out[n-1].Size == s.Offset {
			out[n-1].Size += s.Size
			continue
		}
		out = append(out, s)
	}
	return out
}

// coarsen cuts a row of more than n segments into n equal bins, each of
// the kind holding most of its bytes (the first such kind on a tie), and
// merges the bins again.
func coarsen(segs []Segment, n int) []Segment {
	if len(segs) <= n {
		return segs
	}
	start, end := segs[0].Offset, segs[len(segs)-1].Offset+segs[len(segs)-1].Size
	width := (end - start + uint64(n) - 1) / uint64(n)
	bins := make([]Segment, 0, n)
	j := 0
	for lo := start; lo < end; lo += width {
		hi := min(lo+width, end)
		bytes := map[string]uint64{}
		var order []string
		for ; j < len(segs) && segs[j].Offset < hi; j++ {
			s := segs[j]
			over := min(hi, s.Offset+s.Size) - max(lo, s.Offset)
			if _, ok := bytes[s.Kind]; !ok {
				order = append(order, s.Kind)
			}
			bytes[s.Kind] += over
			if s.Offset+s.Size > hi {
				break // it goes on into the next bin
			}
		}
		kind := ""
		for _, k := range order {
			if kind == "" || bytes[k] > bytes[kind] {
				kind = k
			}
		}
		if kind == "" {
			continue // a gap between segments
		}
		bins = append(bins, Segment{Offset: lo, Size: hi - lo, Kind: kind})
	}
	return merge(bins)
}
