package kvcache

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/units"
)

// TestWindowReleaseKeepsStoreUnits: a window sequence that borrowed a
// prompt's store units and decodes past them keeps them mapped behind its
// window (kept, no unmap on the Append's path; its own units behind are
// decommitted); evicting them later, while it runs, unmaps them and
// leaves its views, its shared units and its bytes as they were.
func TestWindowReleaseKeepsStoreUnits(t *testing.T) {
	t.Run("calls", func(t *testing.T) {
		e := simEnv(t, 64*units.MiB, page)
		drv := e.drv.(*sim.Driver)
		cfg := tinyConfig(TokenMajor, 512, 3)
		cfg.Window = 32
		c := e.cache(t, cfg)
		prompt := seqTokens(200, 200, 0)
		a, err := c.Admit(prompt, 0)
		require.NoError(t, err)
		_, err = a.Append(prompt)
		require.NoError(t, err)
		require.NoError(t, a.MarkWritten(200))
		require.NoError(t, a.Free())
		b, err := c.Admit(prompt, 0)
		require.NoError(t, err)
		_, err = b.Append(prompt[b.Len():])
		require.NoError(t, err)
		require.NoError(t, b.MarkWritten(200))
		lo0, kept0, unmaps := b.sl.lo, c.Stats().KeptUnits, drv.Calls().Unmap
		for i := range 40 {
			_, err := b.Append([]int{9000 + i})
			require.NoError(t, err)
		}
		released := b.sl.lo - lo0
		kept := c.Stats().KeptUnits - kept0
		require.Positive(t, kept, "the store units behind the window stay mapped")
		require.Less(t, kept, released+1)
		t.Logf("released %d units, kept %d, unmapped %d (regions %d)", released, kept, drv.Calls().Unmap-unmaps, c.g.regions)
		// Every released unit was a mapping of its own (a store unit
		// borrowed, or a page of the slot's): unmapping them all, as a
		// release did, is an unmap a unit at least.
		require.Less(t, int(drv.Calls().Unmap-unmaps), released, "only the sequence's own units behind it are unmapped")
		require.NoError(t, c.Check())
	})
	t.Run("evicted while running", func(t *testing.T) {
		e := hostEnv(t, 64*units.MiB)
		cfg := tinyConfig(TokenMajor, 512, 1) // one slot: b takes the one its prompt's units are kept in
		cfg.Window = 32
		c := e.cache(t, cfg)
		prompt := seqTokens(200, 200, 0)
		require.NoError(t, prefill(t, c, prompt, 0).Free())
		b := prefill(t, c, prompt, 0)
		tokens := append([]int(nil), prompt...)
		for i := range 20 { // the window still reaches the last shared units
			tokens = append(tokens, 9000+i)
			step, err := b.Append(tokens[len(tokens)-1:])
			require.NoError(t, err)
			writeStep(t, step, tokens, 0)
		}
		require.Positive(t, c.Stats().KeptUnits)
		k, err := b.K(1) // held across the eviction
		require.NoError(t, err)
		shared := b.sl.shared
		require.Greater(t, shared, b.sl.lo, "shared units within the window")
		st := c.Stats()
		preempted, err := c.SetBudget(st.Committed-uint64(st.CachedPages)*page, Drop)
		require.NoError(t, err)
		require.Empty(t, preempted)
		st = c.Stats()
		require.Zero(t, st.KeptUnits, "the eviction unmapped what the window kept")
		require.Positive(t, st.Evictions)
		require.Equal(t, shared, b.sl.shared, "the running sequence's shared units are as they were")
		_, err = k.At(make([]int, k.Dims())...)
		require.NoError(t, err, "its views were not revoked")
		checkWindow(t, b, tokens, 0)
		require.NoError(t, c.Check())
		require.NoError(t, b.Free())
	})
}
