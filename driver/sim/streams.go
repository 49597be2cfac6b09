package sim

import (
	"fmt"
	"time"
	"unsafe"

	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/driver"
)

// The sim driver's streams run host functions, record and wait on events
// like any driver's; copies and fills have no memory to touch.

// CreateStream makes a stream of device dev (an unknown device is
// ErrNoDevice): an ordered queue whose work runs on a goroutine of its own,
// one operation at a time, in the order it was enqueued.
func (d *Driver) CreateStream(dev driver.DeviceID) (driver.Stream, error) {
	if d.unmade() {
		return *new(driver.Stream), errUnmade("CreateStream")
	}
	return d.engine.CreateStream(dev)
}

// DestroyStream waits for the work enqueued on s, then destroys it; the
// error is any failure of that work not yet reported. An unknown or
// destroyed stream is ErrBadHandle. From a host function this would wait
// for, it is refused with ErrBusy and changes nothing.
func (d *Driver) DestroyStream(s driver.Stream) error {
	if d.unmade() {
		return errUnmade("DestroyStream")
	}
	return d.engine.DestroyStream(s)
}

// CreateEvent makes an event of device dev (an unknown device is
// ErrNoDevice), to be recorded on that device's streams.
func (d *Driver) CreateEvent(dev driver.DeviceID) (driver.Event, error) {
	if d.unmade() {
		return *new(driver.Event), errUnmade("CreateEvent")
	}
	return d.engine.CreateEvent(dev)
}

// DestroyEvent forgets the event e; an unknown or destroyed event is
// ErrBadHandle. Work already waiting on it still waits for the point it
// was recorded at.
func (d *Driver) DestroyEvent(e driver.Event) error {
	if d.unmade() {
		return errUnmade("DestroyEvent")
	}
	return d.engine.DestroyEvent(e)
}

// RecordEvent marks the current end of stream s in e: e completes when the
// work enqueued on s so far has. Recording it again moves it. The event and
// the stream must be of the same device (ErrInvalid); an unknown event or
// stream is ErrBadHandle.
func (d *Driver) RecordEvent(e driver.Event, s driver.Stream) error {
	if d.unmade() {
		return errUnmade("RecordEvent")
	}
	return d.engine.RecordEvent(e, s)
}

// StreamWaitEvent makes the work enqueued on s from now on wait until e,
// as last recorded, completes; an event never recorded is complete. A
// stream of any device may wait on an event of any device.
func (d *Driver) StreamWaitEvent(s driver.Stream, e driver.Event) error {
	if d.unmade() {
		return errUnmade("StreamWaitEvent")
	}
	return d.engine.StreamWaitEvent(s, e)
}

// SyncStream waits until the work enqueued on s so far has finished and
// returns the first failure of it not yet reported, naming the operation
// (later work was skipped until now). An unknown stream is ErrBadHandle;
// from a host function this would wait for, it is refused at once with
// ErrBusy.
func (d *Driver) SyncStream(s driver.Stream) error {
	if d.unmade() {
		return errUnmade("SyncStream")
	}
	return d.engine.SyncStream(s)
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
	what := func() string { return fmt.Sprintf("sim: synchronize device %d", dev) }
	if err := driver.CheckDevice(what, dev, len(d.books.Devices())); err != nil {
		return err
	}
	return d.engine.Drain(what())
}

// QueryStream reports, without waiting, whether the work enqueued on s has
// finished; once it has, the error is any failure not yet reported.
func (d *Driver) QueryStream(s driver.Stream) (bool, error) {
	if d.unmade() {
		return false, errUnmade("QueryStream")
	}
	return d.engine.QueryStream(s)
}

// SyncEvent waits until e, as last recorded, has completed; an event never
// recorded is complete. From a host function this would wait for, it is
// refused at once with ErrBusy.
func (d *Driver) SyncEvent(e driver.Event) error {
	if d.unmade() {
		return errUnmade("SyncEvent")
	}
	return d.engine.SyncEvent(e)
}

// QueryEvent reports, without waiting, whether e has completed.
func (d *Driver) QueryEvent(e driver.Event) (bool, error) {
	if d.unmade() {
		return false, errUnmade("QueryEvent")
	}
	return d.engine.QueryEvent(e)
}

// ElapsedTime is the wall-clock time from the completion of start to that
// of end. An event never recorded is ErrInvalid, one not yet completed
// ErrBusy.
func (d *Driver) ElapsedTime(start, end driver.Event) (time.Duration, error) {
	if d.unmade() {
		return *new(time.Duration), errUnmade("ElapsedTime")
	}
	return d.engine.ElapsedTime(start, end)
}

// LaunchHostFunc enqueues fn on s; it runs on the stream's goroutine after
// the work enqueued before it. An error it returns or a panic (ErrInvalid)
// is its failure, reported under name by the next SyncStream. A nil fn is
// ErrInvalid.
func (d *Driver) LaunchHostFunc(s driver.Stream, name string, fn func() error) error {
	if d.unmade() {
		return errUnmade("LaunchHostFunc")
	}
	return d.engine.LaunchHostFunc(s, name, fn)
}

// CanAccessPeer reports true for two different devices: every simulated
// device may be allowed to reach every other's memory (EnablePeerAccess).
func (d *Driver) CanAccessPeer(dev, peer driver.DeviceID) (bool, error) {
	if d.unmade() {
		return false, errUnmade("CanAccessPeer")
	}
	return d.engine.CanAccessPeer(dev, peer)
}

// EnablePeerAccess records that dev's streams may reach memory of peer;
// enabling it again is harmless, and from a device to itself it is
// ErrInvalid.
func (d *Driver) EnablePeerAccess(dev, peer driver.DeviceID) error {
	if d.unmade() {
		return errUnmade("EnablePeerAccess")
	}
	return d.engine.EnablePeerAccess(dev, peer)
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
// pinned: there is no device to copy to). A zero size is ErrInvalid; Close
// refuses (ErrBusy) while any buffer is live.
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
	raw := make([]byte, size+64)
	off := (64 - uintptr(unsafe.Pointer(&raw[0]))%64) % 64
	b := raw[off : off+uintptr(size) : off+uintptr(size)]
	if !d.hb.Add(b) {
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
	return d.hb.Remove("sim", d.engine, b)
}
