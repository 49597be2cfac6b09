package main

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestGeneratedFilesAreCurrent: each driver's forward.go is what its
// //go:generate line writes from its forward.txt now, so an edit of the
// text, of a part's signature or of this generator that was not followed
// by go generate fails here.
func TestGeneratedFilesAreCurrent(t *testing.T) {
	const prefix = "//go:generate go run ../internal/forward "
	files, err := filepath.Glob("../../*/*.go")
	require.NoError(t, err)
	n := 0
	for _, f := range files {
		fd, err := os.Open(f)
		require.NoError(t, err)
		sc := bufio.NewScanner(fd)
		for sc.Scan() {
			args, ok := strings.CutPrefix(sc.Text(), prefix)
			if !ok {
				continue
			}
			n++
			dir := filepath.Dir(f)
			docs, out, build := "forward.txt", "forward.go", ""
			var parts []string
			fs := strings.Fields(args)
			for i := 0; i < len(fs); i++ {
				switch fs[i] {
				case "-docs":
					i++
					docs = fs[i]
				case "-out":
					i++
					out = fs[i]
				case "-build":
					i++
					build = fs[i]
				default:
					parts = append(parts, fs[i])
				}
			}
			want, err := Generate(dir, docs, build, parts)
			require.NoError(t, err, f)
			got, err := os.ReadFile(filepath.Join(dir, out))
			require.NoError(t, err)
			require.Equal(t, string(want), string(got), "%s is not what go generate writes from %s: run go generate ./%s", filepath.Join(dir, out), docs, dir)
		}
		require.NoError(t, sc.Err())
		fd.Close()
	}
	require.Equal(t, 4, n, "host, sim, cuda and acl each have one //go:generate line")
}

// TestGenerateRefuses: a text file that names a method the part lacks, a
// part not given, or a method without a doc is an error naming it.
func TestGenerateRefuses(t *testing.T) {
	dir := t.TempDir()
	part := filepath.Join(dir, "part")
	require.NoError(t, os.Mkdir(part, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(part, "p.go"), []byte("package part\n\ntype T struct{}\n\nfunc (t *T) Do(n int) (int, error) { return n, nil }\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "d.go"), []byte("package d\n"), 0o644))
	for text, want := range map[string]string{
		"== Undo p\nUndo undoes.\n":     "no exported method Undo",
		"== Do q\nDo does.\n":           `the part "q" is not named`,
		"== Do p\n\n":                   "Do has no doc comment",
		"== Do p\nDo.\n== Do p\nDo.\n":  "Do listed twice",
		"stray text\n== Do p\nDo does.": "text before the first method",
	} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, "f.txt"), []byte(text), 0o644))
		_, err := Generate(dir, "f.txt", "", []string{"p=part:T"})
		require.ErrorContains(t, err, want, text)
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "f.txt"), []byte("== Do p\nDo does n.\n"), 0o644))
	src, err := Generate(dir, "f.txt", "", []string{"p=part:T"})
	require.NoError(t, err)
	require.Contains(t, string(src), "func (d *Driver) Do(n int) (int, error) {\n\tif d.unmade() {\n\t\treturn *new(int), errUnmade(\"Do\")\n\t}\n\treturn d.p.Do(n)\n}")
}
