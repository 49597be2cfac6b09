package budget

import (
	"fmt"
	"sync"
	"time"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// A Device is a driver one of whose devices is shared through a book:
// every chunk created on that device is acquired from the member first,
// and its bytes go back to the member once the chunk's memory returns to
// the device (released and its last mapping gone, as the driver's own
// rule has it). So the processes whose drivers all count against one book
// never commit more of the device than its capacity, whatever each
// driver's own capacity says. The other devices pass through.
//
// Invariant: the member's hold is at least the bytes of the wrapped
// device's live chunks (created through the Device, not yet returned) —
// exactly that when the member acquires nothing else, but for bytes
// returned to the device whose release the book refused (its lock held
// by something that is not a member: ErrBusy), which the call that
// returned them answers with the book's error and the next call that
// reaches the book gives back. Every other call
// passes through. The driver must answer its books (driver.Books: every
// driver of this module does), which the Device answers for it; chunks
// are not exported through it (no driver.Sharing): an import would
// count in two processes or none.
//
// Lock order: Device.mu → the driver's locks, then the book's; mu is never
// held across an Acquire (which may wait for another member's give-back,
// and that member may be this process's, releasing through this Device).
type Device struct {
	d   driver.Driver
	b   driver.Books
	mi  memInfo // nil when the driver cannot say what is free
	m   *Member
	dev driver.DeviceID

	mu     sync.Mutex
	chunks map[driver.Handle]*devChunk
	maps   map[driver.Addr]driver.Handle
	live   uint64 // bytes of the chunks not returned
	// owed is bytes returned to the device whose release the book
	// refused (its lock held by something that is not a member, a
	// corrupt book): given back at the next call that reaches the book.
	owed   uint64
	closed bool
}

type devChunk struct {
	size     uint64
	maps     int
	released bool
}

// memInfo is a driver that says how much of a device's memory is free,
// every process's use counted (cuda.Driver.MemInfo: cuMemGetInfo).
type memInfo interface {
	MemInfo(dev driver.DeviceID) (free, total uint64, err error)
}

// deviceHost is a Device over a driver whose memory this process
// addresses (driver.HostMapper).
type deviceHost struct {
	*Device
	hm driver.HostMapper
}

func (d *deviceHost) HostBytes(addr driver.Addr, size uint64) ([]byte, error) {
	return d.hm.HostBytes(addr, size)
}

// NewDevice wraps d so that device dev's chunks are acquired from m (see
// Device). The value returned is a *Device, or, when d addresses its
// memory directly (driver.HostMapper), a driver that also does. A nil
// driver or member, a device d has not, or a driver without books is
// refused (ErrInvalid).
//
// A driver that says how much of the device is free with every process's
// use counted (the CUDA driver's MemInfo, over cuMemGetInfo) is asked at
// NewDevice, which refuses a book larger than the device (ErrInvalid),
// and before each chunk: memory taken outside the book (a process that
// is no member) leaves Create an ErrOutOfMemory naming what the device
// has free, the book's hold given back.
func NewDevice(d driver.Driver, dev driver.DeviceID, m *Member) (driver.Driver, error) {
	what := func() string { return fmt.Sprintf("budget: share device %d through the book", dev) }
	if d == nil || m == nil {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: the driver or the member is nil", what())
	}
	if dev < 0 || int(dev) >= len(d.Devices()) {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: the %s driver has %d devices", what(), d.Name(), len(d.Devices()))
	}
	b, ok := d.(driver.Books)
	if !ok {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: the %s driver does not answer its books (driver.Books)", what(), d.Name())
	}
	w := &Device{d: d, b: b, m: m, dev: dev, chunks: map[driver.Handle]*devChunk{}, maps: map[driver.Addr]driver.Handle{}}
	if mi, ok := d.(memInfo); ok {
		_, total, err := mi.MemInfo(dev)
		switch {
		case errors.Is(err, driver.ErrUnsupported):
		case err != nil:
			return nil, errors.Wrapf(err, "%s", what())
		case m.bookCapacity() > total:
			return nil, errors.Wrapf(driver.ErrInvalid, "%s: the book's capacity %s is over the device's %s",
				what(), units.Bytes(m.bookCapacity()), units.Bytes(total))
		default:
			w.mi = mi
		}
	}
	if hm, ok := d.(driver.HostMapper); ok {
		return &deviceHost{Device: w, hm: hm}, nil
	}
	return w, nil
}

// Live is the bytes of the shared device's chunks not returned: what the
// Device holds of the member.
func (w *Device) Live() uint64 {
	if w == nil || w.d == nil {
		return 0
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.live
}

// usable refuses a nil Device or one not made by NewDevice.
func (w *Device) usable() error {
	if w == nil || w.d == nil {
		return errors.WithHint(errors.Wrap(driver.ErrInvalid, "budget: the device is nil or was not made by NewDevice"), "wrap a driver with budget.NewDevice")
	}
	return nil
}

func (w *Device) Name() string {
	if w == nil || w.d == nil {
		return ""
	}
	return w.d.Name()
}

func (w *Device) Devices() []driver.Device {
	if w == nil || w.d == nil {
		return nil
	}
	return w.d.Devices()
}

func (w *Device) Granularity() uint64 {
	if w == nil || w.d == nil {
		return 0
	}
	return w.d.Granularity()
}

func (w *Device) Supports(f driver.Feature) bool {
	if w == nil || w.d == nil || f == driver.FeatureShareable {
		return false
	}
	_, streams := w.d.(driver.Streams)
	return w.d.Supports(f) && (f != driver.FeatureStreams || streams)
}

func (w *Device) Reserve(size, align uint64, hint driver.Addr) (driver.Addr, error) {
	if err := w.usable(); err != nil {
		return 0, err
	}
	return w.d.Reserve(size, align, hint)
}

func (w *Device) Unreserve(base driver.Addr, size uint64) error {
	if err := w.usable(); err != nil {
		return err
	}
	return w.d.Unreserve(base, size)
}

// Create acquires size bytes from the member for a chunk on the shared
// device (the book's ErrOutOfMemory, naming who holds what, when it
// cannot), then creates it; a create the driver refuses gives them back.
func (w *Device) Create(dev driver.DeviceID, size uint64, opts driver.ChunkOptions) (driver.Handle, error) {
	if err := w.usable(); err != nil {
		return 0, err
	}
	if dev != w.dev {
		return w.d.Create(dev, size, opts)
	}
	if opts.Shareable {
		return 0, errors.Wrapf(driver.ErrUnsupported, "budget: create a shareable chunk of %s on device %d: a shared device's chunks are not exported", units.Bytes(size), dev)
	}
	if size == 0 || size > MaxCapacity {
		return w.d.Create(dev, size, opts) // the driver's own refusal
	}
	w.mu.Lock()
	_ = w.settleLocked() // what is still owed stays owed; the Acquire says why
	w.mu.Unlock()
	if err := w.m.Acquire(size); err != nil {
		return 0, errors.Wrapf(err, "budget: create a chunk of %s on device %d", units.Bytes(size), dev)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.mi != nil {
		free, _, err := w.mi.MemInfo(dev)
		if err == nil && free < size {
			err = errors.WithHint(errors.Wrapf(driver.ErrOutOfMemory,
				"budget: create a chunk of %s on device %d: the device has %s free, the rest taken outside the book", units.Bytes(size), dev, units.Bytes(free)),
				"every process on the device should join the book")
		}
		if err != nil {
			w.owed += size
			return 0, errors.CombineErrors(err, w.settleLocked())
		}
	}
	h, err := w.d.Create(dev, size, opts)
	if err != nil {
		w.owed += size
		return 0, errors.CombineErrors(err, w.settleLocked())
	}
	w.chunks[h] = &devChunk{size: size}
	w.live += size
	return h, nil
}

// giveBackLocked returns c's bytes to the member once its memory is back
// on the device.
func (w *Device) giveBackLocked(h driver.Handle, c *devChunk) error {
	if !c.released || c.maps > 0 {
		return nil
	}
	delete(w.chunks, h)
	w.live -= c.size
	w.owed += c.size
	return w.settleLocked()
}

// settleLocked gives the member back what is owed (see owed); refused,
// it stays owed, and the book's error is returned.
func (w *Device) settleLocked() error {
	if w.owed == 0 {
		return nil
	}
	if err := w.m.Release(w.owed); err != nil {
		return err
	}
	w.owed = 0
	return nil
}

func (w *Device) Release(h driver.Handle) error {
	if err := w.usable(); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.d.Release(h); err != nil {
		return err
	}
	if c := w.chunks[h]; c != nil {
		c.released = true
		return w.giveBackLocked(h, c)
	}
	return nil
}

func (w *Device) Map(addr driver.Addr, h driver.Handle) error {
	if err := w.usable(); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.d.Map(addr, h); err != nil {
		return err
	}
	if c := w.chunks[h]; c != nil {
		c.maps++
		w.maps[addr] = h
	}
	return nil
}

func (w *Device) Unmap(addr driver.Addr, size uint64) error {
	if err := w.usable(); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.d.Unmap(addr, size); err != nil {
		return err
	}
	h, ok := w.maps[addr]
	if !ok {
		return nil
	}
	delete(w.maps, addr)
	c := w.chunks[h]
	c.maps--
	return w.giveBackLocked(h, c)
}

func (w *Device) SetAccess(addr driver.Addr, size uint64, dev driver.DeviceID, a driver.Access) error {
	if err := w.usable(); err != nil {
		return err
	}
	return w.d.SetAccess(addr, size, dev, a)
}

func (w *Device) Access(addr driver.Addr, dev driver.DeviceID) (driver.Access, error) {
	if err := w.usable(); err != nil {
		return 0, err
	}
	return w.d.Access(addr, dev)
}

func (w *Device) Read(addr driver.Addr, p []byte) error {
	if err := w.usable(); err != nil {
		return err
	}
	return w.d.Read(addr, p)
}

func (w *Device) Write(addr driver.Addr, p []byte) error {
	if err := w.usable(); err != nil {
		return err
	}
	return w.d.Write(addr, p)
}

// Close closes the driver and gives every chunk's bytes back to the
// member (which stays joined: the caller closes it).
func (w *Device) Close() error {
	if err := w.usable(); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.d.Close(); err != nil {
		return err
	}
	if w.closed {
		return nil
	}
	w.closed = true
	w.owed += w.live
	err := w.settleLocked()
	w.live = 0
	clear(w.chunks)
	clear(w.maps)
	return err
}

// The driver's books, answered by the driver.

func (w *Device) ChunkInfo(h driver.Handle) (driver.DeviceID, uint64, error) {
	if err := w.usable(); err != nil {
		return 0, 0, err
	}
	return w.b.ChunkInfo(h)
}

func (w *Device) MappingAt(addr driver.Addr) (driver.Handle, uint64, error) {
	if err := w.usable(); err != nil {
		return 0, 0, err
	}
	return w.b.MappingAt(addr)
}

func (w *Device) Mapped(base driver.Addr, size uint64) (int, uint64, error) {
	if err := w.usable(); err != nil {
		return 0, 0, err
	}
	return w.b.Mapped(base, size)
}

func (w *Device) ReservationAt(base driver.Addr) (uint64, error) {
	if err := w.usable(); err != nil {
		return 0, err
	}
	return w.b.ReservationAt(base)
}

func (w *Device) Used(dev driver.DeviceID) uint64 {
	if w == nil || w.b == nil {
		return 0
	}
	return w.b.Used(dev)
}

// The driver's streams, when it has them (Supports(FeatureStreams)
// says): ErrUnsupported otherwise.

func (w *Device) streams() (driver.Streams, error) {
	if err := w.usable(); err != nil {
		return nil, err
	}
	s, ok := w.d.(driver.Streams)
	if !ok {
		return nil, errors.Wrapf(driver.ErrUnsupported, "budget: the %s driver has no streams", w.d.Name())
	}
	return s, nil
}

func (w *Device) CreateStream(dev driver.DeviceID) (driver.Stream, error) {
	s, err := w.streams()
	if err != nil {
		return 0, err
	}
	return s.CreateStream(dev)
}

func (w *Device) DestroyStream(st driver.Stream) error {
	s, err := w.streams()
	if err != nil {
		return err
	}
	return s.DestroyStream(st)
}

func (w *Device) CreateEvent(dev driver.DeviceID) (driver.Event, error) {
	s, err := w.streams()
	if err != nil {
		return 0, err
	}
	return s.CreateEvent(dev)
}

func (w *Device) DestroyEvent(e driver.Event) error {
	s, err := w.streams()
	if err != nil {
		return err
	}
	return s.DestroyEvent(e)
}

func (w *Device) RecordEvent(e driver.Event, st driver.Stream) error {
	s, err := w.streams()
	if err != nil {
		return err
	}
	return s.RecordEvent(e, st)
}

func (w *Device) StreamWaitEvent(st driver.Stream, e driver.Event) error {
	s, err := w.streams()
	if err != nil {
		return err
	}
	return s.StreamWaitEvent(st, e)
}

func (w *Device) SyncStream(st driver.Stream) error {
	s, err := w.streams()
	if err != nil {
		return err
	}
	return s.SyncStream(st)
}

func (w *Device) QueryStream(st driver.Stream) (bool, error) {
	s, err := w.streams()
	if err != nil {
		return false, err
	}
	return s.QueryStream(st)
}

func (w *Device) SyncEvent(e driver.Event) error {
	s, err := w.streams()
	if err != nil {
		return err
	}
	return s.SyncEvent(e)
}

func (w *Device) QueryEvent(e driver.Event) (bool, error) {
	s, err := w.streams()
	if err != nil {
		return false, err
	}
	return s.QueryEvent(e)
}

func (w *Device) ElapsedTime(start, end driver.Event) (time.Duration, error) {
	s, err := w.streams()
	if err != nil {
		return 0, err
	}
	return s.ElapsedTime(start, end)
}

func (w *Device) LaunchHostFunc(st driver.Stream, name string, fn func() error) error {
	s, err := w.streams()
	if err != nil {
		return err
	}
	return s.LaunchHostFunc(st, name, fn)
}

func (w *Device) CopyHtoD(dst driver.Addr, src []byte, st driver.Stream) error {
	s, err := w.streams()
	if err != nil {
		return err
	}
	return s.CopyHtoD(dst, src, st)
}

func (w *Device) CopyDtoH(dst []byte, src driver.Addr, st driver.Stream) error {
	s, err := w.streams()
	if err != nil {
		return err
	}
	return s.CopyDtoH(dst, src, st)
}

func (w *Device) CopyDtoD(dst, src driver.Addr, n uint64, st driver.Stream) error {
	s, err := w.streams()
	if err != nil {
		return err
	}
	return s.CopyDtoD(dst, src, n, st)
}

func (w *Device) Memset(dst driver.Addr, value byte, n uint64, st driver.Stream) error {
	s, err := w.streams()
	if err != nil {
		return err
	}
	return s.Memset(dst, value, n, st)
}

func (w *Device) CanAccessPeer(dev, peer driver.DeviceID) (bool, error) {
	s, err := w.streams()
	if err != nil {
		return false, err
	}
	return s.CanAccessPeer(dev, peer)
}

func (w *Device) EnablePeerAccess(dev, peer driver.DeviceID) error {
	s, err := w.streams()
	if err != nil {
		return err
	}
	return s.EnablePeerAccess(dev, peer)
}

func (w *Device) HostAlloc(size uint64) ([]byte, error) {
	s, err := w.streams()
	if err != nil {
		return nil, err
	}
	return s.HostAlloc(size)
}

func (w *Device) HostFree(b []byte) error {
	s, err := w.streams()
	if err != nil {
		return err
	}
	return s.HostFree(b)
}
