package vmarena_test

import (
	"cmp"
	stderrors "errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/internal/leakcheck"
	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/tensor"
)

// small is a KV cache small enough for a 64 MiB device.
var small = kvcache.Config{Layers: 2, KVHeads: 1, HeadDim: 16, DType: tensor.Float32, MaxContext: 256, MaxSeqs: 2,
	MapAhead: -1}

// hint is err's hints, flattened.
func hint(err error) string { return strings.Join(vmarena.Hints(err), "\n--\n") }

// TestOpen: each of host and sim opens with its defaults and with devices
// and a capacity given; the allocator draws from Options.Device; Close
// twice is fine, and nothing is made after it.
func TestOpen(t *testing.T) {
	for _, o := range []vmarena.Options{
		{Capacity: 64 * vmarena.MiB},
		{Driver: "host", Devices: 2, Capacity: 64 * vmarena.MiB, Granularity: 64 * vmarena.KiB, Device: 1, Max: 32 * vmarena.MiB},
		{Driver: "sim"},
		{Driver: "sim", Devices: 3, Capacity: 8 * vmarena.GiB, Device: 2},
	} {
		m, err := vmarena.Open(o)
		require.NoError(t, err, "%+v", o)
		devs := m.Driver().Devices()
		require.Len(t, devs, max(o.Devices, 1))
		if o.Capacity != 0 {
			require.Equal(t, o.Capacity, devs[o.Device].Capacity)
		}
		require.Equal(t, o.Device, m.Device())
		al := m.Allocator()
		require.Equal(t, cmp.Or(o.Max, devs[o.Device].Capacity), al.Max())
		p, err := al.Alloc(vmarena.MiB, 0)
		require.NoError(t, err)
		require.NotZero(t, al.Stats().Committed)
		for _, d := range devs { // the allocator's memory is Options.Device's
			require.Equal(t, d.ID == o.Device, al.Access(d.ID) == driver.AccessReadWrite, "device %d", d.ID)
		}
		require.NoError(t, al.Free(p))
		a, err := m.NewArena(vmarena.GiB)
		require.NoError(t, err)
		require.NoError(t, a.Grow(vmarena.MiB))
		require.Equal(t, o.Device, a.Device())
		require.NoError(t, m.Close())
		require.NoError(t, m.Close(), "closing twice is fine")
		require.True(t, al.Closed())
		require.True(t, a.Closed())
		_, err = m.NewArena(vmarena.GiB)
		drivertest.RequireIs(t, err, driver.ErrClosed, "vmarena: make an arena: the Memory is closed")
	}
}

// TestCloseOrder: Close closes what the Memory made, latest first, and
// the layers under them only once all of them are closed. A refusal
// (a live view, a live allocation) leaves everything usable, names what
// refused with a hint, and a later Close carries on; something closed by
// hand counts as closed.
func TestCloseOrder(t *testing.T) {
	m, err := vmarena.Open(vmarena.Options{Driver: "sim", Capacity: 256 * vmarena.MiB})
	require.NoError(t, err)
	al := m.Allocator()
	p, err := al.Alloc(4*vmarena.MiB, 0)
	require.NoError(t, err)
	a, err := m.NewArena(64 * vmarena.MiB)
	require.NoError(t, err)
	require.NoError(t, a.Grow(4*vmarena.MiB))
	v, err := a.View(0, 4096)
	require.NoError(t, err)
	c, err := m.NewKVCache(small)
	require.NoError(t, err)
	a2, err := m.NewArena(64 * vmarena.MiB)
	require.NoError(t, err)
	require.NoError(t, a2.Close(), "closed by hand")

	err = m.Close()
	drivertest.RequireIs(t, err, driver.ErrBusy, "vmarena: close an arena: arena: close of a range: 1 view(s) still live",
		"vmarena: close the allocator: arena: close of an allocator: 1 allocation(s) still live, 4 MiB in all")
	require.True(t, stderrors.Is(err, driver.ErrBusy))
	require.Contains(t, hint(err), "call Close again")
	require.True(t, c.Closed(), "the KV cache, made last, was closed")
	require.False(t, a.Closed())
	require.False(t, al.Closed())
	// Everything under them is open: the allocator still allocates.
	q, err := al.Alloc(vmarena.MiB, 0)
	require.NoError(t, err)
	require.NoError(t, al.Free(q))
	require.NoError(t, a.Grow(vmarena.MiB))
	_, err = m.NewArena(vmarena.MiB)
	drivertest.RequireIs(t, err, driver.ErrClosed, "the Memory is closed")

	require.NoError(t, v.Release())
	err = m.Close()
	drivertest.RequireIs(t, err, driver.ErrBusy, "vmarena: close the allocator")
	require.NotContains(t, err.Error(), "arena: close of a range")
	require.Contains(t, hint(err), "free every allocation (release the tensors that hold theirs)")
	require.True(t, a.Closed())
	require.NoError(t, al.Free(p))
	require.NoError(t, m.Close())
	require.True(t, al.Closed())
	err = m.Driver().Close()
	drivertest.RequireIs(t, err, driver.ErrClosed) // the driver was closed last
	require.NoError(t, m.Close())
}

// TestOpenRefuses: bad options are refused with the field, the sentinel
// and a hint, and a refusal after the driver opened closes it again.
func TestOpenRefuses(t *testing.T) {
	for _, tc := range []struct {
		opts      vmarena.Options
		sentinel  error
		msg, hint string
	}{
		{vmarena.Options{Driver: "gpu"}, driver.ErrInvalid, `vmarena: open: unknown driver "gpu"`, "host (the default), sim, cuda or acl"},
		{vmarena.Options{Devices: -1}, driver.ErrInvalid, "vmarena: open: Devices -1", "0 (the default) to 32"},
		{vmarena.Options{Driver: "sim", Devices: 33}, driver.ErrInvalid, "vmarena: open: Devices 33", "0 (the default) to 32"},
		{vmarena.Options{Device: -1}, driver.ErrNoDevice, "vmarena: open: Device -1", "numbered from 0"},
		{vmarena.Options{Driver: "sim", Devices: 2, Device: 2}, driver.ErrNoDevice, "vmarena: open: Device 2, but the sim driver has 2 device(s)", "from 0 to 1, or open more with Options.Devices"},
		{vmarena.Options{Capacity: 64 * vmarena.MiB, Device: 1}, driver.ErrNoDevice, "the host driver has 1 device(s)", "from 0 to 0"},
		{vmarena.Options{Driver: "cuda", Granularity: vmarena.MiB}, driver.ErrInvalid, "vmarena: open: Granularity 1 MiB on the cuda driver", "devices' own"},
		{vmarena.Options{Library: "libcuda.so.1"}, driver.ErrInvalid, `vmarena: open: Library "libcuda.so.1" on the host driver`, "for cuda and acl"},
		{vmarena.Options{Driver: "sim", Capacity: 3 * vmarena.MiB}, driver.ErrInvalid, "vmarena: open the sim driver: sim: 1 devices of 3145728 bytes", ""},
		{vmarena.Options{Capacity: 1 << 50}, driver.ErrOutOfMemory, "vmarena: open the host driver", ""},
		{vmarena.Options{Driver: "cuda", Library: "/nonexistent/libcuda.so.1"}, driver.ErrUnsupported, "vmarena: open the cuda driver", ""},
		{vmarena.Options{Driver: "acl", Library: "/nonexistent/libascendcl.so"}, driver.ErrUnsupported, "vmarena: open the acl driver", ""},
	} {
		m, err := vmarena.Open(tc.opts)
		require.Nil(t, m, "%+v", tc.opts)
		drivertest.RequireIs(t, err, tc.sentinel, tc.msg)
		require.Contains(t, hint(err), tc.hint, "%+v: %v", tc.opts, err)
	}
}

// TestNoLeaks: opening, using and closing a Memory on the host driver
// leaves the process holding what it held (descriptors, mappings, shared
// memory), and so does an Open refused after the driver opened.
func TestNoLeaks(t *testing.T) {
	work := func() {
		m, err := vmarena.Open(vmarena.Options{Capacity: 64 * vmarena.MiB, Devices: 2, Device: 1})
		require.NoError(t, err)
		p, err := m.Allocator().Alloc(3*vmarena.MiB, 0)
		require.NoError(t, err)
		b, err := m.Allocator().Bytes(p)
		require.NoError(t, err)
		b[len(b)-1] = 1
		a, err := m.NewArena(vmarena.GiB)
		require.NoError(t, err)
		v, err := a.Append(5*vmarena.MiB, 0)
		require.NoError(t, err)
		c, err := m.NewKVCache(small)
		require.NoError(t, err)
		s, err := c.Admit([]int{1, 2, 3}, 0)
		require.NoError(t, err)
		_, err = s.Append([]int{1, 2, 3})
		require.NoError(t, err)
		require.Error(t, m.Close()) // the allocation and the view are live
		require.NoError(t, m.Allocator().Free(p))
		require.NoError(t, v.Release())
		require.NoError(t, m.Close())

		_, err = vmarena.Open(vmarena.Options{Capacity: 64 * vmarena.MiB, Device: 3})
		require.Error(t, err)
	}
	leakcheck.Require(t, 3, work)
}

// TestSizes: the units are package driver's binary ones, ParseSize reads
// fractions and SI units and refuses with ErrInvalid, FormatSize prints
// what ParseSize reads back.
func TestSizes(t *testing.T) {
	require.Equal(t, []uint64{1 << 10, 1 << 20, 1 << 30, 1 << 40}, []uint64{vmarena.KiB, vmarena.MiB, vmarena.GiB, vmarena.TiB})
	for s, want := range map[string]uint64{"1.5GiB": 3 * vmarena.GiB / 2, "64 MiB": 64 * vmarena.MiB, "4096": 4096, "80GB": 80e9, "2 TB": 2e12, "1.5 MB": 1.5e6} {
		n, err := vmarena.ParseSize(s)
		require.NoError(t, err, s)
		require.Equal(t, want, n, s)
		back, err := vmarena.ParseSize(vmarena.FormatSize(n))
		require.NoError(t, err)
		require.Equal(t, n, back)
	}
	n, err := vmarena.ParseSize("0.1KiB")
	drivertest.RequireIs(t, err, driver.ErrInvalid, `units: "0.1KiB" is not a whole number of bytes`)
	require.Zero(t, n)
	_, err = vmarena.ParseSize("lots")
	drivertest.RequireIs(t, err, driver.ErrInvalid, `units: "lots" is not a size`)
	require.Contains(t, hint(err), "1.5GiB")
}

// TestSentinels: the re-exported sentinels are package driver's own.
func TestSentinels(t *testing.T) {
	for _, p := range [][2]error{
		{vmarena.ErrInvalid, driver.ErrInvalid}, {vmarena.ErrMisaligned, driver.ErrMisaligned},
		{vmarena.ErrOutOfMemory, driver.ErrOutOfMemory}, {vmarena.ErrNoDevice, driver.ErrNoDevice},
		{vmarena.ErrNotReserved, driver.ErrNotReserved}, {vmarena.ErrOverlap, driver.ErrOverlap},
		{vmarena.ErrNotMapped, driver.ErrNotMapped}, {vmarena.ErrPartial, driver.ErrPartial},
		{vmarena.ErrBadHandle, driver.ErrBadHandle}, {vmarena.ErrBusy, driver.ErrBusy},
		{vmarena.ErrAccessDenied, driver.ErrAccessDenied}, {vmarena.ErrUnsupported, driver.ErrUnsupported},
		{vmarena.ErrClosed, driver.ErrClosed}, {vmarena.ErrNotAllocated, driver.ErrNotAllocated},
		{vmarena.ErrDeviceFault, driver.ErrDeviceFault},
	} {
		require.Same(t, p[1], p[0])
	}
}

// TestMakeRefuses: an arena or KV cache the layers refuse is not made,
// nothing is recorded for Close, and a nil or zero Memory refuses every
// call.
func TestMakeRefuses(t *testing.T) {
	m, err := vmarena.Open(vmarena.Options{Driver: "sim", Capacity: 64 * vmarena.MiB})
	require.NoError(t, err)
	_, err = m.NewArena(0)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "arena")
	bad := small
	bad.Layers = 0
	_, err = m.NewKVCache(bad)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "Layers")
	require.NoError(t, m.Close())

	for _, z := range []*vmarena.Memory{nil, new(vmarena.Memory)} {
		drivertest.RequireIs(t, z.Close(), driver.ErrInvalid, "vmarena: Memory.Close on a nil or zero value")
		_, err := z.NewArena(vmarena.MiB)
		drivertest.RequireIs(t, err, driver.ErrInvalid, "Memory.NewArena")
		require.Contains(t, hint(err), "vmarena.Open")
		require.Nil(t, z.Allocator())
		require.Nil(t, z.Driver())
	}
}
