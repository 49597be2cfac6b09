package cuda

import (
	"fmt"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/internal/accel"
)

// Driver is the CUDA driver. It implements driver.Driver, driver.Streams
// and driver.Sharing; its methods are safe for concurrent use. It does
// not implement driver.HostMapper: device memory is not host memory, and
// bytes move with Read, Write and the stream copies.
type Driver struct {
	// core checks every call against the contract, keeps the record of
	// what was made and runs the streams; the CUDA calls are made through
	// it.
	core *accel.Core
	rt   *cu // the runtime under core, for SyncStreamHandle
	wait WaitMode
}

var (
	_ driver.Driver  = (*Driver)(nil)
	_ driver.Books   = (*Driver)(nil)
	_ driver.Streams = (*Driver)(nil)
	_ driver.Sharing = (*Driver)(nil)
)

// unmade reports whether d is nil or a zero Driver, not one Open made:
// every method then answers ErrInvalid instead of dereferencing nothing.
func (d *Driver) unmade() bool { return d == nil || d.core == nil }

func errUnmade(op string) error {
	return errors.Wrapf(driver.ErrInvalid, "cuda: %s: the driver was not made by cuda.Open (nil or zero Driver)", op)
}

// Name is "cuda".
func (d *Driver) Name() string { return "cuda" }

// Devices lists the GPUs the driver uses, in the order of
// Options.Devices: their names, capacities (total memory, or
// Options.Capacity), and the minimum and recommended granularities
// cuMemGetAllocationGranularity reports. The slice is a copy.
func (d *Driver) Devices() []driver.Device {
	if d.unmade() {
		return nil
	}
	return d.core.Devices()
}

// Granularity is the unit of reservation sizes and addresses: the largest
// minimum granularity of the devices (2 MiB on current GPUs).
func (d *Driver) Granularity() uint64 {
	if d.unmade() {
		return 0
	}
	return d.core.Granularity()
}

// Supports reports the optional features the loaded libcuda provides:
// FeatureHostAccess (cuMemcpyHtoD_v2 and cuMemcpyDtoH_v2), FeatureShareable
// (POSIX descriptor export on every device used) and FeatureStreams
// (streams, async copies and fills, pinned host memory). A library lacking
// the symbols of one answers false for it and ErrUnsupported from its
// methods; the rest of the driver works.
func (d *Driver) Supports(f driver.Feature) bool {
	if d.unmade() {
		return false
	}
	return d.core.Supports(f)
}

// Wait is how the driver waits for the work it enqueues on CUDA streams:
// Options.Wait, with WaitAuto resolved.
func (d *Driver) Wait() WaitMode {
	if d.unmade() {
		return WaitAuto
	}
	return d.wait
}

// Reserve holds size bytes of the GPUs' virtual address space
// (cuMemAddressReserve), aligned to align (0 means Granularity()), at hint
// when CUDA can place it there. A size or hint that is not a multiple of
// the granularity is ErrMisaligned, a zero size or an align that is not a
// power of two ErrInvalid.
func (d *Driver) Reserve(size, align uint64, hint driver.Addr) (driver.Addr, error) {
	if d.unmade() {
		return 0, errUnmade("Reserve")
	}
	return d.core.Reserve(size, align, hint)
}

// Unreserve gives back a range Reserve returned, passed exactly as it was
// returned (cuMemAddressFree); any other range is ErrNotReserved, and
// while anything inside is mapped it refuses with ErrBusy.
func (d *Driver) Unreserve(base driver.Addr, size uint64) error {
	if d.unmade() {
		return errUnmade("Unreserve")
	}
	return d.core.Unreserve(base, size)
}

// Create commits size bytes on GPU dev (cuMemCreate, pinned device
// memory; exportable as a POSIX descriptor with opts.Shareable). size must
// be a multiple of the device's MinGranularity (ErrMisaligned); a chunk
// the device's capacity cannot hold is ErrOutOfMemory, as is
// CUDA_ERROR_OUT_OF_MEMORY when other processes hold the GPU's memory.
func (d *Driver) Create(dev driver.DeviceID, size uint64, opts driver.ChunkOptions) (driver.Handle, error) {
	if d.unmade() {
		return 0, errUnmade("Create")
	}
	return d.core.Create(dev, size, opts)
}

// Release gives up chunk h (cuMemRelease); its memory returns to the GPU
// once its last mapping is gone too. An unknown or released handle is
// ErrBadHandle.
func (d *Driver) Release(h driver.Handle) error {
	if d.unmade() {
		return errUnmade("Release")
	}
	return d.core.Release(h)
}

// Map maps the whole chunk h at addr (cuMemMap, offset 0), inaccessible to
// every GPU until SetAccess. addr must be a multiple of the chunk's device
// granularity (ErrMisaligned) inside one reservation (ErrNotReserved),
// covering no other mapping (ErrOverlap).
func (d *Driver) Map(addr driver.Addr, h driver.Handle) error {
	if d.unmade() {
		return errUnmade("Map")
	}
	return d.core.Map(addr, h)
}

// Unmap removes the mapping that starts at addr and is size bytes long
// (cuMemUnmap). Nothing mapped there is ErrNotMapped, a range that is not
// exactly one mapping ErrPartial.
func (d *Driver) Unmap(addr driver.Addr, size uint64) error {
	if d.unmade() {
		return errUnmade("Unmap")
	}
	return d.core.Unmap(addr, size)
}

// SetAccess sets what GPU dev may do over [addr, addr+size)
// (cuMemSetAccess, one call per stretch whose access for dev changes
// alike, across adjacent mappings, as PyTorch's expandable segments grant a
// run of chunks at once), which must be
// mapped throughout (ErrNotMapped) and granule-aligned (ErrMisaligned). If
// CUDA refuses part-way, the mappings already changed are set back.
func (d *Driver) SetAccess(addr driver.Addr, size uint64, dev driver.DeviceID, a driver.Access) error {
	if d.unmade() {
		return errUnmade("SetAccess")
	}
	return d.core.SetAccess(addr, size, dev, a)
}

// Access reports what GPU dev may do at addr, as last set.
func (d *Driver) Access(addr driver.Addr, dev driver.DeviceID) (driver.Access, error) {
	if d.unmade() {
		return 0, errUnmade("Access")
	}
	return d.core.Access(addr, dev)
}

// Read copies len(p) bytes at addr into p (cuMemcpyDtoH_v2), as a GPU
// that may read each part. A part no GPU may read, or
// reserved but not mapped, is ErrAccessDenied: CUDA is never asked to
// touch it.
func (d *Driver) Read(addr driver.Addr, p []byte) error {
	if d.unmade() {
		return errUnmade("Read")
	}
	return d.core.Read(addr, p)
}

// Write copies p to addr (cuMemcpyHtoD_v2), as a GPU that may write each
// part, or is ErrAccessDenied.
func (d *Driver) Write(addr driver.Addr, p []byte) error {
	if d.unmade() {
		return errUnmade("Write")
	}
	return d.core.Write(addr, p)
}

// Export returns chunk h, created shareable, as a POSIX file descriptor
// (cuMemExportToShareableHandle); the caller closes it. Once per chunk: a
// second export is ErrBusy, a chunk not created shareable ErrInvalid.
func (d *Driver) Export(h driver.Handle) (driver.Shareable, error) {
	if d.unmade() {
		return driver.Shareable{}, errUnmade("Export")
	}
	return d.core.Export(h)
}

// Import makes a chunk on GPU dev of a descriptor another process
// exported (cuMemImportFromShareableHandle); the caller keeps its
// descriptor. CUDA cannot say how large the memory is, so Import maps it
// once at a scratch range to prove it holds exactly s.Size bytes; anything
// else (another size, a descriptor that is no CUDA memory) is ErrInvalid.
// The memory stays on the GPU that created it; dev is the device it is
// counted against.
func (d *Driver) Import(s driver.Shareable, dev driver.DeviceID) (driver.Handle, error) {
	if d.unmade() {
		return 0, errUnmade("Import")
	}
	return d.core.Import(s, dev)
}

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
// reservation and the primary contexts. While anything is mapped or a
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

// CreateStream makes a stream of GPU dev: an ordered queue whose work
// runs one operation at a time, each copy or fill on a CUDA stream of its
// own (cuStreamCreate, non-blocking) and waited for before the next.
func (d *Driver) CreateStream(dev driver.DeviceID) (driver.Stream, error) {
	if d.unmade() {
		return 0, errUnmade("CreateStream")
	}
	return d.core.CreateStream(dev)
}

// DestroyStream waits for the work enqueued on s, then destroys it and
// its CUDA stream; the error is any failure of that work not yet
// reported. From a host function it would wait for, it is refused with
// ErrBusy.
func (d *Driver) DestroyStream(s driver.Stream) error {
	if d.unmade() {
		return errUnmade("DestroyStream")
	}
	return d.core.DestroyStream(s)
}

// CreateEvent makes an event of GPU dev, a point in a stream of it.
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
// stream must be of the same GPU (ErrInvalid).
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
// the CUDA error.
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
// after the work before it, not on a CUDA thread: unlike a function given
// to cuLaunchHostFunc it may call the driver (but not wait for itself).
// An error, a panic or a fault in it is its failure, reported under name.
func (d *Driver) LaunchHostFunc(s driver.Stream, name string, fn func() error) error {
	if d.unmade() {
		return errUnmade("LaunchHostFunc")
	}
	return d.core.LaunchHostFunc(s, name, fn)
}

// CopyHtoD enqueues on s a copy of src to dst (cuMemcpyHtoDAsync_v2). When
// its turn comes, the stream's GPU needs read-write access over the
// destination, and peer access to another GPU's memory, or the copy fails
// with ErrAccessDenied without reaching CUDA. src must be left alone until
// the stream has passed the copy.
func (d *Driver) CopyHtoD(dst driver.Addr, src []byte, s driver.Stream) error {
	if d.unmade() {
		return errUnmade("CopyHtoD")
	}
	return d.core.CopyHtoD(dst, src, s)
}

// CopyDtoH enqueues on s a copy of len(dst) bytes at src into dst
// (cuMemcpyDtoHAsync_v2); the stream's GPU needs read access over the
// source.
func (d *Driver) CopyDtoH(dst []byte, src driver.Addr, s driver.Stream) error {
	if d.unmade() {
		return errUnmade("CopyDtoH")
	}
	return d.core.CopyDtoH(dst, src, s)
}

// CopyDtoD enqueues on s a copy of n bytes from src to dst
// (cuMemcpyDtoDAsync_v2, which crosses GPUs over unified addressing); the
// stream's GPU needs read access over the source, read-write over the
// destination, and peer access to other GPUs' memory.
func (d *Driver) CopyDtoD(dst, src driver.Addr, n uint64, s driver.Stream) error {
	if d.unmade() {
		return errUnmade("CopyDtoD")
	}
	return d.core.CopyDtoD(dst, src, n, s)
}

// Memset enqueues on s a fill of n bytes at dst with value
// (cuMemsetD8Async); the stream's GPU needs read-write access.
func (d *Driver) Memset(dst driver.Addr, value byte, n uint64, s driver.Stream) error {
	if d.unmade() {
		return errUnmade("Memset")
	}
	return d.core.Memset(dst, value, n, s)
}

// CanAccessPeer reports cuDeviceCanAccessPeer's answer for two different
// GPUs (false when the library lacks it).
func (d *Driver) CanAccessPeer(dev, peer driver.DeviceID) (bool, error) {
	if d.unmade() {
		return false, errUnmade("CanAccessPeer")
	}
	return d.core.CanAccessPeer(dev, peer)
}

// SyncDevice waits for all the work queued on GPU dev: first what this
// driver's streams had queued at the call, then everything in dev's
// primary context on every stream, streams this library never made
// included, such as PyTorch's (cuCtxSynchronize, called on this OS thread
// with that context current). It is sleep.DeviceSyncer's: Sleep calls it
// before it copies out or unmaps anything. A failure of a stream's work
// stays with that stream; a sticky fault of the context is ErrDeviceFault.
// A libcuda lacking cuCtxSynchronize answers ErrUnsupported, having waited
// for this driver's own streams; an unknown dev is ErrNoDevice.
func (d *Driver) SyncDevice(dev driver.DeviceID) error {
	if d.unmade() {
		return errUnmade("SyncDevice")
	}
	return d.core.SyncDevice(dev)
}

// SyncStreamHandle waits for the work queued so far on stream, a CUDA
// stream this driver did not make: a CUstream, or the cudaStream_t PyTorch
// hands a pluggable allocator (the runtime's handle is the driver's). 0 is
// the default stream of GPU dev's primary context. It calls
// cuStreamQuery, then, if the stream is busy, cuStreamSynchronize, on the
// calling OS thread with dev's primary context current, leaving the
// caller's context as it was. It is what
// libvmarena's vmarena_free waits with before memory the stream's work
// may still use goes back (CUDA's cuMemUnmap and cuMemRelease do not wait
// for it, as cudaFree does). A failure of the stream's work is reported
// (and, as cuStreamSynchronize does, taken from the stream); an unknown
// dev is ErrNoDevice, a closed driver ErrClosed, a library without
// streams ErrUnsupported, each having waited for nothing.
func (d *Driver) SyncStreamHandle(dev driver.DeviceID, stream uintptr) error {
	if d.unmade() {
		return errUnmade("SyncStreamHandle")
	}
	what := fmt.Sprintf("cuda: synchronize stream %#x of device %d", stream, dev)
	if err := driver.CheckDevice(func() string { return what }, dev, len(d.rt.ordinal)); err != nil {
		return err
	}
	if d.core.Closed() {
		return errors.Wrapf(driver.ErrClosed, "%s", what)
	}
	if d.rt.l.cuStreamSynchronize == nil || d.rt.l.cuStreamQuery == nil {
		return errors.Wrapf(driver.ErrUnsupported, "%s: %s lacks cuStreamQuery or cuStreamSynchronize", what, d.rt.l.path)
	}
	// cuStreamQuery first: an idle stream (the usual case at a free) costs
	// no wait; a busy one (CUDA_ERROR_NOT_READY) is waited for.
	const notReady = 600
	busy := false
	err := d.rt.on(dev, "cuStreamQuery", func() cuResult {
		r := d.rt.l.cuStreamQuery(stream)
		if r == notReady {
			busy, r = true, 0
		}
		return r
	})
	if err == nil && busy {
		err = d.rt.on(dev, "cuStreamSynchronize", func() cuResult { return d.rt.l.cuStreamSynchronize(stream) })
	}
	return errors.Wrapf(err, "%s", what)
}

// EnablePeerAccess lets dev's streams reach peer's memory
// (cuCtxEnablePeerAccess); enabling it again is harmless. From a device to
// itself it is ErrInvalid, and where CanAccessPeer is false
// ErrUnsupported.
func (d *Driver) EnablePeerAccess(dev, peer driver.DeviceID) error {
	if d.unmade() {
		return errUnmade("EnablePeerAccess")
	}
	return d.core.EnablePeerAccess(dev, peer)
}

// HostAlloc returns size bytes of page-locked host memory pinned for
// every GPU (cuMemHostAlloc, portable), for async copies. Close refuses
// (ErrBusy) while any buffer is live.
func (d *Driver) HostAlloc(size uint64) ([]byte, error) {
	if d.unmade() {
		return nil, errUnmade("HostAlloc")
	}
	return d.core.HostAlloc(size)
}

// HostFree returns a buffer HostAlloc gave, whole (cuMemFreeHost); any
// other slice is ErrInvalid.
func (d *Driver) HostFree(b []byte) error {
	if d.unmade() {
		return errUnmade("HostFree")
	}
	return d.core.HostFree(b)
}
