package acl

//go:generate go run ../internal/forward -docs forward.txt -out forward.go core=../internal/accel:Core

import (
	"fmt"
	"runtime"
	"slices"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/internal/accel"
)

// Driver is the AscendCL driver. It implements driver.Driver,
// driver.Streams, driver.Sharing and driver.AllowList; its methods are
// safe for concurrent use. It does not implement driver.HostMapper: NPU
// memory is not host memory, and bytes move with Read, Write and the
// stream copies.
type Driver struct {
	// core checks every call against the contract, keeps the record of
	// what was made and runs the streams; the AscendCL calls are made
	// through it.
	core *accel.Core
	// rt is the runtime under core, for the calls outside the contract
	// (HostPID).
	rt   *ascend
	wait WaitMode
}

var (
	_ driver.Driver    = (*Driver)(nil)
	_ driver.Books     = (*Driver)(nil)
	_ driver.Streams   = (*Driver)(nil)
	_ driver.Sharing   = (*Driver)(nil)
	_ driver.AllowList = (*Driver)(nil)
)

// unmade reports whether d is nil or a zero Driver, not one Open made:
// every method then answers ErrInvalid instead of dereferencing nothing.
func (d *Driver) unmade() bool { return d == nil || d.core == nil }

func errUnmade(op string) error {
	return errors.Wrapf(driver.ErrInvalid, "acl: %s: the driver was not made by acl.Open (nil or zero Driver)", op)
}

// Name is "acl".
func (d *Driver) Name() string { return "acl" }

// Wait is how the driver waits for the work it enqueues on AscendCL
// streams: Options.Wait, with WaitAuto resolved.
func (d *Driver) Wait() WaitMode {
	if d.unmade() {
		return WaitAuto
	}
	return d.wait
}

// ReservationsBindOneDevice is true: AscendCL binds each reservation to
// the memory of one NPU, local or imported, never both at once (Huawei's
// reference for aclrtMapMem), so Map refuses the rest with
// ErrUnsupported. Reserve a range for each NPU, and one for imported
// chunks.
func (d *Driver) ReservationsBindOneDevice() bool { return true }

// tearDown closes d whatever is left mapped: for the conformance suite.
func (d *Driver) tearDown() error { return d.core.TearDown() }

// SyncStreamHandle waits for the work queued so far on stream, an
// aclrtStream this driver did not make (a framework's: torch_npu's), given
// by its handle (aclrtSynchronizeStream, on the calling thread); libvmarena
// calls it before a free, as on CUDA. A stream handle carries its
// context, so the thread's current one is used as it is (the driver's own
// where the thread has none). Stream 0 is the default stream of the
// calling thread's current context (torch_npu's); on a thread with no
// context of the caller's (none, or the driver's own, which its calls
// leave on a thread that had none) there is no such stream to name, and the whole device is waited
// for instead (aclrtSynchronizeDevice), every context's work. A bad handle
// is the runtime's error.
func (d *Driver) SyncStreamHandle(dev driver.DeviceID, stream uintptr) error {
	if d.unmade() || d.rt == nil {
		return errUnmade("SyncStreamHandle")
	}
	what := fmt.Sprintf("acl: synchronize stream %#x of device %d", stream, dev)
	if err := driver.CheckDevice(func() string { return what }, dev, len(d.core.Devices())); err != nil {
		return err
	}
	if d.core.Closed() {
		return driver.Closed(what)
	}
	l := d.rt.x.l
	if l.aclrtSynchronizeStream == nil {
		return errors.Wrapf(driver.ErrUnsupported, "%s: %s lacks aclrtSynchronizeStream", what, l.path)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var cur uintptr
	if l.aclrtGetCurrentContext(&cur) != 0 || slices.Contains(d.rt.ctx, cur) {
		cur = 0 // none, or the driver's own (left by an earlier call): not a caller's
	}
	sync := func() aclError { return l.aclrtSynchronizeStream(stream) }
	switch {
	case cur != 0:
		return errors.Wrapf(l.err("aclrtSynchronizeStream", sync()), "%s", what)
	case stream != 0:
		return errors.Wrapf(d.rt.on(dev, "aclrtSynchronizeStream", sync), "%s", what)
	default:
		return errors.Wrapf(d.rt.SyncDevice(dev), "%s: the thread has no context, so no default stream: the device", what)
	}
}

// HostPID is this process's ID as AscendCL's allow-lists hold it
// (aclrtDeviceGetBareTgid): what an exporter passes to AllowPIDs for this
// process to import its chunks, so an importer sends it to the exporter.
// On a bare host it is os.Getpid(); inside a container (a PID namespace)
// the two differ, as does the ID SO_PEERCRED reports across containers,
// and AscendCL refuses an import allowed under any ID but this one. A
// library without the sharing calls is ErrUnsupported; a closed driver
// ErrClosed.
func (d *Driver) HostPID() (int, error) {
	if d.unmade() || d.rt == nil {
		return 0, errUnmade("HostPID")
	}
	if d.core.Closed() {
		return 0, driver.Closed("acl: host process ID")
	}
	if !d.core.Supports(driver.FeatureShareable) {
		return 0, errors.Wrap(driver.ErrUnsupported, "acl: host process ID: the library cannot share memory between processes")
	}
	pid, err := d.rt.hostPID()
	if err != nil {
		return 0, errors.Wrap(err, "acl: host process ID")
	}
	return pid, nil
}

// AllowPIDs adds processes to those AscendCL lets import chunk h, which was
// exported (aclrtMemSetPidToShareableHandle). The IDs are host process IDs,
// each the importer's HostPID (aclrtDeviceGetBareTgid): inside a PID
// namespace they differ from what the importer's getpid says, and from
// what SO_PEERCRED reports across containers. The list only grows.
func (d *Driver) AllowPIDs(h driver.Handle, pids []int) error {
	if d.unmade() {
		return errUnmade("AllowPIDs")
	}
	if !d.core.Supports(driver.FeatureShareable) {
		// The library lacks the sharing calls: as Export says.
		return errors.Wrapf(driver.ErrUnsupported, "acl: allow processes to import chunk %d: the library cannot share memory between processes", h)
	}
	return d.core.AllowPIDs(h, pids)
}
