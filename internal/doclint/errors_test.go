package doclint

import (
	"fmt"
	"go/ast"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReadmeNamesEverySentinel: every exported Err variable of the module
// appears in the README's Errors section, qualified by its package unless
// it is one of the driver package's: a reader learns every sentinel an
// error may carry there.
func TestReadmeNamesEverySentinel(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(readme), "\n## Errors\n")
	require.True(t, ok, "the README has an Errors section")
	section, _, _ = strings.Cut(section, "\n## ")

	var missing []string
	n := 0
	for p, f := range goFiles(t) {
		if strings.HasSuffix(p, "_test.go") || f.Name.Name == "main" || strings.Contains(p, "internal") {
			continue
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.VAR {
				continue
			}
			for _, sp := range gd.Specs {
				for _, name := range sp.(*ast.ValueSpec).Names {
					if !name.IsExported() || !strings.HasPrefix(name.Name, "Err") {
						continue
					}
					n++
					want := f.Name.Name + "." + name.Name
					if f.Name.Name == "driver" {
						want = name.Name
					}
					if !strings.Contains(section, "`"+want+"`") {
						missing = append(missing, want+" ("+p+")")
					}
				}
			}
		}
	}
	require.Greater(t, n, 10, "the driver's sentinels alone are more")
	require.Empty(t, missing, "sentinels the README's Errors section does not name")
}

// TestNoCockroachMark: no code outside tests marks an error with
// cockroachdb's errors.Mark. Its marks are seen by cockroachdb's errors.Is
// alone: errors.Is from the standard library, the one Go users reach
// for, answered false for driver.ErrInvalid on tensor.Empty(al, Float32,
// -1). internal/sentinel's Mark is seen by both.
func TestNoCockroachMark(t *testing.T) {
	var bad []string
	for p, f := range goFiles(t) {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name != "Mark" {
				return true
			}
			if id, ok := sel.X.(*ast.Ident); ok && id.Name == "errors" {
				bad = append(bad, fmt.Sprintf("%s: errors.Mark", fset.Position(sel.Pos())))
			}
			return true
		})
	}
	require.Empty(t, bad, "mark sentinels with internal/sentinel.Mark, or wrap them with errors.Wrapf(sentinel, ...)")
}
