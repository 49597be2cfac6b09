package kvcache

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/tensor"
)

// TestHybridCanResume: CanResume answers what Resume then does, changes
// nothing, and refuses a running sequence, a negative count and a freed
// sequence.
func TestHybridCanResume(t *testing.T) {
	e := simEnv(t, 64*units.MiB, 0)
	h := e.hybrid(t, HybridConfig{Groups: []Group{
		{Kind: FullAttention, Layers: 2, KVHeads: 2, HeadDim: 64},
		{Kind: SlidingWindow, Layers: 2, KVHeads: 2, HeadDim: 64, Window: 64},
		{Kind: Recurrent, Layers: 2, StateBytes: 4096},
	}, DType: tensor.Float16, MaxContext: 4096, MaxSeqs: 2, NoPrefixSharing: true, MapAhead: -1})
	prompt := make([]int, 1000)
	for i := range prompt {
		prompt[i] = i + 1
	}
	s, err := h.Admit(prompt)
	require.NoError(t, err)
	_, err = s.Append(prompt)
	require.NoError(t, err)
	_, err = s.CanResume(0)
	require.ErrorIs(t, err, driver.ErrInvalid, "running")
	require.NoError(t, s.Preempt(Drop))
	_, err = s.CanResume(-1)
	require.ErrorIs(t, err, driver.ErrInvalid)
	before := h.Stats()
	ok, err := s.CanResume(0)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, before, h.Stats(), "it changes nothing")
	ok, err = s.CanResume(1 << 20)
	require.NoError(t, err)
	require.True(t, ok, "more is capped at MaxContext, which fits")
	_, err = h.SetBudget(units.MiB, Drop)
	require.NoError(t, err)
	ok, err = s.CanResume(0)
	require.NoError(t, err)
	require.False(t, ok, "a budget of 1 MiB does not hold its pages")
	_, err = s.Resume()
	require.ErrorIs(t, err, driver.ErrOutOfMemory)
	_, err = h.SetBudget(64*units.MiB, Drop)
	require.NoError(t, err)
	_, err = s.Resume()
	require.NoError(t, err)
	require.NoError(t, s.Free())
	_, err = s.CanResume(0)
	require.ErrorIs(t, err, driver.ErrClosed)
	var zero HybridSeq
	_, err = zero.CanResume(0)
	require.ErrorIs(t, err, driver.ErrInvalid)
}

// TestHybridCanAdmitHugeOutput: an expected output (or more tokens after
// a resume) past MaxContext is counted as MaxContext in all, whatever
// its size: math.MaxInt overflowed the sum to a negative total, which
// every budget held (true where the answer for MaxContext is false).
func TestHybridCanAdmitHugeOutput(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	h := e.hybrid(t, tinyHybrid(512, 4, 2*units.MiB))
	prompt := []int{1, 2}
	for _, out := range []int{510, 1 << 40, math.MaxInt} {
		ok, err := h.CanAdmit(prompt, out)
		require.NoError(t, err)
		require.False(t, ok, "%d more: the whole MaxContext does not fit in 2 MiB", out)
	}
	s, err := h.Admit(prompt)
	require.NoError(t, err)
	_, err = s.Append(prompt)
	require.NoError(t, err)
	require.NoError(t, s.Preempt(Drop))
	for _, more := range []int{510, math.MaxInt} {
		ok, err := s.CanResume(more)
		require.NoError(t, err)
		require.False(t, ok, "%d more", more)
	}
}
