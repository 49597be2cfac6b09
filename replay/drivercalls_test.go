package replay

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/units"
)

// TestSegmentCalls: a segment of at most 2 MiB maps 2 MiB pages, a larger
// one 20 MiB pages, rounding up; mapping is a create and a map a page and
// one access grant, unmapping an unmap and a release a page.
func TestSegmentCalls(t *testing.T) {
	const MiB = units.MiB
	for _, c := range []struct {
		size  uint64
		pages uint64
	}{
		{0, 0}, {1, 1}, {512, 1}, {2 * MiB, 1},
		{2*MiB + 1, 1}, {20 * MiB, 1}, {20*MiB + 1, 2}, {40 * MiB, 2}, {41 * MiB, 3},
		{80 * units.GiB, 4096}, {1<<64 - 1, (1<<64-1)/(20*MiB) + 1},
	} {
		wantMap, wantUnmap := sim.Calls{}, sim.Calls{}
		if c.pages > 0 {
			wantMap = sim.Calls{Create: c.pages, Map: c.pages, SetAccess: 1}
			wantUnmap = sim.Calls{Unmap: c.pages, Release: c.pages}
		}
		for _, op := range []Op{OpSegmentAlloc, OpSegmentMap} {
			require.Equal(t, wantMap, SegmentCalls(op, c.size), "%s of %d", op, c.size)
		}
		for _, op := range []Op{OpSegmentFree, OpSegmentUnmap} {
			require.Equal(t, wantUnmap, SegmentCalls(op, c.size), "%s of %d", op, c.size)
		}
		for _, op := range []Op{OpAlloc, OpFreeRequested, OpFreeCompleted, OpOOM, 0, 99} {
			require.Zero(t, SegmentCalls(op, c.size), "%s of %d", op, c.size)
		}
	}
}

// TestSummarySegmentCalls: the summary adds up the calls of every segment
// event, per device (worked out with awk from the traces, independently
// of this package; none of the real traces returns a segment).
func TestSummarySegmentCalls(t *testing.T) {
	sums := Summarize(readTrace(t, "handmade_two_devices.csv"))
	require.Len(t, sums, 2)
	// Device 0: segment_alloc 20, 12 and 20 MiB (one 20 MiB page each),
	// segment_free 20 MiB.
	require.Equal(t, sim.Calls{Create: 3, Map: 3, SetAccess: 3, Unmap: 1, Release: 1}, sums[0].SegmentCalls)
	// Device 1: segment_alloc 10, segment_map 10, 10 and 16 MiB,
	// segment_unmap 10 MiB.
	require.Equal(t, sim.Calls{Create: 4, Map: 4, SetAccess: 4, Unmap: 1, Release: 1}, sums[1].SegmentCalls)

	for _, c := range []struct {
		file             string
		pages, grants    uint64
		segmentEventsToo int
	}{
		{"cs336_kkaitlyn111_memory_ctx128_fullstep.csv", 2360, 783, 783},
		{"select_n_snapshot_v1f2f548.csv", 72, 13, 13},
		{"cs336_MAGMA27_memory_snapshot.csv", 0, 0, 0},
		{"cranberrii_ftcourse_memory_snapshot.csv", 331, 152, 152},
		{"wedsonlin_medium_512_training.csv", 4, 1, 1},
		{"silmont2000_mem_snapshot.csv", 184, 9, 9},
	} {
		sums := Summarize(readTrace(t, c.file))
		require.Len(t, sums, 1)
		require.Equal(t, sim.Calls{Create: c.pages, Map: c.pages, SetAccess: c.grants}, sums[0].SegmentCalls, c.file)
		require.Equal(t, c.segmentEventsToo, sums[0].SegmentEvents, c.file)
	}
}

// TestReplayCountsDriverCalls: a replay on the sim driver reads each
// device's calls from the driver, priced by its table beside PyTorch's;
// on a caller's sim driver it counts only its own calls; off the sim
// driver nothing is priced.
func TestReplayCountsDriverCalls(t *testing.T) {
	events := readTrace(t, "handmade_two_devices.csv")
	res, err := Replay(events, Options{CheckEvery: 1, Verify: true, Drain: true})
	require.NoError(t, err)
	require.Positive(t, res.SpaceCalls.Reserve, "the allocators reserve their ranges")
	require.Equal(t, sim.Calls{Reserve: res.SpaceCalls.Reserve}, res.SpaceCalls, "nothing unreserved before the last event")
	for _, d := range res.Devices {
		c := d.DriverCalls
		require.True(t, d.Priced)
		require.Equal(t, sim.A100, d.CallCosts)
		require.Zero(t, c.Reserve+c.Unreserve, "address space is the driver's, not a device's")
		require.Positive(t, c.Create)
		require.Positive(t, c.SetAccess)
		// The driver's count is the allocator's, which it keeps apart.
		require.Equal(t, uint64(d.Figures.ChunkMaps), c.Map)
		require.Equal(t, uint64(d.Figures.ChunkUnmaps), c.Unmap)
		require.Equal(t, c.Time(sim.A100), d.DriverTime())
		require.Equal(t, d.Summary.SegmentCalls.Time(sim.A100), d.PyTorchDriverTime())
	}
	require.Equal(t, NA, res.Devices[0].DriverTimeTarget(), "device 0 starts mid-run")
	require.Equal(t, 4*(sim.A100.Create+sim.A100.Map+sim.A100.SetAccess)+sim.A100.Unmap, res.Devices[1].PyTorchDriverTime())
	require.Contains(t, []Verdict{Met, NotMet}, res.Devices[1].DriverTimeTarget())

	// The same replay on a sim driver of the caller's, with calls of its
	// own before: the replay counts its own alone, and with its
	// allocators closed every chunk is unmapped and released.
	costs := sim.CallCosts{Name: "test", Create: time.Millisecond, Map: time.Microsecond}
	drv, err := sim.New(sim.Options{Devices: 3, Costs: costs})
	require.NoError(t, err)
	defer func() { require.NoError(t, drv.Close()) }()
	h, err := drv.Create(1, 2*units.MiB, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, drv.Release(h))
	on, err := ReplayOn(drv, events, Options{CheckEvery: 1, Verify: true, Drain: true})
	require.NoError(t, err)
	require.Equal(t, res.SpaceCalls, on.SpaceCalls)
	for i, d := range on.Devices {
		require.Equal(t, res.Devices[i].DriverCalls, d.DriverCalls, "device %d", i)
		require.Equal(t, costs, d.CallCosts)
		require.Equal(t, time.Duration(d.DriverCalls.Create)*time.Millisecond+time.Duration(d.DriverCalls.Map)*time.Microsecond, d.DriverTime())
	}
	total := drv.Tally().Total()
	require.Equal(t, total.Create, total.Release)
	require.Equal(t, total.Map, total.Unmap)
	require.Equal(t, total.Reserve, total.Unreserve)
	require.Equal(t, res.Devices[1].DriverCalls.Create+1, drv.Tally().Devices[1].Create, "the caller's own create, and the replay's")

	// Off the sim driver: nothing counted, nothing priced, n/a.
	hd, err := host.New(host.Options{Devices: 2, Capacity: 128 * units.MiB})
	require.NoError(t, err)
	defer func() { require.NoError(t, hd.Close()) }()
	off, err := ReplayOn(hd, events[:0:0], Options{})
	require.NoError(t, err)
	require.Empty(t, off.Devices)
	small := parseBody(t, "0,0,segment_alloc,2097152,0,-1,0,,\n1,0,alloc,4096,0,0,0,,\n")
	off, err = ReplayOn(hd, small, Options{Capacity: 64 * units.MiB})
	require.NoError(t, err)
	d := off.Devices[0]
	require.False(t, d.Priced)
	require.Zero(t, d.DriverCalls)
	require.Zero(t, d.CallCosts)
	require.Zero(t, off.SpaceCalls)
	require.Equal(t, sim.Calls{Create: 1, Map: 1, SetAccess: 1}, d.Summary.SegmentCalls, "PyTorch's calls are the trace's")
	require.Equal(t, NA, d.DriverTimeTarget())
}

func parseBody(t *testing.T, body string) []Event {
	t.Helper()
	events, err := Parse(strings.NewReader(header + body))
	require.NoError(t, err)
	return events
}

// TestDriverTimeTarget: vmarena's modelled time at most PyTorch's, priced
// by the same table; n/a off the sim driver, without segment events and
// mid-run.
func TestDriverTimeTarget(t *testing.T) {
	d := DeviceResult{Priced: true, CallCosts: sim.A100, Granularity: 64 * units.KiB,
		Summary:     Summary{SegmentEvents: 2, SegmentCalls: sim.Calls{Create: 10, Map: 10, SetAccess: 2}},
		DriverCalls: sim.Calls{Create: 10, Map: 10, SetAccess: 2}}
	require.Equal(t, d.DriverTime(), d.PyTorchDriverTime())
	require.Equal(t, Met, d.DriverTimeTarget(), "equal is met, at any granularity")
	d.DriverCalls.Release = 100
	require.Equal(t, Met, d.DriverTimeTarget(), "releases are unpriced on the A100 table")
	d.DriverCalls.Map++
	require.Equal(t, NotMet, d.DriverTimeTarget())
	require.Equal(t, d.PyTorchDriverTime()+sim.A100.Map, d.DriverTime())

	d.Summary.FreedBeforeRecording = 1
	require.Equal(t, NA, d.DriverTimeTarget(), "mid-run")
	d.Summary.FreedBeforeRecording, d.Summary.ReservedBelowZero = 0, true
	require.Equal(t, NA, d.DriverTimeTarget(), "mid-run")
	d.Summary.ReservedBelowZero, d.Summary.SegmentEvents = false, 0
	require.Equal(t, NA, d.DriverTimeTarget(), "no segment events")
	d.Summary.SegmentEvents, d.Priced = 2, false
	require.Equal(t, NA, d.DriverTimeTarget(), "not priced")
	require.Zero(t, DeviceResult{}.DriverTime())
}

// TestDriverTimesBy: both sides priced by each table; PyTorch's unknown
// without segment events (not zero), the ratio only where both are known
// and the trace starts from nothing.
func TestDriverTimesBy(t *testing.T) {
	d := DeviceResult{Priced: true, CallCosts: sim.A100,
		Summary:     Summary{SegmentEvents: 2, SegmentCalls: sim.Calls{Create: 10, Map: 10, SetAccess: 2}},
		DriverCalls: sim.Calls{Create: 5, Map: 10, SetAccess: 2, Unmap: 3, Release: 3}}
	for _, costs := range PriceTables {
		dt := d.DriverTimesBy(costs)
		require.Equal(t, d.DriverCalls.Time(costs), dt.VMArena)
		require.Equal(t, d.Summary.SegmentCalls.Time(costs), dt.PyTorch)
		x, ok := dt.Ratio()
		require.True(t, ok)
		require.InDelta(t, float64(dt.VMArena)/float64(dt.PyTorch), x, 1e-12)
	}
	require.Equal(t, d.DriverTime(), d.DriverTimesBy(d.CallCosts).VMArena, "the driver's own table prices the same")

	mid := d
	mid.Summary.FreedBeforeRecording = 1
	dt := mid.DriverTimesBy(sim.H100)
	require.True(t, dt.PyTorchKnown)
	_, ok := dt.Ratio()
	require.False(t, ok, "mid-run: PyTorch's time is a part")

	none := d
	none.Summary = Summary{}
	dt = none.DriverTimesBy(sim.A100)
	require.False(t, dt.PyTorchKnown)
	require.Zero(t, dt.PyTorch)
	_, ok = dt.Ratio()
	require.False(t, ok, "no segment events: unknown")

	off := d
	off.Priced, off.DriverCalls = false, sim.Calls{}
	dt = off.DriverTimesBy(sim.A100)
	require.False(t, dt.Priced)
	require.True(t, dt.PyTorchKnown, "PyTorch's calls are the trace's, priced on any driver")
	_, ok = dt.Ratio()
	require.False(t, ok)
}
