package doclint

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// goBlock is a fenced Go code block of a Markdown file; group 1 is its code.
var goBlock = regexp.MustCompile("(?s)```go\n(.*?)```")

// example is one Example function of the module, as the README may show
// it: whole (func line and all) or its body alone.
type example struct {
	name        string // "path: ExampleName"
	whole, body string // source text, comments included
	output      bool   // has an output comment, so go test runs it and checks what it prints
}

// examplesIn returns the Example functions of one parsed test file, whose
// source is src (the bytes f was parsed from, positions in fset).
func examplesIn(fset *token.FileSet, path string, f *ast.File, src []byte) []example {
	var out []example
	off := func(p token.Pos) int { return fset.File(f.Pos()).Offset(p) }
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Recv != nil || fd.Body == nil || !strings.HasPrefix(fd.Name.Name, "Example") {
			continue
		}
		ex := example{
			name:  path + ": " + fd.Name.Name,
			whole: string(src[off(fd.Pos()):off(fd.End())]),
			body:  string(src[off(fd.Body.Lbrace)+1 : off(fd.Body.Rbrace)]),
		}
		for _, cg := range f.Comments {
			if fd.Body.Pos() <= cg.Pos() && cg.End() <= fd.Body.End() {
				text := strings.TrimSpace(cg.Text())
				if strings.HasPrefix(text, "Output:") || strings.HasPrefix(text, "Unordered output:") {
					ex.output = true
				}
			}
		}
		out = append(out, ex)
	}
	return out
}

// examples returns every Example function of the module's test files.
func examples(t *testing.T) []example {
	t.Helper()
	var out []example
	for p, f := range goFiles(t) {
		if !strings.HasSuffix(p, "_test.go") {
			continue
		}
		src, err := os.ReadFile(p)
		require.NoError(t, err)
		rel, err := filepath.Rel(root, p)
		require.NoError(t, err)
		out = append(out, examplesIn(fset, filepath.ToSlash(rel), f, src)...)
	}
	return out
}

// normalize is s with every run of white space (indentation, blank lines,
// the spaces gofmt aligns comments with) made one space.
func normalize(s string) string { return strings.Join(strings.Fields(s), " ") }

// matchBlock returns the example whose whole source or body is code,
// white space aside, and false when there is none.
func matchBlock(code string, exs []example) (example, bool) {
	want := normalize(code)
	if want == "" {
		return example{}, false
	}
	for _, ex := range exs {
		if normalize(ex.whole) == want || normalize(ex.body) == want {
			return ex, true
		}
	}
	return example{}, false
}

// unmatchedBlocks checks every Go block of the Markdown text md (named
// file in messages) against exs and returns one message per block that is
// not an Example which go test runs, and the number of blocks.
func unmatchedBlocks(file, md string, exs []example) (bad []string, blocks int) {
	for _, b := range goBlock.FindAllStringSubmatchIndex(md, -1) {
		blocks++
		line := 1 + strings.Count(md[:b[0]], "\n") // the line of the ```go fence
		code := md[b[2]:b[3]]
		first, _, _ := strings.Cut(strings.TrimSpace(code), "\n")
		ex, ok := matchBlock(code, exs)
		switch {
		case !ok:
			bad = append(bad, fmt.Sprintf("%s:%d: the Go block (%q) is not, white space aside, the source or the body of any Example function: "+
				"write it as one (its output as the // Output: comment), then copy it here", file, line, first))
		case !ex.output:
			bad = append(bad, fmt.Sprintf("%s:%d: the Go block (%q) is %s, which has no // Output: comment, so go test compiles it but never runs it",
				file, line, first, ex.name))
		}
	}
	return bad, blocks
}

// TestDocsBlocksAreExamples: every Go block of the README and of the
// pages in docs/ is, white space aside, an Example function of the module
// — whole or its body — which go test compiles and runs and whose output
// it checks. (The README's first block once did not compile.) Edit the
// example, then copy it here.
func TestDocsBlocksAreExamples(t *testing.T) {
	exs := examples(t)
	var bad []string
	for _, d := range docPages(t) {
		b, blocks := unmatchedBlocks(d.name, d.text, exs)
		bad = append(bad, b...)
		if d.name == "README.md" {
			require.Positive(t, blocks, "the README has Go blocks: the one-import example")
		}
	}
	if len(bad) > 0 {
		t.Errorf("blocks that are not Examples:\n%s", strings.Join(bad, "\n"))
	}
}

// TestReadmeBlockMatcher: the matcher behind TestDocsBlocksAreExamples
// accepts a block that is an Example's body or whole source however it is
// indented, and names by line each block that is not: one changed token,
// a Test function's body, an Example without output.
func TestReadmeBlockMatcher(t *testing.T) {
	const src = `package x_test

import "fmt"

func Example() {
	n := 2 // two
	fmt.Println(n)
	// Output: 2
}

func ExampleQuiet() {
	fmt.Println("unchecked")
}

func TestSomething() {
	fmt.Println("not an example")
}
`
	fs := token.NewFileSet()
	f, err := parser.ParseFile(fs, "x_test.go", src, parser.ParseComments)
	require.NoError(t, err)
	exs := examplesIn(fs, "x_test.go", f, []byte(src))
	require.Len(t, exs, 2)

	md := strings.Join([]string{
		"# x",
		"```go", // line 2: the body, indented otherwise
		"n := 2    // two",
		"fmt.Println(n)",
		"",
		"// Output: 2",
		"```",
		"```go", // line 8: the whole function, as in the source
		"func Example() {",
		"\tn := 2 // two",
		"\tfmt.Println(n)",
		"\t// Output: 2",
		"}",
		"```",
		"```go", // line 15: one token changed
		"n := 3 // two",
		"fmt.Println(n)",
		"// Output: 2",
		"```",
		"```go", // line 20: a test's body
		"\tfmt.Println(\"not an example\")",
		"```",
		"```go", // line 23: an example go test never runs
		"\tfmt.Println(\"unchecked\")",
		"```",
		"",
	}, "\n")
	bad, blocks := unmatchedBlocks("x.md", md, exs)
	require.Equal(t, 5, blocks)
	require.Len(t, bad, 3, "%s", strings.Join(bad, "\n"))
	require.True(t, strings.HasPrefix(bad[0], "x.md:15: "), bad[0])
	require.Contains(t, bad[0], `("n := 3 // two")`)
	require.True(t, strings.HasPrefix(bad[1], "x.md:20: "), bad[1])
	require.True(t, strings.HasPrefix(bad[2], "x.md:23: "), bad[2])
	require.Contains(t, bad[2], "x_test.go: ExampleQuiet")

	_, ok := matchBlock("  \n\t", exs)
	require.False(t, ok, "an empty block matches nothing")
}

// starterPackages must each have an Example that go test runs: the public
// packages a user starts from.
var starterPackages = []string{
	"vaspace", "physical", "mapping", "stream", "arena", "pool", "multidev",
	"ipc", "tensor", "kvcache", "serving", "driver/host", "driver/sim", "driver/cuda",
}

// TestPackagesHaveExamples: each of those packages has, in its own
// directory, at least one Example function with an output comment, so its
// godoc shows the package at work and go test checks what it prints.
func TestPackagesHaveExamples(t *testing.T) {
	have := map[string]bool{}
	for _, ex := range examples(t) {
		if ex.output {
			path, _, _ := strings.Cut(ex.name, ": ")
			have[filepath.ToSlash(filepath.Dir(path))] = true
		}
	}
	var missing []string
	for _, p := range starterPackages {
		if !have[p] {
			missing = append(missing, p)
		}
	}
	slices.Sort(missing)
	require.Empty(t, missing, "packages with no Example that has an // Output: comment")
}
