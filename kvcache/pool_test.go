package kvcache

import (
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
