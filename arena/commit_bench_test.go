package arena

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// BenchmarkSparseCommitDecommit: a Commit of one chunk and its Decommit
// (a create, a map, a grant, an unmap and a release through the page
// table, physical memory and the sim driver's ledger) at a hole of a
// range with a thousand and with a hundred thousand chunks committed
// around it, the two ranges taking turns in one loop: the per-chunk cost a
// KV cache pays each time a sequence reaches a new page. Reports ns at
// each size, their ratio (100k/1k: the books' depth, not their size, is
// what may cost) and allocs/op (both sizes: one op is two pairs).
func BenchmarkSparseCommitDecommit(b *testing.B) {
	const gran = 64 << 10
	sizes := []int{1_000, 100_000}
	type subject struct {
		s *Sparse
		n int
	}
	subjects := make([]subject, len(sizes))
	for i, n := range sizes {
		drv, err := sim.New(sim.Options{Devices: 1, Capacity: uint64(2*n+1) * gran, Granularity: gran})
		require.NoError(b, err)
		defer func() { require.NoError(b, drv.Close()) }()
		s, err := NewSparse(vaspace.New(drv), physical.New(drv), SparseOptions{Max: uint64(2*n) * gran, ChunkSize: gran})
		require.NoError(b, err)
		defer func() { require.NoError(b, s.Close()) }()
		// Every other chunk committed; the holes near the middle are
		// committed and decommitted in turn.
		for c := 0; c < 2*n; c += 2 {
			require.NoError(b, s.Commit(uint64(c)*gran, gran))
		}
		subjects[i] = subject{s, n}
	}
	b.ReportAllocs()
	spent := make([]time.Duration, len(sizes))
	h := 0
	for b.Loop() {
		for i, sub := range subjects {
			off := uint64(sub.n+1+2*(h%64)) * gran
			t0 := time.Now()
			if err := sub.s.Commit(off, gran); err != nil {
				b.Fatal(err)
			}
			if err := sub.s.Decommit(off, gran); err != nil {
				b.Fatal(err)
			}
			spent[i] += time.Since(t0)
		}
		h++
	}
	b.ReportMetric(float64(spent[0].Nanoseconds())/float64(h), "ns@1K")
	b.ReportMetric(float64(spent[1].Nanoseconds())/float64(h), "ns@100K")
	b.ReportMetric(float64(spent[1])/float64(spent[0]), "100K/1K")
	b.ReportMetric(0, "ns/op")
}
