package kvcache

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver/sim"
)

// TestPagePool: pages a preemption gives back stay committed in the page
// pool and the next sequence's commits map them — no driver create, no
// release — within the budget; a lowered budget trims the pool, and Close
// releases it.
func TestPagePool(t *testing.T) {
	for _, layout := range []Layout{PerLayer, TokenMajor} {
		t.Run(layout.String(), func(t *testing.T) {
			e := simEnv(t, 64<<20, page)
			drv := e.drv.(*sim.Driver)
			cfg := tinyConfig(layout, 256, 4)
			cfg.Budget = 256 * page
			c := e.cache(t, cfg)
			calls := func() sim.Calls { return drv.Tally().Total() }
			a, err := c.Admit(family(0, 100), 0)
			require.NoError(t, err)
			_, err = a.Append(family(0, 100))
			require.NoError(t, err)
			held := c.Stats().PagesCommitted
			t0 := calls()
			require.NoError(t, a.Preempt(Drop))
			t1 := calls()
			require.Zero(t, t1.Sub(t0).Release, "nothing released")
			st := c.Stats()
			require.Zero(t, st.PagesCommitted)
			require.Equal(t, held, st.PooledPages)
			require.Equal(t, uint64(held)*page, e.used(t))
			b, err := c.Admit(family(1, 100), 0)
			require.NoError(t, err)
			_, err = b.Append(family(1, 100))
			require.NoError(t, err)
			t2 := calls()
			require.Zero(t, t2.Sub(t1).Create, "every page the pool's")
			st = c.Stats()
			require.Zero(t, t2.Sub(t1).Release)
			require.Equal(t, held-st.PagesCommitted, st.PooledPages)
			held = st.PagesCommitted + st.PooledPages
			require.NoError(t, c.Check())
			// A lowered budget: b's pages fit, the pool trims to what is
			// left beside them.
			require.NoError(t, b.Preempt(Drop))
			require.Equal(t, held, c.Stats().PooledPages)
			_, err = c.SetBudget(uint64(held/2)*page, Drop)
			require.NoError(t, err)
			require.Equal(t, held/2, c.Stats().PooledPages)
			require.Equal(t, uint64(held/2)*page, e.used(t))
			require.NoError(t, c.Check())
			require.NoError(t, a.Free())
			require.NoError(t, b.Free())
			require.NoError(t, c.Close())
			require.Zero(t, e.used(t), "Close released the pool")
		})
	}
}

// TestMultiPageUnitsPoolWhole: a token-major token larger than a page is
// a unit of several pages, which the slots and the prefix store both
// commit as one chunk, so the pool they share holds chunks of one size:
// Warm creates whole units, and sequences that come and go — their
// prompts cached in the store, evicted for the next — map the pool's
// chunks over and over, creating and releasing none (a pool of pages
// beside a store of units had to release pages to create units, and the
// other way round).
func TestMultiPageUnitsPoolWhole(t *testing.T) {
	e := hostEnv(t, 64<<20) // real bytes: the units read back what was written
	cfg := tinyConfig(TokenMajor, 64, 2)
	cfg.HeadDim = 384 // 96 KiB a token: a unit of two pages
	const units = 24
	cfg.Budget = 2 * units * page
	c := e.cache(t, cfg)
	require.Equal(t, uint64(2*page), c.g.unitBytes)

	got, err := c.Warm(2*units - 1) // rounds up to whole units
	require.NoError(t, err)
	require.Equal(t, 2*units, got)
	p0 := c.pool.Stats()
	require.Equal(t, units, p0.Filled, "one create a unit, not a page")
	require.Equal(t, units, p0.Chunks)
	require.NoError(t, c.Check())

	for i := range 12 {
		prompt := family(i, 10) // 10 units, cached at Free; the next evicts them
		s := prefill(t, c, prompt, 0)
		checkSeq(t, s, prompt, 0, 0, len(prompt))
		require.NoError(t, s.Free())
		require.NoError(t, c.Check())
		st := c.Stats()
		require.Equal(t, 2*units, st.PagesCommitted+st.PooledPages, "the budget stays whole")
		require.Equal(t, uint64(2*units)*page, e.used(t))
	}
	p1 := c.pool.Stats()
	require.Equal(t, units, p1.Filled, "every chunk the pool's: none created")
	require.Zero(t, p1.Released, "none released to make a chunk of another size")
	require.Positive(t, p1.Reused)
	require.NoError(t, c.Close())
	require.Zero(t, e.used(t))
}

// TestWarmHugeCount: Warm of a count near math.MaxInt (a caller asking
// for all it can), in units of several pages, fills the pool to the free
// budget, as a count of the budget's pages does; a later Admit and Append
// take their pages from it.
func TestWarmHugeCount(t *testing.T) {
	for _, pages := range []int{math.MaxInt, math.MaxInt - 1} {
		e := hostEnv(t, 64<<20)
		cfg := tinyConfig(TokenMajor, 64, 2)
		cfg.HeadDim = 384 // 96 KiB a token: a unit of two pages
		cfg.Budget = 16 * page
		c := e.cache(t, cfg)
		require.Equal(t, uint64(2*page), c.g.unitBytes)
		got, err := c.Warm(pages)
		require.NoError(t, err)
		require.Equal(t, 16, got, "Warm(%d): the whole free budget", pages)
		require.Equal(t, 16, c.Stats().PooledPages)
		require.NoError(t, c.Check())
		s := prefill(t, c, family(0, 3), 0)
		require.Equal(t, 3, s.Len())
		require.Equal(t, 16, c.Stats().PagesCommitted+c.Stats().PooledPages)
		require.NoError(t, c.Check())
	}
}
