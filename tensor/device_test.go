package tensor_test

import (
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/cuda"
	"github.com/vmarena/vmarena/driver/cuda/cudatest"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/stream"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/vaspace"
)

// simArena is an arena over the sim driver, whose memory the process
// cannot address, closed (and checked) at the end of the test.
func simArena(t testing.TB) (*sim.Driver, *arena.Arena) {
	t.Helper()
	drv, err := sim.New(sim.Options{Granularity: gran})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, drv.Close()) })
	a, err := arena.New(vaspace.New(drv), physical.New(drv), arena.Options{Max: 4 * gran, ChunkSize: gran})
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, a.Check())
		require.NoError(t, a.Close(), "every view released by the end of the test")
	})
	return drv, a
}

// TestDeviceTensorOnArena: on an arena the process cannot address,
// OnArena makes a device tensor: a device address and a length, no
// bytes. Views work; every accessor of bytes refuses it
// (ErrUnsupported) and changes nothing; AccessDevice hands out the
// address and length of the tensor's (or the view's) elements; Release
// gives the view back.
func TestDeviceTensorOnArena(t *testing.T) {
	drv, a := simArena(t)
	x, err := tensor.OnArena(a, tensor.Float32, 4, 8)
	require.NoError(t, err)
	require.NoError(t, x.Check())
	require.False(t, x.Addressable())
	require.True(t, x.Mapped())
	require.Equal(t, uint64(128), a.Len())
	require.Equal(t, 1, a.Stats().Views)
	before := layoutOf(x)

	_, err = x.At(0, 0)
	drivertest.RequireIs(t, err, driver.ErrUnsupported, "not addressable")
	drivertest.RequireIs(t, x.Set(1, 0, 0), driver.ErrUnsupported, "not addressable")
	_, err = tensor.Data[float32](x)
	drivertest.RequireIs(t, err, driver.ErrUnsupported, "not addressable")
	drivertest.RequireIs(t, x.Access(false, func([]byte) error { t.Error("fn called"); return nil }), driver.ErrUnsupported)
	h, err := tensor.New(newHeap(128), tensor.Float32, 4, 8)
	require.NoError(t, err)
	drivertest.RequireIs(t, tensor.Copy(h, x), driver.ErrUnsupported, "not addressable")
	drivertest.RequireIs(t, tensor.Copy(x, h), driver.ErrUnsupported, "not addressable")
	_, err = x.Contiguous(newHeap(128))
	drivertest.RequireIs(t, err, driver.ErrUnsupported)
	require.Equal(t, before, layoutOf(x), "refusals change nothing")

	var addr driver.Addr
	var n uint64
	require.NoError(t, x.AccessDevice(true, func(a driver.Addr, m uint64) error { addr, n = a, m; return nil }))
	require.Equal(t, x.Addr(), addr)
	require.Equal(t, uint64(128), n)
	row, err := x.Narrow(0, 2, 1)
	require.NoError(t, err)
	require.NoError(t, row.Check())
	require.NoError(t, row.AccessDevice(false, func(a driver.Addr, m uint64) error {
		require.Equal(t, addr+64, a)
		require.Equal(t, uint64(32), m)
		return nil
	}))
	col, err := x.Narrow(1, 0, 2)
	require.NoError(t, err)
	drivertest.RequireIs(t, col.AccessDevice(false, func(driver.Addr, uint64) error { t.Error("fn called"); return nil }), driver.ErrInvalid, "not contiguous")
	drivertest.RequireIs(t, x.AccessDevice(false, nil), driver.ErrInvalid, "fn is nil")

	require.NoError(t, x.Release())
	drivertest.RequireIs(t, row.AccessDevice(false, func(driver.Addr, uint64) error { t.Error("fn called"); return nil }), driver.ErrClosed)
	require.Zero(t, a.Stats().Views, "the view went back")
	require.NoError(t, drv.Check())
}

// TestDeviceTensorEmpty: an allocator the process cannot address gives
// device tensors too; Release frees the allocation.
func TestDeviceTensorEmpty(t *testing.T) {
	drv, err := sim.New(sim.Options{Granularity: gran})
	require.NoError(t, err)
	defer func() { require.NoError(t, drv.Close()) }()
	al, err := arena.NewAllocator(vaspace.New(drv), physical.New(drv), arena.AllocatorOptions{Max: 4 * gran, ChunkSize: gran})
	require.NoError(t, err)
	x, err := tensor.Empty(al, tensor.Int32, 100)
	require.NoError(t, err)
	require.NoError(t, x.Check())
	require.False(t, x.Addressable())
	require.NoError(t, x.AccessDevice(true, func(a driver.Addr, n uint64) error {
		require.Equal(t, x.Addr(), a)
		require.Equal(t, uint64(400), n)
		return nil
	}))
	drivertest.RequireIs(t, x.Set(1, 0), driver.ErrUnsupported)
	require.NoError(t, x.Release())
	require.NoError(t, al.Close(), "the allocation was freed")
}

// TestAccessDeviceLease: a leased device tensor (NewLeasedReadOnly over
// a view of device memory) follows Access's rules: the read-only prefix
// refuses a write (ErrAccessDenied) without calling fn, Revoke waits for
// an AccessDevice in flight, and after it AccessDevice is ErrClosed.
func TestAccessDeviceLease(t *testing.T) {
	_, a := simArena(t)
	require.NoError(t, a.Grow(gran))
	v, err := a.View(0, 256)
	require.NoError(t, err)
	defer func() { require.NoError(t, v.Release()) }()
	l := tensor.NewLease()
	x, err := tensor.NewLeasedReadOnly(l, v, 64, tensor.Uint8, 256)
	require.NoError(t, err)
	require.False(t, x.Addressable())
	drivertest.RequireIs(t, x.AccessDevice(true, func(driver.Addr, uint64) error { t.Error("fn called"); return nil }), driver.ErrAccessDenied, "read-only")
	tail, err := x.Narrow(0, 64, 192)
	require.NoError(t, err)
	require.NoError(t, tail.AccessDevice(true, func(addr driver.Addr, n uint64) error {
		require.Equal(t, v.Addr()+64, addr)
		require.Equal(t, uint64(192), n)
		return nil
	}))
	_, err = tensor.NewLeasedReadOnly(tensor.NewLease(), v, 257, tensor.Uint8, 256)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "257 read-only bytes")

	// Revoke, started inside fn, cannot return before fn does: fn sees
	// the lease stopped (Revoke's first step) and returns; the revoke's
	// goroutine then sees fn done.
	var wg sync.WaitGroup
	var fnDone bool
	var mu sync.Mutex
	require.NoError(t, x.AccessDevice(false, func(driver.Addr, uint64) error {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.Revoke()
			mu.Lock()
			defer mu.Unlock()
			require.True(t, fnDone, "Revoke returned while AccessDevice's fn ran")
		}()
		for !l.Revoked() {
			runtimeGosched()
		}
		mu.Lock()
		fnDone = true
		mu.Unlock()
		return nil
	}))
	wg.Wait()
	drivertest.RequireIs(t, x.AccessDevice(false, func(driver.Addr, uint64) error { t.Error("fn called"); return nil }), driver.ErrClosed)
}

// TestDeviceTensorCUDA: on the CUDA stand-in, a device tensor's bytes
// move with stream copies at the address AccessDevice gives: what is
// copied in reads back the same, and everything is given back at the
// end (the stand-in must hold nothing: cudatest.Open).
func TestDeviceTensorCUDA(t *testing.T) {
	drv, _ := cudatest.Open(t, cudatest.Small(), cuda.Options{})
	a, err := arena.New(vaspace.New(drv), physical.New(drv), arena.Options{Max: 4 * (64 << 10), ChunkSize: 64 << 10})
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Close()) }()
	x, err := tensor.OnArena(a, tensor.Uint8, 4096)
	require.NoError(t, err)
	require.False(t, x.Addressable())
	s, err := stream.New(drv, 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, s.Destroy()) }()
	hb, err := stream.NewHostBuffer(drv, 4096)
	require.NoError(t, err)
	defer func() { require.NoError(t, hb.Free()) }()
	b := hb.Bytes()[:4096]
	for i := range b {
		b[i] = byte(i * 7)
	}
	require.NoError(t, x.AccessDevice(true, func(addr driver.Addr, n uint64) error { return s.CopyHtoDSync(addr, b[:n]) }))
	clear(b)
	require.NoError(t, x.AccessDevice(false, func(addr driver.Addr, n uint64) error { return s.CopyDtoHSync(b[:n], addr) }))
	for i := range b {
		if b[i] != byte(i*7) {
			t.Fatalf("byte %d is %d, want %d", i, b[i], byte(i*7))
		}
	}
	require.NoError(t, x.Release())
}

func runtimeGosched() { runtime.Gosched() }
