package replay

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/units"
)

// realTraces are the traces in testdata/alloc-traces, with what their own
// events say (worked out from the traces with awk, independently of this
// package; the data README has the ratios).
var realTraces = []struct {
	file                 string
	events               int
	peakAllocated        uint64
	segmentEvents        int
	peakReserved         uint64
	pytorchRatio         float64 // 0: none that means anything
	unmatchedFrees       int
	freedBeforeRecording int
	// noStitch replays it a second time with stitching off (the small
	// traces only: the suite stays fast).
	noStitch bool
}{
	{"cs336_kkaitlyn111_memory_ctx128_fullstep.csv", 19342, 41174114308, 783, 47347400704, 1.150, 0, 0, false},
	{"select_n_snapshot_v1f2f548.csv", 4496, 1068339968, 13, 1423966208, 1.333, 0, 0, true},
	{"cs336_MAGMA27_memory_snapshot.csv", 5163, 12877758464, 0, 0, 0, 2, 2, false},
	{"cranberrii_ftcourse_memory_snapshot.csv", 10307, 4780407592, 152, 5070913536, 1.061, 0, 0, false},
	{"wedsonlin_medium_512_training.csv", 22332, 7331061768, 1, 67108864, 0, 438, 438, false},
	{"silmont2000_mem_snapshot.csv", 97, 3249143816, 9, 3781165056, 1.164, 0, 0, true},
}

func readTrace(t testing.TB, file string) []Event {
	t.Helper()
	events, err := ParseFile(filepath.Join("..", "testdata", "alloc-traces", file))
	require.NoError(t, err)
	return events
}

// TestReplayRealTraces replays each real trace once on the sim driver,
// checking every address the allocator returns and the allocator itself a
// hundred times along the way (Check walks every block and chunk: more
// often costs seconds under -race), then frees what is left. The summary is
// checked against figures worked out from the trace; the targets
// are reported by `vmarena replay`, not asserted here.
func TestReplayRealTraces(t *testing.T) {
	for _, tc := range realTraces {
		t.Run(strings.TrimSuffix(tc.file, ".csv"), func(t *testing.T) {
			events := readTrace(t, tc.file)
			res, err := Replay(events, Options{CheckEvery: len(events)/100 + 1, Verify: true, Drain: true})
			require.NoError(t, err)
			require.Len(t, res.Devices, 1)
			d := res.Devices[0]

			s := d.Summary
			require.Equal(t, tc.events, s.Events)
			require.Equal(t, tc.peakAllocated, s.PeakAllocated)
			require.Equal(t, tc.segmentEvents, s.SegmentEvents)
			require.Equal(t, tc.peakReserved, s.PeakReserved)
			require.Equal(t, tc.unmatchedFrees, s.UnmatchedFrees)
			require.Equal(t, tc.freedBeforeRecording, s.FreedBeforeRecording)
			require.Equal(t, tc.freedBeforeRecording > 0, s.MidRun())
			require.Zero(t, s.MismatchedFrees)
			require.Zero(t, s.OOMs)
			ratio, ok := s.PyTorchRatio()
			require.Equal(t, tc.pytorchRatio != 0, ok)
			require.InDelta(t, tc.pytorchRatio, ratio, 0.0005)
			if s.MidRun() {
				require.Equal(t, NA, d.MapEventsTarget(), "PyTorch's segment events say nothing mid-run")
			}

			checkReplayed(t, d)
			if tc.noStitch {
				res, err := Replay(events, Options{CheckEvery: len(events)/100 + 1, Verify: true, Drain: true, NoStitch: true})
				require.NoError(t, err)
				checkReplayed(t, res.Devices[0])
				require.Zero(t, res.Devices[0].Figures.Stitches)
			}
		})
	}
}

// checkReplayed checks what must hold of any whole replay of a device.
func checkReplayed(t *testing.T, d DeviceResult) {
	t.Helper()
	s := d.Summary
	require.Equal(t, s.Count(OpAlloc), d.Allocs, "every alloc was served")
	require.Equal(t, s.Count(OpFreeCompleted)-s.UnmatchedFrees, d.Frees, "every matched free was done")
	require.Equal(t, s.UnmatchedFrees, d.SkippedFrees)
	require.Len(t, d.OOMs, s.OOMs)

	f := d.Figures
	require.Equal(t, d.Allocs-d.Frees, f.Live)
	require.Equal(t, s.PeakAllocated, f.PeakAllocated, "the allocator counts the bytes the trace asked for")
	require.GreaterOrEqual(t, f.PeakCommitted, f.PeakAllocated)
	require.GreaterOrEqual(t, f.PeakCommitted, f.Committed)
	require.GreaterOrEqual(t, f.Committed, f.Allocated)
	require.Zero(t, f.PeakCommitted%d.Granularity)
	require.GreaterOrEqual(t, d.Ratio(), 1.0)
	require.Positive(t, f.MapEvents)
	require.LessOrEqual(t, f.MapEvents, f.ChunkMaps, "an event maps one chunk or more")
	require.LessOrEqual(t, f.UnmapEvents, f.ChunkUnmaps)
	require.Equal(t, f.MapEvents+f.UnmapEvents, f.MapUnmapEvents())
	require.Contains(t, []Verdict{Met, NotMet}, d.RatioTarget())

	a := d.AfterDrain
	require.Zero(t, a.Allocated)
	require.Zero(t, a.Live)
	require.Zero(t, a.Committed, "all memory goes back once everything is freed and trimmed")
	require.Equal(t, a.ChunkMaps, a.ChunkUnmaps)
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
		res, err := Replay(events, Options{Capacity: 8 * units.MiB, CheckEvery: 1, Verify: true})
		require.True(t, errors.Is(err, driver.ErrOutOfMemory), "%v", err)
		require.Contains(t, err.Error(), "replay: line 4 (seq 7), device 0: alloc of 8 MiB (alloc_id 1)")
		require.Equal(t, 1, res.Devices[0].Allocs)
	})
	t.Run("bigger than the device", func(t *testing.T) {
		_, err := Replay(parse("3,5,alloc,17179869184,0,0,0,,\n"), Options{Capacity: 8 * units.GiB})
		require.True(t, errors.Is(err, driver.ErrOutOfMemory), "%v", err)
		require.Contains(t, err.Error(), "line 2 (seq 3), device 5")
	})
	t.Run("an alloc of nothing", func(t *testing.T) {
		_, err := Replay(parse("3,0,alloc,0,0,0,0,,\n"), Options{})
		require.True(t, errors.Is(err, driver.ErrInvalid), "%v", err)
		require.Contains(t, err.Error(), "line 2 (seq 3), device 0: alloc of 0 B")
	})
	t.Run("unknown frees are skipped and counted", func(t *testing.T) {
		res, err := Replay(parse("0,0,free_completed,512,0,5,0,,\n"+
			"1,0,alloc,512,0,5,0,,\n"+
			"2,0,free_completed,512,0,5,0,,\n"+
			"3,0,free_completed,512,0,5,0,,\n"+
			"4,0,free_completed,512,0,-1,0,,\n"), Options{CheckEvery: 1, Verify: true})
		require.NoError(t, err)
		d := res.Devices[0]
		require.Equal(t, 3, d.SkippedFrees)
		require.Equal(t, 1, d.Allocs)
		require.Equal(t, 1, d.Frees)
		require.Zero(t, d.Figures.Live)
	})
	t.Run("a live alloc_id allocated again", func(t *testing.T) {
		// Parse refuses this; Replay also guards events built by hand.
		events := []Event{{Line: 2, Op: OpAlloc, Size: 512, AllocID: 1}, {Line: 3, Seq: 1, Op: OpAlloc, Size: 512, AllocID: 1}}
		_, err := Replay(events, Options{})
		require.ErrorContains(t, err, "line 3 (seq 1), device 0: alloc of 512 B (alloc_id 1): the alloc_id is live already")
	})
	t.Run("an oom vmarena cannot serve either is recorded", func(t *testing.T) {
		res, err := Replay(parse("0,0,alloc,4194304,0,0,0,,\n"+
			"1,0,oom,8388608,,-1,0,,0\n"+ // 4 + 8 MiB on an 8 MiB device
			"2,0,oom,2097152,,-1,0,,\n"), Options{Capacity: 8 * units.MiB, CheckEvery: 1, Verify: true})
		require.NoError(t, err)
		d := res.Devices[0]
		require.Len(t, d.OOMs, 2)
		require.Equal(t, OOM{Line: 3, Seq: 1, Size: 8 * units.MiB, HasDeviceFree: true}, withoutRefusal(d.OOMs[0]))
		require.Contains(t, d.OOMs[0].Refusal, "out of memory")
		require.Equal(t, OOM{Line: 4, Seq: 2, Size: 2 * units.MiB, Served: true}, d.OOMs[1])
		require.Equal(t, 1, d.Figures.Live, "the probes were freed")
		// The served probe fit in the chunk the allocator committed ahead
		// of the first alloc (6 MiB for 4): it counts in no peak, the
		// trace having never allocated it.
		require.Equal(t, 4*units.MiB, d.Summary.PeakAllocated)
		require.Equal(t, 4*units.MiB, d.Figures.PeakAllocated)
		require.Equal(t, 6*units.MiB, d.Figures.Committed)
		require.Equal(t, 6*units.MiB, d.Figures.PeakCommitted)
		require.InDelta(t, 1.5, d.Ratio(), 1e-12)
	})
	t.Run("an oom of nothing", func(t *testing.T) {
		_, err := Replay(parse("3,0,oom,0,,-1,0,,\n"), Options{})
		require.True(t, errors.Is(err, driver.ErrInvalid), "%v", err)
		require.Contains(t, err.Error(), "line 2 (seq 3), device 0: oom of 0 B")
	})
	t.Run("capacity not a multiple of the granularity", func(t *testing.T) {
		_, err := Replay(nil, Options{Capacity: 3 * units.MiB})
		require.True(t, errors.Is(err, driver.ErrInvalid), "%v", err)
	})
	t.Run("unknown policy", func(t *testing.T) {
		_, err := Replay(parse("0,0,alloc,512,0,0,0,,\n"), Options{Policy: 9})
		require.True(t, errors.Is(err, driver.ErrInvalid), "%v", err)
		require.ErrorContains(t, err, "unknown allocator policy 9")
	})
	t.Run("more devices than a driver has", func(t *testing.T) {
		var body strings.Builder
		for i := range 20000 { // 0.6 MB naming 20,000 devices
			fmt.Fprintf(&body, "%d,%d,alloc,1,%d,0,0,,\n", i, i, i)
		}
		res, err := Replay(parse(body.String()), Options{})
		require.ErrorIs(t, err, driver.ErrInvalid)
		require.ErrorContains(t, err, fmt.Sprintf("the trace names more than %d devices", driver.MaxDevices))
		require.Empty(t, res.Devices, "refused before any device's summary is built")
		_, err = Replay(parse("0,3,alloc,512,0,0,0,,\n1,7,alloc,512,0,1,0,,\n"), Options{})
		require.NoError(t, err, "two devices, numbered sparsely")
	})
	t.Run("no events", func(t *testing.T) {
		res, err := Replay(nil, Options{})
		require.NoError(t, err)
		require.Empty(t, res.Devices)
	})
}

func withoutRefusal(o OOM) OOM {
	o.Refusal = ""
	return o
}

// TestReplayPolicies: every policy replays, and the verification holds
// each address to the policy's alignment.
func TestReplayPolicies(t *testing.T) {
	events := readTrace(t, "silmont2000_mem_snapshot.csv")
	for _, p := range Policies {
		t.Run(p.String(), func(t *testing.T) {
			got, err := ParsePolicy(p.String())
			require.NoError(t, err)
			require.Equal(t, p, got)
			res, err := Replay(events, Options{Policy: p, CheckEvery: 10, Verify: true, Drain: true})
			require.NoError(t, err)
			checkReplayed(t, res.Devices[0])
		})
	}
	_, err := ParsePolicy("best-fit")
	require.True(t, errors.Is(err, driver.ErrInvalid), "%v", err)
	require.ErrorContains(t, err, `unknown allocator policy "best-fit"`)
	require.Equal(t, "policy(9)", Policy(9).String())
}

func TestTargets(t *testing.T) {
	d := DeviceResult{Granularity: 2 * units.MiB,
		Summary: Summary{PeakAllocated: 1000, SegmentEvents: 10},
		Figures: Figures{PeakCommitted: 1010, MapEvents: 6, UnmapEvents: 4}}
	require.InDelta(t, 1.01, d.Ratio(), 1e-12)
	require.Equal(t, Met, d.RatioTarget())
	require.Equal(t, 10, d.Figures.MapUnmapEvents())
	require.Equal(t, Met, d.MapEventsTarget())

	d.Figures.PeakCommitted, d.Figures.UnmapEvents = 1011, 5
	require.Equal(t, NotMet, d.RatioTarget())
	require.Equal(t, NotMet, d.MapEventsTarget(), "map and unmap events together, against segment events")

	d.Summary.FreedBeforeRecording = 1
	require.Equal(t, NA, d.MapEventsTarget(), "mid-run: PyTorch's segment events leave out what it held before")
	require.Equal(t, NotMet, d.RatioTarget(), "the ratio target holds on every trace")
	d.Summary.FreedBeforeRecording, d.Summary.ReservedBelowZero = 0, true
	require.Equal(t, NA, d.MapEventsTarget())

	d.Granularity, d.Summary.SegmentEvents, d.Summary.ReservedBelowZero = 64*units.KiB, 0, false
	require.Equal(t, NA, d.RatioTarget(), "the ratio target is for 2 MiB")
	require.Equal(t, NA, d.MapEventsTarget(), "no segment events to compare with")
	require.Zero(t, DeviceResult{}.Ratio())
	require.Equal(t, NA, DeviceResult{Granularity: 2 * units.MiB}.RatioTarget(), "nothing allocated")
}

// TestOptionsCheck: sizes no replay can run with are ErrInvalid, with a
// message that starts with the option and says what would be valid; Replay
// refuses them before it builds anything.
func TestOptionsCheck(t *testing.T) {
	require.NoError(t, Options{}.Check(), "the defaults")
	require.NoError(t, Options{Granularity: 64 * units.KiB, Capacity: 4 * units.GiB}.Check())
	require.NoError(t, Options{Granularity: units.GiB, Capacity: MaxCapacity}.Check())
	for _, c := range []struct {
		o    Options
		says string
	}{
		{Options{Granularity: 3 * units.MiB}, "granularity 3 MiB: want a power of two from 4 KiB to 1 GiB"},
		{Options{Granularity: 2 * units.KiB}, "granularity 2 KiB: want"},
		{Options{Granularity: 2 * units.GiB}, "granularity 2 GiB: want"},
		{Options{Capacity: 3 * units.MiB}, "capacity 3 MiB: want a multiple of the granularity 2 MiB from 2 MiB to 1 TiB"},
		{Options{Capacity: MaxCapacity + 2*units.MiB}, "capacity 1048578 MiB: want"},
		{Options{Capacity: 1 << 63}, "capacity 8388608 TiB: want"},
	} {
		err := c.o.Check()
		require.True(t, errors.Is(err, driver.ErrInvalid), "%+v: %v", c.o, err)
		require.True(t, strings.HasPrefix(err.Error(), c.says), "%q does not start with %q", err, c.says)
		_, err = Replay(nil, c.o)
		require.True(t, errors.Is(err, driver.ErrInvalid), "%v", err)
	}
}

// TestReplayProgress: Options.Progress is called every ProgressEvents
// events and once after the last, counting up to the trace's events, and
// the result does not keep the hook.
func TestReplayProgress(t *testing.T) {
	events := readTrace(t, "wedsonlin_medium_512_training.csv")
	require.Greater(t, len(events), ProgressEvents)
	var calls [][2]int
	res, err := Replay(events, Options{Progress: func(done, total int) { calls = append(calls, [2]int{done, total}) }})
	require.NoError(t, err)
	require.Equal(t, [][2]int{{ProgressEvents, len(events)}, {len(events), len(events)}}, calls)
	require.Nil(t, res.Options.Progress)
}

// TestReplayDeadline: a replay still running at its deadline stops before
// its next event with an error marked context.DeadlineExceeded, saying how
// many events it replayed, and leaves nothing behind on the driver; one
// that ends in time replays every event.
func TestReplayDeadline(t *testing.T) {
	events := readTrace(t, "select_n_snapshot_v1f2f548.csv")
	res, err := Replay(events, Options{Deadline: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	require.Equal(t, len(events), res.Events)

	drv, err := sim.New(sim.Options{})
	require.NoError(t, err)
	res, err = ReplayOn(drv, events, Options{Deadline: time.Now().Add(-time.Second)})
	require.True(t, errors.Is(err, context.DeadlineExceeded), "%v", err)
	require.ErrorContains(t, err, "replay: the deadline passed after 0 of 4496 events")
	require.Zero(t, res.Events)
	total := drv.Tally().Total()
	require.Equal(t, total.Reserve, total.Unreserve, "the allocators gave their ranges back")
	require.NoError(t, drv.Close())

	// Stopped part-way: the Progress hook, called after ProgressEvents
	// events, waits until the deadline has passed (which it may have
	// already on a slow machine: the replay then stops earlier).
	long := readTrace(t, "wedsonlin_medium_512_training.csv")
	require.Greater(t, len(long), ProgressEvents)
	deadline := time.Now().Add(50 * time.Millisecond)
	res, err = Replay(long, Options{CheckEvery: 1000, Deadline: deadline,
		Progress: func(int, int) { time.Sleep(time.Until(deadline) + time.Millisecond) }})
	require.True(t, errors.Is(err, context.DeadlineExceeded), "%v", err)
	require.LessOrEqual(t, res.Events, ProgressEvents)
	require.ErrorContains(t, err, fmt.Sprintf("after %d of %d events", res.Events, len(long)))
}

// TestServedOOMLeftOutOfPeaks: PyTorch failed a request near the trace's
// peak that vmarena, on a larger device, serves. The probe is freed at
// once and must not count in vmarena's peak committed as if the trace
// had allocated it (on a real diffusion trace it turned 1.0039 into
// 1.0168): the peaks are the trace's own until an event of the trace
// passes the probe's.
func TestServedOOMLeftOutOfPeaks(t *testing.T) {
	const MiB = units.MiB
	events, err := Parse(strings.NewReader(header +
		"0,0,alloc,8388608,0,0,0,,\n" + // 8 MiB live
		"1,0,oom,4194304,,-1,0,,0\n" + // PyTorch had no 4 MiB more; vmarena serves it: 12 MiB for a moment
		"2,0,free_completed,8388608,0,0,0,,\n" +
		"3,0,alloc,10485760,0,1,0,,\n")) // 10 MiB live: the trace's peak
	require.NoError(t, err)
	res, err := Replay(events, Options{CheckEvery: 1, Verify: true})
	require.NoError(t, err)
	d := res.Devices[0]
	require.Equal(t, 10*MiB, d.Summary.PeakAllocated)
	require.Equal(t, []OOM{{Line: 3, Seq: 1, Size: 4 * MiB, HasDeviceFree: true, Served: true}}, d.OOMs)
	require.Equal(t, 10*MiB, d.Figures.PeakAllocated, "not the probe's 12 MiB")
	require.Equal(t, 10*MiB, d.Figures.PeakCommitted, "not the probe's 12 MiB")
	require.InDelta(t, 1.0, d.Ratio(), 1e-12)

	// An event of the trace past the probe's peak: the allocator's own
	// peaks are the trace's again.
	more, err := Parse(strings.NewReader(header + "0,0,alloc,4194304,0,2,0,,\n"))
	require.NoError(t, err)
	more[0].Seq, more[0].Line = 4, 6
	res, err = Replay(append(events, more...), Options{CheckEvery: 1, Verify: true})
	require.NoError(t, err)
	d = res.Devices[0]
	require.Equal(t, 14*MiB, d.Summary.PeakAllocated)
	require.Equal(t, 14*MiB, d.Figures.PeakAllocated)
	require.Equal(t, 16*MiB, d.Figures.PeakCommitted, "14 MiB and the chunk the allocator commits ahead")
}

// TestFailedReplayKeepsFigures: an event that stops the replay leaves the
// figures of what was replayed before it, for the CLI to print.
func TestFailedReplayKeepsFigures(t *testing.T) {
	events, err := Parse(strings.NewReader(header +
		"0,0,alloc,4194304,0,0,0,,\n" +
		"1,0,alloc,104857600,0,1,0,,\n" + // 100 MiB on an 8 MiB device
		"2,0,free_completed,4194304,0,0,0,,\n"))
	require.NoError(t, err)
	res, err := Replay(events, Options{Capacity: 8 * units.MiB, Record: true})
	require.True(t, errors.Is(err, driver.ErrOutOfMemory), "%v", err)
	require.Contains(t, err.Error(), "line 3 (seq 1)")
	require.Equal(t, 1, res.Events)
	require.Len(t, res.Devices, 1)
	d := res.Devices[0]
	require.Equal(t, 1, d.Allocs)
	require.Equal(t, 4*units.MiB, d.Figures.Allocated)
	require.Equal(t, 4*units.MiB, d.Figures.PeakAllocated)
	require.True(t, d.Priced)
	require.NotZero(t, d.DriverCalls.Map)
	require.NotNil(t, d.Timeline)
	require.Len(t, d.Timeline.Allocated.X, 2, "the state after each event met, the failing one (which changed nothing) included")
	require.NotNil(t, d.PeakMap)
}
