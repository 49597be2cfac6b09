package bench

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/replay"
)

// replayTraces are the real PyTorch allocator traces in
// testdata/alloc-traces (the hand-written one there is for tests).
var replayTraces = []string{
	"cs336_kkaitlyn111_memory_ctx128_fullstep.csv",
	"select_n_snapshot_v1f2f548.csv",
	"cs336_MAGMA27_memory_snapshot.csv",
	"cranberrii_ftcourse_memory_snapshot.csv",
	"wedsonlin_medium_512_training.csv",
	"silmont2000_mem_snapshot.csv",
}

func loadTrace(tb testing.TB, file string) []replay.Event {
	tb.Helper()
	events, err := replay.ParseFile(filepath.Join("..", "testdata", "alloc-traces", file))
	require.NoError(tb, err)
	return events
}

// BenchmarkReplay replays each trace through vmarena's allocator on the sim
// driver (80 GiB devices, 2 MiB granularity), once per iteration. The
// baseline is what the trace says PyTorch's caching allocator did:
// committed/allocated is set beside pytorch-ratio (peak reserved / peak
// allocated; absent for a trace without segment events or one that starts
// mid-run), map-unmap-events beside segment-events, both counted as PyTorch
// counts them (one per contiguous range), with the driver calls
// (chunk-maps, chunk-unmaps) beside them. Targets: committed/allocated at
// most 1.01, map-unmap-events at most segment-events. ns/op is the time of
// one whole replay. A trace of several devices reports each device's
// figures with a -devN suffix.
func BenchmarkReplay(b *testing.B) {
	b.ReportAllocs()
	for _, file := range replayTraces {
		b.Run(strings.TrimSuffix(file, ".csv"), func(b *testing.B) {
			b.ReportAllocs()
			events := loadTrace(b, file)
			var res replay.Result
			var err error
			b.ResetTimer()
			for range b.N {
				if res, err = replay.Replay(events, replay.Options{}); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			reportReplay(b, res)
		})
	}
}

// reportReplay reports a replay's figures, per device.
func reportReplay(b *testing.B, res replay.Result) {
	for _, d := range res.Devices {
		suffix := ""
		if len(res.Devices) > 1 {
			suffix = fmt.Sprintf("-dev%d", d.Device)
		}
		metric := func(v float64, unit string) { b.ReportMetric(v, unit+suffix) }
		s, f := d.Summary, d.Figures
		metric(d.Ratio(), "committed/allocated")
		if r, ok := s.PyTorchRatio(); ok {
			metric(r, "pytorch-ratio")
		}
		metric(float64(f.MapEvents), "map-events")
		metric(float64(f.UnmapEvents), "unmap-events")
		metric(float64(f.MapUnmapEvents()), "map-unmap-events")
		metric(float64(s.SegmentEvents), "segment-events")
		metric(float64(f.ChunkMaps), "chunk-maps")
		metric(float64(f.ChunkUnmaps), "chunk-unmaps")
		metric(float64(f.Decommits), "decommits")
		metric(float64(f.DecommittedBytes), "decommitted-B")
		metric(float64(f.Stitches), "stitches")
		metric(float64(f.Grows), "grows")
		metric(float64(f.OOMRetries), "oom-retries")
		metric(float64(len(d.OOMs)), "pytorch-ooms")
		metric(float64(s.FreedBeforeRecording), "freed-before-recording")
	}
}

// TestReplayBenchmarkBody replays the smallest trace the way the benchmark
// does, so a broken benchmark fails the tests rather than the next
// measurement.
func TestReplayBenchmarkBody(t *testing.T) {
	res, err := replay.Replay(loadTrace(t, "silmont2000_mem_snapshot.csv"), replay.Options{})
	require.NoError(t, err)
	require.Len(t, res.Devices, 1)
	require.Positive(t, res.Devices[0].Ratio())
	require.Positive(t, res.Devices[0].Figures.MapEvents)
}
