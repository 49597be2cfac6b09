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

// TestRaceSkipsRunWithoutRace: a test that skips (or shrinks) itself when
// the race detector is on — a long computation on one goroutine, where the
// detector multiplies the time and can find nothing — must be run whole
// somewhere: scripts/test's run without -race names it (a test skipped
// under -race in every run of its package runs nowhere in CI).
func TestRaceSkipsRunWithoutRace(t *testing.T) {
	script, err := os.ReadFile(filepath.Join(root, "scripts", "test"))
	require.NoError(t, err)
	// The run without -race: the go test line (after the variables it
	// sets, CGO_ENABLED=0) whose -run names the tests.
	goTest := regexp.MustCompile(`^([A-Z_]+=[^ ]* )*go test `)
	var pattern string
	for _, line := range strings.Split(string(script), "\n") {
		if goTest.MatchString(line) && !strings.Contains(line, "-race") && strings.Contains(line, "-run") {
			pattern = line
		}
	}
	require.NotEmpty(t, pattern, "scripts/test has a go test line without -race that names tests with -run")
	m := regexp.MustCompile(`-run '([^']+)'`).FindStringSubmatch(pattern)
	require.NotNil(t, m, "the -run pattern is quoted: %s", pattern)
	named := regexp.MustCompile(m[1])

	found := 0
	for p, f := range goFiles(t) {
		if !strings.HasSuffix(p, "_test.go") {
			continue
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil || fn.Recv != nil || !strings.HasPrefix(fn.Name.Name, "Test") || !mentionsRaceEnabled(fn.Body) {
				continue
			}
			found++
			rel, _ := filepath.Rel(root, p)
			require.True(t, named.MatchString(fn.Name.Name),
				"%s: %s changes under the race detector, but scripts/test's run without -race (%s) does not name it", rel, fn.Name.Name, m[1])
			dir := "./" + filepath.ToSlash(filepath.Dir(rel))
			require.Contains(t, strings.Fields(pattern), dir, "%s: the run without -race does not test the package %s", fn.Name.Name, dir)
		}
	}
	require.Positive(t, found, "some tests do skip under the race detector")
}

// mentionsRaceEnabled reports whether body reads race.Enabled.
func mentionsRaceEnabled(body *ast.BlockStmt) bool {
	seen := false
	ast.Inspect(body, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok {
			if id, ok := sel.X.(*ast.Ident); ok && id.Name == "race" && sel.Sel.Name == "Enabled" {
				seen = true
			}
		}
		return !seen
	})
	return seen
}
