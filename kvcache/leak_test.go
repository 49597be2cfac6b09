package kvcache

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/internal/leakcheck"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// TestNoLeaks: a cache that admitted, appended, swapped and resumed,
// freed and reused slots in both layouts, mapping ahead, then closed
// (with a sequence still swapped out), and one that shared prefixes and
// forked and closed with a borrower and a fork live, leave the
// process's descriptors, mappings and resident memory as they were, and
// its device with nothing committed.
func TestNoLeaks(t *testing.T) {
	work := func() {
		drv, err := host.New(host.Options{Devices: 1, Capacity: 64 * units.MiB, Granularity: page})
		require.NoError(t, err)
		space, mem := vaspace.New(drv), physical.New(drv)
		for _, layout := range []Layout{PerLayer, TokenMajor} {
			cfg := tinyConfig(layout, 128, 2)
			cfg.MapAhead = 8
			c, err := New(space, mem, cfg)
			require.NoError(t, err)
			a, err := c.Admit([]int{1, 2, 3}, 0)
			require.NoError(t, err)
			step, err := a.Append([]int{1, 2, 3})
			require.NoError(t, err)
			writeStep(t, step, []int{1, 2, 3}, 0)
			_, err = a.Append(make([]int, 70))
			require.NoError(t, err)
			_, err = a.K(1)
			require.NoError(t, err)
			require.NoError(t, a.Preempt(Swap))
			_, err = a.Resume()
			require.NoError(t, err)
			require.NoError(t, a.Free())
			b, err := c.Admit([]int{4}, 0)
			require.NoError(t, err)
			_, err = b.Append([]int{4, 5})
			require.NoError(t, err)
			require.NoError(t, b.Preempt(Swap), "its host buffer goes with Close")
			require.NoError(t, c.Close())
			u, err := mem.Usage(0)
			require.NoError(t, err)
			require.Zero(t, u.Used, "committed back to where it started")
		}
		// Prefix sharing: a store, borrowed units, a copied one, cached
		// ones, and a borrower still live at Close.
		c, err := New(space, mem, microConfig(TokenMajor, 4096, 3))
		require.NoError(t, err)
		a := prefill(t, c, seqTokens(800, 800, 0), 0)
		_, err = a.Append([]int{1})
		require.NoError(t, err)
		b := prefill(t, c, seqTokens(800, 600, 50_000), 0)
		require.Equal(t, 256+336, b.Matched())
		// A fork: its parent's own pages handed over to the store, a
		// page copied on write, fork and parent live at Close.
		f, err := b.Fork()
		require.NoError(t, err)
		_, err = f.Append([]int{2})
		require.NoError(t, err)
		require.NoError(t, a.Free())
		require.NoError(t, c.Close())
		require.Empty(t, space.Reservations())
		require.NoError(t, drv.Close())
	}
	leakcheck.Require(t, 3, work)
}
