package serving

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// TestSimulateRecord: the paged scheme of TestSimulatePreemptionByHand,
// recorded: its timeline's peaks are the result's, it starts at 0 and
// ends at the simulated time with nothing running; unrecorded, the result
// is the same but for the timeline.
func TestSimulateRecord(t *testing.T) {
	cfg := Config{Model: tinyModel, Budget: 64 * units.KiB, MaxContext: 64, MaxSeqs: 4}
	reqs := []Request{{Input: 16, Output: 20}, {Input: 16, Output: 20}}
	opts := Options{Config: cfg, MaxBatchedTokens: 1000, Steps: tenMs}
	run := func(record bool) Result {
		tbl, err := NewBlockTable(cfg)
		require.NoError(t, err)
		opts.Record = record
		res, err := Simulate(reqs, tbl, opts)
		require.NoError(t, err)
		return res
	}
	plain, res := run(false), run(true)
	require.Nil(t, plain.Timeline)
	tl := res.Timeline
	require.NotNil(t, tl)
	res.Timeline, res.WallTime, plain.WallTime, res.CPUTime, plain.CPUTime = nil, 0, 0, 0, 0
	require.Equal(t, plain, res, "recording changes nothing")

	require.Equal(t, float64(res.PeakSeqs), slices.Max(tl.Seqs.Y))
	require.Equal(t, float64(res.PeakInUse), slices.Max(tl.InUse.Y))
	require.Equal(t, float64(res.PeakWaste), slices.Max(tl.Waste.Y))
	for _, s := range []Series{tl.Seqs, tl.InUse, tl.Waste} {
		require.Len(t, s.X, res.Steps+1, "a point a step, and the end")
		require.Equal(t, 0.0, s.X[0])
		require.InDelta(t, (230 * time.Millisecond).Seconds(), s.X[len(s.X)-1], 1e-12)
	}
	require.Zero(t, tl.Seqs.Y[len(tl.Seqs.Y)-1], "nothing runs at the end")
}

// TestPanickingProgressHook: a Progress hook that panics stops the
// simulation with an error (ErrInvalid) that says so, instead of unwinding
// through it.
func TestPanickingProgressHook(t *testing.T) {
	cfg := Config{Model: tinyModel, Budget: 64 * units.KiB, MaxContext: 64, MaxSeqs: 4}
	reqs := []Request{{Input: 16, Output: 20}, {Input: 16, Output: 20}}
	tbl, err := NewBlockTable(cfg)
	require.NoError(t, err)
	_, err = Simulate(reqs, tbl, Options{Config: cfg, MaxBatchedTokens: 1000, Steps: tenMs,
		Progress: func(Progress) { panic("bang") }})
	require.ErrorIs(t, err, driver.ErrInvalid)
	require.ErrorContains(t, err, "the Progress hook panicked: bang")
}
