package replay

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
)

const header = "seq,device,op,size,addr,alloc_id,stream,time_us,device_free\n"

func TestParse(t *testing.T) {
	events, err := Parse(strings.NewReader(header +
		"0,0,segment_alloc,20971520,139833534054400,-1,0,1748730219596671,\n" +
		"1,0,alloc,5242880,139833534054400,0,0,1748730219596673,\n" +
		"2,0,free_requested,5242880,139833534054400,0,7,,\n" +
		"3,0,free_completed,5242880,139833534054400,0,7,,123456\n" +
		"4,0,segment_free,20971520,139833534054400,-1,0,, \n" +
		"5,1,segment_map,2097152,4096,-1,0,,\n" +
		"6,1,oom,6291456,,-1,0,12,2097152\n" +
		"7,1,oom,512,8192,-1,0,,\n" +
		"8,1,segment_unmap,2097152,4096,-1,0,,\n"))
	require.NoError(t, err)
	const a = 139833534054400
	require.Equal(t, []Event{
		{Line: 2, Seq: 0, Op: OpSegmentAlloc, Size: 20 << 20, Addr: a, HasAddr: true, AllocID: -1, TimeUS: 1748730219596671, HasTime: true},
		{Line: 3, Seq: 1, Op: OpAlloc, Size: 5 << 20, Addr: a, HasAddr: true, AllocID: 0, TimeUS: 1748730219596673, HasTime: true},
		{Line: 4, Seq: 2, Op: OpFreeRequested, Size: 5 << 20, Addr: a, HasAddr: true, AllocID: 0, Stream: 7},
		{Line: 5, Seq: 3, Op: OpFreeCompleted, Size: 5 << 20, Addr: a, HasAddr: true, AllocID: 0, Stream: 7, DeviceFree: 123456, HasDeviceFree: true},
		{Line: 6, Seq: 4, Op: OpSegmentFree, Size: 20 << 20, Addr: a, HasAddr: true, AllocID: -1},
		{Line: 7, Seq: 5, Device: 1, Op: OpSegmentMap, Size: 2 << 20, Addr: 4096, HasAddr: true, AllocID: -1},
		{Line: 8, Seq: 6, Device: 1, Op: OpOOM, Size: 6 << 20, AllocID: -1, TimeUS: 12, HasTime: true, DeviceFree: 2 << 20, HasDeviceFree: true},
		{Line: 9, Seq: 7, Device: 1, Op: OpOOM, Size: 512, Addr: 8192, HasAddr: true, AllocID: -1},
		{Line: 10, Seq: 8, Device: 1, Op: OpSegmentUnmap, Size: 2 << 20, Addr: 4096, HasAddr: true, AllocID: -1},
	}, events)

	t.Run("header only", func(t *testing.T) {
		events, err := Parse(strings.NewReader(header))
		require.NoError(t, err)
		require.Empty(t, events)
	})
	t.Run("columns in another order, CRLF, byte-order mark", func(t *testing.T) {
		events, err := Parse(strings.NewReader("\ufeffop,seq,device,size,addr,alloc_id,stream,time_us,device_free\r\n" +
			"alloc,9,1,512,4096,3,0,,\r\n"))
		require.NoError(t, err)
		require.Equal(t, []Event{{Line: 2, Seq: 9, Device: 1, Op: OpAlloc, Size: 512, Addr: 4096, HasAddr: true, AllocID: 3}}, events)
	})
	t.Run("an alloc_id may be reused once freed", func(t *testing.T) {
		events, err := Parse(strings.NewReader(header +
			"0,0,alloc,512,0,1,0,,\n" +
			"1,0,free_completed,512,0,1,0,,\n" +
			"2,0,alloc,512,0,1,0,,\n"))
		require.NoError(t, err)
		require.Len(t, events, 3)
	})
	t.Run("alloc_ids are per device", func(t *testing.T) {
		events, err := Parse(strings.NewReader(header +
			"0,0,alloc,512,0,1,0,,\n" +
			"1,1,alloc,512,0,1,0,,\n"))
		require.NoError(t, err)
		require.Len(t, events, 2)
	})
}

// TestParseMalformed: every malformed trace is an error marked
// ErrMalformed that names the line and what is wrong with it.
func TestParseMalformed(t *testing.T) {
	good := "0,0,alloc,512,4096,0,0,,\n"
	for _, tc := range []struct {
		name, input string
		line        int
		says        string
	}{
		{"empty input", "", 0, "empty input: want a header line"},
		{"no header", good, 1, `header names column "0"`},
		{"header lacks a column", "seq,device,op,size,addr,alloc_id,stream,time_us\n", 1, `header lacks column "device_free"`},
		{"header names a column twice", "seq,device,op,size,addr,alloc_id,stream,time_us,seq\n", 1, `header names column "seq" twice`},
		{"too few fields", header + good + "1,0,alloc,512,4096,1,0,\n", 3, "8 fields, want 9"},
		{"too many fields", header + good + good[:len(good)-1] + ",extra\n", 3, "10 fields, want 9"},
		{"bad seq", header + "x,0,alloc,512,4096,0,0,,\n", 2, `column seq: "x" is not an integer`},
		{"negative device", header + "0,-1,alloc,512,4096,0,0,,\n", 2, `column device: "-1" is not an integer of at least 0`},
		{"negative size", header + "0,0,alloc,-512,4096,0,0,,\n", 2, `column size: "-512" is not an integer of at least 0`},
		{"fractional size", header + "0,0,alloc,1.5,4096,0,0,,\n", 2, `column size: "1.5"`},
		{"size out of range", header + "0,0,alloc,18446744073709551616,4096,0,0,,\n", 2, "out of range"},
		{"bad addr", header + "0,0,alloc,512,0xff,0,0,,\n", 2, `column addr: "0xff"`},
		{"empty addr on an alloc", header + "0,0,alloc,512,,0,0,,\n", 2, `column addr: "" is not an integer`},
		{"empty addr on a free", header + good + "1,0,free_completed,512,,0,0,,\n", 3, `column addr: ""`},
		{"empty addr on a segment event", header + "0,0,segment_map,2097152,,-1,0,,\n", 2, `column addr: ""`},
		{"bad addr on an oom", header + "0,0,oom,512,x,-1,0,,\n", 2, `column addr: "x"`},
		{"empty size on an oom", header + "0,0,oom,,,-1,0,,\n", 2, `column size: ""`},
		{"bad alloc_id", header + "0,0,alloc,512,4096,id,0,,\n", 2, `column alloc_id: "id" is not an integer`},
		{"bad stream", header + "0,0,alloc,512,4096,0,s,,\n", 2, `column stream: "s"`},
		{"bad time", header + "0,0,alloc,512,4096,0,0,soon,\n", 2, `column time_us: "soon"`},
		{"negative time", header + "0,0,alloc,512,4096,0,0,-1,\n", 2, `column time_us: "-1" is not an integer of at least 0`},
		{"bad device_free", header + "0,0,alloc,512,4096,0,0,,-5\n", 2, `column device_free: "-5"`},
		{"unknown op", header + good + "1,0,realloc,512,4096,1,0,,\n", 3, `unknown op "realloc"`},
		{"empty op", header + "0,0,,512,4096,0,0,,\n", 2, `unknown op ""`},
		{"alloc without an id", header + "0,0,alloc,512,4096,-1,0,,\n", 2, "alloc with alloc_id -1"},
		{"alloc of a live id", header + good + "1,0,free_requested,512,4096,0,0,,\n" + good, 4, "alloc_id 0 is allocated again on device 0 while live since line 2"},
		{"alloc of a live id on another device", header + "0,3,alloc,512,0,7,0,,\n1,0,alloc,512,0,7,0,,\n2,3,alloc,512,0,7,0,,\n", 4,
			"alloc_id 7 is allocated again on device 3 while live since line 2"},
		{"bare quote", header + good + "1,0,al\"loc,512,4096,1,0,,\n", 3, "bare \""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			events, err := Parse(strings.NewReader(tc.input))
			require.Error(t, err)
			require.Nil(t, events)
			require.True(t, errors.Is(err, ErrMalformed), "%v", err)
			if tc.line > 0 {
				require.Contains(t, err.Error(), fmt.Sprintf("replay: line %d: ", tc.line))
			}
			require.Contains(t, err.Error(), tc.says)
		})
	}
}

// FuzzParse: no input makes Parse panic, and what it accepts it accepts
// whole: every event has a known op and its own line.
func FuzzParse(f *testing.F) {
	f.Add(header + "0,0,alloc,512,4096,0,0,,\n1,0,free_completed,512,4096,0,0,1,2\n")
	f.Add(header + "0,0,segment_alloc,2097152,0,-1,0,,\n")
	f.Add(header + "0,1,segment_map,2097152,0,-1,0,,\n1,1,oom,4194304,,-1,0,,2097152\n2,0,segment_unmap,2097152,0,-1,0,,\n")
	f.Add("seq,op\n1,2\n")
	f.Add("\"")
	f.Add(header + "0,0,snapshot,0,,-1,0,,\n")
	// Snapshot pickles (ParseSnapshot), made by hand: see pk.
	f.Add(string(pk([]map[string]any{entry("alloc", 512, 0), entry("free_requested", 512, 0), entry("free_completed", 512, 0)},
		[]map[string]any{{"action": "oom", "size": 1 << 20, "device_free": 0, "stream": 0}})))
	f.Add(string(pk([]map[string]any{entry("free_completed", 512, 64), entry("snapshot", 0, 0)})))
	f.Add(string(pk([]map[string]any{{"action": "alloc", "size": uint64(1 << 63), "addr": uint64(1<<64 - 1), "stream": uint64(1 << 63)}},
		[]map[string]any{entry("alloc", 512, 0)})))
	f.Fuzz(func(t *testing.T, s string) {
		events, err := Parse(strings.NewReader(s))
		if err != nil {
			require.Nil(t, events)
			return
		}
		last := 1
		next := map[int]uint64{} // a snapshot's next seq on each device
		for _, ev := range events {
			if len(s) > 0 && s[0] == pickleProto {
				require.Equal(t, next[ev.Device], ev.Seq, "a snapshot numbers each device's entries from 0")
				next[ev.Device]++
			}
			require.Contains(t, Ops, ev.Op)
			require.Greater(t, ev.Line, last)
			require.True(t, ev.HasAddr || ev.Op == OpOOM || ev.Op.IsMark(), "only an oom or a mark may lack an address")
			last = ev.Line
		}
	})
}

func TestOp(t *testing.T) {
	for _, op := range Ops {
		got, ok := parseOp(op.String())
		require.True(t, ok)
		require.Equal(t, op, got)
	}
	require.Equal(t, "Op(11)", Op(11).String())
	require.Equal(t, "snapshot", OpSnapshot.String())
	require.Equal(t, "user_defined", OpUserDefined.String())
	require.Equal(t, "oom", OpOOM.String())
	var segment, free, mark []Op
	for _, op := range Ops {
		if op.IsSegment() {
			segment = append(segment, op)
		}
		if op.IsFree() {
			free = append(free, op)
		}
		if op.IsMark() {
			mark = append(mark, op)
		}
	}
	require.Equal(t, []Op{OpSegmentAlloc, OpSegmentFree, OpSegmentMap, OpSegmentUnmap}, segment)
	require.Equal(t, []Op{OpFreeRequested, OpFreeCompleted}, free)
	require.Equal(t, []Op{OpSnapshot, OpUserDefined}, mark)
	require.True(t, slices.IsSortedFunc(Ops, func(a, b Op) int { return int(a) - int(b) }))
	require.Len(t, Ops, numOps-1)
}

// TestSummarize: a hand-written trace whose figures are worked out below.
func TestSummarize(t *testing.T) {
	events, err := Parse(strings.NewReader(header +
		"0,0,segment_alloc,4096,0,-1,0,,\n" + // reserved 4096
		"1,0,alloc,1000,0,1,0,,\n" + // allocated 1000
		"2,0,alloc,2000,1024,2,0,,\n" + // 3000
		"3,0,free_requested,1000,0,1,0,,\n" + // still 3000: not free until completed
		"4,0,alloc,500,3072,3,0,,\n" + // 3500: the peak
		"5,0,free_completed,1000,0,1,0,,\n" + // 2500
		"6,0,segment_alloc,8192,8192,-1,0,,\n" + // reserved 12288: the peak
		"7,0,segment_free,4096,0,-1,0,,\n" + // 8192
		"8,0,free_completed,1000,0,1,0,,\n" + // freed twice: unmatched, and id 1 was allocated: not mid-run
		"9,0,free_requested,2000,2048,2,0,,\n" + // the address disagrees with the alloc's
		"10,0,free_completed,1999,1024,2,0,,\n" + // the size disagrees: 1500, by the alloc's size
		"11,0,alloc,600,8192,4,0,,\n" + // 2100
		"12,0,segment_map,2097152,16384,-1,0,,\n" + // reserved 2105344: the peak
		"13,0,oom,8388608,,-1,0,,1048576\n" +
		"14,0,segment_unmap,2097152,16384,-1,0,,\n")) // 8192
	require.NoError(t, err)
	sums := Summarize(events)
	require.Len(t, sums, 1)
	s := sums[0]
	require.Equal(t, 0, s.Device)
	require.Equal(t, 15, s.Events)
	require.Equal(t, 4, s.Count(OpAlloc))
	require.Equal(t, 2, s.Count(OpFreeRequested))
	require.Equal(t, 3, s.Count(OpFreeCompleted))
	require.Equal(t, 2, s.Count(OpSegmentAlloc))
	require.Equal(t, 1, s.Count(OpSegmentFree))
	require.Equal(t, 1, s.Count(OpSegmentMap))
	require.Equal(t, 1, s.Count(OpSegmentUnmap))
	require.Equal(t, 1, s.Count(OpOOM))
	require.Equal(t, 0, s.Count(Op(200)))
	require.Equal(t, uint64(3500), s.PeakAllocated)
	require.Equal(t, 1, s.UnmatchedFrees)
	require.Equal(t, 2, s.MismatchedFrees)
	require.Zero(t, s.FreedBeforeRecording)
	require.False(t, s.ReservedBelowZero)
	require.False(t, s.MidRun())
	require.Equal(t, 5, s.SegmentEvents)
	require.Equal(t, uint64(2105344), s.PeakReserved)
	require.Equal(t, 1, s.OOMs)
	ratio, ok := s.PyTorchRatio()
	require.True(t, ok)
	require.InDelta(t, 2105344.0/3500, ratio, 1e-12)

	t.Run("no segment events: no ratio", func(t *testing.T) {
		s := Summarize(events[1:6])[0]
		require.Zero(t, s.SegmentEvents)
		require.Zero(t, s.PeakReserved)
		_, ok = s.PyTorchRatio()
		require.False(t, ok)
		require.Empty(t, Summarize(nil))
	})
	t.Run("mid-run: frees of allocations made before recording", func(t *testing.T) {
		events, err := Parse(strings.NewReader(header +
			"0,0,segment_alloc,4096,0,-1,0,,\n" +
			"1,0,free_requested,100,64,-1,0,,\n" + // made before recording
			"2,0,free_completed,100,64,-1,0,,\n" + // the same one
			"3,0,free_requested,100,128,-1,0,,\n" + // another, never completed
			"4,0,free_completed,200,256,9,0,,\n" + // a third, with an id
			"5,0,alloc,300,0,1,0,,\n"))
		require.NoError(t, err)
		s := Summarize(events)[0]
		require.Equal(t, 3, s.FreedBeforeRecording)
		require.Equal(t, 2, s.UnmatchedFrees)
		require.Zero(t, s.MismatchedFrees)
		require.True(t, s.MidRun())
		require.Equal(t, uint64(300), s.PeakAllocated)
		require.Equal(t, uint64(4096), s.PeakReserved)
		_, ok := s.PyTorchRatio()
		require.False(t, ok, "the reserved sum leaves out what was reserved before recording")
	})
	t.Run("mid-run: segments returned that were reserved before recording", func(t *testing.T) {
		events, err := Parse(strings.NewReader(header +
			"0,0,alloc,300,0,1,0,,\n" +
			"1,0,segment_alloc,4096,0,-1,0,,\n" +
			"2,0,segment_unmap,8192,4096,-1,0,,\n" + // -4096
			"3,0,segment_map,2097152,4096,-1,0,,\n")) // 2093056
		require.NoError(t, err)
		s := Summarize(events)[0]
		require.Zero(t, s.FreedBeforeRecording)
		require.True(t, s.ReservedBelowZero)
		require.True(t, s.MidRun())
		require.Equal(t, uint64(2093056), s.PeakReserved)
		_, ok := s.PyTorchRatio()
		require.False(t, ok)
	})
	t.Run("one summary per device, alloc_ids per device", func(t *testing.T) {
		events, err := Parse(strings.NewReader(header +
			"0,2,alloc,100,0,1,0,,\n" +
			"1,0,alloc,200,0,1,0,,\n" + // the same id on another device
			"2,2,free_completed,100,0,1,0,,\n" +
			"3,0,alloc,300,512,2,0,,\n" + // device 0: 500
			"4,2,free_completed,200,0,1,0,,\n" + // freed on device 2 already: unmatched there
			"5,0,segment_alloc,2097152,0,-1,0,,\n"))
		require.NoError(t, err)
		sums := Summarize(events)
		require.Len(t, sums, 2)
		require.Equal(t, 0, sums[0].Device)
		require.Equal(t, 3, sums[0].Events)
		require.Equal(t, uint64(500), sums[0].PeakAllocated)
		require.Equal(t, 1, sums[0].SegmentEvents)
		require.Zero(t, sums[0].UnmatchedFrees)
		require.Equal(t, 2, sums[1].Device)
		require.Equal(t, 3, sums[1].Events)
		require.Equal(t, uint64(100), sums[1].PeakAllocated)
		require.Equal(t, 1, sums[1].UnmatchedFrees)
		require.Zero(t, sums[1].FreedBeforeRecording, "id 1 was allocated on device 2")
		require.Zero(t, sums[1].SegmentEvents)
	})
}

// TestParseNilReader: a nil (or typed-nil) reader is driver.ErrInvalid,
// not a panic inside encoding/csv.
func TestParseNilReader(t *testing.T) {
	for _, r := range []io.Reader{nil, (*strings.Reader)(nil), (*os.File)(nil)} {
		_, err := Parse(r)
		drivertest.RequireIs(t, err, driver.ErrInvalid, "the reader is nil")
	}
}

// TestLargestAtPeak: the allocations live when the allocated memory
// first peaked, largest first (the earlier among equals), with their
// allocs' lines and times; a later peak of the same height changes
// nothing.
func TestLargestAtPeak(t *testing.T) {
	events, err := Parse(strings.NewReader(header +
		"0,0,alloc,1000,0,1,0,500,\n" +
		"1,0,alloc,3000,1024,2,0,600,\n" +
		"2,0,alloc,1000,8192,3,0,700,\n" + // 5000
		"3,0,free_completed,1000,0,1,0,800,\n" + // 4000
		"4,0,alloc,2000,0,4,0,900,\n" + // 6000: the peak
		"5,0,free_completed,2000,0,4,0,1000,\n" +
		"6,0,alloc,2000,0,5,0,1100,\n" + // 6000 again: not the first
		"7,1,alloc,512,0,1,0,,\n")) // device 1: no times
	require.NoError(t, err)
	sums := Summarize(events)
	s := sums[0]
	require.Equal(t, uint64(6000), s.PeakAllocated)
	require.Equal(t, PeakAlloc{AllocID: 4, Size: 2000, Line: 6, Seq: 4, TimeUS: 900, HasTime: true}, s.Peak)
	require.Equal(t, 3, s.LiveAtPeak)
	require.Equal(t, []PeakAlloc{
		{AllocID: 2, Size: 3000, Line: 3, Seq: 1, TimeUS: 600, HasTime: true},
		{AllocID: 4, Size: 2000, Line: 6, Seq: 4, TimeUS: 900, HasTime: true},
		{AllocID: 3, Size: 1000, Line: 4, Seq: 2, TimeUS: 700, HasTime: true},
	}, s.LargestAtPeak)
	require.True(t, s.HasFirstTime)
	require.Equal(t, int64(500), s.FirstTimeUS)
	d1 := sums[1]
	require.Equal(t, []PeakAlloc{{AllocID: 1, Size: 512, Line: 9, Seq: 7}}, d1.LargestAtPeak)
	require.False(t, d1.HasFirstTime)

	// A real trace: silmont2000's peak holds its 512 MiB tensors.
	real := Summarize(readTrace(t, "silmont2000_mem_snapshot.csv"))[0]
	require.Len(t, real.LargestAtPeak, MaxLargestAtPeak)
	var sum uint64
	for i, a := range real.LargestAtPeak {
		sum += a.Size
		if i > 0 {
			require.LessOrEqual(t, a.Size, real.LargestAtPeak[i-1].Size)
		}
	}
	require.LessOrEqual(t, sum, real.PeakAllocated)
	require.Equal(t, uint64(512<<20), real.LargestAtPeak[0].Size)
}
