package reporttest

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// failures is a testing.TB that records failures instead of failing, so
// that Read can be shown to refuse a page.
type failures struct {
	testing.TB
	msgs []string
}

func (f *failures) Helper() {}
func (f *failures) Errorf(format string, args ...any) {
	f.msgs = append(f.msgs, fmt.Sprintf(format, args...))
}
func (f *failures) FailNow() { runtime.Goexit() }

// refuses runs Read on page and returns what it said was wrong.
func refuses(t *testing.T, page string) string {
	f := &failures{TB: t}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		Read(f, []byte(page))
	}()
	wg.Wait()
	require.NotEmpty(t, f.msgs, "Read accepted:\n%s", page)
	return strings.Join(f.msgs, "\n")
}

const good = `<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"/><title>t</title><style>p { color: #222; }</style></head>
<body><h1>t</h1><p>intro</p>
<section><h2>s</h2><p>note</p>
<figure><svg role="img" aria-label="c" width="10pt" height="10pt" viewBox="0 0 10 10"><path d="M0 0L1 1"/><text>label</text></svg><figcaption>cap</figcaption></figure>
<table><caption>tc</caption><thead><tr><th>a</th><th>b</th></tr></thead><tbody><tr><th scope="row">r</th><td>1 &amp; 2</td></tr></tbody></table>
</section></body></html>`

// TestRead: a good page reads back whole; each kind of fault is refused,
// saying what it is.
func TestRead(t *testing.T) {
	p := Read(t, []byte(good))
	require.Equal(t, Page{Title: "t", Intro: []string{"intro"}, Sections: []Section{{
		Title:  "s",
		Notes:  []string{"note"},
		Charts: []Chart{{Label: "c", Texts: []string{"label"}, Paths: 1, Caption: "cap"}},
		Tables: []Table{{Caption: "tc", Header: []string{"a", "b"}, Rows: [][]string{{"r", "1 & 2"}}}},
	}}}, p)
	require.True(t, p.Sections[0].Charts[0].Has("label"))

	for _, tc := range []struct{ what, from, to, says string }{
		{"no doctype", "<!DOCTYPE html>", "", "doctype"},
		{"a script", "<p>intro</p>", `<p>intro</p><script>console.error("boom")</script>`, "<script>"},
		{"an image", "<p>note</p>", `<p>note</p><img alt="x"/>`, "<img>"},
		{"a link", "<p>note</p>", `<p><a href="x.html">x</a></p>`, "href"},
		{"an address", "intro", "see https://example.com", "names something outside itself"},
		{"a style sheet import", "p { color", "@import 'x.css'; p { color", "names something outside itself"},
		{"an unclosed element", "<p>note</p>", "<p>note", "well-formed"},
		{"an empty chart", `<path d="M0 0L1 1"/>`, "", "draws nothing"},
		{"a chart with no label", ` aria-label="c"`, "", "aria-label"},
		{"two bodies", "</body>", "</body><body></body>", "<body> elements"},
	} {
		t.Run(tc.what, func(t *testing.T) {
			page := strings.Replace(good, tc.from, tc.to, 1)
			require.NotEqual(t, good, page)
			require.Contains(t, refuses(t, page), tc.says)
		})
	}
}
