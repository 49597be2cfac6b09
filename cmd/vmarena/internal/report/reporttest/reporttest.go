// Package reporttest reads a page package report wrote and checks it as a
// browser with no network would need it to be, for the tests of report
// and of the commands that write reports. It fails the test at the first
// thing wrong.
package reporttest

import (
	"bytes"
	"encoding/xml"
	"io"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Page is what a reader sees of a report.
type Page struct {
	Title    string
	Intro    []string
	Sections []Section
}

// Section is a section of a page.
type Section struct {
	Title  string
	Notes  []string
	Charts []Chart
	Tables []Table
}

// Chart is one inline SVG: its accessible label, every text it draws
// (title, axis labels, tick labels, legend) in order, the number of
// drawn paths, and its caption.
type Chart struct {
	Label   string
	Texts   []string
	Paths   int
	Caption string
}

// Table is a table's caption, header and rows of cells (a row's label
// first).
type Table struct {
	Caption string
	Header  []string
	Rows    [][]string
}

// Section returns the page's section titled title, failing t when there
// is none.
func (p Page) Section(t testing.TB, title string) Section {
	t.Helper()
	var titles []string
	for _, s := range p.Sections {
		if s.Title == title {
			return s
		}
		titles = append(titles, s.Title)
	}
	require.Failf(t, "no such section", "no section %q; the page has %q", title, titles)
	return Section{}
}

// Has reports whether the chart draws the text s.
func (c Chart) Has(s string) bool {
	for _, t := range c.Texts {
		if t == s {
			return true
		}
	}
	return false
}

// forbidden are elements that would load or run something: a report has
// none.
var forbidden = map[string]bool{"script": true, "link": true, "img": true, "iframe": true, "object": true,
	"embed": true, "image": true, "use": true, "foreignObject": true, "audio": true, "video": true, "source": true}

// address matches anything that names a place outside the file.
var address = regexp.MustCompile(`(?i)(\b(https?|ftp|file)://|\bdata:[a-z-]+/[a-z0-9.+-]+[;,]|url\(|@import)`)

// Read checks data and returns what it shows. It checks that data is one
// HTML document with a doctype; that it is well-formed XML throughout, so
// every element is closed and every inline SVG parses; that it has one
// html, head, title and body element; that it names nothing outside
// itself: no script, stylesheet link, image, frame or object, no src or
// href attribute, no address (http://, file://, a data: URI, url(),
// @import);
// and that every chart has a label, a size and something drawn.
func Read(t testing.TB, data []byte) Page {
	t.Helper()
	require.True(t, bytes.HasPrefix(data, []byte("<!DOCTYPE html>")), "the page starts with the HTML doctype")
	if m := address.Find(data); m != nil {
		i := bytes.Index(data, m)
		require.Failf(t, "the page names something outside itself", "%q at byte %d: …%s…", m, i, data[max(0, i-80):min(len(data), i+80)])
	}
	d := xml.NewDecoder(bytes.NewReader(data))
	d.Strict = true
	var (
		p      Page
		stack  []string
		counts = map[string]int{}
		sec    *Section
		chart  *Chart
		table  *Table
		row    []string
		text   strings.Builder
	)
	in := func(name string) bool {
		for _, s := range stack {
			if s == name {
				return true
			}
		}
		return false
	}
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		require.NoError(t, err, "the page is well-formed")
		switch tok := tok.(type) {
		case xml.StartElement:
			name := tok.Name.Local
			require.False(t, forbidden[name], "the page has a <%s> element", name)
			for _, a := range tok.Attr {
				require.NotContains(t, []string{"src", "href", "srcset", "action", "background"}, a.Name.Local,
					"<%s> has a %s attribute", name, a.Name.Local)
				require.False(t, strings.HasPrefix(strings.ToLower(a.Name.Local), "on"), "<%s> has an event handler %s", name, a.Name.Local)
			}
			counts[name]++
			stack = append(stack, name)
			text.Reset()
			switch name {
			case "section":
				p.Sections = append(p.Sections, Section{})
				sec = &p.Sections[len(p.Sections)-1]
			case "svg":
				require.NotNil(t, sec, "charts are in sections")
				sec.Charts = append(sec.Charts, Chart{})
				chart = &sec.Charts[len(sec.Charts)-1]
				attrs := map[string]string{}
				for _, a := range tok.Attr {
					attrs[a.Name.Local] = a.Value
				}
				for _, a := range []string{"aria-label", "width", "height", "viewBox"} {
					require.NotEmpty(t, attrs[a], "an <svg> with no %s", a)
				}
				chart.Label = attrs["aria-label"]
			case "path":
				if chart != nil {
					chart.Paths++
				}
			case "table":
				require.NotNil(t, sec, "tables are in sections")
				sec.Tables = append(sec.Tables, Table{})
				table = &sec.Tables[len(sec.Tables)-1]
			case "tr":
				row = nil
			}
		case xml.CharData:
			text.Write(tok)
		case xml.EndElement:
			name := tok.Name.Local
			require.NotEmpty(t, stack)
			stack = stack[:len(stack)-1]
			s := strings.TrimSpace(text.String())
			switch {
			case name == "title" && !in("svg"):
				require.Empty(t, p.Title, "one <title>")
				p.Title = s
			case name == "h1":
				require.Equal(t, p.Title, s, "the heading is the title")
			case name == "p" && sec == nil:
				p.Intro = append(p.Intro, s)
			case name == "p":
				sec.Notes = append(sec.Notes, s)
			case name == "h2":
				sec.Title = s
			case name == "text" && chart != nil:
				chart.Texts = append(chart.Texts, s)
			case name == "svg":
				require.NotZero(t, chart.Paths, "chart %q draws nothing", chart.Label)
				chart = nil
			case name == "figcaption":
				sec.Charts[len(sec.Charts)-1].Caption = s
			case name == "caption":
				table.Caption = s
			case (name == "th" || name == "td") && in("thead"):
				table.Header = append(table.Header, s)
			case name == "th" || name == "td":
				row = append(row, s)
			case name == "tr" && in("tbody"):
				table.Rows = append(table.Rows, row)
			case name == "table":
				table = nil
			case name == "section":
				sec = nil
			}
			text.Reset()
		case xml.Directive:
			require.Equal(t, "DOCTYPE html", string(tok), "the doctype")
		case xml.ProcInst:
			require.Failf(t, "a processing instruction", "<?%s?> in the page", tok.Target)
		}
	}
	require.Empty(t, stack, "every element is closed")
	for _, e := range []string{"html", "head", "title", "body", "h1"} {
		require.Equal(t, 1, counts[e], "<%s> elements", e)
	}
	return p
}
