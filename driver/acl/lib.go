package acl

import (
	"sync"
	"time"
	"unsafe"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/internal/dl"
)

// DefaultLibrary is the library Open loads when neither Options.Library
// nor the environment variable LibraryEnv names one: the AscendCL runtime,
// found on the loader's path (CANN's set_env.sh adds it).
const DefaultLibrary = "libascendcl.so"

// LibraryEnv is the environment variable that names the library to load
// when Options.Library is empty.
const LibraryEnv = "VMARENA_ACL_LIBRARY"

// lib is libascendcl as loaded once per process and path. A field is nil
// when the library lacks the symbol; the feature that needs it is then
// unsupported. Pointers the runtime hands out (aclrtDrvMemHandle,
// aclrtStream, aclrtEvent, aclrtContext) and device addresses are kept as
// uintptr: they point into the runtime's memory or the device's address
// space, never Go's, and the garbage collector must not see them as
// pointers. The copies' void* arguments are uintptr for the same reason;
// a Go buffer passed there is kept alive (and Go's heap does not move)
// until the runtime is done with it.
type lib struct {
	path string

	// Initialisation, devices, contexts.
	aclInit                func(configPath *byte) aclError
	aclrtGetDeviceCount    func(n *uint32) aclError
	aclrtSetDevice         func(dev int32) aclError
	aclrtResetDevice       func(dev int32) aclError
	aclrtCreateContext     func(ctx *uintptr, dev int32) aclError
	aclrtDestroyContext    func(ctx uintptr) aclError
	aclrtSetCurrentContext func(ctx uintptr) aclError
	aclrtGetCurrentContext func(ctx *uintptr) aclError
	aclrtGetMemInfo        func(attr int32, free, total *uint64) aclError

	// Virtual memory management.
	aclrtMemGetAllocationGranularity func(prop *physicalMemProp, option int32, g *uint64) aclError
	aclrtReserveMemAddress           func(ptr *uint64, size, align uint64, hint uintptr, flags uint64) aclError
	aclrtReleaseMemAddress           func(ptr uint64) aclError
	aclrtMallocPhysical              func(h *uintptr, size uint64, prop *physicalMemProp, flags uint64) aclError
	aclrtFreePhysical                func(h uintptr) aclError
	aclrtMapMem                      func(ptr, size, offset uint64, h uintptr, flags uint64) aclError
	aclrtUnmapMem                    func(ptr uint64) aclError
	aclrtMemSetAccess                func(ptr, size uint64, desc *memAccessDesc, count uint64) aclError

	// Mapping without access (newer CANN releases; without it a mapping
	// is made with aclrtMapMem, accessible to its device, and revoked).
	aclrtMemMapNoAccess func(ptr, size, offset uint64, h uintptr, flags uint64) aclError

	// Sharing between processes.
	aclrtMemExportToShareableHandle   func(h uintptr, typ int32, flags uint64, token *uint64) aclError
	aclrtMemSetPidToShareableHandle   func(token uint64, pids *int32, n uint64) aclError
	aclrtMemImportFromShareableHandle func(token uint64, dev int32, h *uintptr) aclError
	aclrtDeviceGetBareTgid            func(pid *int32) aclError

	// Synchronous copies (Read, Write).
	aclrtMemcpy func(dst uintptr, destMax uint64, src uintptr, count uint64, kind int32) aclError

	// Streams, async copies and fills, pinned host memory.
	aclrtCreateStream      func(s *uintptr) aclError
	aclrtDestroyStream     func(s uintptr) aclError
	aclrtSynchronizeStream func(s uintptr) aclError
	aclrtMemcpyAsync       func(dst uintptr, destMax uint64, src uintptr, count uint64, kind int32, s uintptr) aclError
	aclrtMemsetAsync       func(dst uintptr, maxCount uint64, value int32, count uint64, s uintptr) aclError
	aclrtMallocHost        func(p *unsafe.Pointer, size uint64) aclError
	aclrtFreeHost          func(p unsafe.Pointer) aclError

	// Waiting for a stream with an event.
	aclrtCreateEvent      func(e *uintptr) aclError
	aclrtRecordEvent      func(e, s uintptr) aclError
	aclrtSynchronizeEvent func(e uintptr) aclError
	aclrtDestroyEvent     func(e uintptr) aclError

	// Peers.
	aclrtDeviceCanAccessPeer    func(can *int32, dev, peer int32) aclError
	aclrtDeviceEnablePeerAccess func(peer int32, flags uint32) aclError

	// Names and messages.
	aclrtGetSocName    func() *byte
	aclGetRecentErrMsg func() *byte

	// Waiting for a whole device's work (SyncDevice).
	aclrtSynchronizeDevice func() aclError
}

// A group is a set of symbols one feature needs, all or none.
type group int

const (
	groupCore group = iota
	groupVMM
	groupShare
	groupSyncCopy
	groupStreams
	groupEvents
	groupPeer
	groupSocName
	groupErrMsg
	groupMapNoAccess
	groupDevSync
	groups
)

var groupTitles = [groups]string{"core", "virtual memory management", "sharing", "synchronous copies", "streams", "events", "peers", "SoC name", "error messages", "mapping without access", "device synchronization"}

func (l *lib) symbols() []dl.Symbol {
	s := func(name string, fn any, g group) dl.Symbol { return dl.Symbol{Name: name, Fn: fn, Group: int(g)} }
	return []dl.Symbol{
		s("aclInit", &l.aclInit, groupCore),
		s("aclrtGetDeviceCount", &l.aclrtGetDeviceCount, groupCore),
		s("aclrtSetDevice", &l.aclrtSetDevice, groupCore),
		s("aclrtResetDevice", &l.aclrtResetDevice, groupCore),
		s("aclrtCreateContext", &l.aclrtCreateContext, groupCore),
		s("aclrtDestroyContext", &l.aclrtDestroyContext, groupCore),
		s("aclrtSetCurrentContext", &l.aclrtSetCurrentContext, groupCore),
		s("aclrtGetCurrentContext", &l.aclrtGetCurrentContext, groupCore),
		s("aclrtGetMemInfo", &l.aclrtGetMemInfo, groupCore),

		s("aclrtMemGetAllocationGranularity", &l.aclrtMemGetAllocationGranularity, groupVMM),
		s("aclrtReserveMemAddress", &l.aclrtReserveMemAddress, groupVMM),
		s("aclrtReleaseMemAddress", &l.aclrtReleaseMemAddress, groupVMM),
		s("aclrtMallocPhysical", &l.aclrtMallocPhysical, groupVMM),
		s("aclrtFreePhysical", &l.aclrtFreePhysical, groupVMM),
		s("aclrtMapMem", &l.aclrtMapMem, groupVMM),
		s("aclrtUnmapMem", &l.aclrtUnmapMem, groupVMM),
		s("aclrtMemSetAccess", &l.aclrtMemSetAccess, groupVMM),

		s("aclrtMemExportToShareableHandle", &l.aclrtMemExportToShareableHandle, groupShare),
		s("aclrtMemSetPidToShareableHandle", &l.aclrtMemSetPidToShareableHandle, groupShare),
		s("aclrtMemImportFromShareableHandle", &l.aclrtMemImportFromShareableHandle, groupShare),
		s("aclrtDeviceGetBareTgid", &l.aclrtDeviceGetBareTgid, groupShare),

		s("aclrtMemcpy", &l.aclrtMemcpy, groupSyncCopy),

		s("aclrtCreateStream", &l.aclrtCreateStream, groupStreams),
		s("aclrtDestroyStream", &l.aclrtDestroyStream, groupStreams),
		s("aclrtSynchronizeStream", &l.aclrtSynchronizeStream, groupStreams),
		s("aclrtMemcpyAsync", &l.aclrtMemcpyAsync, groupStreams),
		s("aclrtMemsetAsync", &l.aclrtMemsetAsync, groupStreams),
		s("aclrtMallocHost", &l.aclrtMallocHost, groupStreams),
		s("aclrtFreeHost", &l.aclrtFreeHost, groupStreams),

		s("aclrtCreateEvent", &l.aclrtCreateEvent, groupEvents),
		s("aclrtRecordEvent", &l.aclrtRecordEvent, groupEvents),
		s("aclrtSynchronizeEvent", &l.aclrtSynchronizeEvent, groupEvents),
		s("aclrtDestroyEvent", &l.aclrtDestroyEvent, groupEvents),

		s("aclrtDeviceCanAccessPeer", &l.aclrtDeviceCanAccessPeer, groupPeer),
		s("aclrtDeviceEnablePeerAccess", &l.aclrtDeviceEnablePeerAccess, groupPeer),

		s("aclrtGetSocName", &l.aclrtGetSocName, groupSocName),
		s("aclGetRecentErrMsg", &l.aclGetRecentErrMsg, groupErrMsg),
		s("aclrtMemMapNoAccess", &l.aclrtMemMapNoAccess, groupMapNoAccess),
		s("aclrtSynchronizeDevice", &l.aclrtSynchronizeDevice, groupDevSync),
	}
}

// loaded is one library opened by path, once.
type loaded struct {
	l       *lib
	has     [groups]bool
	missing [groups][]string
	err     error
	// initErr is aclInit's answer, kept: the runtime is initialised once
	// per process and never finalised (aclFinalize ends it for good).
	initOnce sync.Once
	initErr  error
	// exports are the tokens this process exported from this library and
	// the handles behind them (guarded by exportsMu).
	exports map[uint64]*handle
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
		return &loaded{err: errors.Wrap(err, "acl: open")}
	}
	x, err := libs.Load(path, loadWait, func() (*loaded, error) {
		x := &loaded{exports: map[uint64]*handle{}}
		l := &lib{path: path}
		bound, err := dl.Open(path, l.symbols(), int(groups))
		if err != nil {
			x.err = errors.WithHint(
				errors.Wrapf(driver.ErrUnsupported, "acl: no Ascend runtime found: %v", err),
				"install CANN and source its set_env.sh (it puts libascendcl.so on the library path), or name the library with acl.Options.Library or "+LibraryEnv)
			return x, nil
		}
		copy(x.has[:], bound.Has)
		copy(x.missing[:], bound.Missing)
		x.l = l
		return x, nil
	})
	if err != nil {
		return &loaded{err: errors.Wrap(err, "acl: open")}
	}
	return x
}

// libraryPath is the library Open loads: Options.Library, else
// $VMARENA_ACL_LIBRARY, else DefaultLibrary.
func libraryPath(opt string) string { return dl.Pick(opt, LibraryEnv, DefaultLibrary) }

// recent is the runtime's message about the last error on this thread.
func (l *lib) recent() string {
	if l.aclGetRecentErrMsg == nil {
		return ""
	}
	p := l.aclGetRecentErrMsg()
	if p == nil {
		return ""
	}
	return dl.CString(p, 512)
}

// err is the error of call fn returning e, with the runtime's message
// about it; call it on the thread that made the call.
// keepCurrent notes the calling thread's current context and returns
// what sets it back: called before the caller's OS thread is unlocked,
// after calls that made another context current (aclrtSetDevice,
// aclrtCreateContext and aclrtSetCurrentContext all do). A thread with no
// context current (aclrtGetCurrentContext fails) is left with whatever
// the calls made current: AscendCL cannot unset a context.
func (l *lib) keepCurrent() func() {
	var prev uintptr
	if l.aclrtGetCurrentContext(&prev) != 0 || prev == 0 {
		return func() {}
	}
	return func() { _ = l.aclrtSetCurrentContext(prev) }
}

func (l *lib) err(fn string, e aclError) error {
	if e == 0 {
		return nil
	}
	return resultError(fn, e, l.recent())
}
