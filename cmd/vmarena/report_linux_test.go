package main

import (
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
