package serving

import (
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
)

// TestNotRegularFiles: every file a reader opens must be a regular one; a
// device, a directory or a FIFO is refused before a byte is read.
func TestNotRegularFiles(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "trace.jsonl")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	for _, tc := range []struct {
		name string
		read func() error
		msg  string
	}{
		{"a request trace of a FIFO", func() error { _, err := ParseRequestsFile(fifo); return err }, "serving: request trace: " + fifo + " is a named pipe, not a regular file"},
		{"a model of /dev/zero", func() error { _, err := LoadModel("/dev/zero"); return err }, "serving: model config: /dev/zero is a character device, not a regular file"},
		{"a model of a FIFO", func() error { _, err := LoadModel(fifo); return err }, "serving: model config: " + fifo + " is a named pipe, not a regular file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.read()
			require.ErrorIs(t, err, driver.ErrInvalid)
			require.ErrorContains(t, err, tc.msg)
		})
	}
}
