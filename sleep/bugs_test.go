package sleep

import (
	"math"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/leakcheck"
)

// faulty is the host driver with its calls counted and, when armed, the
// n-th call of one kind refused.
type faulty struct {
	*host.Driver
	mu      sync.Mutex
	calls   map[string]int
	failOp  string
	failAt  int // the call of failOp to refuse, counted from 1; 0: none
	live    map[driver.Handle]bool
	doubles int // releases of a handle not live
}

func newFaulty(t testing.TB, capacity uint64) *faulty {
	return &faulty{Driver: openHost(t, capacity), calls: map[string]int{}, live: map[driver.Handle]bool{}}
}

func (f *faulty) arm(op string, at int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failOp, f.failAt = op, at
	f.calls = map[string]int{}
}

var errInjected = errors.New("injected")

// call counts op and says whether to refuse it.
func (f *faulty) call(op string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[op]++
	if op == f.failOp && f.calls[op] == f.failAt {
		return errors.Mark(errors.Wrapf(driver.ErrOutOfMemory, "injected failure of %s #%d", op, f.failAt), errInjected)
	}
	return nil
}

func (f *faulty) count(op string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[op]
}

func (f *faulty) Create(dev driver.DeviceID, size uint64, o driver.ChunkOptions) (driver.Handle, error) {
	if err := f.call("create"); err != nil {
		return 0, err
	}
	h, err := f.Driver.Create(dev, size, o)
	if err == nil {
		f.mu.Lock()
		f.live[h] = true
		f.mu.Unlock()
	}
	return h, err
}

func (f *faulty) Release(h driver.Handle) error {
	if err := f.call("release"); err != nil {
		return err
	}
	f.mu.Lock()
	if !f.live[h] {
		f.doubles++
	}
	delete(f.live, h)
	f.mu.Unlock()
	return f.Driver.Release(h)
}

func (f *faulty) Map(a driver.Addr, h driver.Handle) error {
	if err := f.call("map"); err != nil {
		return err
	}
	return f.Driver.Map(a, h)
}

func (f *faulty) Unmap(a driver.Addr, n uint64) error {
	if err := f.call("unmap"); err != nil {
		return err
	}
	return f.Driver.Unmap(a, n)
}

func (f *faulty) SetAccess(a driver.Addr, n uint64, dev driver.DeviceID, acc driver.Access) error {
	if err := f.call("access"); err != nil {
		return err
	}
	return f.Driver.SetAccess(a, n, dev, acc)
}

func (f *faulty) Write(a driver.Addr, p []byte) error {
	if err := f.call("write"); err != nil {
		return err
	}
	return f.Driver.Write(a, p)
}

// model fills a few allocations in tag "w" (some freed, leaving free
// chunks between live ones) and returns them with their contents.
func fillModel(t testing.TB, d driver.Driver, m *Manager) map[driver.Addr][]byte {
	t.Helper()
	want := map[driver.Addr][]byte{}
	var drop []driver.Addr
	for i, n := range []uint64{256 * kib, 100 * kib, 512 * kib, 10, 200 * kib, 64 * kib} {
		p, err := m.Alloc("w", n)
		require.NoError(t, err)
		b := pattern(uint64(i), n)
		require.NoError(t, d.Write(p, b))
		if i%3 == 2 {
			drop = append(drop, p)
		} else {
			want[p] = b
		}
	}
	for _, p := range drop {
		require.NoError(t, m.Free(p))
	}
	return want
}

func requireContents(t testing.TB, d driver.Driver, want map[driver.Addr][]byte) {
	t.Helper()
	for p, b := range want {
		require.Equal(t, b, read(t, d, p, uint64(len(b))), "contents at %s", p)
	}
}

// TestSleepFreesAllItShould (vLLM #32714, sleep freeing 6 GB of 20+;
// torch_memory_saver #83, pause that frees nothing): after allocations
// and frees that leave free chunks among live ones, sleep gives back
// every byte the tag holds, free chunks included.
func TestSleepFreesAllItShould(t *testing.T) {
	d := openHost(t, testCap)
	m := newManager(t, d)
	want := fillModel(t, d, m)
	require.NotZero(t, d.Used(0))
	require.NoError(t, m.Sleep(Host))
	require.Zero(t, d.Used(0), "sleep gives back all the tag's memory")
	require.NoError(t, m.Wake())
	requireContents(t, d, want)
	closeAll(t, m)
}

// TestNoDoubleReleaseAcrossCycles (vLLM #36651, a double cuMemRelease
// across sleep/wake cycles; torch_memory_saver #92, a free while paused
// that releases twice): over cycles with frees and allocations between
// them, and frees while asleep, every real chunk is released exactly
// once, and creates equal releases at the end.
func TestNoDoubleReleaseAcrossCycles(t *testing.T) {
	f := newFaulty(t, testCap)
	m := newManager(t, f)
	want := fillModel(t, f, m)
	for cycle := range 20 {
		require.NoError(t, m.Sleep(Mode(cycle%3)))
		if cycle%4 == 1 { // free one while asleep
			for p := range want {
				require.NoError(t, m.Free(p))
				delete(want, p)
				break
			}
		}
		require.NoError(t, m.Wake())
		if cycle%3 != int(Discard) {
			requireContents(t, f, want)
		} else {
			for p, b := range want {
				require.NoError(t, f.Write(p, b))
			}
		}
		p, err := m.Alloc("w", uint64(cycle+1)*20*kib)
		require.NoError(t, err)
		b := pattern(uint64(cycle), uint64(cycle+1)*20*kib)
		require.NoError(t, f.Write(p, b))
		want[p] = b
		require.NoError(t, m.Check())
	}
	closeAll(t, m)
	require.Zero(t, f.doubles, "no real chunk released twice")
	require.Empty(t, f.live, "every real chunk released")
	require.Zero(t, f.Used(0))
}

// TestFreeWhileAsleep (torch_memory_saver #92): a free while the tag
// sleeps gives back that allocation's backup at once (its host buffer,
// its blocks of the backup file), releases no
// memory (it went back at sleep), and the wake that follows restores the
// rest; a second free of it is refused.
func TestFreeWhileAsleep(t *testing.T) {
	for _, mode := range []Mode{Host, File, Discard} {
		t.Run(mode.String(), func(t *testing.T) {
			f := newFaulty(t, testCap)
			m := newManager(t, f)
			want := fillModel(t, f, m)
			require.NoError(t, m.Sleep(mode))
			before := stats(t, m, "w")
			releases := f.count("release")
			var gone driver.Addr // the largest, whose file blocks are its own
			for p, b := range want {
				if gone == 0 || len(b) > len(want[gone]) {
					gone = p
				}
			}
			if mode == File {
				fileBlocksDrop(t, m, func() { require.NoError(t, m.Free(gone)) })
			} else {
				require.NoError(t, m.Free(gone))
			}
			require.Equal(t, releases, f.count("release"), "a free while asleep releases nothing")
			if mode != Discard {
				require.Equal(t, before.BackupBytes-uint64(len(want[gone])), stats(t, m, "w").BackupBytes)
			}
			require.ErrorIs(t, m.Free(gone), driver.ErrNotAllocated)
			delete(want, gone)
			require.NoError(t, m.Wake())
			if mode != Discard {
				requireContents(t, f, want)
			}
			closeAll(t, m)
			require.Zero(t, f.doubles)
			require.Zero(t, f.Used(0))
		})
	}
}

// TestNoLeakThenOOMAtWake (vLLM #47654, HBM leaked by each cycle until a
// wake runs out of memory): on a device that holds two tags and little
// more, a hundred cycles never run out, and the device's used bytes
// after each wake are what they were after the first (the first sleep
// trims the chunks the allocator kept free).
func TestNoLeakThenOOMAtWake(t *testing.T) {
	d := openHost(t, 8*mib)
	m, err := New(d, Options{TagMax: 4 * mib, ChunkSize: testCS})
	require.NoError(t, err)
	p, err := m.Alloc("w", 3*mib)
	require.NoError(t, err)
	q, err := m.Alloc("kv", 3*mib)
	require.NoError(t, err)
	var used uint64
	for i := range 100 {
		require.NoError(t, m.Sleep(Host, "w"))
		require.NoError(t, m.Sleep(Discard, "kv"))
		require.Equal(t, uint64(0), d.Used(0))
		require.NoError(t, m.Wake("w", "kv"))
		if i == 0 {
			used = d.Used(0)
		}
		require.Equal(t, used, d.Used(0))
	}
	require.NoError(t, m.Free(p))
	require.NoError(t, m.Free(q))
	require.NoError(t, m.Close())
}

// TestHostBackupsFreedAtWake (vLLM #21336, pinned host pages growing
// every cycle; torch_memory_saver #90, host backups resident after
// resume): the backup's pinned buffers are the driver's and all go back
// at wake — the process holds no more mappings, descriptors or shared
// memory after a cycle than before it.
func TestHostBackupsFreedAtWake(t *testing.T) {
	d := openHost(t, testCap)
	m := newManager(t, d)
	want := fillModel(t, d, m)
	var failed error
	_, _, same, err := leakcheck.Compare(5, func() {
		if failed == nil {
			failed = errors.CombineErrors(m.Sleep(Host), m.Wake())
		}
	})
	require.NoError(t, err)
	require.NoError(t, failed)
	require.True(t, same, "a cycle leaves the process holding what it held")
	require.Zero(t, stats(t, m, "w").BackupBytes)
	requireContents(t, d, want)
	closeAll(t, m)
}

// TestCloseWhileAsleep: allocations freed while their tag sleeps, then
// Close: the backups go (the file too), nothing is created again and
// nothing released twice, and the driver is left holding nothing.
func TestCloseWhileAsleep(t *testing.T) {
	for _, mode := range []Mode{Host, File} {
		f := newFaulty(t, testCap)
		dir := t.TempDir()
		m, err := New(f, Options{TagMax: testTMax, ChunkSize: testCS, BackupDir: dir})
		require.NoError(t, err)
		want := fillModel(t, f, m)
		require.NoError(t, m.Sleep(mode))
		creates := f.count("create")
		for p := range want {
			require.NoError(t, m.Free(p))
		}
		require.Zero(t, stats(t, m, "w").BackupBytes)
		require.NoError(t, m.Close())
		require.Equal(t, creates, f.count("create"), "nothing is committed again to be closed")
		require.Zero(t, f.doubles)
		require.Empty(t, f.live)
		require.Zero(t, f.Used(0))
		left, err := os.ReadDir(dir)
		require.NoError(t, err)
		require.Empty(t, left, "the backup file is removed")
	}
}

// fileBlocksDrop runs free and checks that the backup file of tag "w"
// holds fewer blocks after it, on file systems that punch holes.
func fileBlocksDrop(t *testing.T, m *Manager, free func()) {
	t.Helper()
	blocks := func() int64 { return fileBlocks(t, m.tags["w"].bk.file.Name()) }
	before := blocks()
	free()
	after := blocks()
	if before < 0 {
		t.Logf("this platform does not report a file's blocks")
		return
	}
	if before == after {
		t.Logf("the file system of %s keeps the blocks (no hole punched)", m.o.BackupDir)
		return
	}
	require.Less(t, after, before, "the freed allocation's blocks of the backup file go back")
}

// TestFileBackupErrorsAreMarked: a File sleep whose backup directory is
// not there, or may not be written, fails with the sentinel a caller
// tests for (ErrInvalid, ErrAccessDenied), and the tag stays awake with
// its bytes.
func TestFileBackupErrorsAreMarked(t *testing.T) {
	d := openHost(t, 16*mib)
	readOnly := t.TempDir()
	require.NoError(t, os.Chmod(readOnly, 0o500))
	t.Cleanup(func() { _ = os.Chmod(readOnly, 0o700) })
	for _, c := range []struct {
		dir  string
		want error
	}{
		{filepath.Join(t.TempDir(), "absent"), driver.ErrInvalid},
		{readOnly, driver.ErrAccessDenied},
	} {
		if c.want == driver.ErrAccessDenied && os.Geteuid() == 0 {
			continue // root writes a directory whatever its mode
		}
		m, err := New(d, Options{TagMax: testTMax, ChunkSize: testCS, BackupDir: c.dir})
		require.NoError(t, err)
		p, err := m.Alloc("w", 100*kib)
		require.NoError(t, err)
		want := pattern(7, 100*kib)
		require.NoError(t, d.Write(p, want))
		err = m.Sleep(File, "w")
		require.ErrorIs(t, err, c.want, "%s", c.dir)
		requireContents(t, d, map[driver.Addr][]byte{p: want})
		require.NoError(t, m.Check())
		closeAll(t, m)
	}
}

// TestRefusedFirstAllocMakesNoTag: a tag whose first allocation is
// refused is not made — Stats does not list it and Sleep answers that
// there is no such tag — while a refused allocation in a tag that exists
// keeps it; the device holds what it held before.
func TestRefusedFirstAllocMakesNoTag(t *testing.T) {
	d := openHost(t, 8*mib)
	m, err := New(d, Options{TagMax: 4 * mib, ChunkSize: testCS})
	require.NoError(t, err)
	p, err := m.Alloc("kv", 2*mib)
	require.NoError(t, err)
	tags := func() (names []string) {
		for _, st := range m.Stats() {
			names = append(names, st.Tag)
		}
		return names
	}
	before, used := tags(), d.Used(0)

	_, err = m.Alloc("weights", 8*mib)
	require.Error(t, err)
	require.Contains(t, err.Error(), `tag "weights"`)
	require.Equal(t, before, tags())
	// Past TagMax, refused before anything is done: the device holds
	// what it held.
	require.Equal(t, used, d.Used(0))
	err = m.Sleep(Discard, "weights")
	require.ErrorIs(t, err, driver.ErrInvalid)
	require.Contains(t, err.Error(), `no tag "weights"`)

	_, err = m.Alloc("kv", 8*mib)
	require.Error(t, err)
	require.Equal(t, before, tags(), "a tag that exists stays")
	q, err := m.Alloc("weights", 2*mib)
	require.NoError(t, err, "the name is free for a first allocation that fits")
	require.NoError(t, m.Free(q))
	require.NoError(t, m.Free(p))
	require.NoError(t, m.Close())
}

// TestRefusedSleepKeepsFreeMemory: a Sleep refused before anything is
// backed up — a BackupDir that is a file, not a directory (ErrInvalid); a
// Host sleep on the sim driver, which has no bytes (ErrUnsupported) —
// leaves the tag as it was: awake, its free chunks still committed for
// its next allocations (Stats equal before and after), the device's used
// bytes unchanged. A valid Sleep and Wake follow.
func TestRefusedSleepKeepsFreeMemory(t *testing.T) {
	notDir := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(notDir, nil, 0o600))
	simDrv, err := sim.New(sim.Options{Devices: 1, Capacity: testCap, Granularity: 4 * kib})
	require.NoError(t, err)
	drivertest.CloseAtEnd(t, simDrv)
	for _, c := range []struct {
		name string
		d    interface {
			driver.Driver
			Used(driver.DeviceID) uint64
		}
		mode Mode
		want error
	}{
		{"file into a file", openHost(t, testCap), File, driver.ErrInvalid},
		{"host on sim", simDrv, Host, driver.ErrUnsupported},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, err := New(c.d, Options{TagMax: testTMax, ChunkSize: testCS, BackupDir: notDir})
			require.NoError(t, err)
			_, err = m.Alloc("w", 100) // live: closeAll frees it
			require.NoError(t, err)
			q, err := m.Alloc("w", 300*kib)
			require.NoError(t, err)
			require.NoError(t, m.Free(q)) // its chunks stay committed in the tag
			before, used := m.Stats(), c.d.Used(0)
			require.Greater(t, before[0].AwakeBytes, testCS)
			err = m.Sleep(c.mode, "w")
			require.ErrorIs(t, err, c.want)
			require.ErrorContains(t, err, `sleep: `+c.mode.String()+` backup of tag "w"`)
			require.Equal(t, before, m.Stats())
			require.Equal(t, used, c.d.Used(0))
			require.NoError(t, m.Check())
			require.NoError(t, m.Sleep(Discard, "w"))
			require.NoError(t, m.Wake("w"))
			closeAll(t, m)
			require.Zero(t, c.d.Used(0))
		})
	}
}

// TestAllocPastTagMaxTrimsNothing: an Alloc larger than TagMax, which no
// tag can ever hold, is refused (ErrOutOfMemory, naming the tag and
// TagMax) before anything is done: the other tags keep their free chunks
// committed (Stats and the device's used bytes as before), no tag is
// made for it, and an Alloc that fits follows.
func TestAllocPastTagMaxTrimsNothing(t *testing.T) {
	d := openHost(t, testCap)
	m := newManager(t, d)
	keep, err := m.Alloc("kv", 100)
	require.NoError(t, err)
	q, err := m.Alloc("kv", 2*mib)
	require.NoError(t, err)
	require.NoError(t, m.Free(q)) // its chunks stay committed in "kv"
	before, used := m.Stats(), d.Used(0)
	require.Greater(t, before[0].AwakeBytes, 2*mib)
	for _, c := range []struct {
		tag  string
		size uint64
	}{{"kv", testTMax + 1}, {"weights", testTMax + 1}, {"weights", math.MaxUint64}} {
		_, err := m.Alloc(c.tag, c.size)
		require.ErrorIs(t, err, driver.ErrOutOfMemory)
		require.ErrorContains(t, err, `sleep: alloc `)
		require.ErrorContains(t, err, `in tag "`+c.tag+`"`)
		require.ErrorContains(t, err, "TagMax")
		require.Equal(t, before, m.Stats())
		require.Equal(t, used, d.Used(0))
		require.NoError(t, m.Check())
	}
	p, err := m.Alloc("weights", testTMax)
	require.NoError(t, err, "TagMax itself fits")
	require.NoError(t, m.Free(p))
	require.NoError(t, m.Free(keep))
	require.NoError(t, m.Close())
}
