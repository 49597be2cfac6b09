package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/trace"
)

// replayTraces are the PyTorch allocator traces in testdata/alloc-traces.
var replayTraces = []string{
	"cs336_kkaitlyn111_memory_ctx128_fullstep.csv",
	"select_n_snapshot_v1f2f548.csv",
	"cs336_MAGMA27_memory_snapshot.csv",
}

func loadTrace(tb testing.TB, file string) []trace.Event {
	tb.Helper()
	f, err := os.Open(filepath.Join("..", "testdata", "alloc-traces", file))
	require.NoError(tb, err)
	defer f.Close()
	events, err := trace.Parse(f)
	require.NoError(tb, err)
	return events
}

// BenchmarkReplay replays each trace through vmarena's allocator on the sim
// driver (80 GiB, 2 MiB granularity), once per iteration. The baseline is
// what the trace says PyTorch's caching allocator did: committed/allocated
// is set beside pytorch-ratio (peak reserved / peak allocated; absent for a
// trace without segment events), map-calls beside segment-events. Targets
// (issue 3): committed/allocated at most 1.02, map-calls at most
// segment-events. ns/op is the time of one whole replay.
func BenchmarkReplay(b *testing.B) {
	for _, file := range replayTraces {
		b.Run(strings.TrimSuffix(file, ".csv"), func(b *testing.B) {
			events := loadTrace(b, file)
			var res trace.Result
			var err error
			b.ResetTimer()
			for range b.N {
				if res, err = trace.Replay(events, trace.ReplayOptions{}); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(res.Ratio(), "committed/allocated")
			if r, ok := res.Summary.PyTorchRatio(); ok {
				b.ReportMetric(r, "pytorch-ratio")
			}
			b.ReportMetric(float64(res.Stats.MapCalls), "map-calls")
			b.ReportMetric(float64(res.Summary.SegmentEvents), "segment-events")
			b.ReportMetric(float64(res.Stats.Stitches), "stitches")
		})
	}
}

// TestReplayBenchmarkBody replays the smallest trace the way the benchmark
// does, so a broken benchmark fails the tests rather than the next
// measurement.
func TestReplayBenchmarkBody(t *testing.T) {
	res, err := trace.Replay(loadTrace(t, "select_n_snapshot_v1f2f548.csv"), trace.ReplayOptions{})
	require.NoError(t, err)
	require.Positive(t, res.Ratio())
	require.Positive(t, res.Stats.MapCalls)
}
