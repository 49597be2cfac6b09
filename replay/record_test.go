package replay

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
)

// TestReplayRecord replays the hand-written two-device trace, silmont2000
// (97 events, segment events, no mid-run) and select_n (4496 events, more
// than a recorded series keeps) with and without recording. Recording
// changes no figure. Each timeline has a point per event up to
// RecordPoints, and thinned keeps its peaks: its highest allocated is the
// trace's peak, its highest committed at most vmarena's peak (an OOM
// probe may commit and give back within one event), its highest
// reserved PyTorch's peak where that means something. The memory map is
// taken at the event where allocated first peaks, tiles each range, and
// its committed blocks add up to what the allocator held then.
func TestReplayRecord(t *testing.T) {
	for _, file := range []string{"handmade_two_devices.csv", "silmont2000_mem_snapshot.csv", "select_n_snapshot_v1f2f548.csv"} {
		t.Run(file, func(t *testing.T) {
			events := readTrace(t, file)
			plain, err := Replay(events, Options{})
			require.NoError(t, err)
			res, err := Replay(events, Options{Record: true})
			require.NoError(t, err)
			for i, d := range res.Devices {
				p := plain.Devices[i]
				require.Nil(t, p.Timeline, "recording is opt-in")
				require.Nil(t, p.PeakMap)
				require.Equal(t, p.Figures, d.Figures, "recording changes nothing")

				tl, s := d.Timeline, d.Summary
				require.NotNil(t, tl)
				for _, ser := range []Series{tl.Allocated, tl.Committed, tl.Reserved} {
					require.Len(t, ser.Y, len(ser.X))
					if s.Events <= RecordPoints/2 {
						require.Len(t, ser.X, s.Events, "a point an event")
					}
					require.LessOrEqual(t, len(ser.X), RecordPoints)
					require.Equal(t, 1.0, ser.X[0])
					require.Equal(t, float64(s.Events), ser.X[len(ser.X)-1])
					require.True(t, slices.IsSorted(ser.X))
				}
				require.Equal(t, float64(s.PeakAllocated), slices.Max(tl.Allocated.Y))
				require.Equal(t, float64(d.Figures.Allocated), tl.Allocated.Y[len(tl.Allocated.Y)-1])
				require.LessOrEqual(t, slices.Max(tl.Committed.Y), float64(d.Figures.PeakCommitted))
				require.Equal(t, float64(d.Figures.Committed), tl.Committed.Y[len(tl.Committed.Y)-1])
				if _, ok := s.PyTorchRatio(); ok {
					require.Equal(t, float64(s.PeakReserved), slices.Max(tl.Reserved.Y))
				}

				m := d.PeakMap
				require.NotNil(t, m)
				require.Equal(t, s.PeakAllocated, m.Allocated)
				require.Equal(t, float64(m.Allocated), tl.Allocated.Y[slices.Index(tl.Allocated.X, float64(m.Event))], "the map is taken at its event")
				require.Positive(t, m.Line)
				require.Equal(t, []string{"small requests", "large requests", "stitch range"}, m.Ranges)
				var committed, used uint64
				ends := make([]uint64, len(m.Ranges))
				for _, b := range m.Blocks {
					require.Equal(t, ends[b.Range], b.Offset, "range %d is tiled in order", b.Range)
					ends[b.Range] += b.Size
					switch b.Kind {
					case MapUsed:
						used += b.Size
						committed += b.Size
					case MapFree, MapLent:
						committed += b.Size
					}
				}
				require.Equal(t, m.Committed, committed)
				require.GreaterOrEqual(t, used, m.Allocated-stitchedBytes(m))
			}
		})
	}
}

// stitchedBytes is what m's stitched allocations take.
func stitchedBytes(m *PeakMap) uint64 {
	var n uint64
	for _, b := range m.Blocks {
		if b.Kind == MapStitched {
			n += b.Size
		}
	}
	return n
}

// TestPanickingProgressHook: a Progress hook that panics stops the replay
// with an error (ErrInvalid) that says so, instead of unwinding through it.
func TestPanickingProgressHook(t *testing.T) {
	events := readTrace(t, "wedsonlin_medium_512_training.csv")
	_, err := Replay(events, Options{Progress: func(int, int) { panic("boom") }})
	require.ErrorIs(t, err, driver.ErrInvalid)
	require.ErrorContains(t, err, "the Progress hook panicked: boom")
}
