package replay

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

func ev(op Op, id int64, size uint64) Event {
	return Event{Op: op, AllocID: id, Size: size, HasAddr: true}
}

// TestWithModelledSegments: the model's segments land before the allocs
// that made them, and its releases before the alloc whose OOM path gave
// them back; an allocation the model cannot hold becomes an oom event
// before its alloc and its free is left out of the model; events are
// numbered afresh; the input is unchanged; the summary then reads the
// model's reserved peak.
func TestWithModelledSegments(t *testing.T) {
	in := []Event{
		ev(OpAlloc, 1, 100),         // a 2 MiB small segment
		ev(OpAlloc, 2, 3*units.MiB), // a 20 MiB segment
		ev(OpFreeRequested, 2, 3*units.MiB),
		ev(OpFreeCompleted, 2, 3*units.MiB), // the 20 MiB segment empty, kept
		ev(OpAlloc, 3, 16*units.MiB),        // fits the kept 20 MiB segment
		ev(OpAlloc, 4, 30*units.MiB),        // 22 + 30 > 40: nothing empty to give back, oom
		ev(OpFreeCompleted, 4, 30*units.MiB),
		ev(OpFreeCompleted, 3, 16*units.MiB),
		ev(OpAlloc, 5, 24*units.MiB), // 22 + 24 > 40: the empty 20 MiB segment given back, 24 MiB made
	}
	orig := slices.Clone(in)
	out, err := WithModelledSegments(in, 40*units.MiB)
	require.NoError(t, err)
	require.Equal(t, orig, in, "the input unchanged")
	var got []string
	for i, e := range out {
		require.Equal(t, uint64(i), e.Seq)
		require.Equal(t, i+2, e.Line)
		got = append(got, e.Op.String()+" "+units.Bytes(e.Size))
	}
	require.Equal(t, []string{
		"segment_alloc 2 MiB", "alloc 100 B",
		"segment_alloc 20 MiB", "alloc 3 MiB", "free_requested 3 MiB", "free_completed 3 MiB",
		"alloc 16 MiB",
		"oom 30 MiB", "alloc 30 MiB", "free_completed 30 MiB", "free_completed 16 MiB",
		"segment_free 20 MiB", "segment_alloc 24 MiB", "alloc 24 MiB",
	}, got)
	require.Equal(t, uint64(18*units.MiB), out[7].DeviceFree)
	require.True(t, out[7].HasDeviceFree)
	require.Equal(t, uint64(2*units.MiB), out[2].Addr, "segments placed one after another")
	s := Summarize(out)
	require.Len(t, s, 1)
	require.Equal(t, uint64(26*units.MiB), s[0].PeakReserved, "2 MiB and the 24 MiB segment")
	require.Equal(t, 4, s[0].SegmentEvents)
	require.Equal(t, 1, s[0].OOMs)
	require.False(t, s[0].MidRun())
}

// TestWithModelledSegmentsZeroBytes: an alloc of 0 bytes takes no block
// and makes no segment; its free frees nothing.
func TestWithModelledSegmentsZeroBytes(t *testing.T) {
	out, err := WithModelledSegments([]Event{ev(OpAlloc, 1, 0), ev(OpFreeCompleted, 1, 0), ev(OpAlloc, 1, 0)}, units.GiB)
	require.NoError(t, err)
	require.Len(t, out, 3)
	require.Zero(t, Summarize(out)[0].SegmentEvents)
}

// TestWithModelledSegmentsPerDevice: each device has a model of its own.
func TestWithModelledSegmentsPerDevice(t *testing.T) {
	a, b := ev(OpAlloc, 1, 100), ev(OpAlloc, 1, 100)
	b.Device = 1
	out, err := WithModelledSegments([]Event{a, b}, units.GiB)
	require.NoError(t, err)
	require.Len(t, out, 4)
	require.Equal(t, []int{0, 0, 1, 1}, []int{out[0].Device, out[1].Device, out[2].Device, out[3].Device})
	require.Equal(t, out[0].Addr, out[2].Addr, "a space of each device's own")
}

// TestWithModelledSegmentsRefuses: events with segment events of their
// own, a device of 0 bytes and an id allocated twice are refused with
// driver.ErrInvalid, naming the line, and nothing is returned.
func TestWithModelledSegmentsRefuses(t *testing.T) {
	for _, c := range []struct {
		events   []Event
		capacity uint64
		says     string
	}{
		{[]Event{ev(OpAlloc, 1, 100), {Line: 3, Op: OpSegmentAlloc, Size: units.MiB}}, units.GiB, "line 3: the events have segment events of their own (segment_alloc)"},
		{[]Event{ev(OpAlloc, 1, 100)}, 0, "a modelled device of 0 bytes"},
		{[]Event{{Line: 2, Op: OpAlloc, AllocID: 1, Size: 100}, {Line: 3, Op: OpAlloc, AllocID: 1, Size: 100}}, units.GiB, "line 3: cachingmodel: allocation 1 is live already"},
	} {
		orig := slices.Clone(c.events)
		out, err := WithModelledSegments(c.events, c.capacity)
		require.ErrorIs(t, err, driver.ErrInvalid)
		require.ErrorContains(t, err, c.says)
		require.Nil(t, out)
		require.Equal(t, orig, c.events)
	}
}

// TestWithModelledSegmentsRandomLifetimes: on the generated workload at
// 48 GiB, where the model runs out of memory, its reserved peak is at
// least the allocated peak and each of its ooms is listed once, served or
// not by the alloc after it; vmarena's replay of the events with the
// model's is the same as of the workload alone (its calls, peaks and
// allocations: a modelled oom is not probed).
func TestWithModelledSegmentsRandomLifetimes(t *testing.T) {
	w, err := RandomLifetimes{Seed: 1, Events: 20_000, Live: 36 * units.GiB, Limit: 48 * units.GiB}.Generate()
	require.NoError(t, err)
	out, err := WithModelledSegments(w, 48*units.GiB)
	require.NoError(t, err)
	s := Summarize(out)[0]
	require.Positive(t, s.SegmentEvents)
	require.Positive(t, s.OOMs, "the model fragments past 48 GiB")
	require.GreaterOrEqual(t, s.PeakReserved, s.PeakAllocated)
	require.Equal(t, Summarize(w)[0].PeakAllocated, s.PeakAllocated)
	opts := Options{Capacity: 48 * units.GiB}
	res, err := Replay(out, opts)
	require.NoError(t, err)
	alone, err := Replay(w, opts)
	require.NoError(t, err)
	d, a := res.Devices[0], alone.Devices[0]
	require.Len(t, d.OOMs, s.OOMs)
	for _, o := range d.OOMs {
		require.True(t, o.Served, "line %d", o.Line)
		require.Equal(t, OpOOM, out[o.Line-2].Op)
		require.Equal(t, OpAlloc, out[o.Line-1].Op)
	}
	require.Equal(t, a.DriverCalls, d.DriverCalls)
	require.Equal(t, a.Figures, d.Figures)
	require.Equal(t, a.Allocs, d.Allocs)
	require.Equal(t, a.Frees, d.Frees)
}

// FuzzWithModelledSegments: any events a caller passes (ops, devices,
// ids and sizes drawn from the input, segment events included) come back
// either refused with driver.ErrInvalid and nothing, or as the input in
// order with only modelled segment and oom events between, each device's
// reserved bytes never below zero nor above the capacity; the input is
// never changed.
func FuzzWithModelledSegments(f *testing.F) {
	f.Add([]byte{1, 0, 1, 8, 1, 0, 2, 200, 3, 0, 1, 8, 1, 1, 1, 255})
	f.Add([]byte{1, 0, 0, 0, 1, 0, 0, 0, 4, 0, 0, 9})
	f.Fuzz(func(t *testing.T, data []byte) {
		var in []Event
		for i := 0; i+3 < len(data) && len(in) < 500; i += 4 {
			// Mostly the ops a workload has; now and then a segment op,
			// which refuses the whole input.
			op := []Op{OpAlloc, OpAlloc, OpFreeCompleted, OpFreeRequested, OpFreeCompleted, OpOOM, OpSnapshot, OpAlloc}[data[i]%8]
			if data[i] == 255 {
				op = OpSegmentAlloc
			}
			size := uint64(data[i+3]) << (data[i+3] % 40)
			in = append(in, Event{Line: len(in) + 2, Op: op, Device: int(data[i+1] % 3), AllocID: int64(data[i+2] % 16), Size: size, HasAddr: true})
		}
		orig := slices.Clone(in)
		const capacity = 256 * units.MiB
		out, err := WithModelledSegments(in, capacity)
		require.Equal(t, orig, in)
		if err != nil {
			require.ErrorIs(t, err, driver.ErrInvalid)
			require.Nil(t, out)
			return
		}
		j := 0
		reserved := map[int]int64{}
		for _, e := range out {
			if e.Modelled {
				require.True(t, e.Op.IsSegment() || e.Op == OpOOM, "%v", e.Op)
				reserved[e.Device] += int64(e.Op.reserves()) * int64(e.Size)
				require.GreaterOrEqual(t, reserved[e.Device], int64(0))
				require.LessOrEqual(t, reserved[e.Device], int64(capacity))
				continue
			}
			require.Less(t, j, len(in))
			want := in[j]
			want.Seq, want.Line = e.Seq, e.Line
			require.Equal(t, want, e)
			j++
		}
		require.Equal(t, len(in), j)
	})
}
