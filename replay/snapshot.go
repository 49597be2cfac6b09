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
	"strings"

	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/isnil"
	"github.com/vmarena/vmarena/internal/pickle"
	"github.com/vmarena/vmarena/internal/sentinel"
)

// pickleProto is the first byte of every pickle of protocol 2 or later.
const pickleProto = 0x80

// ParseSnapshot reads a PyTorch memory snapshot (a pickle) into the
// events the CSV made from it holds, one event per trace entry: devices
// in order, each device's entries in order, Seq counting from 0 across
// them all and Line being Seq+2, the entry's line in that CSV. Each alloc
// gets the next alloc_id of its device, and each free the alloc_id of the
// live allocation at its address — -1 when there is none (an allocation
// made before recording) — the allocation ending at its free_completed.
// Segment, oom and snapshot entries carry alloc_id -1.
//
// The pickle is decoded by a restricted unpickler (internal/pickle) that
// builds plain data only and refuses anything that would construct an
// object or call code. A problem is an error marked with ErrMalformed,
// naming the entry (device_traces[device][index]).
func ParseSnapshot(r io.Reader) ([]Event, error) {
	if isnil.Is(r) {
		return nil, errors.Wrap(driver.ErrInvalid, "replay: parse: the reader is nil")
	}
	v, err := pickle.Read(r)
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
	var events []Event
	for dev, t := range devices.Items {
		entries, ok := t.(*pickle.List)
		if !ok {
			return nil, snapshotError("device_traces[%d] is a %s, want a list of trace entries", dev, pickle.TypeName(t))
		}
		next := int64(0)           // the device's next alloc_id
		live := map[uint64]int64{} // the alloc_id of the live allocation at each address
		for i, e := range entries.Items {
			seq := uint64(len(events))
			ev, err := snapshotEvent(e, dev, seq)
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

// snapshotEvent is the event of one trace entry, its AllocID -1.
func snapshotEvent(e any, dev int, seq uint64) (Event, error) {
	ev := Event{Line: int(min(seq, 1<<40)) + 2, Seq: seq, Device: dev, AllocID: -1}
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
	// number reads an int field of at least 0; a missing one is not there.
	number := func(key string) (uint64, bool, error) {
		v, ok := d.Get(key)
		if !ok || v == nil {
			return 0, false, nil
		}
		n, isInt := v.(int64)
		if !isInt || n < 0 {
			return 0, false, errors.Newf("%s is %s, want an integer of at least 0", key, describe(v, true))
		}
		return uint64(n), true, nil
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
	if !ev.HasAddr && ev.Op != OpOOM && ev.Op != OpSnapshot {
		return ev, errors.Newf("%s with no addr: every entry but oom and snapshot has one", ev.Op)
	}
	if ev.DeviceFree, ev.HasDeviceFree, err = number("device_free"); err != nil {
		return ev, err
	}
	var t uint64
	if t, ev.HasTime, err = number("time_us"); err != nil {
		return ev, err
	}
	ev.TimeUS = int64(t) // number took an int64 of at least 0
	if s, ok := d.Get("stream"); ok && s != nil {
		n, isInt := s.(int64)
		if !isInt {
			return ev, errors.Newf("stream is %s, want an integer", describe(s, true))
		}
		ev.Stream = n
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
	case int64, bool, float64, nil:
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
