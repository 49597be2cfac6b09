package doclint

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/require"
)

// docPage is one Markdown page a user reads: the README or a page of docs/.
type docPage struct {
	name string // relative to the module's root, slashes: "docs/arena.md"
	text string
}

// docPages returns README.md and every docs/*.md. The pages under
// docs/ subdirectories are not among them: docs/bench/ is what
// bench/report writes, and docs/incoming/ holds pieces not yet folded in.
func docPages(t *testing.T) []docPage {
	t.Helper()
	names := []string{"README.md"}
	more, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	require.NoError(t, err)
	for _, m := range more {
		rel, err := filepath.Rel(root, m)
		require.NoError(t, err)
		names = append(names, filepath.ToSlash(rel))
	}
	require.Greater(t, len(names), 1, "docs/ has pages")
	var out []docPage
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(n)))
		require.NoError(t, err)
		out = append(out, docPage{name: n, text: string(b)})
	}
	return out
}

// page returns the page of docPages named name.
func page(t *testing.T, name string) docPage {
	t.Helper()
	for _, d := range docPages(t) {
		if d.name == name {
			return d
		}
	}
	t.Fatalf("no page %s", name)
	return docPage{}
}

// fence matches a line that opens or closes a fenced code block.
var fence = regexp.MustCompile("^\\s*```")

// prose is md with its fenced code blocks and inline code spans blanked
// (line breaks kept, so line numbers stay), where no link or heading is.
func prose(md string) string {
	lines := strings.Split(stripFences(md), "\n")
	for i, l := range lines {
		lines[i] = codeSpan.ReplaceAllString(l, "``")
	}
	return strings.Join(lines, "\n")
}

// codeSpan is an inline code span of one line.
var codeSpan = regexp.MustCompile("`[^`]*`")

// heading is an ATX heading line; group 2 is its text.
var heading = regexp.MustCompile(`(?m)^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$`)

// anchors returns the anchors GitHub gives the headings of md: the text
// lowercased, everything but letters, digits, spaces, hyphens and
// underscores dropped, spaces made hyphens; a repeated one gets -1, -2…
func anchors(md string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	// Code spans keep their text in a heading's anchor: read headings
	// from md with only the fenced blocks blanked.
	for _, m := range heading.FindAllStringSubmatch(stripFences(md), -1) {
		a := slug(m[2])
		if n := seen[a]; n > 0 {
			out[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// slug is a heading's text as GitHub makes it an anchor.
func slug(text string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case unicode.IsLetter(r), unicode.IsDigit(r), r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// link is a Markdown link or image: group 1 its target.
var link = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// brokenLinks returns one message per relative link of the page named
// file (text md) whose file or heading is not there: read is how another
// page's text is had (false when it does not exist).
func brokenLinks(file, md string, read func(path string) (string, bool)) []string {
	var bad []string
	p := prose(md)
	for _, m := range link.FindAllStringSubmatchIndex(p, -1) {
		target := p[m[2]:m[3]]
		line := 1 + strings.Count(p[:m[0]], "\n")
		if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
			continue
		}
		path, anchor, _ := strings.Cut(target, "#")
		text := md
		if path != "" {
			dest := filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(file), path)))
			if dest == ".." || strings.HasPrefix(dest, "../") {
				bad = append(bad, fmt.Sprintf("%s:%d: %s points outside the repository", file, line, target))
				continue
			}
			t, ok := read(dest)
			if !ok {
				bad = append(bad, fmt.Sprintf("%s:%d: %s: no such file %s", file, line, target, dest))
				continue
			}
			if anchor != "" && !strings.HasSuffix(dest, ".md") {
				bad = append(bad, fmt.Sprintf("%s:%d: %s: an anchor into a file that is not Markdown", file, line, target))
				continue
			}
			text = t
		}
		if anchor != "" && !anchors(text)[anchor] {
			bad = append(bad, fmt.Sprintf("%s:%d: %s: no heading makes the anchor #%s", file, line, target, anchor))
		}
	}
	return bad
}

// readRepo reads a file or names a directory of the module, by a path
// relative to its root.
func readRepo(path string) (string, bool) {
	full := filepath.Join(root, filepath.FromSlash(path))
	st, err := os.Stat(full)
	if err != nil {
		return "", false
	}
	if st.IsDir() {
		return "", true
	}
	b, err := os.ReadFile(full)
	return string(b), err == nil
}

// TestDocsLinksResolve: every relative link and image of the README,
// CONTRIBUTING.md and the docs/ pages names a file of the repository, and every #anchor a
// heading of the page it points into (as GitHub makes anchors). No link
// leaves the repository by a relative path: a user of it has nothing
// beside it.
func TestDocsLinksResolve(t *testing.T) {
	var bad []string
	links := 0
	contributing, err := os.ReadFile(filepath.Join(root, "CONTRIBUTING.md"))
	require.NoError(t, err)
	for _, d := range append(docPages(t), docPage{"CONTRIBUTING.md", string(contributing)}) {
		links += len(link.FindAllString(prose(d.text), -1))
		bad = append(bad, brokenLinks(d.name, d.text, readRepo)...)
	}
	require.Greater(t, links, 20, "the pages link to each other")
	if len(bad) > 0 {
		t.Errorf("links that do not resolve:\n%s", strings.Join(bad, "\n"))
	}
}

// TestLinkChecker: the checker behind TestDocsLinksResolve finds a
// missing file, a missing heading in this page and in another, a path
// out of the repository, and accepts anchors as GitHub makes them
// (punctuation dropped, code kept, repeats numbered), links in code left
// alone.
func TestLinkChecker(t *testing.T) {
	files := map[string]string{
		"docs/b.md": "# B\n\n## Sleep and wake: a model's memory\n\n## `Step`, one call\n\n## Twice\n\n## Twice\n",
		"README.md": "",
	}
	read := func(p string) (string, bool) { s, ok := files[p]; return s, ok }
	md := strings.Join([]string{
		"# A",              // 1
		"## Local heading", // 2
		"[ok](#local-heading) [ok](b.md#twice-1)",     // 3
		"[ok](b.md#sleep-and-wake-a-models-memory)",   // 4
		"[ok](b.md#step-one-call) [ok](../README.md)", // 5
		"[bad](#nowhere)",                               // 6
		"[bad](c.md)",                                   // 7
		"[bad](b.md#twice-2)",                           // 8
		"[bad](../../shared/DESIGN.md)",                 // 9
		"`[code](nowhere.md)` [web](https://x.org/y#z)", // 10
		"```",
		"[code](nowhere.md)",
		"```",
		"![bad](pic.svg)", // 14
	}, "\n")
	bad := brokenLinks("docs/a.md", md, read)
	require.Len(t, bad, 5, "%s", strings.Join(bad, "\n"))
	for i, want := range []string{"docs/a.md:6: ", "docs/a.md:7: ", "docs/a.md:8: ", "docs/a.md:9: ", "docs/a.md:14: "} {
		require.True(t, strings.HasPrefix(bad[i], want), bad[i])
	}
	require.Contains(t, bad[3], "outside the repository")
}

// history matches what a page must not say: the project's own issue and
// branch names ("issue 19", "iss19-commit", "this branch"), which a user
// cannot look up,
// and paths into the project's notes beside the repository (../shared).
var history = regexp.MustCompile(`(?i)\bissues? \d+|\biss\d+[a-z]*-|\bthis branch\b|\.\./shared`)

// TestDocsStateHowThingsAre: the README and the docs/ pages name no issue
// or branch of the project and point at nothing beside the repository; a
// page says how things are now.
func TestDocsStateHowThingsAre(t *testing.T) {
	var bad []string
	for _, d := range docPages(t) {
		for i, l := range strings.Split(d.text, "\n") {
			if m := history.FindString(l); m != "" {
				bad = append(bad, fmt.Sprintf("%s:%d: %q", d.name, i+1, m))
			}
		}
	}
	require.Empty(t, bad, "say how things are now: no issue numbers, branch names or ../shared")
}

// TestDocsPagesHaveContents: each page of docs/ has one title and, before
// its first section, a contents list that links to every section (## heading)
// of the page, in order; the README links to every page.
func TestDocsPagesHaveContents(t *testing.T) {
	readme := prose(page(t, "README.md").text)
	for _, d := range docPages(t) {
		if d.name == "README.md" {
			continue
		}
		p := prose(d.text)
		require.True(t, strings.HasPrefix(p, "# "), "%s starts with its title", d.name)
		require.Equal(t, 1, strings.Count("\n"+p, "\n# "), "%s has one title", d.name)
		head, _, ok := strings.Cut(p, "\n## ")
		require.True(t, ok, "%s has sections", d.name)
		var listed []string
		for _, m := range link.FindAllStringSubmatch(head, -1) {
			if a, ok := strings.CutPrefix(m[1], "#"); ok {
				listed = append(listed, a)
			}
		}
		var sections []string
		for _, m := range regexp.MustCompile(`(?m)^## (.+)$`).FindAllStringSubmatch(stripFences(d.text), -1) {
			sections = append(sections, slug(m[1]))
		}
		require.Equal(t, sections, listed, "%s: the contents list before the first section links to each section, in order", d.name)
		base := strings.TrimPrefix(d.name, "docs/")
		require.True(t, strings.Contains(readme, "(docs/"+base+")") || strings.Contains(readme, "(docs/"+base+"#"),
			"the README links to %s", d.name)
	}
}

// stripFences is md with its fenced code blocks blanked.
func stripFences(md string) string {
	lines := strings.Split(md, "\n")
	in := false
	for i, l := range lines {
		if fence.MatchString(l) {
			in = !in
			lines[i] = ""
		} else if in {
			lines[i] = ""
		}
	}
	return strings.Join(lines, "\n")
}

// TestReadmeIsShort: the README is a way in, at most 300 lines; the rest
// is in docs/.
func TestReadmeIsShort(t *testing.T) {
	n := strings.Count(page(t, "README.md").text, "\n")
	require.LessOrEqual(t, n, 300, "README.md has %d lines: move detail into docs/", n)
}

// TestHistoryPattern: what TestDocsStateHowThingsAre refuses, and what it
// lets be: other projects' bug numbers, which a user can look up.
func TestHistoryPattern(t *testing.T) {
	for _, s := range []string{"before issue 19", "Issues 9 and 13", "branch iss19-commit", "see ../shared/DESIGN.md", "run before this branch"} {
		require.NotEmpty(t, history.FindString(s), s)
	}
	for _, s := range []string{"vLLM #32714, tms #83", "an issue of its own", "the shared prefix", "tissue 3"} {
		require.Empty(t, history.FindString(s), s)
	}
}
