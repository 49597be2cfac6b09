package sleep

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/internal/leakcheck"
)

// TestHostCache: with Options.HostCache, a Host-mode wake keeps the
// backup's pinned buffers (up to the limit) and the next sleep of the
// same sizes takes them again; the bytes are right every cycle; what
// does not fit is given back; Close gives the rest back, leaving the
// process's mappings and descriptors as they were. Without a HostCache a
// wake keeps nothing (TestHostBackupsFreedAtWake).
func TestHostCache(t *testing.T) {
	const big, small = 2 * mib, 512 * kib // small is below pinnedMin: Go memory, never kept
	for _, tc := range []struct {
		name  string
		limit uint64
		kept  uint64
	}{
		{"room for both", 4 * big, 2 * big},
		{"room for one", big + big/2, big},
		{"none", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := openHost(t, testCap)
			before, err := leakcheck.Take()
			require.NoError(t, err)
			m, err := New(d, Options{TagMax: testTMax, ChunkSize: testCS, BackupDir: t.TempDir(), HostCache: tc.limit})
			require.NoError(t, err)
			var ps []uint64
			want := map[uint64][]byte{}
			for i, n := range []uint64{big, big, small} {
				p, err := m.Alloc("w", n)
				require.NoError(t, err)
				want[uint64(p)] = pattern(uint64(i), n)
				require.NoError(t, d.Write(p, want[uint64(p)]))
				ps = append(ps, uint64(p))
			}
			for cycle := range 4 {
				require.NoError(t, m.Sleep(Host, "w"))
				require.Zero(t, m.HostCached(), "cycle %d: asleep, the kept buffers hold the backup", cycle)
				require.NoError(t, m.Wake("w"))
				require.Equal(t, tc.kept, m.HostCached(), "cycle %d: kept after the wake", cycle)
				require.Zero(t, stats(t, m, "w").BackupBytes)
				for p, b := range want {
					require.Equal(t, b, read(t, d, driver.Addr(p), uint64(len(b))), "cycle %d: bytes at %#x", cycle, p)
				}
				require.NoError(t, m.Check())
			}
			for _, p := range ps {
				require.NoError(t, m.Free(driver.Addr(p)))
			}
			require.NoError(t, m.Close())
			require.Zero(t, m.HostCached(), "Close gives the kept buffers back")
			after, err := leakcheck.Take()
			require.NoError(t, err)
			require.Equal(t, before.FDs, after.FDs, "descriptors: %v, then %v", before, after)
			require.Equal(t, before.VmarenaMaps, after.VmarenaMaps, "vmarena's mappings: %v, then %v", before, after)
		})
	}
}

// TestCheckSeesHostCacheOverLimit: Check fails when the kept host
// buffers' books say more than the limit (a broken release would).
func TestCheckSeesHostCacheOverLimit(t *testing.T) {
	d := openHost(t, testCap)
	m, err := New(d, Options{TagMax: testTMax, ChunkSize: testCS, HostCache: mib})
	require.NoError(t, err)
	require.NoError(t, m.Check())
	m.cache.mu.Lock()
	m.cache.bytes = 2 * mib
	m.cache.mu.Unlock()
	require.ErrorContains(t, m.Check(), "past the HostCache")
	m.cache.mu.Lock()
	m.cache.bytes = 0
	m.cache.mu.Unlock()
	require.NoError(t, m.Close())
}

// refusingHostFree is the host driver with HostFree refused while refuse
// is set: a driver that cannot take a pinned buffer back.
type refusingHostFree struct {
	*host.Driver
	refuse bool
}

func (d *refusingHostFree) HostFree(b []byte) error {
	if d.refuse {
		return errors.Wrap(driver.ErrBusy, "refusingHostFree: refused")
	}
	return d.Driver.HostFree(b)
}

// TestHostCacheCloseRefused: when the driver refuses to take a kept buffer
// back, close says which (the driver's sentinel, the buffer's size) and
// still empties its books: a cache closed is a cache that holds nothing.
func TestHostCacheCloseRefused(t *testing.T) {
	d := &refusingHostFree{Driver: openHost(t, testCap)}
	c := newHostCache(d, 4*mib)
	b, pinned, err := c.alloc(2 * mib)
	require.NoError(t, err)
	require.True(t, pinned, "a buffer of pinnedMin or more is the driver's pinned memory")
	require.NoError(t, c.release(b, pinned))
	require.Equal(t, uint64(2*mib), c.held())

	d.refuse = true
	err = c.close()
	require.ErrorIs(t, err, driver.ErrBusy)
	require.ErrorContains(t, err, "give back a kept host buffer of 2097152 bytes")
	require.Zero(t, c.held())
	require.Empty(t, c.kept)

	d.refuse = false
	require.NoError(t, d.HostFree(b), "the buffer was the driver's still: given back here")
}
