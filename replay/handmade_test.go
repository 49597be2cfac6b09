package replay

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/units"
)

// TestReplayHandmade replays testdata/alloc-traces/handmade_two_devices.csv,
// a trace written for this test, and checks every figure against values
// worked out by hand below. The trace has two devices using the same
// alloc_ids; device 0 starts mid-run (its first events free an allocation
// made before recording), frees an allocation with the wrong size, and
// PyTorch fails a 96 GiB request on it; device 1 mixes segment_alloc with
// expandable segments' segment_map / segment_unmap, and PyTorch fails an
// 8 MiB request there that vmarena can serve.
//
// vmarena's figures are the allocator's (2 MiB granules, default policy,
// stitching on; every request here is over 1 MiB, so all go to its large
// heap): a request no free block fits goes to the hole that needs the
// fewest new granules, using the free bytes beside it; whole free chunks
// elsewhere move there first (an unmap and a map each, nothing created);
// the rest is committed — ahead of need while committed stays within the
// live set plus max(2 MiB, live/256), else after giving back whole free
// chunks down to that — as chunks cut for the request: its interior one
// chunk, the granules beside it one each. A request that would cover a
// large free chunk in part (a freed allocation's interior) splits it: the
// chunk goes back and the request's own chunks, and room for one more
// like it, are committed.
func TestReplayHandmade(t *testing.T) {
	const MiB = units.MiB
	events := readTrace(t, "handmade_two_devices.csv")
	require.Len(t, events, 31)
	res, err := Replay(events, Options{CheckEvery: 1, Verify: true, Drain: true})
	require.NoError(t, err)
	require.Len(t, res.Devices, 2)

	// Device 0, events in seq order; allocated is PyTorch's running sum,
	// reserved its segments; vmarena's arena in MiB offsets.
	//
	//	 0,1  free_requested/completed of alloc_id -1 at 4 GiB: made before
	//	      recording (mid-run: 1), unmatched and skipped (1)
	//	 4    segment_alloc 20 MiB                     reserved 20
	//	 5    alloc 1: 6 MiB   allocated  6   commit [0,8) (budget 6+2): its
	//	      interior [0,6) one chunk, [6,8) another; id 1 at [0,6)
	//	 6    alloc 2: 3 MiB   allocated  9   commit [8,10) (budget 11): id 2 at [6,9)
	//	11,12 free 1 (completed with 5 MiB: disagrees, 1)  allocated 3   [0,6)
	//	      free: one whole chunk
	//	13    segment_alloc 12 MiB                     reserved 32
	//	14    alloc 3: 12 MiB  allocated 15   nothing fits; the tail [9,10)
	//	      needs [10,22): the free chunk [0,6) moves to [10,16) (one unmap,
	//	      one map, one map event), then [16,22) is committed, [16,20) and
	//	      [20,22); id 3 at [9,21), committed 16
	//	18    oom 96 GiB, 1 MiB free: more than the 80 GiB allocator, not served
	//	19,20 free 2          allocated 12   [6,9) free, beside the hole [0,6)
	//	21    segment_free 20 MiB                      reserved 12
	//	25    segment_alloc 20 MiB                     reserved 32
	//	26    alloc 4: 4 MiB   allocated 16 (the peak)  ending at [6,9)'s end needs
	//	      only [4,6): id 4 at [5,9), committed 18 (the peak)
	//	29,30 free 3          allocated  4
	d := res.Devices[0]
	s := d.Summary
	require.Equal(t, 0, d.Device)
	require.Equal(t, 17, s.Events)
	require.Equal(t, [numOps]int{OpAlloc: 4, OpFreeRequested: 4, OpFreeCompleted: 4, OpSegmentAlloc: 3, OpSegmentFree: 1, OpOOM: 1}, s.ByOp)
	require.Equal(t, 16*MiB, s.PeakAllocated)
	require.Equal(t, 1, s.UnmatchedFrees)
	require.Equal(t, 1, s.FreedBeforeRecording)
	require.Equal(t, 1, s.MismatchedFrees)
	require.Equal(t, 4, s.SegmentEvents)
	require.Equal(t, 32*MiB, s.PeakReserved)
	require.False(t, s.ReservedBelowZero)
	require.Equal(t, 1, s.OOMs)
	require.True(t, s.MidRun())
	_, ok := s.PyTorchRatio()
	require.False(t, ok, "mid-run")

	require.Equal(t, 4, d.Allocs)
	require.Equal(t, 3, d.Frees)
	require.Equal(t, 1, d.SkippedFrees)
	require.Len(t, d.OOMs, 1)
	require.Contains(t, d.OOMs[0].Refusal, "larger than the allocator's maximum 80 GiB")
	require.Equal(t, OOM{Line: 20, Seq: 18, Size: 96 * units.GiB, DeviceFree: 1 * MiB, HasDeviceFree: true}, withoutRefusal(d.OOMs[0]))
	require.Equal(t, Figures{
		Allocated: 4 * MiB, PeakAllocated: 16 * MiB,
		Committed: 18 * MiB, PeakCommitted: 18 * MiB,
		MapEvents: 5, UnmapEvents: 1, ChunkMaps: 7, ChunkUnmaps: 1,
		Grows: 4, Live: 1,
	}, d.Figures)
	require.InDelta(t, 18.0/16, d.Ratio(), 1e-12)
	require.Equal(t, NotMet, d.RatioTarget(), "a chunk of slack is 1/8 of 16 MiB")
	require.Equal(t, NA, d.MapEventsTarget(), "mid-run")
	// The drain frees id 4 and gives back [4,22): one run of 6 chunks.
	require.Equal(t, Figures{PeakAllocated: 16 * MiB, PeakCommitted: 18 * MiB,
		MapEvents: 5, UnmapEvents: 2, ChunkMaps: 7, ChunkUnmaps: 7,
		Decommits: 1, DecommittedBytes: 18 * MiB, Grows: 4}, d.AfterDrain)

	// Device 1, the same ids 1 to 4 as device 0's:
	//
	//	 2    segment_alloc 10 MiB                     reserved 10
	//	 3    alloc 1: 10 MiB  allocated 10   commit [0,12) (budget 10+2): its
	//	      interior [0,10) one chunk, [10,12) another
	//	 7    segment_map 10 MiB                       reserved 20
	//	 8    alloc 2: 10 MiB  allocated 20   commit [12,22): id 2 at [10,20)
	//	 9    segment_map 10 MiB                       reserved 30
	//	10    alloc 3: 10 MiB  allocated 30 (the peak)  commit [22,32): id 3 at
	//	      [20,30), committed 32 (the peak)
	//	15,16 free 1          allocated 20   [0,10) free: one whole chunk
	//	17    oom 8 MiB, 2 MiB free: served at [0,8), which would cover the
	//	      10 MiB chunk in part: it goes back (one unmap, one release) and
	//	      [0,8) and [8,10) are committed; freed at once
	//	22,23 free 3          allocated 10   [20,32) free
	//	24    segment_unmap 10 MiB                     reserved 20
	//	27    segment_map 16 MiB                       reserved 36 (the peak)
	//	28    alloc 4: 16 MiB  allocated 26   no free block holds it; the tail
	//	      [20,32) needs [32,36): the free chunk [8,10) moves to [32,34),
	//	      [0,8) goes back (past the budget of 26+2), and [34,38) is
	//	      committed (two more, within the budget): id 4 at [20,36),
	//	      committed 28
	d = res.Devices[1]
	s = d.Summary
	require.Equal(t, 1, d.Device)
	require.Equal(t, 14, s.Events)
	require.Equal(t, [numOps]int{OpAlloc: 4, OpFreeRequested: 2, OpFreeCompleted: 2, OpSegmentAlloc: 1, OpSegmentMap: 3, OpSegmentUnmap: 1, OpOOM: 1}, s.ByOp)
	require.Equal(t, 30*MiB, s.PeakAllocated)
	require.Zero(t, s.UnmatchedFrees)
	require.Zero(t, s.FreedBeforeRecording)
	require.Zero(t, s.MismatchedFrees)
	require.Equal(t, 5, s.SegmentEvents)
	require.Equal(t, 36*MiB, s.PeakReserved)
	require.Equal(t, 1, s.OOMs)
	require.False(t, s.MidRun())
	ratio, ok := s.PyTorchRatio()
	require.True(t, ok)
	require.InDelta(t, 36.0/30, ratio, 1e-12)

	require.Equal(t, 4, d.Allocs)
	require.Equal(t, 2, d.Frees)
	require.Zero(t, d.SkippedFrees)
	require.Equal(t, []OOM{{Line: 19, Seq: 17, Size: 8 * MiB, DeviceFree: 2 * MiB, HasDeviceFree: true, Served: true}}, d.OOMs)
	require.Equal(t, Figures{
		Allocated: 26 * MiB, PeakAllocated: 30 * MiB,
		Committed: 28 * MiB, PeakCommitted: 32 * MiB,
		MapEvents: 6, UnmapEvents: 3, ChunkMaps: 11, ChunkUnmaps: 3,
		Decommits: 2, DecommittedBytes: 18 * MiB,
		Grows: 4, Live: 2,
	}, d.Figures)
	require.InDelta(t, 32.0/30, d.Ratio(), 1e-12)
	require.Equal(t, NotMet, d.RatioTarget(), "a chunk of slack is 1/15 of 30 MiB")
	require.Equal(t, 9, d.Figures.MapUnmapEvents())
	require.Equal(t, NotMet, d.MapEventsTarget(), "9 map and unmap events, 5 segment events")
	// The drain frees ids 2 and 4 and gives back [10,38): one run of 8
	// chunks.
	require.Equal(t, Figures{PeakAllocated: 30 * MiB, PeakCommitted: 32 * MiB,
		MapEvents: 6, UnmapEvents: 4, ChunkMaps: 11, ChunkUnmaps: 11,
		Decommits: 3, DecommittedBytes: 46 * MiB, Grows: 4}, d.AfterDrain)
}
