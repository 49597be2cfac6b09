// Package replay reads GPU allocator event traces (PyTorch memory snapshots,
// exported as CSV or as the pickles PyTorch writes), sums up what the
// trace's own allocator did, and replays the trace through vmarena's
// allocator on the sim driver.
//
// It owns the trace format and the replay, nothing else: it never touches
// memory (the sim driver has none), and a malformed trace is an error naming
// its line, never a panic. Every reader bounds what it reads and what it
// builds from it (input.go: line lengths, totals, a config's size) and
// opens regular files only. Each device a trace names is replayed on a sim
// device of its own, by an allocator of its own, and summed up on its own.
// allocator.go is the one file that knows vmarena's allocator (package
// arena); the rest sees its figures as Figures.
//
// The format, one event a line after a header:
//
//	seq,device,op,size,addr,alloc_id,stream,time_us,device_free
//
// op is one of
//
//   - alloc, free_requested, free_completed: the allocator's own events;
//     alloc_id pairs an alloc with its frees, on its device (two devices may
//     use the same ids);
//   - segment_alloc / segment_free: the caching allocator reserving or
//     returning a cudaMalloc segment;
//   - segment_map / segment_unmap: the same with expandable segments, which
//     map and unmap physical memory inside one reserved range; a trace may
//     mix both kinds;
//   - oom: the caching allocator failed to serve a request of size bytes;
//     its addr is empty and device_free says what the device had left;
//   - snapshot: PyTorch dumped a snapshot while recording; a no-op.
//
// Segment events carry alloc_id -1. time_us (at least 0) and device_free
// may be empty; addr may be empty on oom and snapshot rows only.
//
// It also reads the pickles torch.cuda.memory._dump_snapshot writes
// (snapshot.go): Parse and ParseFile tell them from CSV by their first
// byte, and turn each device's trace entries into the events the CSV made
// from the same snapshot holds.
//
// Driver calls are a budget (drivercalls.go): on the sim driver a replay
// reads each device's driver calls from the driver (sim.Driver.Tally) and
// prices them with its table of per-call costs (sim.A100 by default), and
// prices PyTorch's the same way, from the trace's segment events as an
// expandable segment makes them (SegmentCalls). A trace that starts
// mid-run does not show the segments made before recording, so PyTorch's
// calls are undercounted there and the comparison is not made.
package replay

import (
	"bufio"
	"encoding/csv"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/isnil"
	"github.com/vmarena/vmarena/internal/sentinel"
	"github.com/vmarena/vmarena/replay/input"
	"github.com/vmarena/vmarena/replay/internal/pickle"
)

// ErrMalformed marks every error about the content of a trace (allocator
// and request traces alike).
var ErrMalformed = input.ErrMalformed

// Op is what an event did.
type Op uint8

const (
	// OpAlloc is an allocation handed to the program.
	OpAlloc Op = iota + 1
	// OpFreeRequested is the program freeing an allocation; it stays live
	// until OpFreeCompleted (the stream may still be using it).
	OpFreeRequested
	// OpFreeCompleted is the allocation's memory returning to the allocator.
	OpFreeCompleted
	// OpSegmentAlloc is the caching allocator reserving a segment from the
	// device (cudaMalloc).
	OpSegmentAlloc
	// OpSegmentFree is the caching allocator returning a segment.
	OpSegmentFree
	// OpSegmentMap is the caching allocator mapping memory into an
	// expandable segment: PyTorch's segment event when segments are
	// expandable, counted and summed as OpSegmentAlloc.
	OpSegmentMap
	// OpSegmentUnmap is the caching allocator unmapping memory from an
	// expandable segment, counted and summed as OpSegmentFree.
	OpSegmentUnmap
	// OpOOM is the caching allocator failing a request of Size bytes, with
	// DeviceFree left on the device; the program never got the memory.
	OpOOM
	// OpSnapshot marks where PyTorch dumped a snapshot while recording;
	// it changes nothing.
	OpSnapshot
	// OpUserDefined is a mark the program put in the trace (PyTorch's
	// user_defined entries, its annotations of the recording, in newer
	// snapshots); it changes nothing.
	OpUserDefined

	numOps = int(OpUserDefined) + 1
)

var opNames = [numOps]string{"", "alloc", "free_requested", "free_completed",
	"segment_alloc", "segment_free", "segment_map", "segment_unmap", "oom", "snapshot", "user_defined"}

// Ops lists every op in the order they are defined.
var Ops = []Op{OpAlloc, OpFreeRequested, OpFreeCompleted, OpSegmentAlloc, OpSegmentFree, OpSegmentMap, OpSegmentUnmap, OpOOM, OpSnapshot, OpUserDefined}

// IsMark says whether the op is a mark in the trace that changes nothing
// (a snapshot's, or the program's own), which needs no address.
func (o Op) IsMark() bool { return o == OpSnapshot || o == OpUserDefined }

func (o Op) String() string {
	if int(o) < numOps && o != 0 {
		return opNames[o]
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// IsSegment says whether the op is one of the caching allocator's own
// segment events: a segment reserved or returned, or memory mapped into or
// unmapped from an expandable segment.
func (o Op) IsSegment() bool {
	return o == OpSegmentAlloc || o == OpSegmentFree || o == OpSegmentMap || o == OpSegmentUnmap
}

// IsFree says whether the op is one of the program's frees.
func (o Op) IsFree() bool { return o == OpFreeRequested || o == OpFreeCompleted }

// reserves is what the op adds to the caching allocator's reserved memory,
// in units of the event's size: +1, -1 or 0.
func (o Op) reserves() int {
	switch o {
	case OpSegmentAlloc, OpSegmentMap:
		return 1
	case OpSegmentFree, OpSegmentUnmap:
		return -1
	}
	return 0
}

func parseOp(s string) (Op, bool) {
	for i := 1; i < numOps; i++ {
		if opNames[i] == s {
			return Op(i), true
		}
	}
	return 0, false
}

// Event is one line of a trace.
type Event struct {
	// Line is the event's line in the file (the header is line 1).
	Line int
	// Seq is the trace's own number for the event: a PyTorch snapshot
	// numbers each device's entries from 0.
	Seq uint64
	// Device is the device index the event happened on.
	Device int
	Op     Op
	// Size is in bytes, as the trace's allocator recorded it.
	Size uint64
	// Addr is the address the trace's allocator used (of no meaning to a
	// replay, which places allocations itself), when HasAddr: always but on
	// oom and snapshot rows, where it may be empty.
	Addr    uint64
	HasAddr bool
	// AllocID pairs an alloc with its frees on the event's device; -1 on
	// segment events.
	AllocID int64
	Stream  int64
	// TimeUS is the event's time in microseconds (0 to 2^63-1), when
	// HasTime.
	TimeUS  int64
	HasTime bool
	// DeviceFree is the device's free memory after the event, when
	// HasDeviceFree.
	DeviceFree    uint64
	HasDeviceFree bool
	// Modelled marks an event of WithModelledSegments' model of PyTorch's
	// caching allocator (a segment or oom event), not of a trace. A
	// modelled oom is not probed: the workload's own alloc of the request
	// follows it and says whether vmarena serves it.
	Modelled bool
}

// Columns are the trace's columns, in the order the header names them.
var Columns = []string{"seq", "device", "op", "size", "addr", "alloc_id", "stream", "time_us", "device_free"}

const numColumns = 9 // len(Columns)

// Parse reads a whole trace. The header must name exactly the nine columns
// (in any order). Every line must have as many fields as the header,
// numbers where numbers belong (addr may be empty on an oom, snapshot or
// user_defined row), and a known op; an alloc must carry an alloc_id of at
// least 0 that is not already live on its device (allocated and not yet
// free_completed). The first problem found is returned, marked with
// ErrMalformed and naming its line.
//
// Input that starts with a pickle's PROTO opcode (byte 0x80, which no CSV
// text starts with) is read as a PyTorch snapshot instead (ParseSnapshot).
//
// What it reads is bounded: lines of at most MaxTraceLineBytes, at most
// MaxTraceBytes in all and MaxTraceEvents events; past a bound is an error
// marked ErrMalformed.
func Parse(r io.Reader) ([]Event, error) {
	if isnil.Is(r) {
		return nil, errors.Wrap(driver.ErrInvalid, "replay: parse: the reader is nil")
	}
	br := bufio.NewReader(r)
	if b, err := br.Peek(1); err == nil && b[0] == pickleProto {
		return ParseSnapshot(br)
	}
	cr := csv.NewReader(in.Reader(br, MaxTraceBytes, MaxTraceLineBytes))
	cr.FieldsPerRecord = -1 // counted here, for a message that says what is wrong
	cr.ReuseRecord = true
	header, err := cr.Read()
	if err == io.EOF {
		return nil, sentinel.Mark(errors.New("replay: empty input: want a header line naming the columns "+strings.Join(Columns, ",")), ErrMalformed)
	}
	if err != nil {
		return nil, csvError(err)
	}
	col, err := parseHeader(header, lineOf(cr))
	if err != nil {
		return nil, err
	}

	var events []Event
	live := map[allocKey]int{} // line of the alloc, while live
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			return events, nil
		}
		if err != nil {
			return nil, csvError(err)
		}
		line := lineOf(cr)
		if len(events) == maxTraceEvents {
			return nil, malformed(line, "more than %d events (MaxTraceEvents)", maxTraceEvents)
		}
		if len(rec) != numColumns {
			return nil, malformed(line, "%d fields, want %d (%s)", len(rec), len(Columns), strings.Join(Columns, ","))
		}
		ev, err := parseEvent(rec, col, line)
		if err != nil {
			return nil, err
		}
		switch ev.Op {
		case OpAlloc:
			if ev.AllocID < 0 {
				return nil, malformed(line, "alloc with alloc_id %d: an alloc needs an id of at least 0 for its frees to name", ev.AllocID)
			}
			k := allocKey{ev.Device, ev.AllocID}
			if at, ok := live[k]; ok {
				return nil, malformed(line, "alloc_id %d is allocated again on device %d while live since line %d", ev.AllocID, ev.Device, at)
			}
			live[k] = line
		case OpFreeCompleted:
			delete(live, allocKey{ev.Device, ev.AllocID})
		}
		events = append(events, ev)
	}
}

// allocKey names an allocation: ids are per device.
type allocKey struct {
	device int
	id     int64
}

// ParseFile reads the trace in the named file (Parse), which must be a
// regular file: another (a directory, a device, a FIFO) is an error
// marked driver.ErrInvalid.
func ParseFile(name string) ([]Event, error) {
	f, err := in.Open(name, "trace")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := checkTraceSize(f, name); err != nil {
		return nil, err
	}
	return Parse(f)
}

// checkTraceSize refuses, before anything is read past its first byte, a
// trace file larger than its kind may be: a snapshot over the pickle
// decoder's input limit, a CSV over MaxTraceBytes. Parse would read that
// much before it saw the bound passed (a gigabyte held for a snapshot).
func checkTraceSize(f *os.File, name string) error {
	st, err := f.Stat()
	if err != nil {
		return sentinel.Mark(errors.Wrap(err, "replay: trace"), driver.ErrInvalid)
	}
	var first [1]byte
	n, err := f.ReadAt(first[:], 0)
	if n == 0 && err != nil && err != io.EOF {
		return sentinel.Mark(errors.Wrap(err, "replay: trace"), driver.ErrInvalid)
	}
	most, kind := int64(MaxTraceBytes), "a CSV trace (MaxTraceBytes)"
	if n == 1 && first[0] == pickleProto {
		most, kind = pickle.DefaultMaxInput, "a snapshot pickle (the decoder's input limit)"
	}
	if st.Size() > most {
		return sentinel.Mark(errors.Newf("replay: trace %s is %d bytes, more than the %d %s may have", name, st.Size(), most, kind), ErrMalformed)
	}
	return nil
}

// parseHeader returns the index of each of Columns in the header.
func parseHeader(header []string, line int) ([numColumns]int, error) {
	var col [numColumns]int
	for i := range col {
		col[i] = -1
	}
	for i, name := range header {
		name = strings.TrimSpace(name)
		if i == 0 {
			name = strings.TrimPrefix(name, "\ufeff") // a byte-order mark some tools write
		}
		k := -1
		for j, c := range Columns {
			if c == name {
				k = j
			}
		}
		switch {
		case k < 0:
			return col, malformed(line, "header names column %q, want the columns %s", name, strings.Join(Columns, ","))
		case col[k] >= 0:
			return col, malformed(line, "header names column %q twice", name)
		}
		col[k] = i
	}
	for j, i := range col {
		if i < 0 {
			return col, malformed(line, "header lacks column %q (a trace starts with the header %s)", Columns[j], strings.Join(Columns, ","))
		}
	}
	return col, nil
}

func parseEvent(rec []string, col [numColumns]int, line int) (Event, error) {
	ev := Event{Line: line}
	field := func(k int) string { return strings.TrimSpace(rec[col[k]]) }
	var err error
	num := func(k int, bits int) uint64 {
		if err != nil {
			return 0
		}
		s := field(k)
		v, perr := strconv.ParseUint(s, 10, bits)
		if perr != nil {
			err = malformed(line, "column %s: %q is not an integer of at least 0%s", Columns[k], s, rangeNote(perr))
		}
		return v
	}
	signed := func(k int) int64 {
		if err != nil {
			return 0
		}
		s := field(k)
		v, perr := strconv.ParseInt(s, 10, 64)
		if perr != nil {
			err = malformed(line, "column %s: %q is not an integer%s", Columns[k], s, rangeNote(perr))
		}
		return v
	}
	ev.Seq = num(0, 64)
	ev.Device = int(num(1, 31))
	op := field(2)
	ev.Size = num(3, 64)
	// PyTorch records no address for a request it failed, nor for a
	// mark.
	if field(4) != "" || (op != opNames[OpOOM] && op != opNames[OpSnapshot] && op != opNames[OpUserDefined]) {
		ev.Addr, ev.HasAddr = num(4, 64), true
	}
	ev.AllocID = signed(5)
	ev.Stream = signed(6)
	if field(7) != "" {
		// From 0, as the pickles' times: so that the difference of
		// two never overflows.
		ev.TimeUS, ev.HasTime = int64(num(7, 63)), true
	}
	if field(8) != "" {
		ev.DeviceFree, ev.HasDeviceFree = num(8, 64), true
	}
	if err != nil {
		return ev, err
	}
	var ok bool
	if ev.Op, ok = parseOp(op); !ok {
		return ev, malformed(line, "unknown op %q, want one of %s", op, strings.Join(opNames[1:], ", "))
	}
	return ev, nil
}

func rangeNote(err error) string { return input.RangeNote(err) }

// csvError turns the csv reader's error (a bare quote, say) into ours; the
// csv package's message already names the line.
func csvError(err error) error {
	if errors.Is(err, ErrMalformed) { // a bound of boundedReader
		return err
	}
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		return malformed(pe.StartLine, "%v", pe.Err)
	}
	return errors.Wrap(err, "replay: read")
}

// lineOf is the line the reader's last record started on.
func lineOf(cr *csv.Reader) int {
	line, _ := cr.FieldPos(0)
	return line
}
