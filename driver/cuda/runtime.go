package cuda

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/internal/accel"
	"github.com/vmarena/vmarena/driver/internal/dl"
	"github.com/vmarena/vmarena/internal/units"
)

// cu is accel.Runtime over the CUDA driver API. Each call runs on the
// calling OS thread (the goroutine is locked to it for the call) with the
// primary context of the device it concerns current, and leaves the
// thread's current context as the caller had it (see on): CUDA keeps the
// current context per thread, and Go moves goroutines between threads.
type cu struct {
	l    *lib
	wait WaitMode
	// ordinal[i] is the CUDA device of driver device i; ctx[i] its
	// retained primary context.
	ordinal []int32
	ctx     []uintptr
	gran    []uint64 // each device's minimum granularity
}

var _ accel.Runtime = (*cu)(nil)

// on runs call fn (named for errors) on this OS thread with dev's primary
// context current, and leaves the thread's current context as it found
// it, when it found one:
//
//   - dev's primary context current already (PyTorch's and the CUDA
//     runtime's, so the usual case): it is used as it is, one
//     cuCtxGetCurrent more than the call itself;
//   - another context current (a caller's own, from cuCtxCreate, or
//     another device's primary context): the primary context replaces it
//     for the call (cuCtxSetCurrent replaces the top of the thread's
//     context stack) and the caller's is set back after, whatever the
//     call returned;
//   - none current (a thread that never used CUDA, such as a Go runtime
//     thread): the primary context stays current after, as the CUDA
//     runtime leaves it after its first call on a thread, so the next
//     call on the thread finds it (one call, not three).
//
// cuCtxGetCurrent and cuCtxSetCurrent, rather than cuCtxPushCurrent and
// cuCtxPopCurrent: the usual case costs one call instead of two, and the
// depth of the caller's context stack never changes. Setting back a
// context that was current a moment ago on this thread does not fail
// unless the caller destroyed it in between; if it does, the call's own
// result stands (what the call did is done) and dev's primary context
// stays current, as it did before this function restored anything.
func (c *cu) on(dev driver.DeviceID, fn string, call func() cuResult) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var prev uintptr
	if r := c.l.cuCtxGetCurrent(&prev); r != 0 {
		return c.l.err("cuCtxGetCurrent", r)
	}
	if prev == c.ctx[dev] {
		return c.l.err(fn, call())
	}
	if r := c.l.cuCtxSetCurrent(c.ctx[dev]); r != 0 {
		return c.l.err("cuCtxSetCurrent", r)
	}
	err := c.l.err(fn, call())
	if prev != 0 {
		_ = c.l.cuCtxSetCurrent(prev)
	}
	return err
}

// memory is a chunk's allocation handle.
type memory struct {
	h    uint64 // CUmemGenericAllocationHandle
	dev  driver.DeviceID
	size uint64
}

func (c *cu) Reserve(size, align uint64, hint driver.Addr) (driver.Addr, any, error) {
	var p uint64
	err := c.on(0, "cuMemAddressReserve", func() cuResult { return c.l.cuMemAddressReserve(&p, size, align, uint64(hint), 0) })
	if err != nil {
		return 0, nil, err
	}
	return driver.Addr(p), nil, nil
}

func (c *cu) Unreserve(base driver.Addr, size uint64, _ any) error {
	return c.on(0, "cuMemAddressFree", func() cuResult { return c.l.cuMemAddressFree(uint64(base), size) })
}

// prop is the allocation property of memory on dev.
func (c *cu) prop(dev driver.DeviceID, shareable bool) memAllocationProp {
	p := memAllocationProp{typ: allocationPinned, location: memLocation{typ: locationTypeDevice, id: c.ordinal[dev]}}
	if shareable {
		p.requestedHandleTypes = handleTypePOSIXFD
	}
	return p
}

func (c *cu) Create(dev driver.DeviceID, size uint64, shareable bool) (any, error) {
	prop := c.prop(dev, shareable)
	var h uint64
	if err := c.on(dev, "cuMemCreate", func() cuResult { return c.l.cuMemCreate(&h, size, &prop, 0) }); err != nil {
		return nil, err
	}
	return &memory{h: h, dev: dev, size: size}, nil
}

func (c *cu) Release(mem any) error {
	m := mem.(*memory)
	return c.on(m.dev, "cuMemRelease", func() cuResult { return c.l.cuMemRelease(m.h) })
}

func (c *cu) Map(addr driver.Addr, size uint64, mem any) error {
	m := mem.(*memory)
	return c.on(m.dev, "cuMemMap", func() cuResult { return c.l.cuMemMap(uint64(addr), size, 0, m.h, 0) })
}

func (c *cu) Unmap(addr driver.Addr, size uint64, mem any) error {
	m := mem.(*memory)
	return c.on(m.dev, "cuMemUnmap", func() cuResult { return c.l.cuMemUnmap(uint64(addr), size) })
}

func (c *cu) SetAccess(addr driver.Addr, size uint64, dev driver.DeviceID, a driver.Access) error {
	desc := memAccessDesc{location: memLocation{typ: locationTypeDevice, id: c.ordinal[dev]}, flags: int32(a)}
	return c.on(dev, "cuMemSetAccess", func() cuResult { return c.l.cuMemSetAccess(uint64(addr), size, &desc, 1) })
}

func (c *cu) Export(mem any, size uint64) (driver.Shareable, error) {
	m := mem.(*memory)
	var fd int32 = -1
	err := c.on(m.dev, "cuMemExportToShareableHandle", func() cuResult {
		return c.l.cuMemExportToShareableHandle(unsafe.Pointer(&fd), m.h, handleTypePOSIXFD, 0)
	})
	if err != nil {
		return driver.Shareable{}, err
	}
	return driver.Shareable{Type: driver.HandlePOSIXFD, FD: int(fd), Size: size}, nil
}

// Import imports the descriptor, then proves that it holds sh.Size bytes:
// CUDA cannot say how large an imported allocation is, so it maps the
// allocation at a scratch range for sh.Size bytes (which fails if it holds
// fewer) and for one granule more (which fails if it holds no more).
func (c *cu) Import(sh driver.Shareable, dev driver.DeviceID) (any, error) {
	if sh.Type != driver.HandlePOSIXFD {
		return nil, errors.Wrapf(driver.ErrInvalid, "handle type %d: the CUDA driver shares POSIX file descriptors (%d)", sh.Type, driver.HandlePOSIXFD)
	}
	if sh.FD < 0 {
		return nil, errors.Wrapf(driver.ErrInvalid, "descriptor %d", sh.FD)
	}
	var h uint64
	err := c.on(dev, "cuMemImportFromShareableHandle", func() cuResult {
		return c.l.cuMemImportFromShareableHandle(&h, uintptr(sh.FD), handleTypePOSIXFD)
	})
	if err != nil {
		return nil, err
	}
	m := &memory{h: h, dev: dev, size: sh.Size}
	if err := c.probeSize(m); err != nil {
		return nil, errors.CombineErrors(err, c.Release(m))
	}
	return m, nil
}

// probeSize returns ErrInvalid unless m's allocation holds exactly m.size
// bytes; it leaves nothing mapped or reserved.
func (c *cu) probeSize(m *memory) error {
	g := c.gran[m.dev]
	span := m.size + g
	var base uint64
	if err := c.on(0, "cuMemAddressReserve", func() cuResult { return c.l.cuMemAddressReserve(&base, span, g, 0, 0) }); err != nil {
		return err
	}
	defer func() { _ = c.Unreserve(driver.Addr(base), span, nil) }()
	fits := func(n uint64) bool {
		if c.on(m.dev, "cuMemMap", func() cuResult { return c.l.cuMemMap(base, n, 0, m.h, 0) }) != nil {
			return false
		}
		_ = c.on(m.dev, "cuMemUnmap", func() cuResult { return c.l.cuMemUnmap(base, n) })
		return true
	}
	if !fits(m.size) {
		return errors.Wrapf(driver.ErrInvalid, "the descriptor holds less than %s", units.Bytes(m.size))
	}
	if fits(span) {
		return errors.Wrapf(driver.ErrInvalid, "the descriptor holds more than %s", units.Bytes(m.size))
	}
	return nil
}

func (c *cu) ReadSync(dev driver.DeviceID, p []byte, src driver.Addr) error {
	defer runtime.KeepAlive(p)
	return c.on(dev, "cuMemcpyDtoH_v2", func() cuResult {
		return c.l.cuMemcpyDtoH(unsafe.Pointer(unsafe.SliceData(p)), uint64(src), uint64(len(p)))
	})
}

func (c *cu) WriteSync(dev driver.DeviceID, dst driver.Addr, p []byte) error {
	defer runtime.KeepAlive(p)
	return c.on(dev, "cuMemcpyHtoD_v2", func() cuResult {
		return c.l.cuMemcpyHtoD(uint64(dst), unsafe.Pointer(unsafe.SliceData(p)), uint64(len(p)))
	})
}

// cuStreamT is a CUDA stream and, when the driver waits with events, the
// event it records to wait.
type cuStreamT struct {
	h     uintptr
	dev   driver.DeviceID
	fence uintptr
}

func (c *cu) CreateStream(dev driver.DeviceID) (any, error) {
	s := &cuStreamT{dev: dev}
	if err := c.on(dev, "cuStreamCreate", func() cuResult { return c.l.cuStreamCreate(&s.h, streamNonBlocking) }); err != nil {
		return nil, err
	}
	if c.wait == WaitEvent {
		if err := c.on(dev, "cuEventCreate", func() cuResult { return c.l.cuEventCreate(&s.fence, eventDisableTiming) }); err != nil {
			return nil, errors.CombineErrors(err, c.on(dev, "cuStreamDestroy_v2", func() cuResult { return c.l.cuStreamDestroy(s.h) }))
		}
	}
	return s, nil
}

func (c *cu) DestroyStream(rs any) error {
	s := rs.(*cuStreamT)
	var err error
	if s.fence != 0 {
		err = c.on(s.dev, "cuEventDestroy_v2", func() cuResult { return c.l.cuEventDestroy(s.fence) })
	}
	return errors.CombineErrors(err, c.on(s.dev, "cuStreamDestroy_v2", func() cuResult { return c.l.cuStreamDestroy(s.h) }))
}

// The async copies take Go memory (src, dst): they are waited for (Wait)
// before the operation that enqueued them returns, and that operation
// holds the slice, so the memory stays put and alive while the device
// reads or writes it (Go's heap does not move objects).

func (c *cu) CopyHtoD(rs any, dst driver.Addr, src []byte) error {
	s := rs.(*cuStreamT)
	return c.on(s.dev, "cuMemcpyHtoDAsync_v2", func() cuResult {
		return c.l.cuMemcpyHtoDAsync(uint64(dst), unsafe.Pointer(unsafe.SliceData(src)), uint64(len(src)), s.h)
	})
}

func (c *cu) CopyDtoH(rs any, dst []byte, src driver.Addr) error {
	s := rs.(*cuStreamT)
	return c.on(s.dev, "cuMemcpyDtoHAsync_v2", func() cuResult {
		return c.l.cuMemcpyDtoHAsync(unsafe.Pointer(unsafe.SliceData(dst)), uint64(src), uint64(len(dst)), s.h)
	})
}

func (c *cu) CopyDtoD(rs any, dst, src driver.Addr, n uint64) error {
	s := rs.(*cuStreamT)
	return c.on(s.dev, "cuMemcpyDtoDAsync_v2", func() cuResult { return c.l.cuMemcpyDtoDAsync(uint64(dst), uint64(src), n, s.h) })
}

func (c *cu) Memset(rs any, dst driver.Addr, v byte, n uint64) error {
	s := rs.(*cuStreamT)
	return c.on(s.dev, "cuMemsetD8Async", func() cuResult { return c.l.cuMemsetD8Async(uint64(dst), v, n, s.h) })
}

// Wait returns once the work enqueued on the stream so far has run, by
// the means Options.Wait chose.
func (c *cu) Wait(rs any) error {
	s := rs.(*cuStreamT)
	switch c.wait {
	case WaitHostFunc:
		return c.waitHostFunc(s)
	case WaitEvent:
		err := c.on(s.dev, "cuEventRecord", func() cuResult { return c.l.cuEventRecord(s.fence, s.h) })
		if err == nil {
			err = c.on(s.dev, "cuEventSynchronize", func() cuResult { return c.l.cuEventSynchronize(s.fence) })
		}
		if err != nil {
			return err
		}
		return c.query(s) // a failure of the work itself, which the event does not carry
	}
	return c.on(s.dev, "cuStreamSynchronize", func() cuResult { return c.l.cuStreamSynchronize(s.h) })
}

// A host function launched behind the work says when it has run: the
// goroutine waits on a channel, and no OS thread blocks in the driver.
// One callback serves the whole process (purego callbacks are never
// freed); its user data is the key of the waiting channel.
var (
	hostFnOnce sync.Once
	hostFn     uintptr
	waiters    sync.Map // uintptr -> chan struct{}
	nextWaiter atomic.Uintptr
)

// hostFnPoll is how often a waiting goroutine asks the stream whether it
// failed: after a failure CUDA may never call the host function.
const hostFnPoll = 5 * time.Millisecond

func (c *cu) waitHostFunc(s *cuStreamT) error {
	hostFnOnce.Do(func() {
		hostFn = dl.NewCallback(func(key uintptr) {
			if ch, ok := waiters.LoadAndDelete(key); ok {
				close(ch.(chan struct{}))
			}
		})
	})
	key := nextWaiter.Add(1)
	done := make(chan struct{})
	waiters.Store(key, done)
	if err := c.on(s.dev, "cuLaunchHostFunc", func() cuResult { return c.l.cuLaunchHostFunc(s.h, hostFn, key) }); err != nil {
		waiters.Delete(key)
		return err
	}
	tick := time.NewTicker(hostFnPoll)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return c.query(s)
		case <-tick.C:
			if err := c.query(s); err != nil {
				waiters.Delete(key)
				return err
			}
		}
	}
}

// query returns the stream's failure, if any: CUDA_ERROR_NOT_READY (work
// still running) is not one.
func (c *cu) query(s *cuStreamT) error {
	const notReady = 600
	return c.on(s.dev, "cuStreamQuery", func() cuResult {
		if r := c.l.cuStreamQuery(s.h); r != notReady {
			return r
		}
		return 0
	})
}

// SyncDevice waits for all the work of dev's primary context, on every
// stream (cuCtxSynchronize), with that context current on this OS thread:
// the context PyTorch and the CUDA runtime use too.
func (c *cu) SyncDevice(dev driver.DeviceID) error {
	if c.l.cuCtxSynchronize == nil {
		return errors.WithHint(errors.Wrapf(driver.ErrUnsupported, "cuda: %s lacks cuCtxSynchronize", c.l.path),
			"only the work queued through this driver's streams was waited for")
	}
	return c.on(dev, "cuCtxSynchronize", func() cuResult { return c.l.cuCtxSynchronize() })
}

var _ accel.DeviceSyncer = (*cu)(nil)

// MemInfo is dev's free and total memory (cuMemGetInfo_v2, with dev's
// primary context current on this OS thread): every process's chunks
// counted, as the device sees them.
func (c *cu) MemInfo(dev driver.DeviceID) (free, total uint64, err error) {
	if c.l.cuMemGetInfo == nil {
		return 0, 0, errors.Wrapf(driver.ErrUnsupported, "cuda: %s lacks cuMemGetInfo_v2", c.l.path)
	}
	err = c.on(dev, "cuMemGetInfo_v2", func() cuResult { return c.l.cuMemGetInfo(&free, &total) })
	return free, total, err
}

var _ accel.MemInfoer = (*cu)(nil)

func (c *cu) EnablePeerAccess(dev, peer driver.DeviceID) error {
	const alreadyEnabled = 704
	return c.on(dev, "cuCtxEnablePeerAccess", func() cuResult {
		if r := c.l.cuCtxEnablePeerAccess(c.ctx[peer], 0); r != alreadyEnabled {
			return r
		}
		return 0
	})
}

// memHostAllocPortable (CU_MEMHOSTALLOC_PORTABLE): the buffer is pinned
// for every context, so streams of any device may copy to and from it.
const memHostAllocPortable = 1

func (c *cu) HostAlloc(size uint64) (unsafe.Pointer, error) {
	var p unsafe.Pointer
	if err := c.on(0, "cuMemHostAlloc", func() cuResult { return c.l.cuMemHostAlloc(&p, size, memHostAllocPortable) }); err != nil {
		return nil, err
	}
	if uintptr(p)%64 != 0 {
		_ = c.HostFree(p)
		return nil, errors.AssertionFailedf("cuMemHostAlloc returned %p, not 64-byte aligned", p)
	}
	return p, nil
}

func (c *cu) HostFree(p unsafe.Pointer) error {
	return c.on(0, "cuMemFreeHost", func() cuResult { return c.l.cuMemFreeHost(p) })
}

func (c *cu) Close() error {
	var errs error
	for i, ord := range c.ordinal {
		if c.ctx[i] != 0 {
			errs = errors.CombineErrors(errs, c.l.err(fmt.Sprintf("cuDevicePrimaryCtxRelease_v2(%d)", ord), c.l.cuDevicePrimaryCtxRelease(ord)))
			c.ctx[i] = 0
		}
	}
	return errs
}
