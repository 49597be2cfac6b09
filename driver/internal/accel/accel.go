// Package accel is the half of the accelerator drivers (driver/cuda,
// driver/acl) that does not depend on the vendor: the driver contract kept
// over a vendor runtime's calls. A vendor package binds its library (the
// CUDA driver API, AscendCL), implements Runtime with it, and declares
// each method of the contract on its own Driver type, calling the Core
// this package builds.
//
// The Core owns the driver's record (the shared ledger, which checks every
// call against the contract before the runtime sees it and records the
// result only after the runtime succeeded) and its streams (the shared
// queue engine, which orders work, reports failures, runs host functions
// and refuses self-waits exactly as the host driver does). Each stream of
// the engine has a stream of the runtime under it: a copy or fill is
// checked against the record when its turn comes, enqueued on that
// runtime stream, and waited for before the next operation of the stream
// runs. So the contract's ordering and error rules hold on devices whose
// own streams cannot skip work after a failure, and whose host functions
// may not call the runtime (CUDA's cuLaunchHostFunc forbids it; the
// contract lets host functions call the driver).
//
// Invariants: the runtime never sees a call the contract refuses (an
// access the record does not grant, an unmap of part of a mapping, a map
// over a mapping): a vendor runtime answers some of those with errors that
// make the whole device context unusable. Every runtime object the Core
// made (streams, pinned host buffers, and through the record reservations,
// chunks and mappings) is given back by Close.
//
// The package never touches device memory itself and never hands the
// record or the engine to a caller: the vendor packages keep the Core in
// an unexported field.
package accel

import (
	"fmt"
	"unsafe"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/internal/ledger"
	"github.com/vmarena/vmarena/driver/internal/queue"
	"github.com/vmarena/vmarena/internal/lockrank"
)

// Runtime is one vendor runtime's calls, as the Core needs them. Every
// method either succeeds completely or fails having changed nothing, and
// marks its error with one driver sentinel, naming the vendor call and its
// error code. The memory methods are called with the record locked; they
// must not call back into the Core.
type Runtime interface {
	// Reserve holds size bytes of device address space aligned to align
	// (a power of two, at least the driver's granularity), at hint if it
	// can; backing is the runtime's own record of the range.
	Reserve(size, align uint64, hint driver.Addr) (base driver.Addr, backing any, err error)
	// Unreserve gives back a range Reserve returned; nothing is mapped
	// in it.
	Unreserve(base driver.Addr, size uint64, backing any) error
	// Create commits size bytes on dev, exportable when shareable; mem is
	// the runtime's handle of the memory.
	Create(dev driver.DeviceID, size uint64, shareable bool) (mem any, err error)
	// Release gives up the handle mem: the chunk is unmapped everywhere
	// in this process.
	Release(mem any) error
	// Map maps all size bytes of mem at addr, inaccessible to every
	// device: it either succeeds so or fails having mapped nothing.
	Map(addr driver.Addr, size uint64, mem any) error
	// Unmap removes the mapping of mem at addr, size bytes long.
	Unmap(addr driver.Addr, size uint64, mem any) error
	// SetAccess sets what dev may do over [addr, addr+size), which lies
	// inside one mapping, or over adjacent mappings when Info.SpanAccess,
	// or is exactly one whole mapping when Info.MappingAccess — with both,
	// a run of adjacent whole mappings (cuMemSetAccess).
	SetAccess(addr driver.Addr, size uint64, dev driver.DeviceID, a driver.Access) error
	// Export returns the shareable handle of mem, size bytes, created
	// shareable; it is called once per chunk.
	Export(mem any, size uint64) (driver.Shareable, error)
	// Import makes memory of this process from another process's
	// shareable handle, on dev, refusing (ErrInvalid) one that is not
	// memory of sh.Size bytes; the caller keeps sh's descriptor.
	Import(sh driver.Shareable, dev driver.DeviceID) (mem any, err error)
	// ReadSync copies len(p) bytes at src into p, as device dev, which has
	// read access there; WriteSync copies p to dst as dev, which has
	// read-write access there.
	ReadSync(dev driver.DeviceID, p []byte, src driver.Addr) error
	WriteSync(dev driver.DeviceID, dst driver.Addr, p []byte) error

	// CreateStream makes a runtime stream of dev; DestroyStream destroys
	// one whose work has finished.
	CreateStream(dev driver.DeviceID) (any, error)
	DestroyStream(s any) error
	// The copies and the fill enqueue work on s and return without
	// waiting; Wait returns once everything enqueued on s so far has run,
	// with the first failure of that work.
	CopyHtoD(s any, dst driver.Addr, src []byte) error
	CopyDtoH(s any, dst []byte, src driver.Addr) error
	CopyDtoD(s any, dst, src driver.Addr, n uint64) error
	Memset(s any, dst driver.Addr, v byte, n uint64) error
	Wait(s any) error
	// EnablePeerAccess lets dev's work reach memory of peer; enabling it
	// again is not an error.
	EnablePeerAccess(dev, peer driver.DeviceID) error
	// HostAlloc returns size bytes of pinned host memory, aligned to at
	// least 64 bytes; HostFree returns it.
	HostAlloc(size uint64) (unsafe.Pointer, error)
	HostFree(p unsafe.Pointer) error
	// Close lets go of the runtime's per-driver state (contexts): the
	// Core has given back everything else.
	Close() error
}

// Info is what a vendor package learned when it opened its runtime.
type Info struct {
	// Name prefixes every message ("cuda", "acl").
	Name string
	// Devices are the devices, Devices[i].ID == i.
	Devices []driver.Device
	// Peer[dev][peer] is the runtime's answer to whether dev can reach
	// peer's memory.
	Peer [][]bool
	// HostAccess, Shareable and Streams say which optional features the
	// runtime's symbols allow (driver.FeatureHostAccess, ...). As on every
	// driver, the copies of streams move bytes only with HostAccess: a
	// runtime without its synchronous copies has streams that order work
	// and events, and refuses copies and fills (ErrUnsupported).
	HostAccess, Shareable, Streams bool
	// SpanAccess says the runtime's SetAccess takes a range over several
	// adjacent mappings in one call (cuMemSetAccess does).
	SpanAccess bool
	// MappingAccess says the runtime's SetAccess takes whole mappings
	// only: exactly one (aclrtMemSetAccess), or with SpanAccess a run of
	// adjacent ones (cuMemSetAccess: an H100 refused part of a mapping
	// with CUDA_ERROR_INVALID_VALUE). The device's access over a mapping is
	// then the widest the record gives it anywhere in the mapping, and
	// finer grants are the record's, enforced by the Core's copies
	// (ledger.WholeMappingProtector).
	MappingAccess bool
	// OneDevicePerReservation says the runtime binds a reservation to one
	// device's memory, local or imported, never both (aclrtMapMem): a Map
	// that would mix them is refused with ErrUnsupported
	// (ledger.OneBinder).
	OneDevicePerReservation bool
}

// Core is one open accelerator driver.
type Core struct {
	info   Info
	rt     Runtime
	books  *ledger.Ledger
	engine *queue.Engine

	// mu guards streams; it is a leaf: nothing is called under it.
	mu lockrank.Mutex[lockrank.AccelStreams]
	// streams holds, for each live engine stream, its runtime stream.
	streams map[driver.Stream]any
	// host are the pinned buffers HostAlloc handed out.
	host queue.HostBuffers
}

// New opens a Core over rt.
func New(info Info, rt Runtime) (*Core, error) {
	c := &Core{info: info, rt: rt, streams: map[driver.Stream]any{}}
	books, err := ledger.New(info.Name, info.Devices, backend{c}, info.Shareable)
	if err != nil {
		return nil, err
	}
	c.books = books
	peer := func(dev, peer driver.DeviceID) bool {
		return int(dev) < len(info.Peer) && int(peer) < len(info.Peer[dev]) && info.Peer[dev][peer]
	}
	c.engine = queue.New(info.Name, len(info.Devices), peer)
	return c, nil
}

func (c *Core) errf(sentinel error, format string, args ...any) error {
	return errors.Wrapf(sentinel, "%s: "+format, append([]any{c.info.Name}, args...)...)
}

// Name is the vendor's short name.
func (c *Core) Name() string { return c.info.Name }

// Devices lists the devices (a copy).
func (c *Core) Devices() []driver.Device { return c.books.Devices() }

// Granularity is the unit of reservations.
func (c *Core) Granularity() uint64 { return c.books.Granularity() }

// Supports reports the optional features the runtime's symbols allow.
func (c *Core) Supports(f driver.Feature) bool {
	switch f {
	case driver.FeatureHostAccess:
		return c.info.HostAccess
	case driver.FeatureShareable:
		return c.info.Shareable
	case driver.FeatureStreams:
		return c.info.Streams
	}
	return false
}

// Reserve, Unreserve, Create, Release, Map, Unmap, SetAccess and Access
// are the contract's, checked and recorded by the ledger.
func (c *Core) Reserve(size, align uint64, hint driver.Addr) (driver.Addr, error) {
	return c.books.Reserve(size, align, hint)
}

func (c *Core) Unreserve(base driver.Addr, size uint64) error { return c.books.Unreserve(base, size) }

func (c *Core) Create(dev driver.DeviceID, size uint64, opts driver.ChunkOptions) (driver.Handle, error) {
	return c.books.Create(dev, size, opts)
}

func (c *Core) Release(h driver.Handle) error { return c.books.Release(h) }

func (c *Core) Map(addr driver.Addr, h driver.Handle) error { return c.books.Map(addr, h) }

func (c *Core) Unmap(addr driver.Addr, size uint64) error { return c.books.Unmap(addr, size) }

func (c *Core) SetAccess(addr driver.Addr, size uint64, dev driver.DeviceID, a driver.Access) error {
	return c.books.SetAccess(addr, size, dev, a)
}

func (c *Core) Access(addr driver.Addr, dev driver.DeviceID) (driver.Access, error) {
	return c.books.Access(addr, dev)
}

// Used is the bytes committed on dev.
func (c *Core) Used(dev driver.DeviceID) uint64 { return c.books.Used(dev) }

// ChunkInfo, MappingAt, Mapped and ReservationAt are the record's
// answers to driver.Books.
func (c *Core) ChunkInfo(h driver.Handle) (driver.DeviceID, uint64, error) {
	return c.books.ChunkInfo(h)
}

func (c *Core) MappingAt(addr driver.Addr) (driver.Handle, uint64, error) {
	return c.books.MappingAt(addr)
}

func (c *Core) Mapped(base driver.Addr, size uint64) (int, uint64, error) {
	return c.books.Mapped(base, size)
}

func (c *Core) ReservationAt(base driver.Addr) (uint64, error) { return c.books.ReservationAt(base) }

// Check verifies the record's invariants.
func (c *Core) Check() error { return c.books.Check() }

// Read copies len(p) bytes at addr into p through the copy engines of
// devices that may read each part.
func (c *Core) Read(addr driver.Addr, p []byte) error {
	return c.hostCopy("read", addr, uint64(len(p)), driver.AccessRead, func(s ledger.Segment, off uint64) error {
		return c.rt.ReadSync(s.Dev, p[off:off+s.N], s.Addr)
	})
}

// Write copies p to addr through the copy engines of devices that may
// write each part.
func (c *Core) Write(addr driver.Addr, p []byte) error {
	return c.hostCopy("write", addr, uint64(len(p)), driver.AccessReadWrite, func(s ledger.Segment, off uint64) error {
		return c.rt.WriteSync(s.Dev, s.Addr, p[off:off+s.N])
	})
}

// hostCopy is Read and Write: move copies each segment of [addr, addr+n),
// at offset off of the host's bytes, with a device that has want over it.
func (c *Core) hostCopy(op string, addr driver.Addr, n uint64, want driver.Access, move func(s ledger.Segment, off uint64) error) error {
	if c.engine.Closed() {
		return driver.Closed(c.info.Name + ": " + op)
	}
	if !c.info.HostAccess {
		return c.errf(driver.ErrUnsupported, "%s: the runtime has no synchronous copies", op)
	}
	return c.books.WithHostSegments(op, addr, n, want, func(segs []ledger.Segment) error {
		for _, s := range segs {
			if err := move(s, uint64(s.Addr-addr)); err != nil {
				return err
			}
		}
		return nil
	})
}

// Export returns the shareable handle of chunk h, once.
func (c *Core) Export(h driver.Handle) (driver.Shareable, error) {
	if !c.info.Shareable {
		return driver.Shareable{}, c.errf(driver.ErrUnsupported, "export chunk %d: the runtime cannot share memory between processes", h)
	}
	return c.books.Export(h, func(ch *ledger.Chunk) (driver.Shareable, error) {
		return c.rt.Export(ch.Backing, ch.Size)
	})
}

// Import makes a chunk on dev of another process's shareable handle.
func (c *Core) Import(s driver.Shareable, dev driver.DeviceID) (driver.Handle, error) {
	if !c.info.Shareable {
		return 0, c.errf(driver.ErrUnsupported, "import: the runtime cannot share memory between processes")
	}
	return c.books.Import(dev, s.Size, func(ch *ledger.Chunk) error {
		mem, err := c.rt.Import(s, dev)
		if err != nil {
			return err
		}
		ch.Backing = mem
		return nil
	})
}

// PIDAllower is a Runtime whose shareable handles carry an allow-list of
// importing processes that the runtime enforces (AscendCL).
type PIDAllower interface {
	// AllowPIDs adds pids to the list of mem, which was exported.
	AllowPIDs(mem any, pids []int) error
}

// AllowPIDs adds processes to those the runtime lets import chunk h.
func (c *Core) AllowPIDs(h driver.Handle, pids []int) error {
	a, ok := c.rt.(PIDAllower)
	if !ok {
		return c.errf(driver.ErrUnsupported, "allow processes to import chunk %d: the runtime keeps no allow-list", h)
	}
	if err := driver.CheckPIDs(func() string { return fmt.Sprintf("%s: allow processes to import chunk %d", c.info.Name, h) }, pids); err != nil {
		return err
	}
	return c.books.WithChunk("allow processes to import", h, func(ch *ledger.Chunk) error {
		if !ch.Exported() {
			return errors.WithHint(errors.Wrap(driver.ErrInvalid, "it is not exported"), "export it first")
		}
		return a.AllowPIDs(ch.Backing, pids)
	})
}

// Closed reports whether Close (or TearDown) has run.
func (c *Core) Closed() bool { return c.engine.Closed() }

// Close refuses while memory is mapped or pinned host buffers are live,
// changing nothing; otherwise it gives back every chunk and reservation
// and takes no more pinned buffers, then waits for the streams, destroys
// them, and lets go of the runtime. Each check is one step with the
// closing (closeBooks), so memory mapped or pinned while Close runs makes
// it refuse or is refused itself, and stream work that runs while Close
// waits finds the driver closed.
func (c *Core) Close() error {
	if err := c.closeBooks(); err != nil {
		return err
	}
	return c.close(func() error { return nil }) // closeBooks closed them
}

// closeBooks is Close's first half: the pinned buffers and then the
// record (queue.HostBuffers.CloseWith).
func (c *Core) closeBooks() error {
	return c.host.CloseWith(c.info.Name, c.engine, c.books, func() error { return c.close(func() error { return nil }) })
}

// TearDown closes c whatever is mapped or pinned: for the vendor
// packages' tests, whose conformance subtests may end with memory mapped.
func (c *Core) TearDown() error {
	if c.engine.Closed() {
		return nil
	}
	return c.close(func() error { return ledger.TearDown(c.books) })
}

func (c *Core) close(closeBooks func() error) error {
	err := c.engine.Close() // failures of stream work not yet reported
	c.mu.Lock()
	streams := c.streams
	c.streams = nil
	c.mu.Unlock()
	for _, s := range streams {
		err = errors.CombineErrors(err, c.rt.DestroyStream(s))
	}
	err = errors.CombineErrors(err, closeBooks())
	for _, b := range c.host.Close() {
		err = errors.CombineErrors(err, c.rt.HostFree(unsafe.Pointer(&b[0])))
	}
	return errors.CombineErrors(err, c.rt.Close())
}

// backend is the ledger's view of the runtime.
type backend struct{ c *Core }

var (
	_ ledger.DeviceProtector       = backend{}
	_ ledger.SpanningProtector     = backend{}
	_ ledger.WholeMappingProtector = backend{}
	_ ledger.OneBinder             = backend{}
)

func (b backend) Reserve(size, align uint64, hint driver.Addr) (driver.Addr, any, error) {
	return b.c.rt.Reserve(size, align, hint)
}

func (b backend) Unreserve(r *ledger.Region) error {
	return b.c.rt.Unreserve(r.Base, r.Size, r.Backing)
}

func (b backend) Commit(ch *ledger.Chunk) error {
	mem, err := b.c.rt.Create(ch.Device, ch.Size, ch.Opts.Shareable)
	if err != nil {
		return err
	}
	ch.Backing = mem
	return nil
}

func (b backend) Free(ch *ledger.Chunk) error { return b.c.rt.Release(ch.Backing) }

func (b backend) Map(m *ledger.Mapping) error { return b.c.rt.Map(m.Addr, m.Size, m.Chunk.Backing) }

func (b backend) Unmap(m *ledger.Mapping) error {
	return b.c.rt.Unmap(m.Addr, m.Size, m.Chunk.Backing)
}

func (b backend) SetDeviceAccess(_ *ledger.Region, addr driver.Addr, size uint64, dev driver.DeviceID, _, to driver.Access) error {
	return b.c.rt.SetAccess(addr, size, dev, to)
}

// SpansMappings is Info.SpanAccess (ledger.SpanningProtector).
func (b backend) SpansMappings() bool { return b.c.info.SpanAccess }

// WholeMappings is Info.MappingAccess (ledger.WholeMappingProtector).
func (b backend) WholeMappings() bool { return b.c.info.MappingAccess }

// BindsOneDevice is Info.OneDevicePerReservation (ledger.OneBinder).
func (b backend) BindsOneDevice() bool { return b.c.info.OneDevicePerReservation }

func (b backend) Close() error { return nil } // the Core closes the runtime after the record

// DeviceSyncer is a Runtime that can wait for all the work queued on a
// device, on every stream — streams the Core never made too, such as a
// framework's (cuCtxSynchronize, aclrtSynchronizeDevice). SyncDevice
// answers ErrUnsupported when the loaded library lacks the call.
type DeviceSyncer interface {
	SyncDevice(dev driver.DeviceID) error
}

// MemInfoer is a Runtime that can say how much of a device's memory is
// free, every process's use counted (cuMemGetInfo).
type MemInfoer interface {
	MemInfo(dev driver.DeviceID) (free, total uint64, err error)
}

// MemInfo is device dev's free and total memory as the vendor library
// counts them (every process's chunks). A runtime without the call, or a
// library lacking it, is ErrUnsupported; an unknown dev ErrNoDevice.
func (c *Core) MemInfo(dev driver.DeviceID) (free, total uint64, err error) {
	what := fmt.Sprintf("%s: the free memory of device %d", c.info.Name, dev)
	if err := driver.CheckDevice(func() string { return what }, dev, len(c.info.Devices)); err != nil {
		return 0, 0, err
	}
	mi, ok := c.rt.(MemInfoer)
	if !ok {
		return 0, 0, c.errf(driver.ErrUnsupported, "the free memory of device %d: the runtime cannot say", dev)
	}
	free, total, err = mi.MemInfo(dev)
	return free, total, errors.Wrapf(err, "%s", what)
}

// SyncDevice waits for the work the Core's streams had queued at the call
// (on every device: its engine drains whole), then for all the work on
// device dev, other streams than the Core's included (the runtime's
// DeviceSyncer). A runtime without the call, or a library lacking it, is
// ErrUnsupported after the Core's own streams have been waited for: the
// caller then knows only the work it queued through the driver is done.
// An unknown dev is ErrNoDevice, having waited for nothing.
func (c *Core) SyncDevice(dev driver.DeviceID) error {
	what := fmt.Sprintf("%s: synchronize device %d", c.info.Name, dev)
	if err := driver.CheckDevice(func() string { return what }, dev, len(c.info.Devices)); err != nil {
		return err
	}
	if err := c.engine.Drain(what); err != nil {
		return err
	}
	ds, ok := c.rt.(DeviceSyncer)
	if !ok {
		return c.errf(driver.ErrUnsupported, "synchronize device %d: the runtime cannot wait for a whole device", dev)
	}
	return errors.Wrapf(ds.SyncDevice(dev), "%s", what)
}
