package acl

import (
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/cockroachdb/errors"

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

// Devices lists the NPUs the driver uses, in the order of
// Options.Devices: their names, capacities (device memory, or
// Options.Capacity), the minimum and recommended granularities
// aclrtMemGetAllocationGranularity reports, and CopyAlign 64 (async
// copies need 64-byte aligned addresses). The slice is a copy.
func (d *Driver) Devices() []driver.Device {
	if d.unmade() {
		return nil
	}
	return d.core.Devices()
}

// Granularity is the unit of reservation sizes and addresses: the largest
// minimum granularity of the devices.
func (d *Driver) Granularity() uint64 {
	if d.unmade() {
		return 0
	}
	return d.core.Granularity()
}

// Supports reports the optional features the loaded libascendcl provides:
// FeatureHostAccess (aclrtMemcpy), FeatureShareable (export and import of
// tokens with an allow-list) and FeatureStreams (streams, async copies and
// fills, pinned host memory). A library lacking the symbols of one answers
// false for it and ErrUnsupported from its methods; the rest of the driver
// works.
func (d *Driver) Supports(f driver.Feature) bool {
	if d.unmade() {
		return false
	}
	return d.core.Supports(f)
}

// Wait is how the driver waits for the work it enqueues on AscendCL
// streams: Options.Wait, with WaitAuto resolved.
func (d *Driver) Wait() WaitMode {
	if d.unmade() {
		return WaitAuto
	}
	return d.wait
}

// Reserve holds size bytes of the NPUs' virtual address space
// (aclrtReserveMemAddress), aligned to align (0 means Granularity()).
// AscendCL takes no alignment and no hint: a range that needs alignment is
// reserved larger and the aligned part used, and hint is ignored. A size
// or hint that is not a multiple of the granularity is ErrMisaligned, a
// zero size or an align that is not a power of two ErrInvalid.
func (d *Driver) Reserve(size, align uint64, hint driver.Addr) (driver.Addr, error) {
	if d.unmade() {
		return 0, errUnmade("Reserve")
	}
	return d.core.Reserve(size, align, hint)
}

// Unreserve gives back a range Reserve returned, passed exactly as it was
// returned (aclrtReleaseMemAddress of what was reserved); any other range
// is ErrNotReserved, and while anything inside is mapped it refuses with
// ErrBusy.
func (d *Driver) Unreserve(base driver.Addr, size uint64) error {
	if d.unmade() {
		return errUnmade("Unreserve")
	}
	return d.core.Unreserve(base, size)
}

// Create commits size bytes on NPU dev (aclrtMallocPhysical, pinned HBM in
// 2 MiB pages). size must be a multiple of the device's MinGranularity
// (ErrMisaligned); a chunk the device's capacity cannot hold is
// ErrOutOfMemory, as is ACL_ERROR_RT_MEMORY_ALLOCATION when other
// processes hold the NPU's memory. Only chunks created with
// opts.Shareable may be exported.
func (d *Driver) Create(dev driver.DeviceID, size uint64, opts driver.ChunkOptions) (driver.Handle, error) {
	if d.unmade() {
		return 0, errUnmade("Create")
	}
	return d.core.Create(dev, size, opts)
}

// Release gives up chunk h (aclrtFreePhysical, once no other chunk of
// this process holds the same memory); its memory returns to the NPU once
// its last mapping is gone too. An unknown or released handle is
// ErrBadHandle.
func (d *Driver) Release(h driver.Handle) error {
	if d.unmade() {
		return errUnmade("Release")
	}
	return d.core.Release(h)
}

// Map maps the whole chunk h at addr (aclrtMemMapNoAccess, offset 0, the
// whole handle; with an older CANN, aclrtMapMem and aclrtMemSetAccess
// taking back the access it gives the chunk's NPU), inaccessible to every
// NPU until SetAccess. addr must be a multiple of the chunk's device
// granularity (ErrMisaligned) inside one reservation (ErrNotReserved),
// covering no other mapping (ErrOverlap). AscendCL binds a reservation to
// one NPU's memory, local or imported, never both: a chunk of another NPU,
// or an imported chunk beside local ones (or the reverse), is
// ErrUnsupported, and nothing changes (ReservationsBindOneDevice).
func (d *Driver) Map(addr driver.Addr, h driver.Handle) error {
	if d.unmade() {
		return errUnmade("Map")
	}
	return d.core.Map(addr, h)
}

// Unmap removes the mapping that starts at addr and is size bytes long
// (aclrtUnmapMem, which takes the start alone: the size is checked here).
// Nothing mapped there is ErrNotMapped, a range that is not exactly one
// mapping ErrPartial.
func (d *Driver) Unmap(addr driver.Addr, size uint64) error {
	if d.unmade() {
		return errUnmade("Unmap")
	}
	return d.core.Unmap(addr, size)
}

// SetAccess sets what NPU dev may do over [addr, addr+size), which must
// be mapped throughout (ErrNotMapped) and granule-aligned (ErrMisaligned).
// The driver records the access per granule, and its copies obey that;
// aclrtMemSetAccess takes exactly one whole mapping, so each mapping the
// range covers is given, for dev, the widest access dev has anywhere in
// it (one call a mapping whose widest access changes). If AscendCL refuses
// part-way, the mappings already changed are set back.
func (d *Driver) SetAccess(addr driver.Addr, size uint64, dev driver.DeviceID, a driver.Access) error {
	if d.unmade() {
		return errUnmade("SetAccess")
	}
	return d.core.SetAccess(addr, size, dev, a)
}

// Access reports what NPU dev may do at addr, as last set.
func (d *Driver) Access(addr driver.Addr, dev driver.DeviceID) (driver.Access, error) {
	if d.unmade() {
		return 0, errUnmade("Access")
	}
	return d.core.Access(addr, dev)
}

// Read copies len(p) bytes at addr into p (aclrtMemcpy, device to host),
// as an NPU that may read each part. A part no NPU may read, or reserved
// but not mapped, is ErrAccessDenied: AscendCL is never asked to touch it.
func (d *Driver) Read(addr driver.Addr, p []byte) error {
	if d.unmade() {
		return errUnmade("Read")
	}
	return d.core.Read(addr, p)
}

// Write copies p to addr (aclrtMemcpy, host to device), as an NPU that may
// write each part, or is ErrAccessDenied.
func (d *Driver) Write(addr driver.Addr, p []byte) error {
	if d.unmade() {
		return errUnmade("Write")
	}
	return d.core.Write(addr, p)
}

// Export returns chunk h, created shareable, as a 64-bit token
// (aclrtMemExportToShareableHandle, importer PIDs validated): only the
// processes AllowPIDs names may import it. Once per chunk: a second export
// is ErrBusy, a chunk not created shareable ErrInvalid.
func (d *Driver) Export(h driver.Handle) (driver.Shareable, error) {
	if d.unmade() {
		return driver.Shareable{}, errUnmade("Export")
	}
	return d.core.Export(h)
}

// Import makes a chunk on NPU dev of a token
// (aclrtMemImportFromShareableHandle); AscendCL cannot say how large the
// memory is, so Import maps it once at a scratch range to prove it holds
// exactly s.Size bytes, or refuses with ErrInvalid. A process that is not
// on the token's allow-list is refused by AscendCL (ErrAccessDenied). A
// token this process exported is not imported — AscendCL refuses that —
// but becomes a chunk over the same memory, released when both chunks
// are.
func (d *Driver) Import(s driver.Shareable, dev driver.DeviceID) (driver.Handle, error) {
	if d.unmade() {
		return 0, errUnmade("Import")
	}
	return d.core.Import(s, dev)
}

// ReservationsBindOneDevice is true: AscendCL binds each reservation to
// the memory of one NPU, local or imported, never both at once (Huawei's
// reference for aclrtMapMem), so Map refuses the rest with
// ErrUnsupported. Reserve a range for each NPU, and one for imported
// chunks.
func (d *Driver) ReservationsBindOneDevice() bool { return true }

// Used reports the bytes committed on device dev by this driver.
func (d *Driver) Used(dev driver.DeviceID) uint64 {
	if d.unmade() {
		return 0
	}
	return d.core.Used(dev)
}

// ChunkInfo implements driver.Books: the device and size of the live
// chunk h in the driver's record.
func (d *Driver) ChunkInfo(h driver.Handle) (driver.DeviceID, uint64, error) {
	if d.unmade() {
		return 0, 0, errUnmade("ChunkInfo")
	}
	return d.core.ChunkInfo(h)
}

// MappingAt implements driver.Books: the handle and size of the mapping
// that starts at addr in the driver's record.
func (d *Driver) MappingAt(addr driver.Addr) (driver.Handle, uint64, error) {
	if d.unmade() {
		return 0, 0, errUnmade("MappingAt")
	}
	return d.core.MappingAt(addr)
}

// Mapped implements driver.Books: the mappings of the driver's record
// that overlap [base, base+size).
func (d *Driver) Mapped(base driver.Addr, size uint64) (int, uint64, error) {
	if d.unmade() {
		return 0, 0, errUnmade("Mapped")
	}
	return d.core.Mapped(base, size)
}

// ReservationAt implements driver.Books: the size of the reservation of
// the driver's record that starts at base.
func (d *Driver) ReservationAt(base driver.Addr) (uint64, error) {
	if d.unmade() {
		return 0, errUnmade("ReservationAt")
	}
	return d.core.ReservationAt(base)
}

// Check verifies the driver's record of reservations, chunks, mappings
// and access against its invariants and returns every violation found.
func (d *Driver) Check() error {
	if d.unmade() {
		return errUnmade("Check")
	}
	return d.core.Check()
}

// Close waits for the streams, destroys them, releases every chunk and
// reservation, destroys the contexts and resets the devices. While anything is mapped or a
// pinned host buffer is live it refuses with ErrBusy, naming them, and
// changes nothing. Every later call is ErrClosed.
func (d *Driver) Close() error {
	if d.unmade() {
		return errUnmade("Close")
	}
	return d.core.Close()
}

// tearDown closes d whatever is left mapped: for the conformance suite.
func (d *Driver) tearDown() error { return d.core.TearDown() }

// CreateStream makes a stream of NPU dev: an ordered queue whose work
// runs one operation at a time, each copy or fill on an AscendCL stream of
// its own (aclrtCreateStream) and waited for before the next.
func (d *Driver) CreateStream(dev driver.DeviceID) (driver.Stream, error) {
	if d.unmade() {
		return 0, errUnmade("CreateStream")
	}
	return d.core.CreateStream(dev)
}

// DestroyStream waits for the work enqueued on s, then destroys it and
// its AscendCL stream; the error is any failure of that work not yet
// reported. From a host function it would wait for, it is refused with
// ErrBusy.
func (d *Driver) DestroyStream(s driver.Stream) error {
	if d.unmade() {
		return errUnmade("DestroyStream")
	}
	return d.core.DestroyStream(s)
}

// CreateEvent makes an event of NPU dev, a point in a stream of it.
func (d *Driver) CreateEvent(dev driver.DeviceID) (driver.Event, error) {
	if d.unmade() {
		return 0, errUnmade("CreateEvent")
	}
	return d.core.CreateEvent(dev)
}

// DestroyEvent forgets event e; work already waiting on it still waits
// for the point it was recorded at.
func (d *Driver) DestroyEvent(e driver.Event) error {
	if d.unmade() {
		return errUnmade("DestroyEvent")
	}
	return d.core.DestroyEvent(e)
}

// RecordEvent marks the current end of stream s in e; the event and the
// stream must be of the same NPU (ErrInvalid).
func (d *Driver) RecordEvent(e driver.Event, s driver.Stream) error {
	if d.unmade() {
		return errUnmade("RecordEvent")
	}
	return d.core.RecordEvent(e, s)
}

// StreamWaitEvent makes the work enqueued on s from now on wait until e,
// as last recorded, completes.
func (d *Driver) StreamWaitEvent(s driver.Stream, e driver.Event) error {
	if d.unmade() {
		return errUnmade("StreamWaitEvent")
	}
	return d.core.StreamWaitEvent(s, e)
}

// SyncStream waits until the work enqueued on s so far has finished and
// returns its first failure not yet reported, naming the operation and
// the AscendCL error.
func (d *Driver) SyncStream(s driver.Stream) error {
	if d.unmade() {
		return errUnmade("SyncStream")
	}
	return d.core.SyncStream(s)
}

// QueryStream reports, without waiting, whether the work enqueued on s
// has finished, and then any failure not yet reported.
func (d *Driver) QueryStream(s driver.Stream) (bool, error) {
	if d.unmade() {
		return false, errUnmade("QueryStream")
	}
	return d.core.QueryStream(s)
}

// SyncEvent waits until e, as last recorded, has completed.
func (d *Driver) SyncEvent(e driver.Event) error {
	if d.unmade() {
		return errUnmade("SyncEvent")
	}
	return d.core.SyncEvent(e)
}

// QueryEvent reports, without waiting, whether e has completed.
func (d *Driver) QueryEvent(e driver.Event) (bool, error) {
	if d.unmade() {
		return false, errUnmade("QueryEvent")
	}
	return d.core.QueryEvent(e)
}

// ElapsedTime is the wall-clock time between the completions of two
// events, as the host saw them.
func (d *Driver) ElapsedTime(start, end driver.Event) (time.Duration, error) {
	if d.unmade() {
		return 0, errUnmade("ElapsedTime")
	}
	return d.core.ElapsedTime(start, end)
}

// LaunchHostFunc enqueues fn on s. It runs on a goroutine of the stream
// after the work before it (not through aclrtLaunchCallback, whose report
// thread a process must drive itself), and may call the driver (but not
// wait for itself). An error, a panic or a fault in it is its failure,
// reported under name.
func (d *Driver) LaunchHostFunc(s driver.Stream, name string, fn func() error) error {
	if d.unmade() {
		return errUnmade("LaunchHostFunc")
	}
	return d.core.LaunchHostFunc(s, name, fn)
}

// CopyHtoD enqueues on s a copy of src to dst (aclrtMemcpyAsync, host to
// device). Both addresses must be 64-byte aligned (ErrMisaligned at once;
// HostAlloc buffers are). When its turn comes, the stream's NPU needs
// read-write access over the destination, and peer access to another
// NPU's memory, or the copy fails with ErrAccessDenied without reaching
// AscendCL. src must be left alone until the stream has passed the copy.
func (d *Driver) CopyHtoD(dst driver.Addr, src []byte, s driver.Stream) error {
	if d.unmade() {
		return errUnmade("CopyHtoD")
	}
	return d.core.CopyHtoD(dst, src, s)
}

// CopyDtoH enqueues on s a copy of len(dst) bytes at src into dst
// (aclrtMemcpyAsync, device to host; 64-byte aligned); the stream's NPU
// needs read access over the source.
func (d *Driver) CopyDtoH(dst []byte, src driver.Addr, s driver.Stream) error {
	if d.unmade() {
		return errUnmade("CopyDtoH")
	}
	return d.core.CopyDtoH(dst, src, s)
}

// CopyDtoD enqueues on s a copy of n bytes from src to dst
// (aclrtMemcpyAsync, device to device; 64-byte aligned); the stream's NPU
// needs read access over the source, read-write over the destination, and
// peer access to other NPUs' memory.
func (d *Driver) CopyDtoD(dst, src driver.Addr, n uint64, s driver.Stream) error {
	if d.unmade() {
		return errUnmade("CopyDtoD")
	}
	return d.core.CopyDtoD(dst, src, n, s)
}

// Memset enqueues on s a fill of n bytes at dst with value
// (aclrtMemsetAsync; 64-byte aligned); the stream's NPU needs read-write
// access.
func (d *Driver) Memset(dst driver.Addr, value byte, n uint64, s driver.Stream) error {
	if d.unmade() {
		return errUnmade("Memset")
	}
	return d.core.Memset(dst, value, n, s)
}

// CanAccessPeer reports aclrtDeviceCanAccessPeer's answer for two
// different NPUs (false when the library lacks it).
func (d *Driver) CanAccessPeer(dev, peer driver.DeviceID) (bool, error) {
	if d.unmade() {
		return false, errUnmade("CanAccessPeer")
	}
	return d.core.CanAccessPeer(dev, peer)
}

// SyncDevice waits for all the work queued on NPU dev: first what this
// driver's streams had queued at the call, then everything on the device,
// every stream of every context, streams this library never made included,
// such as torch_npu's (aclrtSynchronizeDevice, called on this OS thread
// with the driver's context of dev current). It is sleep.DeviceSyncer's:
// Sleep calls it before it copies out or unmaps anything. A failure of a
// stream's work stays with that stream. A libascendcl lacking
// aclrtSynchronizeDevice answers ErrUnsupported, having waited for this
// driver's own streams; an unknown dev is ErrNoDevice.
func (d *Driver) SyncDevice(dev driver.DeviceID) error {
	if d.unmade() {
		return errUnmade("SyncDevice")
	}
	return d.core.SyncDevice(dev)
}

// EnablePeerAccess lets dev's streams reach peer's memory
// (aclrtDeviceEnablePeerAccess from dev); enabling it again is harmless. From a device to
// itself it is ErrInvalid, and where CanAccessPeer is false
// ErrUnsupported.
func (d *Driver) EnablePeerAccess(dev, peer driver.DeviceID) error {
	if d.unmade() {
		return errUnmade("EnablePeerAccess")
	}
	return d.core.EnablePeerAccess(dev, peer)
}

// HostAlloc returns size bytes of page-locked host memory
// (aclrtMallocHost), 64-byte aligned for async copies. Close refuses
// (ErrBusy) while any buffer is live.
func (d *Driver) HostAlloc(size uint64) ([]byte, error) {
	if d.unmade() {
		return nil, errUnmade("HostAlloc")
	}
	return d.core.HostAlloc(size)
}

// HostFree returns a buffer HostAlloc gave, whole (aclrtFreeHost); any
// other slice is ErrInvalid.
func (d *Driver) HostFree(b []byte) error {
	if d.unmade() {
		return errUnmade("HostFree")
	}
	return d.core.HostFree(b)
}

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
