package replay

import "github.com/vmarena/vmarena/internal/units"

// Targets for vmarena's allocator on a replayed trace, per device.
const (
	// TargetRatio is the most peak committed / peak allocated may be, at
	// TargetGranularity, on every trace.
	TargetRatio = 1.01
	// TargetGranularity is the granularity TargetRatio is stated for.
	TargetGranularity = 2 * units.MiB
)

// Verdict says whether a target was met.
type Verdict string

const (
	Met    Verdict = "met"
	NotMet Verdict = "not met"
	// NA: the target does not apply (another granularity; nothing
	// allocated; no segment events of PyTorch's to compare with, or only
	// those of a trace that starts mid-run).
	NA Verdict = "n/a"
)

// Ratio is the allocator's peak committed over the trace's peak allocated:
// the figure to set beside Summary.PyTorchRatio. The trace's figure is the
// denominator of both, so the two compare the same live bytes.
func (d DeviceResult) Ratio() float64 {
	if d.Summary.PeakAllocated == 0 {
		return 0
	}
	return float64(d.Figures.PeakCommitted) / float64(d.Summary.PeakAllocated)
}

// RatioTarget: Ratio at most TargetRatio, at TargetGranularity. It holds
// for every trace, mid-run ones included: the replay commits for exactly
// the allocations the trace shows.
func (d DeviceResult) RatioTarget() Verdict {
	switch {
	case d.Granularity != TargetGranularity || d.Summary.PeakAllocated == 0:
		return NA
	case d.Ratio() <= TargetRatio:
		return Met
	}
	return NotMet
}

// MapUnmapEvents is vmarena's map and unmap events together: the figure
// PyTorch's segment events count.
func (f Figures) MapUnmapEvents() int { return f.MapEvents + f.UnmapEvents }

// MapEventsTarget: no more map and unmap events than PyTorch has segment
// events, both counted as PyTorch counts them (one per contiguous range
// mapped or unmapped at once). Not applicable to a trace without segment
// events or one that starts mid-run, whose segment events leave out what
// was reserved before recording.
func (d DeviceResult) MapEventsTarget() Verdict {
	switch {
	case d.Summary.SegmentEvents == 0 || d.Summary.MidRun():
		return NA
	case d.Figures.MapUnmapEvents() <= d.Summary.SegmentEvents:
		return Met
	}
	return NotMet
}
