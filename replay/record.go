package replay

// Recording for reports: what a replay's devices held after each event,
// and the allocator's memory map at the trace's peak (Options.Record).
// Off, it costs a nil check an event.

import (
	"fmt"

	"github.com/vmarena/vmarena/internal/series"
)

// RecordPoints is the most points a recorded series keeps: long runs are
// thinned, each stretch keeping its highest and lowest sample, so peaks
// survive (package internal/series).
const RecordPoints = 2000

// Series is a recorded series: Y[i] at X[i], X never decreasing.
type Series = series.Series

// Timeline is a device's memory after each of its events, X numbering the
// device's events from 1 in trace order, Y in bytes.
type Timeline struct {
	// Allocated is what live allocations asked for (the trace's and
	// vmarena's allocator's alike).
	Allocated Series
	// Committed is the memory vmarena's allocator held.
	Committed Series
	// Reserved is PyTorch's running sum of segments (segment_alloc and
	// segment_map less segment_free and segment_unmap): below zero in a
	// trace that starts mid-run, all zero in one without segment events.
	Reserved Series
}

// MapKind is what a stretch of an allocator's range holds.
type MapKind uint8

const (
	// MapUsed is a live allocation.
	MapUsed MapKind = iota
	// MapFree is committed memory no allocation uses.
	MapFree
	// MapUncommitted is address space with no memory behind it: never
	// committed, or given back.
	MapUncommitted
	// MapLent is free chunks of the large-request range mapped a second
	// time into a stitched allocation.
	MapLent
	// MapStitched is a stitched allocation in the stitch range.
	MapStitched
)

var mapKindNames = [...]string{"used", "free", "uncommitted", "lent", "stitched"}

func (k MapKind) String() string {
	if int(k) < len(mapKindNames) {
		return mapKindNames[k]
	}
	return fmt.Sprintf("MapKind(%d)", uint8(k))
}

// MapBlock is [Offset, Offset+Size) of one of an allocator's ranges.
type MapBlock struct {
	// Range indexes PeakMap.Ranges; Offset is from the range's base.
	Range        int
	Offset, Size uint64
	Kind         MapKind
}

// PeakMap is an allocator's memory map when the trace's allocated memory
// first reached its peak (or after the last event, for a device that
// allocated nothing).
type PeakMap struct {
	// Event is the device's event after which the map was taken,
	// numbered as Timeline's; Line is its line in the trace (0 when
	// taken after the last event of a device that allocated nothing).
	Event, Line int
	// Allocated and Committed are the allocator's figures then.
	Allocated, Committed uint64
	// Ranges names the allocator's ranges: small requests, large
	// requests and, with stitching on, the stitch range.
	Ranges []string
	// Blocks tile each range in address order, from offset 0 to its end.
	Blocks []MapBlock
}

// recorder records one device of a replay.
type recorder struct {
	events                         int
	allocated, committed, reserved *series.Thinned
	sum                            int64 // PyTorch's reserved bytes
	peak                           *PeakMap
}

func newRecorder() *recorder {
	return &recorder{allocated: series.New(RecordPoints), committed: series.New(RecordPoints), reserved: series.New(RecordPoints)}
}

// record adds the device's state after ev, and takes the memory map the
// first time its allocated memory is the trace's peak.
func (r *recorder) record(d *device, ev Event) {
	r.events++
	if ev.Op.IsSegment() {
		r.sum += int64(ev.Op.reserves()) * int64(ev.Size)
	}
	allocated, committed := d.al.usage()
	x := float64(r.events)
	r.allocated.Add(x, float64(allocated))
	r.committed.Add(x, float64(committed))
	r.reserved.Add(x, float64(r.sum))
	if r.peak == nil && allocated > 0 && allocated == d.res.Summary.PeakAllocated {
		r.peak = d.al.memoryMap()
		r.peak.Event, r.peak.Line = r.events, ev.Line
		r.peak.Allocated, r.peak.Committed = allocated, committed
	}
}

// finish puts what was recorded into the device's result.
func (r *recorder) finish(d *device) {
	d.res.Timeline = &Timeline{Allocated: r.allocated.Series(), Committed: r.committed.Series(), Reserved: r.reserved.Series()}
	if r.peak == nil {
		r.peak = d.al.memoryMap()
		r.peak.Event = r.events
		r.peak.Allocated, r.peak.Committed = d.al.usage()
	}
	d.res.PeakMap = r.peak
}
