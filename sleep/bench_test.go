package sleep

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/internal/leakcheck"
	"github.com/vmarena/vmarena/internal/units"
)

// BenchmarkSleepWake: Sleep in Host mode then Wake of a 1 GiB tag,
// beside the baseline in the same loop: a plain copy of the same 1 GiB
// out to a pinned host buffer and back (HostAlloc, Read, Write,
// HostFree), what the backup alone costs. Reports sleepwake-ns/op,
// copy-ns/op and their ratio (target ≤ 1.2): the rest of the ratio is
// giving the memory back and committing and mapping it again. Skipped
// when the host driver's default device (half of MemAvailable) cannot
// hold the tag, its backup and the baseline's buffer.
func BenchmarkSleepWake(b *testing.B) {
	const size = 1 << 30
	d, err := host.New(host.Options{Devices: 1})
	require.NoError(b, err)
	defer func() { require.NoError(b, d.Close()) }()
	if c := d.Devices()[0].Capacity; c < 3*size {
		b.Skipf("sleep: the benchmark needs %s of device capacity (the tag, its backup, the baseline's buffer); the host driver's default device has %s (half of MemAvailable)",
			units.Bytes(3*size), units.Bytes(c))
	}
	m, err := New(d, Options{})
	require.NoError(b, err)
	p, err := m.Alloc("weights", size)
	require.NoError(b, err)
	piece := pattern(1, 64<<20)
	for off := uint64(0); off < size; off += uint64(len(piece)) {
		require.NoError(b, d.Write(p+addr(off), piece))
	}
	var sw, cp time.Duration
	for b.Loop() {
		t0 := time.Now()
		require.NoError(b, m.Sleep(Host))
		require.NoError(b, m.Wake())
		t1 := time.Now()
		buf, err := d.HostAlloc(size)
		require.NoError(b, err)
		require.NoError(b, d.Read(p, buf))
		require.NoError(b, d.Write(p, buf))
		require.NoError(b, d.HostFree(buf))
		sw += t1.Sub(t0)
		cp += time.Since(t1)
	}
	got := make([]byte, len(piece))
	require.NoError(b, d.Read(p+addr(size-uint64(len(piece))), got))
	require.Equal(b, piece, got, "the woken tag holds its bytes")
	n := float64(b.N)
	b.ReportMetric(float64(sw.Nanoseconds())/n, "sleepwake-ns/op")
	b.ReportMetric(float64(cp.Nanoseconds())/n, "copy-ns/op")
	b.ReportMetric(float64(sw)/float64(cp), "ratio")
	require.NoError(b, m.Free(p))
	require.NoError(b, m.Close())
}

// BenchmarkSleepWakeCycles: a thousand Host-mode sleep/wake cycles of a
// small tag (three allocations, 120 KiB) per op. Reports the growth per
// cycle of the device's used bytes, the backup bytes held, the process's
// file descriptors and its mappings (/proc/self/maps) over the thousand
// (target 0 for each), and the time of one cycle.
func BenchmarkSleepWakeCycles(b *testing.B) {
	d := openHost(b, testCap)
	m := newManager(b, d)
	for i := range 3 {
		p, err := m.Alloc("weights", uint64(i+1)*20*kib)
		require.NoError(b, err)
		require.NoError(b, d.Write(p, pattern(uint64(i), uint64(i+1)*20*kib)))
	}
	require.NoError(b, m.Sleep(Host))
	require.NoError(b, m.Wake())
	used := d.Used(0)
	for range 200 { // warm up: the Go heap grows to what the cycles need
		require.NoError(b, cycle(m, d, Host, used))
	}
	const cycles = 1000
	var bytes, backup, fds, maps int64
	var took time.Duration
	for b.Loop() {
		before, err := leakcheck.Take()
		require.NoError(b, err)
		t0 := time.Now()
		for range cycles {
			require.NoError(b, cycle(m, d, Host, used))
		}
		took += time.Since(t0)
		after, err := leakcheck.Take()
		require.NoError(b, err)
		bytes += int64(d.Used(0)) - int64(used)
		backup += int64(stats(b, m, "weights").BackupBytes)
		fds += int64(after.FDs - before.FDs)
		maps += int64(after.Maps - before.Maps)
	}
	per := float64(b.N) * cycles
	b.ReportMetric(float64(bytes)/per, "bytes-growth/cycle")
	b.ReportMetric(float64(backup)/per, "backup-bytes/cycle")
	b.ReportMetric(float64(fds)/per, "fds-growth/cycle")
	b.ReportMetric(float64(maps)/per, "maps-growth/cycle")
	b.ReportMetric(float64(took.Nanoseconds())/per, "ns/cycle")
	closeAll(b, m)
}

func addr(off uint64) driver.Addr { return driver.Addr(off) }
