package input

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
)

// TestOpenRegularOnly: a directory, a device and a FIFO are refused
// before a byte is read (opening the FIFO would wait for a writer), a file
// past its size is refused, and a regular file within it is read whole.
func TestOpenRegularOnly(t *testing.T) {
	const p = Prefix("pkg")
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	for name, kind := range map[string]string{dir: "a directory", "/dev/zero": "a character device", fifo: "a named pipe"} {
		_, err := p.Open(name, "trace")
		require.ErrorIs(t, err, driver.ErrInvalid)
		require.ErrorContains(t, err, "pkg: trace: "+name+" is "+kind+", not a regular file")
		_, err = p.ReadFile(name, "config", 10)
		require.ErrorIs(t, err, driver.ErrInvalid)
	}
	_, err := p.Open(filepath.Join(dir, "none"), "trace")
	require.ErrorIs(t, err, driver.ErrInvalid)

	name := filepath.Join(dir, "config.json")
	require.NoError(t, os.WriteFile(name, []byte("0123456789"), 0o600))
	data, err := p.ReadFile(name, "config", 10)
	require.NoError(t, err)
	require.Equal(t, "0123456789", string(data))
	_, err = p.ReadFile(name, "config", 9)
	require.ErrorIs(t, err, driver.ErrInvalid)
	require.ErrorContains(t, err, "pkg: config: "+name+" is 10 bytes, more than the 9 a config may have")
}
