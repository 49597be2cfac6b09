package kvcache

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/units"
)

// TestHybridWarm: Warm fills every attention group's pool with a chunk's
// pages, so that the admission of a chunk of that many tokens creates
// nothing; a window group's pool keeps them across the decodes that
// release behind its window (and lets them go once Warm asks for none);
// a short budget warms what is free and no more; its refusals change
// nothing.
func TestHybridWarm(t *testing.T) {
	e := simEnv(t, 64*units.MiB, page)
	drv := e.drv.(*sim.Driver)
	cfg := tinyHybrid(256, 4, 24*units.MiB)
	cfg.Groups[1].Window = 32
	cfg.Groups = cfg.Groups[:3] // a recurrent state is committed at Admit, not warmed
	h := e.hybrid(t, cfg)
	pooled := func() (n int) {
		for _, g := range h.Stats().Groups {
			n += g.PooledPages
		}
		return n
	}
	a := hybridPrefill(t, h, seqTokens(100, 0, 1))

	bytes, err := h.Warm(128)
	require.NoError(t, err)
	require.Positive(t, bytes)
	require.Equal(t, uint64(pooled())*page, bytes)
	require.NoError(t, h.Check())
	warmed := pooled()

	// A decode (within its last units in every group) bounds the window
	// group's pool: to the warmed pages, not to a decode's.
	_, err = a.Append([]int{5000})
	require.NoError(t, err)
	require.Equal(t, warmed, pooled(), "the decode keeps the warmed pages")

	creates := drv.Calls().Create
	b, err := h.Admit(seqTokens(128, 0, 2))
	require.NoError(t, err)
	_, err = b.Append(seqTokens(128, 0, 2))
	require.NoError(t, err)
	require.Equal(t, creates, drv.Calls().Create, "the admission's chunk maps warmed pages, creating none")
	require.NoError(t, h.Check())

	// Warm(0) asks for none: the window group's pool goes back to a
	// decode's pages at its next Append.
	_, err = h.Warm(64)
	require.NoError(t, err)
	high := h.Stats().Groups[1].PooledPages
	_, err = h.Warm(0)
	require.NoError(t, err)
	_, err = a.Append([]int{7000})
	require.NoError(t, err)
	require.Less(t, h.Stats().Groups[1].PooledPages, high)
	require.NoError(t, h.Check())

	// A budget of a few free pages warms those only.
	st := h.Stats()
	_, err = h.SetBudget(st.Committed+3*page, Drop)
	require.NoError(t, err)
	before := pooled()
	_, err = h.Warm(200)
	require.NoError(t, err)
	st = h.Stats()
	require.LessOrEqual(t, st.Committed, st.Budget)
	require.LessOrEqual(t, pooled()-before, 3)
	require.NoError(t, h.Check())

	// Refusals change nothing.
	for _, n := range []int{-1, cfg.MaxContext + 1} {
		_, err := h.Warm(n)
		drivertest.RequireIs(t, err, driver.ErrInvalid)
		require.Equal(t, st, h.Stats())
	}
	require.NoError(t, a.Free())
	require.NoError(t, b.Free())
	require.NoError(t, h.Close())
	_, err = h.Warm(1)
	drivertest.RequireIs(t, err, driver.ErrClosed)
	require.Zero(t, e.used(t))
}

// TestHybridWarmDeviceFull: a create the device refuses ends Warm with
// the error (ErrOutOfMemory), the pages created before it kept in the
// pools and the books as they should be; the sequences are untouched.
func TestHybridWarmDeviceFull(t *testing.T) {
	e := simEnv(t, 8*page, page)
	cfg := tinyHybrid(256, 4, 64*page) // a budget past the device's 8 pages
	cfg.Groups = cfg.Groups[:1]
	h := e.hybrid(t, cfg)
	s := hybridPrefill(t, h, seqTokens(40, 0, 1))
	before := h.Stats().Groups[0]
	pooled, err := h.Warm(256)
	drivertest.RequireIs(t, err, driver.ErrOutOfMemory)
	st := h.Stats()
	require.Equal(t, uint64(st.Groups[0].PooledPages)*page, pooled, "what was created before the refusal is kept")
	require.Positive(t, pooled)
	require.Equal(t, before.PagesCommitted, st.Groups[0].PagesCommitted, "the sequence's pages as they were")
	require.LessOrEqual(t, st.Committed, 8*page)
	require.Equal(t, 40, s.Len())
	require.NoError(t, h.Check())
	require.NoError(t, s.Free())
}

// TestHybridWarmAtMost: WarmAtMost creates at most the pages it is
// given, shared among the groups by what each lacks, and the next call
// goes on from there to what Warm would have made; a negative bound is
// none.
func TestHybridWarmAtMost(t *testing.T) {
	e := simEnv(t, 64*units.MiB, page)
	drv := e.drv.(*sim.Driver)
	cfg := tinyHybrid(256, 4, 24*units.MiB)
	cfg.Groups = cfg.Groups[:2]
	h := e.hybrid(t, cfg)
	pooled := func() (n int) {
		for _, g := range h.Stats().Groups {
			n += g.PooledPages
		}
		return n
	}
	creates := drv.Calls().Create
	_, err := h.WarmAtMost(128, 1)
	require.NoError(t, err)
	require.Equal(t, 1, pooled())
	require.Equal(t, creates+1, drv.Calls().Create)
	_, err = h.WarmAtMost(128, 0)
	require.NoError(t, err)
	require.Equal(t, 1, pooled(), "a bound of none creates none")
	require.Equal(t, creates+1, drv.Calls().Create)

	e2 := simEnv(t, 64*units.MiB, page)
	whole := e2.hybrid(t, cfg)
	_, err = whole.Warm(128)
	require.NoError(t, err)
	var want int
	for _, g := range whole.Stats().Groups {
		want += g.PooledPages
	}
	require.Greater(t, want, 2)
	_, err = h.WarmAtMost(128, -1)
	require.NoError(t, err)
	require.Equal(t, want, pooled(), "no bound: what Warm makes")
	require.NoError(t, h.Check())
}

// TestHybridWarmBudget: WarmBudget fills the groups' pools with the free
// budget, shared by the bytes a token keeps in each (the full and latent
// groups here), a window group's share at most its slots' windows, the
// rest to the others; a bound on the pages is kept; the window group's
// pool keeps its share across the decodes that release behind its
// window; the next admissions create nothing; on a closed cache it is
// ErrClosed.
func TestHybridWarmBudget(t *testing.T) {
	e := simEnv(t, 64*units.MiB, page)
	drv := e.drv.(*sim.Driver)
	cfg := tinyHybrid(256, 4, 24*units.MiB)
	cfg.Groups[1].Window = 32
	cfg.Groups = cfg.Groups[:3]
	h := e.hybrid(t, cfg)

	_, err := h.WarmBudget(10)
	require.NoError(t, err)
	st := h.Stats()
	n := 0
	for _, g := range st.Groups {
		n += g.PooledPages
	}
	require.Equal(t, 10, n, "at most the pages asked for")

	bytes, err := h.WarmBudget(-1)
	require.NoError(t, err)
	st = h.Stats()
	require.Equal(t, bytes, st.Committed, "every committed page is pooled")
	require.Greater(t, st.Committed+page*uint64(len(st.Groups)), st.Budget, "the budget is filled, within a unit a group")
	full, window, latent := st.Groups[0].PooledPages, st.Groups[1].PooledPages, st.Groups[2].PooledPages
	wc := h.groups[1].c
	capped := wc.cfg.MaxSeqs * (wc.g.unitsFor(wc.cfg.Window) + 1) * wc.g.unitPages()
	require.LessOrEqual(t, window, capped, "a window group's share is at most its windows'")
	require.Positive(t, window)
	// A token keeps a key and a value of 2*64 floats in each of the full
	// group's 2 layers (2,048 bytes), a latent vector of 96 floats in each
	// of the latent group's (768 bytes): 8:3, within the rounding to units.
	require.InDelta(t, 8.0/3.0, float64(full)/float64(latent), 0.05)
	require.NoError(t, h.Check())

	creates := drv.Calls().Create
	a := hybridPrefill(t, h, seqTokens(100, 0, 1))
	for i := range 40 { // past the window: its units behind go back
		_, err = a.Append([]int{5000 + i})
		require.NoError(t, err)
	}
	require.Equal(t, creates, drv.Calls().Create, "the prefill and the decodes map pooled pages, creating none")
	require.Equal(t, uint64(0), drv.Calls().Release, "the window group's pool keeps what its window gives back")
	require.NoError(t, h.Check())
	require.NoError(t, a.Free())
	require.NoError(t, h.Close())
	_, err = h.WarmBudget(-1)
	drivertest.RequireIs(t, err, driver.ErrClosed)
	require.Zero(t, e.used(t))
}
