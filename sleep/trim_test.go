package sleep

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
)

// TestFreedMemoryServesOtherTags: sixteen tags each allocate a quarter
// of the device and free it. The memory they freed serves another tag's
// allocation of most of the device and a sleeping tag's wake (each of
// which trims the other tags when the device runs out), and the books —
// each tag's AwakeBytes, the device's used bytes — stay exact.
func TestFreedMemoryServesOtherTags(t *testing.T) {
	const capacity = 16 * mib
	d := openHost(t, capacity)
	m, err := New(d, Options{TagMax: capacity, ChunkSize: testCS, BackupDir: t.TempDir()})
	require.NoError(t, err)
	defer closeAll(t, m)

	sleeper, err := m.Alloc("sleeper", capacity/2)
	require.NoError(t, err)
	require.NoError(t, d.Write(sleeper, pattern(1, 4*kib)))
	require.NoError(t, m.Sleep(Host, "sleeper"))
	for i := range 16 {
		name := string(rune('a' + i))
		p, err := m.Alloc(name, capacity/4)
		require.NoError(t, err, "tag %s", name)
		require.NoError(t, m.Free(p))
	}
	var held uint64
	for _, s := range m.Stats() {
		if s.Tag != "sleeper" {
			require.Zero(t, s.Live, "tag %q", s.Tag)
		}
		held += s.AwakeBytes
	}
	require.Equal(t, d.Used(0), held, "the device holds what the tags say they hold")

	big, err := m.Alloc("big", capacity/2)
	require.NoError(t, err, "memory the other tags freed serves this tag")
	require.NoError(t, m.Wake("sleeper"), "and the sleeping tag's wake")
	require.Equal(t, pattern(1, 4*kib), read(t, d, sleeper, 4*kib))
	held = 0
	for _, s := range m.Stats() {
		held += s.AwakeBytes
	}
	require.Equal(t, d.Used(0), held)
	require.NoError(t, m.Check())
	require.NoError(t, m.Free(big))
	require.NoError(t, m.Free(sleeper))
}

// TestTrim: Trim gives back every free chunk of the tags named, leaves
// live allocations' bytes and sleeping tags as they are, and refuses an
// unknown tag and a closed Manager with nothing changed.
func TestTrim(t *testing.T) {
	d := openHost(t, testCap)
	m := newManager(t, d)
	p, err := m.Alloc("a", 2*mib)
	require.NoError(t, err)
	q, err := m.Alloc("a", 64*kib)
	require.NoError(t, err)
	r, err := m.Alloc("b", 2*mib)
	require.NoError(t, err)
	require.NoError(t, d.Write(q, pattern(2, 64*kib)))
	require.NoError(t, m.Free(p))
	require.NoError(t, m.Free(r))
	require.NoError(t, m.Sleep(Host, "b"))
	before := stats(t, m, "a").AwakeBytes
	require.GreaterOrEqual(t, before, 2*mib, "a free keeps the tag's memory committed")

	require.ErrorIs(t, m.Trim("nosuch"), driver.ErrInvalid)
	require.Equal(t, before, stats(t, m, "a").AwakeBytes, "a refused Trim changes nothing")

	require.NoError(t, m.Trim())
	require.Equal(t, testCS, stats(t, m, "a").AwakeBytes, "only the chunk of the live allocation stays")
	require.True(t, stats(t, m, "b").Asleep)
	require.Equal(t, pattern(2, 64*kib), read(t, d, q, 64*kib))
	require.Equal(t, testCS, d.Used(0))
	require.NoError(t, m.Check())
	require.NoError(t, m.Free(q))
	require.NoError(t, m.Trim("a"))
	require.Zero(t, d.Used(0))
	require.NoError(t, m.Close())
	require.ErrorIs(t, m.Trim(), driver.ErrClosed)
	require.ErrorIs(t, (&Manager{}).Trim(), driver.ErrInvalid)
}

// TestWakeWithBackupFileRemoved: a File-mode wake whose backup file was
// removed from its directory meanwhile restores from the file it holds
// open: the tag is awake with its bytes, and Wake says so (no error).
func TestWakeWithBackupFileRemoved(t *testing.T) {
	d := openHost(t, testCap)
	dir := t.TempDir()
	m, err := New(d, Options{TagMax: testTMax, ChunkSize: testCS, BackupDir: dir})
	require.NoError(t, err)
	defer closeAll(t, m)
	want := fillModel(t, d, m)
	require.NoError(t, m.Sleep(File, "w"))
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, ents, 1)
	require.NoError(t, os.Remove(dir+"/"+ents[0].Name()))

	require.NoError(t, m.Wake("w"))
	s := stats(t, m, "w")
	require.False(t, s.Asleep)
	require.Zero(t, s.BackupBytes)
	require.Equal(t, 1, s.Cycles)
	requireContents(t, d, want)
	require.NoError(t, m.Check())
}
