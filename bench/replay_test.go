package bench

import (
	"flag"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/replay"
)

// replayBudget, when set (go test ./bench -bench Replay -args
// -replay-budget 1h), replaces TraceBudget and SyntheticBudget: a replay
// stopped at its budget reports a lower bound of its time, and no figure
// but that.
var replayBudget = flag.Duration("replay-budget", 0, "the longest a timed replay runs before it is stopped (0: TraceBudget for traces, SyntheticBudget for the synthetic workload)")

func budget(def time.Duration) time.Duration {
	if *replayBudget > 0 {
		return *replayBudget
	}
	return def
}

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
// (chunk-maps, chunk-unmaps) beside them; and the driver calls as the sim
// driver counted them (calls-create, calls-map, calls-setaccess,
// calls-unmap, calls-release) and their modelled time on the A100 table
// (driver-s) beside PyTorch's calls modelled from its segment events
// (pytorch-create, ...) and their time (pytorch-driver-s). Targets:
// committed/allocated at most 1.01, map-unmap-events at most
// segment-events, driver/pytorch (modelled driver time ÷ PyTorch's,
// reported only where the target applies: segment events, not mid-run) at
// most 1. ns/op is the time of one whole replay. A trace of several
// devices reports each device's figures with a -devN suffix.
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
		reportCalls(metric, d)
	}
}

// reportCalls reports a device's driver calls, vmarena's and PyTorch's,
// their modelled times and, where the target applies, their ratio
// (driver/pytorch).
func reportCalls(metric func(v float64, unit string), d replay.DeviceResult) {
	if !d.Priced {
		return
	}
	for _, side := range []struct {
		prefix string
		c      sim.Calls
	}{{"calls-", d.DriverCalls}, {"pytorch-", d.Summary.SegmentCalls}} {
		metric(float64(side.c.Create), side.prefix+"create")
		metric(float64(side.c.Map), side.prefix+"map")
		metric(float64(side.c.SetAccess), side.prefix+"setaccess")
		metric(float64(side.c.Unmap), side.prefix+"unmap")
		metric(float64(side.c.Release), side.prefix+"release")
	}
	metric(d.DriverTime().Seconds(), "driver-s")
	metric(d.PyTorchDriverTime().Seconds(), "pytorch-driver-s")
	if d.DriverTimeTarget() != replay.NA && d.PyTorchDriverTime() > 0 {
		metric(d.DriverTime().Seconds()/d.PyTorchDriverTime().Seconds(), "driver/pytorch")
		// The same counts priced by the calls measured on an H100.
		if pt := d.Summary.SegmentCalls.Time(sim.H100); pt > 0 {
			metric(d.DriverCalls.Time(sim.H100).Seconds()/pt.Seconds(), "driver/pytorch-h100")
		}
	}
}

// BenchmarkReplay64KiB replays each trace as BenchmarkReplay does at
// 64 KiB granularity, timed: replay-s is one whole replay's wall time
// (target: at most 5 s), with the figures BenchmarkReplay reports. A
// replay still running after TraceBudget is stopped: its replay-s is the
// budget, a lower bound, finished is 0, and only events-replayed and
// wall-s (the call's own time, the event in flight and the freeing after
// it included) are reported beside it.
func BenchmarkReplay64KiB(b *testing.B) {
	for _, file := range replayTraces {
		b.Run(strings.TrimSuffix(file, ".csv"), func(b *testing.B) {
			benchTimed(b, loadTrace(b, file), replay.Options{Granularity: 64 * units.KiB}, budget(TraceBudget))
		})
	}
}

// BenchmarkReplaySynthetic replays the random-lifetimes workload (seed 1,
// 100,000 events: sizes log-uniform from 512 B to 4 GiB, about 56 GiB
// live) at 2 MiB and at 64 KiB granularity, timed as BenchmarkReplay64KiB
// times traces, with SyntheticBudget. Targets: replay-s at most 2 s at
// 2 MiB and 20 s at 64 KiB; committed/allocated at most 1.01.
func BenchmarkReplaySynthetic(b *testing.B) {
	events, err := replay.Synthetic("random-lifetimes", 1, 0)
	if err != nil {
		b.Fatal(err)
	}
	for _, g := range []uint64{2 * units.MiB, 64 * units.KiB} {
		b.Run("random-lifetimes/"+units.Bytes(g), func(b *testing.B) {
			benchTimed(b, events, replay.Options{Granularity: g}, budget(SyntheticBudget))
		})
	}
}

// benchTimed replays events b.N times, each stopped at budget, and
// reports the mean wall time of a replay (replay-s; wall-s the same for
// replays that finished) and, once the last replay finished, its figures;
// the first replay stopped at its budget ends the loop, and counts its
// budget in replay-s.
func benchTimed(b *testing.B, events []replay.Event, opts replay.Options, budget time.Duration) {
	b.ReportAllocs()
	var t Timed
	var bound, wall time.Duration
	n := 0
	for range b.N {
		var err error
		if t, err = TimedReplay(events, opts, budget); err != nil {
			b.Fatal(err)
		}
		bound += t.Bound
		wall += t.Wall
		n++
		if !t.Finished {
			break
		}
	}
	b.ReportMetric(bound.Seconds()/float64(n), "replay-s")
	b.ReportMetric(wall.Seconds()/float64(n), "wall-s")
	finished := 0.0
	if t.Finished {
		finished = 1
		reportReplay(b, t.Result)
	}
	b.ReportMetric(finished, "finished")
	b.ReportMetric(float64(t.Result.Events), "events-replayed")
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
	d := res.Devices[0]
	require.True(t, d.Priced)
	require.Positive(t, d.DriverCalls.Create)
	require.Positive(t, d.PyTorchDriverTime())
	require.NotEqual(t, replay.NA, d.DriverTimeTarget(), "silmont2000 has segment events and starts empty")
}

// TestTimedReplay: the timed bodies of BenchmarkReplay64KiB and
// BenchmarkReplaySynthetic, on the hand-written trace and a small
// synthetic workload at 64 KiB, run whole; a budget already spent stops a
// replay before its first event, without an error.
func TestTimedReplay(t *testing.T) {
	opts := replay.Options{Granularity: 64 * units.KiB}
	events := loadTrace(t, "handmade_two_devices.csv")
	tm, err := TimedReplay(events, opts, time.Hour)
	require.NoError(t, err)
	require.True(t, tm.Finished)
	require.Equal(t, len(events), tm.Result.Events)
	require.Positive(t, tm.Wall)
	require.Equal(t, tm.Wall, tm.Bound)
	require.Positive(t, tm.Result.Devices[1].DriverCalls.Map)

	synthetic, err := replay.RandomLifetimes{Seed: 1, Events: 300, MaxSize: 64 * units.MiB, Live: 256 * units.MiB}.Generate()
	require.NoError(t, err)
	tm, err = TimedReplay(synthetic, opts, 0)
	require.NoError(t, err)
	require.True(t, tm.Finished)
	require.LessOrEqual(t, tm.Result.Devices[0].Ratio(), 2.0)

	tm, err = TimedReplay(events, opts, time.Nanosecond)
	require.NoError(t, err, "the budget is no error")
	require.False(t, tm.Finished)
	require.Less(t, tm.Result.Events, len(events))
	require.Equal(t, time.Nanosecond, tm.Bound, "a lower bound: the budget")

	_, err = TimedReplay(events, replay.Options{Granularity: 3 * units.KiB}, time.Hour)
	require.Error(t, err, "any other error is returned")
}
