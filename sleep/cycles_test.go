package sleep

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/leakcheck"
)

// cycle sleeps every tag of m in mode and wakes it, checking that sleep
// gave back all the device held and wake took back what it had.
func cycle(m *Manager, d interface{ Used(driver.DeviceID) uint64 }, mode Mode, used uint64) error {
	if err := m.Sleep(mode); err != nil {
		return err
	}
	if u := d.Used(0); u != 0 {
		return errors.Newf("asleep, the device holds %d bytes", u)
	}
	if err := m.Wake(); err != nil {
		return err
	}
	if u := d.Used(0); u != used {
		return errors.Newf("awake, the device holds %d bytes, %d before", u, used)
	}
	for _, s := range m.Stats() {
		if s.BackupBytes != 0 || s.AsleepBytes != 0 {
			return errors.Newf("awake, tag %q holds %d backup bytes and %d asleep", s.Tag, s.BackupBytes, s.AsleepBytes)
		}
	}
	return nil
}

// TestThousandCycles: a thousand sleep/wake cycles of two small tags
// (host backups) leave the device's used bytes, the process's file
// descriptors and mappings and the backups where they were, and the
// bytes intact.
func TestThousandCycles(t *testing.T) {
	d := openHost(t, testCap)
	m := newManager(t, d)
	want := map[driver.Addr][]byte{}
	for i, tag := range []string{"weights", "weights", "kv"} {
		p, err := m.Alloc(tag, uint64(i+1)*20*kib)
		require.NoError(t, err)
		want[p] = pattern(uint64(i), uint64(i+1)*20*kib)
		require.NoError(t, d.Write(p, want[p]))
	}
	require.NoError(t, m.Sleep(Host)) // the first sleep trims the free chunks
	require.NoError(t, m.Wake())
	used := d.Used(0)
	cycles := 1
	for ; cycles < 1000; cycles++ {
		require.NoError(t, cycle(m, d, Host, used))
	}
	// The process holds no more after further cycles than before them
	// (leakcheck.Compare: every round must differ for a leak).
	var failed error
	_, _, same, err := leakcheck.Compare(3, func() {
		for range 20 {
			if failed == nil {
				failed = cycle(m, d, Host, used)
				cycles++
			}
		}
	})
	require.NoError(t, err)
	require.NoError(t, failed)
	require.True(t, same, "the cycles leave the process holding what it held")
	requireContents(t, d, want)
	for _, s := range m.Stats() {
		require.Equal(t, cycles, s.Cycles)
	}
	closeAll(t, m)
}
