package kvcache

import (
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/internal/leakcheck"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/vaspace"
)

// tinyHybrid is a small hybrid model on 64 KiB pages: a full-attention
// group, a sliding-window group (its window all of MaxContext: tests of
// released units set a smaller one), a latent group and a recurrent
// group.
func tinyHybrid(maxCtx, maxSeqs int, budget uint64) HybridConfig {
	return HybridConfig{Groups: []Group{
		{Kind: FullAttention, Layers: 2, KVHeads: 2, HeadDim: 64},
		{Kind: SlidingWindow, Layers: 2, KVHeads: 2, HeadDim: 64, Window: maxCtx},
		{Kind: Latent, Layers: 2, KVHeads: 1, HeadDim: 96},
		{Kind: Recurrent, Layers: 2, StateBytes: 40 * units.KiB},
	}, DType: tensor.Float32, BlockTokens: 16, MaxContext: maxCtx, MaxSeqs: maxSeqs, PageSize: page, Budget: budget, MapAhead: -1}
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

// TestHybridForkWriteRead: after a fork, what one side writes (its new
// tokens' rows in every group, its recurrent state) the other never
// reads, and both read their own shared prefix.
func TestHybridForkWriteRead(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	h := e.hybrid(t, tinyHybrid(512, 4, 32*units.MiB))
	m := &hybridModel{t: t, h: h, bytes: true}
	prompt := seqTokens(200, 200, 1)
	s, err := h.Admit(prompt)
	require.NoError(t, err)
	p := &hmSeq{s: s, prompt: prompt, running: true}
	m.seqs = append(m.seqs, p)
	m.prefill(p, HybridStep{})
	m.compare()
	for round := range 6 {
		c, err := p.s.Fork()
		require.NoError(t, err)
		q := &hmSeq{s: c, tokens: p.tokens[:len(p.tokens):len(p.tokens)], prompt: prompt, running: true}
		m.seqs = append(m.seqs, q)
		m.compare()
		// Each side appends its own tokens; the other's bytes stay.
		for i, x := range []*hmSeq{q, p} {
			tokens := []int{5000 + 10*round + i, 6000 + round}
			step, err := x.s.Append(tokens)
			require.NoError(t, err)
			x.tokens = append(x.tokens[:len(x.tokens):len(x.tokens)], tokens...)
			m.write(x, step)
			m.compare()
		}
		if round%2 == 0 {
			require.NoError(t, q.s.Free())
			m.remove(q)
			m.compare()
		}
	}
	require.Equal(t, 6, h.Stats().Forks)
}

// TestHybridEvents: each group's BlockStored and BlockRemoved name it,
// with its kind and window.
func TestHybridEvents(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	var batches []EventBatch
	cfg := tinyHybrid(512, 2, 32*units.MiB)
	cfg.Groups[1].Window = 32
	cfg.Events = func(b EventBatch) { batches = append(batches, b) }
	h := e.hybrid(t, cfg)
	a := hybridPrefill(t, h, seqTokens(300, 300, 1))
	require.NoError(t, a.Free())
	_, err := h.SetBudget(2*units.MiB, Drop) // evicts the cached units
	require.NoError(t, err)
	stored, removed := map[int]bool{}, map[int]bool{}
	for _, b := range batches {
		for _, ev := range b.Events {
			switch ev := ev.(type) {
			case *BlockStored:
				stored[ev.GroupIdx] = true
				want := map[int]string{0: "", 1: "sliding_window", 2: "mla_attention"}[ev.GroupIdx]
				require.Equal(t, want, ev.SpecKind)
				require.Equal(t, map[int]int{1: 32}[ev.GroupIdx], ev.SlidingWindow)
			case *BlockRemoved:
				removed[ev.GroupIdx] = true
			}
		}
	}
	require.Equal(t, map[int]bool{0: true, 1: true, 2: true}, stored)
	require.Equal(t, map[int]bool{0: true, 1: true, 2: true}, removed)
}

// TestHybridRefusals: bad configs and calls are ErrInvalid (or
// ErrClosed) and change nothing.
func TestHybridRefusals(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	for _, groups := range [][]Group{
		nil,
		{{Kind: Recurrent, Layers: 1, StateBytes: 8}},
		{{Kind: FullAttention, Layers: 0, KVHeads: 1, HeadDim: 8}},
		{{Kind: SlidingWindow, Layers: 1, KVHeads: 1, HeadDim: 8}},
		{{Kind: Latent, Layers: 1, KVHeads: 2, HeadDim: 8}},
		{{Kind: Latent, Layers: 1, KVHeads: 1, HeadDim: 7}},
		{{Kind: FullAttention, Layers: 1, KVHeads: 1, HeadDim: 8, Window: 4}},
		{{Kind: FullAttention, Layers: 1, KVHeads: 1, HeadDim: 8}, {Kind: Recurrent, Layers: 1}},
		{{Kind: 9, Layers: 1}},
	} {
		cfg := tinyHybrid(64, 2, 0)
		cfg.Groups = groups
		_, err := NewHybrid(e.space, e.mem, cfg)
		require.ErrorIs(t, err, driver.ErrInvalid, "%v", groups)
	}
	h := e.hybrid(t, tinyHybrid(64, 2, 16*units.MiB))
	before := h.Stats()
	for _, p := range [][]int{nil, make([]int, 65), {1, -1}} {
		_, err := h.Admit(p)
		require.ErrorIs(t, err, driver.ErrInvalid)
	}
	require.Equal(t, before.Committed, h.Stats().Committed)
	s, err := h.Admit([]int{1, 2, 3})
	require.NoError(t, err)
	before = h.Stats()
	_, err = s.Append([]int{1, 9})
	require.ErrorIs(t, err, driver.ErrInvalid, "not the prompt's tokens")
	_, err = s.State(99)
	require.ErrorIs(t, err, driver.ErrInvalid)
	_, err = s.Resume()
	require.ErrorIs(t, err, driver.ErrInvalid, "running")
	_, err = h.SetBudget(0, Drop)
	require.ErrorIs(t, err, driver.ErrInvalid)
	require.Equal(t, before.Committed, h.Stats().Committed)
	require.NoError(t, s.Free())
	require.NoError(t, h.Close())
	_, err = h.Admit([]int{1})
	require.ErrorIs(t, err, driver.ErrClosed)
	require.ErrorIs(t, h.Close(), driver.ErrClosed)
}

// TestHybridNoLeaks: a hybrid cache that shared, forked, preempted and
// closed with sequences live leaves descriptors, mappings and resident
// memory as they were, and nothing committed.
func TestHybridNoLeaks(t *testing.T) {
	work := func() {
		drv, err := host.New(host.Options{Devices: 1, Capacity: 64 * units.MiB, Granularity: page})
		require.NoError(t, err)
		space, mem := vaspace.New(drv), physical.New(drv)
		h, err := NewHybrid(space, mem, tinyHybrid(512, 4, 32*units.MiB))
		require.NoError(t, err)
		a := hybridPrefill(t, h, seqTokens(300, 300, 1))
		b := hybridPrefill(t, h, seqTokens(300, 300, 1))
		_, err = b.State(1)
		require.NoError(t, err)
		c, err := b.Fork()
		require.NoError(t, err)
		_, err = c.Append([]int{7})
		require.NoError(t, err)
		require.NoError(t, a.Preempt(Swap))
		require.NoError(t, b.Preempt(Drop))
		require.NoError(t, h.Close())
		u, err := mem.Usage(0)
		require.NoError(t, err)
		require.Zero(t, u.Used)
		require.Empty(t, space.Reservations())
		require.NoError(t, drv.Close())
	}
	leakcheck.Require(t, 3, work)
}

// TestHybridRace: sequences admitted, appended, forked, preempted,
// resumed and freed from several goroutines at once (go test -race).
func TestHybridRace(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	h := e.hybrid(t, tinyHybrid(512, 8, 32*units.MiB))
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10 {
				s, err := h.Admit(seqTokens(40+i, 40, g))
				if err != nil {
					continue
				}
				if _, err := s.Append(seqTokens(40+i, 40, g)[s.Len():]); err == nil {
					_ = s.MarkWritten(s.Len())
					if c, err := s.Fork(); err == nil {
						_, _ = c.Append([]int{1})
						_ = c.Free()
					}
					if s.Preempt(Swap) == nil {
						_, _ = s.Resume()
					}
				}
				_ = s.Free()
			}
		}()
	}
	wg.Wait()
	require.NoError(t, h.Check())
	require.Zero(t, h.Stats().Sequences)
}

// TestHybridWindowHit: a hybrid's window group hits by the sliding-window
// rule: once the first sequence's window passed its prompt's early units
// (released, and kept cached in the window group's store), a second
// admission of the prompt matches what the full group holds, its window
// group's sequence borrowing the window's units only; a prompt sharing
// only the first half hits at its end in both groups, through the units
// behind the first prompt's window.
func TestHybridWindowHit(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	cfg := HybridConfig{Groups: []Group{
		{Kind: FullAttention, Layers: 2, KVHeads: 2, HeadDim: 64},
		{Kind: SlidingWindow, Layers: 2, KVHeads: 2, HeadDim: 64, Window: 64},
	}, DType: tensor.Float32, BlockTokens: 16, MaxContext: 1024, MaxSeqs: 2, PageSize: page, Budget: 32 * units.MiB, MapAhead: -1}
	h := e.hybrid(t, cfg)
	prompt := seqTokens(600, 600, 1)
	a := hybridPrefill(t, h, prompt)
	for i := range 8 {
		_, err := a.Append([]int{50_000 + i})
		require.NoError(t, err)
	}
	require.NoError(t, a.MarkWritten(a.Len()))
	win := h.groups[1].c
	require.Positive(t, win.Stats().WindowUnits, "the window group released units behind its window")
	require.Zero(t, win.Stats().Evictions, "and keeps them cached")
	require.NoError(t, a.Free())
	require.NoError(t, h.Check())
	b, err := h.Admit(prompt)
	require.NoError(t, err)
	m := b.Matched()
	require.Greater(t, m, 600-64, "the full group's match, which the window group serves")
	require.Positive(t, b.Group(1).sl.lo, "the window group's match starts past the units behind its window")
	require.Equal(t, m, b.Group(0).Matched())
	require.Equal(t, m, b.Group(1).Matched())
	_, err = b.Append(prompt[m:])
	require.NoError(t, err)
	require.NoError(t, b.MarkWritten(600))
	require.NoError(t, h.Check())
	require.NoError(t, b.Free())
	require.NoError(t, h.Check())

	half := seqTokens(600, 300, 7_000)
	c, err := h.Admit(half)
	require.NoError(t, err)
	require.Greater(t, c.Matched(), 300-32, "a hit at the end of the shared half")
	require.LessOrEqual(t, c.Matched(), 300)
	require.Equal(t, c.Matched(), c.Group(1).Matched(), "the window group serves it")
	_, err = c.Append(half[c.Matched():])
	require.NoError(t, err)
	require.NoError(t, c.MarkWritten(600))
	require.NoError(t, h.Check())
	require.NoError(t, c.Free())
	require.NoError(t, h.Check())
}

// TestHybridRecurrentBounds: recurrent layers whose state a sequence
// would overflow a slot's bytes (2^24 layers of 2^40 bytes are 2^64: a
// zero-byte slot before it was refused) or that are too many to list are
// refused (ErrInvalid), naming the group, with nothing reserved.
func TestHybridRecurrentBounds(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	for _, rec := range []Group{
		{Kind: Recurrent, Layers: 1 << 24, StateBytes: 1 << 40},
		{Kind: Recurrent, Layers: 2, StateBytes: 1 << 40},
		{Kind: Recurrent, Layers: 1<<20 + 1, StateBytes: 1},
	} {
		cfg := tinyHybrid(64, 2, 16*units.MiB)
		cfg.Groups[3] = rec
		h, err := NewHybrid(e.space, e.mem, cfg)
		require.ErrorIs(t, err, driver.ErrInvalid, "%+v", rec)
		require.ErrorContains(t, err, "group 3 (recurrent)")
		require.Nil(t, h)
		require.Empty(t, e.space.Reservations())
	}
	cfg := tinyHybrid(64, 2, 16*units.MiB)
	cfg.Groups = append(cfg.Groups, Group{Kind: Recurrent, Layers: 1, StateBytes: 1<<40 - 2*40*units.KiB})
	h := e.hybrid(t, cfg) // 2^40 bytes of state in all: the bound itself
	require.NoError(t, h.Check())
}

// TestHybridGroupRefusalsPrefixed: a refusal a group's check makes (a
// fork with every slot taken or no prefix sharing, a swap of a sequence
// its window group released units of) is the hybrid's, its message
// starting "kvcache: " and naming the group, and changes nothing.
func TestHybridGroupRefusalsPrefixed(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	cfg := tinyHybrid(512, 1, 32*units.MiB)
	cfg.Groups[1].Window = 32
	h := e.hybrid(t, cfg)
	s := hybridPrefill(t, h, seqTokens(200, 200, 1))
	for range 40 {
		_, err := s.Append([]int{7})
		require.NoError(t, err)
	}
	require.NoError(t, s.MarkWritten(s.Len()))
	before := h.Stats()
	_, err := s.Fork()
	require.ErrorIs(t, err, driver.ErrBusy)
	require.True(t, strings.HasPrefix(err.Error(), "kvcache: hybrid: fork a sequence: group 0 (full): "), "%v", err)
	err = s.Preempt(Swap)
	require.ErrorIs(t, err, driver.ErrUnsupported)
	require.True(t, strings.HasPrefix(err.Error(), "kvcache: hybrid: preempt a sequence (swap): group 1 (window): "), "%v", err)
	require.Equal(t, before, h.Stats())
	require.NoError(t, h.Check())

	cfg = tinyHybrid(512, 2, 32*units.MiB)
	cfg.NoPrefixSharing = true
	h = e.hybrid(t, cfg)
	s = hybridPrefill(t, h, seqTokens(100, 100, 1))
	_, err = s.Fork()
	require.ErrorIs(t, err, driver.ErrUnsupported)
	require.True(t, strings.HasPrefix(err.Error(), "kvcache: "), "%v", err)
}

// ringHybrid is a full-attention group and a ring window group of 64
// tokens (a ring of 128 rows: at most 65 tokens an Append).
func ringHybrid() HybridConfig {
	return HybridConfig{Groups: []Group{
		{Kind: FullAttention, Layers: 2, KVHeads: 2, HeadDim: 64},
		{Kind: SlidingWindow, Layers: 2, KVHeads: 2, HeadDim: 64, Window: 64},
	}, DType: tensor.Float32, BlockTokens: 16, MaxContext: 1024, MaxSeqs: 2, PageSize: page, Budget: 32 * units.MiB, MapAhead: -1, Ring: true}
}

// TestHybridRingAppendRefusal: an Append of more tokens than the ring
// group takes at once is refused before any group appends (the full
// group, first, took the tokens and committed their pages before); the
// prompt then appended in chunks the ring takes fits.
func TestHybridRingAppendRefusal(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	h := e.hybrid(t, ringHybrid())
	prompt := seqTokens(100, 100, 1)
	s, err := h.Admit(prompt)
	require.NoError(t, err)
	before := h.Stats()
	_, err = s.Append(prompt)
	require.ErrorIs(t, err, driver.ErrInvalid)
	require.True(t, strings.HasPrefix(err.Error(), "kvcache: hybrid: append 100 tokens: group 1 (window): "), "%v", err)
	require.Equal(t, before, h.Stats(), "nothing changed")
	require.Zero(t, s.Group(0).Len())
	require.NoError(t, h.Check())
	for s.Len() < len(prompt) {
		_, err := s.Append(prompt[s.Len():min(s.Len()+60, len(prompt))])
		require.NoError(t, err)
	}
	require.Equal(t, 100, s.Group(0).Len())
	require.Equal(t, 100, s.Group(1).Len())
	require.NoError(t, h.Check())
}

// TestHybridSetBudgetFloor: a budget lowered below what no preemption
// frees — the recurrent states swapped sequences keep, a ring group's
// sequences — stops at what stays held, ErrOutOfMemory saying so, and
// the books hold (the groups within the budget); raised again, the
// sequences resume. Before, the budget was set below what was held and
// SetBudget answered an assertion failure, with Check rejecting the
// books.
func TestHybridSetBudgetFloor(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	h := e.hybrid(t, tinyHybrid(512, 4, 32*units.MiB))
	a := hybridPrefill(t, h, seqTokens(100, 100, 1))
	b := hybridPrefill(t, h, seqTokens(100, 100, 2))
	require.NoError(t, b.Preempt(Swap))
	for _, mode := range []PreemptMode{Drop, Swap} {
		_, err := h.SetBudget(page, mode)
		require.ErrorIs(t, err, driver.ErrOutOfMemory, "%s", mode)
		require.True(t, strings.HasPrefix(err.Error(), "kvcache: hybrid: set the budget to 64 KiB: "), "%v", err)
		st := h.Stats()
		require.Equal(t, st.Committed, st.Budget, "the budget stops at what stays")
		require.Equal(t, st.StateBytes, st.Committed, "the swapped sequences' states")
		require.NoError(t, h.Check())
		_, err = h.SetBudget(32*units.MiB, Drop)
		require.NoError(t, err)
		for _, s := range []*HybridSeq{a, b} {
			if s.Len() > 0 && h.Stats().Running < 2 {
				if _, err := s.Resume(); err != nil {
					require.ErrorIs(t, err, driver.ErrInvalid, "running")
				}
			}
		}
		require.NoError(t, h.Check())
		require.Equal(t, 2, h.Stats().Running)
		require.NoError(t, b.Preempt(Swap))
	}

	h = e.hybrid(t, ringHybrid())
	prompt := seqTokens(60, 60, 1)
	s, err := h.Admit(prompt)
	require.NoError(t, err)
	_, err = s.Append(prompt)
	require.NoError(t, err)
	preempted, err := h.SetBudget(page, Drop)
	require.ErrorIs(t, err, driver.ErrOutOfMemory)
	require.Empty(t, preempted, "a ring sequence is never preempted")
	st := h.Stats()
	require.Equal(t, st.Committed, st.Budget)
	require.NoError(t, h.Check())
	_, err = s.Append([]int{5})
	require.NoError(t, err, "its ring holds its window: the decode goes on")
}

// TestHybridStatePreempted: State refuses a preempted sequence, swapped
// (whose state stays in its slot) as dropped, and answers again once it
// is resumed.
func TestHybridStatePreempted(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	h := e.hybrid(t, tinyHybrid(512, 4, 32*units.MiB))
	s := hybridPrefill(t, h, seqTokens(100, 100, 1))
	for _, mode := range []PreemptMode{Swap, Drop} {
		require.NoError(t, s.Preempt(mode))
		_, err := s.State(0)
		require.ErrorIs(t, err, driver.ErrInvalid, "%s", mode)
		_, err = s.Resume()
		require.NoError(t, err)
		_, err = s.State(0)
		require.NoError(t, err)
	}
}

// TestHybridPrefillChunk: with HybridConfig.PrefillChunk, a sliding-window
// group's admission plan is what a prefill in such chunks holds at its
// peak — the window behind a chunk and the chunk — not the whole prompt,
// which one Append holds at once: a prompt whose window group would need
// four times the budget in one Append is admitted, and prefilled in
// chunks with no refusal and books Check accepts. A chunk below 0 or past
// MaxContext is refused.
func TestHybridPrefillChunk(t *testing.T) {
	e := simEnv(t, 64*units.MiB, page)
	cfg := HybridConfig{Groups: []Group{
		{Kind: FullAttention, Layers: 1, KVHeads: 1, HeadDim: 64},
		{Kind: SlidingWindow, Layers: 8, KVHeads: 2, HeadDim: 64, Window: 64},
	}, DType: tensor.Float32, BlockTokens: 16, MaxContext: 2048, MaxSeqs: 2, PageSize: page, Budget: 4 * units.MiB, MapAhead: -1}
	prompt := seqTokens(2048, 0, 7)

	whole := e.hybrid(t, cfg)
	ok, err := whole.CanAdmit(prompt, 0)
	require.NoError(t, err)
	require.False(t, ok, "in one Append the window group holds the whole prompt: 16 MiB")
	_, err = whole.Admit(prompt)
	requireIs(t, err, driver.ErrOutOfMemory, "admit")

	cfg.PrefillChunk = 128
	h := e.hybrid(t, cfg)
	ok, err = h.CanAdmit(prompt, 0)
	require.NoError(t, err)
	require.True(t, ok, "in chunks of 128 it holds its window and a chunk")
	s, err := h.Admit(prompt)
	require.NoError(t, err)
	for s.Len() < len(prompt) {
		_, err := s.Append(prompt[s.Len():min(s.Len()+cfg.PrefillChunk, len(prompt))])
		require.NoError(t, err, "at %d tokens", s.Len())
		require.NoError(t, h.Check())
	}
	require.Zero(t, h.Stats().FailedAdmits)
	require.NoError(t, s.Free())

	for _, chunk := range []int{-1, cfg.MaxContext + 1} {
		bad := cfg
		bad.PrefillChunk = chunk
		_, err := NewHybrid(e.space, e.mem, bad)
		requireIs(t, err, driver.ErrInvalid, "PrefillChunk")
		require.ErrorContains(t, err, "PrefillChunk")
	}
}
