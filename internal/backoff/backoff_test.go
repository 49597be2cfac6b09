package backoff

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPause: the pauses double from 5 ms to 1 s and start again after a
// Reset; a closed done ends a wait at once.
func TestPause(t *testing.T) {
	var p Pause
	var got []time.Duration
	for range 10 {
		got = append(got, p.next())
	}
	require.Equal(t, []time.Duration{5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000}, scale(got))
	p.Reset()
	start := time.Now()
	require.True(t, p.Wait(make(chan struct{})))
	require.GreaterOrEqual(t, time.Since(start), first, "a wait lasts at least its pause")
	done := make(chan struct{})
	close(done)
	p.d = most
	require.False(t, p.Wait(done))
}

func scale(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d / time.Millisecond
	}
	return out
}
