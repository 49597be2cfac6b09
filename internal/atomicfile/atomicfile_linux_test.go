package atomicfile

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWriteOverAFIFO: a name that is a FIFO, or a link to one, is refused
// and left as it is, not replaced by a regular file (as a device node
// would be: a link to /dev/full renamed over).
func TestWriteOverAFIFO(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo.svg")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	link := filepath.Join(dir, "link.svg")
	require.NoError(t, os.Symlink(fifo, link))
	for _, name := range []string{fifo, link} {
		err := Write(name, []byte("x"), 0o644)
		require.ErrorContains(t, err, fifo+" is not a regular file", name)
		fi, err := os.Lstat(fifo)
		require.NoError(t, err)
		require.Equal(t, os.ModeNamedPipe, fi.Mode().Type(), "%s: the FIFO is left", name)
	}
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, ents, 2, "no temporary file left")
}
