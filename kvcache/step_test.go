package kvcache

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
)

// step is the model's Cache.Step: o picks up to four running sequences
// (from o.seq on), each appending 1 to 3 tokens (a prefill's rest, for
// one still in its prompt, when o.n says so); with o.n%16 == 15 a
// preempted sequence joins and the step is refused. The model refuses the
// step, changing nothing, when the batch's empty units need more pages
// than the free ones and those that can be given back (idle, cached, and
// surplus beyond the batch's own units); otherwise it backs each
// sequence's units in slot order, as one Append each would. It reports
// whether the step went through, and whether it was refused for memory.
func (m *model) step(t *testing.T, c *Cache, o op, fresh *int, maxCtx int, onSim bool, step string) (ok, oom bool) {
	var batch []*mseq
	var bad *mseq
	for k := range m.seqs {
		s := m.seqs[(o.seq+k)%len(m.seqs)]
		switch {
		case s.preempted != 0:
			if bad == nil && o.n%16 == 15 {
				bad = s
			}
		case len(batch) < 1+o.n%4:
			batch = append(batch, s)
		}
	}
	if bad != nil {
		batch = append(batch, bad)
	}
	if len(batch) == 0 {
		return false, false
	}
	reqs := make([]StepRequest, len(batch))
	tooLong := false
	for k, s := range batch {
		have := len(s.tokens)
		cnt := 1 + (o.n/4+k)%3
		if o.n/64 == 1 && have < len(s.prompt) {
			cnt = len(s.prompt) - have
		}
		more := s.next(have, cnt, fresh)
		tooLong = tooLong || have+cnt > maxCtx
		if s.preempted == 0 {
			require.NoError(t, s.real.MarkWritten(have), step)
			m.publish(s, have)
		}
		reqs[k] = StepRequest{Seq: s.real, Tokens: more, Views: !onSim}
	}
	got, err := c.Step(reqs, nil)
	step += fmt.Sprintf(" (a step of %d sequences)", len(batch))
	if bad != nil || tooLong {
		requireIs(t, err, driver.ErrInvalid, step)
		return false, false
	}
	// Slot order, and the room each needs.
	order := slices.Clone(batch)
	slices.SortFunc(order, func(a, b *mseq) int { return a.slot - b.slot })
	total, reserved := 0, 0
	for _, s := range order {
		sl := m.slots[s.slot]
		from, need := m.g.unitsFor(len(s.tokens)), m.g.unitsFor(len(s.tokens)+len(reqs[slices.Index(batch, s)].Tokens))
		for u := from; u < need; u++ {
			switch {
			case sl.owned[u]:
				reserved++
			case sl.borrowed[u] == nil:
				total += m.up()
			}
		}
		if _, mu := m.cowUnit(s); mu != nil && mu.refs > 1 {
			total += m.up() // its copy on write
		}
	}
	can := m.free() + len(m.lru)*m.up()
	for _, sl := range m.slots {
		switch {
		case sl.seq == nil:
			can += m.ownedFrom(sl, 0) * m.up()
		default:
			can += m.ownedFrom(sl, m.surplusFrom(sl, nil, 0)) * m.up()
		}
	}
	can -= reserved * m.up()
	if total > m.free() && total > can {
		requireIs(t, err, driver.ErrOutOfMemory, step)
		require.Nil(t, got, step)
		return false, true
	}
	require.NoError(t, err, step)
	require.Len(t, got, len(batch), step)
	for _, s := range order {
		k := slices.Index(batch, s)
		have := len(s.tokens)
		require.True(t, m.cow(s, m.g.unitsFor(have+len(reqs[k].Tokens))), "%s: the model cannot copy on write what the step did", step)
		_, fits := m.back(s, m.g.unitsFor(have+len(reqs[k].Tokens)))
		require.True(t, fits, "%s: the model cannot back what the step did", step)
		s.tokens = append(s.tokens, reqs[k].Tokens...)
		r := got[k]
		require.Same(t, s.real, r.Seq, step)
		require.Equal(t, len(s.tokens), r.Len, step)
		require.Equal(t, have, r.Pos, step)
		require.Equal(t, len(reqs[k].Tokens), r.N, step)
		require.Equal(t, c.Base()+driver.Addr(uint64(s.slot)*c.SlotBytes()), r.Base, step)
		if !onSim {
			require.Len(t, r.Layers, c.cfg.Layers, step)
			writeStep(t, r.Step, s.tokens, s.extra)
		} else {
			require.Nil(t, r.Layers, step)
		}
	}
	return true, false
}

// TestStepIsAppends: a step of every running sequence leaves the same
// bytes and books as one Append each, in either layout, with prompts that
// share a prefix (borrowed units) and decode steps that cross units.
func TestStepIsAppends(t *testing.T) {
	for _, layout := range []Layout{PerLayer, TokenMajor} {
		t.Run(layout.String(), func(t *testing.T) {
			cfg := tinyConfig(layout, 96, 4)
			cfg.Budget = 40 * page
			if layout == PerLayer {
				cfg.Budget = 200 * page // units of 8 pages
			}
			run := func(useStep bool) (Stats, [][]int) {
				e := hostEnv(t, 64<<20)
				c := e.cache(t, cfg)
				var seqs []*Seq
				var toks [][]int
				for i := range 4 {
					prompt := family(0, 20+i) // a shared prefix
					s, err := c.Admit(prompt, 0)
					require.NoError(t, err)
					got, err := s.Append(prompt[s.Len():])
					require.NoError(t, err)
					writeStep(t, got, prompt, 0)
					require.NoError(t, s.MarkWritten(s.Len()))
					seqs = append(seqs, s)
					toks = append(toks, slices.Clone(prompt))
				}
				next := 70_000
				for range 30 {
					reqs := make([]StepRequest, len(seqs))
					for k := len(seqs) - 1; k >= 0; k-- { // not slot order
						reqs[k] = StepRequest{Seq: seqs[k], Tokens: []int{next}, Views: true}
						toks[k] = append(toks[k], next)
						next++
					}
					if useStep {
						got, err := c.Step(reqs, nil)
						require.NoError(t, err)
						for k, r := range got {
							writeStep(t, r.Step, toks[k], 0)
						}
					} else {
						for k, r := range reqs {
							got, err := r.Seq.Append(r.Tokens)
							require.NoError(t, err)
							writeStep(t, got, toks[k], 0)
						}
					}
					for k, s := range seqs {
						require.NoError(t, s.MarkWritten(len(toks[k])))
					}
				}
				for k, s := range seqs {
					checkSeq(t, s, toks[k], 0, 0, len(toks[k]))
				}
				require.NoError(t, c.Check())
				st := c.Stats()
				for _, s := range seqs {
					require.NoError(t, s.Free())
				}
				require.NoError(t, c.Close())
				return st, toks
			}
			want, _ := run(false)
			got, _ := run(true)
			require.Equal(t, want, got)
		})
	}
}

// TestStepRefusals: every bad batch is refused with its error and leaves
// the cache as it was.
func TestStepRefusals(t *testing.T) {
	e := hostEnv(t, 64<<20)
	cfg := tinyConfig(TokenMajor, 32, 4)
	cfg.Budget = 8 * page
	c := e.cache(t, cfg)
	other := hostEnv(t, 64<<20).cache(t, cfg)
	a, err := c.Admit(family(0, 3), 0)
	require.NoError(t, err)
	_, err = a.Append(family(0, 3))
	require.NoError(t, err)
	b, err := c.Admit(family(1, 3), 0)
	require.NoError(t, err)
	_, err = b.Append(family(1, 3))
	require.NoError(t, err)
	p, err := c.Admit(family(2, 3), 0)
	require.NoError(t, err)
	_, err = p.Append(family(2, 3))
	require.NoError(t, err)
	require.NoError(t, p.Preempt(Drop))
	o, err := other.Admit(family(0, 2), 0)
	require.NoError(t, err)
	before := c.Stats()
	lens := []int{a.Len(), b.Len(), p.Len()}
	for _, tc := range []struct {
		name  string
		batch []StepRequest
		want  error
	}{
		{"nil sequence", []StepRequest{{Seq: a, Tokens: []int{1}}, {Tokens: []int{1}}}, driver.ErrInvalid},
		{"another cache's", []StepRequest{{Seq: a, Tokens: []int{1}}, {Seq: o, Tokens: []int{1}}}, driver.ErrInvalid},
		{"twice", []StepRequest{{Seq: a, Tokens: []int{1}}, {Seq: a, Tokens: []int{2}}}, driver.ErrInvalid},
		{"preempted", []StepRequest{{Seq: a, Tokens: []int{1}}, {Seq: p, Tokens: []int{1}}}, driver.ErrInvalid},
		{"no tokens", []StepRequest{{Seq: a, Tokens: []int{1}}, {Seq: b}}, driver.ErrInvalid},
		{"negative token", []StepRequest{{Seq: a, Tokens: []int{1}}, {Seq: b, Tokens: []int{-1}}}, driver.ErrInvalid},
		{"past MaxContext", []StepRequest{{Seq: a, Tokens: []int{1}}, {Seq: b, Tokens: make([]int, 30)}}, driver.ErrInvalid},
		// 8 pages: a and b hold one each, p none; 6 free. a wants 4 more
		// pages (16 tokens), b 4: the second does not fit.
		{"out of memory", []StepRequest{{Seq: a, Tokens: make([]int, 16)}, {Seq: b, Tokens: make([]int, 16)}}, driver.ErrOutOfMemory},
	} {
		got, err := c.Step(tc.batch, nil)
		requireIs(t, err, tc.want, tc.name)
		require.Nil(t, got, tc.name)
		require.Equal(t, before, c.Stats(), tc.name)
		require.Equal(t, lens, []int{a.Len(), b.Len(), p.Len()}, tc.name)
		require.NoError(t, c.Check(), tc.name)
	}
	_, err = c.Step([]StepRequest{{Seq: a, Tokens: make([]int, 16)}, {Seq: b, Tokens: make([]int, 16)}}, nil)
	require.ErrorContains(t, err, fmt.Sprintf("the sequence in slot %d (request 1", b.Slot()), "the error names the sequence past the budget")
	got, err := c.Step(nil, nil)
	require.NoError(t, err, "a step of nothing")
	require.Empty(t, got)
	require.Equal(t, before, c.Stats())
	require.NoError(t, c.Close())
	_, err = c.Step([]StepRequest{{Seq: a, Tokens: []int{1}}}, nil)
	requireIs(t, err, driver.ErrClosed, "closed")
	_, err = (*Cache)(nil).Step(nil, nil)
	requireIs(t, err, driver.ErrInvalid, "nil cache")
}

// TestStepMapAhead: steps of sequences whose next units the mapper
// commits (or is committing): each step waits for what is in flight, the
// books stay whole, and with the mapper ahead most steps commit nothing.
func TestStepMapAhead(t *testing.T) {
	for _, layout := range []Layout{PerLayer, TokenMajor} {
		t.Run(layout.String(), func(t *testing.T) {
			e := hostEnv(t, 64<<20)
			cfg := tinyConfig(layout, 256, 8)
			cfg.MapAhead = 8
			c := e.cache(t, cfg)
			var seqs []*Seq
			var toks [][]int
			for i := range 8 {
				prompt := family(i, 5)
				s, err := c.Admit(prompt, 0)
				require.NoError(t, err)
				got, err := s.Append(prompt[s.Len():])
				require.NoError(t, err)
				writeStep(t, got, prompt, 0)
				seqs = append(seqs, s)
				toks = append(toks, slices.Clone(prompt))
			}
			next := 90_000
			for range 200 {
				reqs := make([]StepRequest, len(seqs))
				for k, s := range seqs {
					reqs[k] = StepRequest{Seq: s, Tokens: []int{next}, Views: true}
					toks[k] = append(toks[k], next)
					next++
				}
				got, err := c.Step(reqs, nil)
				require.NoError(t, err)
				for k, r := range got {
					writeStep(t, r.Step, toks[k], 0)
				}
			}
			require.NoError(t, c.Check())
			for k, s := range seqs {
				checkSeq(t, s, toks[k], 0, 0, len(toks[k]))
			}
			st := c.Stats()
			require.Equal(t, 8*200+8, st.Steps)
			require.Positive(t, st.MapperCommits)
			t.Logf("steps %d, waits %d, mapper commits %d", st.Steps, st.Waits, st.MapperCommits)
			require.NoError(t, c.Close())
		})
	}
}

// TestRefusedStepKeepsTensors: a Step refused for a bad request (no
// tokens, a negative token, a preempted sequence) is refused before it
// touches any other request's sequence, as Append is: the tensors handed
// out for a window sequence whose step would release the units behind
// its window still read after the refusal, and the books are as before.
// A valid step of the same sequences follows.
func TestRefusedStepKeepsTensors(t *testing.T) {
	e := hostEnv(t, 64<<20)
	cfg := tinyConfig(PerLayer, 256, 4)
	cfg.Window = 4
	c := e.cache(t, cfg)
	w := prefill(t, c, family(0, 40), 0) // 32 tokens a page: the next step releases unit 0
	require.True(t, c.releasePendingLocked(w))
	b := prefill(t, c, family(1, 3), 0)
	p := prefill(t, c, family(2, 3), 0)
	require.NoError(t, p.Preempt(Drop))
	k, err := w.K(0)
	require.NoError(t, err)
	read := func() error { _, err := k.At(w.Len()-1, 0, 0); return err }
	require.NoError(t, read())
	before := c.Stats()
	for _, tc := range []struct {
		name  string
		batch []StepRequest
	}{
		{"no tokens", []StepRequest{{Seq: w, Tokens: []int{1}}, {Seq: b}}},
		{"negative token", []StepRequest{{Seq: w, Tokens: []int{1}}, {Seq: b, Tokens: []int{-1}}}},
		{"preempted", []StepRequest{{Seq: w, Tokens: []int{1}}, {Seq: p, Tokens: []int{1}}}},
	} {
		_, err := c.Step(tc.batch, nil)
		drivertest.RequireIs(t, err, driver.ErrInvalid, "kvcache: step of 2 sequences: request 1")
		require.NoError(t, read(), "%s: the window sequence's tensor still reads", tc.name)
		require.Equal(t, before, c.Stats(), tc.name)
		require.NoError(t, c.Check(), tc.name)
	}
	_, err = c.Step([]StepRequest{{Seq: w, Tokens: []int{1}}, {Seq: b, Tokens: []int{1}}}, nil)
	require.NoError(t, err)
	require.Equal(t, 41, w.Len())
	require.NoError(t, c.Check())
}
