// Package cuda is the driver for NVIDIA GPUs: the driver contract over the
// CUDA driver API's virtual memory management, with libcuda.so.1 loaded at
// run time (github.com/ebitengine/purego). Nothing of CUDA is needed to
// build it — no cgo, no toolkit, no header — and on a machine without the
// NVIDIA driver Open says so ("no NVIDIA driver found") and nothing else
// changes.
//
// It owns the binding: the symbols it looks up once when the library is
// opened (a group of them — sharing, streams, host functions, events,
// peers — missing makes that feature unsupported, not the driver
// unusable), the Go mirrors of the structs it passes (abi.go, their
// layout asserted against shared/CUDA_ABI.md), the table that marks every
// CUresult with the contract's sentinel and names it as cuda.h does
// ("cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY (2)"), and the primary context of
// each GPU, retained at Open, current on the calling OS thread for every
// call and released at Close. Every call runs on the calling thread and
// leaves the thread's current context as the caller had it: a primary
// context already current (PyTorch's) is used as it is; another context
// (a caller's own) is replaced for the call and set back after
// (cuCtxGetCurrent, cuCtxSetCurrent); a thread with none keeps the
// primary context after, as the CUDA runtime leaves it.
//
//	contract           CUDA driver API
//	-----------------  ------------------------------------------------------
//	Open, Devices      cuInit, cuDeviceGetCount, cuDeviceGet, cuDeviceGetName,
//	                   cuDeviceTotalMem_v2, cuDeviceGetAttribute (VMM, POSIX fd,
//	                   pools), cuMemGetAllocationGranularity (MINIMUM,
//	                   RECOMMENDED), cuDevicePrimaryCtxRetain; every call:
//	                   cuCtxGetCurrent, cuCtxSetCurrent
//	Reserve/Unreserve  cuMemAddressReserve(size, align, hint) / cuMemAddressFree
//	Create/Release     cuMemCreate(PINNED, DEVICE id, POSIX fd when shareable) /
//	                   cuMemRelease
//	Map/Unmap          cuMemMap(addr, size, 0, handle) / cuMemUnmap(addr, size)
//	SetAccess          cuMemSetAccess({DEVICE id, flags}, 1), once per run of
//	                   adjacent whole mappings whose access changes alike
//	Read/Write         cuMemcpyDtoH_v2 / cuMemcpyHtoD_v2, as a GPU with access
//	Export/Import      cuMemExportToShareableHandle / cuMemImportFromShareableHandle
//	                   (POSIX descriptors), the size proved by a scratch map
//	streams            cuStreamCreate (non-blocking), cuStreamDestroy_v2,
//	                   cuMemcpy{HtoD,DtoH,DtoD}Async_v2, cuMemsetD8Async, waited
//	                   for with cuLaunchHostFunc, cuEventRecord and
//	                   cuEventSynchronize, or cuStreamSynchronize; cuStreamQuery
//	peers              cuDeviceCanAccessPeer, cuCtxEnablePeerAccess
//	HostAlloc/HostFree cuMemHostAlloc (portable) / cuMemFreeHost
//	Close              cuStreamDestroy_v2, cuMemUnmap, cuMemRelease,
//	                   cuMemAddressFree, cuDevicePrimaryCtxRelease_v2
//
// On CUDA a device's hardware access is per whole mapping: cuMemSetAccess
// takes a run of adjacent mappings, never a piece of one (an H100 with
// CUDA 13.0 answered a range over part of a mapping with
// CUDA_ERROR_INVALID_VALUE; the reference asks for "a fully mapped address
// range containing all allocations created by cuMemMap / cuMemCreate"). A
// SetAccess over part of a mapping is kept per granule in the record, and
// Read, Write and every stream copy are checked against it; the GPU's page
// tables give the device its widest access anywhere in the mapping, so a
// kernel (which the driver never sees) is held to the mapping, not to the
// granule (see ledger.WholeMappingProtector).
//
// The contract's checks run before CUDA sees a call: an access the record
// does not grant, an unmap of part of a mapping or a map over a mapping
// never reaches the device, since CUDA answers some such mistakes with
// errors that make the whole context unusable (CUDA_ERROR_ILLEGAL_ADDRESS
// is sticky). Streams are the shared engine's, each over a CUDA stream of
// its own: the contract's ordering, failure reporting and host functions
// that may call the driver hold exactly as on the host driver, and a host
// function runs on a goroutine, never on a CUDA thread. SyncDevice
// (sleep.DeviceSyncer's) drains those streams, then calls cuCtxSynchronize
// with the device's primary context current on the calling OS thread —
// the context PyTorch's streams live in — so it waits for work on streams
// the driver never made; a libcuda without cuCtxSynchronize answers
// ErrUnsupported. SyncStreamHandle waits for one such stream
// (cuStreamQuery, then cuStreamSynchronize if it is busy): libvmarena's
// vmarena_free does before it frees.
//
// What is proven where: every test here runs against a C stand-in of
// libcuda.so.1 that the tests build (driver/internal/standin), through the
// same loading, calling convention, structs and codes.
// TestHardwareConformance and TestHardwareSmoke run wherever a GPU is, and
// docs/drivers.md (Running on a GPU or NPU machine) says how; an H100
// (CUDA 13.0) has run them, which is how the whole-mapping rule above was
// found.
//
// The driver never touches device memory from Go, never hands out a host
// slice over it (it is not a driver.HostMapper), and never unloads
// libcuda.
package cuda
