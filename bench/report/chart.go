package main

import (
	"image/color"
	"io"
	"math"
	"slices"

	"github.com/vmarena/vmarena/internal/errors"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// chartTitle says how to read the chart: its ratios run from a quarter
// (Alloc+Free against Go's make) to tens (growth against append), so the
// axis is logarithmic and every bar is the ratio itself, not a ratio
// over its target.
const chartTitle = "vmarena benchmarks: each ratio against its target (log scale)"

// The chart's colours: a bar that meets its target, one that misses it,
// and the target's mark.
var (
	metColour    = color.RGBA{R: 46, G: 139, B: 87, A: 255}
	missedColour = color.RGBA{R: 205, G: 80, B: 70, A: 255}
	targetColour = color.Black
)

// Sizes of the chart: a bar's band of the height, and the rest.
const (
	rowHeight   = 0.32 * vg.Inch
	chartWidth  = 11 * vg.Inch
	chartMargin = 1.8 * vg.Inch // title, legend and the ratio axis
)

// writeChart writes an SVG chart of es to w: one horizontal bar per
// measured ratio, labelled with its path, on a logarithmic ratio axis,
// its target marked across it and its value and target written beside
// it; green where the target is met, red where it is missed. Entries not
// measured, or not above zero (a log axis has no place for them), are
// left out; with none left it returns an error.
func writeChart(w io.Writer, es []entry) error {
	var shown []entry
	for _, e := range es {
		if e.measured && e.value > 0 && e.row.target > 0 {
			shown = append(shown, e)
		}
	}
	if len(shown) == 0 {
		return errors.New("no ratio above zero was measured: nothing to chart")
	}
	slices.Reverse(shown) // the first entry at the top

	// Sans serif, as the docs page around it. (The SVG names the
	// font rather than embedding it, which would add half a megabyte.)
	plot.DefaultFont = font.Font{Typeface: "Liberation", Variant: "Sans"}
	p := plot.New()
	p.Title.Text = chartTitle
	p.Title.TextStyle.Font.Size = vg.Points(14)
	p.X.Label.Text = "ratio (log scale): the bar is the measured ratio, the black mark its target; green meets it, red misses it"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = logTicks{}
	p.X.Tick.Label.Font.Size = vg.Points(10)
	p.Y.Tick.Label.Font.Size = vg.Points(10)

	lo, hi := math.Inf(1), math.Inf(-1)
	labels := make([]string, len(shown))
	for i, e := range shown {
		lo = min(lo, e.value, e.row.target)
		hi = max(hi, e.value, e.row.target)
		labels[i] = e.label
	}
	grid := plotter.NewGrid()
	grid.Horizontal.Color = nil
	p.Add(grid)
	text := p.X.Tick.Label
	text.XAlign, text.YAlign = draw.XLeft, draw.YCenter
	p.Add(ratioBars{entries: shown, text: text})
	p.NominalY(labels...)
	// Room on the left for the bars to start, on the right for the
	// figures written past the longest bar, and above the top bar for
	// the legend.
	p.X.Min, p.X.Max = lo/1.6, hi*4
	p.Y.Min, p.Y.Max = -0.6, float64(len(shown))+0.9

	p.Legend.Top = true
	p.Legend.TextStyle.Font.Size = vg.Points(10)
	p.Legend.Add("measured, meets its target", swatch{metColour})
	p.Legend.Add("measured, misses its target", swatch{missedColour})
	p.Legend.Add("target", targetMark{})

	wt, err := p.WriterTo(chartWidth, chartMargin+vg.Length(len(shown))*rowHeight, "svg")
	if err != nil {
		return errors.Wrap(err, "chart")
	}
	_, err = wt.WriteTo(w)
	return errors.Wrap(err, "chart")
}

// ratioBars draws the chart's bars: entry i at y = i, from the axis's
// left end to its value, its target a black mark across the bar, and
// "value (≤ target)" written past the longer of the two.
type ratioBars struct {
	entries []entry
	text    draw.TextStyle
}

// barWidth is a bar's thickness, in rows.
const barWidth = 0.62

func (b ratioBars) Plot(c draw.Canvas, plt *plot.Plot) {
	trX, trY := plt.Transforms(&c)
	half := (trY(barWidth) - trY(0)) / 2
	mark := draw.LineStyle{Color: targetColour, Width: vg.Points(2.5)}
	for i, e := range b.entries {
		y := trY(float64(i))
		x0, x1 := trX(plt.X.Min), trX(e.value)
		fill := missedColour
		if e.met() {
			fill = metColour
		}
		c.FillPolygon(fill, c.ClipPolygonXY([]vg.Point{
			{X: x0, Y: y - half}, {X: x0, Y: y + half}, {X: x1, Y: y + half}, {X: x1, Y: y - half},
		}))
		tx := trX(e.row.target)
		c.StrokeLine2(mark, tx, y-1.35*half, tx, y+1.35*half)
		c.FillText(b.text, vg.Point{X: max(x1, tx) + vg.Points(6), Y: y},
			e.measuredText()+"  ("+e.row.bound()+")")
	}
}

// DataRange is the bars' extent: every value and target, one row each.
func (b ratioBars) DataRange() (xmin, xmax, ymin, ymax float64) {
	xmin, xmax = math.Inf(1), math.Inf(-1)
	for _, e := range b.entries {
		xmin = min(xmin, e.value, e.row.target)
		xmax = max(xmax, e.value, e.row.target)
	}
	return xmin, xmax, -0.5, float64(len(b.entries)) - 0.5
}

// swatch is a legend's filled box.
type swatch struct{ colour color.Color }

func (s swatch) Thumbnail(c *draw.Canvas) {
	c.FillPolygon(s.colour, c.ClipPolygonXY([]vg.Point{
		{X: c.Min.X, Y: c.Min.Y}, {X: c.Min.X, Y: c.Max.Y}, {X: c.Max.X, Y: c.Max.Y}, {X: c.Max.X, Y: c.Min.Y},
	}))
}

// targetMark is the legend's target: the bars' upright black mark.
type targetMark struct{}

func (targetMark) Thumbnail(c *draw.Canvas) {
	x := (c.Min.X + c.Max.X) / 2
	c.StrokeLine2(draw.LineStyle{Color: targetColour, Width: vg.Points(2.5)}, x, c.Min.Y, x, c.Max.Y)
}

// logTicks marks a logarithmic axis at 1, 2 and 5 of each decade, with
// unlabelled marks between: plot.LogTicks labels only the powers of ten,
// and the ratios here mostly lie between two of them.
type logTicks struct{}

func (logTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for d := math.Floor(math.Log10(lo)); d <= math.Ceil(math.Log10(hi)); d++ {
		for m := 1; m < 10; m++ {
			v := float64(m) * math.Pow(10, d)
			if v < lo || v > hi {
				continue
			}
			t := plot.Tick{Value: v}
			if m == 1 || m == 2 || m == 5 {
				t.Label = formatFloat(v, -1)
				if d < 0 {
					t.Label = formatFloat(v, int(-d))
				}
			}
			ticks = append(ticks, t)
		}
	}
	return ticks
}
