package host

import (
	"bytes"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
)

// ascendLike is small() with the rules of AscendCL that Options can turn
// on: 64-byte aligned async copies and no peer access between devices.
func ascendLike() Options {
	o := small()
	o.CopyAlign, o.NoPeerAccess = 64, true
	return o
}

// TestConformanceAscendLike runs the conformance suite on a host driver
// that needs 64-byte aligned async copies and has no peer access, so the
// suite's alignment checks run and its peer checks take the refused path.
func TestConformanceAscendLike(t *testing.T) {
	drivertest.Run(t, func(t *testing.T) driver.Driver { return newTest(t, ascendLike()) })
}

// TestCopyAlign checks Options.CopyAlign: every device reports it, and an
// async copy or fill at an address or host buffer off a 64-byte boundary is
// refused at once with ErrMisaligned naming the alignment, enqueueing
// nothing; aligned starts with any length work.
func TestCopyAlign(t *testing.T) {
	_, err := New(Options{Devices: 1, Capacity: small().Capacity, Granularity: small().Granularity, CopyAlign: 48})
	drivertest.RequireIs(t, err, driver.ErrInvalid, "48")

	d := newTest(t, ascendLike())
	for _, dev := range d.Devices() {
		require.EqualValues(t, 64, dev.CopyAlign, "device %d", dev.ID)
	}
	g := d.Granularity()
	base, err := d.Reserve(g, 0, 0)
	require.NoError(t, err)
	h, err := d.Create(0, g, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, d.Map(base, h))
	require.NoError(t, d.SetAccess(base, g, 0, driver.AccessReadWrite))
	before := bytes.Repeat([]byte{0x5a}, 512)
	require.NoError(t, d.Write(base, before))
	st, err := d.CreateStream(0)
	require.NoError(t, err)
	buf, err := d.HostAlloc(256)
	require.NoError(t, err)
	for i := range buf {
		buf[i] = byte(i)
	}
	at := func(off uint64) driver.Addr { return base + driver.Addr(off) }
	for _, c := range []struct {
		name string
		call func() error
	}{
		{"CopyHtoD to an odd address", func() error { return d.CopyHtoD(at(1), buf[:64], st) }},
		{"CopyHtoD to a 32-byte boundary", func() error { return d.CopyHtoD(at(32), buf[:64], st) }},
		{"CopyHtoD from an odd host buffer", func() error { return d.CopyHtoD(at(0), buf[1:65], st) }},
		{"CopyDtoH from an odd address", func() error { return d.CopyDtoH(buf[:64], at(8), st) }},
		{"CopyDtoH to an odd host buffer", func() error { return d.CopyDtoH(buf[1:65], at(0), st) }},
		{"CopyDtoD from an odd address", func() error { return d.CopyDtoD(at(64), at(1), 64, st) }},
		{"CopyDtoD to an odd address", func() error { return d.CopyDtoD(at(1), at(64), 64, st) }},
		{"Memset at an odd address", func() error { return d.Memset(at(63), 0, 64, st) }},
	} {
		drivertest.RequireIs(t, c.call(), driver.ErrMisaligned, "64-byte aligned")
		done, err := d.QueryStream(st)
		require.NoError(t, err, c.name)
		require.True(t, done, "%s: a refused copy was enqueued", c.name)
	}
	require.NoError(t, d.SyncStream(st))
	got := make([]byte, len(before))
	require.NoError(t, d.Read(base, got))
	require.Equal(t, before, got, "refused copies changed device memory")
	for i := range buf {
		require.Equal(t, byte(i), buf[i], "refused copies changed the host buffer")
	}

	// Aligned starts need no aligned length.
	out, err := d.HostAlloc(256)
	require.NoError(t, err)
	require.NoError(t, d.CopyHtoD(at(64), buf[:100], st))
	require.NoError(t, d.CopyDtoD(at(192), at(64), 100, st))
	require.NoError(t, d.CopyDtoH(out[:100], at(192), st))
	require.NoError(t, d.SyncStream(st))
	require.Equal(t, buf[:100], out[:100])
	require.NoError(t, d.HostFree(out))
	require.NoError(t, d.HostFree(buf))
	require.NoError(t, d.DestroyStream(st))
}

// TestNoPeerAccess checks Options.NoPeerAccess: CanAccessPeer is false
// between different devices, EnablePeerAccess is ErrUnsupported, and a
// stream cannot reach another device's memory even where that memory
// grants its device access.
func TestNoPeerAccess(t *testing.T) {
	d := newTest(t, ascendLike())
	for _, p := range [][2]driver.DeviceID{{0, 1}, {1, 0}} {
		ok, err := d.CanAccessPeer(p[0], p[1])
		require.NoError(t, err)
		require.False(t, ok, "CanAccessPeer(%d, %d)", p[0], p[1])
		drivertest.RequireIs(t, d.EnablePeerAccess(p[0], p[1]), driver.ErrUnsupported, "CanAccessPeer is false")
	}
	drivertest.RequireIs(t, d.EnablePeerAccess(0, 0), driver.ErrInvalid)

	g := d.Granularity()
	base, err := d.Reserve(g, 0, 0)
	require.NoError(t, err)
	h, err := d.Create(1, g, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, d.Map(base, h))
	require.NoError(t, d.SetAccess(base, g, 0, driver.AccessReadWrite))
	require.NoError(t, d.SetAccess(base, g, 1, driver.AccessReadWrite))
	require.NoError(t, d.Write(base, []byte{1, 2, 3, 4}))
	st, err := d.CreateStream(0)
	require.NoError(t, err)
	src, err := d.HostAlloc(64)
	require.NoError(t, err)
	require.NoError(t, d.CopyHtoD(base, src, st))
	drivertest.RequireIs(t, d.SyncStream(st), driver.ErrAccessDenied, "peer access", "device 1")
	got := make([]byte, 4)
	require.NoError(t, d.Read(base, got))
	require.Equal(t, []byte{1, 2, 3, 4}, got)
	// A stream of the memory's own device reaches it.
	own, err := d.CreateStream(1)
	require.NoError(t, err)
	require.NoError(t, d.CopyHtoD(base, src, own))
	require.NoError(t, d.SyncStream(own))

	// Without the option, different devices can reach each other.
	ok, err := newTest(t, small()).CanAccessPeer(0, 1)
	require.NoError(t, err)
	require.True(t, ok)
}

// TestHostFreeWaitsForQueuedCopy: HostFree of a buffer a queued copy
// still writes waits for the work queued on every stream before it, as
// cuMemFreeHost does: the copy runs into the old buffer first, and the
// next HostAlloc, which may get the same address, is never written.
func TestHostFreeWaitsForQueuedCopy(t *testing.T) {
	d := newTest(t, small())
	g := d.Granularity()
	base, err := d.Reserve(g, 0, 0)
	require.NoError(t, err)
	h, err := d.Create(0, g, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, d.Map(base, h))
	require.NoError(t, d.SetAccess(base, g, 0, driver.AccessReadWrite))
	require.NoError(t, d.Write(base, bytes.Repeat([]byte{0xcd}, int(g))))
	st, err := d.CreateStream(0)
	require.NoError(t, err)
	const size = 8192
	for round := 0; round < 3; round++ {
		old, err := d.HostAlloc(size)
		require.NoError(t, err)
		gate := make(chan struct{})
		open := sync.OnceFunc(func() { close(gate) })
		require.NoError(t, d.LaunchHostFunc(st, "gate", func() error { <-gate; return nil }))
		require.NoError(t, d.CopyDtoH(old, base, st))
		var copied atomic.Bool
		require.NoError(t, d.LaunchHostFunc(st, "after the copy", func() error { copied.Store(true); return nil }))
		type result struct {
			err        error
			copiedThen bool
			next       []byte
		}
		freed := make(chan result, 1)
		go func() {
			r := result{err: d.HostFree(old), copiedThen: copied.Load()}
			var err error
			r.next, err = d.HostAlloc(size)
			r.err = errors.CombineErrors(r.err, err)
			freed <- r
		}()
		var r result
		select { // the pause only lets a Free that does not wait show
		case r = <-freed:
		case <-time.After(50 * time.Millisecond):
			open()
			r = <-freed
		}
		open()
		require.NoError(t, d.SyncStream(st))
		require.NoError(t, r.err)
		require.Equal(t, make([]byte, size), r.next, "round %d: the next buffer was written", round)
		require.True(t, r.copiedThen, "round %d: HostFree returned before the copy queued on the buffer ran", round)
		require.NoError(t, d.HostFree(r.next))
	}
	require.NoError(t, d.DestroyStream(st))
	require.NoError(t, d.Unmap(base, g))
	require.NoError(t, d.Release(h))
	require.NoError(t, d.Unreserve(base, g))
	require.NoError(t, d.Check())
}

// TestSyncDevice: SyncDevice returns only after the work queued on the
// driver's streams at the call has run; a device the driver lacks is
// ErrNoDevice (drivertest.SyncDeviceWaits).
func TestSyncDevice(t *testing.T) {
	d := newTest(t, small())
	drivertest.SyncDeviceWaits(t, d, -1, 2)
}
