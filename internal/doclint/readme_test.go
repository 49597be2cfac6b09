package doclint

import (
	"go/ast"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// goBlock is a fenced Go code block of a Markdown file.
var goBlock = regexp.MustCompile("(?s)```go\n(.*?)```")

// examples returns the source of every Example function of the module,
// by name and file.
func examples(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for p, f := range goFiles(t) {
		if !strings.HasSuffix(p, "_test.go") {
			continue
		}
		src, err := os.ReadFile(p)
		require.NoError(t, err)
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Recv != nil || !strings.HasPrefix(fd.Name.Name, "Example") {
				continue
			}
			// Offsets are into src: ParseFile read the same bytes.
			start, end := fileOffset(f, fd.Pos()), fileOffset(f, fd.End())
			out[filepath.Clean(p)+": "+fd.Name.Name] = string(src[start:end])
		}
	}
	return out
}

// TestReadmeBlocksAreExamples: every Go block of the README is, character
// for character, an Example function of the module, which go test compiles
// and runs and whose output it checks. (The README's first block once did
// not compile.) Edit the example, then copy it here.
func TestReadmeBlocksAreExamples(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	require.NoError(t, err)
	blocks := goBlock.FindAllStringSubmatchIndex(string(readme), -1)
	require.NotEmpty(t, blocks)
	exs := examples(t)
	for _, b := range blocks {
		block := strings.TrimRight(string(readme[b[2]:b[3]]), "\n")
		found := ""
		for name, src := range exs {
			if src == block {
				found = name
			}
		}
		// Several Examples share a first line (func Example() {): the
		// block is named by where it starts.
		line := 1 + strings.Count(string(readme[:b[2]]), "\n")
		first, _, _ := strings.Cut(block, "\n")
		require.NotEmpty(t, found, "the README's block at line %d (%q) is not the source of any Example function", line, first)
		require.Contains(t, block, "// Output:", "%s checks no output", found)
	}
}
