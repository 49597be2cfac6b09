package cuda

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/internal/acceltest"
	"github.com/vmarena/vmarena/driver/internal/dl"
	"github.com/vmarena/vmarena/driver/internal/standin"
)

// contexts are the stand-in's context calls a caller of the driver makes
// itself: PyTorch, or a program with a context of its own.
type contexts struct {
	create  func(ctx *uintptr, flags uint32, dev int32) cuResult
	destroy func(ctx uintptr) cuResult
	get     func(ctx *uintptr) cuResult
	set     func(ctx uintptr) cuResult
}

func bindContexts(t *testing.T, lib *standin.Lib) *contexts {
	t.Helper()
	var c contexts
	bound, err := dl.Open(lib.Path(), []dl.Symbol{
		{Name: "cuCtxCreate_v2", Fn: &c.create},
		{Name: "cuCtxDestroy_v2", Fn: &c.destroy},
		{Name: "cuCtxGetCurrent", Fn: &c.get},
		{Name: "cuCtxSetCurrent", Fn: &c.set},
	}, 1)
	require.NoError(t, err)
	require.True(t, bound.Has[0], "the stand-in lacks %v", bound.Missing[0])
	return &c
}

func (c *contexts) current(t *testing.T) uintptr {
	t.Helper()
	var cur uintptr
	require.Zero(t, c.get(&cur))
	return cur
}

// TestCallerContextStaysCurrent: every call leaves the calling thread's
// current context as the caller had it. A context of the caller's own
// (cuCtxCreate) is current again after each call; the device's primary
// context, when current (PyTorch's case), is used as it is, with no
// cuCtxSetCurrent at all; a thread with none keeps the primary context
// after, as the CUDA runtime leaves it.
func TestCallerContextStaysCurrent(t *testing.T) {
	lib := standin.Open(t, standin.CUDA, small)
	d, err := Open(Options{Library: lib.Path(), Wait: WaitHostFunc})
	require.NoError(t, err)
	drivertest.CloseAtEnd(t, d)
	c := bindContexts(t, lib)

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var own uintptr
	require.Zero(t, c.create(&own, 0, 1))
	defer func() { require.Zero(t, c.destroy(own)) }()
	require.Equal(t, own, c.current(t))

	// every runs each kind of call the driver makes on the calling
	// thread, checking after each that want is current.
	every := func(want uintptr) {
		t.Helper()
		acceltest.CallsKeepContext(t, d, g, func() uintptr { return c.current(t) }, want)
	}
	every(own)

	// A failed call restores it too.
	lib.Fail("cuMemCreate", 1, 1, 2)
	_, err = d.Create(0, g, driver.ChunkOptions{})
	drivertest.RequireIs(t, err, driver.ErrOutOfMemory)
	require.Equal(t, own, c.current(t), "the caller's context after a failed Create")

	// Device 0's primary context current: used as it is.
	primary := d.rt.ctx[0]
	require.Zero(t, c.set(primary))
	sets := lib.Calls("cuCtxSetCurrent")
	every(primary)
	require.Equal(t, sets, lib.Calls("cuCtxSetCurrent"), "with the primary context current, no call sets one")

	// No context current: the primary context stays.
	require.Zero(t, c.set(0))
	require.NoError(t, d.Unreserve(mustReserve(t, d), 4*g))
	require.Equal(t, primary, c.current(t), "a thread that had none keeps the primary context")
	require.Zero(t, c.set(own))
}

func mustReserve(t *testing.T, d *Driver) driver.Addr {
	t.Helper()
	base, err := d.Reserve(4*g, 0, 0)
	require.NoError(t, err)
	return base
}

// TestSyncStreamHandle: a stream this driver never made (here the
// default stream of the primary context, where the stand-in holds work as
// a framework's kernels would) is waited for; bad arguments wait for
// nothing and say why.
func TestSyncStreamHandle(t *testing.T) {
	d := vendor.SyncStreamHandleWaits(t, small)
	drivertest.RequireIs(t, d.SyncStreamHandle(0, 0xdead0), driver.ErrBadHandle, "cuStreamQuery")
}
