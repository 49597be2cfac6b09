package bench

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/units"
)

// BenchmarkPoolAllocFree: a MallocAsync and a FreeAsync per pair through a
// stream-ordered pool, on one stream and spread over four, with 1K live
// allocations of 256 B to 64 KiB on the sim driver; beside, in the same
// loop, an Alloc and a Free of the same sizes on a synchronous Allocator
// and make([]byte) of them (Go's allocator: a reference point only).
// Reports pairs/s of each and the time ratios pool/alloc and pool/make
// (above 1: the pool is slower); the four-stream case also runs as many
// rounds on one stream after it and reports the ratio of their pool time
// per pair, streams/one.
func BenchmarkPoolAllocFree(b *testing.B) {
	b.ReportAllocs()
	for _, streams := range []int{1, 4} {
		name := "1-stream"
		if streams > 1 {
			name = "4-streams"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			p, err := PoolAllocFree(b.Loop, streams, 1000)
			if err != nil {
				b.Fatal(err)
			}
			perSec := func(d float64) float64 { return float64(p.N) / (d / 1e9) }
			b.ReportMetric(perSec(float64(p.Pool)), "pool-pairs/s")
			b.ReportMetric(perSec(float64(p.Alloc)), "alloc-pairs/s")
			b.ReportMetric(perSec(float64(p.Make)), "make-pairs/s")
			b.ReportMetric(float64(p.Pool)/float64(p.Alloc), "pool/alloc")
			b.ReportMetric(float64(p.Pool)/float64(p.Make), "pool/make")
			if streams > 1 {
				// The same rounds on one stream, in this process: what
				// spreading the pairs over streams costs (the target:
				// at most 1.2).
				one, err := PoolAllocFree(Rounds(p.N/allocBatch), 1, 1000)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(p.Pool)/float64(p.N)/(float64(one.Pool)/float64(one.N)), "streams/one")
			}
			b.ReportMetric(0, "ns/op") // includes the fill and the untimed synchronizes
		})
	}
}

// BenchmarkPoolReleaseAfterThreshold: the Synchronize that releases a
// pool's memory above its release threshold (32 MiB freed in 2 MiB blocks,
// threshold 8 MiB, host driver), beside the same memory released through
// an Allocator's Free and TrimTo in the same loop. Reports release-us for
// both and their ratio.
func BenchmarkPoolReleaseAfterThreshold(b *testing.B) {
	b.ReportAllocs()
	p, err := PoolRelease(b.Loop, 32*units.MiB, 8*units.MiB)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(p.Lib.Microseconds())/float64(p.N), "pool-sync-us")
	b.ReportMetric(float64(p.Bare.Microseconds())/float64(p.N), "free-trim-us")
	b.ReportMetric(p.Ratio(), "pool/direct")
	b.ReportMetric(0, "ns/op") // includes the untimed allocations that commit the memory
}

// TestPoolBenchmarkBodies runs each pool benchmark body small, so a broken
// benchmark fails the tests rather than the next measurement.
func TestPoolBenchmarkBodies(t *testing.T) {
	for _, streams := range []int{1, 4} {
		p, err := PoolAllocFree(Rounds(3), streams, 300)
		require.NoError(t, err)
		require.Equal(t, 3*allocBatch, p.N)
		require.Positive(t, p.Pool)
		require.Positive(t, p.Alloc)
		require.Positive(t, p.Make)
	}
	p, err := PoolRelease(Rounds(3), 16*units.MiB, 4*units.MiB)
	require.NoError(t, err)
	require.Equal(t, 3, p.N)
	require.Positive(t, p.Lib)
	require.Positive(t, p.Bare)

	_, err = PoolRelease(Rounds(1), 4*units.MiB, 8*units.MiB)
	require.ErrorContains(t, err, "above the threshold")
	_, err = PoolAllocFree(Rounds(1), 0, 10)
	require.Error(t, err)
}
