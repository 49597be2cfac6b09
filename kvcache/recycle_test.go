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
			require.NoError(t, a.Free())
			st0 := c.Stats()
			require.Equal(t, 3*up, st0.CachedPages)

			// b, another prompt, in a's slot: one unit of room is free, two
			// come from evicting a's last two units, whose memory b's
			// units take over.
			pb := seqTokens(3*unit+1, 0, 200000)
			b := prefill(t, c, pb, 0)
			st1 := c.Stats()
			require.Equal(t, st0.Evictions+2, st1.Evictions)
			require.Equal(t, st0.EvictedPages+2*up, st1.EvictedPages)
			require.Equal(t, st0.Commits+1, st1.Commits, "one store commit (layouts alike): the unit the free room holds")
			require.Equal(t, st0.Decommits, st1.Decommits, "the evicted memory was reused, not given back")
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
