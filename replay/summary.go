package replay

import (
	"slices"

	"github.com/vmarena/vmarena/driver/sim"
)

// Summary is what a trace says its own allocator (PyTorch's caching
// allocator) did on one device.
//
// A trace may start mid-run: recording began while allocations and
// segments already existed. Its frees then name allocations it never
// allocated, or its segment events return more than it reserved. The
// running sums below start at zero with the first event all the same, so
// for such a trace they are what changed during the recording, and
// PyTorch's reserved figures say nothing about what it held.
type Summary struct {
	// Device is the device the events happened on.
	Device int
	// Events is the number of events on the device; ByOp counts them by
	// op (indexed by Op; ByOp[0] is unused).
	Events int
	ByOp   [numOps]int
	// PeakAllocated is the most bytes live at once: the running sum of the
	// sizes of live allocations, where an allocation lives from its alloc to
	// its free_completed (free_requested does not end it: the stream may
	// still be using the memory).
	PeakAllocated uint64
	// UnmatchedFrees counts free_completed events whose alloc_id is not
	// live; they change nothing.
	UnmatchedFrees int
	// FreedBeforeRecording counts the allocations the trace frees
	// (free_requested or free_completed) without having allocated them:
	// made before recording began. PyTorch's snapshots give them alloc_id
	// -1, so each is told apart by its alloc_id and address.
	FreedBeforeRecording int
	// MismatchedFrees counts frees of a live allocation whose address or
	// size differs from what its alloc recorded. The allocation is freed
	// all the same, and the sums use the alloc's size.
	MismatchedFrees int
	// SegmentEvents counts PyTorch's segment events: segment_alloc,
	// segment_free, segment_map and segment_unmap, each one contiguous
	// range reserved or mapped, returned or unmapped, at once.
	SegmentEvents int
	// PeakReserved is the most bytes held in segments at once: the running
	// sum of segment_alloc and segment_map sizes less segment_free and
	// segment_unmap sizes. Zero when the trace has no segment events.
	PeakReserved uint64
	// ReservedBelowZero says the running sum of segments went below zero:
	// the trace returned segments reserved before recording.
	ReservedBelowZero bool
	// SegmentCalls are the driver calls PyTorch's expandable segments
	// make for the segment events (SegmentCalls, the function: pages of
	// 2 MiB or 20 MiB, each created and mapped, one access grant an
	// event, each unmapped and released). A trace that starts mid-run
	// does not show the segments made before recording, nor so their
	// calls.
	SegmentCalls sim.Calls
	// OOMs counts the requests PyTorch failed (oom events).
	OOMs int
}

// Count is the number of events with the op.
func (s Summary) Count(op Op) int {
	if int(op) >= numOps {
		return 0
	}
	return s.ByOp[op]
}

// MidRun says the trace started while the device already held memory that
// the trace frees: allocations or segments made before recording.
func (s Summary) MidRun() bool { return s.FreedBeforeRecording > 0 || s.ReservedBelowZero }

// PyTorchRatio is PeakReserved / PeakAllocated: how much memory the
// trace's own allocator held for what was live at the peak. ok is false
// when the trace has no segment events (or allocates nothing) and so says
// nothing about it, and when it starts mid-run, where the reserved sum
// leaves out what was held before recording.
func (s Summary) PyTorchRatio() (ratio float64, ok bool) {
	if s.SegmentEvents == 0 || s.PeakAllocated == 0 || s.MidRun() {
		return 0, false
	}
	return float64(s.PeakReserved) / float64(s.PeakAllocated), true
}

// Summarize adds up a trace's events, one Summary per device the events
// name, in device order.
func Summarize(events []Event) []Summary {
	tallies := map[int]*tally{}
	for _, ev := range events {
		t := tallies[ev.Device]
		if t == nil {
			t = &tally{s: Summary{Device: ev.Device}, live: map[int64]Event{}, allocated: map[int64]bool{}, early: map[earlyFree]bool{}}
			tallies[ev.Device] = t
		}
		t.add(ev)
	}
	sums := make([]Summary, 0, len(tallies))
	for _, t := range tallies {
		sums = append(sums, t.s)
	}
	slices.SortFunc(sums, func(a, b Summary) int { return a.Device - b.Device })
	return sums
}

// tally is one device's running account.
type tally struct {
	s         Summary
	live      map[int64]Event    // the alloc of each live alloc_id
	allocated map[int64]bool     // alloc_ids allocated at least once
	early     map[earlyFree]bool // allocations freed without an alloc: made before recording
	bytes     uint64             // live bytes
	reserved  int64              // may go below zero in a trace that starts mid-run
}

// earlyFree names an allocation made before recording: its free_requested
// and free_completed carry the same alloc_id and address.
type earlyFree struct {
	id   int64
	addr uint64
}

func (t *tally) add(ev Event) {
	s := &t.s
	s.Events++
	if int(ev.Op) < numOps {
		s.ByOp[ev.Op]++
	}
	switch {
	case ev.Op == OpAlloc:
		t.live[ev.AllocID] = ev
		t.allocated[ev.AllocID] = true
		t.bytes += ev.Size
		s.PeakAllocated = max(s.PeakAllocated, t.bytes)
	case ev.Op.IsFree():
		a, ok := t.live[ev.AllocID]
		switch {
		case ok && (a.Addr != ev.Addr || a.Size != ev.Size):
			s.MismatchedFrees++
		case !ok && !t.allocated[ev.AllocID] && !t.early[earlyFree{ev.AllocID, ev.Addr}]:
			t.early[earlyFree{ev.AllocID, ev.Addr}] = true
			s.FreedBeforeRecording++
		}
		if ev.Op != OpFreeCompleted {
			return
		}
		if !ok {
			s.UnmatchedFrees++
			return
		}
		delete(t.live, ev.AllocID)
		t.bytes -= a.Size
	case ev.Op.IsSegment():
		s.SegmentEvents++
		s.SegmentCalls = s.SegmentCalls.Add(SegmentCalls(ev.Op, ev.Size))
		t.reserved += int64(ev.Op.reserves()) * int64(ev.Size)
		if t.reserved < 0 {
			s.ReservedBelowZero = true
		} else {
			s.PeakReserved = max(s.PeakReserved, uint64(t.reserved))
		}
	case ev.Op == OpOOM:
		s.OOMs++
	}
}
