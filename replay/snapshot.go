package replay

// This file reads the pickles torch.cuda.memory._dump_snapshot writes. A
// snapshot is a dict whose "device_traces" holds one list per device of
// trace entries, each a dict with "action", "addr", "size", "stream",
// "time_us" (missing in older snapshots) and "frames" (the stack, not
// read here); an oom entry has "device_free" instead of "addr". The
// snapshot's "segments" (the allocator's state when it was dumped) are not
// read: the trace is what a replay needs.

import (
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/isnil"
	"github.com/vmarena/vmarena/internal/sentinel"
	"github.com/vmarena/vmarena/replay/internal/pickle"
)

// pickleProto is the first byte of every pickle of protocol 2 or later.
const pickleProto = 0x80

// ParseSnapshot reads a PyTorch memory snapshot (a pickle) into the
// events the CSV made from it holds, one event per trace entry: devices
// in order, each device's entries in order, Seq counting from 0 on each
// device (an entry's index in its device's trace, as PyTorch's
// _memory_viz numbers them) and Line the entry's line in that CSV (2 for
// the first entry of the first device, counting on across devices). Each
// alloc gets the next alloc_id of its device, and each free the alloc_id
// of the live allocation at its address — -1 when there is none (an
// allocation made before recording) — the allocation ending at its
// free_completed. Segment, oom, snapshot and user_defined entries carry
// alloc_id -1.
//
// The pickle is decoded by a restricted unpickler (replay/internal/pickle) that
// builds plain data only and refuses anything that would construct an
// object or call code, and builds at most pickle.BuiltPerByte bytes a byte
// of input. The events are bounded by the input too: a snapshot of n bytes
// holds at most n/MinEntryBytes+1 trace entries, since a memo reference
// (two bytes) could otherwise repeat one entry into a hundred bytes of
// Event. Ints are read as PyTorch writes them: addr, size and device_free
// up to 2^64-1, time_us up to 2^63-1, and stream as a 64-bit identifier
// (one from 2^63 up keeps its bits in Event.Stream, negative there).
// A problem is an error marked with ErrMalformed, naming the entry
// (device_traces[device][index]).
func ParseSnapshot(r io.Reader) ([]Event, error) {
	if isnil.Is(r) {
		return nil, errors.Wrap(driver.ErrInvalid, "replay: parse: the reader is nil")
	}
	data, err := pickle.ReadInput(r, pickle.DefaultMaxInput)
	if err != nil {
		return nil, sentinel.Mark(errors.Wrap(err, "replay: reading the snapshot"), ErrMalformed)
	}
	v, err := pickle.Decode(data)
	if err != nil {
		return nil, sentinel.Mark(errors.Wrap(err, "replay: reading the snapshot"), ErrMalformed)
	}
	snap, ok := v.(*pickle.Dict)
	if !ok {
		return nil, snapshotError("the pickle holds a %s, want a snapshot's dict", pickle.TypeName(v))
	}
	dt, ok := snap.Get("device_traces")
	if !ok {
		return nil, snapshotError("the pickle has no device_traces (its keys: %s): not a memory snapshot with a trace, or one taken without _record_memory_history", keys(snap))
	}
	devices, ok := dt.(*pickle.List)
	if !ok {
		return nil, snapshotError("device_traces is a %s, want a list of one list per device", pickle.TypeName(dt))
	}
	total := 0
	for dev, t := range devices.Items {
		entries, ok := t.(*pickle.List)
		if !ok {
			return nil, snapshotError("device_traces[%d] is a %s, want a list of trace entries", dev, pickle.TypeName(t))
		}
		total += len(entries.Items)
	}
	if total > maxTraceEvents {
		return nil, snapshotError("%d trace entries, more than %d (MaxTraceEvents)", total, maxTraceEvents)
	}
	if most := len(data)/MinEntryBytes + 1; total > most {
		return nil, snapshotError("%d trace entries in %d bytes, more than the %d a pickle of that size holds (a trace entry takes at least %d bytes): memo references repeating entries",
			total, len(data), most, MinEntryBytes)
	}
	events := make([]Event, 0, total)
	for dev, t := range devices.Items {
		entries := t.(*pickle.List)
		next := int64(0)           // the device's next alloc_id
		live := map[uint64]int64{} // the alloc_id of the live allocation at each address
		for i, e := range entries.Items {
			seq := uint64(i)
			ev, err := snapshotEvent(e, dev, seq, len(events))
			if err != nil {
				return nil, sentinel.Mark(errors.Wrapf(err, "replay: device_traces[%d][%d] (seq %d)", dev, i, seq), ErrMalformed)
			}
			switch {
			case ev.Op == OpAlloc:
				ev.AllocID = next
				next++
				live[ev.Addr] = ev.AllocID
			case ev.Op.IsFree():
				id, ok := live[ev.Addr]
				if !ok {
					id = -1
				}
				ev.AllocID = id
				if ev.Op == OpFreeCompleted {
					delete(live, ev.Addr)
				}
			}
			events = append(events, ev)
		}
	}
	return events, nil
}

// MinEntryBytes is the fewest bytes of pickle a trace entry takes: a
// dict of its action and size (a snapshot entry needs no more), each key
// and value an opcode of two bytes at the least, and the dict's own two
// (MARK and DICT).
const MinEntryBytes = 10

// snapshotEvent is the event of one trace entry, the index-th of the
// whole snapshot, its AllocID -1.
func snapshotEvent(e any, dev int, seq uint64, index int) (Event, error) {
	ev := Event{Line: index + 2, Seq: seq, Device: dev, AllocID: -1}
	d, ok := e.(*pickle.Dict)
	if !ok {
		return ev, errors.Newf("a %s, want a trace entry's dict", pickle.TypeName(e))
	}
	a, ok := d.Get("action")
	action, isStr := a.(string)
	if !ok || !isStr {
		return ev, errors.Newf("action is %s, want a string", describe(a, ok))
	}
	if ev.Op, ok = parseOp(action); !ok {
		return ev, errors.Newf("unknown action %q, want one of %s", action, strings.Join(opNames[1:], ", "))
	}
	// number reads an int field from 0 to 2^64-1; a missing one is not
	// there.
	number := func(key string) (uint64, bool, error) {
		v, ok := d.Get(key)
		if !ok || v == nil {
			return 0, false, nil
		}
		switch n := v.(type) {
		case int64:
			if n >= 0 {
				return uint64(n), true, nil
			}
		case uint64:
			return n, true, nil
		}
		return 0, false, errors.Newf("%s is %s, want an integer from 0 to 2^64-1", key, describe(v, true))
	}
	var err error
	if ev.Size, ok, err = number("size"); err != nil {
		return ev, err
	} else if !ok {
		return ev, errors.New("no size")
	}
	if ev.Addr, ev.HasAddr, err = number("addr"); err != nil {
		return ev, err
	}
	if !ev.HasAddr && ev.Op != OpOOM && !ev.Op.IsMark() {
		return ev, errors.Newf("%s with no addr: every entry but oom, snapshot and user_defined has one", ev.Op)
	}
	if ev.DeviceFree, ev.HasDeviceFree, err = number("device_free"); err != nil {
		return ev, err
	}
	var t uint64
	if t, ev.HasTime, err = number("time_us"); err != nil {
		return ev, err
	}
	if t > math.MaxInt64 {
		return ev, errors.Newf("time_us is %d, more than 2^63-1 microseconds", t)
	}
	ev.TimeUS = int64(t)
	if s, ok := d.Get("stream"); ok && s != nil {
		switch n := s.(type) {
		case int64:
			ev.Stream = n
		case uint64:
			ev.Stream = int64(n) // an identifier: its 64 bits, kept
		default:
			return ev, errors.Newf("stream is %s, want an integer of 64 bits", describe(s, true))
		}
	}
	return ev, nil
}

func snapshotError(format string, args ...any) error {
	return sentinel.Mark(errors.Newf("replay: snapshot: "+format, args...), ErrMalformed)
}

// describe is a field's value for a message: missing, or its value when
// short, or its type.
func describe(v any, present bool) string {
	if !present {
		return "missing"
	}
	switch x := v.(type) {
	case string:
		if len(x) <= 40 {
			return fmt.Sprintf("%q", x)
		}
	case int64, uint64, bool, float64, nil:
		return fmt.Sprintf("%v (%s)", v, pickle.TypeName(v))
	}
	return "a " + pickle.TypeName(v)
}

// keys lists a dict's keys for a message, the first few.
func keys(d *pickle.Dict) string {
	var names []string
	for i, k := range d.Keys() {
		if i == 8 {
			names = append(names, "...")
			break
		}
		names = append(names, fmt.Sprint(k))
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}
