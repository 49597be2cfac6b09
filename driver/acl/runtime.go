package acl

import (
	"fmt"
	"runtime"
	"slices"
	"sync"
	"unsafe"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/internal/accel"
	"github.com/vmarena/vmarena/internal/units"
)

// ascend is accel.Runtime over AscendCL. Each call runs with the context
// of the device it concerns current on the calling OS thread (the
// goroutine is locked to it for the call): AscendCL keeps the current
// context per thread. It absorbs the ways AscendCL differs from the
// contract: reservations take no alignment and no hint, unmap and release
// take no size, export gives a 64-bit token with an allow-list, and a
// process cannot import its own token.
type ascend struct {
	x    *loaded // the library; its symbols are x.l
	wait WaitMode
	// ordinal[i] is the AscendCL device of driver device i; ctx[i] the
	// context made for it.
	ordinal []int32
	ctx     []uintptr
}

var (
	_ accel.Runtime    = (*ascend)(nil)
	_ accel.PIDAllower = (*ascend)(nil)
)

// on runs call fn (named for errors) with dev's context current on this
// OS thread, reads the runtime's message on the same thread, and leaves
// the thread's current context as it found it: dev's context, when
// current already, is used as it is; another (the caller's own, such as
// torch_npu's default context of the device) is replaced for the call and
// set back after, whatever the call returned; a thread with none keeps
// dev's context (AscendCL cannot unset one). If setting back fails (the
// caller destroyed its context meanwhile) the call's own result stands.
func (a *ascend) on(dev driver.DeviceID, fn string, call func() aclError) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var prev uintptr
	if a.x.l.aclrtGetCurrentContext(&prev) != 0 {
		prev = 0 // none current
	}
	if prev == a.ctx[dev] {
		return a.x.l.err(fn, call())
	}
	if e := a.x.l.aclrtSetCurrentContext(a.ctx[dev]); e != 0 {
		return a.x.l.err("aclrtSetCurrentContext", e)
	}
	err := a.x.l.err(fn, call())
	if prev != 0 {
		_ = a.x.l.aclrtSetCurrentContext(prev)
	}
	return err
}

// reservation is what AscendCL reserved: aclrtReserveMemAddress takes no
// alignment (it must be 0), so a range that needs one is reserved larger
// and the aligned part used; aclrtReleaseMemAddress takes the start of
// what was reserved.
type reservation struct{ start uint64 }

func (a *ascend) reserve(size uint64) (uint64, error) {
	var p uint64
	err := a.on(0, "aclrtReserveMemAddress", func() aclError { return a.x.l.aclrtReserveMemAddress(&p, size, 0, 0, 0) })
	return p, err
}

// Reserve ignores hint (AscendCL takes none; the contract lets a driver
// place the range elsewhere).
func (a *ascend) Reserve(size, align uint64, _ driver.Addr) (driver.Addr, any, error) {
	p, err := a.reserve(size)
	if err != nil {
		return 0, nil, err
	}
	if p%align == 0 {
		return driver.Addr(p), reservation{p}, nil
	}
	if err := a.release(p); err != nil {
		return 0, nil, err
	}
	if size+align < size {
		return 0, nil, errors.Wrapf(driver.ErrOutOfMemory, "no room for %s aligned to %s", units.Bytes(size), units.Bytes(align))
	}
	p, err = a.reserve(size + align)
	if err != nil {
		return 0, nil, err
	}
	return driver.Addr((p + align - 1) &^ (align - 1)), reservation{p}, nil
}

func (a *ascend) release(p uint64) error {
	return a.on(0, "aclrtReleaseMemAddress", func() aclError { return a.x.l.aclrtReleaseMemAddress(p) })
}

func (a *ascend) Unreserve(_ driver.Addr, _ uint64, backing any) error {
	return a.release(backing.(reservation).start)
}

// memory is a chunk's physical memory handle. handle is shared by the
// chunks of this process that hold the same memory: the one created or
// imported, and those made by importing a token this process exported
// (AscendCL refuses that import; the driver gives the chunk the same
// handle instead).
type memory struct {
	*handle
	dev driver.DeviceID
}

// handle is one aclrtDrvMemHandle of this process and how many chunks
// hold it; it is freed when the last lets go.
type handle struct {
	h     uintptr
	size  uint64
	refs  int    // guarded by exportsMu
	token uint64 // set once exported
}

// exportsMu guards every handle's refs and each library's exports.
var exportsMu sync.Mutex

func (a *ascend) prop(dev driver.DeviceID) physicalMemProp {
	return physicalMemProp{
		handleType: handleTypeNone, allocationType: allocationPinned, memAttr: memAttrHBMHuge,
		location: memLocation{id: uint32(a.ordinal[dev]), typ: locationTypeDevice},
	}
}

// Create makes physical memory; any AscendCL allocation can be exported,
// so shareable changes nothing here.
func (a *ascend) Create(dev driver.DeviceID, size uint64, _ bool) (any, error) {
	prop := a.prop(dev)
	var h uintptr
	if err := a.on(dev, "aclrtMallocPhysical", func() aclError { return a.x.l.aclrtMallocPhysical(&h, size, &prop, 0) }); err != nil {
		return nil, err
	}
	return &memory{handle: &handle{h: h, size: size, refs: 1}, dev: dev}, nil
}

// Release frees the handle once no chunk of this process holds it.
func (a *ascend) Release(mem any) error {
	m := mem.(*memory)
	exportsMu.Lock()
	m.refs--
	last := m.refs == 0
	if last && m.token != 0 {
		delete(a.x.exports, m.token)
	}
	exportsMu.Unlock()
	if !last {
		return nil
	}
	if err := a.on(m.dev, "aclrtFreePhysical", func() aclError { return a.x.l.aclrtFreePhysical(m.h) }); err != nil {
		exportsMu.Lock()
		m.refs++
		if m.token != 0 {
			a.x.exports[m.token] = m.handle
		}
		exportsMu.Unlock()
		return err
	}
	return nil
}

// Map maps the handle whole, inaccessible to every NPU, as the contract
// wants: with aclrtMemMapNoAccess where the library has it; otherwise
// aclrtMapMem, whose mapping is accessible to the handle's NPU at once,
// and aclrtMemSetAccess taking that back before anything else sees the
// mapping (the record is locked throughout) — if that fails, the mapping
// is undone.
func (a *ascend) Map(addr driver.Addr, size uint64, mem any) error {
	m := mem.(*memory)
	l := a.x.l
	if a.x.has[groupMapNoAccess] {
		return a.on(m.dev, "aclrtMemMapNoAccess", func() aclError { return l.aclrtMemMapNoAccess(uint64(addr), size, 0, m.h, 0) })
	}
	if err := a.on(m.dev, "aclrtMapMem", func() aclError { return l.aclrtMapMem(uint64(addr), size, 0, m.h, 0) }); err != nil {
		return err
	}
	if err := a.SetAccess(addr, size, m.dev, driver.AccessNone); err != nil {
		return errors.CombineErrors(errors.Wrap(err, "taking back the access aclrtMapMem gave"), a.Unmap(addr, size, m))
	}
	return nil
}

// Unmap takes the mapping's start: AscendCL unmaps the whole mapping there,
// which is what the contract asks.
func (a *ascend) Unmap(addr driver.Addr, _ uint64, mem any) error {
	m := mem.(*memory)
	return a.on(m.dev, "aclrtUnmapMem", func() aclError { return a.x.l.aclrtUnmapMem(uint64(addr)) })
}

// SetAccess sets dev's access over exactly one whole mapping
// (Info.MappingAccess): aclrtMemSetAccess takes aclrtMapMem's virPtr and
// size, never a piece of a mapping.
func (a *ascend) SetAccess(addr driver.Addr, size uint64, dev driver.DeviceID, acc driver.Access) error {
	desc := memAccessDesc{flags: int32(acc), location: memLocation{id: uint32(a.ordinal[dev]), typ: locationTypeDevice}}
	return a.on(dev, "aclrtMemSetAccess", func() aclError { return a.x.l.aclrtMemSetAccess(uint64(addr), size, &desc, 1) })
}

// Export makes the handle's token, importable by the processes its
// allow-list names (AllowPIDs).
func (a *ascend) Export(mem any, size uint64) (driver.Shareable, error) {
	m := mem.(*memory)
	var token uint64
	err := a.on(m.dev, "aclrtMemExportToShareableHandle", func() aclError {
		return a.x.l.aclrtMemExportToShareableHandle(m.h, handleTypeNone, exportPIDValidation, &token)
	})
	if err != nil {
		return driver.Shareable{}, err
	}
	exportsMu.Lock()
	m.token = token
	a.x.exports[token] = m.handle
	exportsMu.Unlock()
	return driver.Shareable{Type: driver.HandleToken, Token: token, Size: size}, nil
}

// AllowPIDs adds processes to the token's allow-list
// (aclrtMemSetPidToShareableHandle). The IDs are host process IDs as
// aclrtDeviceGetBareTgid reports them in the importer.
func (a *ascend) AllowPIDs(mem any, pids []int) error {
	m := mem.(*memory)
	if len(pids) == 0 {
		return nil
	}
	list := make([]int32, len(pids))
	for i, p := range pids {
		list[i] = int32(p)
	}
	defer runtime.KeepAlive(list)
	return a.on(m.dev, "aclrtMemSetPidToShareableHandle", func() aclError {
		return a.x.l.aclrtMemSetPidToShareableHandle(m.token, &list[0], uint64(len(list)))
	})
}

// hostPID is aclrtDeviceGetBareTgid's answer: this process's ID on the
// host, as AscendCL's allow-lists hold it.
func (a *ascend) hostPID() (int, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var pid int32
	if err := a.x.l.err("aclrtDeviceGetBareTgid", a.x.l.aclrtDeviceGetBareTgid(&pid)); err != nil {
		return 0, err
	}
	if pid <= 0 {
		return 0, errors.AssertionFailedf("aclrtDeviceGetBareTgid answered process ID %d", pid)
	}
	return int(pid), nil
}

// Import makes memory of a token. A token this process exported is not
// imported (AscendCL refuses: one handle per shareable handle per
// process): the chunk shares the exporter's handle. Otherwise the import
// is proven to hold sh.Size bytes by mapping it once at a scratch range:
// AscendCL maps a handle whole, so the map succeeds only at its size.
func (a *ascend) Import(sh driver.Shareable, dev driver.DeviceID) (any, error) {
	if sh.Type != driver.HandleToken {
		return nil, errors.Wrapf(driver.ErrInvalid, "handle type %d: the AscendCL driver shares 64-bit tokens (%d)", sh.Type, driver.HandleToken)
	}
	exportsMu.Lock()
	if own, ok := a.x.exports[sh.Token]; ok {
		defer exportsMu.Unlock()
		if own.size != sh.Size {
			return nil, errors.Wrapf(driver.ErrInvalid, "token %#x is memory of %s, not %s", sh.Token, units.Bytes(own.size), units.Bytes(sh.Size))
		}
		own.refs++
		return &memory{handle: own, dev: dev}, nil
	}
	exportsMu.Unlock()
	var h uintptr
	err := a.on(dev, "aclrtMemImportFromShareableHandle", func() aclError {
		return a.x.l.aclrtMemImportFromShareableHandle(sh.Token, a.ordinal[dev], &h)
	})
	if err != nil {
		return nil, err
	}
	m := &memory{handle: &handle{h: h, size: sh.Size, refs: 1}, dev: dev}
	if err := a.probeSize(m); err != nil {
		return nil, errors.CombineErrors(err, a.Release(m))
	}
	return m, nil
}

// probeSize returns ErrInvalid unless m maps whole at m.size bytes.
func (a *ascend) probeSize(m *memory) error {
	base, res, err := a.Reserve(m.size, 1<<21, 0)
	if err != nil {
		return err
	}
	defer func() { _ = a.Unreserve(base, m.size, res) }()
	if a.Map(base, m.size, m) != nil {
		return errors.Wrapf(driver.ErrInvalid, "the token's memory is not %s", units.Bytes(m.size))
	}
	return a.Unmap(base, m.size, m)
}

func (a *ascend) ReadSync(dev driver.DeviceID, p []byte, src driver.Addr) error {
	defer runtime.KeepAlive(p)
	n := uint64(len(p))
	return a.on(dev, "aclrtMemcpy", func() aclError {
		return a.x.l.aclrtMemcpy(hostPtr(p), n, uintptr(src), n, memcpyDeviceToHost)
	})
}

func (a *ascend) WriteSync(dev driver.DeviceID, dst driver.Addr, p []byte) error {
	defer runtime.KeepAlive(p)
	n := uint64(len(p))
	return a.on(dev, "aclrtMemcpy", func() aclError {
		return a.x.l.aclrtMemcpy(uintptr(dst), n, hostPtr(p), n, memcpyHostToDevice)
	})
}

// hostPtr is the address of Go buffer p for a void* argument; the caller
// keeps p alive until the runtime is done with it.
func hostPtr(p []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(p))) }

// aclStream is an AscendCL stream and, when the driver waits with events,
// the event it records to wait.
type aclStream struct {
	h     uintptr
	dev   driver.DeviceID
	fence uintptr
}

func (a *ascend) CreateStream(dev driver.DeviceID) (any, error) {
	s := &aclStream{dev: dev}
	if err := a.on(dev, "aclrtCreateStream", func() aclError { return a.x.l.aclrtCreateStream(&s.h) }); err != nil {
		return nil, err
	}
	if a.wait == WaitEvent {
		if err := a.on(dev, "aclrtCreateEvent", func() aclError { return a.x.l.aclrtCreateEvent(&s.fence) }); err != nil {
			return nil, errors.CombineErrors(err, a.on(dev, "aclrtDestroyStream", func() aclError { return a.x.l.aclrtDestroyStream(s.h) }))
		}
	}
	return s, nil
}

func (a *ascend) DestroyStream(rs any) error {
	s := rs.(*aclStream)
	var err error
	if s.fence != 0 {
		err = a.on(s.dev, "aclrtDestroyEvent", func() aclError { return a.x.l.aclrtDestroyEvent(s.fence) })
	}
	return errors.CombineErrors(err, a.on(s.dev, "aclrtDestroyStream", func() aclError { return a.x.l.aclrtDestroyStream(s.h) }))
}

// The async copies take Go memory; they are waited for (Wait) before the
// operation that enqueued them returns, and that operation holds the
// slice, so the memory stays put and alive while the device uses it.

func (a *ascend) CopyHtoD(rs any, dst driver.Addr, src []byte) error {
	s := rs.(*aclStream)
	n := uint64(len(src))
	defer runtime.KeepAlive(src)
	return a.on(s.dev, "aclrtMemcpyAsync", func() aclError {
		return a.x.l.aclrtMemcpyAsync(uintptr(dst), n, hostPtr(src), n, memcpyHostToDevice, s.h)
	})
}

func (a *ascend) CopyDtoH(rs any, dst []byte, src driver.Addr) error {
	s := rs.(*aclStream)
	n := uint64(len(dst))
	defer runtime.KeepAlive(dst)
	return a.on(s.dev, "aclrtMemcpyAsync", func() aclError {
		return a.x.l.aclrtMemcpyAsync(hostPtr(dst), n, uintptr(src), n, memcpyDeviceToHost, s.h)
	})
}

func (a *ascend) CopyDtoD(rs any, dst, src driver.Addr, n uint64) error {
	s := rs.(*aclStream)
	return a.on(s.dev, "aclrtMemcpyAsync", func() aclError {
		return a.x.l.aclrtMemcpyAsync(uintptr(dst), n, uintptr(src), n, memcpyDeviceToDevice, s.h)
	})
}

func (a *ascend) Memset(rs any, dst driver.Addr, v byte, n uint64) error {
	s := rs.(*aclStream)
	return a.on(s.dev, "aclrtMemsetAsync", func() aclError { return a.x.l.aclrtMemsetAsync(uintptr(dst), n, int32(v), n, s.h) })
}

// Wait returns once the work enqueued on the stream so far has run:
// through an event recorded behind it, or the whole stream. Either returns
// (and takes) the first failure of that work; each call is named for
// itself, so a failure of the work says aclrtSynchronizeEvent.
func (a *ascend) Wait(rs any) error {
	s := rs.(*aclStream)
	if a.wait == WaitEvent {
		if err := a.on(s.dev, "aclrtRecordEvent", func() aclError { return a.x.l.aclrtRecordEvent(s.fence, s.h) }); err != nil {
			return err
		}
		return a.on(s.dev, "aclrtSynchronizeEvent", func() aclError { return a.x.l.aclrtSynchronizeEvent(s.fence) })
	}
	return a.on(s.dev, "aclrtSynchronizeStream", func() aclError { return a.x.l.aclrtSynchronizeStream(s.h) })
}

// EnablePeerAccess lets dev reach peer's memory: AscendCL enables it from
// the current device (dev's context) to the device named.
// SyncDevice waits for all the work of dev, on every stream of every
// context (aclrtSynchronizeDevice), with the driver's context of dev
// current on this OS thread.
func (a *ascend) SyncDevice(dev driver.DeviceID) error {
	if a.x.l.aclrtSynchronizeDevice == nil {
		return errors.WithHint(errors.Wrapf(driver.ErrUnsupported, "acl: %s lacks aclrtSynchronizeDevice", a.x.l.path),
			"only the work queued through this driver's streams was waited for")
	}
	return a.on(dev, "aclrtSynchronizeDevice", func() aclError { return a.x.l.aclrtSynchronizeDevice() })
}

var _ accel.DeviceSyncer = (*ascend)(nil)

func (a *ascend) EnablePeerAccess(dev, peer driver.DeviceID) error {
	return a.on(dev, "aclrtDeviceEnablePeerAccess", func() aclError { return a.x.l.aclrtDeviceEnablePeerAccess(a.ordinal[peer], 0) })
}

func (a *ascend) HostAlloc(size uint64) (unsafe.Pointer, error) {
	var p unsafe.Pointer
	if err := a.on(0, "aclrtMallocHost", func() aclError { return a.x.l.aclrtMallocHost(&p, size) }); err != nil {
		return nil, err
	}
	if uintptr(p)%copyAlign != 0 {
		_ = a.HostFree(p)
		return nil, errors.AssertionFailedf("aclrtMallocHost returned %p, not %d-byte aligned", p, copyAlign)
	}
	return p, nil
}

func (a *ascend) HostFree(p unsafe.Pointer) error {
	return a.on(0, "aclrtFreeHost", func() aclError { return a.x.l.aclrtFreeHost(p) })
}

// Close destroys the contexts and lets the devices go, on one OS thread:
// each error's message (aclGetRecentErrMsg) is the calling thread's.
func (a *ascend) Close() error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var prev uintptr
	if a.x.l.aclrtGetCurrentContext(&prev) != 0 || slices.Contains(a.ctx, prev) {
		prev = 0 // none, or one of those destroyed here
	}
	defer func() {
		if prev != 0 {
			_ = a.x.l.aclrtSetCurrentContext(prev)
		}
	}()
	var errs error
	for i, ord := range a.ordinal {
		if a.ctx[i] != 0 {
			errs = errors.CombineErrors(errs, a.x.l.err("aclrtDestroyContext", a.x.l.aclrtDestroyContext(a.ctx[i])))
			errs = errors.CombineErrors(errs, a.x.l.err(fmt.Sprintf("aclrtResetDevice(%d)", ord), a.x.l.aclrtResetDevice(ord)))
			a.ctx[i] = 0
		}
	}
	return errs
}
