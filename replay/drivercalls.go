package replay

// Driver calls as a budget: the calls vmarena's allocator made, as the
// sim driver counted them, beside the calls PyTorch's caching allocator
// would have made for the trace's segment events, both priced with the
// sim driver's table of per-call costs.

import (
	"time"

	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/cachingmodel"
)

// SegmentCalls are the driver calls an expandable segment makes for one
// segment event of op and size bytes, as CUDACachingAllocator.cpp makes
// them: memory is mapped in pages of 2 MiB (the small pool's) when size
// is at most 2 MiB and of 20 MiB (the large pool's) otherwise
// (cachingmodel.ExpandablePages), each page its own cuMemCreate and
// cuMemMap, with one cuMemSetAccess over the range mapped; unmapping
// takes a cuMemUnmap and a cuMemRelease per page. segment_alloc and segment_map
// are mapping, segment_free and segment_unmap unmapping (a cudaMalloc
// segment priced as an expandable segment would map it). Any other op,
// or a size of 0, makes no call.
func SegmentCalls(op Op, size uint64) sim.Calls {
	pages := cachingmodel.ExpandablePages(size)
	switch {
	case pages == 0:
		return sim.Calls{}
	case op == OpSegmentAlloc || op == OpSegmentMap:
		return sim.Calls{Create: pages, Map: pages, SetAccess: 1}
	case op == OpSegmentFree || op == OpSegmentUnmap:
		return sim.Calls{Unmap: pages, Release: pages}
	}
	return sim.Calls{}
}

// DriverTime is vmarena's driver calls on the device priced by the sim
// driver's table; 0 when not Priced.
func (d DeviceResult) DriverTime() time.Duration { return d.DriverCalls.Time(d.CallCosts) }

// PyTorchDriverTime is the calls of PyTorch's segment events
// (Summary.SegmentCalls) priced by the same table; 0 when not Priced.
func (d DeviceResult) PyTorchDriverTime() time.Duration {
	return d.Summary.SegmentCalls.Time(d.CallCosts)
}

// DriverTimeTarget: vmarena's modelled driver time at most PyTorch's,
// both priced by the sim driver's table, at any granularity. Not
// applicable off the sim driver (nothing priced), to a trace without
// segment events, or to one that starts mid-run, whose segment events
// leave out the segments made before recording.
func (d DeviceResult) DriverTimeTarget() Verdict {
	switch {
	case !d.Priced || d.Summary.SegmentEvents == 0 || d.Summary.MidRun():
		return NA
	case d.DriverTime() <= d.PyTorchDriverTime():
		return Met
	}
	return NotMet
}

// PriceTables are the tables of per-call costs a replay's driver calls
// are given in, both sides priced by each: the A100's published figures
// and the H100's measured ones weigh a create against a grant or an unmap
// differently (sim.H100), so a change that trades one for the other shows
// in one of them.
var PriceTables = []sim.CallCosts{sim.A100, sim.H100}

// DriverTimes are both sides' driver calls on a device priced by one
// table.
type DriverTimes struct {
	// Costs is the table.
	Costs sim.CallCosts
	// VMArena is vmarena's calls priced, when Priced (the replay ran on
	// a sim driver, which counted them).
	VMArena time.Duration
	Priced  bool
	// PyTorch is the calls of the trace's segment events priced, when
	// PyTorchKnown: the trace has segment events. Without them what
	// PyTorch did with the driver is unknown, not nothing.
	PyTorch      time.Duration
	PyTorchKnown bool
	// MidRun says the trace starts mid-run: its segment events leave out
	// the segments made before recording, so PyTorch's time is a part.
	MidRun bool
}

// Ratio is vmarena's time over PyTorch's; ok only when both are known,
// PyTorch's is whole (not MidRun) and not zero.
func (t DriverTimes) Ratio() (ratio float64, ok bool) {
	if !t.Priced || !t.PyTorchKnown || t.MidRun || t.PyTorch == 0 {
		return 0, false
	}
	return float64(t.VMArena) / float64(t.PyTorch), true
}

// DriverTimesBy prices both sides' calls on the device by costs.
func (d DeviceResult) DriverTimesBy(costs sim.CallCosts) DriverTimes {
	t := DriverTimes{Costs: costs, Priced: d.Priced, PyTorchKnown: d.Summary.SegmentEvents > 0, MidRun: d.Summary.MidRun()}
	if t.Priced {
		t.VMArena = d.DriverCalls.Time(costs)
	}
	if t.PyTorchKnown {
		t.PyTorch = d.Summary.SegmentCalls.Time(costs)
	}
	return t
}
