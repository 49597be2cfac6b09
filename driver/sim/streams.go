package sim

import (
	"fmt"
	"unsafe"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// The sim driver's streams run host functions, record and wait on events
// like any driver's; copies and fills have no memory to touch.

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
	what := func() string { return fmt.Sprintf("sim: synchronize device %d", dev) }
	if err := driver.CheckDevice(what, dev, len(d.books.Devices())); err != nil {
		return err
	}
	return d.engine.Drain(what())
}

// unsupported is the answer of every call that would touch memory.
func (d *Driver) unsupported(op string) error {
	return errors.WithHint(errors.Wrapf(driver.ErrUnsupported, "sim: %s: the sim driver has no memory behind its addresses", op),
		"use the host driver to move bytes")
}

// CopyHtoD is ErrUnsupported: the sim driver has no memory to copy to.
func (d *Driver) CopyHtoD(driver.Addr, []byte, driver.Stream) error {
	if d.unmade() {
		return errUnmade("CopyHtoD")
	}
	return d.unsupported("copy to device")
}

// CopyDtoH is ErrUnsupported: the sim driver has no memory to copy from.
func (d *Driver) CopyDtoH([]byte, driver.Addr, driver.Stream) error {
	if d.unmade() {
		return errUnmade("CopyDtoH")
	}
	return d.unsupported("copy from device")
}

// CopyDtoD is ErrUnsupported: the sim driver has no memory to copy.
func (d *Driver) CopyDtoD(_, _ driver.Addr, _ uint64, _ driver.Stream) error {
	if d.unmade() {
		return errUnmade("CopyDtoD")
	}
	return d.unsupported("copy device to device")
}

// Memset is ErrUnsupported: the sim driver has no memory to fill.
func (d *Driver) Memset(driver.Addr, byte, uint64, driver.Stream) error {
	if d.unmade() {
		return errUnmade("Memset")
	}
	return d.unsupported("fill")
}

// HostAlloc returns size bytes of Go memory aligned to 64 bytes (nothing is
// pinned: there is no device to copy to). A zero size is ErrInvalid, one
// the live buffers and Options.HostMemory leave no room for
// ErrOutOfMemory; Close refuses (ErrBusy) while any buffer is live.
func (d *Driver) HostAlloc(size uint64) ([]byte, error) {
	if d.unmade() {
		return nil, errUnmade("HostAlloc")
	}
	if d.engine.Closed() {
		return nil, driver.Closed("sim: host alloc")
	}
	if size == 0 {
		return nil, errors.Wrap(driver.ErrInvalid, "sim: host alloc of zero bytes")
	}
	d.host.Lock()
	if size > d.host.max-d.host.live {
		live, most := d.host.live, d.host.max
		d.host.Unlock()
		return nil, errors.WithHint(errors.Wrapf(driver.ErrOutOfMemory, "sim: host alloc of %s: %s of host buffers live, of at most %s",
			units.Bytes(size), units.Bytes(live), units.Bytes(most)), "free host buffers, or make the driver with a larger Options.HostMemory")
	}
	d.host.live += size
	d.host.Unlock()
	raw := make([]byte, size+hostAlign)
	off := (hostAlign - uintptr(unsafe.Pointer(&raw[0]))%hostAlign) % hostAlign
	b := raw[off : off+uintptr(size) : off+uintptr(size)]
	if !d.hb.Add(b) {
		d.hostGone(size)
		return nil, driver.Closed("sim: host alloc")
	}
	return b, nil
}

// HostFree takes back a buffer HostAlloc gave, whole; any other slice, or
// one freed already, is ErrInvalid. Like every driver's, it first waits for
// the work enqueued on every stream so far (from a host function that work
// waits for, ErrBusy and the buffer stays live).
func (d *Driver) HostFree(b []byte) error {
	if d.unmade() {
		return errUnmade("HostFree")
	}
	if d.engine.Closed() {
		return driver.Closed("sim: host free")
	}
	if err := d.hb.Remove("sim", d.engine, b); err != nil {
		return err
	}
	d.hostGone(uint64(len(b)))
	return nil
}

// hostAlign is the alignment of a host buffer.
const hostAlign = 64

// hostGone takes n bytes of host buffers out of the live count.
func (d *Driver) hostGone(n uint64) {
	d.host.Lock()
	d.host.live -= n
	d.host.Unlock()
}
