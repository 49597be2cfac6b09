package trace

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// realTraces are the traces in testdata/alloc-traces, with what their own
// segment events say (worked out from the traces; the data README has the
// ratios).
var realTraces = []struct {
	file           string
	events         int
	peakAllocated  uint64
	segmentEvents  int
	pytorchRatio   float64 // 0: no segment events
	unmatchedFrees int
}{
	{"cs336_kkaitlyn111_memory_ctx128_fullstep.csv", 19342, 41174114308, 783, 1.150, 0},
	{"select_n_snapshot_v1f2f548.csv", 4496, 1068339968, 13, 1.333, 0},
	{"cs336_MAGMA27_memory_snapshot.csv", 5163, 12877758464, 0, 0, 2},
}

func readTrace(t testing.TB, file string) []Event {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "testdata", "alloc-traces", file))
	require.NoError(t, err)
	defer f.Close()
	events, err := Parse(f)
	require.NoError(t, err)
	return events
}

func TestSummarizeRealTraces(t *testing.T) {
	for _, tc := range realTraces {
		t.Run(tc.file, func(t *testing.T) {
			s := Summarize(readTrace(t, tc.file))
			require.Equal(t, tc.events, s.Events)
			require.Equal(t, tc.peakAllocated, s.PeakAllocated)
			require.Equal(t, tc.segmentEvents, s.SegmentEvents)
			require.Equal(t, tc.unmatchedFrees, s.UnmatchedFrees)
			ratio, ok := s.PyTorchRatio()
			require.Equal(t, tc.pytorchRatio != 0, ok)
			require.InDelta(t, tc.pytorchRatio, ratio, 0.0005)
		})
	}
}

// TestReplayRealTraces replays each real trace on the sim driver, with and
// without stitching, checking every address the allocator returns and the
// allocator itself a hundred times along the way (Check walks every block
// and chunk: more often costs seconds under -race), then frees what is left.
// The targets are reported by `vmarena replay`, not asserted here.
func TestReplayRealTraces(t *testing.T) {
	for _, tc := range realTraces {
		for _, noStitch := range []bool{false, true} {
			name := tc.file
			if noStitch {
				name += "/no-stitch"
			}
			t.Run(name, func(t *testing.T) {
				events := readTrace(t, tc.file)
				res, err := Replay(events, ReplayOptions{CheckEvery: len(events)/100 + 1, Verify: true, Drain: true, NoStitch: noStitch})
				require.NoError(t, err)
				s := res.Summary
				require.Equal(t, s.Count(OpAlloc), res.Allocs, "every alloc was served")
				require.Equal(t, s.Count(OpFreeCompleted)-tc.unmatchedFrees, res.Frees, "every matched free was done")
				require.Equal(t, tc.unmatchedFrees, res.SkippedFrees)
				require.Equal(t, res.Allocs-res.Frees, res.Stats.Live)

				st := res.Stats
				require.Equal(t, s.PeakAllocated, st.PeakAllocated, "the allocator counts the bytes the trace asked for")
				require.GreaterOrEqual(t, st.PeakCommitted, st.PeakAllocated)
				require.GreaterOrEqual(t, st.PeakCommitted, st.Committed)
				require.GreaterOrEqual(t, st.Committed, st.Allocated)
				require.Zero(t, st.PeakCommitted%res.Options.Granularity)
				require.GreaterOrEqual(t, res.Ratio(), 1.0)
				require.Positive(t, st.MapCalls)
				if noStitch {
					require.Zero(t, st.Stitches)
				}

				d := res.AfterDrain
				require.Zero(t, d.Allocated)
				require.Zero(t, d.Live)
				require.Zero(t, d.Committed, "all memory goes back once everything is freed and trimmed")
				require.Equal(t, d.MapCalls, d.UnmapCalls)
			})
		}
	}
}

func TestReplayErrors(t *testing.T) {
	parse := func(body string) []Event {
		events, err := Parse(strings.NewReader(header + body))
		require.NoError(t, err)
		return events
	}

	t.Run("out of memory names the event", func(t *testing.T) {
		events := parse("0,0,alloc,4194304,0,0,0,,\n" +
			"1,0,free_requested,4194304,0,0,0,,\n" +
			"7,0,alloc,8388608,0,1,0,,\n") // 4 + 8 MiB on an 8 MiB device
		res, err := Replay(events, ReplayOptions{Capacity: 8 * units.MiB, CheckEvery: 1, Verify: true})
		require.True(t, errors.Is(err, driver.ErrOutOfMemory), "%v", err)
		require.Contains(t, err.Error(), "line 4 (seq 7): alloc of 8 MiB (alloc_id 1)")
		require.Equal(t, 1, res.Allocs)
	})
	t.Run("bigger than the device", func(t *testing.T) {
		_, err := Replay(parse("3,0,alloc,17179869184,0,0,0,,\n"), ReplayOptions{Capacity: 8 * units.GiB})
		require.True(t, errors.Is(err, driver.ErrOutOfMemory), "%v", err)
		require.Contains(t, err.Error(), "line 2 (seq 3)")
	})
	t.Run("unknown frees are skipped and counted", func(t *testing.T) {
		res, err := Replay(parse("0,0,free_completed,512,0,5,0,,\n"+
			"1,0,alloc,512,0,5,0,,\n"+
			"2,0,free_completed,512,0,5,0,,\n"+
			"3,0,free_completed,512,0,5,0,,\n"+
			"4,0,free_completed,512,0,-1,0,,\n"), ReplayOptions{CheckEvery: 1, Verify: true})
		require.NoError(t, err)
		require.Equal(t, 3, res.SkippedFrees)
		require.Equal(t, 1, res.Allocs)
		require.Equal(t, 1, res.Frees)
		require.Zero(t, res.Stats.Live)
	})
	t.Run("a live alloc_id allocated again", func(t *testing.T) {
		// Parse refuses this; Replay also guards events built by hand.
		events := []Event{{Line: 2, Op: OpAlloc, Size: 512, AllocID: 1}, {Line: 3, Seq: 1, Op: OpAlloc, Size: 512, AllocID: 1}}
		_, err := Replay(events, ReplayOptions{})
		require.ErrorContains(t, err, "line 3 (seq 1): alloc of 512 B (alloc_id 1): the alloc_id is live already")
	})
	t.Run("several devices", func(t *testing.T) {
		_, err := Replay(parse("0,0,alloc,512,0,1,0,,\n1,1,alloc,512,0,2,0,,\n"), ReplayOptions{})
		require.ErrorContains(t, err, "events on 2 devices")
	})
	t.Run("capacity not a multiple of the granularity", func(t *testing.T) {
		_, err := Replay(nil, ReplayOptions{Capacity: 3 * units.MiB})
		require.True(t, errors.Is(err, driver.ErrInvalid), "%v", err)
	})
}

func TestTargets(t *testing.T) {
	r := Result{Options: ReplayOptions{Granularity: 2 * units.MiB},
		Summary: Summary{PeakAllocated: 1000, SegmentEvents: 10},
		Stats:   arena.AllocStats{PeakCommitted: 1020, MapCalls: 10}}
	require.InDelta(t, 1.02, r.Ratio(), 1e-12)
	require.Equal(t, Met, r.RatioTarget())
	require.Equal(t, Met, r.MapCallsTarget())

	r.Stats.PeakCommitted, r.Stats.MapCalls = 1021, 11
	require.Equal(t, NotMet, r.RatioTarget())
	require.Equal(t, NotMet, r.MapCallsTarget())

	r.Options.Granularity, r.Summary.SegmentEvents = 64*units.KiB, 0
	require.Equal(t, NA, r.RatioTarget(), "the ratio target is for 2 MiB")
	require.Equal(t, NA, r.MapCallsTarget(), "no segment events to compare with")
	require.Zero(t, Result{}.Ratio())
}
