package kvcache

import (
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/tensor"
)

// microConfig is a small model (2 layers x 1 KV head x 16, float32: a row
// of 64 bytes) with 64 KiB pages: 1024 tokens a unit in PerLayer, 256 in
// TokenMajor, blocks of 16 — so prompts share whole units and parts of
// units.
func microConfig(layout Layout, maxCtx, maxSeqs int) Config {
	return Config{Layers: 2, KVHeads: 1, HeadDim: 16, DType: tensor.Float32, MaxContext: maxCtx, MaxSeqs: maxSeqs,
		PageSize: page, Layout: layout, MapAhead: -1}
}

// seqTokens is n tokens: the first shared of them are the common prefix,
// the rest tail+i.
func seqTokens(n, shared, tail int) []int {
	out := make([]int, n)
	for i := range out {
		if i < shared {
			out[i] = 10 + i
		} else {
			out[i] = tail + i
		}
	}
	return out
}

// prefill admits prompt under extra and appends and writes what Admit did
// not match.
func prefill(t testing.TB, c *Cache, prompt []int, extra uint64) *Seq {
	t.Helper()
	s, err := c.Admit(prompt, extra)
	require.NoError(t, err)
	step, err := s.Append(prompt[s.Len():])
	require.NoError(t, err)
	writeStep(t, step, prompt, extra)
	require.NoError(t, s.MarkWritten(s.Len()))
	return s
}

// TestPrefixSharing: a second sequence whose prompt starts like a first's
// maps the same physical pages for the whole units they share — written
// through the owner's view, read through the borrower's — once the owner
// has written them (published at its next Append); another extra key
// shares nothing; Stats count the shared pages and the hits.
func TestPrefixSharing(t *testing.T) {
	for _, layout := range []Layout{PerLayer, TokenMajor} {
		t.Run(layout.String(), func(t *testing.T) {
			e := hostEnv(t, 64*units.MiB)
			c := e.cache(t, microConfig(layout, 4096, 4))
			unit := 1024
			if layout == TokenMajor {
				unit = c.TokensPerGroup()
				require.Equal(t, 256, unit)
			}
			prompt := seqTokens(3*unit+40, 3*unit+40, 0)
			a, err := c.Admit(prompt, 7)
			require.NoError(t, err)
			step, err := a.Append(prompt)
			require.NoError(t, err)
			writeStep(t, step, prompt, 7)

			early, err := c.Admit(seqTokens(3*unit+90, 3*unit+40, 5000), 7)
			require.NoError(t, err)
			require.Zero(t, early.Len(), "a's pages are not marked written yet")
			require.NoError(t, early.Free())

			require.NoError(t, a.MarkWritten(a.Len())) // a wrote its prompt: published
			_, err = a.Append([]int{1})
			require.NoError(t, err)
			other, err := c.Admit(seqTokens(3*unit+90, 3*unit+40, 5000), 8)
			require.NoError(t, err)
			require.Zero(t, other.Len(), "another extra key shares nothing")
			require.NoError(t, other.Free())

			b, err := c.Admit(seqTokens(3*unit+90, 3*unit+40, 5000), 7)
			require.NoError(t, err)
			require.Equal(t, 3*unit, b.Len(), "three whole units shared")
			require.Equal(t, 3*unit, b.Matched())
			st := c.Stats()
			require.Equal(t, 3*c.g.unitPages(), st.SharedPages)
			require.Equal(t, uint64(3*c.g.unitPages())*page, st.SavedBytes)
			require.Equal(t, 3*unit/16, st.PrefixHits)
			require.NoError(t, c.Check())

			// The same physical memory at two addresses: a write through
			// a's K is read through b's.
			ka, err := a.K(1)
			require.NoError(t, err)
			kb, err := b.K(1)
			require.NoError(t, err)
			require.NotEqual(t, firstAddr(t, a, 1), firstAddr(t, b, 1), "each at its own addresses")
			idx := []int{unit + 5, 0, 3}
			if layout == TokenMajor {
				idx = []int{1, 5, 0, 3}
			}
			before, err := kb.At(idx...)
			require.NoError(t, err)
			require.NoError(t, ka.Set(before+1, idx...))
			after, err := kb.At(idx...)
			require.NoError(t, err)
			require.Equal(t, before+1, after)
			require.NoError(t, ka.Set(before, idx...))

			// b computes the rest of its prompt; every byte reads back.
			bTokens := seqTokens(3*unit+90, 3*unit+40, 5000)
			step, err = b.Append(bTokens[b.Len():])
			require.NoError(t, err)
			writeStep(t, step, bTokens, 7)
			checkSeq(t, b, bTokens, 7, 0, len(bTokens))
			checkSeq(t, a, append(prompt, 1), 7, 0, len(prompt))

			// a goes: the shared units stay, b still maps them.
			require.NoError(t, a.Free())
			checkSeq(t, b, bTokens, 7, 0, len(bTokens))
			require.Zero(t, c.Stats().SharedPages, "one mapping each now")
			require.NoError(t, b.Free())
			st = c.Stats()
			require.Equal(t, st.StorePages, st.CachedPages, "no sequence maps the store: all cached")
			require.NoError(t, c.Check())
		})
	}
}

// TestPartialUnitCopiedOnce: a prompt that shares whole units and then
// part of the next unit's blocks with a cached prompt borrows the units
// and gets the partly shared unit copied once into its own; the keys and
// values of every shared position read back.
func TestPartialUnitCopiedOnce(t *testing.T) {
	for _, layout := range []Layout{PerLayer, TokenMajor} {
		t.Run(layout.String(), func(t *testing.T) {
			e := hostEnv(t, 64*units.MiB)
			c := e.cache(t, microConfig(layout, 4096, 4))
			unit := 1024
			if layout == TokenMajor {
				unit = 256
			}
			first := seqTokens(2*unit+100, 2*unit+100, 0)
			a := prefill(t, c, first, 0)
			require.NoError(t, a.Free())
			// Shares unit 0 whole and 40 tokens of unit 1: two whole
			// blocks (32 tokens) of it are copied.
			second := seqTokens(unit+300, unit+40, 9000)
			b, err := c.Admit(second, 0)
			require.NoError(t, err)
			require.Equal(t, unit+32, b.Matched())
			st := c.Stats()
			require.Equal(t, 1, st.Copies)
			require.Equal(t, uint64(c.g.unitPages())*page, st.CopiedBytes)
			step, err := b.Append(second[b.Len():])
			require.NoError(t, err)
			writeStep(t, step, second, 0)
			checkSeq(t, b, second, 0, 0, len(second))
			require.NoError(t, c.Check())
		})
	}
}

// TestWholePromptLeavesOneToCompute: a prompt the store holds entirely is
// matched but for the tokens after the last whole block before its last
// token: the caller computes at least that one (its logits).
func TestWholePromptLeavesOneToCompute(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	c := e.cache(t, microConfig(TokenMajor, 4096, 2))
	p := seqTokens(512, 512, 0) // two whole units of 256
	a := prefill(t, c, p, 0)
	require.NoError(t, a.Free())
	b, err := c.Admit(p, 0)
	require.NoError(t, err)
	require.Equal(t, 256+240, b.Matched(), "unit 0 whole, 15 blocks of unit 1 copied")
	ok, err := c.CanAdmit(p, 0, 0)
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, b.Free())
}

// TestPrefixEvictionLRU: cached prompt units are evicted least recently
// used first, whole units at a time, when memory is needed — a prompt
// matched since is kept over one that was not.
func TestPrefixEvictionLRU(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	cfg := microConfig(TokenMajor, 4096, 3)
	cfg.Budget = 8 * page
	c := e.cache(t, cfg)
	// Three prompts of two whole units (a page each), all cached.
	prompts := [][]int{seqTokens(512, 0, 100_000), seqTokens(512, 0, 200_000), seqTokens(512, 0, 300_000)}
	var seqs []*Seq
	for _, p := range prompts {
		seqs = append(seqs, prefill(t, c, p, 0))
	}
	for _, s := range seqs {
		require.NoError(t, s.Free())
	}
	st := c.Stats()
	require.Equal(t, 6, st.CachedPages)
	require.Equal(t, 6, st.PagesCommitted)
	// Prompt 0 again: its unit 0 is borrowed, 15 blocks of its unit 1
	// copied (the last token is left to compute): both used last.
	s, err := c.Admit(prompts[0], 0)
	require.NoError(t, err)
	require.Equal(t, 256+240, s.Len())
	require.NoError(t, s.Free())
	// A new prompt of four whole units needs 4 pages of the 2 free: the
	// least recently used units go — prompt 1's.
	f := prefill(t, c, seqTokens(1024, 0, 400_000), 1)
	st = c.Stats()
	require.Equal(t, 2, st.Evictions)
	require.Equal(t, 2, st.EvictedPages)
	require.NoError(t, f.Free())
	_, err = c.SetBudget(16*page, Drop) // room for the checks' copies
	require.NoError(t, err)
	for i, want := range []int{496, 0, 496} {
		s, err := c.Admit(prompts[i], 0)
		require.NoError(t, err)
		require.Equal(t, want, s.Matched(), "prompt %d", i)
		require.NoError(t, s.Free())
	}
	require.NoError(t, c.Check())
}

// TestPrefixEvictedFromItsEnd: a freed or preempted sequence's prompt
// units go back to the cache last first, so that eviction takes a chain
// from its end: a unit is found only through every unit before it, and
// evicting the first would leave the rest cached and unreachable.
func TestPrefixEvictedFromItsEnd(t *testing.T) {
	for _, preempt := range []bool{false, true} {
		e := hostEnv(t, 64*units.MiB)
		cfg := microConfig(TokenMajor, 4096, 3)
		cfg.Budget = 5 * page
		c := e.cache(t, cfg)
		prompt := seqTokens(1024, 0, 100_000) // four whole units of 256 tokens
		a := prefill(t, c, prompt, 0)
		if preempt {
			require.NoError(t, a.Preempt(Drop))
		} else {
			require.NoError(t, a.Free())
		}
		require.Equal(t, 4, c.Stats().CachedPages)
		// Two pages for another prompt, one free: one of a's units goes.
		x := prefill(t, c, seqTokens(512, 0, 200_000), 1)
		require.Equal(t, 1, c.Stats().Evictions)
		require.NoError(t, x.Free())
		b, err := c.Admit(prompt, 0)
		require.NoError(t, err)
		require.Equal(t, 768, b.Matched(), "units 0 to 2 are found; unit 3 went (preempted: %t)", preempt)
		require.NoError(t, b.Free())
		require.NoError(t, c.Check())
	}
}

// TestBudgetEvictsCachedBeforePreempting: lowering the budget gives back
// cached prefix units before it preempts any running sequence.
func TestBudgetEvictsCachedBeforePreempting(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	c := e.cache(t, microConfig(TokenMajor, 4096, 3))
	cached := prefill(t, c, seqTokens(1024, 0, 100_000), 0) // 4 store units
	require.NoError(t, cached.Free())
	running := prefill(t, c, seqTokens(600, 0, 200_000), 0) // 2 store units, 1 own page
	require.Equal(t, 4, c.Stats().CachedPages)
	got, err := c.SetBudget(3*page, Swap)
	require.NoError(t, err)
	require.Empty(t, got, "nothing preempted")
	st := c.Stats()
	require.Equal(t, 4, st.Evictions)
	require.Equal(t, 3, st.PagesCommitted)
	require.Zero(t, st.Preemptions)
	// Lower still: now the running sequence goes (swapped), and what it
	// borrowed, cached again, is evicted too.
	got, err = c.SetBudget(page, Swap)
	require.NoError(t, err)
	require.Equal(t, []*Seq{running}, got)
	require.Equal(t, 1, c.Stats().PagesCommitted, "one of its units stays cached: it fits")
	_, err = c.SetBudget(16*page, Swap)
	require.NoError(t, err)
	step, err := running.Resume()
	require.NoError(t, err)
	require.Zero(t, step.N, "swapped: identical content, nothing to recompute")
	checkSeq(t, running, seqTokens(600, 0, 200_000), 0, 0, 600)
	require.NoError(t, c.Check())
}

// TestDropResumeRematches: a dropped sequence whose prompt units are
// still cached borrows them again on Resume and recomputes only the rest.
func TestDropResumeRematches(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	c := e.cache(t, microConfig(TokenMajor, 4096, 2))
	p := seqTokens(600, 0, 100_000)
	s := prefill(t, c, p, 0)
	tokens := append(p, 1, 2, 3)
	step, err := s.Append([]int{1, 2, 3})
	require.NoError(t, err)
	writeStep(t, step, tokens, 0)
	require.NoError(t, s.Preempt(Drop))
	require.Equal(t, 2, c.Stats().CachedPages, "its two prompt units stay cached")
	step, err = s.Resume()
	require.NoError(t, err)
	require.Equal(t, 512, s.Matched())
	require.Equal(t, 512, step.Pos)
	require.Equal(t, len(tokens)-512, step.N)
	writeStep(t, step, tokens, 0)
	checkSeq(t, s, tokens, 0, 0, len(tokens))
	require.NoError(t, c.Check())
}

// TestResumeCountsItsLookup: a Resume looks the prompt up again and
// counts it as Admit does — the prompt's whole blocks queried, those
// found hit — so hits never outnumber queries; a Resume the budget
// refuses counts nothing (it changes nothing).
func TestResumeCountsItsLookup(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	c := e.cache(t, microConfig(TokenMajor, 4096, 2))
	p := seqTokens(600, 0, 100_000) // 37 whole blocks; units of 256 tokens
	s := prefill(t, c, p, 0)
	tokens := append(p, 1, 2, 3)
	step, err := s.Append([]int{1, 2, 3})
	require.NoError(t, err)
	writeStep(t, step, tokens, 0)
	st := c.Stats()
	require.Equal(t, [2]int{37, 0}, [2]int{st.PrefixQueries, st.PrefixHits})

	require.NoError(t, s.Preempt(Drop))
	_, err = s.Resume()
	require.NoError(t, err)
	st = c.Stats()
	require.Equal(t, [2]int{74, 32}, [2]int{st.PrefixQueries, st.PrefixHits}, "its two prompt units found again")

	// Its two prompt units fill the budget: they are found, but the third
	// unit has no page.
	require.NoError(t, s.Preempt(Drop))
	_, err = c.SetBudget(2*page, Drop)
	require.NoError(t, err)
	before := c.Stats()
	can, err := s.CanResume(0)
	require.NoError(t, err)
	require.False(t, can)
	_, err = s.Resume()
	require.ErrorIs(t, err, driver.ErrOutOfMemory)
	after := c.Stats()
	// Its plan found the two units and no page for the third: it borrowed
	// nothing, so it gave nothing back.
	require.Equal(t, before.FailedResumes+1, after.FailedResumes)
	after.FailedResumes = before.FailedResumes
	require.Equal(t, before, after, "a refused Resume counts no lookup and calls no arena")
	_, err = c.SetBudget(64*units.MiB, Drop)
	require.NoError(t, err)
	_, err = s.Resume()
	require.NoError(t, err)
	st = c.Stats()
	require.Equal(t, [2]int{111, 64}, [2]int{st.PrefixQueries, st.PrefixHits})
	require.NoError(t, c.Check())
}

// TestConcurrentSharing: goroutines admitting prompts of one family at
// the same time — some finding the others' units published, some making
// their own — append, write and read back their sequences, while another
// warms the pool and clears the free slots' kept units (an engine's
// background work between steps); every byte is as written and the books
// agree. Run it with -race.
func TestConcurrentSharing(t *testing.T) {
	for _, layout := range []Layout{PerLayer, TokenMajor} {
		t.Run(layout.String(), func(t *testing.T) {
			e := hostEnv(t, 256*units.MiB)
			cfg := microConfig(layout, 4096, 6)
			cfg.MapAhead = 64
			c := e.cache(t, cfg)
			errs := make(chan error, 16)
			done := make(chan struct{})
			var wg sync.WaitGroup
			for g := 0; g < 6; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for round := 0; round < 4; round++ {
						prompt := seqTokens(1100+50*g, 1000+30*round, 10_000*(g+1))
						s, err := c.Admit(prompt, uint64(round%2))
						if err != nil {
							errs <- err
							return
						}
						tokens := slices.Clone(prompt)
						step, err := s.Append(prompt[s.Len():])
						if err != nil {
							errs <- err
							return
						}
						writeStep(t, step, tokens, uint64(round%2))
						if err := s.MarkWritten(len(tokens)); err != nil {
							errs <- err
							return
						}
						for i := 0; i < 20; i++ {
							tokens = append(tokens, 90_000+i)
							step, err := s.Append(tokens[len(tokens)-1:])
							if err != nil {
								errs <- err
								return
							}
							writeStep(t, step, tokens, uint64(round%2))
						}
						checkSeq(t, s, tokens, uint64(round%2), 0, len(tokens))
						if err := s.Free(); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			go func() { wg.Wait(); close(done) }()
			background := make(chan error, 1)
			var cleared atomic.Int64
			go func() {
				for {
					select {
					case <-done:
						background <- nil
						return
					default:
					}
					if _, err := c.Warm(64); err != nil {
						background <- err
						return
					}
					n, err := c.ClearKept(8)
					if err != nil {
						background <- err
						return
					}
					cleared.Add(int64(n))
				}
			}()
			bounded(t, "the sequences", func() struct{} { <-done; return struct{}{} })
			require.NoError(t, bounded(t, "the background work", func() error { return <-background }))
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			st := c.Stats()
			require.Positive(t, st.PrefixHits)
			require.NoError(t, c.Check())
			t.Logf("%s: %d hits of %d blocks asked, %d copies, %d kept pages cleared ahead", layout, st.PrefixHits, st.PrefixQueries, st.Copies, cleared.Load())
		})
	}
}

// TestCanAdmitCountsOwnedUnitsUnderShared: the free slot's own pages
// where a prompt's shared units will be mapped are given back at Admit,
// so CanAdmit counts them as room. (It did not: with every slot idle and
// the request fitting the budget exactly, it said no for ever, and a
// server waiting on it stalled.)
func TestCanAdmitCountsOwnedUnitsUnderShared(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	c := e.cache(t, microConfig(TokenMajor, 4096, 1))
	// a's prompt puts its unit 0 (256 tokens) in the store, cached once a
	// is freed; its unit 1 is the slot's own.
	p := seqTokens(300, 0, 100_000)
	a := prefill(t, c, p, 0)
	_, err := a.Append([]int{1})
	require.NoError(t, err)
	require.NoError(t, a.Free())
	// x, unshared, leaves the slot owning units 0 and 1.
	q := seqTokens(10, 0, 200_000)
	x := prefill(t, c, q, 0)
	more := seqTokens(290, 0, 300_000)
	step, err := x.Append(more)
	require.NoError(t, err)
	writeStep(t, step, append(slices.Clone(q), more...), 0)
	require.NoError(t, x.Free())
	st := c.Stats()
	require.Equal(t, 2, st.IdlePages)
	require.Equal(t, 1, st.CachedPages)

	// A prompt sharing unit 0 with a's, 1024 tokens in all (4 pages): the
	// slot's unit 0 goes (the store's is mapped there), unit 1 is kept,
	// and units 2 and 3 take the two pages the budget has then.
	_, err = c.SetBudget(4*page, Swap)
	require.NoError(t, err)
	r := append(slices.Clone(p[:256]), seqTokens(44, 0, 400_000)...)
	ok, err := c.CanAdmit(r, 0, 1024-len(r))
	require.NoError(t, err)
	require.True(t, ok, "the slot's unit 0 is given back for the shared one")
	s, err := c.Admit(r, 0)
	require.NoError(t, err)
	require.Equal(t, 256, s.Matched())
	step, err = s.Append(r[s.Len():])
	require.NoError(t, err)
	writeStep(t, step, r, 0)
	tail := seqTokens(1024-len(r), 0, 500_000)
	step, err = s.Append(tail)
	require.NoError(t, err, "what CanAdmit promised fits")
	all := append(slices.Clone(r), tail...)
	writeStep(t, step, all, 0)
	checkSeq(t, s, all, 0, 0, len(all))
	require.Equal(t, 4, c.Stats().PagesCommitted)
	require.NoError(t, c.Check())
}

// TestCanAdmitCountsSharedUnits: CanAdmit counts a prompt's cached units
// as shared, not as room — and a copy's source is never evicted to make
// room for the copy: without room the match stops at the whole units.
func TestCanAdmitCountsSharedUnits(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	cfg := microConfig(TokenMajor, 4096, 2)
	cfg.Budget = 2 * page
	c := e.cache(t, cfg)
	p := seqTokens(512, 0, 100_000)
	a := prefill(t, c, p, 0)
	require.NoError(t, a.Free())
	require.Equal(t, 2, c.Stats().CachedPages)

	ok, err := c.CanAdmit(append(slices.Clone(p), 1), 0, 0)
	require.NoError(t, err)
	require.False(t, ok, "both units shared, a third page needed, nothing to evict but what it shares")
	ok, err = c.CanAdmit(p, 0, 0)
	require.NoError(t, err)
	require.True(t, ok, "unit 0 shared; unit 1's page comes from evicting the cached unit 1")

	s, err := c.Admit(p, 0)
	require.NoError(t, err)
	require.Equal(t, 256, s.Matched(), "no room to copy unit 1 without evicting its source")
	require.Zero(t, c.Stats().Copies)
	step, err := s.Append(p[256:])
	require.NoError(t, err)
	writeStep(t, step, p, 0)
	checkSeq(t, s, p, 0, 0, len(p))
	require.Equal(t, 1, c.Stats().Evictions)
	require.NoError(t, c.Check())
}
