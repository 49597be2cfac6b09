package sleep

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/cuda"
	"github.com/vmarena/vmarena/driver/cuda/cudatest"
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

// TestSleepSyncsCUDADevice: over the CUDA driver on the C stand-in, Sleep
// waits for work queued on a stream the library never made (the
// stand-in's Hold: a stream of the device's primary context, as PyTorch's
// is) before it copies out and unmaps — the driver's SyncDevice, which is
// cuCtxSynchronize; a libcuda without cuCtxSynchronize still sleeps and
// wakes (the driver answers ErrUnsupported and Sleep passes it over).
func TestSleepSyncsCUDADevice(t *testing.T) {
	d, lib := cudatest.Open(t, cudatest.Small(), cuda.Options{})
	t.Cleanup(lib.Release) // runs before the stand-in's teardown
	m, err := New(d, Options{TagMax: testTMax, ChunkSize: 2 * mib, BackupDir: t.TempDir()})
	require.NoError(t, err)
	p, err := m.Alloc("weights", 100*kib)
	require.NoError(t, err)
	want := map[driver.Addr][]byte{p: pattern(7, 100*kib)}
	require.NoError(t, d.Write(p, want[p]))

	require.NoError(t, lib.Hold(0))
	held := make(chan uint64, 1)
	go func() {
		if err := m.Sleep(Host, "weights"); err != nil {
			t.Error(err)
		}
		held <- lib.Held()
	}()
	time.Sleep(20 * time.Millisecond) // a chance to return early, were it wrong
	lib.Release()
	n := <-held
	require.Equal(t, uint64(1), n, "Sleep returned before the work on the device's other stream ran")
	require.Equal(t, uint64(1), lib.Calls("cuCtxSynchronize"))
	require.True(t, stats(t, m, "weights").Asleep)
	require.NoError(t, m.Wake())
	requireContents(t, d, want)
	closeAll(t, m)

	old := cudatest.Small()
	old.Omit = []string{"devsync"}
	d2, _ := cudatest.Open(t, old, cuda.Options{})
	m2, err := New(d2, Options{TagMax: testTMax, ChunkSize: 2 * mib, BackupDir: t.TempDir()})
	require.NoError(t, err)
	_, err = m2.Alloc("weights", 100*kib)
	require.NoError(t, err)
	require.NoError(t, m2.Sleep(Host), "a library without cuCtxSynchronize still sleeps")
	require.NoError(t, m2.Wake())
	closeAll(t, m2)
}
