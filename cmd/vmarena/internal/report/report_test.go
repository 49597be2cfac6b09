package report

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/cmd/vmarena/internal/report/reporttest"
)

// examplePage has a chart of a long series in bytes and a short one, a
// memory map of three ranges (one of 5000 alternating blocks), and a
// table whose cells need escaping.
func examplePage() Page {
	var long, short Series
	long.Name, short.Name = "committed <vmarena>", `reserved "PyTorch" & co`
	for i := range 10_000 {
		long.X = append(long.X, float64(i+1))
		long.Y = append(long.Y, 3<<30+float64(i%500)*(1<<20))
	}
	long.Y[7777] = 5 << 30 // the peak: 5 GiB
	short.X, short.Y = []float64{1, 5000, 10_000}, []float64{1 << 30, 2 << 30, 1.5 * (1 << 30)}
	var many []Segment
	for i := range 5000 {
		kind := "allocated"
		if i%2 == 1 {
			kind = "free"
		}
		many = append(many, Segment{Offset: uint64(i) << 20, Size: 1 << 20, Kind: kind})
	}
	return Page{
		Title: "replay of a.csv & b.csv",
		Intro: []string{"sim driver, 80 GiB devices"},
		Sections: []Section{
			{Title: "figures", Tables: []Table{{
				Caption: "what it did",
				Header:  []string{"trace", "a <1>", "b"},
				Rows:    [][]string{{"events", "10000", "97"}, {"peak committed", "5.00 GiB", "—"}, {"ratio & more", `1.0039 "x"`, "n/a"}},
			}}},
			{Title: "a <1>", Notes: []string{"device 0"}, Charts: []Chart{
				LineChart{Title: "memory over the trace", X: Axis{Label: "event", Unit: Count}, Y: Axis{Label: "memory", Unit: Bytes},
					Series: []Series{long, short}, Caption: "allocated and committed"},
				MemoryMap{Title: "memory map at the peak",
					Kinds: []Kind{{Name: "allocated"}, {Name: "free"}, {Name: "stitched"}, {Name: "not committed"}},
					Rows: []MapRow{
						{Name: "small requests", Segments: many},
						{Name: "large requests", Segments: []Segment{{0, 2 << 30, "allocated"}, {2 << 30, 1 << 30, "not committed"}, {3 << 30, 512 << 20, "stitched"}}},
						{Name: "stitch range", Segments: []Segment{{0, 512 << 20, "stitched"}}},
					}},
			}},
		},
	}
}

// TestWrite writes the example page and reads it back as a browser
// would need it (reporttest.Read: one well-formed document, every SVG
// parsing as XML, nothing named outside the file), then checks what a
// reader sees: the titles, the notes, the table cell for cell as given,
// and in the charts their titles, axis labels with their units, the
// series' and kinds' names in the legends, the ranges' names; the long
// series is drawn thinned, so the page stays small.
func TestWrite(t *testing.T) {
	var buf bytes.Buffer
	require.NoError(t, Write(&buf, examplePage()))
	p := reporttest.Read(t, buf.Bytes())
	require.Equal(t, "replay of a.csv & b.csv", p.Title)
	require.Equal(t, []string{"sim driver, 80 GiB devices"}, p.Intro)
	require.Len(t, p.Sections, 2)

	fig := p.Section(t, "figures")
	require.Empty(t, fig.Charts)
	require.Equal(t, []reporttest.Table{{
		Caption: "what it did",
		Header:  []string{"trace", "a <1>", "b"},
		Rows:    [][]string{{"events", "10000", "97"}, {"peak committed", "5.00 GiB", "—"}, {"ratio & more", `1.0039 "x"`, "n/a"}},
	}}, fig.Tables)

	dev := p.Section(t, "a <1>")
	require.Equal(t, []string{"device 0"}, dev.Notes)
	require.Len(t, dev.Charts, 2)
	line, mm := dev.Charts[0], dev.Charts[1]
	require.Equal(t, "memory over the trace", line.Label)
	require.Equal(t, "allocated and committed", line.Caption)
	for _, s := range []string{"memory over the trace", "event", "memory (GiB)", "committed <vmarena>", `reserved "PyTorch" & co`, "5"} {
		require.True(t, line.Has(s), "the line chart draws %q: %q", s, line.Texts)
	}
	require.Equal(t, "memory map at the peak", mm.Label)
	for _, s := range []string{"memory map at the peak", "offset in the range (GiB)", "small requests", "large requests", "stitch range",
		"allocated", "free", "stitched", "not committed"} {
		require.True(t, mm.Has(s), "the map draws %q: %q", s, mm.Texts)
	}
	require.Less(t, buf.Len(), 400_000, "10,000 points and 5,000 blocks drawn thinned")
}

// TestWriteFile: the page goes to a file; a file that cannot be written
// is an error naming it.
func TestWriteFile(t *testing.T) {
	name := filepath.Join(t.TempDir(), "out.html")
	require.NoError(t, WriteFile(name, examplePage()))
	data, err := os.ReadFile(name)
	require.NoError(t, err)
	reporttest.Read(t, data)
	err = WriteFile(filepath.Join(t.TempDir(), "no", "such", "dir", "out.html"), examplePage())
	require.ErrorContains(t, err, "out.html")
}

// TestChartErrors: a series whose x and y differ in length, and a
// segment of a kind the map does not list, are errors that say which.
func TestChartErrors(t *testing.T) {
	err := Write(&bytes.Buffer{}, Page{Sections: []Section{{Title: "s", Charts: []Chart{
		LineChart{Title: "c", Series: []Series{{Name: "bad", X: []float64{1, 2}, Y: []float64{1}}}}}}}})
	require.ErrorContains(t, err, `series "bad" has 2 x values and 1 y values`)
	err = Write(&bytes.Buffer{}, Page{Sections: []Section{{Title: "s", Charts: []Chart{
		MemoryMap{Title: "m", Kinds: []Kind{{Name: "used"}}, Rows: []MapRow{{Name: "r", Segments: []Segment{{0, 1, "lent"}}}}}}}}})
	require.ErrorContains(t, err, `row "r" has a segment of kind "lent"`)
}

// TestEmptyCharts: a chart with no series, or a map with no rows, still
// draws (its axes and title).
func TestEmptyCharts(t *testing.T) {
	var buf bytes.Buffer
	require.NoError(t, Write(&buf, Page{Title: "empty", Sections: []Section{{Title: "s", Charts: []Chart{
		LineChart{Title: "no series", X: Axis{Label: "t", Unit: Seconds}, Y: Axis{Label: "n"}},
		LineChart{Title: "one flat point", Series: []Series{{Name: "x", X: []float64{0}, Y: []float64{0}}}},
		MemoryMap{Title: "no rows"}}}}}))
	p := reporttest.Read(t, buf.Bytes())
	require.True(t, p.Sections[0].Charts[0].Has("t (s)"))
}

// TestAxisScale: byte axes take the largest binary unit their largest
// value reaches.
func TestAxisScale(t *testing.T) {
	for _, tc := range []struct {
		most  float64
		div   float64
		label string
	}{
		{0, 1, "m (B)"}, {1023, 1, "m (B)"}, {1024, 1024, "m (KiB)"}, {3 << 20, 1 << 20, "m (MiB)"},
		{80 << 30, 1 << 30, "m (GiB)"}, {5 << 40, 1 << 40, "m (TiB)"}, {math.Ldexp(1, 60), 1 << 40, "m (TiB)"},
	} {
		div, label := Axis{Label: "m", Unit: Bytes}.scale(tc.most)
		require.Equal(t, tc.div, div, "%v", tc.most)
		require.Equal(t, tc.label, label)
	}
	_, label := Axis{Label: "sequences"}.scale(100)
	require.Equal(t, "sequences", label)
}

// TestCoarsen: neighbours of one kind merge; a row of more than n
// stretches becomes at most n, still tiling the row, each bin the kind
// holding most of its bytes.
func TestCoarsen(t *testing.T) {
	require.Equal(t, []Segment{{0, 30, "a"}, {30, 5, "b"}},
		merge([]Segment{{0, 10, "a"}, {10, 20, "a"}, {30, 5, "b"}, {35, 0, "a"}}))

	var segs []Segment
	for i := range uint64(1000) {
		kind := "rare"
		if i%4 != 0 {
			kind = "common"
		}
		segs = append(segs, Segment{Offset: i * 10, Size: 10, Kind: kind})
	}
	out := coarsen(segs, 100)
	require.Equal(t, []Segment{{0, 10_000, "common"}}, out, "each bin of 100 bytes is three quarters common")
	out = coarsen(segs, 2000)
	require.Len(t, out, 1000, "few enough: as they were")

	segs = append(merge(segs[:500]), Segment{Offset: 5000, Size: 5000, Kind: "rare"})
	out = coarsen(segs, 10)
	require.LessOrEqual(t, len(out), 10)
	at := uint64(0)
	for _, s := range out {
		require.Equal(t, at, s.Offset)
		at += s.Size
	}
	require.Equal(t, uint64(10_000), at)
	require.Equal(t, "rare", out[len(out)-1].Kind)
}

// TestNoScripts: a report carries no script, and its style sheet names
// nothing outside it.
func TestNoScripts(t *testing.T) {
	var buf bytes.Buffer
	require.NoError(t, Write(&buf, examplePage()))
	require.NotContains(t, strings.ToLower(buf.String()), "<script")
	require.NotContains(t, buf.String(), "<?xml", "no XML prologue inside HTML")
}

// TestNiceTicks: about six round steps, labelled with the decimals the
// step needs.
func TestNiceTicks(t *testing.T) {
	labels := func(min, max float64) []string {
		var out []string
		for _, tk := range niceTicks(min, max) {
			out = append(out, tk.Label)
		}
		return out
	}
	require.Equal(t, []string{"0", "1", "2", "3", "4", "5"}, labels(0, 5))
	require.Equal(t, []string{"2000", "4000", "6000", "8000", "10000"}, labels(1, 10_000))
	require.Equal(t, []string{"0.00", "0.05", "0.10", "0.15", "0.20", "0.25", "0.30"}, labels(0, 0.3))
	require.Equal(t, []string{"-2", "-1", "0", "1", "2"}, labels(-2.5, 2.5))
	require.Equal(t, []string{"7"}, labels(7, 7))
}

// TestLineChartSVG: the chart this package draws itself has what a
// reader reads a chart by: the title, both axes' labels and tick labels,
// a grid, a line per series (steps drawn as steps) in its own colour and
// dashes, and a legend naming each beside a swatch of its line.
func TestLineChartSVG(t *testing.T) {
	svg, err := LineChart{Title: "t", X: Axis{Label: "time", Unit: Seconds}, Y: Axis{Label: "memory", Unit: Bytes},
		Series: []Series{
			{Name: "a", X: []float64{0, 1, 2}, Y: []float64{0, 2 << 20, 1 << 20}, Steps: true},
			{Name: "b", X: []float64{0, 2}, Y: []float64{1 << 20, 3 << 20}},
			{Name: "empty"},
		}}.svg()
	require.NoError(t, err)
	s := string(svg)
	require.True(t, strings.HasPrefix(s, `<svg role="img" aria-label="t" `), s)
	for _, text := range []string{">t<", ">time (s)<", ">memory (MiB)<", ">0.0<", ">1.0<", ">2.0<", ">3.0<", ">0.5<", ">a<", ">b<"} {
		require.Contains(t, s, text)
	}
	require.NotContains(t, s, ">empty<", "a series with no points is not in the legend")
	require.Contains(t, s, `stroke="#808080" stroke-width="0.25"`, "the grid")
	require.Contains(t, s, `rotate(-90`, "the y label runs up the axis")
	require.Equal(t, 2, strings.Count(s, `stroke="`+lineColors[0]+`"`), "a's line and its legend swatch")
	require.Equal(t, 2, strings.Count(s, `stroke="`+lineColors[1]+`"`), "b's line and its legend swatch")
	require.Equal(t, 2, strings.Count(s, `stroke-dasharray="6,2"`), "b's dashes, on its line and its swatch")
	require.Regexp(t, `<path d="M[0-9.]+ [0-9.]+H[0-9.]+V[0-9.]+H`, s, "a's steps")
	require.Regexp(t, `<path d="M[0-9.]+ [0-9.]+L[0-9.]+ [0-9.]+" fill="none" stroke="`+regexp.QuoteMeta(lineColors[1]), s, "b's slope")
	require.Equal(t, 1, strings.Count(s, "<svg"), "one element")
	require.True(t, strings.HasSuffix(s, "</svg>"))
}

// TestNum: coordinates are written with at most two decimals, no
// trailing zeros and no "-0".
func TestNum(t *testing.T) {
	for in, want := range map[float64]string{0: "0", 10: "10", 10.5: "10.5", 1.239: "1.24", -0.001: "0", -2.5: "-2.5", 100.004: "100"} {
		require.Equal(t, want, num(in), "%v", in)
	}
}

// TestSeriesWidth: a series' Width is its line's width, in the chart and
// in the legend; without one it is DefaultWidth.
func TestSeriesWidth(t *testing.T) {
	flat := []float64{1, 1}
	svg, err := LineChart{Title: "t", Series: []Series{
		{Name: "under", X: []float64{0, 1}, Y: flat, Width: 4.4},
		{Name: "over", X: []float64{0, 1}, Y: flat},
	}}.svg()
	require.NoError(t, err)
	widths := regexp.MustCompile(`stroke-width="(4\.4|1\.6)"`).FindAllStringSubmatch(string(svg), -1)
	var got []string
	for _, w := range widths {
		got = append(got, w[1])
	}
	require.Equal(t, []string{"4.4", "1.6", "4.4", "1.6"}, got, "the lines, then the legend's")
}
