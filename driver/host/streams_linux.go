package host

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/cockroachdb/errors"
	"golang.org/x/sys/unix"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/internal/ledger"
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
	dev, err := d.StreamDevice(s)
	if err != nil {
		return 0, err
	}
	align := d.Devices()[dev].CopyAlign
	for _, a := range addrs {
		if uint64(a)%align != 0 {
			return 0, errors.WithHintf(
				errors.Wrapf(driver.ErrMisaligned, "%s: address %s is not %d-byte aligned, as device %d requires for async copies", what(), a, align, dev),
				"allocate copy buffers with %d-byte aligned starts (pinned host buffers from HostAlloc are)", align)
		}
	}
	if len(host) > 0 && uint64(uintptr(unsafe.Pointer(&host[0])))%align != 0 {
		return 0, errors.Wrapf(driver.ErrMisaligned, "%s: the host buffer is not %d-byte aligned, as device %d requires for async copies (use HostAlloc)", what(), align, dev)
	}
	return dev, nil
}

func (d *Driver) peer(dev driver.DeviceID) func(driver.DeviceID) bool {
	return func(owner driver.DeviceID) bool { return d.PeerEnabled(dev, owner) }
}

// CopyHtoD implements driver.Streams.
func (d *Driver) CopyHtoD(dst driver.Addr, src []byte, s driver.Stream) error {
	what := func() string { return fmt.Sprintf("host: copy %d bytes from the host to %s", len(src), dst) }
	dev, err := d.checkCopy(what, s, []driver.Addr{dst}, src)
	if err != nil || len(src) == 0 {
		return err
	}
	n := uint64(len(src))
	return d.Enqueue(s, what(), func() error {
		return d.WithDeviceRanges("copy to device", dev, d.peer(dev), []ledger.Want{{Addr: dst, N: n, Access: driver.AccessReadWrite}},
			func(rs []*ledger.Region) error { return copyFaulting(bytesAt(rs[0], dst, len(src)), src) })
	})
}

// CopyDtoH implements driver.Streams.
func (d *Driver) CopyDtoH(dst []byte, src driver.Addr, s driver.Stream) error {
	what := func() string { return fmt.Sprintf("host: copy %d bytes from %s to the host", len(dst), src) }
	dev, err := d.checkCopy(what, s, []driver.Addr{src}, dst)
	if err != nil || len(dst) == 0 {
		return err
	}
	n := uint64(len(dst))
	return d.Enqueue(s, what(), func() error {
		return d.WithDeviceRanges("copy from device", dev, d.peer(dev), []ledger.Want{{Addr: src, N: n, Access: driver.AccessRead}},
			func(rs []*ledger.Region) error { return copyFaulting(dst, bytesAt(rs[0], src, len(dst))) })
	})
}

// CopyDtoD implements driver.Streams. Overlapping ranges copy as memmove.
func (d *Driver) CopyDtoD(dst, src driver.Addr, n uint64, s driver.Stream) error {
	what := func() string { return fmt.Sprintf("host: copy %s from %s to %s", units.Bytes(n), src, dst) }
	dev, err := d.checkCopy(what, s, []driver.Addr{dst, src}, nil)
	if err != nil || n == 0 {
		return err
	}
	return d.Enqueue(s, what(), func() error {
		return d.WithDeviceRanges("copy device to device", dev, d.peer(dev),
			[]ledger.Want{{Addr: src, N: n, Access: driver.AccessRead}, {Addr: dst, N: n, Access: driver.AccessReadWrite}},
			func(rs []*ledger.Region) error {
				return copyFaulting(bytesAt(rs[1], dst, int(n)), bytesAt(rs[0], src, int(n)))
			})
	})
}

// Memset implements driver.Streams.
func (d *Driver) Memset(dst driver.Addr, value byte, n uint64, s driver.Stream) error {
	what := func() string { return fmt.Sprintf("host: fill %s at %s with %#x", units.Bytes(n), dst, value) }
	dev, err := d.checkCopy(what, s, []driver.Addr{dst}, nil)
	if err != nil || n == 0 {
		return err
	}
	return d.Enqueue(s, what(), func() error {
		return d.WithDeviceRanges("fill", dev, d.peer(dev), []ledger.Want{{Addr: dst, N: n, Access: driver.AccessReadWrite}},
			func(rs []*ledger.Region) error { return fillFaulting(bytesAt(rs[0], dst, int(n)), value) })
	})
}

// hostBuffers are the pinned buffers HostAlloc handed out, by first byte.
type hostBuffers struct {
	mu   sync.Mutex
	bufs map[*byte]uint64
}

// HostAlloc returns size bytes of page-aligned (so 64-byte aligned) host
// memory outside the Go heap, locked in RAM where the limit allows
// (mlock), for copies that need aligned, pinned buffers.
func (d *Driver) HostAlloc(size uint64) ([]byte, error) {
	if d.Closed() {
		return nil, driver.Closed("host: host alloc")
	}
	if size == 0 {
		return nil, errors.Wrap(driver.ErrInvalid, "host: host alloc of zero bytes")
	}
	p, err := unix.MmapPtr(-1, 0, nil, uintptr(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		return nil, errors.Mark(errors.Wrapf(err, "host: host alloc of %s", units.Bytes(size)), driver.ErrOutOfMemory)
	}
	b := unsafe.Slice((*byte)(p), size)
	_ = unix.Mlock(b) // best effort: RLIMIT_MEMLOCK may forbid it
	d.hb.mu.Lock()
	defer d.hb.mu.Unlock()
	if d.hb.bufs == nil {
		d.hb.bufs = map[*byte]uint64{}
	}
	d.hb.bufs[&b[0]] = size
	return b, nil
}

// HostFree returns a buffer HostAlloc gave, whole.
func (d *Driver) HostFree(b []byte) error {
	if d.Closed() {
		return driver.Closed("host: host free (Close returned every host buffer)")
	}
	d.hb.mu.Lock()
	defer d.hb.mu.Unlock()
	if len(b) == 0 || d.hb.bufs[&b[0]] != uint64(len(b)) {
		return errors.Wrap(driver.ErrInvalid, "host: host free of a buffer HostAlloc did not give (or not whole, or freed already)")
	}
	delete(d.hb.bufs, &b[0])
	return errors.Wrap(unix.MunmapPtr(unsafe.Pointer(&b[0]), uintptr(len(b))), "host: host free")
}

func (d *Driver) closeHostBuffers() error {
	d.hb.mu.Lock()
	defer d.hb.mu.Unlock()
	var errs error
	for p, n := range d.hb.bufs {
		errs = errors.CombineErrors(errs, unix.MunmapPtr(unsafe.Pointer(p), uintptr(n)))
	}
	d.hb.bufs = nil
	return errs
}
