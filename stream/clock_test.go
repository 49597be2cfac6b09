package stream

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/internal/units"
)

// TestClockForgetsDestroyedStreams: a long-lived stream that waits on
// the events of a thousand short-lived streams, each destroyed after,
// holds in its clock — and copies into each event it records — the
// streams alive, not the thousand; what it waited on while they lived it
// ran after, as OrderedAfter said then.
func TestClockForgetsDestroyedStreams(t *testing.T) {
	d, err := host.New(host.Options{Devices: 1, Capacity: 4 * units.MiB, Granularity: 64 * units.KiB})
	require.NoError(t, err)
	drivertest.CloseAtEnd(t, d)
	w, err := New(d, 0)
	require.NoError(t, err)
	ev, err := NewEvent(d, 0)
	require.NoError(t, err)
	mine, err := NewEvent(d, 0)
	require.NoError(t, err)
	for range 1000 {
		s, err := New(d, 0)
		require.NoError(t, err)
		require.NoError(t, s.Launch("work", func() error { return nil }))
		require.NoError(t, s.Record(ev))
		require.NoError(t, w.Wait(ev))
		require.True(t, w.OrderedAfter(s, s.Position()))
		require.NoError(t, s.Destroy())
		require.NoError(t, w.Record(mine))
	}
	w.mu.Lock()
	n := len(w.clock)
	w.mu.Unlock()
	require.LessOrEqual(t, n, 1, "the last short-lived stream, at most")
	mine.mu.Lock()
	n = len(mine.clock)
	mine.mu.Unlock()
	require.LessOrEqual(t, n, 2, "w and the last short-lived stream, at most")
	for _, e := range []*Event{ev, mine} {
		require.NoError(t, e.Destroy())
	}
	require.NoError(t, w.Destroy())
}
