package host

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"syscall"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"
	"golang.org/x/sys/unix"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/internal/ledger"
	"github.com/vmarena/vmarena/internal/leakcheck"
	"github.com/vmarena/vmarena/internal/procmaps"
	"github.com/vmarena/vmarena/internal/units"
)

// newTest returns a small host driver closed at the end of the test.
func newTest(t testing.TB, opts Options) *Driver {
	t.Helper()
	d, err := New(opts)
	require.NoError(t, err)
	t.Cleanup(func() {
		if err := d.tearDown(); err != nil {
			t.Errorf("tear down the host driver: %v", err)
		}
	})
	return d
}

func small() Options {
	return Options{Devices: 2, Capacity: 4 * units.MiB, Granularity: 64 * units.KiB}
}

func TestOptions(t *testing.T) {
	d := newTest(t, Options{})
	devs := d.Devices()
	require.Len(t, devs, 1)
	require.Equal(t, 2*units.MiB, devs[0].MinGranularity)
	require.NotZero(t, devs[0].Capacity)
	require.Zero(t, devs[0].Capacity%devs[0].MinGranularity)

	for _, bad := range []Options{
		{Granularity: 3 << 20}, {Granularity: 1024}, {Devices: -1}, {Devices: driver.MaxDevices + 1},
		{Capacity: 3 * units.MiB, Granularity: 2 * units.MiB},
	} {
		_, err := New(bad)
		require.True(t, errors.Is(err, driver.ErrInvalid) || errors.Is(err, driver.ErrMisaligned), "%+v: %v", bad, err)
	}
}

// TestDefaultCapacity: the default capacity is half of MemAvailable, split
// between the devices and rounded down to the granularity. MemAvailable is
// read from a file of the test's own: the machine's moves with every other
// process (a test that compared the capacity with a second reading of
// /proc/meminfo failed whenever another process committed memory between
// the two).
func TestDefaultCapacity(t *testing.T) {
	const lines = "MemTotal:       24683520 kB\nMemFree:        22286848 kB\nMemAvailable:   %d kB\nShmem:      8192 kB\n"
	for _, c := range []struct {
		availKiB uint64
		devices  int
		want     uint64
	}{
		{availKiB: 16 * units.GiB / units.KiB, devices: 1, want: 8 * units.GiB},
		{availKiB: 16 * units.GiB / units.KiB, devices: 3, want: 8 * units.GiB / 3 / (2 * units.MiB) * (2 * units.MiB)},
		{availKiB: 5*units.MiB/units.KiB + 3, devices: 1, want: 2 * units.MiB},
	} {
		opts := fakeMachine(t, fmt.Sprintf(lines, c.availKiB))
		opts.Devices = c.devices
		d := newTest(t, opts)
		for _, dev := range d.Devices() {
			require.Equal(t, c.want, dev.Capacity, "MemAvailable %d KiB, %d devices", c.availKiB, c.devices)
		}
	}
	_, err := New(fakeMachine(t, fmt.Sprintf(lines, 3*units.MiB/units.KiB)))
	drivertest.RequireIs(t, err, driver.ErrOutOfMemory, "3 MiB available, too little for 1 devices")
	_, err = New(fakeMachine(t, "MemTotal: 1 kB\n"))
	require.ErrorContains(t, err, "has no MemAvailable line")
	opts := fakeMachine(t, "MemTotal: 1048576 kB\nMemAvailable: 0 kB\n")
	opts.Capacity = 4 * units.MiB
	d := newTest(t, opts)
	require.Equal(t, 4*units.MiB, d.Devices()[0].Capacity, "an explicit capacity takes nothing of MemAvailable")
}

// TestProcMapsFollowStates checks the kernel's own view of each state:
// reserved is private PROT_NONE, mapped is the shared memfd with PROT_NONE,
// accessible carries the widest access of any device.
func TestProcMapsFollowStates(t *testing.T) {
	d := newTest(t, small())
	g := d.Granularity()
	base, err := d.Reserve(8*g, 0, 0)
	require.NoError(t, err)
	perms := func(a driver.Addr) procmaps.Entry {
		es, err := procmaps.Read()
		require.NoError(t, err)
		e, ok := procmaps.Find(es, uint64(a))
		require.True(t, ok)
		return e
	}
	require.Equal(t, "---p", perms(base).Perms)
	h, err := d.Create(1, 2*g, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, d.Map(base+driver.Addr(g), h))
	e := perms(base + driver.Addr(g))
	require.Equal(t, "---s", e.Perms)
	require.Contains(t, e.Path, "vmarena-host1-heap")
	require.NoError(t, d.SetAccess(base+driver.Addr(g), g, 0, driver.AccessRead))
	require.Equal(t, "r--s", perms(base+driver.Addr(g)).Perms)
	require.Equal(t, "---s", perms(base+driver.Addr(2*g)).Perms)
	require.NoError(t, d.SetAccess(base+driver.Addr(g), 2*g, 1, driver.AccessReadWrite))
	require.Equal(t, "rw-s", perms(base+driver.Addr(2*g)).Perms)
	require.NoError(t, d.SetAccess(base+driver.Addr(g), 2*g, 1, driver.AccessNone))
	require.Equal(t, "r--s", perms(base+driver.Addr(g)).Perms, "device 0 still reads the first granule")
	require.Equal(t, "---s", perms(base+driver.Addr(2*g)).Perms)
	require.NoError(t, d.Unmap(base+driver.Addr(g), 2*g))
	require.Equal(t, "---p", perms(base+driver.Addr(g)).Perms)
}

// TestAdjacentChunksMerge checks that chunks created one after another and
// mapped side by side with the same access cost one kernel mapping, not one
// each (vm.max_map_count is 65,530).
func TestAdjacentChunksMerge(t *testing.T) {
	d := newTest(t, Options{Devices: 1, Capacity: 64 * units.MiB, Granularity: 64 * units.KiB})
	g := d.Granularity()
	const n = 64
	base, err := d.Reserve(n*g, 0, 0)
	require.NoError(t, err)
	for i := 0; i < n; i++ {
		h, err := d.Create(0, g, driver.ChunkOptions{})
		require.NoError(t, err)
		require.NoError(t, d.Map(base+driver.Addr(uint64(i)*g), h))
	}
	require.NoError(t, d.SetAccess(base, n*g, 0, driver.AccessReadWrite))
	es, err := procmaps.Read()
	require.NoError(t, err)
	in := procmaps.Within(es, uint64(base), uint64(base)+n*g)
	require.Len(t, in, 1, "%d chunks mapped side by side should be one kernel mapping: %+v", n, in)
}

func minorFaults(t *testing.T) int64 {
	var ru syscall.Rusage
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_THREAD, &ru))
	return ru.Minflt
}

// TestPopulateOnGrant checks that granting access fills the page tables:
// touching every page afterwards takes (almost) no faults, where without
// populate every page faults.
func TestPopulateOnGrant(t *testing.T) {
	const size = 2 * units.MiB
	touch := func(opts Options) int64 {
		d := newTest(t, opts)
		base, err := d.Reserve(size, 0, 0)
		require.NoError(t, err)
		h, err := d.Create(0, size, driver.ChunkOptions{})
		require.NoError(t, err)
		require.NoError(t, d.Map(base, h))
		require.NoError(t, d.SetAccess(base, size, 0, driver.AccessReadWrite))
		var faults int64
		require.NoError(t, d.books.WithRange("touch", base, size, driver.AccessReadWrite, func(r *ledger.Region) error {
			mem := bytesAt(r, base, int(size))
			before := minorFaults(t)
			for i := 0; i < len(mem); i += 4096 {
				mem[i] = 1
			}
			faults = minorFaults(t) - before
			return nil
		}))
		return faults
	}
	// Faults are counted per thread: keep the goroutine on one.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	pages := int64(size / 4096)
	with := touch(Options{Capacity: size})
	without := touch(Options{Capacity: size, NoPopulate: true})
	t.Logf("faults touching %d pages: %d with populate, %d without", pages, with, without)
	require.Less(t, with, pages/8)
	require.Greater(t, without, pages/2)
}

// TestFaultBecomesAccessDenied checks the backstop under Read and Write: a
// copy from memory the kernel refuses returns ErrAccessDenied, no crash.
func TestFaultBecomesAccessDenied(t *testing.T) {
	p, err := unix.MmapPtr(-1, 0, nil, 4096, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	require.NoError(t, err)
	defer unix.MunmapPtr(p, 4096)
	mem := unsafe.Slice((*byte)(p), 4096)
	buf := make([]byte, 16)
	err = copyFaulting(buf, mem)
	require.True(t, errors.Is(err, driver.ErrAccessDenied), "%v", err)
	err = copyFaulting(mem, buf)
	require.True(t, errors.Is(err, driver.ErrAccessDenied), "%v", err)
	require.NoError(t, copyFaulting(buf, make([]byte, 16)))
}

// TestCloseReturnsEverything is the leak test: descriptors, kernel
// mappings and resident shared memory are back where they started after
// Close, and heap blocks go back to the kernel as chunks are released.
func TestCloseReturnsEverything(t *testing.T) {
	work := func(release bool) {
		d, err := New(Options{Devices: 2, Capacity: 16 * units.MiB, Granularity: 64 * units.KiB})
		require.NoError(t, err)
		g := d.Granularity()
		base, err := d.Reserve(64*g, 0, 0)
		require.NoError(t, err)
		var hs []driver.Handle
		for i := 0; i < 16; i++ {
			h, err := d.Create(driver.DeviceID(i%2), 2*g, driver.ChunkOptions{Shareable: i%4 == 0})
			require.NoError(t, err)
			require.NoError(t, d.Map(base+driver.Addr(uint64(3*i)*g), h))
			require.NoError(t, d.SetAccess(base+driver.Addr(uint64(3*i)*g), 2*g, 0, driver.AccessReadWrite))
			require.NoError(t, d.Write(base+driver.Addr(uint64(3*i)*g), []byte{1, 2, 3}))
			hs = append(hs, h)
		}
		hb, err := d.HeapBytes(0)
		require.NoError(t, err)
		require.Equal(t, 4*2*g, hb, "device 0 heap holds its 4 non-shareable chunks (the 4 shareable ones have memfds of their own)")
		if release {
			for i, h := range hs {
				require.NoError(t, d.Unmap(base+driver.Addr(uint64(3*i)*g), 2*g))
				require.NoError(t, d.Release(h))
			}
			for dev := driver.DeviceID(0); dev < 2; dev++ {
				hb, err := d.HeapBytes(dev)
				require.NoError(t, err)
				require.Zero(t, hb, "punch-hole returned device %d's heap", dev)
				require.Zero(t, d.Used(dev))
			}
		}
		require.NoError(t, d.Check())
		if !release {
			// Close refuses while anything is mapped; unmapping is enough
			// for it to take down the chunks and the reservation.
			require.True(t, errors.Is(d.Close(), driver.ErrBusy))
			for i := range hs {
				require.NoError(t, d.Unmap(base+driver.Addr(uint64(3*i)*g), 2*g))
			}
		}
		require.NoError(t, d.Close())
	}
	for _, release := range []bool{false, true} {
		before, after, same, err := leakcheck.Compare(3, func() { work(release) })
		require.NoError(t, err)
		require.True(t, same, "release=%v: %v before, %v after", release, before, after)
	}
}

// TestCloseWithUnreportedClosedError: a stream whose failed work is itself
// marked ErrClosed (say, it used something closed) must not make Close
// think the driver was closed already and skip returning everything.
func TestCloseWithUnreportedClosedError(t *testing.T) {
	d, err := New(small())
	require.NoError(t, err)
	s, err := d.CreateStream(0)
	require.NoError(t, err)
	require.NoError(t, d.LaunchHostFunc(s, "uses a closed thing", func() error { return driver.Closed("something") }))
	_, err = d.Reserve(d.Granularity(), 0, 0)
	require.NoError(t, err)
	err = d.Close()
	require.True(t, errors.Is(err, driver.ErrClosed), "the stream's failure is reported: %v", err)
	_, err = d.Reserve(d.Granularity(), 0, 0)
	require.True(t, errors.Is(err, driver.ErrClosed), "the ledger closed too: %v", err)
	require.True(t, errors.Is(d.Close(), driver.ErrClosed))
}

// TestImportSealedMemfd: a memory file sealed as the host driver seals its
// exports, of the right size and committed, is memory like any export — the host
// driver's descriptors are plain memfds, so one made by hand imports. (The
// conformance suite checks only the refusals: what an accepted descriptor
// looks like is each driver's own.)
func TestImportSealedMemfd(t *testing.T) {
	d := newTest(t, small())
	g := d.Devices()[1].MinGranularity
	fd := handMadeMemfd(t, g, g, true)
	h, err := d.Import(driver.Shareable{Type: driver.HandlePOSIXFD, FD: fd, Size: g}, 1)
	require.NoError(t, err)
	require.Equal(t, g, d.Used(1))
	require.NoError(t, d.Release(h))
	require.Zero(t, d.Used(1))
}

// TestImportRefusesDescriptorNotReadWrite: a descriptor of a properly
// sealed memory file, opened read-only or write-only (a reopen through
// /proc/self/fd), cannot be mapped read-write, or mapped at all: Import
// refuses it (ErrInvalid) and keeps nothing. Accepted, a SetAccess
// (read-write) over it and a chunk mapped beside it failed in mprotect
// after the kernel had already made the neighbour writable, with the
// driver's books still saying no access.
func TestImportRefusesDescriptorNotReadWrite(t *testing.T) {
	d := newTest(t, small())
	g := d.Granularity()
	fd := handMadeMemfd(t, g, g, true)
	for _, mode := range []int{unix.O_RDONLY, unix.O_WRONLY} {
		reopened, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", fd), mode|unix.O_CLOEXEC, 0)
		require.NoError(t, err)
		defer unix.Close(reopened)
		fds, err := os.ReadDir("/proc/self/fd")
		require.NoError(t, err)
		_, err = d.Import(driver.Shareable{Type: driver.HandlePOSIXFD, FD: reopened, Size: g}, 1)
		drivertest.RequireIs(t, err, driver.ErrInvalid, "host: import of descriptor", "not open for reading and writing")
		after, err := os.ReadDir("/proc/self/fd")
		require.NoError(t, err)
		require.Equal(t, len(fds), len(after), "the driver keeps no descriptor of a refused import")
		require.Zero(t, d.Used(1))
		require.NoError(t, d.Check())
	}
	h, err := d.Import(driver.Shareable{Type: driver.HandlePOSIXFD, FD: fd, Size: g}, 1)
	require.NoError(t, err, "the read-write descriptor imports")
	require.Equal(t, g, d.Used(1))
	require.NoError(t, d.Release(h))
}

// TestFailedProtectChangesNothing: an mprotect that fails part way over a
// run of several kernel mappings (here the second chunk's descriptor is
// read-only, slipped past Import's checks through the books; in the wild,
// vm.max_map_count reached while splitting) leaves the mappings before
// the failure as they were, so the failed SetAccess changes nothing in the
// kernel either: the books say no access, and no page is writable.
func TestFailedProtectChangesNothing(t *testing.T) {
	d := newTest(t, small())
	g := d.Granularity()
	fd := handMadeMemfd(t, g, 0, false)
	ro, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", fd), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	defer unix.Close(ro)
	bad, err := d.books.Import(1, g, func(c *ledger.Chunk) error {
		dup, err := unix.FcntlInt(uintptr(ro), unix.F_DUPFD_CLOEXEC, 0)
		c.Backing = &chunkMem{fd: dup, own: true}
		return err
	})
	require.NoError(t, err)
	good, err := d.Create(1, g, driver.ChunkOptions{})
	require.NoError(t, err)
	base, err := d.Reserve(2*g, 0, 0)
	require.NoError(t, err)
	require.NoError(t, d.Map(base, good))
	require.NoError(t, d.Map(base+driver.Addr(g), bad))

	err = d.SetAccess(base, 2*g, 0, driver.AccessReadWrite)
	require.ErrorContains(t, err, "host: set access of device 0")
	require.ErrorContains(t, err, "mprotect")
	es, err := procmaps.Read()
	require.NoError(t, err)
	for _, at := range []driver.Addr{base, base + driver.Addr(g)} {
		e, ok := procmaps.Find(es, uint64(at))
		require.True(t, ok)
		require.Equal(t, "---s", e.Perms, "%s: the failed SetAccess left the kernel's protection as it was", at)
		a, err := d.Access(at, 0)
		require.NoError(t, err)
		require.Equal(t, driver.AccessNone, a)
	}
	require.NoError(t, d.Check())
	require.NoError(t, d.SetAccess(base, g, 0, driver.AccessReadWrite), "the good chunk alone still takes access")
	require.NoError(t, d.Write(base, []byte{1}))
	require.NoError(t, d.Unmap(base+driver.Addr(g), g))
	require.NoError(t, d.Unmap(base, g))
	require.NoError(t, d.Release(bad))
	require.NoError(t, d.Release(good))
}

// TestImportRefusesUncommittedMemfd: a sealed memory file of the right
// size whose pages were never allocated (ftruncate only, or with a hole
// punched in it) is refused (ErrInvalid) and nothing is kept: its memory
// would be allocated at first touch, after Import had counted it as
// committed, where running out is the OOM killer and not an error. The
// same file committed throughout (fallocate, as Create commits a
// shareable chunk) imports.
func TestImportRefusesUncommittedMemfd(t *testing.T) {
	d := newTest(t, small())
	g := d.Granularity()
	fd := handMadeMemfd(t, 2*g, g, true) // the first half allocated only
	sh := driver.Shareable{Type: driver.HandlePOSIXFD, FD: fd, Size: 2 * g}
	fds, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	_, err = d.Import(sh, 1)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "host: import of descriptor", "not committed throughout", "64 KiB of 128 KiB")
	after, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	require.Equal(t, len(fds), len(after), "the driver keeps no descriptor of a refused import")
	require.Zero(t, d.Used(1))
	require.NoError(t, d.Check())

	require.NoError(t, unix.Fallocate(fd, 0, 0, int64(2*g)))
	h, err := d.Import(sh, 1)
	require.NoError(t, err, "committed throughout, it imports")
	require.Equal(t, 2*g, d.Used(1))
	require.NoError(t, d.Release(h))
}

// TestRangePastTheTopNamed: a range that starts inside a reservation but
// whose size runs past the end of the address space (HostBytes and
// SetAccess of 2^64-1 bytes) is ErrNotReserved saying so, not "not inside
// any reservation" about an address that is; nothing changes.
func TestRangePastTheTopNamed(t *testing.T) {
	d := newTest(t, small())
	g := d.Granularity()
	base, err := d.Reserve(2*g, 0, 0)
	require.NoError(t, err)
	h, err := d.Create(0, g, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, d.Map(base, h))
	_, err = d.HostBytes(base, math.MaxUint64)
	drivertest.RequireIs(t, err, driver.ErrNotReserved, "host: host bytes", "runs past the end of the address space")
	require.NotContains(t, err.Error(), "not inside any reservation")
	err = d.SetAccess(base, math.MaxUint64-g+1, 0, driver.AccessRead)
	drivertest.RequireIs(t, err, driver.ErrNotReserved, "host: set access", "runs past the end of the address space")
	a, err := d.Access(base, 0)
	require.NoError(t, err)
	require.Equal(t, driver.AccessNone, a)
	require.NoError(t, d.Check())
	require.NoError(t, d.SetAccess(base, g, 0, driver.AccessRead))
	require.NoError(t, d.Unmap(base, g))
	require.NoError(t, d.Release(h))
}

// TestCloseRacingMap: drivertest.CloseRacingMap, and the reservations,
// chunks, heaps and descriptors all go with the Close that succeeds.
func TestCloseRacingMap(t *testing.T) {
	before, after, same, err := leakcheck.Compare(3, func() {
		d, err := New(small())
		require.NoError(t, err)
		drivertest.CloseRacingMap(t, d)
	})
	require.NoError(t, err)
	require.True(t, same, "%v before, %v after", before, after)
}

// TestCloseFromHostFuncWhileClosing: Close waits for the streams, and a
// host function it waits for may call Close too: that Close answers
// ErrClosed at once (the driver is closing) instead of waiting for the
// first, which waits for it.
func TestCloseFromHostFuncWhileClosing(t *testing.T) {
	d, err := New(small())
	require.NoError(t, err)
	drivertest.CloseFromHostFunc(t, d, "host")
}

// TestOutOfDescriptorsIsOutOfMemory: with the process's descriptor limit
// reached, creating a shareable chunk (a memfd of its own), exporting one
// and importing one each fail with ErrOutOfMemory naming the descriptor
// limit, and change nothing; once descriptors are free again the same
// calls work.
func TestOutOfDescriptorsIsOutOfMemory(t *testing.T) {
	d := newTest(t, small())
	g := d.Granularity()
	shared, err := d.Create(0, g, driver.ChunkOptions{Shareable: true})
	require.NoError(t, err)
	x, err := d.Export(shared)
	require.NoError(t, err)
	defer unix.Close(x.FD)
	unexported, err := d.Create(0, g, driver.ChunkOptions{Shareable: true})
	require.NoError(t, err)

	var old unix.Rlimit
	require.NoError(t, unix.Getrlimit(unix.RLIMIT_NOFILE, &old))
	es, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	// Fill every descriptor below a low limit, then lower the limit to it.
	limit := uint64(len(es) + 8)
	var fill []int
	for {
		fd, err := unix.Dup(0)
		if err != nil || uint64(fd) >= limit {
			if err == nil {
				unix.Close(fd)
			}
			break
		}
		fill = append(fill, fd)
	}
	lowered := old
	lowered.Cur = limit
	require.NoError(t, unix.Setrlimit(unix.RLIMIT_NOFILE, &lowered))
	restore := func() {
		require.NoError(t, unix.Setrlimit(unix.RLIMIT_NOFILE, &old))
		for _, fd := range fill {
			unix.Close(fd)
		}
		fill = nil
	}
	defer func() {
		if fill != nil {
			restore()
		}
	}()
	used := d.Used(0)
	_, err = d.Create(0, g, driver.ChunkOptions{Shareable: true})
	drivertest.RequireIs(t, err, driver.ErrOutOfMemory, "host: create", "descriptor")
	_, err = d.Export(unexported)
	drivertest.RequireIs(t, err, driver.ErrOutOfMemory, "host: export", "descriptor")
	_, err = d.Import(x, 1)
	drivertest.RequireIs(t, err, driver.ErrOutOfMemory, "host: import", "descriptor")
	require.Equal(t, used, d.Used(0))
	require.Zero(t, d.Used(1))
	require.NoError(t, d.Check())
	restore()

	h, err := d.Create(0, g, driver.ChunkOptions{Shareable: true})
	require.NoError(t, err)
	y, err := d.Export(unexported)
	require.NoError(t, err, "a failed export can be retried")
	require.NoError(t, unix.Close(y.FD))
	imp, err := d.Import(x, 1)
	require.NoError(t, err)
	for _, h := range []driver.Handle{imp, h, unexported, shared} {
		require.NoError(t, d.Release(h))
	}
}

// handMadeMemfd is a memory file of size bytes made as a peer would, not
// by the driver: the first allocated bytes allocated (fallocate), sealed
// as a shareable chunk's is (shareSeals) when seal. It is closed when
// the test ends.
func handMadeMemfd(t *testing.T, size, allocated uint64, seal bool) int {
	t.Helper()
	fd, err := unix.MemfdCreate("hand-made", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Close(fd) })
	require.NoError(t, unix.Ftruncate(fd, int64(size)))
	if allocated > 0 {
		require.NoError(t, unix.Fallocate(fd, 0, 0, int64(allocated)))
	}
	if seal {
		_, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, shareSeals)
		require.NoError(t, err)
	}
	return fd
}
