package kvcache

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/tensor"
)

// TestHybridLatentFindsWholePrefix: deepseek-v3's latent group (the
// Contiguous layout, 70,272 bytes a token: tokens straddle its 2 MiB
// pages) lends a second admission of a written 20,000-token prompt as
// much as a uniform cache of the same geometry does: every token but
// those of the unit the last one starts in. (Before, the hybrid's
// agreement between groups asked the group again with the count it had
// answered, and in the Contiguous layout each such round lost a unit:
// 16,400 tokens.)
func TestHybridLatentFindsWholePrefix(t *testing.T) {
	prompt := seqTokens(20000, 20000, 0)
	hc, err := HybridPreset("deepseek-v3")
	require.NoError(t, err)
	hc.MaxContext, hc.MaxSeqs, hc.MapAhead = 32768, 8, -1
	e := simEnv(t, 80*units.GiB, 2*units.MiB)
	h, err := NewHybrid(e.space, e.mem, hc)
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Close() })
	require.NoError(t, hybridPrefill(t, h, prompt).Free())
	s, err := h.Admit(prompt)
	require.NoError(t, err)

	cfg, err := Preset("deepseek-v3")
	require.NoError(t, err)
	cfg.MaxContext, cfg.MaxSeqs, cfg.Layout, cfg.MapAhead = 32768, 8, Contiguous, -1
	c := simEnv(t, 80*units.GiB, 2*units.MiB).cache(t, cfg)
	require.NoError(t, prefill(t, c, prompt, 0).Free())
	b, err := c.Admit(prompt, 0)
	require.NoError(t, err)
	require.Equal(t, b.Matched(), s.Matched(), "the hybrid's latent group lends what the uniform cache does")
	require.Greater(t, s.Matched(), len(prompt)-int(2*units.MiB/70272)-1, "all but the last unit's tokens")
	require.NoError(t, s.Free())
	require.NoError(t, b.Free())
	require.NoError(t, h.Check())
}

// TestFindAtMost: in every layout, the match of at most n tokens holds at
// most n, is the longest (a brute force over the longest match's units
// agrees in the Contiguous layout), and asking again with its own count
// gives it back: the fixed point the hybrid's groups agree on.
func TestFindAtMost(t *testing.T) {
	for _, layout := range []Layout{PerLayer, TokenMajor, Contiguous} {
		t.Run(layout.String(), func(t *testing.T) {
			cfg, err := Preset("deepseek-v3")
			require.NoError(t, err)
			cfg.MaxContext, cfg.MaxSeqs, cfg.Layout, cfg.MapAhead = 8192, 4, layout, -1
			if layout == PerLayer {
				cfg, err = Preset("llama3-8b") // 2 MiB holds whole rows
				require.NoError(t, err)
				cfg.MaxContext, cfg.MaxSeqs, cfg.Layout, cfg.MapAhead = 8192, 4, layout, -1
			}
			c := simEnv(t, 80*units.GiB, 2*units.MiB).cache(t, cfg)
			prompt := seqTokens(5000, 5000, 0)
			require.NoError(t, prefill(t, c, prompt, 0).Free())
			rng := rand.New(rand.NewPCG(1, uint64(layout)))
			c.mu.Lock()
			defer c.mu.Unlock()
			full := c.findAtMostLocked(prompt, len(prompt))
			require.Positive(t, full.tokens)
			for range 200 {
				n := rng.IntN(len(prompt) + 1)
				m := c.findAtMostLocked(prompt, n)
				require.LessOrEqual(t, m.tokens, n)
				again := c.findAtMostLocked(prompt, m.tokens)
				require.Equal(t, m.tokens, again.tokens, "idempotent at %d", n)
				require.Equal(t, len(m.units), len(again.units))
				require.Equal(t, m.partial, again.partial)
				if layout == Contiguous {
					best := 0
					for k := 0; k <= len(full.units)+1; k++ {
						if _, _, tk := c.g.cut(k); tk <= n && tk <= full.tokens {
							best = tk
						}
					}
					require.Equal(t, best, m.tokens, "the longest at most %d", n)
				}
			}
		})
	}
}

// TestHybridCheckpointIsRoom: an Append counts the recurrent store's
// checkpoints as room, as CanAdmit does (they are given back with the
// cached units): with a budget that holds a sequence and a checkpoint
// but for that checkpoint no second sequence, CanAdmit's yes is kept —
// the prompt's Append fits, evicting the checkpoint. (Before, the Append
// left the checkpoints out and refused, ErrOutOfMemory, what CanAdmit
// had promised.)
func TestHybridCheckpointIsRoom(t *testing.T) {
	const pg = 64 * units.KiB
	e := simEnv(t, 48*pg, pg)
	h := e.hybrid(t, HybridConfig{Groups: []Group{
		{Kind: FullAttention, Layers: 2, KVHeads: 8, HeadDim: 128},
		{Kind: SlidingWindow, Layers: 2, KVHeads: 8, HeadDim: 128, Window: 16},
		{Kind: Recurrent, Layers: 1, StateBytes: 16 << 10},
	}, DType: tensor.Float16, BlockTokens: 8, MaxContext: 64, MaxSeqs: 8, PageSize: pg, MapAhead: -1})
	_, err := h.SetBudget(2*pg, Drop)
	require.NoError(t, err)
	for i := range 4 {
		prompt := seqTokens(40, 0, 1000*(i+1))
		ok, err := h.CanAdmit(prompt, 0)
		require.NoError(t, err)
		if !ok {
			// Grow the budget by what the sequence needs beyond the spare,
			// as a shared budget's member does.
			need := h.SeqBytes(40)
			_, err := h.SetBudget(h.Stats().Budget+max(need-min(need, h.Spare()), pg), Drop)
			require.NoError(t, err)
			ok, err = h.CanAdmit(prompt, 0)
			require.NoError(t, err)
			require.True(t, ok)
		}
		s, err := h.Admit(prompt)
		require.NoError(t, err)
		_, err = s.Append(prompt[s.Len():])
		require.NoError(t, err, "admission %d: CanAdmit agreed", i)
		require.NoError(t, s.MarkWritten(40))
		if i > 0 {
			require.NoError(t, s.Free())
		}
		require.NoError(t, h.Check())
	}
	require.Positive(t, h.Stats().CheckpointsEvicted, "the checkpoints were the room")
}

// TestHybridReserve: Reserve commits the next tokens' pages in every
// group ahead of their Append, which then commits nothing; in a budget
// with room for part of them it reserves what fits and the Append
// commits the rest; its refusals (a negative count, past MaxContext, a
// preempted sequence, a freed one) change nothing.
func TestHybridReserve(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	h := e.hybrid(t, tinyHybrid(256, 4, 24*units.MiB))
	prompt := seqTokens(100, 0, 1)
	s := hybridPrefill(t, h, prompt[:40])
	commits := func() (n int) {
		for _, g := range h.Stats().Groups {
			n += g.Commits
		}
		return n
	}
	got, err := s.Reserve(60)
	require.NoError(t, err)
	require.Equal(t, 60, got)
	require.Equal(t, 40, s.Len(), "nothing appended")
	require.NoError(t, h.Check())
	before := commits()
	_, err = s.Append(prompt[40:])
	require.NoError(t, err)
	require.Equal(t, before, commits(), "the Append finds its pages committed")
	require.NoError(t, s.MarkWritten(100))
	require.NoError(t, h.Check())

	st := h.Stats()
	for _, n := range []int{-1, 256 - 100 + 1} {
		_, err := s.Reserve(n)
		drivertest.RequireIs(t, err, driver.ErrInvalid)
	}
	require.Equal(t, st.Committed, h.Stats().Committed)

	// A budget with room for a part: what fits.
	_, err = h.SetBudget(h.Stats().Committed+2*page, Drop)
	require.NoError(t, err)
	got, err = s.Reserve(150)
	require.NoError(t, err)
	require.Less(t, got, 150)
	require.LessOrEqual(t, h.Stats().Committed, h.Stats().Budget)
	require.NoError(t, h.Check())

	require.NoError(t, s.Preempt(Drop))
	_, err = s.Reserve(1)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "preempted")
	require.NoError(t, s.Free())
	_, err = s.Reserve(1)
	drivertest.RequireIs(t, err, driver.ErrClosed)
	require.NoError(t, h.Check())
}

// TestHybridGiveBackRefusals: GiveBack refuses nothing asked (ErrInvalid)
// and a closed cache (ErrClosed), changing nothing; Spare and SeqBytes are
// 0 once closed.
func TestHybridGiveBackRefusals(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	h, err := NewHybrid(e.space, e.mem, tinyHybrid(256, 4, 24*units.MiB))
	require.NoError(t, err)
	before := h.Stats()
	_, err = h.GiveBack(0)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "nothing asked")
	require.Equal(t, before.Budget, h.Stats().Budget)
	require.Positive(t, h.SeqBytes(10))
	require.NoError(t, h.Close())
	require.True(t, h.Closed())
	_, err = h.GiveBack(page)
	drivertest.RequireIs(t, err, driver.ErrClosed)
	require.Zero(t, h.Spare())
	require.Zero(t, h.SeqBytes(10))
}
