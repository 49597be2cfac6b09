package acl

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/internal/acceltest"
	"github.com/vmarena/vmarena/driver/internal/dl"
)

// TestCallerContextStaysCurrent: every call leaves the calling thread's
// current context as the caller had it — the device's default context
// (aclrtSetDevice: torch_npu's) or a context of the caller's own
// (aclrtCreateContext) — and so do Open and Close.
func TestCallerContextStaysCurrent(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	d, lib := openStandin(t, small, Options{})
	var c struct {
		setDevice, resetDevice func(dev int32) aclError
		create                 func(ctx *uintptr, dev int32) aclError
		destroy, set           func(ctx uintptr) aclError
		get                    func(ctx *uintptr) aclError
	}
	bound, err := dl.Open(lib.Path(), []dl.Symbol{
		{Name: "aclrtSetDevice", Fn: &c.setDevice},
		{Name: "aclrtResetDevice", Fn: &c.resetDevice},
		{Name: "aclrtCreateContext", Fn: &c.create},
		{Name: "aclrtDestroyContext", Fn: &c.destroy},
		{Name: "aclrtSetCurrentContext", Fn: &c.set},
		{Name: "aclrtGetCurrentContext", Fn: &c.get},
	}, 1)
	require.NoError(t, err)
	require.True(t, bound.Has[0], "the stand-in lacks %v", bound.Missing[0])
	current := func() uintptr {
		var cur uintptr
		require.Zero(t, c.get(&cur))
		return cur
	}

	every := func(want uintptr) {
		t.Helper()
		acceltest.CallsKeepContext(t, d, g, current, want)
		_, err := d.Create(0, 1<<40, driver.ChunkOptions{})
		require.Error(t, err)
		require.Equal(t, want, current(), "the caller's context after a failed Create")
	}

	// torch_npu's case: the device's default context.
	require.Zero(t, c.setDevice(1))
	defer func() { require.Zero(t, c.resetDevice(1)) }()
	dflt := current()
	every(dflt)

	// A context of the caller's own; and another driver opened and
	// closed on the thread.
	var own uintptr
	require.Zero(t, c.create(&own, 1))
	defer func() { require.Zero(t, c.destroy(own)) }()
	require.Zero(t, c.set(own))
	every(own)
	d2, err := Open(Options{Library: lib.Path()})
	require.NoError(t, err)
	require.Equal(t, own, current(), "the caller's context after Open")
	require.NoError(t, d2.Close())
	require.Equal(t, own, current(), "the caller's context after Close")
}
