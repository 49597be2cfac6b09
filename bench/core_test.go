package bench

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/units"
)

func report(b *testing.B, p Pair, err error) {
	b.Helper()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(p.Lib.Nanoseconds())/float64(p.N), "lib-ns/op")
	b.ReportMetric(float64(p.Bare.Nanoseconds())/float64(p.N), "bare-ns/op")
	b.ReportMetric(p.Ratio(), "lib/bare")
	b.ReportMetric(0, "ns/op") // the loop times both; the figures above are the ones that matter
}

// BenchmarkMapAccessUnmap: Map + SetAccess + Unmap of a 2 MiB chunk against
// the bare system calls. Target: lib/bare at most 1.10.
func BenchmarkMapAccessUnmap(b *testing.B) {
	b.ReportAllocs()
	for _, populate := range []bool{true, false} {
		name := "populate"
		if !populate {
			name = "no-populate"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			p, err := MapAccessUnmap(b.N, populate)
			report(b, p, err)
		})
	}
}

// BenchmarkCreateRelease: Create + Release of a 2 MiB chunk against bare
// fallocate + punch-hole.
func BenchmarkCreateRelease(b *testing.B) {
	b.ReportAllocs()
	p, err := CreateRelease(b.N)
	report(b, p, err)
}

// BenchmarkReserveFree1TiB: Reserve + Free of 1 TiB against bare mmap +
// munmap.
func BenchmarkReserveFree1TiB(b *testing.B) {
	b.ReportAllocs()
	p, err := ReserveFree(b.N, units.TiB)
	report(b, p, err)
}

// TestBenchmarkBodies runs each benchmark body a few times, so a broken
// benchmark fails the tests rather than the next measurement.
func TestBenchmarkBodies(t *testing.T) {
	for _, populate := range []bool{true, false} {
		p, err := MapAccessUnmap(3, populate)
		require.NoError(t, err)
		require.Equal(t, 3, p.N)
		require.Positive(t, p.Lib)
		require.Positive(t, p.Bare)
	}
	_, err := CreateRelease(3)
	require.NoError(t, err)
	_, err = ReserveFree(3, units.TiB)
	require.NoError(t, err)
}
