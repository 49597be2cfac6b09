package trace

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/stretchr/testify/require"
)

const header = "seq,device,op,size,addr,alloc_id,stream,time_us,device_free\n"

func TestParse(t *testing.T) {
	events, err := Parse(strings.NewReader(header +
		"0,0,segment_alloc,20971520,139833534054400,-1,0,1748730219596671,\n" +
		"1,0,alloc,5242880,139833534054400,0,0,1748730219596673,\n" +
		"2,0,free_requested,5242880,139833534054400,0,7,,\n" +
		"3,0,free_completed,5242880,139833534054400,0,7,,123456\n" +
		"4,0,segment_free,20971520,139833534054400,-1,0,, \n"))
	require.NoError(t, err)
	require.Equal(t, []Event{
		{Line: 2, Seq: 0, Op: OpSegmentAlloc, Size: 20 << 20, Addr: 139833534054400, AllocID: -1, TimeUS: 1748730219596671, HasTime: true},
		{Line: 3, Seq: 1, Op: OpAlloc, Size: 5 << 20, Addr: 139833534054400, AllocID: 0, TimeUS: 1748730219596673, HasTime: true},
		{Line: 4, Seq: 2, Op: OpFreeRequested, Size: 5 << 20, Addr: 139833534054400, AllocID: 0, Stream: 7},
		{Line: 5, Seq: 3, Op: OpFreeCompleted, Size: 5 << 20, Addr: 139833534054400, AllocID: 0, Stream: 7, DeviceFree: 123456, HasDeviceFree: true},
		{Line: 6, Seq: 4, Op: OpSegmentFree, Size: 20 << 20, Addr: 139833534054400, AllocID: -1},
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
		require.Equal(t, []Event{{Line: 2, Seq: 9, Device: 1, Op: OpAlloc, Size: 512, Addr: 4096, AllocID: 3}}, events)
	})
	t.Run("an alloc_id may be reused once freed", func(t *testing.T) {
		events, err := Parse(strings.NewReader(header +
			"0,0,alloc,512,0,1,0,,\n" +
			"1,0,free_completed,512,0,1,0,,\n" +
			"2,0,alloc,512,0,1,0,,\n"))
		require.NoError(t, err)
		require.Len(t, events, 3)
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
		{"bad alloc_id", header + "0,0,alloc,512,4096,id,0,,\n", 2, `column alloc_id: "id" is not an integer`},
		{"bad stream", header + "0,0,alloc,512,4096,0,s,,\n", 2, `column stream: "s"`},
		{"bad time", header + "0,0,alloc,512,4096,0,0,soon,\n", 2, `column time_us: "soon"`},
		{"bad device_free", header + "0,0,alloc,512,4096,0,0,,-5\n", 2, `column device_free: "-5"`},
		{"unknown op", header + good + "1,0,realloc,512,4096,1,0,,\n", 3, `unknown op "realloc"`},
		{"empty op", header + "0,0,,512,4096,0,0,,\n", 2, `unknown op ""`},
		{"alloc without an id", header + "0,0,alloc,512,4096,-1,0,,\n", 2, "alloc with alloc_id -1"},
		{"alloc of a live id", header + good + "1,0,free_requested,512,4096,0,0,,\n" + good, 4, "alloc_id 0 is allocated again while live since line 2"},
		{"bare quote", header + good + "1,0,al\"loc,512,4096,1,0,,\n", 3, "bare \""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			events, err := Parse(strings.NewReader(tc.input))
			require.Error(t, err)
			require.Nil(t, events)
			require.True(t, errors.Is(err, ErrMalformed), "%v", err)
			if tc.line > 0 {
				require.Contains(t, err.Error(), fmt.Sprintf("trace: line %d: ", tc.line))
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
	f.Add("seq,op\n1,2\n")
	f.Add("\"")
	f.Fuzz(func(t *testing.T, s string) {
		events, err := Parse(strings.NewReader(s))
		if err != nil {
			require.Nil(t, events)
			return
		}
		last := 1
		for _, ev := range events {
			require.Contains(t, Ops, ev.Op)
			require.Greater(t, ev.Line, last)
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
	require.Equal(t, "Op(9)", Op(9).String())
	require.True(t, OpSegmentFree.IsSegment())
	require.False(t, OpFreeCompleted.IsSegment())
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
		"8,0,free_completed,1000,0,1,0,,\n" + // freed twice: unmatched
		"9,0,free_completed,9,0,42,0,,\n" + // never allocated: unmatched
		"10,0,alloc,600,8192,4,0,,\n")) // 3100
	require.NoError(t, err)
	s := Summarize(events)
	require.Equal(t, 11, s.Events)
	require.Equal(t, 4, s.Count(OpAlloc))
	require.Equal(t, 1, s.Count(OpFreeRequested))
	require.Equal(t, 3, s.Count(OpFreeCompleted))
	require.Equal(t, 2, s.Count(OpSegmentAlloc))
	require.Equal(t, 1, s.Count(OpSegmentFree))
	require.Equal(t, 0, s.Count(Op(200)))
	require.Equal(t, 1, s.Devices)
	require.Equal(t, uint64(3500), s.PeakAllocated)
	require.Equal(t, 2, s.UnmatchedFrees)
	require.Equal(t, 3, s.SegmentEvents)
	require.Equal(t, uint64(12288), s.PeakReserved)
	ratio, ok := s.PyTorchRatio()
	require.True(t, ok)
	require.InDelta(t, 12288.0/3500, ratio, 1e-12)

	// No segment events: no ratio.
	s = Summarize(events[1:6])
	require.Zero(t, s.SegmentEvents)
	require.Zero(t, s.PeakReserved)
	_, ok = s.PyTorchRatio()
	require.False(t, ok)
	require.Equal(t, Summary{}, Summarize(nil))
}
