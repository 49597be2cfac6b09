// Package cachemiss builds the pointer chase that benchmarks time a load
// missing every cache with: one random cycle of uint32 links, each load
// depending on the one before, so the processor can neither prefetch nor
// overlap them. It owns no state and times nothing: each caller times
// the walk with its own clock (the wall clock, a thread's CPU clock).
package cachemiss

import "math/rand/v2"

// Cycle returns span bytes (at least two links) of links forming one
// random cycle (Sattolo's shuffle: a walk visits every link before it
// repeats), and the link where a walk is in the cycle's steady state,
// past the start's first pages.
func Cycle(span uint64) (next []uint32, start uint32) {
	next = make([]uint32, max(span/4, 2))
	for i := range next {
		next[i] = uint32(i)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for i := len(next) - 1; i > 0; i-- {
		j := rng.IntN(i)
		next[i], next[j] = next[j], next[i]
	}
	return next, Walk(next, 0, 1<<16)
}

// Walk follows loads links of next from p and returns where it ends.
func Walk(next []uint32, p uint32, loads int) uint32 {
	for range loads {
		p = next[p]
	}
	return p
}
