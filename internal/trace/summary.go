package trace

// Summary is what a trace says its own allocator (PyTorch's caching
// allocator) did.
type Summary struct {
	// Events is the number of events; ByOp counts them by op (indexed by
	// Op; ByOp[0] is unused).
	Events int
	ByOp   [numOps]int
	// Devices is the number of distinct devices the events name.
	Devices int
	// PeakAllocated is the most bytes live at once: the running sum of the
	// sizes of live allocations, where an allocation lives from its alloc to
	// its free_completed (free_requested does not end it: the stream may
	// still be using the memory).
	PeakAllocated uint64
	// UnmatchedFrees counts free_completed events whose alloc_id is not
	// live; they change nothing.
	UnmatchedFrees int
	// SegmentEvents counts segment_alloc and segment_free events.
	SegmentEvents int
	// PeakReserved is the most bytes held in segments at once: the running
	// sum of segment_alloc sizes less segment_free sizes. Zero when the
	// trace has no segment events.
	PeakReserved uint64
}

// Count is the number of events with the op.
func (s Summary) Count(op Op) int {
	if int(op) >= numOps {
		return 0
	}
	return s.ByOp[op]
}

// PyTorchRatio is PeakReserved / PeakAllocated: how much memory the
// trace's own allocator held for what was live at the peak. ok is false
// when the trace has no segment events (or allocates nothing) and so says
// nothing about it.
func (s Summary) PyTorchRatio() (ratio float64, ok bool) {
	if s.SegmentEvents == 0 || s.PeakAllocated == 0 {
		return 0, false
	}
	return float64(s.PeakReserved) / float64(s.PeakAllocated), true
}

// Summarize adds up a trace's events.
func Summarize(events []Event) Summary {
	var s Summary
	live := map[int64]uint64{}
	devices := map[int]struct{}{}
	var allocated uint64
	var reserved int64 // may go below zero if a trace starts after segments were reserved
	for _, ev := range events {
		s.Events++
		if int(ev.Op) < numOps {
			s.ByOp[ev.Op]++
		}
		devices[ev.Device] = struct{}{}
		switch ev.Op {
		case OpAlloc:
			live[ev.AllocID] += ev.Size
			allocated += ev.Size
			s.PeakAllocated = max(s.PeakAllocated, allocated)
		case OpFreeCompleted:
			size, ok := live[ev.AllocID]
			if !ok {
				s.UnmatchedFrees++
				continue
			}
			delete(live, ev.AllocID)
			allocated -= size
		case OpSegmentAlloc:
			s.SegmentEvents++
			reserved += int64(ev.Size)
			if reserved > 0 {
				s.PeakReserved = max(s.PeakReserved, uint64(reserved))
			}
		case OpSegmentFree:
			s.SegmentEvents++
			reserved -= int64(ev.Size)
		}
	}
	s.Devices = len(devices)
	return s
}
