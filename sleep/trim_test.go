package sleep

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/host"
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

// sleptToFile makes a Manager on the host driver whose tag "w" holds
// fillModel's allocations and sleeps in File mode, and returns the
// contents to expect and the name of its backup file, the one file of
// its BackupDir.
func sleptToFile(t *testing.T) (*host.Driver, *Manager, map[driver.Addr][]byte, string) {
	t.Helper()
	d := openHost(t, testCap)
	dir := t.TempDir()
	m, err := New(d, Options{TagMax: testTMax, ChunkSize: testCS, BackupDir: dir})
	require.NoError(t, err)
	want := fillModel(t, d, m)
	require.NoError(t, m.Sleep(File, "w"))
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, ents, 1)
	return d, m, want, dir + "/" + ents[0].Name()
}

// TestWakeWithBackupFileRemoved: a File-mode wake whose backup file was
// removed from its directory meanwhile restores from the file it holds
// open: the tag is awake with its bytes, and Wake says so (no error).
func TestWakeWithBackupFileRemoved(t *testing.T) {
	d, m, want, name := sleptToFile(t)
	defer closeAll(t, m)
	require.NoError(t, os.Remove(name))

	require.NoError(t, m.Wake("w"))
	s := stats(t, m, "w")
	require.False(t, s.Asleep)
	require.Zero(t, s.BackupBytes)
	require.Equal(t, 1, s.Cycles)
	requireContents(t, d, want)
	require.NoError(t, m.Check())
}

// TestWakeRefusesAChangedBackup: a File-mode wake whose backup file was
// changed since the sleep — a byte in its middle flipped, the file cut
// short, or emptied — restores nothing it cannot vouch for: Wake is
// ErrInvalid naming the file, the tag sleeps on with its books and its
// backup as they were and nothing of the device held, and once the file
// holds what the sleep wrote again the next wake restores every byte
// (pieces of 64 KiB, so that allocations of several are checked piece
// by piece).
func TestWakeRefusesAChangedBackup(t *testing.T) {
	piece := copyPiece
	copyPiece = 64 * kib // the 256 KiB allocation is four pieces
	t.Cleanup(func() { copyPiece = piece })
	for _, c := range []struct {
		name   string
		change func(t *testing.T, f *os.File, size int64)
		says   string
	}{
		{"flipped", func(t *testing.T, f *os.File, size int64) {
			var b [1]byte
			_, err := f.ReadAt(b[:], size/2)
			require.NoError(t, err)
			b[0] ^= 0x40
			_, err = f.WriteAt(b[:], size/2)
			require.NoError(t, err)
		}, "changed since the sleep"},
		{"cut short", func(t *testing.T, f *os.File, size int64) {
			require.NoError(t, f.Truncate(size/2))
		}, "read "},
		{"emptied", func(t *testing.T, f *os.File, size int64) {
			require.NoError(t, f.Truncate(0))
		}, "read "},
	} {
		t.Run(c.name, func(t *testing.T) {
			d, m, want, name := sleptToFile(t)
			defer closeAll(t, m)
			written, err := os.ReadFile(name)
			require.NoError(t, err)
			f, err := os.OpenFile(name, os.O_RDWR, 0)
			require.NoError(t, err)
			defer f.Close()
			c.change(t, f, int64(len(written)))

			before, used := stats(t, m, "w"), d.Used(0)
			err = m.Wake("w")
			require.True(t, errors.Is(err, driver.ErrInvalid), "%v", err)
			require.ErrorContains(t, err, c.says)
			require.ErrorContains(t, err, name)
			require.Equal(t, before, stats(t, m, "w"), "the tag sleeps on, unchanged")
			require.Equal(t, used, d.Used(0), "nothing of the device is held")
			require.NoError(t, m.Check())

			_, err = f.WriteAt(written, 0)
			require.NoError(t, err)
			require.NoError(t, m.Wake("w"))
			requireContents(t, d, want)
			require.Zero(t, stats(t, m, "w").BackupBytes)
		})
	}
}
