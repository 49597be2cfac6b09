package replay

// PyTorch's side of a workload that has none: the segment events a model
// of its caching allocator makes for the same allocations.

import (
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/cachingmodel"
	"github.com/vmarena/vmarena/internal/errors"
)

// WithModelledSegments returns events with the segment events PyTorch's
// caching allocator would have made for them added where it makes them:
// each device's allocations and completed frees run through
// internal/cachingmodel (CUDACachingAllocator.cpp's defaults: 512 B
// rounding, a small pool of 2 MiB segments, 20 MiB segments for requests
// under 10 MiB, best fit, splitting and merging, empty segments given
// back only when an allocation finds the device full) on a device of
// capacity bytes. A segment made is a segment_alloc before the alloc that
// made it, one given back a segment_free; an allocation the model cannot
// serve is an oom event before its alloc (DeviceFree what the model left
// free), and the model then leaves that allocation and its free out. The
// events added are Modelled: a replay does not probe a modelled oom (the
// alloc after it is the probe), so vmarena's figures are those of the
// workload alone. So
// a generated workload's PyTorch figures (peak reserved, its ratio,
// segment events and their driver calls, oom events) come from the same
// rules as a recorded trace's, beside vmarena's replay of the same
// events; they are a model's, reproducing the bundled traces that start
// empty (internal/cachingmodel's and arena's tests). The events are
// numbered afresh as Synthetic numbers them (Seq from 0, Line from 2), so
// it is for generated workloads: a recorded trace's lines would move.
// An alloc of 0 bytes takes no block (PyTorch's allocate returns a null
// pointer for it). Events that already have segment events are
// driver.ErrInvalid, as is a capacity of 0 or an alloc of an id already
// live; the input is never changed.
func WithModelledSegments(events []Event, capacity uint64) ([]Event, error) {
	if capacity == 0 {
		return nil, errors.Wrapf(driver.ErrInvalid, "replay: a modelled device of 0 bytes")
	}
	for _, ev := range events {
		if ev.Op.IsSegment() {
			return nil, errors.Wrapf(driver.ErrInvalid, "replay: line %d: the events have segment events of their own (%s)", ev.Line, ev.Op)
		}
	}
	out := make([]Event, 0, len(events)+len(events)/8)
	models := map[int]*cachingmodel.Model{}
	held := map[allocKey]bool{} // what each model serves
	var segs []cachingmodel.Segment
	for _, ev := range events {
		m := models[ev.Device]
		if m == nil {
			m = cachingmodel.New(capacity)
			models[ev.Device] = m
		}
		key := allocKey{ev.Device, ev.AllocID}
		switch {
		case ev.Op == OpAlloc && ev.Size == 0:
			// PyTorch's allocate hands back a null pointer for 0 bytes,
			// taking no block: nothing for the model to hold.
		case ev.Op == OpAlloc:
			var err error
			segs, err = m.Alloc(ev.AllocID, ev.Size, segs[:0])
			for _, s := range segs {
				op := OpSegmentAlloc
				if s.Released {
					op = OpSegmentFree
				}
				out = append(out, Event{Device: ev.Device, Op: op, Size: s.Size, Addr: s.Addr, HasAddr: true, AllocID: -1, Stream: ev.Stream, Modelled: true})
			}
			switch {
			case errors.Is(err, cachingmodel.ErrOutOfMemory):
				out = append(out, Event{Device: ev.Device, Op: OpOOM, Size: ev.Size, AllocID: -1, Stream: ev.Stream,
					DeviceFree: capacity - m.Reserved(), HasDeviceFree: true, Modelled: true})
			case err != nil:
				return nil, errors.Wrapf(driver.ErrInvalid, "replay: line %d: %v", ev.Line, err)
			default:
				held[key] = true
			}
		case ev.Op == OpFreeCompleted:
			if held[key] {
				delete(held, key)
				if err := m.Free(ev.AllocID); err != nil {
					return nil, errors.AssertionFailedf("replay: line %d: %v", ev.Line, err)
				}
			}
		}
		out = append(out, ev)
	}
	for i := range out {
		out[i].Seq, out[i].Line = uint64(i), i+2
	}
	return out, nil
}
