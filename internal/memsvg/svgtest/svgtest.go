// Package svgtest reads a memsvg picture back the way a person looks at
// one, for the tests of what draws them: it parses the SVG (failing the
// test unless it is well-formed, with a root <svg> whose width, height and
// viewBox agree), and gives the texts by what they are (title, caption,
// legend, alias lines...), the cells with their colours, the gap bars, and
// the granule counts the caption states.
package svgtest

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/memsvg"
)

// node is an element of the document, generically.
type node struct {
	XMLName xml.Name
	Attrs   []xml.Attr `xml:",any,attr"`
	Text    string     `xml:",chardata"`
	Nodes   []node     `xml:",any"`
}

func (n *node) attr(name string) string {
	for _, a := range n.Attrs {
		if a.Name.Local == name {
			return a.Value
		}
	}
	return ""
}

// Cell is a cell of the grid: its classes ("cell accessible alias"), its
// fill and its tooltip.
type Cell struct {
	Class, Fill, Tooltip string
}

// Doc is a picture as read back.
type Doc struct {
	Width, Height int
	// Title is the document's <title>.
	Title string
	// Texts are the lines of text by class: "title", "range", "counts",
	// "legend", "alias", "chunk-list", "mark-list", "caption", "note",
	// "gap-text", "chunk" (a cell's label), "axis", "empty".
	Texts map[string][]string
	Cells []Cell
	// Gaps are the granules each gap bar stands for.
	Gaps []uint64
	// Swatches are the legend's colours by label.
	Swatches map[string]string
}

// ReadFile reads and parses the picture at path.
func ReadFile(t testing.TB, path string) *Doc {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	return Parse(t, data)
}

// gapText is a gap bar's text.
var gapText = regexp.MustCompile(`^… \S+ \S+ reserved \((\d+) granules\) …$`)

// Parse parses a picture, failing the test where it is not a well-formed
// SVG document of the shape memsvg writes.
func Parse(t testing.TB, data []byte) *Doc {
	t.Helper()
	var root node
	require.NoError(t, xml.NewDecoder(bytes.NewReader(data)).Decode(&root), "well-formed XML")
	require.Equal(t, "svg", root.XMLName.Local, "the root element")
	require.Equal(t, "http://www.w3.org/2000/svg", root.XMLName.Space)
	d := &Doc{Texts: map[string][]string{}, Swatches: map[string]string{}}
	var err error
	d.Width, err = strconv.Atoi(root.attr("width"))
	require.NoError(t, err, "width")
	d.Height, err = strconv.Atoi(root.attr("height"))
	require.NoError(t, err, "height")
	require.Positive(t, d.Width)
	require.Positive(t, d.Height)
	require.Equal(t, fmt.Sprintf("0 0 %d %d", d.Width, d.Height), root.attr("viewBox"))
	var swatch string // the fill of the last legend swatch, waiting for its label
	for i := range root.Nodes {
		n := &root.Nodes[i]
		class := n.attr("class")
		switch {
		case n.XMLName.Local == "title":
			d.Title = n.Text
		case n.XMLName.Local == "text":
			d.Texts[class] = append(d.Texts[class], n.Text)
			if class == "legend" {
				d.Swatches[n.Text] = swatch
			}
			if class == "gap-text" {
				m := gapText.FindStringSubmatch(n.Text)
				require.NotNil(t, m, "a gap bar says how many granules it stands for: %q", n.Text)
				g, _ := strconv.ParseUint(m[1], 10, 64)
				d.Gaps = append(d.Gaps, g)
			}
		case n.XMLName.Local == "rect" && class == "legend-swatch":
			swatch = n.attr("fill")
		case n.XMLName.Local == "rect" && strings.HasPrefix(class, "cell "):
			c := Cell{Class: class, Fill: n.attr("fill")}
			for _, k := range n.Nodes {
				if k.XMLName.Local == "title" {
					c.Tooltip = k.Text
				}
			}
			d.Cells = append(d.Cells, c)
		}
	}
	return d
}

// caption is the caption's first line.
var caption = regexp.MustCompile(`^(\d+) granules of (\S+ \S+) in (\d+) ranges?: (\d+) reserved, (\d+) mapped, (\d+) accessible\.$`)

// Counts are the granules of each state the caption states, failing the
// test if it states none.
func (d *Doc) Counts(t testing.TB) memsvg.Counts {
	t.Helper()
	require.NotEmpty(t, d.Texts["caption"], "a caption")
	m := caption.FindStringSubmatch(d.Texts["caption"][0])
	require.NotNil(t, m, "the caption counts granules: %q", d.Texts["caption"][0])
	n := func(s string) uint64 {
		v, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err)
		return v
	}
	c := memsvg.Counts{Reserved: n(m[4]), Mapped: n(m[5]), Accessible: n(m[6])}
	require.Equal(t, n(m[1]), c.Total(), "the caption's total is its parts' sum")
	return c
}

// CellsByFill counts the cells of each colour.
func (d *Doc) CellsByFill() map[string]int {
	out := map[string]int{}
	for _, c := range d.Cells {
		out[c.Fill]++
	}
	return out
}

// Aliases are the legend's lines of aliased chunks.
func (d *Doc) Aliases() []string { return d.Texts["alias"] }

// Has reports whether a line of text of the class contains s.
func (d *Doc) Has(class, s string) bool {
	for _, l := range d.Texts[class] {
		if strings.Contains(l, s) {
			return true
		}
	}
	return false
}
