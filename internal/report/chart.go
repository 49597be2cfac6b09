package report

import (
	"bytes"
	"html"
	"image/color"
	"math"
	"regexp"
	"strconv"

	"github.com/cockroachdb/errors"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"

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

// LineChart draws series as lines over shared axes, with a legend.
type LineChart struct {
	Title   string
	X, Y    Axis
	Series  []Series
	Caption string
}

// The size of a chart, and of its legend's column on the right.
const (
	chartWidth  = 10 * vg.Inch
	chartHeight = 3.6 * vg.Inch
	legendWidth = 2.6 * vg.Inch
)

func sans(size vg.Length) font.Font {
	return font.From(font.Font{Typeface: "Liberation", Variant: "Sans"}, size)
}

// newPlot is a plot with the page's fonts, the axes labelled.
func newPlot(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font = sans(13)
	p.Title.Padding = vg.Points(8)
	for _, a := range []*plot.Axis{&p.X, &p.Y} {
		a.Label.TextStyle.Font = sans(11)
		a.Tick.Label.Font = sans(10)
		a.Tick.Marker = plot.TickerFunc(niceTicks)
	}
	p.X.Label.Text, p.Y.Label.Text = x, y
	return p
}

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
	p := newPlot(c.Title, labelX, labelY)
	p.Add(plotter.NewGrid())
	legend := newLegend()
	for i, s := range c.Series {
		if len(s.X) == 0 {
			continue
		}
		xs, ys := series.Thin(s.X, s.Y, MaxPoints)
		xys := make(plotter.XYs, len(xs))
		for j := range xs {
			xys[j] = plotter.XY{X: xs[j] / divX, Y: ys[j] / divY}
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return nil, errors.Wrapf(err, "chart %q: series %q", c.Title, s.Name)
		}
		l.Color = plotutil.Color(i)
		l.Width = vg.Points(DefaultWidth)
		if s.Width > 0 {
			l.Width = vg.Points(s.Width)
		}
		l.Dashes = plotutil.Dashes(i)
		if s.Steps {
			l.StepStyle = plotter.PostStep
		}
		p.Add(l)
		legend.Add(s.Name, l)
	}
	if nonNegative {
		p.Y.Min = 0 // amounts are read from zero
	}
	return drawSVG(p, legend, chartHeight, c.Title)
}

func newLegend() plot.Legend {
	l := plot.NewLegend()
	l.TextStyle.Font = sans(11)
	l.Top, l.Left = true, true
	l.ThumbnailWidth = vg.Points(28)
	l.Padding = vg.Points(5)
	return l
}

// niceTicks marks about six round values (1, 2 or 5 times a power of ten
// apart) between min and max, labelled with as many decimals as the step
// needs.
func niceTicks(min, max float64) []plot.Tick {
	if !(max > min) || math.IsInf(max-min, 0) {
		return []plot.Tick{{Value: min, Label: strconv.FormatFloat(min, 'g', 4, 64)}}
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
	var ticks []plot.Tick
	for v := math.Ceil(min/step) * step; v <= max+step*1e-9; v += step {
		if math.Abs(v) < step*1e-9 {
			v = 0 // no "-0"
		}
		ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', decimals, 64)})
	}
	return ticks
}

// drawSVG draws p with its legend in a column on the right, as an SVG
// element for inlining: no XML prologue, no namespace declarations (the
// HTML parser gives <svg> its namespace), labelled for screen readers.
func drawSVG(p *plot.Plot, legend plot.Legend, height vg.Length, title string) ([]byte, error) {
	c := vgsvg.New(chartWidth, height)
	dc := draw.New(c)
	p.Draw(draw.Crop(dc, 0, -legendWidth, 0, 0))
	legend.Draw(draw.Crop(dc, chartWidth-legendWidth+vg.Points(12), 0, 0, -vg.Points(28)))
	var buf bytes.Buffer
	if _, err := c.WriteTo(&buf); err != nil {
		return nil, errors.Wrapf(err, "chart %q", title)
	}
	return inline(buf.Bytes(), title)
}

// svgStart matches what vgsvg writes before the drawing: the XML
// prologue, its comment and the <svg> tag's namespace declarations.
var (
	svgPrologue = regexp.MustCompile(`(?s)^.*?<svg `)
	svgXMLNS    = regexp.MustCompile(`\s+xmlns(:xlink)?="[^"]*"`)
)

func inline(svg []byte, title string) ([]byte, error) {
	loc := svgPrologue.FindIndex(svg)
	if loc == nil {
		return nil, errors.AssertionFailedf("chart %q: gonum wrote no <svg> element", title)
	}
	tagEnd := bytes.IndexByte(svg[loc[1]:], '>')
	if tagEnd < 0 {
		return nil, errors.AssertionFailedf("chart %q: gonum's <svg> tag is not closed", title)
	}
	tag := svgXMLNS.ReplaceAll(svg[loc[1]:loc[1]+tagEnd], nil)
	var out bytes.Buffer
	out.WriteString(`<svg role="img" aria-label="` + html.EscapeString(title) + `" `)
	out.Write(bytes.TrimSpace(tag))
	out.Write(svg[loc[1]+tagEnd:])
	return bytes.TrimSpace(out.Bytes()), nil
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
	colors := map[string]color.Color{}
	for i, k := range m.Kinds {
		c := k.Color
		if c == nil {
			c = mapPalette[i%len(mapPalette)]
		}
		colors[k.Name] = c
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
	p := newPlot(m.Title, labelX, "")
	names := make([]string, len(m.Rows))
	const half = 0.35 // half a bar's height, in rows
	for i, r := range m.Rows {
		y := float64(len(m.Rows) - 1 - i) // the first row on top
		names[len(m.Rows)-1-i] = r.Name
		rings := map[string][]plotter.XYer{}
		for _, s := range rows[i] {
			x0, x1 := float64(s.Offset)/div, float64(s.Offset+s.Size)/div
			rings[s.Kind] = append(rings[s.Kind], plotter.XYs{{X: x0, Y: y - half}, {X: x1, Y: y - half}, {X: x1, Y: y + half}, {X: x0, Y: y + half}})
		}
		for _, k := range m.Kinds {
			if len(rings[k.Name]) == 0 {
				continue
			}
			poly, err := plotter.NewPolygon(rings[k.Name]...)
			if err != nil {
				return nil, errors.Wrapf(err, "memory map %q", m.Title)
			}
			poly.Color, poly.LineStyle.Width = colors[k.Name], 0
			p.Add(poly)
		}
	}
	legend := newLegend()
	for _, k := range m.Kinds {
		swatch := &plotter.Polygon{Color: colors[k.Name]}
		swatch.LineStyle.Width = 0
		legend.Add(k.Name, swatch)
	}
	if len(names) > 0 {
		p.NominalY(names...)
	}
	p.X.Min, p.X.Max = 0, math.Max(float64(most)/div, 1e-9)
	p.Y.Min, p.Y.Max = -0.5, math.Max(float64(len(m.Rows))-0.5, 0.5)
	height := vg.Length(len(m.Rows))*0.5*vg.Inch + 1.3*vg.Inch
	return drawSVG(p, legend, max(height, 2.2*vg.Inch), m.Title)
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
