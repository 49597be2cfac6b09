package bench

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// scaleName is a size as a metric's name writes it: 1K, 100K, 1M.
func scaleName(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n >= 1_000 && n%1_000 == 0:
		return fmt.Sprintf("%dK", n/1_000)
	}
	return fmt.Sprint(n)
}

// reportScaled reports an operation's mean ns at each size and the
// slowest over the fastest (largest/smallest: the target is at most 1.5).
func reportScaled(b *testing.B, s Scaled) {
	for i, n := range s.Sizes {
		b.ReportMetric(s.NS(i), "ns@"+scaleName(n))
	}
	b.ReportMetric(s.Ratio(), "largest/smallest")
	b.ReportMetric(0, "ns/op") // includes building the subjects
}

// BenchmarkScale: an alloc and a free, a map and an unmap, a commit and a
// decommit, each timed with a thousand, a hundred thousand and a million
// objects live in the structures it edits (ScaleSizes), the sizes' rounds
// alternating. Reports ns at each size and largest/smallest (the target:
// at most 1.5).
//
// The plain rows work where the last operation worked — alloc-free frees
// a recent allocation, map-unmap and commit-decommit work in a window in
// the middle of the range — so what they time is the books: an edit that
// walked, copied or rehashed in proportion to what is live would show
// there. The -random rows work anywhere, so at a million each operation
// reads books no cache holds; they report miss-ns (MissLatency, a load
// that misses every cache) and extra-misses, the growth from the smallest
// size to the largest in units of it: a constant number of misses, not a
// cost in proportion to what is live. hash-floor-random is the floor they
// are read against, in the same run: Go's own map at random places
// (ScaleHashFloor), O(1) by construction.
func BenchmarkScale(b *testing.B) {
	random := func(b *testing.B, s Scaled) {
		reportScaled(b, s)
		miss := float64(MissLatency(MissSpan, 1<<22).Nanoseconds())
		b.ReportMetric(miss, "miss-ns")
		b.ReportMetric((s.NS(len(s.Sizes)-1)-s.NS(0))/miss, "extra-misses")
	}
	b.Run("alloc-free", func(b *testing.B) {
		s, err := ScaleAllocFree(b.Loop, ScaleSizes, true)
		require.NoError(b, err)
		reportScaled(b, s)
	})
	b.Run("alloc-free-random", func(b *testing.B) {
		s, err := ScaleAllocFree(b.Loop, ScaleSizes, false)
		require.NoError(b, err)
		random(b, s)
	})
	b.Run("map-unmap", func(b *testing.B) {
		s, err := ScaleMapUnmap(b.Loop, ScaleSizes, true)
		require.NoError(b, err)
		reportScaled(b, s)
	})
	b.Run("map-unmap-random", func(b *testing.B) {
		s, err := ScaleMapUnmap(b.Loop, ScaleSizes, false)
		require.NoError(b, err)
		random(b, s)
	})
	b.Run("commit-decommit", func(b *testing.B) {
		s, err := ScaleCommitDecommit(b.Loop, ScaleSizes, true)
		require.NoError(b, err)
		reportScaled(b, s)
	})
	b.Run("commit-decommit-random", func(b *testing.B) {
		s, err := ScaleCommitDecommit(b.Loop, ScaleSizes, false)
		require.NoError(b, err)
		random(b, s)
	})
	b.Run("hash-floor-random", func(b *testing.B) {
		s, err := ScaleHashFloor(b.Loop, ScaleSizes)
		require.NoError(b, err)
		random(b, s)
	})
}

// TestScalePlaces: the layouts hold n chunks in 2n slots, the free slots
// are the empty ones, and a local layout's free slots lie in a window in
// the middle.
func TestScalePlaces(t *testing.T) {
	for _, n := range []int{3, 10, 300, 5000} {
		for _, local := range []bool{false, true} {
			mapped, free := scalePlaces(rand.New(rand.NewPCG(1, 2)), n, local)
			require.Len(t, mapped, n)
			seen := map[int]bool{}
			for _, pl := range append(slices.Clone(mapped), free...) {
				require.False(t, seen[pl], "slot %d twice", pl)
				require.True(t, pl >= 0 && pl < 2*n, "slot %d of %d", pl, 2*n)
				seen[pl] = true
			}
			require.NotEmpty(t, free)
			if local {
				slices.Sort(free)
				require.Less(t, free[len(free)-1]-free[0], scaleWindow)
				require.LessOrEqual(t, free[0], n)
				require.GreaterOrEqual(t, free[len(free)-1], n-1)
			} else {
				require.Len(t, free, n)
			}
		}
	}
}

// TestScaleBenchmarkBodies runs each scale body small, so a broken
// benchmark fails the tests rather than the next measurement.
func TestScaleBenchmarkBodies(t *testing.T) {
	sizes := []int{10, 300}
	for name, run := range map[string]func() (Scaled, error){
		"alloc-free":             func() (Scaled, error) { return ScaleAllocFree(Rounds(2), sizes, true) },
		"alloc-free-random":      func() (Scaled, error) { return ScaleAllocFree(Rounds(2), sizes, false) },
		"map-unmap":              func() (Scaled, error) { return ScaleMapUnmap(Rounds(2), sizes, true) },
		"map-unmap-random":       func() (Scaled, error) { return ScaleMapUnmap(Rounds(2), sizes, false) },
		"commit-decommit":        func() (Scaled, error) { return ScaleCommitDecommit(Rounds(2), sizes, true) },
		"commit-decommit-random": func() (Scaled, error) { return ScaleCommitDecommit(Rounds(2), sizes, false) },
		"hash-floor-random":      func() (Scaled, error) { return ScaleHashFloor(Rounds(2), sizes) },
	} {
		s, err := run()
		require.NoError(t, err, name)
		require.Equal(t, 2*scaleBatch, s.N, name)
		for i := range sizes {
			require.Positive(t, s.NS(i), name)
		}
		require.GreaterOrEqual(t, s.Ratio(), 1.0, name)
	}
}
