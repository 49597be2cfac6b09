package doclint

import (
	"fmt"
	"go/ast"
	"go/token"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDocsNameEverySentinel: every exported Err variable of the module
// appears in the Errors section of docs/drivers.md, qualified by its
// package unless it is one of the driver package's (the docs once claimed
// every error carried a driver sentinel while ipc.ErrProtocol was nowhere
// in them).
func TestDocsNameEverySentinel(t *testing.T) {
	_, section, ok := strings.Cut(page(t, "docs/drivers.md").text, "\n## Errors\n")
	require.True(t, ok, "docs/drivers.md has an Errors section")
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
	require.Empty(t, missing, "sentinels the Errors section of docs/drivers.md does not name")
}

// TestNoCockroachMark: no code outside tests marks an error with
// errors.Mark: code marks with internal/sentinel's Mark, one way for the
// whole module (internal/errors' Mark, the same mark, is for tests).
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
