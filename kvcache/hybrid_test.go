package kvcache

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/tensor"
)

// tinyHybrid is a small hybrid model on 64 KiB pages: a full-attention
// group, a sliding-window group, a latent group and a recurrent group.
func tinyHybrid(maxCtx, maxSeqs int, budget uint64) HybridConfig {
	return HybridConfig{Groups: []Group{
		{Kind: FullAttention, Layers: 2, KVHeads: 2, HeadDim: 64},
		{Kind: SlidingWindow, Layers: 2, KVHeads: 2, HeadDim: 64, Window: 32},
		{Kind: Latent, Layers: 2, KVHeads: 1, HeadDim: 96},
		{Kind: Recurrent, Layers: 2, StateBytes: 40 * units.KiB},
	}, DType: tensor.Float32, BlockTokens: 16, MaxContext: maxCtx, MaxSeqs: maxSeqs, PageSize: page, Budget: budget}
}

func (e *env) hybrid(t testing.TB, cfg HybridConfig) *Hybrid {
	t.Helper()
	h, err := NewHybrid(e.space, e.mem, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Close() })
	return h
}

// hybridPrefill admits prompt and appends and marks it written in chunks
// of a unit (BlockTokens), so that a checkpoint is left at each.
func hybridPrefill(t testing.TB, h *Hybrid, prompt []int) *HybridSeq {
	t.Helper()
	s, err := h.Admit(prompt)
	require.NoError(t, err)
	b := h.Config().BlockTokens
	for s.Len() < len(prompt) {
		end := min((s.Len()/b+1)*b, len(prompt))
		_, err := s.Append(prompt[s.Len():end])
		require.NoError(t, err)
		require.NoError(t, s.MarkWritten(end))
	}
	require.NoError(t, h.Check())
	return s
}

func TestHybridBasics(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	h := e.hybrid(t, tinyHybrid(512, 4, 32*units.MiB))
	prompt := seqTokens(300, 300, 1)
	a := hybridPrefill(t, h, prompt)
	require.Equal(t, 300, a.Len())
	st := h.Stats()
	require.Equal(t, 1, st.Running)
	require.Equal(t, 18, st.Checkpoints, "one at 16, 32, ..., 288")
	b, err := h.Admit(prompt)
	require.NoError(t, err)
	require.Equal(t, 256, b.Matched(), "every group serves 256 tokens (the latent group's third page ends there), and a checkpoint")
	require.Equal(t, 1, h.Stats().CheckpointHits)
	step, err := b.Append(prompt[256:])
	require.NoError(t, err)
	require.Equal(t, 256, step.Pos)
	require.NoError(t, b.MarkWritten(300))
	c, err := b.Fork()
	require.NoError(t, err)
	require.Equal(t, 300, c.Len())
	_, err = c.Append([]int{5})
	require.NoError(t, err)
	_, err = b.Append([]int{6})
	require.NoError(t, err)
	require.NoError(t, h.Check())
	require.NoError(t, a.Preempt(Drop))
	require.NoError(t, h.Check())
	rs, err := a.Resume()
	require.NoError(t, err)
	require.Equal(t, 256, rs.Pos, "recomputed from the checkpoint at 256")
	require.NoError(t, h.Check())
	require.NoError(t, c.Preempt(Swap))
	rs, err = c.Resume()
	require.NoError(t, err)
	require.Equal(t, 301, rs.Pos)
	require.Zero(t, rs.N)
	for _, s := range []*HybridSeq{a, b, c} {
		require.NoError(t, s.Free())
	}
	require.NoError(t, h.Check())
	require.ErrorIs(t, a.Free(), driver.ErrClosed)
}
