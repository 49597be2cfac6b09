package doclint

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// root is the module's root directory.
const root = "../.."

// fset holds the positions of every parsed file.
var fset = token.NewFileSet()

// fileOffset is pos as a byte offset into f's file.
func fileOffset(f *ast.File, pos token.Pos) int { return fset.File(f.Pos()).Offset(pos) }

// goFiles parses every .go file of the module (testdata and hidden
// directories aside) with its comments.
func goFiles(t *testing.T) map[string]*ast.File {
	t.Helper()
	files := map[string]*ast.File{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		files[filepath.Clean(p)] = f
		return nil
	})
	require.NoError(t, err)
	require.NotEmpty(t, files)
	return files
}

// TestCommentsSpeakToUsers: no comment names the what() closure that
// builds error messages in prose ("Usage reports what() device dev
// holds" in godoc tells a user nothing), and none points at the
// project's internal notes ("seed 002") where the CUDA or AscendCL call
// names belong.
func TestCommentsSpeakToUsers(t *testing.T) {
	var bad []string
	for p, f := range goFiles(t) {
		if strings.Contains(p, "doclint") {
			continue // this test names what it bans
		}
		for _, cg := range f.Comments {
			for _, c := range cg.List {
				for _, banned := range []string{"what()", "seed 00"} {
					if strings.Contains(c.Text, banned) {
						bad = append(bad, p+": "+strings.TrimSpace(c.Text))
					}
				}
			}
		}
	}
	require.Empty(t, bad)
}
