// Package report writes a page of figures — line charts, memory maps and
// tables — as one self-contained HTML file: the charts are drawn as
// inline SVG by the package's own small writer (axes, ticks, grid, lines
// and a legend; no charting library, so that every command linking it
// builds fast from cold), the style sheet is inline, and nothing
// else is referenced (no script, font, image or address of any kind), so
// the file opens anywhere with no network.
//
// It takes plain data — titled series, rows of cells, segments of a
// range — and knows nothing of the library's own types: the callers
// (vmarena replay and vmarena kv simulate) turn their results into a
// Page. Table cells are written as given, so a report's table can carry
// exactly the text of a printed one.
//
// Package reporttest reads a written page back and checks it as a
// reader's browser would need it to be.
package report

import (
	"bytes"
	"html/template"
	"io"

	"github.com/vmarena/vmarena/internal/atomicfile"
	"github.com/vmarena/vmarena/internal/errors"
)

// Page is one report.
type Page struct {
	// Title heads the page and names it in the browser.
	Title string
	// Intro is paragraphs under the title.
	Intro    []string
	Sections []Section
}

// Section is a titled part of a page: its notes, then its charts, then
// its tables.
type Section struct {
	Title  string
	Notes  []string
	Charts []Chart
	Tables []Table
}

// Table is a table of text: a header row and rows of cells. A row's first
// cell labels it.
type Table struct {
	Caption string
	Header  []string
	Rows    [][]string
}

// Chart is a chart a section draws: a LineChart or a MemoryMap.
type Chart interface {
	// svg draws the chart.
	svg() ([]byte, error)
	// caption is the text under it.
	caption() string
}

// Write writes p to w as one HTML document.
func Write(w io.Writer, p Page) error {
	doc := document{Title: p.Title, Intro: p.Intro}
	for _, s := range p.Sections {
		ds := docSection{Title: s.Title, Notes: s.Notes, Tables: s.Tables}
		for _, c := range s.Charts {
			svg, err := c.svg()
			if err != nil {
				return errors.Wrapf(err, "report: section %q", s.Title)
			}
			// The SVG is ours, written here with every text escaped.
			ds.Figures = append(ds.Figures, figure{SVG: template.HTML(svg), Caption: c.caption()})
		}
		doc.Sections = append(doc.Sections, ds)
	}
	var buf bytes.Buffer
	if err := page.Execute(&buf, doc); err != nil {
		return errors.Wrap(err, "report")
	}
	_, err := buf.WriteTo(w)
	return errors.Wrap(err, "report")
}

// WriteFile writes p to the file name, replacing it; a write that fails
// leaves name as it was (no half-written page).
func WriteFile(name string, p Page) error {
	var buf bytes.Buffer
	if err := Write(&buf, p); err != nil {
		return err
	}
	return errors.Wrap(atomicfile.Write(name, buf.Bytes(), 0o644), "report") // whole or not at all
}

// document is a Page with its charts drawn.
type document struct {
	Title    string
	Intro    []string
	Sections []docSection
}

type docSection struct {
	Title   string
	Notes   []string
	Figures []figure
	Tables  []Table
}

type figure struct {
	SVG     template.HTML
	Caption string
}

// page is the document's template. It is XHTML-compatible as well as
// HTML (every element closed, attributes quoted), so that a plain XML
// parser can check it (package reporttest).
var page = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8"/>
<meta name="viewport" content="width=device-width, initial-scale=1"/>
<title>{{.Title}}</title>
<style>
body { font-family: "Liberation Sans", Arial, Helvetica, sans-serif; margin: 2em auto; max-width: 1200px; padding: 0 1em; color: #222; }
h1 { font-size: 1.6em; }
h2 { font-size: 1.25em; margin-top: 2em; border-bottom: 1px solid #ccc; }
figure { margin: 1em 0; }
figure svg { max-width: 100%; height: auto; }
figcaption { font-size: 0.9em; color: #555; }
table { border-collapse: collapse; font-size: 0.9em; margin: 1em 0; }
caption { text-align: left; font-weight: bold; padding: 0.3em 0; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th[scope=row], thead th { text-align: left; }
thead th { background: #f2f2f2; }
tbody tr:nth-child(even) { background: #fafafa; }
</style>
</head>
<body>
<h1>{{.Title}}</h1>
{{range .Intro}}<p>{{.}}</p>
{{end}}{{range .Sections}}<section>
<h2>{{.Title}}</h2>
{{range .Notes}}<p>{{.}}</p>
{{end}}{{range .Figures}}<figure>
{{.SVG}}{{with .Caption}}<figcaption>{{.}}</figcaption>{{end}}
</figure>
{{end}}{{range .Tables}}<table>
{{with .Caption}}<caption>{{.}}</caption>
{{end}}<thead><tr>{{range .Header}}<th>{{.}}</th>{{end}}</tr></thead>
<tbody>
{{range .Rows}}<tr>{{range $i, $c := .}}{{if eq $i 0}}<th scope="row">{{$c}}</th>{{else}}<td>{{$c}}</td>{{end}}{{end}}</tr>
{{end}}</tbody>
</table>
{{end}}</section>
{{end}}</body>
</html>
`))
