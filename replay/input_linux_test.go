package replay

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vmarena/vmarena/driver"
)

// TestNotRegularFiles: every file a reader opens must be a regular one; a
// device, a directory or a FIFO is refused before a byte is read.
func TestNotRegularFiles(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		read func() error
		msg  string
	}{
		{"a trace of /dev/zero", func() error { _, err := ParseFile("/dev/zero"); return err }, "replay: trace: /dev/zero is a character device, not a regular file"},
		{"a trace of a directory", func() error { _, err := ParseFile(dir); return err }, "is a directory, not a regular file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.read()
			require.ErrorIs(t, err, driver.ErrInvalid)
			require.ErrorContains(t, err, tc.msg)
		})
	}
}

// BenchmarkBoundedReader: what the bounds cost a CSV trace's read, beside
// the parse they guard, both in this run: the largest real trace here
// read through boundedReader alone, and parsed by Parse (which reads
// through it). bound/parse is the share of the parse's time.
func BenchmarkBoundedReader(b *testing.B) {
	data, err := os.ReadFile(filepath.Join("..", "testdata", "alloc-traces", "wedsonlin_medium_512_training.csv"))
	require.NoError(b, err)
	// Thread CPU time, beside the wall time b reports: the machine may be
	// loaded.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpu := func() int64 {
		var ts unix.Timespec
		require.NoError(b, unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts))
		return ts.Nano()
	}
	var bound, parse, boundCPU, parseCPU int64
	for b.Loop() {
		start, c := time.Now(), cpu()
		n, err := io.Copy(io.Discard, in.Reader(bytes.NewReader(data), MaxTraceBytes, MaxTraceLineBytes))
		bound += int64(time.Since(start))
		boundCPU += cpu() - c
		require.NoError(b, err)
		require.Equal(b, int64(len(data)), n)
		start, c = time.Now(), cpu()
		_, err = Parse(bytes.NewReader(data))
		parse += int64(time.Since(start))
		parseCPU += cpu() - c
		require.NoError(b, err)
	}
	b.ReportMetric(float64(bound)/float64(b.N), "bound-ns/op")
	b.ReportMetric(float64(parse)/float64(b.N), "parse-ns/op")
	b.ReportMetric(float64(boundCPU)/float64(b.N), "bound-cpu-ns/op")
	b.ReportMetric(float64(parseCPU)/float64(b.N), "parse-cpu-ns/op")
	b.ReportMetric(float64(boundCPU)/float64(parseCPU), "bound/parse-cpu")
}
