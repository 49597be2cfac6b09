package sleep

import (
	"hash/crc32"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver/host"
)

// BenchmarkFileSleepWake: a File-mode sleep and wake of a tag holding
// 256 MiB on the host driver (the file in BackupDir, a temporary
// directory), beside, in the same loop, what the backup's checks cost:
// the CRC-32C of those bytes twice, once as the sleep writes them and
// once as the wake reads them back. Reports sleepwake-ms/op, crc-ms/op
// and crc/sleepwake, the checks' share of a cycle.
func BenchmarkFileSleepWake(b *testing.B) {
	const size = 256 << 20
	d, err := host.New(host.Options{Devices: 1, Capacity: 2 * size, Granularity: 2 << 20})
	require.NoError(b, err)
	defer func() { require.NoError(b, d.Close()) }()
	m, err := New(d, Options{TagMax: size, ChunkSize: 2 << 20, BackupDir: b.TempDir()})
	require.NoError(b, err)
	defer func() { require.NoError(b, m.Close()) }()
	p, err := m.Alloc("w", size)
	require.NoError(b, err)
	defer func() { require.NoError(b, m.Free(p)) }()
	buf := pattern(1, size)
	require.NoError(b, d.Write(p, buf))
	var cycle, crc time.Duration
	n := 0
	for b.Loop() {
		start := time.Now()
		require.NoError(b, m.Sleep(File, "w"))
		require.NoError(b, m.Wake("w"))
		mid := time.Now()
		for range 2 {
			crc32.Checksum(buf, castagnoli)
		}
		cycle, crc, n = cycle+mid.Sub(start), crc+time.Since(mid), n+1
	}
	ms := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 / float64(n) }
	b.ReportMetric(ms(cycle), "sleepwake-ms/op")
	b.ReportMetric(ms(crc), "crc-ms/op")
	b.ReportMetric(float64(crc)/float64(cycle), "crc/sleepwake")
	b.ReportMetric(0, "ns/op")
}
