package bench

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/units"
)

// BenchmarkSleepWake1GiB: sleep in Host mode then wake of a tag holding 1
// GiB, beside the baseline in the same loop: a plain copy of the same 1
// GiB out to a pinned host buffer and back into the memory, which stays
// committed (HostAlloc, Read, Write, HostFree) — what the backup alone
// costs. Reports sleepwake-ms/op (and its sleep-ms/op and wake-ms/op),
// copy-ms/op and sleepwake/copy (target
// ≤ 1.2, docs/benchmarks.md); the rest of the ratio is giving the memory back
// and committing, mapping and granting it again. Host driver, default
// capacity; skipped when it cannot hold 3 GiB.
func BenchmarkSleepWake1GiB(b *testing.B) {
	t, err := SleepWake(b.Loop, units.GiB)
	skipTooLarge(b, err)
	require.NoError(b, err)
	ms := func(d int64) float64 { return float64(d) / 1e6 / float64(t.N) }
	b.ReportMetric(ms(t.SleepWake.Nanoseconds()), "sleepwake-ms/op")
	b.ReportMetric(ms(t.Sleep.Nanoseconds()), "sleep-ms/op")
	b.ReportMetric(ms(t.Wake.Nanoseconds()), "wake-ms/op")
	b.ReportMetric(ms(t.Copy.Nanoseconds()), "copy-ms/op")
	b.ReportMetric(float64(t.SleepWake)/float64(t.Copy), "sleepwake/copy")
	b.ReportMetric(0, "ns/op") // the loop holds both sides; the figures above are the ones that matter
}

// BenchmarkSleepWakeCycles: a thousand Host-mode sleep/wake cycles of a
// small tag (three allocations, 120 KiB) per op, after 200 that warm up.
// Reports the growth per cycle of the device's used bytes, of the backup
// bytes a woken tag holds, of the process's file descriptors and of its
// mappings (/proc/self/maps), each measured over every thousand (target
// 0 each, docs/benchmarks.md), and the time of one cycle. The mappings are the
// whole process's: one the Go runtime adds while the cycles run counts
// (TestThousandCycles in package sleep tells the runtime's from a leak,
// which shows in every round).
func BenchmarkSleepWakeCycles(b *testing.B) {
	const cycles = 1000
	g, err := SleepCycles(b.Loop, cycles, 200)
	require.NoError(b, err)
	per := float64(g.Cycles)
	b.ReportMetric(float64(g.Bytes+g.Backup)/per, "bytes-growth/cycle")
	b.ReportMetric(float64(g.FDs)/per, "fds-growth/cycle")
	b.ReportMetric(float64(g.Maps)/per, "maps-growth/cycle")
	b.ReportMetric(float64(g.Took.Nanoseconds())/1e3/per, "us/cycle")
	b.ReportMetric(0, "ns/op")
}

// TestSleepBenchmarkBodies runs the sleep bodies small: two rounds of a 4
// MiB tag and of a 5 MiB one (not a whole number of 2 MiB chunks), whose
// bytes each checks after its rounds; and two rounds of 20 cycles after 5
// of warm-up, which must grow nothing but, perhaps, the Go runtime's
// mappings.
func TestSleepBenchmarkBodies(t *testing.T) {
	for _, size := range []uint64{4 * units.MiB, 5 * units.MiB} {
		s, err := SleepWake(Rounds(2), size)
		require.NoError(t, err)
		require.Equal(t, 2, s.N)
		require.Positive(t, s.SleepWake)
		require.Equal(t, s.SleepWake, s.Sleep+s.Wake)
		require.Positive(t, s.Copy)
	}
	_, err := SleepWake(Rounds(1), 0)
	require.Error(t, err)

	g, err := SleepCycles(Rounds(2), 20, 5)
	require.NoError(t, err)
	require.Equal(t, 40, g.Cycles)
	require.Zero(t, g.Bytes)
	require.Zero(t, g.Backup)
	require.Zero(t, g.FDs)
	require.Positive(t, g.Took)
}
