package kvcache

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/sim"
)

// TestReserveAhead: a reservation commits the pages of a prompt chunk
// ahead (the prompt's whole units in the prefix store), the Append of
// the chunk then makes no driver call and writes the same rows, and the
// reservation takes the free budget, then cached units' pages (evicting
// them, as the Append would), never another running sequence's.
func TestReserveAhead(t *testing.T) {
	e := simEnv(t, 64<<20, page)
	cfg := tinyConfig(TokenMajor, 96, 2) // 4 tokens a page
	cfg.Budget = 12 * page
	c := e.cache(t, cfg)
	drv := e.drv.(*sim.Driver)
	prompt := family(1, 40)
	s, err := c.Admit(prompt, 0)
	require.NoError(t, err)
	got, err := s.Reserve(8)
	require.NoError(t, err)
	require.Equal(t, 8, got)
	require.Equal(t, 0, s.Len(), "a reservation appends nothing")
	st := c.Stats()
	require.Equal(t, 2, st.PagesCommitted)
	require.Equal(t, 2, st.StorePages, "the prompt's whole units go to the store")
	calls := drv.Tally().Total()
	_, err = s.Append(prompt[:8])
	require.NoError(t, err)
	require.Equal(t, calls, drv.Tally().Total(), "the Append of what was reserved makes no driver call")
	require.Zero(t, c.Stats().Waits, "nor waits")
	// The budget's free pages bound it: 10 are left, the rest of the
	// prompt needs 8, the 8 tokens after it 2 more, a third is not free.
	got, err = s.Reserve(32 + 12)
	require.NoError(t, err)
	require.Equal(t, 40, got)
	require.Equal(t, 12, c.Stats().PagesCommitted)
	before := snapBooks(t, c, e)
	got, err = s.Reserve(44)
	require.NoError(t, err)
	require.Equal(t, 40, got, "no room made")
	require.Equal(t, before, snapBooks(t, c, e), "a reservation that fits nothing changes nothing")
	require.NoError(t, c.Check())

	// Cached units go when the free budget is short, least recently used
	// first, as the Append would evict them: once the first sequence is
	// freed (its written units cached, the rest given back to the pool),
	// a second one's reservation takes the free pages (the pool's), then
	// the cached units'.
	require.NoError(t, s.MarkWritten(8))
	require.NoError(t, s.Free())
	s2, err := c.Admit(family(2, 20), 0)
	require.NoError(t, err)
	st0 := c.Stats()
	require.Equal(t, 2, st0.CachedPages)
	got, err = s2.Reserve(60)
	require.NoError(t, err)
	st = c.Stats()
	require.Equal(t, 48, got, "the budget's 12 pages, 4 tokens each")
	require.Equal(t, 12, st.PagesCommitted)
	require.Zero(t, st.PooledPages)
	require.Zero(t, st.CachedPages)
	require.Equal(t, st0.Evictions+2, st.Evictions)
	require.NoError(t, c.Check())
	// Another running sequence's surplus is never taken: a third
	// sequence's reservation finds nothing and changes nothing.
	s3, err := c.Admit(family(3, 8), 0)
	require.NoError(t, err)
	before = snapBooks(t, c, e)
	got, err = s3.Reserve(8)
	require.NoError(t, err)
	require.Zero(t, got)
	require.Equal(t, before, snapBooks(t, c, e), "the second sequence's surplus stays")
	require.NoError(t, c.Check())
	require.NoError(t, s3.Free())
	require.NoError(t, s2.Free())
}

// TestReserveRefusals: a preempted sequence, a negative count and one
// past MaxContext are refused (ErrInvalid), a freed sequence and a closed
// cache too (ErrClosed), each changing no book and making no driver call.
func TestReserveRefusals(t *testing.T) {
	e := simEnv(t, 64<<20, page)
	cfg := tinyConfig(TokenMajor, 32, 2)
	cfg.Budget = 16 * page
	c := e.cache(t, cfg)
	s, err := c.Admit(family(0, 10), 0)
	require.NoError(t, err)
	_, err = s.Append(family(0, 10))
	require.NoError(t, err)
	for _, n := range []int{-1, 23} {
		before := snapBooks(t, c, e)
		_, err := s.Reserve(n)
		requireIs(t, err, driver.ErrInvalid, "reserve")
		require.Equal(t, before, snapBooks(t, c, e))
	}
	got, err := s.Reserve(22)
	require.NoError(t, err)
	require.Equal(t, 22, got, "up to MaxContext")
	require.NoError(t, s.Preempt(Drop))
	before := snapBooks(t, c, e)
	_, err = s.Reserve(1)
	requireIs(t, err, driver.ErrInvalid, "reserve while preempted")
	require.Equal(t, before, snapBooks(t, c, e))
	require.NoError(t, s.Free())
	_, err = s.Reserve(1)
	requireIs(t, err, driver.ErrClosed, "reserve after free")
	require.NoError(t, c.Close())
	_, err = s.Reserve(1)
	requireIs(t, err, driver.ErrClosed, "reserve after close")
	var zero Seq
	_, err = zero.Reserve(1)
	requireIs(t, err, driver.ErrInvalid, "a zero sequence")
}

// TestWarm: Warm creates pool pages up to a count and the free budget, a
// commit then maps them without a create, and a negative count and a
// closed cache are refused, changing nothing.
func TestWarm(t *testing.T) {
	e := simEnv(t, 64<<20, page)
	cfg := tinyConfig(TokenMajor, 96, 2)
	cfg.Budget = 6 * page
	c := e.cache(t, cfg)
	drv := e.drv.(*sim.Driver)
	before := snapBooks(t, c, e)
	_, err := c.Warm(-1)
	requireIs(t, err, driver.ErrInvalid, "warm -1")
	require.Equal(t, before, snapBooks(t, c, e))
	got, err := c.Warm(4)
	require.NoError(t, err)
	require.Equal(t, 4, got)
	require.Equal(t, 4, c.Stats().PooledPages)
	require.Equal(t, uint64(4*page), e.used(t), "warmed pages are committed memory")
	got, err = c.Warm(10)
	require.NoError(t, err)
	require.Equal(t, 6, got, "the budget")
	creates := drv.Tally().Total().Create
	s, err := c.Admit(family(0, 16), 0)
	require.NoError(t, err)
	_, err = s.Append(family(0, 16))
	require.NoError(t, err)
	require.Equal(t, creates, drv.Tally().Total().Create, "the prompt's pages are the pool's: mapped, not created")
	require.Equal(t, 2, c.Stats().PooledPages)
	require.NoError(t, c.Check())
	require.NoError(t, s.Free())
	require.NoError(t, c.Close())
	require.Zero(t, e.used(t))
	_, err = c.Warm(1)
	requireIs(t, err, driver.ErrClosed, "warm after close")
}

// TestReserveBesideMapper: with mapping ahead on, reservations and the
// mapper's commits of the same slot's units agree: a unit in flight ends
// a reservation there, the books check after every call, and what both
// committed comes back at Close (run it with -race).
func TestReserveBesideMapper(t *testing.T) {
	e := hostEnv(t, 64<<20)
	cfg := tinyConfig(TokenMajor, 96, 2)
	cfg.MapAhead = 4
	cfg.Budget = 32 * page
	c := e.cache(t, cfg)
	s, err := c.Admit(family(3, 8), 0)
	require.NoError(t, err)
	_, err = s.Append(family(3, 8))
	require.NoError(t, err)
	for i := range 40 {
		got, err := s.Reserve(min(6, cfg.MaxContext-s.Len()))
		require.NoError(t, err)
		require.LessOrEqual(t, got, 6)
		if s.Len() < cfg.MaxContext {
			_, err = s.Append([]int{90000 + i})
			require.NoError(t, err)
		}
		require.NoError(t, c.Check())
	}
	require.NoError(t, s.Free())
	require.NoError(t, c.Close())
	require.Zero(t, e.used(t))
}
