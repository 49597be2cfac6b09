package bench

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/units"
)

// BenchmarkMigrate1GiB: 1 GiB moved between the two devices of a host
// driver by multidev.Arena.Migrate (new chunks on the target, the bytes
// copied, remapped at the same addresses, the old chunks released),
// beside the same bytes copied into a fresh arena.Arena on the target and
// the old one closed, in the same loop; 2 MiB chunks on both sides.
// Reports migrate-ms, copy-ms and migrate/copy: ≈ 1 when the remap adds
// little beyond the copy. Commits up to 3 GiB at once.
func BenchmarkMigrate1GiB(b *testing.B) {
	b.ReportAllocs()
	p, err := Migrate(b.Loop, units.GiB)
	skipTooLarge(b, err)
	if err != nil {
		b.Fatal(err)
	}
	ms := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 / float64(p.N) }
	b.ReportMetric(ms(p.Lib), "migrate-ms")
	b.ReportMetric(ms(p.Bare), "copy-ms")
	b.ReportMetric(p.Ratio(), "migrate/copy")
	b.ReportMetric(0, "ns/op") // the loop times both, and the setup; the figures above are the ones that matter
}

// TestMigrateBenchmarkBody runs the migrate body small: an even and an
// odd number of rounds (the tensors end on device 0, then on device 1).
func TestMigrateBenchmarkBody(t *testing.T) {
	for _, rounds := range []int{2, 3} {
		p, err := Migrate(Rounds(rounds), 8*units.MiB)
		require.NoError(t, err)
		require.Equal(t, rounds, p.N)
		require.Positive(t, p.Lib)
		require.Positive(t, p.Bare)
	}
	_, err := Migrate(Rounds(1), 3*units.MiB)
	require.Error(t, err, "not a multiple of 2 MiB")
	_, err = Migrate(Rounds(1), 1<<50)
	require.ErrorIs(t, err, ErrTooLarge)
}
