package physical

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
)

// TestTableModel: random adds and removes of chunks against a map, with
// handles as this module's drivers issue them (small slot indices, reused
// at higher generations) and as another driver might (any 64 bits, equal
// low halves, indices far past the end): every listed chunk is found
// under its handle, no other, and all yields each exactly once.
func TestTableModel(t *testing.T) {
	for seed := range uint64(8) {
		rng := rand.New(rand.NewPCG(seed, 7))
		var tab table
		model := map[driver.Handle]*Chunk{}
		peak := 0
		handle := func() driver.Handle {
			switch rng.IntN(4) {
			case 0: // a slot index and a generation
				return driver.Handle(rng.Uint64N(8))<<32 | driver.Handle(1+rng.IntN(64))
			case 1: // any handle
				return driver.Handle(rng.Uint64() | 1)
			case 2: // far past the end
				return driver.Handle(1 + 2*uint64(tab.n) + denseSlack + rng.Uint64N(1<<20))
			}
			return driver.Handle(1 + rng.IntN(2*tab.n+2*denseSlack)) // around the edge of the slack
		}
		for range 1500 {
			if h := handle(); model[h] == nil && rng.IntN(3) > 0 {
				c := &Chunk{handle: h}
				tab.add(c)
				model[h] = c
				peak = max(peak, len(model))
			} else if len(model) > 0 {
				for h, c := range model { // one, at random
					if rng.IntN(2) == 0 {
						require.Same(t, c, tab.get(h))
						tab.remove(c)
						delete(model, h)
						require.Nil(t, tab.get(h))
						break
					}
				}
			}
			if rng.IntN(16) == 0 {
				require.Nil(t, tab.get(0))
				seen := map[*Chunk]bool{}
				for c := range tab.all {
					require.False(t, seen[c], "chunk %d yielded twice", c.handle)
					seen[c] = true
					require.Same(t, model[c.handle], c)
				}
				require.Len(t, seen, len(model))
				require.Equal(t, len(model), tab.n)
				require.LessOrEqual(t, len(tab.dense), 2*peak+denseSlack)
				for h, c := range model {
					require.Same(t, c, tab.get(h))
				}
			}
		}
	}
}
