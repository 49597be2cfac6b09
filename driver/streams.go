package driver

import "time"

// Stream names an ordered queue of asynchronous work on one device; Event
// names a point in a stream. Zero is never a valid stream or event.
type (
	Stream uint64
	Event  uint64
)

// FeatureStreams: the driver implements Streams.
const FeatureStreams Feature = 3

// Streams is the asynchronous part of the contract, implemented by drivers
// with FeatureStreams. Work enqueued on a stream runs in the order it was
// enqueued; an event recorded on a stream completes when the work before it
// has; a stream made to wait on an event runs nothing enqueued after the
// wait until the event completes.
//
// Errors: a call that cannot be enqueued (a bad argument, a closed driver)
// fails at once and enqueues nothing. A failure of enqueued work surfaces
// at the next SyncStream (or QueryStream) of that stream, naming the
// operation; work enqueued after a failure is skipped until then, and the
// error is cleared once reported. A host function that panics fails its
// operation the same way, with ErrInvalid and the message "panic: <value>"
// (a host function reports failure by returning an error; one that panics
// is not a function a stream can run), as does one that calls
// runtime.Goexit (t.FailNow does), and one that faults touching device
// memory the host may not touch, with ErrAccessDenied as a copy's fault:
// the process lives on, and so does the stream — later work runs once the
// failure is reported, and events recorded after it complete.
//
// Calls from host functions: CUDA forbids every API call from a host
// function. Here a host function may call the driver, but never to wait
// for itself: a call from a host function (on the goroutine that runs it)
// that would wait for work ordered after that host function — SyncStream
// or DestroyStream of its own stream, SyncEvent of an event recorded
// behind it, or the same calls on any stream or event ordered after it
// through events or through another host function waiting for it — is
// refused at once with ErrBusy (the stream is busy running the caller,
// and no retry from there can succeed) and changes nothing. Of two host
// functions that would wait for each other, the second to ask is refused.
// A wait for work independent of the caller waits; queries (QueryStream,
// QueryEvent) never wait, and answer not done. Close from a host function
// closes the driver without waiting for the streams ordered after the
// caller, skips their work not yet run, and returns ErrBusy naming them.
//
//	Streams method     CUDA driver API                       AscendCL runtime
//	-----------------  ------------------------------------  ----------------------------------
//	CreateStream       cuStreamCreate                        aclrtCreateStream
//	DestroyStream      cuStreamDestroy_v2                    aclrtDestroyStream
//	CreateEvent        cuEventCreate                         aclrtCreateEvent
//	DestroyEvent       cuEventDestroy_v2                     aclrtDestroyEvent
//	RecordEvent        cuEventRecord                         aclrtRecordEvent
//	StreamWaitEvent    cuStreamWaitEvent                     aclrtStreamWaitEvent
//	SyncStream         cuStreamSynchronize                   aclrtSynchronizeStream
//	QueryStream        cuStreamQuery                         aclrtStreamQuery
//	SyncEvent          cuEventSynchronize                    aclrtSynchronizeEvent
//	QueryEvent         cuEventQuery                          aclrtQueryEventStatus
//	ElapsedTime        cuEventElapsedTime                    aclrtEventElapsedTime
//	LaunchHostFunc     cuLaunchHostFunc                      aclrtLaunchCallback
//	CopyHtoD           cuMemcpyHtoDAsync_v2                  aclrtMemcpyAsync(HOST_TO_DEVICE)
//	CopyDtoH           cuMemcpyDtoHAsync_v2                  aclrtMemcpyAsync(DEVICE_TO_HOST)
//	CopyDtoD           cuMemcpyDtoDAsync_v2 / cuMemcpyPeer   aclrtMemcpyAsync(DEVICE_TO_DEVICE)
//	Memset             cuMemsetD8Async                       aclrtMemsetAsync
//	CanAccessPeer      cuDeviceCanAccessPeer                 aclrtDeviceCanAccessPeer
//	EnablePeerAccess   cuCtxEnablePeerAccess                 aclrtDeviceEnablePeerAccess
//	HostAlloc          cuMemHostAlloc                        aclrtMallocHost
//	HostFree           cuMemFreeHost                         aclrtFreeHost
//
// Async copies need addresses aligned to the device's CopyAlign (64 on
// AscendCL; the error says so). A copy runs as its stream's device: that
// device needs read access to the source and read-write access to the
// destination, and memory of another device needs peer access enabled
// from the stream's device to it, as well as the access granted.
type Streams interface {
	CreateStream(dev DeviceID) (Stream, error)
	// DestroyStream waits for the stream's work, then destroys it; the
	// error is any failure not yet reported. From a host function it
	// would wait for, it is refused (ErrBusy, above).
	DestroyStream(s Stream) error
	CreateEvent(dev DeviceID) (Event, error)
	DestroyEvent(e Event) error
	// RecordEvent marks the current end of s in e (re-recording moves it).
	RecordEvent(e Event, s Stream) error
	// StreamWaitEvent makes work enqueued on s later wait for e as last
	// recorded; an event never recorded is already complete.
	StreamWaitEvent(s Stream, e Event) error
	SyncStream(s Stream) error
	QueryStream(s Stream) (done bool, err error)
	SyncEvent(e Event) error
	QueryEvent(e Event) (done bool, err error)
	// ElapsedTime is the time between two completed events.
	ElapsedTime(start, end Event) (time.Duration, error)
	// LaunchHostFunc enqueues fn, named name in errors.
	LaunchHostFunc(s Stream, name string, fn func() error) error

	// The copies are asynchronous: a Go slice passed to one must be left
	// alone until the stream has passed the copy.
	CopyHtoD(dst Addr, src []byte, s Stream) error
	CopyDtoH(dst []byte, src Addr, s Stream) error
	CopyDtoD(dst, src Addr, n uint64, s Stream) error
	Memset(dst Addr, value byte, n uint64, s Stream) error

	CanAccessPeer(dev, peer DeviceID) (bool, error)
	EnablePeerAccess(dev, peer DeviceID) error

	// HostAlloc returns pinned host memory with starts aligned for async
	// copies (at least 64 bytes); HostFree returns it, whole, once the work
	// enqueued on every stream before the call has finished (as
	// cuMemFreeHost synchronizes): a copy still queued on the buffer lands
	// before the memory goes, never in a buffer handed out after. From a
	// host function with work queued behind it, on its own stream or on
	// one ordered after it, HostFree cannot wait: it is refused (ErrBusy,
	// above) and the buffer stays live.
	HostAlloc(size uint64) ([]byte, error)
	HostFree(b []byte) error
}
