package host

import (
	"fmt"
	"unsafe"

	"github.com/vmarena/vmarena/internal/errors"
	"golang.org/x/sys/unix"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/internal/ledger"
	"github.com/vmarena/vmarena/internal/sentinel"
	"github.com/vmarena/vmarena/internal/units"
)

// Streams: the shared queue engine runs each stream as a goroutine; the
// host driver adds copies and fills, which run as the stream's device and
// are checked against that device's access (and peer access) when they
// run, in stream order — a fault still becomes ErrAccessDenied at the
// next synchronize, never a crash.

// checkCopy validates what can be checked when a copy is enqueued: the
// stream, and the alignment the device declares for async copies.
func (d *Driver) checkCopy(what func() string, s driver.Stream, addrs []driver.Addr, host []byte) (driver.DeviceID, error) {
	dev, err := d.engine.StreamDevice(s)
	if err != nil {
		return 0, err
	}
	return dev, driver.CheckCopyAlign(what, d.Devices()[dev], addrs, host)
}

func (d *Driver) peer(dev driver.DeviceID) func(driver.DeviceID) bool {
	return func(owner driver.DeviceID) bool { return d.engine.PeerEnabled(dev, owner) }
}

// SyncDevice waits for the work queued at the call on every stream of
// the driver (all its streams are its own: it waits for every device's,
// dev's among them). It is sleep.DeviceSyncer's: Sleep calls it before it
// copies out or unmaps anything. It reports no failure of that work (each
// stream keeps its own for SyncStream); from a host function whose stream
// or a stream after it holds work it would wait for, it is ErrBusy, having
// waited for nothing. An unknown dev is ErrNoDevice.
func (d *Driver) SyncDevice(dev driver.DeviceID) error {
	if d.unmade() {
		return errUnmade("SyncDevice")
	}
	what := func() string { return fmt.Sprintf("host: synchronize device %d", dev) }
	if err := driver.CheckDevice(what, dev, len(d.books.Devices())); err != nil {
		return err
	}
	return d.engine.Drain(what())
}

// CopyHtoD enqueues on s a copy of src to dst. When it runs, the stream's
// device needs read-write access over the whole destination, and peer
// access if it is another device's memory; otherwise the copy fails with
// ErrAccessDenied, reported by the next SyncStream. dst and src must be
// aligned to the device's CopyAlign (ErrMisaligned at once), and src left
// alone until the stream has passed the copy.
func (d *Driver) CopyHtoD(dst driver.Addr, src []byte, s driver.Stream) error {
	if d.unmade() {
		return errUnmade("CopyHtoD")
	}
	what := func() string { return fmt.Sprintf("host: copy %d bytes from the host to %s", len(src), dst) }
	dev, err := d.checkCopy(what, s, []driver.Addr{dst}, src)
	if err != nil || len(src) == 0 {
		return err
	}
	n := uint64(len(src))
	return d.engine.Enqueue(s, what(), func() error {
		return d.books.WithDeviceRanges("copy to device", dev, d.peer(dev), []ledger.Want{{Addr: dst, N: n, Access: driver.AccessReadWrite}},
			func(rs []*ledger.Region) error { return copyFaulting(bytesAt(rs[0], dst, len(src)), src) })
	})
}

// CopyDtoH enqueues on s a copy of len(dst) bytes at src into dst. When it
// runs, the stream's device needs read access over the whole source, and
// peer access if it is another device's memory; otherwise the copy fails
// with ErrAccessDenied, reported by the next SyncStream. dst and src must
// be aligned to the device's CopyAlign (ErrMisaligned at once), and dst
// left alone until the stream has passed the copy.
func (d *Driver) CopyDtoH(dst []byte, src driver.Addr, s driver.Stream) error {
	if d.unmade() {
		return errUnmade("CopyDtoH")
	}
	what := func() string { return fmt.Sprintf("host: copy %d bytes from %s to the host", len(dst), src) }
	dev, err := d.checkCopy(what, s, []driver.Addr{src}, dst)
	if err != nil || len(dst) == 0 {
		return err
	}
	n := uint64(len(dst))
	return d.engine.Enqueue(s, what(), func() error {
		return d.books.WithDeviceRanges("copy from device", dev, d.peer(dev), []ledger.Want{{Addr: src, N: n, Access: driver.AccessRead}},
			func(rs []*ledger.Region) error { return copyFaulting(dst, bytesAt(rs[0], src, len(dst))) })
	})
}

// CopyDtoD enqueues on s a copy of n bytes from src to dst; overlapping
// ranges copy as memmove. When it runs, the stream's device needs read
// access over the source and read-write access over the destination, and
// peer access to another device's memory; otherwise the copy fails with
// ErrAccessDenied, reported by the next SyncStream. Both addresses must be
// aligned to the device's CopyAlign (ErrMisaligned at once).
func (d *Driver) CopyDtoD(dst, src driver.Addr, n uint64, s driver.Stream) error {
	if d.unmade() {
		return errUnmade("CopyDtoD")
	}
	what := func() string { return fmt.Sprintf("host: copy %s from %s to %s", units.Bytes(n), src, dst) }
	dev, err := d.checkCopy(what, s, []driver.Addr{dst, src}, nil)
	if err != nil || n == 0 {
		return err
	}
	return d.engine.Enqueue(s, what(), func() error {
		return d.books.WithDeviceRanges("copy device to device", dev, d.peer(dev),
			[]ledger.Want{{Addr: src, N: n, Access: driver.AccessRead}, {Addr: dst, N: n, Access: driver.AccessReadWrite}},
			func(rs []*ledger.Region) error {
				return copyFaulting(bytesAt(rs[1], dst, int(n)), bytesAt(rs[0], src, int(n)))
			})
	})
}

// Memset enqueues on s a fill of n bytes at dst with value. When it runs,
// the stream's device needs read-write access over the range, and peer
// access if it is another device's memory; otherwise the fill fails with
// ErrAccessDenied, reported by the next SyncStream. dst must be aligned to
// the device's CopyAlign (ErrMisaligned at once).
func (d *Driver) Memset(dst driver.Addr, value byte, n uint64, s driver.Stream) error {
	if d.unmade() {
		return errUnmade("Memset")
	}
	what := func() string { return fmt.Sprintf("host: fill %s at %s with %#x", units.Bytes(n), dst, value) }
	dev, err := d.checkCopy(what, s, []driver.Addr{dst}, nil)
	if err != nil || n == 0 {
		return err
	}
	return d.engine.Enqueue(s, what(), func() error {
		return d.books.WithDeviceRanges("fill", dev, d.peer(dev), []ledger.Want{{Addr: dst, N: n, Access: driver.AccessReadWrite}},
			func(rs []*ledger.Region) error { return fillFaulting(bytesAt(rs[0], dst, int(n)), value) })
	})
}

// HostAlloc returns size bytes of page-aligned (so 64-byte aligned) host
// memory outside the Go heap, locked in RAM where the limit allows
// (mlock), for copies that need aligned, pinned buffers. A zero size is
// ErrInvalid, more than the machine has available now ErrOutOfMemory (as
// for Create); Close refuses (ErrBusy) while any buffer is live.
func (d *Driver) HostAlloc(size uint64) ([]byte, error) {
	if d.unmade() {
		return nil, errUnmade("HostAlloc")
	}
	if d.engine.Closed() {
		return nil, driver.Closed("host: host alloc")
	}
	if size == 0 {
		return nil, errors.Wrap(driver.ErrInvalid, "host: host alloc of zero bytes")
	}
	// MAP_POPULATE faults every page in: more than the machine has would
	// bring the OOM killer, as a chunk's commit would (memory_linux.go).
	if err := d.b.mem.checkAvailable(size); err != nil {
		return nil, errors.Wrapf(err, "host: host alloc of %s", units.Bytes(size))
	}
	p, err := unix.MmapPtr(-1, 0, nil, uintptr(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		return nil, sentinel.Mark(errors.Wrapf(err, "host: host alloc of %s", units.Bytes(size)), driver.ErrOutOfMemory)
	}
	b := unsafe.Slice((*byte)(p), size)
	_ = unix.Mlock(b) // best effort: RLIMIT_MEMLOCK may forbid it
	if !d.hb.Add(b) { // closed meanwhile
		_ = unix.MunmapPtr(p, uintptr(size))
		return nil, driver.Closed("host: host alloc")
	}
	return b, nil
}

// HostFree returns a buffer HostAlloc gave, whole; any other slice, or one
// freed already, is ErrInvalid. It first waits, as cuMemFreeHost does, for
// the work enqueued on every stream so far, so a copy still queued on the
// buffer runs before it is unmapped (and never into a buffer HostAlloc
// hands out next at the same address); failures of that work are left
// for the streams' next synchronize. From a host function that work waits
// for it is refused with ErrBusy, and the buffer stays live.
func (d *Driver) HostFree(b []byte) error {
	if d.unmade() {
		return errUnmade("HostFree")
	}
	if d.engine.Closed() {
		return driver.Closed("host: host free (Close returned every host buffer)")
	}
	if err := d.hb.Remove("host", d.engine, b); err != nil {
		return err
	}
	return errors.Wrap(unix.MunmapPtr(unsafe.Pointer(&b[0]), uintptr(len(b))), "host: host free")
}

// closeHostBuffers unmaps the buffers still live: Close refused while any
// was, so only a tear-down finds some.
func (d *Driver) closeHostBuffers() error {
	var errs error
	for _, b := range d.hb.Close() {
		errs = errors.CombineErrors(errs, unix.MunmapPtr(unsafe.Pointer(&b[0]), uintptr(len(b))))
	}
	return errs
}
