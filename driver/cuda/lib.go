package cuda

import (
	"time"
	"unsafe"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/internal/dl"
)

// DefaultLibrary is the library Open loads when neither Options.Library
// nor the environment variable LibraryEnv names one: the CUDA driver's
// soname, which the dynamic loader finds on its usual path.
const DefaultLibrary = "libcuda.so.1"

// LibraryEnv is the environment variable that names the library to load
// when Options.Library is empty (a path or a soname).
const LibraryEnv = "VMARENA_CUDA_LIBRARY"

// lib is libcuda as loaded once per process and path: its symbols, looked
// up when it was opened. A field is nil when the library lacks the symbol;
// the feature that needs it is then unsupported.
type lib struct {
	path string

	// Initialisation, devices, contexts: without them there is no driver.
	cuInit                    func(flags uint32) cuResult
	cuDriverGetVersion        func(v *int32) cuResult
	cuDeviceGetCount          func(n *int32) cuResult
	cuDeviceGet               func(dev *cuDevice, ordinal int32) cuResult
	cuDeviceGetName           func(name *byte, n int32, dev cuDevice) cuResult
	cuDeviceTotalMem          func(bytes *uint64, dev cuDevice) cuResult
	cuDeviceGetAttribute      func(v *int32, attr int32, dev cuDevice) cuResult
	cuDevicePrimaryCtxRetain  func(ctx *cuContext, dev cuDevice) cuResult
	cuDevicePrimaryCtxRelease func(dev cuDevice) cuResult
	cuCtxSetCurrent           func(ctx cuContext) cuResult
	cuCtxGetCurrent           func(ctx *cuContext) cuResult

	// Virtual memory management (CUDA 10.2 and later).
	cuMemGetAllocationGranularity func(g *uint64, prop *memAllocationProp, option int32) cuResult
	cuMemAddressReserve           func(ptr *cuDeviceptr, size, align uint64, addr cuDeviceptr, flags uint64) cuResult
	cuMemAddressFree              func(ptr cuDeviceptr, size uint64) cuResult
	cuMemCreate                   func(h *cuHandle, size uint64, prop *memAllocationProp, flags uint64) cuResult
	cuMemRelease                  func(h cuHandle) cuResult
	cuMemMap                      func(ptr cuDeviceptr, size, offset uint64, h cuHandle, flags uint64) cuResult
	cuMemUnmap                    func(ptr cuDeviceptr, size uint64) cuResult
	cuMemSetAccess                func(ptr cuDeviceptr, size uint64, desc *memAccessDesc, count uint64) cuResult

	// Sharing between processes.
	cuMemExportToShareableHandle   func(out unsafe.Pointer, h cuHandle, typ int32, flags uint64) cuResult
	cuMemImportFromShareableHandle func(h *cuHandle, osHandle uintptr, typ int32) cuResult

	// Synchronous copies (Read, Write).
	cuMemcpyHtoD func(dst cuDeviceptr, src unsafe.Pointer, n uint64) cuResult
	cuMemcpyDtoH func(dst unsafe.Pointer, src cuDeviceptr, n uint64) cuResult

	// Streams, async copies and fills, pinned host memory.
	cuStreamCreate      func(s *cuStream, flags uint32) cuResult
	cuStreamDestroy     func(s cuStream) cuResult
	cuStreamSynchronize func(s cuStream) cuResult
	cuStreamQuery       func(s cuStream) cuResult
	cuMemcpyHtoDAsync   func(dst cuDeviceptr, src unsafe.Pointer, n uint64, s cuStream) cuResult
	cuMemcpyDtoHAsync   func(dst unsafe.Pointer, src cuDeviceptr, n uint64, s cuStream) cuResult
	cuMemcpyDtoDAsync   func(dst, src cuDeviceptr, n uint64, s cuStream) cuResult
	cuMemsetD8Async     func(dst cuDeviceptr, v uint8, n uint64, s cuStream) cuResult
	cuMemHostAlloc      func(p *unsafe.Pointer, size uint64, flags uint32) cuResult
	cuMemFreeHost       func(p unsafe.Pointer) cuResult

	// Waiting for a stream: a host function, or an event.
	cuLaunchHostFunc   func(s cuStream, fn uintptr, userData uintptr) cuResult
	cuEventCreate      func(e *cuEvent, flags uint32) cuResult
	cuEventRecord      func(e cuEvent, s cuStream) cuResult
	cuEventSynchronize func(e cuEvent) cuResult
	cuEventDestroy     func(e cuEvent) cuResult

	// Peers.
	cuDeviceCanAccessPeer func(can *int32, dev, peer cuDevice) cuResult
	cuCtxEnablePeerAccess func(peer cuContext, flags uint32) cuResult

	// Names of codes this package's table lacks.
	cuGetErrorName func(r cuResult, name **byte) cuResult

	// Waiting for a whole context's work (SyncDevice).
	cuCtxSynchronize func() cuResult

	// A device's free and total memory (MemInfo).
	cuMemGetInfo func(free, total *uint64) cuResult
}

// A group is a set of symbols that one feature needs, all or none.
type group int

const (
	groupCore group = iota
	groupVMM
	groupShare
	groupSyncCopy
	groupStreams
	groupHostFunc
	groupEvents
	groupPeer
	groupErrorNames
	groupDevSync
	groupMemInfo
	groups
)

var groupTitles = [groups]string{"core", "virtual memory management", "sharing", "synchronous copies", "streams", "host functions", "events", "peers", "error names", "device synchronization", "memory information"}

// symbols lists every symbol lib binds, with its group. Names with a _v2
// suffix are how libcuda exports the calls whose signatures changed in
// CUDA 3.2 (size_t sizes); the VMM calls came later and have none.
func (l *lib) symbols() []dl.Symbol {
	return []dl.Symbol{
		{Name: "cuInit", Fn: &l.cuInit, Group: int(groupCore)},
		{Name: "cuDriverGetVersion", Fn: &l.cuDriverGetVersion, Group: int(groupCore)},
		{Name: "cuDeviceGetCount", Fn: &l.cuDeviceGetCount, Group: int(groupCore)},
		{Name: "cuDeviceGet", Fn: &l.cuDeviceGet, Group: int(groupCore)},
		{Name: "cuDeviceGetName", Fn: &l.cuDeviceGetName, Group: int(groupCore)},
		{Name: "cuDeviceTotalMem_v2", Fn: &l.cuDeviceTotalMem, Group: int(groupCore)},
		{Name: "cuDeviceGetAttribute", Fn: &l.cuDeviceGetAttribute, Group: int(groupCore)},
		{Name: "cuDevicePrimaryCtxRetain", Fn: &l.cuDevicePrimaryCtxRetain, Group: int(groupCore)},
		{Name: "cuDevicePrimaryCtxRelease_v2", Fn: &l.cuDevicePrimaryCtxRelease, Group: int(groupCore)},
		{Name: "cuCtxSetCurrent", Fn: &l.cuCtxSetCurrent, Group: int(groupCore)},
		{Name: "cuCtxGetCurrent", Fn: &l.cuCtxGetCurrent, Group: int(groupCore)},

		{Name: "cuMemGetAllocationGranularity", Fn: &l.cuMemGetAllocationGranularity, Group: int(groupVMM)},
		{Name: "cuMemAddressReserve", Fn: &l.cuMemAddressReserve, Group: int(groupVMM)},
		{Name: "cuMemAddressFree", Fn: &l.cuMemAddressFree, Group: int(groupVMM)},
		{Name: "cuMemCreate", Fn: &l.cuMemCreate, Group: int(groupVMM)},
		{Name: "cuMemRelease", Fn: &l.cuMemRelease, Group: int(groupVMM)},
		{Name: "cuMemMap", Fn: &l.cuMemMap, Group: int(groupVMM)},
		{Name: "cuMemUnmap", Fn: &l.cuMemUnmap, Group: int(groupVMM)},
		{Name: "cuMemSetAccess", Fn: &l.cuMemSetAccess, Group: int(groupVMM)},

		{Name: "cuMemExportToShareableHandle", Fn: &l.cuMemExportToShareableHandle, Group: int(groupShare)},
		{Name: "cuMemImportFromShareableHandle", Fn: &l.cuMemImportFromShareableHandle, Group: int(groupShare)},

		{Name: "cuMemcpyHtoD_v2", Fn: &l.cuMemcpyHtoD, Group: int(groupSyncCopy)},
		{Name: "cuMemcpyDtoH_v2", Fn: &l.cuMemcpyDtoH, Group: int(groupSyncCopy)},

		{Name: "cuStreamCreate", Fn: &l.cuStreamCreate, Group: int(groupStreams)},
		{Name: "cuStreamDestroy_v2", Fn: &l.cuStreamDestroy, Group: int(groupStreams)},
		{Name: "cuStreamSynchronize", Fn: &l.cuStreamSynchronize, Group: int(groupStreams)},
		{Name: "cuStreamQuery", Fn: &l.cuStreamQuery, Group: int(groupStreams)},
		{Name: "cuMemcpyHtoDAsync_v2", Fn: &l.cuMemcpyHtoDAsync, Group: int(groupStreams)},
		{Name: "cuMemcpyDtoHAsync_v2", Fn: &l.cuMemcpyDtoHAsync, Group: int(groupStreams)},
		{Name: "cuMemcpyDtoDAsync_v2", Fn: &l.cuMemcpyDtoDAsync, Group: int(groupStreams)},
		{Name: "cuMemsetD8Async", Fn: &l.cuMemsetD8Async, Group: int(groupStreams)},
		{Name: "cuMemHostAlloc", Fn: &l.cuMemHostAlloc, Group: int(groupStreams)},
		{Name: "cuMemFreeHost", Fn: &l.cuMemFreeHost, Group: int(groupStreams)},

		{Name: "cuLaunchHostFunc", Fn: &l.cuLaunchHostFunc, Group: int(groupHostFunc)},

		{Name: "cuEventCreate", Fn: &l.cuEventCreate, Group: int(groupEvents)},
		{Name: "cuEventRecord", Fn: &l.cuEventRecord, Group: int(groupEvents)},
		{Name: "cuEventSynchronize", Fn: &l.cuEventSynchronize, Group: int(groupEvents)},
		{Name: "cuEventDestroy_v2", Fn: &l.cuEventDestroy, Group: int(groupEvents)},

		{Name: "cuDeviceCanAccessPeer", Fn: &l.cuDeviceCanAccessPeer, Group: int(groupPeer)},
		{Name: "cuCtxEnablePeerAccess", Fn: &l.cuCtxEnablePeerAccess, Group: int(groupPeer)},

		{Name: "cuGetErrorName", Fn: &l.cuGetErrorName, Group: int(groupErrorNames)},

		{Name: "cuCtxSynchronize", Fn: &l.cuCtxSynchronize, Group: int(groupDevSync)},

		{Name: "cuMemGetInfo_v2", Fn: &l.cuMemGetInfo, Group: int(groupMemInfo)},
	}
}

// loaded is one library opened by path: what load returned, once.
type loaded struct {
	l       *lib
	has     [groups]bool
	missing [groups][]string
	err     error
}

// libs are the libraries loaded, by path. No lock is held while one
// loads (dl.Once): a path whose load blocks holds up its own Opens for
// loadWait each, never those of other paths.
var libs dl.Once[*loaded]

// loadWait is how long an Open waits for the library to load before it
// gives up with ErrBusy (the load goes on, and a later Open gets it).
const loadWait = time.Minute

// load opens the library at path once per process and binds every group
// of symbols it has whole. A path that is no regular file is refused
// first (dl.CheckFile) and the refusal is not kept: the path may be
// fixed.
func load(path string) *loaded {
	if err := dl.CheckFile(path); err != nil {
		return &loaded{err: errors.Wrap(err, "cuda: open")}
	}
	x, err := libs.Load(path, loadWait, func() (*loaded, error) {
		x := &loaded{}
		l := &lib{path: path}
		bound, err := dl.Open(path, l.symbols(), int(groups))
		if err != nil {
			x.err = errors.WithHint(
				errors.Wrapf(driver.ErrUnsupported, "cuda: no NVIDIA driver found: %v", err),
				"install the NVIDIA driver (it provides libcuda.so.1), or name the library with cuda.Options.Library or "+LibraryEnv)
			return x, nil
		}
		copy(x.has[:], bound.Has)
		copy(x.missing[:], bound.Missing)
		x.l = l
		return x, nil
	})
	if err != nil {
		return &loaded{err: errors.Wrap(err, "cuda: open")}
	}
	return x
}

// libraryPath is the library Open loads: Options.Library, else
// $VMARENA_CUDA_LIBRARY, else DefaultLibrary.
func libraryPath(opt string) string { return dl.Pick(opt, LibraryEnv, DefaultLibrary) }

// errorName is the driver's own name for r (cuGetErrorName), or "".
func (l *lib) errorName(r cuResult) string {
	if l == nil || l.cuGetErrorName == nil {
		return ""
	}
	var p *byte
	if l.cuGetErrorName(r, &p) != 0 || p == nil {
		return ""
	}
	return dl.CString(p, 128)
}

// err is the error of call fn returning r.
func (l *lib) err(fn string, r cuResult) error { return resultError(fn, r, l.errorName) }
