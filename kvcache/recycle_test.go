package kvcache

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/units"
)

// TestEvictedUnitsAreRecycled: a prompt whose whole units need memory
// that cached prefix store units hold reuses their memory in place —
// evicted as before, but neither decommitted nor committed again — and
// commits only what eviction did not give it; the budget stays exact, the
// new units hold what their owner writes, and a later sequence shares
// them (reading them through its own addresses). Memory evicted for the
// slot's own pages is decommitted as before.
func TestEvictedUnitsAreRecycled(t *testing.T) {
	for _, layout := range []Layout{PerLayer, TokenMajor} {
		t.Run(layout.String(), func(t *testing.T) {
			e := hostEnv(t, 64*units.MiB)
			cfg := microConfig(layout, 4096, 2)
			unit, up := 1024, 2*cfg.Layers // tokens and pages of a unit
			if layout == TokenMajor {
				unit, up = 256, 1
			}
			budget := uint64(5*up) * page
			cfg.Budget = budget
			c := e.cache(t, cfg)
			before := e.used(t)

			// a: three whole units in the store and a page of its own,
			// kept by its slot once freed; its units are cached.
			pa := seqTokens(3*unit+1, 0, 100000)
			a := prefill(t, c, pa, 0)
			aSlot := a.Slot()
			require.NoError(t, a.Free())
			st0 := c.Stats()
			require.Equal(t, 3*up, st0.CachedPages)

			// b, another prompt, in a's slot (the other slot is taken by a
			// sequence admitted and never appended to, which holds no
			// page: a prompt matching nothing would take the slot keeping
			// nothing mapped): one unit of room is free, two come from
			// evicting a's last two units, whose memory b's units take over.
			holder, err := c.Admit([]int{7}, 0)
			require.NoError(t, err)
			require.NotEqual(t, aSlot, holder.Slot(), "the slot keeping nothing mapped")
			pb := seqTokens(3*unit+1, 0, 200000)
			b := prefill(t, c, pb, 0)
			require.Equal(t, aSlot, b.Slot())
			require.NoError(t, holder.Free())
			st1 := c.Stats()
			require.Equal(t, st0.Evictions+2, st1.Evictions)
			require.Equal(t, st0.EvictedPages+2*up, st1.EvictedPages)
			require.Equal(t, st0.Commits+1, st1.Commits, "one store commit (layouts alike): the unit the free room holds")
			// a's slot kept a's three units mapped (kept.go): b's prompt
			// differs, so they are unmapped, one call a region.
			require.Equal(t, 3, st1.KeptDropped)
			require.Equal(t, st0.Decommits+c.g.regions, st1.Decommits, "the evicted memory was reused, not given back")
			require.Equal(t, up, st1.CachedPages, "a's first unit")
			require.Equal(t, budget, st1.Committed)
			require.Equal(t, before+budget, e.used(t), "the device holds what the books count")
			require.NoError(t, c.Check())
			checkSeq(t, b, pb, 0, 0, len(pb))

			// c shares b's three units and needs a page of its own: a's
			// last cached unit goes, decommitted.
			s, err := c.Admit(pb, 0)
			require.NoError(t, err)
			require.Equal(t, 3*unit, s.Matched())
			step, err := s.Append(pb[s.Len():])
			require.NoError(t, err)
			writeStep(t, step, pb, 0)
			st2 := c.Stats()
			require.Equal(t, st1.Evictions+1, st2.Evictions)
			require.Equal(t, st1.Decommits+1, st2.Decommits)
			require.Equal(t, 3*up, st2.SharedPages)
			require.Equal(t, before+budget, e.used(t))
			checkSeq(t, s, pb, 0, 0, len(pb))
			require.NoError(t, c.Check())
			require.NoError(t, s.Free())
			require.NoError(t, b.Free())
			require.NoError(t, c.Check())
		})
	}
}

// TestRunsGoInOneCall: the prompt units a sequence borrowed stay mapped
// at Free (kept) and are cached last first (the LRU list takes a chain
// from its end, so eviction does too), and new store units that
// recycle evicted ones are borrowed in the store's order, side by side:
// one call for memory that two chains, evicted one after the other, left.
func TestRunsGoInOneCall(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	cfg := microConfig(TokenMajor, 4096, 2)
	unit := 256 // tokens of a unit (one page)
	budget := uint64(4) * page
	cfg.Budget = budget
	c := e.cache(t, cfg)

	// a1 and a2: two whole units each, all in the store (store units 0,
	// 1 and 2, 3), no page of their own.
	a1 := prefill(t, c, seqTokens(2*unit, 0, 100000), 0)
	a2 := prefill(t, c, seqTokens(2*unit, 0, 300000), 0)
	st0 := c.Stats()
	require.Equal(t, 2, st0.Commits, "one store commit each")
	require.NoError(t, a1.Free())
	require.NoError(t, a2.Free())
	st1 := c.Stats()
	require.Equal(t, st0.Decommits, st1.Decommits, "each sequence's two borrowed units stay mapped, kept (kept.go)")
	require.Equal(t, 4, st1.KeptUnits)
	require.Equal(t, 4, st1.CachedPages)
	var order []int
	for el := c.ps.lru.Front(); el != nil; el = el.Next() {
		su := el.Value.(*storeUnit)
		order = append(order, su.idx)
		require.Equal(t, su.idx%2, su.u)
	}
	require.Equal(t, []int{1, 0, 3, 2}, order, "each chain given back last first")
	require.NoError(t, c.Check())

	// b: four units, which take over the memory of all four evicted
	// units (evicted as listed), in the store's order: one borrow.
	pb := seqTokens(4*unit, 0, 200000)
	b := prefill(t, c, pb, 0)
	st2 := c.Stats()
	require.Equal(t, st1.Evictions+4, st2.Evictions)
	require.Equal(t, st1.Commits, st2.Commits, "all four recycled")
	// The kept mappings go: a1's two in b's slot in one call, a2's two
	// as their units are evicted, one each.
	require.Equal(t, st1.Decommits+3, st2.Decommits)
	require.Equal(t, 4, st2.KeptDropped)
	require.Equal(t, st1.Borrows+1, st2.Borrows, "one borrow for the run")
	for u := range 4 {
		require.Equal(t, u, b.sl.units[u].su.idx)
	}
	require.Equal(t, budget, st2.Committed)
	checkSeq(t, b, pb, 0, 0, len(pb))
	require.NoError(t, c.Check())
	require.NoError(t, b.Free())
	require.NoError(t, c.Check())
}
