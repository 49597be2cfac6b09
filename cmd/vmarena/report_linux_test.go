package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReportToAFIFO: a --report naming a FIFO is a usage error, at once:
// opened for writing, it would wait for a reader for good.
func TestReportToAFIFO(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	code, stdout, errOut := runReplay(t, "--trace", filepath.Join(traceDir, "handmade_two_devices.csv"), "--report", fifo)
	require.Equal(t, 2, code)
	require.Empty(t, stdout)
	require.True(t, strings.HasPrefix(errOut, "vmarena replay: --report "+fifo+": not a regular file (p---------), want a file\n"), errOut)
}

// TestDemoSVGOverAFIFO: a picture's name in the --svg directory that is a
// link to something other than a regular file (a FIFO here; a device such
// as /dev/full alike) fails the demo, exit 1 naming it, and is left as it
// was, not replaced by a regular file.
func TestDemoSVGOverAFIFO(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(t.TempDir(), "fifo")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	require.NoError(t, os.Symlink(fifo, filepath.Join(dir, "step-01-reserve.svg")))
	code, _, errOut := runCmd(t, "demo", "--driver", "sim", "--svg", dir)
	require.Equal(t, 1, code, errOut)
	require.Contains(t, errOut, fifo+" is not a regular file")
	fi, err := os.Lstat(fifo)
	require.NoError(t, err)
	require.Equal(t, os.ModeNamedPipe, fi.Mode().Type(), "the FIFO is left")
}
