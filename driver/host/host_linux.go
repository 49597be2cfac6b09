package host

import (
	"fmt"
	"os"
	"unsafe"

	"github.com/cockroachdb/errors"
	"golang.org/x/sys/unix"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/internal/ledger"
	"github.com/vmarena/vmarena/driver/internal/queue"
	"github.com/vmarena/vmarena/internal/extent"
	"github.com/vmarena/vmarena/internal/units"
)

// Driver is the host driver. It implements driver.Driver.
type Driver struct {
	*ledger.Ledger
	*queue.Engine
	b  *backend
	hb hostBuffers
}

var (
	_ driver.Driver     = (*Driver)(nil)
	_ driver.HostMapper = (*Driver)(nil)
	_ driver.Streams    = (*Driver)(nil)
	_ driver.Sharing    = (*Driver)(nil)
)

// New opens a host driver: one memfd heap per logical device.
func New(opts Options) (*Driver, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	nodes, err := numaPlan(opts.numaRoot, opts.Devices, opts.RequireNUMA)
	if err != nil {
		return nil, err
	}
	b := &backend{opts: opts, page: uint64(os.Getpagesize()), populate: !opts.NoPopulate}
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
	return &Driver{Ledger: l, Engine: queue.New("host", opts.Devices, peer), b: b}, nil
}

// Close implements driver.Driver: the streams finish their work first,
// then everything the ledger holds is unmapped, released and unreserved,
// and pinned host buffers are unmapped.
func (d *Driver) Close() error {
	if d.Engine.Closed() {
		return driver.Closed("host: close: closed already")
	}
	err := d.Engine.Close() // failures of stream work not yet reported
	return errors.CombineErrors(err, errors.CombineErrors(d.Ledger.Close(), d.closeHostBuffers()))
}

// Name implements driver.Driver.
func (d *Driver) Name() string { return "host" }

// Supports implements driver.Driver: host memory can be read and written,
// and chunks can be made shareable.
func (d *Driver) Supports(f driver.Feature) bool {
	return f == driver.FeatureHostAccess || f == driver.FeatureShareable || f == driver.FeatureStreams
}

// Read implements driver.Driver.
func (d *Driver) Read(addr driver.Addr, p []byte) error {
	return d.WithRange("read", addr, uint64(len(p)), driver.AccessRead, func(r *ledger.Region) error {
		return copyFaulting(p, bytesAt(r, addr, len(p)))
	})
}

// Write implements driver.Driver.
func (d *Driver) Write(addr driver.Addr, p []byte) error {
	return d.WithRange("write", addr, uint64(len(p)), driver.AccessReadWrite, func(r *ledger.Region) error {
		return copyFaulting(bytesAt(r, addr, len(p)), p)
	})
}

// HostBytes implements driver.HostMapper.
func (d *Driver) HostBytes(addr driver.Addr, size uint64) ([]byte, error) {
	var b []byte
	err := d.WithRange("host bytes", addr, size, driver.AccessRead, func(r *ledger.Region) error {
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

// Export implements driver.Sharing: a duplicate of the chunk's own memfd
// (a shareable chunk never lives in the device heap, so an export never
// exposes other chunks' memory). The caller closes it.
func (d *Driver) Export(h driver.Handle) (driver.Shareable, error) {
	return d.Ledger.Export(h, func(c *ledger.Chunk) (driver.Shareable, error) {
		m := c.Backing.(*chunkMem)
		fd, err := unix.FcntlInt(uintptr(m.fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return driver.Shareable{}, errors.Wrap(err, "dup")
		}
		return driver.Shareable{Type: driver.HandlePOSIXFD, FD: fd, Size: c.Size}, nil
	})
}

// Import implements driver.Sharing: the chunk keeps its own duplicate of
// the descriptor; the memory goes when every process has closed its
// duplicates and unmapped it.
func (d *Driver) Import(sh driver.Shareable, dev driver.DeviceID) (driver.Handle, error) {
	if sh.Type != driver.HandlePOSIXFD {
		return 0, errors.Wrapf(driver.ErrInvalid, "host: import: handle type %d, the host driver shares POSIX file descriptors (%d)",
			sh.Type, driver.HandlePOSIXFD)
	}
	var st unix.Stat_t
	if err := unix.Fstat(sh.FD, &st); err != nil {
		return 0, errors.Wrapf(driver.ErrInvalid, "host: import: descriptor %d: %v", sh.FD, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || uint64(st.Size) != sh.Size {
		return 0, errors.Wrapf(driver.ErrInvalid, "host: import: descriptor %d is not a memory file of %s (mode %#o, size %d)",
			sh.FD, units.Bytes(sh.Size), st.Mode, st.Size)
	}
	return d.Ledger.Import(dev, sh.Size, func(c *ledger.Chunk) error {
		fd, err := unix.FcntlInt(uintptr(sh.FD), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return errors.Wrap(err, "dup")
		}
		c.Backing = &chunkMem{fd: fd, own: true}
		return nil
	})
}

// HeapBytes reports the bytes the kernel holds for device dev's heap file
// (its allocated blocks): what fallocate committed and punch-hole has not
// yet returned. Shareable chunks, which have memfds of their own, are not
// included. It is the kernel's figure, for leak tests.
func (d *Driver) HeapBytes(dev driver.DeviceID) (uint64, error) {
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

func reserveError(err error, size uint64) error {
	if err == unix.ENOMEM {
		return errors.Mark(errors.Wrapf(err, "the process has no free address range of %s", units.Bytes(size)), driver.ErrOutOfMemory)
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
	if c.Opts.Shareable {
		fd, err := unix.MemfdCreate(fmt.Sprintf("vmarena-host%d-chunk%d", c.Device, c.Handle), unix.MFD_CLOEXEC)
		if err != nil {
			return errors.Wrap(err, "memfd_create")
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
			return errors.Mark(errors.Wrapf(err, "fallocate of %s", units.Bytes(size)), driver.ErrOutOfMemory)
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
			return errors.Mark(errors.Wrap(err, "mmap (vm.max_map_count may be reached)"), driver.ErrOutOfMemory)
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
