package kvcache

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// Pages a slot keeps from its previous sequence (deferred reclaim) that
// lie under whole units of the next prompt: those units go to the prefix
// store all the same, the kept page's memory paying for the store unit's.

// run admits prompt, appends and writes what Admit did not match, marks
// it written and frees it, checking the cache after each step; it
// returns how many tokens Admit matched.
func run(t *testing.T, c *Cache, prompt []int) int {
	t.Helper()
	s := prefill(t, c, prompt, 0)
	require.NoError(t, c.Check())
	checkSeq(t, s, prompt, 0, 0, len(prompt))
	matched := s.Matched()
	require.NoError(t, s.Free())
	require.NoError(t, c.Check())
	return matched
}

// TestKeptPagesUnderPromptGoToStore: a one-slot cache keeps a short
// sequence's page at unit 0; the next prompt's whole units are store
// units all the same, so the same prompt again matches all its whole
// units but the one holding its last token.
func TestKeptPagesUnderPromptGoToStore(t *testing.T) {
	for _, tc := range []struct {
		layout       Layout
		prompt, want int
	}{
		{TokenMajor, 40, 36}, // 4 tokens a unit: units 0-8, the last token's unit left to compute
		{PerLayer, 70, 64},   // 32 tokens a unit: units 0 and 1
	} {
		t.Run(tc.layout.String(), func(t *testing.T) {
			e := hostEnv(t, 64*units.MiB)
			c := e.cache(t, tinyConfig(tc.layout, 96, 1))
			require.Zero(t, run(t, c, []int{7}))
			require.Equal(t, c.g.unitPages(), c.Stats().IdlePages, "the slot keeps its page at unit 0")

			prompt := seqTokens(tc.prompt, tc.prompt, 0)
			require.Zero(t, run(t, c, prompt))
			st := c.Stats()
			_, per := c.g.unitTokens(0)
			whole := tc.prompt / per
			require.Equal(t, whole*c.g.unitPages(), st.CachedPages, "every whole unit of the prompt is in the store")
			require.Equal(t, (c.g.unitsFor(tc.prompt)-whole)*c.g.unitPages(), st.IdlePages, "the slot keeps only the unit past them")

			require.Equal(t, tc.want, run(t, c, prompt), "the same prompt again")
			require.NoError(t, c.Close())
			require.Zero(t, e.used(t))
		})
	}
}

// keptCache is a one-slot TokenMajor tiny cache of budget pages whose
// slot keeps 10 units (40 tokens) a sequence with the prompt [7] left,
// none of them the store's.
func keptCache(t *testing.T, budget int) (*env, *Cache) {
	t.Helper()
	e := hostEnv(t, 64*units.MiB)
	cfg := tinyConfig(TokenMajor, 96, 1)
	cfg.Budget = uint64(budget) * page
	c := e.cache(t, cfg)
	s, err := c.Admit([]int{7}, 0)
	require.NoError(t, err)
	_, err = s.Append(append([]int{7}, seqTokens(39, 0, 100)...))
	require.NoError(t, err)
	require.NoError(t, s.MarkWritten(s.Len()))
	require.NoError(t, s.Free())
	st := c.Stats()
	require.Equal(t, 10, st.IdlePages)
	require.Zero(t, st.StorePages)
	return e, c
}

// TestKeptPagesPayForStoreUnits: at a full budget, a prompt whose whole
// units all lie on kept pages needs no room: each kept page is given back
// for its store unit, committed memory never past the budget.
func TestKeptPagesPayForStoreUnits(t *testing.T) {
	e, c := keptCache(t, 10)
	prompt := seqTokens(40, 40, 0)
	s, err := c.Admit(prompt, 0)
	require.NoError(t, err)
	step, err := s.Append(prompt)
	require.NoError(t, err, "the kept pages are the room")
	writeStep(t, step, prompt, 0)
	st := c.Stats()
	require.Equal(t, 10, st.PagesCommitted)
	require.Equal(t, 10, st.StorePages, "every whole unit of the prompt is the store's")
	require.Zero(t, st.SlotPages)
	require.Equal(t, 10, st.ReclaimedPages)
	require.Equal(t, uint64(10)*page, e.used(t))
	require.NoError(t, c.Check())
	checkSeq(t, s, prompt, 0, 0, len(prompt))
	require.NoError(t, s.MarkWritten(s.Len()))
	require.NoError(t, s.Free())

	again, err := c.Admit(prompt, 0)
	require.NoError(t, err)
	require.Equal(t, 36, again.Matched())
	checkSeq(t, again, prompt, 0, 0, again.Len())
	require.NoError(t, again.Free())
	require.NoError(t, c.Check())
}

// TestKeptPagesRefusedAppendChangesNothing: a prompt of 12 whole units on
// 10 kept pages needs 2 more pages, which a full budget refuses — at
// Admit, whose plan counts the kept pages, and at an Append once the
// budget is lowered under the admitted sequence: the kept pages are still
// the slot's, nothing else changed.
func TestKeptPagesRefusedAppendChangesNothing(t *testing.T) {
	e, c := keptCache(t, 10)
	prompt := seqTokens(48, 48, 0)
	fits, err := c.CanAdmit(prompt, 0, 0)
	require.NoError(t, err)
	require.False(t, fits)
	fits, err = c.CanAdmit(prompt[:40], 0, 0)
	require.NoError(t, err)
	require.True(t, fits, "10 whole units on the 10 kept pages")
	before := c.Stats()
	_, err = c.Admit(prompt, 0)
	requireIs(t, err, driver.ErrOutOfMemory, "admit")
	after := c.Stats()
	require.Equal(t, before.FailedAdmits+1, after.FailedAdmits)
	after.FailedAdmits = before.FailedAdmits
	require.Equal(t, before, after)

	_, err = c.SetBudget(12*page, Drop)
	require.NoError(t, err)
	s, err := c.Admit(prompt, 0)
	require.NoError(t, err)
	_, err = c.SetBudget(10*page, Drop)
	require.NoError(t, err)
	before = c.Stats()
	require.Equal(t, 10, before.SurplusPages)
	_, err = s.Append(prompt)
	requireIs(t, err, driver.ErrOutOfMemory, "append")
	require.Equal(t, before, c.Stats())
	require.Equal(t, uint64(10)*page, e.used(t))
	require.NoError(t, c.Check())

	// Room for the two: the kept pages go to the store with them.
	_, err = c.SetBudget(12*page, Drop)
	require.NoError(t, err)
	step, err := s.Append(prompt)
	require.NoError(t, err)
	writeStep(t, step, prompt, 0)
	st := c.Stats()
	require.Equal(t, 12, st.StorePages)
	require.Zero(t, st.SlotPages)
	require.NoError(t, c.Check())
	checkSeq(t, s, prompt, 0, 0, len(prompt))
	require.NoError(t, s.Free())
}

// TestKeptPagesWithMappingAhead: token by token, with the mapper on, the
// kept pages at the prompt's whole units become store units as the
// appends reach them, those past the prompt serve the generated tokens as
// the slot's own, and the mapper commits only past them.
func TestKeptPagesWithMappingAhead(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	cfg := tinyConfig(TokenMajor, 96, 1)
	cfg.MapAhead = 8
	c := e.cache(t, cfg)
	first := append([]int{7}, seqTokens(59, 0, 100)...) // 15 units, all the slot's own
	s, err := c.Admit(first[:1], 0)
	require.NoError(t, err)
	for _, tok := range first {
		_, err := s.Append([]int{tok})
		require.NoError(t, err)
	}
	require.NoError(t, s.Free())
	bounded(t, "mapper idle", func() struct{} { c.waitMapperIdle(); return struct{}{} })
	st := c.Stats()
	require.GreaterOrEqual(t, st.IdlePages, 15, "15 units, and those mapped ahead")

	prompt := seqTokens(40, 40, 0)
	s, err = c.Admit(prompt, 0)
	require.NoError(t, err)
	all := slices.Clone(prompt)
	for i := 0; i < 64; i++ {
		tok := 500 + i
		if i < len(prompt) {
			tok = prompt[i]
		} else {
			all = append(all, tok)
		}
		require.NoError(t, s.MarkWritten(s.Len()))
		step, err := s.Append([]int{tok})
		require.NoError(t, err)
		writeStep(t, step, all, 0)
		require.NoError(t, c.Check())
	}
	bounded(t, "mapper idle", func() struct{} { c.waitMapperIdle(); return struct{}{} })
	st = c.Stats()
	require.Equal(t, 10, st.StorePages, "the prompt's 10 units are the store's")
	require.GreaterOrEqual(t, st.SlotPages, 6, "units 10 to 15 the slot's own (kept), and those mapped ahead")
	checkSeq(t, s, all, 0, 0, len(all))
	require.NoError(t, s.Free())
	require.NoError(t, c.Close())
	require.Zero(t, e.used(t))
}
