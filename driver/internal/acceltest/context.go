package acceltest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
)

// contextDriver is what CallsKeepContext calls: the contract with
// streams, the whole-device wait and the wait for a framework's stream.
type contextDriver interface {
	driver.Driver
	driver.Streams
	deviceSyncer
	streamHandleSyncer
}

// CallsKeepContext runs each kind of call the driver makes on the calling
// thread (the test holds it with runtime.LockOSThread) over chunks of g
// bytes on device 0 — reserve, create, map, grant, write, read, the two
// waits, a host buffer, unmap, release, unreserve — and checks after each
// that current(), the thread's current context, is still want: the
// caller's context, which the drivers leave as they found it.
func CallsKeepContext(t *testing.T, d contextDriver, g uint64, current func() uintptr, want uintptr) {
	t.Helper()
	after := func(what string) {
		t.Helper()
		require.Equal(t, want, current(), "the caller's context after %s", what)
	}
	base, err := d.Reserve(4*g, 0, 0)
	require.NoError(t, err)
	after("Reserve")
	h, err := d.Create(0, g, driver.ChunkOptions{})
	require.NoError(t, err)
	after("Create")
	require.NoError(t, d.Map(base, h))
	after("Map")
	require.NoError(t, d.SetAccess(base, g, 0, driver.AccessReadWrite))
	after("SetAccess")
	require.NoError(t, d.Write(base, []byte("caller")))
	after("Write")
	got := make([]byte, 6)
	require.NoError(t, d.Read(base, got))
	require.Equal(t, "caller", string(got))
	after("Read")
	require.NoError(t, d.SyncDevice(0))
	after("SyncDevice")
	require.NoError(t, d.SyncStreamHandle(0, 0))
	after("SyncStreamHandle")
	buf, err := d.HostAlloc(4096)
	require.NoError(t, err)
	require.NoError(t, d.HostFree(buf))
	after("HostAlloc and HostFree")
	require.NoError(t, d.Unmap(base, g))
	after("Unmap")
	require.NoError(t, d.Release(h))
	after("Release")
	require.NoError(t, d.Unreserve(base, 4*g))
	after("Unreserve")
}
