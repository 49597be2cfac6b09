package atomicfile

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWrite: a write replaces the file whole, with the mode asked, and
// leaves nothing else in the directory.
func TestWrite(t *testing.T) {
	dir := t.TempDir()
	name := filepath.Join(dir, "r.html")
	require.NoError(t, Write(name, []byte("first"), 0o644))
	require.NoError(t, Write(name, []byte("second"), 0o640))
	b, err := os.ReadFile(name)
	require.NoError(t, err)
	require.Equal(t, "second", string(b))
	fi, err := os.Stat(name)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o640), fi.Mode().Perm())
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, ents, 1)
}

// TestWriteFails: a write that cannot finish leaves the file as it was
// and no temporary file: a directory that is not there, and a name that
// is a directory (the rename fails after every byte is written).
func TestWriteFails(t *testing.T) {
	dir := t.TempDir()
	require.Error(t, Write(filepath.Join(dir, "absent", "r.html"), []byte("x"), 0o644))
	sub := filepath.Join(dir, "sub")
	require.NoError(t, os.Mkdir(sub, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(sub, "keep"), []byte("k"), 0o644))
	require.Error(t, Write(sub, []byte("x"), 0o644))
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, ents, 1, "only sub: no temporary file left")
	b, err := os.ReadFile(filepath.Join(sub, "keep"))
	require.NoError(t, err)
	require.Equal(t, "k", string(b))
}

// TestWriteThroughALink: a name that is a symbolic link has its target
// replaced; the link stays.
func TestWriteThroughALink(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target.html")
	require.NoError(t, os.WriteFile(target, []byte("old"), 0o644))
	link := filepath.Join(dir, "link.html")
	require.NoError(t, os.Symlink(target, link))
	require.NoError(t, Write(link, []byte("new"), 0o644))
	fi, err := os.Lstat(link)
	require.NoError(t, err)
	require.NotZero(t, fi.Mode()&os.ModeSymlink, "still a link")
	b, err := os.ReadFile(target)
	require.NoError(t, err)
	require.Equal(t, "new", string(b))
}
