package sleep

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/testdrivers"
)

// TestSleepWakeOnEveryDriver: a tag sleeps in Host mode and wakes with
// its bytes, and a second in Discard mode, on the host driver and over
// the C stand-ins of libcuda and libascendcl: the vendor library's used
// memory drops to nothing asleep and comes back at wake.
func TestSleepWakeOnEveryDriver(t *testing.T) {
	testdrivers.Each(t, func(t *testing.T, b testdrivers.Backend) {
		d := b.Open(t, testdrivers.Machine{Devices: 1, Capacity: testCap, Granularity: 64 * kib})
		m, err := New(d, Options{TagMax: testTMax, ChunkSize: 2 * mib, BackupDir: t.TempDir()})
		require.NoError(t, err)
		want := map[driver.Addr][]byte{}
		for i, n := range []uint64{3 * mib, 100 * kib, 64} {
			p, err := m.Alloc("weights", n)
			require.NoError(t, err)
			want[p] = pattern(uint64(i), n)
			require.NoError(t, d.Write(p, want[p]))
		}
		kv, err := m.Alloc("kv", mib)
		require.NoError(t, err)
		for _, mode := range []Mode{Host, File} {
			require.NoError(t, m.Sleep(mode, "weights"))
			require.NoError(t, m.Sleep(Discard, "kv"))
			require.Zero(t, d.Used(0), "asleep, the device holds nothing")
			require.NoError(t, m.Wake())
			requireContents(t, d, want)
			require.NoError(t, m.Check())
			require.NoError(t, d.Check())
		}
		require.NoError(t, m.Free(kv))
		closeAll(t, m)
		require.Zero(t, d.Used(0))
	})
}
