package replay

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// snapshotPickles are the PyTorch snapshots in testdata/alloc-traces/pickles
// (copies of ../shared/data/alloc-traces/pickles), each the source of the
// CSV of the same name beside them.
var snapshotPickles = []string{"silmont2000_mem_snapshot", "select_n_snapshot_v1f2f548", "wedsonlin_medium_512_training"}

// TestSnapshotEqualsCSV: each pickle reads into exactly the events of the
// CSV made from it — line, seq, alloc_id, every field — so a replay of
// either gives the same figures; the smallest is replayed both ways to
// show it.
func TestSnapshotEqualsCSV(t *testing.T) {
	for _, name := range snapshotPickles {
		t.Run(name, func(t *testing.T) {
			fromCSV := readTrace(t, name+".csv")
			fromPickle := readTrace(t, filepath.Join("pickles", name+".pickle"))
			require.Equal(t, len(fromCSV), len(fromPickle))
			for i := range fromCSV {
				if fromCSV[i] != fromPickle[i] {
					require.Equal(t, fromCSV[i], fromPickle[i], "event %d", i)
				}
			}
			if name != snapshotPickles[0] {
				return
			}
			a, err := Replay(fromCSV, Options{Record: true})
			require.NoError(t, err)
			b, err := Replay(fromPickle, Options{Record: true})
			require.NoError(t, err)
			require.Equal(t, a, b)
		})
	}
}

// pk builds a snapshot pickle by hand: a dict with device_traces, each
// device a list of entries, each entry a dict of the given string and int
// fields. Protocol 2, no memo, no frames.
func pk(devices ...[]map[string]any) []byte {
	var b bytes.Buffer
	b.Write([]byte{0x80, 2, '}', 0x8c, 13})
	b.WriteString("device_traces")
	b.WriteByte(']')
	for _, dev := range devices {
		b.WriteString("](")
		for _, e := range dev {
			b.WriteString("}(")
			for k, v := range e {
				b.Write([]byte{0x8c, byte(len(k))})
				b.WriteString(k)
				switch x := v.(type) {
				case string:
					b.Write([]byte{0x8c, byte(len(x))})
					b.WriteString(x)
				case int:
					b.Write([]byte{0x8a, 8})
					for i := range 8 {
						b.WriteByte(byte(uint64(x) >> (8 * i)))
					}
				case uint64: // as Python writes one of 2^63 and up: 9 bytes
					b.Write([]byte{0x8a, 9})
					for i := range 8 {
						b.WriteByte(byte(x >> (8 * i)))
					}
					b.WriteByte(0)
				case rawPickle:
					b.Write(x)
				case nil:
					b.WriteByte('N')
				}
			}
			b.WriteByte('u')
		}
		b.WriteString("ea") // APPENDS to the device's list, APPEND it to device_traces
	}
	b.WriteString("s.")
	return b.Bytes()
}

// rawPickle is a value pk writes as it is: opcodes that push one value.
type rawPickle []byte

func entry(action string, size, addr int) map[string]any {
	return map[string]any{"action": action, "size": size, "addr": addr, "stream": 0, "time_us": 100 + addr}
}

func TestParseSnapshot(t *testing.T) {
	t.Run("two devices, a free made before recording, oom and snapshot entries", func(t *testing.T) {
		events, err := Parse(bytes.NewReader(pk(
			[]map[string]any{
				entry("free_requested", 512, 4096), entry("free_completed", 512, 4096),
				entry("alloc", 512, 0), entry("snapshot", 0, 0),
				{"action": "oom", "size": 1 << 20, "device_free": 1024, "stream": 0},
				entry("free_completed", 512, 0), entry("alloc", 512, 0),
			},
			[]map[string]any{entry("segment_alloc", 2<<20, 0), entry("alloc", 512, 0),
				{"action": "oom", "size": 4 << 20, "device_free": 1024, "stream": 0}},
		)))
		require.NoError(t, err)
		require.Equal(t, []Event{
			{Line: 2, Seq: 0, Op: OpFreeRequested, Size: 512, Addr: 4096, HasAddr: true, AllocID: -1, TimeUS: 4196, HasTime: true},
			{Line: 3, Seq: 1, Op: OpFreeCompleted, Size: 512, Addr: 4096, HasAddr: true, AllocID: -1, TimeUS: 4196, HasTime: true},
			{Line: 4, Seq: 2, Op: OpAlloc, Size: 512, HasAddr: true, AllocID: 0, TimeUS: 100, HasTime: true},
			{Line: 5, Seq: 3, Op: OpSnapshot, HasAddr: true, AllocID: -1, TimeUS: 100, HasTime: true},
			{Line: 6, Seq: 4, Op: OpOOM, Size: 1 << 20, AllocID: -1, DeviceFree: 1024, HasDeviceFree: true},
			{Line: 7, Seq: 5, Op: OpFreeCompleted, Size: 512, HasAddr: true, AllocID: 0, TimeUS: 100, HasTime: true},
			{Line: 8, Seq: 6, Op: OpAlloc, Size: 512, HasAddr: true, AllocID: 1, TimeUS: 100, HasTime: true},
			// Seq counts from 0 on each device, as PyTorch numbers entries;
			// Line counts on, as in the CSV of both devices.
			{Line: 9, Seq: 0, Device: 1, Op: OpSegmentAlloc, Size: 2 << 20, HasAddr: true, AllocID: -1, TimeUS: 100, HasTime: true},
			{Line: 10, Seq: 1, Device: 1, Op: OpAlloc, Size: 512, HasAddr: true, AllocID: 0, TimeUS: 100, HasTime: true},
			{Line: 11, Seq: 2, Device: 1, Op: OpOOM, Size: 4 << 20, AllocID: -1, DeviceFree: 1024, HasDeviceFree: true},
		}, events)
		res, err := Replay(events, Options{CheckEvery: 1, Verify: true})
		require.NoError(t, err)
		require.Len(t, res.Devices, 2)
		require.Equal(t, 1, res.Devices[0].Summary.Count(OpSnapshot))
		require.Len(t, res.Devices[1].OOMs, 1)
		require.Equal(t, uint64(2), res.Devices[1].OOMs[0].Seq, "the oom on device 1 is its third entry")
		require.Equal(t, 11, res.Devices[1].OOMs[0].Line)
	})
	t.Run("ints PyTorch writes past 2^63: a frame's line of 2^64-1, addr, size, stream", func(t *testing.T) {
		// A frames list of one frame whose line is 2^64-1, as PyTorch
		// writes a frame it has no line for.
		var frames bytes.Buffer
		frames.WriteString("](}(")
		frames.Write([]byte{0x8c, 4})
		frames.WriteString("line")
		frames.Write([]byte{0x8a, 9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0})
		frames.Write([]byte{0x8c, 4})
		frames.WriteString("name")
		frames.Write([]byte{0x8c, 2})
		frames.WriteString("??")
		frames.WriteString("ue")
		top := uint64(1<<64 - 4096)
		events, err := Parse(bytes.NewReader(pk([]map[string]any{
			{"action": "alloc", "size": 512, "addr": top, "stream": uint64(1 << 63), "time_us": 7, "frames": rawPickle(frames.Bytes())},
			{"action": "free_completed", "size": 512, "addr": top, "stream": uint64(1 << 63), "time_us": 8, "frames": rawPickle(frames.Bytes())},
		})))
		require.NoError(t, err)
		require.Equal(t, []Event{
			{Line: 2, Seq: 0, Op: OpAlloc, Size: 512, Addr: top, HasAddr: true, AllocID: 0, Stream: math.MinInt64, TimeUS: 7, HasTime: true},
			{Line: 3, Seq: 1, Op: OpFreeCompleted, Size: 512, Addr: top, HasAddr: true, AllocID: 0, Stream: math.MinInt64, TimeUS: 8, HasTime: true},
		}, events)
	})
	for _, tc := range []struct {
		name string
		in   []byte
		msg  string
	}{
		{"not a pickle of a dict", []byte{0x80, 2, 'N', '.'}, "holds a None, want a snapshot's dict"},
		{"no device_traces", []byte{0x80, 2, '}', '.'}, "no device_traces (its keys: none)"},
		{"a truncated pickle", pk([]map[string]any{entry("alloc", 512, 0)})[:30], "reading the snapshot"},
		{"a code-running pickle", []byte("\x80\x02cos\nsystem\n."), "GLOBAL refused"},
		{"an unknown action", pk([]map[string]any{entry("teleport", 512, 0)}), `device_traces[0][0] (seq 0): unknown action "teleport"`},
		{"no action", pk([]map[string]any{{"size": 1, "addr": 1}}), "action is missing"},
		{"an action that is not a string", pk([]map[string]any{{"action": 3, "size": 1, "addr": 1}}), "action is 3 (int), want a string"},
		{"a negative size", pk([]map[string]any{entry("alloc", -1, 0)}), "size is -1 (int), want an integer from 0 to 2^64-1"},
		{"a size of 2^64", pk([]map[string]any{{"action": "alloc", "size": rawPickle{0x8a, 9, 0, 0, 0, 0, 0, 0, 0, 0, 1}, "addr": 0}}), "size is a int, want an integer from 0 to 2^64-1"},
		{"a time_us past 2^63-1", pk([]map[string]any{{"action": "alloc", "size": 1, "addr": 0, "time_us": uint64(1 << 63)}}), "time_us is 9223372036854775808, more than 2^63-1"},
		{"a stream of 2^64", pk([]map[string]any{{"action": "alloc", "size": 1, "addr": 0, "stream": rawPickle{0x8a, 9, 0, 0, 0, 0, 0, 0, 0, 0, 1}}}), "stream is a int, want an integer of 64 bits"},
		{"no size", pk([]map[string]any{{"action": "alloc", "addr": 1}}), "no size"},
		{"an alloc with no addr", pk([]map[string]any{{"action": "alloc", "size": 1}}), "alloc with no addr"},
		{"a stream that is not an int", pk([]map[string]any{{"action": "alloc", "size": 1, "addr": 0, "stream": "x"}}), `stream is "x", want an integer`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(bytes.NewReader(tc.in))
			require.Error(t, err)
			require.True(t, errors.Is(err, ErrMalformed), "%v", err)
			require.Contains(t, err.Error(), tc.msg)
		})
	}
	_, err := ParseSnapshot(nil)
	require.True(t, errors.Is(err, driver.ErrInvalid))
}

// TestSnapshotMemoEntries: a pickle whose trace repeats one entry by memo
// references (2 bytes each, where a real entry takes a hundred or more)
// is refused before any event is built: its events would outgrow it.
func TestSnapshotMemoEntries(t *testing.T) {
	memoTrace := func(refs int) []byte {
		var b bytes.Buffer
		b.Write([]byte{0x80, 2, '}', 0x8c, 13})
		b.WriteString("device_traces")
		b.WriteString("]](")    // device_traces, device 0's list, MARK
		b.WriteString("}\x94(") // the entry, memoized as 0, and its MARK
		str := func(s string) {
			b.Write([]byte{0x8c, byte(len(s))})
			b.WriteString(s)
		}
		str("action")
		str("alloc")
		str("size")
		b.Write([]byte{'K', 1})
		str("addr")
		b.Write([]byte{'K', 1})
		b.WriteByte('u')
		for range refs {
			b.Write([]byte{'h', 0}) // BINGET 0: the entry again
		}
		b.WriteString("ea") // APPENDS to device 0, APPEND it to device_traces
		b.WriteString("s.")
		return b.Bytes()
	}
	// A few repeats fit the bound (the pickle's own bytes pay for them);
	// each is its own event.
	events, err := Parse(bytes.NewReader(memoTrace(3)))
	require.NoError(t, err)
	require.Len(t, events, 4)

	in := memoTrace(100_000)
	_, err = Parse(bytes.NewReader(in))
	require.True(t, errors.Is(err, ErrMalformed), "%v", err)
	require.Contains(t, err.Error(), fmt.Sprintf("100001 trace entries in %d bytes, more than the %d a pickle of that size holds (a trace entry takes at least %d bytes)",
		len(in), len(in)/MinEntryBytes+1, MinEntryBytes))
}

// TestParseSnapshotPrefixes: every cut of a real snapshot is an error,
// never a panic.
func TestParseSnapshotPrefixes(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "testdata", "alloc-traces", "pickles", "silmont2000_mem_snapshot.pickle"))
	require.NoError(t, err)
	for _, n := range []int{1, 2, 50, len(data) / 3, len(data) - 1} {
		_, err := Parse(bytes.NewReader(data[:n]))
		require.True(t, errors.Is(err, ErrMalformed), "%d bytes: %v", n, err)
		require.True(t, strings.HasPrefix(err.Error(), "replay: "), "%v", err)
	}
}

// TestUserDefinedEntries: a newer PyTorch's user_defined trace entries
// (its annotations of the recording; they carry an address of 0, a size
// of 0 and a stream, and in the newest a user_metadata string) are read,
// in a snapshot and in the CSV, with or without an address, and change
// nothing.
func TestUserDefinedEntries(t *testing.T) {
	plain, err := Parse(bytes.NewReader(pk([]map[string]any{entry("alloc", 512, 0), entry("free_completed", 512, 0)})))
	require.NoError(t, err)
	marked, err := Parse(bytes.NewReader(pk([]map[string]any{
		entry("user_defined", 0, 0), entry("alloc", 512, 0),
		{"action": "user_defined", "size": 0, "stream": 0, "time_us": 7, "user_metadata": "step 1"},
		entry("free_completed", 512, 0),
	})))
	require.NoError(t, err)
	require.Equal(t, Event{Line: 2, Seq: 0, Op: OpUserDefined, HasAddr: true, AllocID: -1, TimeUS: 100, HasTime: true}, marked[0])
	require.Equal(t, Event{Line: 4, Seq: 2, Op: OpUserDefined, AllocID: -1, TimeUS: 7, HasTime: true}, marked[2])
	csv, err := Parse(strings.NewReader(header + "0,0,user_defined,0,,-1,0,5,\n1,0,alloc,512,0,0,0,,\n2,0,user_defined,0,0,-1,0,,\n3,0,free_completed,512,0,0,0,,\n"))
	require.NoError(t, err)
	require.Equal(t, Event{Line: 2, Seq: 0, Op: OpUserDefined, AllocID: -1, TimeUS: 5, HasTime: true}, csv[0])
	a, err := Replay(plain, Options{CheckEvery: 1, Verify: true})
	require.NoError(t, err)
	for _, events := range [][]Event{marked, csv} {
		b, err := Replay(events, Options{CheckEvery: 1, Verify: true})
		require.NoError(t, err)
		require.Equal(t, 2, b.Devices[0].Summary.Count(OpUserDefined))
		require.Equal(t, a.Devices[0].Figures, b.Devices[0].Figures)
		require.Equal(t, a.Devices[0].Summary.PeakAllocated, b.Devices[0].Summary.PeakAllocated)
	}
	_, err = Parse(bytes.NewReader(pk([]map[string]any{{"action": "alloc", "size": 512, "stream": 0}})))
	require.ErrorIs(t, err, ErrMalformed)
	require.ErrorContains(t, err, "alloc with no addr: every entry but oom, snapshot and user_defined has one")
}

// TestSnapshotRows: a snapshot row (PyTorch dumped a snapshot while
// recording) is read, with or without an address, and changes nothing.
func TestSnapshotRows(t *testing.T) {
	without, err := Parse(strings.NewReader(header + "0,0,alloc,512,0,0,0,,\n1,0,free_completed,512,0,0,0,,\n"))
	require.NoError(t, err)
	with, err := Parse(strings.NewReader(header + "0,0,alloc,512,0,0,0,,\n1,0,snapshot,0,,-1,0,5,\n2,0,snapshot,0,0,-1,0,,\n3,0,free_completed,512,0,0,0,,\n"))
	require.NoError(t, err)
	require.Equal(t, Event{Line: 3, Seq: 1, Op: OpSnapshot, AllocID: -1, TimeUS: 5, HasTime: true}, with[1])
	a, err := Replay(without, Options{CheckEvery: 1, Verify: true})
	require.NoError(t, err)
	b, err := Replay(with, Options{CheckEvery: 1, Verify: true})
	require.NoError(t, err)
	require.Equal(t, 2, b.Devices[0].Summary.Count(OpSnapshot))
	require.Equal(t, a.Devices[0].Figures, b.Devices[0].Figures)
	require.Equal(t, a.Devices[0].Summary.PeakAllocated, b.Devices[0].Summary.PeakAllocated)
}
