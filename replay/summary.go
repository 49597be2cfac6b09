package replay

import (
	"cmp"
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
	// Peak is when the allocated memory first reached PeakAllocated, and
	// LargestAtPeak the largest allocations live then (at most
	// MaxLargestAtPeak, largest first, the earlier alloc first among
	// equals), of LiveAtPeak live; all zero when nothing was allocated.
	// PyTorch's memory viz shows the same: what held the memory at the
	// peak, and since when.
	Peak          PeakAlloc
	LargestAtPeak []PeakAlloc
	LiveAtPeak    int
	// FirstTimeUS is the time of the device's first event that has one,
	// when HasFirstTime: times in the report are counted from it.
	FirstTimeUS  int64
	HasFirstTime bool
}

// MaxLargestAtPeak is how many of the allocations live at the peak a
// Summary names.
const MaxLargestAtPeak = 10

// PeakAlloc is an allocation as its alloc event recorded it: its id and
// size, and the event's line, seq and time (when HasTime). Summary.Peak
// is the event at which the allocated memory peaked.
type PeakAlloc struct {
	AllocID int64
	Size    uint64
	Line    int
	Seq     uint64
	TimeUS  int64
	HasTime bool
}

func peakAlloc(ev Event) PeakAlloc {
	return PeakAlloc{AllocID: ev.AllocID, Size: ev.Size, Line: ev.Line, Seq: ev.Seq, TimeUS: ev.TimeUS, HasTime: ev.HasTime}
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
	for i, ev := range events {
		t := tallies[ev.Device]
		if t == nil {
			t = &tally{s: Summary{Device: ev.Device}, live: map[int64]Event{}, allocated: map[int64]bool{}, early: map[earlyFree]bool{}, peakAt: -1}
			tallies[ev.Device] = t
		}
		t.add(ev, i)
	}
	largestAtPeak(events, tallies)
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
	peakAt    int                // the index of the event that first reached PeakAllocated; -1 before any
}

// largestAtPeak goes over the events a second time, each device's up to
// its peak, to name the allocations live there.
func largestAtPeak(events []Event, tallies map[int]*tally) {
	live := map[int]map[int64]Event{}
	for i, ev := range events {
		t := tallies[ev.Device]
		if i > t.peakAt {
			continue
		}
		l := live[ev.Device]
		if l == nil {
			l = map[int64]Event{}
			live[ev.Device] = l
		}
		switch ev.Op {
		case OpAlloc:
			l[ev.AllocID] = ev
		case OpFreeCompleted:
			delete(l, ev.AllocID)
		}
		if i < t.peakAt {
			continue
		}
		all := make([]Event, 0, len(l))
		for _, a := range l {
			all = append(all, a)
		}
		slices.SortFunc(all, func(a, b Event) int {
			if a.Size != b.Size {
				return cmp.Compare(b.Size, a.Size)
			}
			return cmp.Compare(a.Seq, b.Seq)
		})
		t.s.LiveAtPeak = len(all)
		for _, a := range all[:min(len(all), MaxLargestAtPeak)] {
			t.s.LargestAtPeak = append(t.s.LargestAtPeak, peakAlloc(a))
		}
	}
}

// earlyFree names an allocation made before recording: its free_requested
// and free_completed carry the same alloc_id and address.
type earlyFree struct {
	id   int64
	addr uint64
}

func (t *tally) add(ev Event, i int) {
	s := &t.s
	s.Events++
	if int(ev.Op) < numOps {
		s.ByOp[ev.Op]++
	}
	if ev.HasTime && !s.HasFirstTime {
		s.FirstTimeUS, s.HasFirstTime = ev.TimeUS, true
	}
	switch {
	case ev.Op == OpAlloc:
		t.live[ev.AllocID] = ev
		t.allocated[ev.AllocID] = true
		t.bytes += ev.Size
		if t.bytes > s.PeakAllocated {
			s.PeakAllocated, s.Peak, t.peakAt = t.bytes, peakAlloc(ev), i
		}
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
