package kvcache

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/units"
)

// TestWarmUnmapsKeptAheadOnce: Warm unmaps ahead the kept mappings of the
// cached units a commit of its pages would evict, from the LRU list's
// front, and remembers the units it cleared (the clear prefix): a second
// Warm of the same pages unmaps nothing and walks none of them, a larger
// one goes on past them, and the units leaving the list (evicted or
// borrowed again) leave the prefix; the books check after each step.
func TestWarmUnmapsKeptAheadOnce(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	cfg := microConfig(TokenMajor, 4096, 2)
	unit := 256 // tokens of a unit (one page)
	cfg.Budget = uint64(4) * page
	c := e.cache(t, cfg)

	// Two sequences of two whole units each, freed: four kept mappings
	// of four cached units, which fill the budget.
	pa := seqTokens(2*unit, 0, 100000)
	a1 := prefill(t, c, pa, 0)
	a2 := prefill(t, c, seqTokens(2*unit, 0, 300000), 0)
	require.NoError(t, a1.Free())
	require.NoError(t, a2.Free())
	st0 := c.Stats()
	require.Equal(t, 4, st0.KeptUnits)
	require.Equal(t, 4, st0.CachedPages)
	require.Zero(t, c.ps.clearN)
	require.NoError(t, c.Check())

	// Two pages' worth: the two units at the front lose their mappings.
	_, err := c.Warm(2)
	require.NoError(t, err)
	st1 := c.Stats()
	require.Equal(t, st0.KeptDropped+2, st1.KeptDropped)
	require.Equal(t, st0.Decommits+2, st1.Decommits)
	require.Equal(t, 2, c.ps.clearN)
	require.Same(t, c.ps.lru.Front().Next().Next(), c.ps.clearEnd)
	require.NoError(t, c.Check())

	// The same again: nothing to unmap, the cleared units skipped.
	_, err = c.Warm(2)
	require.NoError(t, err)
	st2 := c.Stats()
	require.Equal(t, st1.KeptDropped, st2.KeptDropped)
	require.Equal(t, st1.Decommits, st2.Decommits)
	require.Equal(t, 2, c.ps.clearN)
	require.NoError(t, c.Check())

	// Four pages: the other two go, and the whole list is clear.
	_, err = c.Warm(4)
	require.NoError(t, err)
	st3 := c.Stats()
	require.Equal(t, st2.KeptDropped+2, st3.KeptDropped)
	require.Zero(t, st3.KeptUnits)
	require.Equal(t, 4, c.ps.clearN)
	require.Nil(t, c.ps.clearEnd)
	require.NoError(t, c.Check())

	// a1's prompt again borrows its two units back: they leave the list
	// and its clear prefix.
	s, err := c.Admit(pa, 0)
	require.NoError(t, err)
	require.GreaterOrEqual(t, s.Matched(), unit)
	require.Less(t, c.ps.lru.Len(), 4)
	require.LessOrEqual(t, c.ps.clearN, c.ps.lru.Len(), "a unit that leaves the list leaves its clear prefix; one that comes back (the partly shared unit copied) joins its end")
	require.NoError(t, c.Check())
	require.NoError(t, s.Free())
	require.NoError(t, c.Check())
	require.NoError(t, c.Close())
}
