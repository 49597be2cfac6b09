package host

//go:generate go run ../internal/forward -docs forward.txt -out forward.go -build linux books=../internal/ledger:Ledger engine=../internal/queue:Engine

import (
	"fmt"
	"os"
	"strings"
	"unsafe"

	"github.com/vmarena/vmarena/internal/errors"
	"golang.org/x/sys/unix"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/internal/ledger"
	"github.com/vmarena/vmarena/driver/internal/queue"
	"github.com/vmarena/vmarena/internal/extent"
	"github.com/vmarena/vmarena/internal/sentinel"
	"github.com/vmarena/vmarena/internal/units"
)

// Driver is the host driver. It implements driver.Driver, and
// driver.Streams, driver.Sharing and driver.HostMapper. Its methods are
// safe for concurrent use.
type Driver struct {
	// books checks every call against the contract and records the
	// reservations, chunks, mappings and access it made; b makes the
	// system calls behind it.
	books  *ledger.Ledger
	engine *queue.Engine // the streams and events
	b      *backend
	hb     queue.HostBuffers // what HostAlloc handed out
}

var (
	_ driver.Driver     = (*Driver)(nil)
	_ driver.Books      = (*Driver)(nil)
	_ driver.HostMapper = (*Driver)(nil)
	_ driver.Streams    = (*Driver)(nil)
	_ driver.Sharing    = (*Driver)(nil)
)

// New opens a host driver: one memfd heap per logical device.
func New(opts Options) (*Driver, error) {
	mem, err := newMachine(opts.meminfo, opts.procCgroup, opts.cgroupRoot)
	if err != nil {
		return nil, errors.WithHint(err, "the host driver reads the machine's memory from /proc/meminfo")
	}
	opts, err = opts.withDefaults(mem.available)
	if err != nil {
		return nil, err
	}
	if err := mem.checkCapacity(opts.Devices, opts.Capacity); err != nil {
		return nil, err
	}
	nodes, err := numaPlan(opts.numaRoot, opts.Devices, opts.RequireNUMA)
	if err != nil {
		return nil, err
	}
	b := &backend{opts: opts, page: uint64(os.Getpagesize()), populate: !opts.NoPopulate, mem: mem}
	devs := make([]driver.Device, opts.Devices)
	for i := range devs {
		h, err := newHeap(i, opts.Capacity, opts.Granularity)
		if err != nil {
			_ = b.Close()
			return nil, err
		}
		b.heaps = append(b.heaps, h)
		if node := nodes[i]; node >= 0 {
			if err := bindFile(h.fd, h.span, node); err != nil {
				if opts.RequireNUMA {
					_ = b.Close()
					return nil, errors.Wrapf(err, "host: binding device %d's heap (Options.RequireNUMA)", i)
				}
			} else {
				h.node = node
			}
		}
		devs[i] = driver.Device{
			ID: driver.DeviceID(i), Name: fmt.Sprintf("host%d", i), Kind: driver.KindHost,
			Capacity: opts.Capacity, MinGranularity: opts.Granularity,
			RecommendedGranularity: max(opts.Granularity, 2*units.MiB),
			NUMANode:               h.node,
			CopyAlign:              opts.CopyAlign,
		}
	}
	l, err := ledger.New("host", devs, b, true)
	if err != nil {
		_ = b.Close()
		return nil, err
	}
	peer := func(dev, peer driver.DeviceID) bool { return !opts.NoPeerAccess }
	return &Driver{books: l, engine: queue.New("host", opts.Devices, peer), b: b}, nil
}

// Close releases and unreserves everything and gives the heaps back to
// the system, takes no more pinned host buffers, then waits for the
// streams to finish their work. The error reports stream work that failed
// and was not yet reported. While anything is mapped or a pinned host buffer
// is live it refuses with ErrBusy, naming them, and changes nothing: a
// slice or tensor over that memory would fault at its next touch. The
// check and the closing of the books (and of the host buffers) are one
// step each, so memory mapped or pinned while Close runs makes it refuse
// or is refused itself; stream work that runs while Close waits for the
// streams finds the driver closed. A second Close is ErrClosed, as is
// every later call.
func (d *Driver) Close() error {
	if d.unmade() {
		return errUnmade("Close")
	}
	if err := d.closeBooks(); err != nil {
		return err
	}
	return d.engine.Close() // failures of stream work not yet reported
}

// closeBooks is Close's first half: the host buffers and then the books
// (queue.HostBuffers.CloseWith).
func (d *Driver) closeBooks() error {
	return d.hb.CloseWith("host", d.engine, d.books, d.engine.Close)
}

// tearDown closes d whatever is mapped or pinned: for tests, whose
// subtests may end with memory mapped (Close refuses then).
func (d *Driver) tearDown() error {
	if d.engine.Closed() {
		return nil
	}
	err := d.engine.Close()
	return errors.CombineErrors(err, errors.CombineErrors(ledger.TearDown(d.books), d.closeHostBuffers()))
}

// Name is "host".
func (d *Driver) Name() string { return "host" }

// Supports reports true for FeatureHostAccess (Read, Write and HostBytes
// reach the memory), FeatureShareable (chunks can be exported to other
// processes) and FeatureStreams.
func (d *Driver) Supports(f driver.Feature) bool {
	if d.unmade() {
		return false
	}
	return f == driver.FeatureHostAccess || f == driver.FeatureShareable || f == driver.FeatureStreams
}

// Read copies len(p) bytes at addr into p. The range must lie inside one
// reservation (ErrNotReserved) and be mapped and readable throughout: a
// granule no device may read, or one reserved but not mapped, is
// ErrAccessDenied, never a crash.
func (d *Driver) Read(addr driver.Addr, p []byte) error {
	if d.unmade() {
		return errUnmade("Read")
	}
	return d.books.WithRange("read", addr, uint64(len(p)), driver.AccessRead, func(r *ledger.Region) error {
		return copyFaulting(p, bytesAt(r, addr, len(p)))
	})
}

// Write copies p to addr. The range must lie inside one reservation
// (ErrNotReserved) and be mapped and writable throughout, or it is
// ErrAccessDenied.
func (d *Driver) Write(addr driver.Addr, p []byte) error {
	if d.unmade() {
		return errUnmade("Write")
	}
	return d.books.WithRange("write", addr, uint64(len(p)), driver.AccessReadWrite, func(r *ledger.Region) error {
		return copyFaulting(bytesAt(r, addr, len(p)), p)
	})
}

// HostBytes returns [addr, addr+size) as a slice over the memory itself,
// with no copy. The range must be mapped and readable now (otherwise
// ErrAccessDenied; a zero size is ErrInvalid), and the slice is valid only
// while it stays mapped: a touch after Unmap faults. Writing through it
// needs read-write access.
func (d *Driver) HostBytes(addr driver.Addr, size uint64) ([]byte, error) {
	if d.unmade() {
		return nil, errUnmade("HostBytes")
	}
	var b []byte
	err := d.books.WithRange("host bytes", addr, size, driver.AccessRead, func(r *ledger.Region) error {
		b = bytesAt(r, addr, int(size))
		return nil
	})
	if err != nil {
		return nil, err
	}
	if b == nil {
		return nil, errors.Wrap(driver.ErrInvalid, "host: host bytes of zero size")
	}
	return b, nil
}

// Export returns the chunk h, created with ChunkOptions.Shareable, as a
// duplicate of its own memfd (a shareable chunk never lives in the device
// heap, so an export never exposes other chunks' memory); the caller
// closes the descriptor. A chunk not created shareable is ErrInvalid, a
// second export of the same chunk ErrBusy, an unknown or released handle
// ErrBadHandle.
func (d *Driver) Export(h driver.Handle) (driver.Shareable, error) {
	if d.unmade() {
		return *new(driver.Shareable), errUnmade("Export")
	}
	return d.books.Export(h, func(c *ledger.Chunk) (driver.Shareable, error) {
		m := c.Backing.(*chunkMem)
		fd, err := unix.FcntlInt(uintptr(m.fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return driver.Shareable{}, fdError(err, "dup")
		}
		return driver.Shareable{Type: driver.HandlePOSIXFD, FD: fd, Size: c.Size}, nil
	})
}

// shareSeals are the seals of a shareable chunk's memfd, set when it is
// created, before any other process can hold it. Another process gets the
// descriptor itself, and with it every file operation the descriptor
// allows; the seals take away those that would hurt the other holders:
//
//   - F_SEAL_SHRINK: ftruncate to a smaller size would drop the memory of
//     every process (its data gone, a touch of the mappings past the new
//     end a SIGBUS, a library read a fault);
//   - F_SEAL_GROW: a larger size would let a holder make the file, and the
//     memory charged for it, bigger than the chunk the exporter created;
//   - F_SEAL_SEAL: no holder can add seals later. Without it a holder could
//     add F_SEAL_WRITE or F_SEAL_FUTURE_WRITE, after which the exporter, or
//     any other importer, could no longer map the chunk writable: its next
//     SetAccess(read-write) would fail. The seals are the exporter's to set,
//     once.
//
// Writes stay allowed: sharing read-write memory is the point.
const shareSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// Import makes a chunk on device dev of a descriptor another process
// exported; it counts against the device's capacity like a created chunk
// (ErrOutOfMemory). The chunk keeps its own duplicate of the descriptor;
// the memory goes when every process has closed its duplicates and
// unmapped it.
//
// The descriptor must be a memory file of exactly the chunk's size,
// committed throughout (its blocks allocated, as Create's fallocate leaves
// a shareable chunk's), sealed as a shareable chunk's is (shareSeals;
// F_SEAL_EXEC, which the kernel may add, is allowed), not sealed against
// writing, and open for reading and writing: memory not yet allocated
// would be allocated at first touch, past the out-of-memory checks (the
// OOM killer's, not an error); a file some holder can resize could lose
// its memory under the mappings; and one sealed against writes, or a
// descriptor opened read-only or write-only, could not be mapped
// read-write. Anything else
// is ErrInvalid, naming what is wrong; the driver keeps nothing of it (the
// caller still closes its descriptor).
func (d *Driver) Import(sh driver.Shareable, dev driver.DeviceID) (driver.Handle, error) {
	if d.unmade() {
		return *new(driver.Handle), errUnmade("Import")
	}
	if sh.Type != driver.HandlePOSIXFD {
		return 0, errors.Wrapf(driver.ErrInvalid, "host: import: handle type %d, the host driver shares POSIX file descriptors (%d)",
			sh.Type, driver.HandlePOSIXFD)
	}
	if err := checkShared(sh); err != nil {
		return 0, errors.Wrapf(err, "host: import of descriptor %d as a chunk of %s", sh.FD, units.Bytes(sh.Size))
	}
	return d.books.Import(dev, sh.Size, func(c *ledger.Chunk) error {
		fd, err := unix.FcntlInt(uintptr(sh.FD), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return fdError(err, "dup")
		}
		c.Backing = &chunkMem{fd: fd, own: true}
		return nil
	})
}

// checkShared returns nil when the descriptor of sh is a memory file of
// sh.Size bytes, committed throughout, that no holder can resize, open for
// reading and writing, and otherwise an ErrInvalid
// that says what it is instead.
func checkShared(sh driver.Shareable) error {
	var st unix.Stat_t
	if err := unix.Fstat(sh.FD, &st); err != nil {
		return errors.Wrapf(driver.ErrInvalid, "fstat: %v", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return errors.Wrapf(driver.ErrInvalid, "not a memory file (a file of mode %#o)", st.Mode)
	}
	seals, err := unix.FcntlInt(uintptr(sh.FD), unix.F_GET_SEALS, 0)
	if err != nil {
		return errors.Wrapf(driver.ErrInvalid, "not a memory file (a regular file without seals: F_GET_SEALS says %v)", err)
	}
	if missing := shareSeals &^ seals; missing != 0 {
		return errors.WithHint(
			errors.Wrapf(driver.ErrInvalid, "a memory file any holder could resize (seals %s, missing %s)", sealNames(seals), sealNames(missing)),
			"export chunks created shareable by the host driver: their memfds are sealed against shrinking and growing")
	}
	if w := seals & (unix.F_SEAL_WRITE | unix.F_SEAL_FUTURE_WRITE); w != 0 {
		return errors.Wrapf(driver.ErrInvalid, "a memory file sealed against writing (seals %s): it cannot be mapped read-write", sealNames(seals))
	}
	fl, err := unix.FcntlInt(uintptr(sh.FD), unix.F_GETFL, 0)
	if err != nil {
		return errors.Wrapf(driver.ErrInvalid, "fcntl(F_GETFL): %v", err)
	}
	if fl&unix.O_ACCMODE != unix.O_RDWR {
		return errors.WithHint(errors.Wrapf(driver.ErrInvalid, "a descriptor not open for reading and writing (open flags %#o): it cannot be mapped read-write", fl),
			"send the descriptor Export returned, not one reopened read-only")
	}
	if uint64(st.Size) != sh.Size {
		return errors.Wrapf(driver.ErrInvalid, "not a memory file of %s: it holds %s (%d bytes)", units.Bytes(sh.Size), units.Bytes(uint64(st.Size)), st.Size)
	}
	if held := uint64(st.Blocks) * 512; held < sh.Size {
		return errors.WithHint(
			errors.Wrapf(driver.ErrInvalid, "a memory file not committed throughout (%s of %s allocated): the rest would be allocated at first touch, past the out-of-memory checks",
				units.Bytes(held), units.Bytes(sh.Size)),
			"export chunks created shareable by the host driver: their memfds are committed whole (fallocate)")
	}
	return nil
}

// sealNames spells a set of F_SEAL_* bits for messages.
func sealNames(seals int) string {
	var names []string
	for _, s := range []struct {
		bit  int
		name string
	}{
		{unix.F_SEAL_SEAL, "seal"}, {unix.F_SEAL_SHRINK, "shrink"}, {unix.F_SEAL_GROW, "grow"},
		{unix.F_SEAL_WRITE, "write"}, {unix.F_SEAL_FUTURE_WRITE, "future-write"}, {unix.F_SEAL_EXEC, "exec"},
	} {
		if seals&s.bit != 0 {
			names = append(names, s.name)
			seals &^= s.bit
		}
	}
	if seals != 0 {
		names = append(names, fmt.Sprintf("%#x", seals))
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, "|")
}

// HeapBytes reports the bytes the kernel holds for device dev's heap file
// (its allocated blocks): what fallocate committed and punch-hole has not
// yet returned. Shareable chunks, which have memfds of their own, are not
// included. It is the kernel's figure, for leak tests.
func (d *Driver) HeapBytes(dev driver.DeviceID) (uint64, error) {
	if d.unmade() {
		return *new(uint64), errUnmade("HeapBytes")
	}
	if err := driver.CheckDevice(func() string { return "host: heap bytes" }, dev, len(d.b.heaps)); err != nil {
		return 0, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(d.b.heaps[dev].fd, &st); err != nil {
		return 0, errors.Wrapf(err, "host: fstat of device %d heap", dev)
	}
	return uint64(st.Blocks) * 512, nil
}

// pointer returns the address addr inside r as a pointer derived from the
// reservation's base, so no integer is ever turned back into a pointer.
func pointer(r *ledger.Region, addr driver.Addr) unsafe.Pointer {
	return unsafe.Add(r.Backing.(unsafe.Pointer), uint64(addr-r.Base))
}

func bytesAt(r *ledger.Region, addr driver.Addr, n int) []byte {
	return unsafe.Slice((*byte)(pointer(r, addr)), n)
}

// heap is one device's memory: a sparse memfd whose offsets are handed out
// first-fit. Its offset space is larger than the capacity (the file is
// sparse, so this costs nothing), so fragmentation of offsets does not
// refuse a chunk the capacity allows.
type heap struct {
	fd      int
	offsets *extent.Set
	gran    uint64
	span    uint64 // the file's size: the offset space
	// node is the NUMA node the heap file's pages are bound to (MPOL_BIND
	// over the whole file), or -1.
	node int
}

// heapSpan is how many times the capacity the heap's offset space spans.
const heapSpan = 64

func newHeap(dev int, capacity, gran uint64) (*heap, error) {
	fd, err := unix.MemfdCreate(fmt.Sprintf("vmarena-host%d-heap", dev), unix.MFD_CLOEXEC)
	if err != nil {
		return nil, errors.Wrapf(err, "host: memfd_create for device %d", dev)
	}
	span := capacity * heapSpan
	if span/heapSpan != capacity || span > 1<<46 {
		span = max(capacity, 1<<46)
	}
	if err := unix.Ftruncate(fd, int64(span)); err != nil {
		_ = unix.Close(fd)
		return nil, errors.Wrapf(err, "host: sizing the heap of device %d", dev)
	}
	return &heap{fd: fd, offsets: extent.New(0, span), gran: gran, span: span, node: -1}, nil
}

// chunkMem is where a chunk's memory lives: a range of a heap, or a memfd
// of its own (own == true, off == 0).
type chunkMem struct {
	fd  int
	off int64
	own bool
}

// backend makes the system calls behind the ledger.
type backend struct {
	opts     Options
	page     uint64
	heaps    []*heap
	populate bool
	mem      *machine // what a commit checks first (memory_linux.go)
}

const reserveFlags = unix.MAP_PRIVATE | unix.MAP_ANONYMOUS | unix.MAP_NORESERVE

func (b *backend) Reserve(size, align uint64, hint driver.Addr) (driver.Addr, any, error) {
	if hint != 0 {
		hp := *(*unsafe.Pointer)(unsafe.Pointer(&hint)) // an address we do not own yet: no Go object lives there
		p, err := unix.MmapPtr(-1, 0, hp, uintptr(size), unix.PROT_NONE, reserveFlags|unix.MAP_FIXED_NOREPLACE)
		if err == nil && p == hp {
			return hint, p, nil
		}
		if err == nil { // an old kernel ignored the flag and placed it elsewhere
			_ = unix.MunmapPtr(p, uintptr(size))
		}
	}
	// The kernel often returns an aligned range by itself (large anonymous
	// mappings are aligned to 2 MiB since Linux 6.7): try the exact size
	// first, one system call.
	p, err := unix.MmapPtr(-1, 0, nil, uintptr(size), unix.PROT_NONE, reserveFlags)
	if err != nil {
		return 0, nil, reserveError(err, size)
	}
	if uint64(uintptr(p))%align == 0 {
		return driver.Addr(uintptr(p)), p, nil
	}
	if err := unix.MunmapPtr(p, uintptr(size)); err != nil {
		return 0, nil, errors.Wrap(err, "munmap")
	}
	// Over-reserve by align and trim both ends, so the range is aligned.
	extra := align - min(align, b.page)
	p, err = unix.MmapPtr(-1, 0, nil, uintptr(size+extra), unix.PROT_NONE, reserveFlags)
	if err != nil {
		return 0, nil, reserveError(err, size)
	}
	head := (align - uint64(uintptr(p))%align) % align
	if head > 0 {
		_ = unix.MunmapPtr(p, uintptr(head))
	}
	if tail := extra - head; tail > 0 {
		_ = unix.MunmapPtr(unsafe.Add(p, head+size), uintptr(tail))
	}
	base := unsafe.Add(p, head)
	return driver.Addr(uintptr(base)), base, nil
}

// fdError wraps the failure of a system call that makes a descriptor,
// marking running out of them (EMFILE, ENFILE) ErrOutOfMemory, as the
// other resources a call needs are.
func fdError(err error, call string) error {
	if err == unix.EMFILE || err == unix.ENFILE {
		return sentinel.Mark(errors.Wrapf(err, "%s: no descriptor free (the process's limit, RLIMIT_NOFILE, or the system's is reached)", call),
			driver.ErrOutOfMemory)
	}
	return errors.Wrap(err, call)
}

func reserveError(err error, size uint64) error {
	if err == unix.ENOMEM {
		return sentinel.Mark(errors.Wrapf(err, "the process has no free address range of %s", units.Bytes(size)), driver.ErrOutOfMemory)
	}
	return errors.Wrap(err, "mmap")
}

func (b *backend) Unreserve(r *ledger.Region) error {
	if err := unix.MunmapPtr(r.Backing.(unsafe.Pointer), uintptr(r.Size)); err != nil {
		return errors.Wrap(err, "munmap")
	}
	return nil
}

func (b *backend) Commit(c *ledger.Chunk) error {
	// fallocate would not refuse memory the machine lacks: the OOM killer
	// would find it. Out of memory is reported here instead.
	if err := b.mem.checkAvailable(c.Size); err != nil {
		return err
	}
	if c.Opts.Shareable {
		fd, err := unix.MemfdCreate(fmt.Sprintf("vmarena-host%d-chunk%d", c.Device, c.Handle), unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		if err != nil {
			return fdError(err, "memfd_create")
		}
		if err := unix.Ftruncate(fd, int64(c.Size)); err != nil {
			_ = unix.Close(fd)
			return errors.Wrap(err, "ftruncate")
		}
		if node := b.heaps[c.Device].node; node >= 0 { // on the device's node, as its heap is
			if err := bindFile(fd, c.Size, node); err != nil {
				_ = unix.Close(fd)
				return err
			}
		}
		if err := fallocate(fd, 0, 0, c.Size); err != nil {
			_ = unix.Close(fd)
			return err
		}
		// Sealed before anyone else can hold it: see shareSeals.
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, shareSeals); err != nil {
			_ = unix.Close(fd)
			return errors.Wrap(err, "fcntl(F_ADD_SEALS)")
		}
		c.Backing = &chunkMem{fd: fd, own: true}
		return nil
	}
	h := b.heaps[c.Device]
	off, ok := h.offsets.Alloc(c.Size, h.gran)
	if !ok {
		return errors.Wrapf(driver.ErrOutOfMemory, "the heap's offset space is fragmented (largest free range %s)", units.Bytes(h.offsets.Largest()))
	}
	if err := fallocate(h.fd, 0, off, c.Size); err != nil {
		_ = h.offsets.Free(off, c.Size)
		return err
	}
	c.Backing = &chunkMem{fd: h.fd, off: int64(off)}
	return nil
}

// fallocate commits (mode 0) or punches out a file range, retrying when a
// signal interrupts it (the Go runtime preempts with signals; shmem undoes a
// partial allocation before returning EINTR).
func fallocate(fd int, mode uint32, off, size uint64) error {
	for {
		err := unix.Fallocate(fd, mode, int64(off), int64(size))
		switch err {
		case nil:
			return nil
		case unix.EINTR:
			continue
		case unix.ENOSPC, unix.ENOMEM:
			return sentinel.Mark(errors.Wrapf(err, "fallocate of %s", units.Bytes(size)), driver.ErrOutOfMemory)
		}
		return errors.Wrapf(err, "fallocate of %s", units.Bytes(size))
	}
}

func (b *backend) Free(c *ledger.Chunk) error {
	m := c.Backing.(*chunkMem)
	if m.own {
		return errors.Wrap(unix.Close(m.fd), "close")
	}
	h := b.heaps[c.Device]
	if err := fallocate(m.fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, uint64(m.off), c.Size); err != nil {
		return err
	}
	return h.offsets.Free(uint64(m.off), c.Size)
}

func (b *backend) Map(m *ledger.Mapping) error {
	cm := m.Chunk.Backing.(*chunkMem)
	want := pointer(m.Region, m.Addr)
	p, err := unix.MmapPtr(cm.fd, cm.off, want, uintptr(m.Size), unix.PROT_NONE, unix.MAP_SHARED|unix.MAP_FIXED)
	if err != nil || p != want {
		// A failed MAP_FIXED may have removed the reservation under it:
		// put the reserved state back.
		if rerr := b.rereserve(want, m.Size); rerr != nil {
			return errors.CombineErrors(errors.Wrap(err, "mmap"), rerr)
		}
		if err == nil {
			return errors.AssertionFailedf("mmap MAP_FIXED returned %p, not %p", p, want)
		}
		if err == unix.ENOMEM {
			return sentinel.Mark(errors.Wrap(err, "mmap (vm.max_map_count may be reached)"), driver.ErrOutOfMemory)
		}
		return errors.Wrap(err, "mmap")
	}
	return nil
}

func (b *backend) Unmap(m *ledger.Mapping) error {
	return b.rereserve(pointer(m.Region, m.Addr), m.Size)
}

// rereserve turns [p, p+size) back into reserved address space.
func (b *backend) rereserve(p unsafe.Pointer, size uint64) error {
	q, err := unix.MmapPtr(-1, 0, p, uintptr(size), unix.PROT_NONE, reserveFlags|unix.MAP_FIXED)
	if err != nil {
		return errors.Wrap(err, "mmap (re-reserve)")
	}
	if q != p {
		return errors.AssertionFailedf("re-reserve at %p landed at %p", p, q)
	}
	return nil
}

func prot(a driver.Access) int {
	switch a {
	case driver.AccessRead:
		return unix.PROT_READ
	case driver.AccessReadWrite:
		return unix.PROT_READ | unix.PROT_WRITE
	}
	return unix.PROT_NONE
}

func (b *backend) Protect(r *ledger.Region, addr driver.Addr, size uint64, from, to driver.Access) error {
	mem := bytesAt(r, addr, int(size))
	if err := unix.Mprotect(mem, prot(to)); err != nil {
		// mprotect changes the kernel's mappings one at a time and stops
		// at the first it cannot change, leaving those before it changed:
		// put the whole range back to from (what it all was), so a failed
		// call changes nothing.
		if rerr := unix.Mprotect(mem, prot(from)); rerr != nil {
			return errors.CombineErrors(errors.Wrap(err, "mprotect"),
				errors.AssertionFailedf("mprotect back to %s after a failure: %v", from, rerr))
		}
		return errors.Wrap(err, "mprotect")
	}
	if b.populate && from == driver.AccessNone && to != driver.AccessNone {
		advice := unix.MADV_POPULATE_READ
		if to == driver.AccessReadWrite {
			advice = unix.MADV_POPULATE_WRITE
		}
		for {
			err := unix.Madvise(mem, advice)
			if err == unix.EINTR {
				continue
			}
			if err == unix.EINVAL { // a kernel before 5.14: fault on first touch instead
				b.populate = false
			}
			// Populating is an optimisation: access is granted either way,
			// and any page it did not fill faults in on first touch.
			break
		}
	}
	return nil
}

func (b *backend) Close() error {
	var errs error
	for _, h := range b.heaps {
		errs = errors.CombineErrors(errs, unix.Close(h.fd))
	}
	b.heaps = nil
	return errs
}

// unmade reports whether d is nil or a zero Driver, not one host.New made:
// every method then answers ErrInvalid (and zero values) instead of
// dereferencing the books it does not have.
func (d *Driver) unmade() bool { return d == nil || d.books == nil || d.engine == nil }

// errUnmade is the refusal of method op on a driver New did not make.
func errUnmade(op string) error {
	return errors.Wrapf(driver.ErrInvalid, "host: %s: the driver was not made by host.New (nil or zero Driver)", op)
}
