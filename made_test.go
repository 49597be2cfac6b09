package vmarena_test

import (
	"context"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/leakcheck"
	"github.com/vmarena/vmarena/multidev"
	"github.com/vmarena/vmarena/pool"
	"github.com/vmarena/vmarena/sleep"
	"github.com/vmarena/vmarena/stream"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/transfer"
)

// TestMadeOnMemory: a sleep manager, a pool, a multi-device arena and
// transfer engines made on one Memory work on its memory, Usage reads
// every device's bytes from the driver's books, Close refuses while one
// of them holds live memory and closes all of them once it is freed, and
// the process's fds, mappings and goroutines are as before.
func TestMadeOnMemory(t *testing.T) {
	goroutines := runtime.NumGoroutine()
	before, after, same, err := leakcheck.Compare(3, func() { madeOnMemory(t) })
	require.NoError(t, err)
	require.True(t, same, "before %v, after %v", before, after)
	for runtime.NumGoroutine() > goroutines { // the engines' goroutines end after Close returns
		runtime.Gosched()
	}
}

func madeOnMemory(t *testing.T) {
	const mib = vmarena.MiB
	m, err := vmarena.Open(vmarena.Options{Devices: 2, Capacity: 64 * mib})
	require.NoError(t, err)
	used := func() []uint64 {
		u, err := m.Usage()
		require.NoError(t, err)
		require.Len(t, u, 2)
		var b []uint64
		for i, d := range u {
			require.Equal(t, vmarena.DeviceID(i), d.Device)
			require.Equal(t, 64*mib, d.Capacity)
			b = append(b, d.Used)
		}
		return b
	}
	require.Equal(t, []uint64{0, 0}, used())

	sm, err := m.NewSleep(sleep.Options{Device: 1})
	require.NoError(t, err)
	p, err := sm.Alloc("weights", 4*mib)
	require.NoError(t, err)
	tagged := used()
	require.Zero(t, tagged[0], "the tag's memory is device 1's")
	require.GreaterOrEqual(t, tagged[1], 4*mib)
	require.NoError(t, sm.Sleep(sleep.Host, "weights"))
	require.Equal(t, []uint64{0, 0}, used(), "asleep, the tag holds no device memory")
	require.NoError(t, sm.Wake("weights"))
	tagged = used()

	pl, err := m.NewPool(pool.Props{Device: 0})
	require.NoError(t, err)
	s, err := stream.New(m.Driver(), 0)
	require.NoError(t, err)
	q, err := pl.MallocAsync(mib, s)
	require.NoError(t, err)
	require.NoError(t, pl.FreeAsync(q, s))
	require.NoError(t, s.Synchronize())
	require.NoError(t, s.Destroy())

	ma, err := m.NewMultiDeviceArena(multidev.Options{Max: 64 * mib})
	require.NoError(t, err)
	require.NoError(t, ma.Grow(4*mib))
	u := used()
	require.NotZero(t, u[0])
	require.Greater(t, u[1], tagged[1], "striped: the arena's chunks lie on both devices")

	// Two engines on the same Memory: one registers an arena's tensor,
	// the other gets its bytes.
	a, err := m.NewArena(64 * mib)
	require.NoError(t, err)
	src, err := tensor.OnArena(a, tensor.Uint8, 4096)
	require.NoError(t, err)
	dst, err := tensor.OnArena(a, tensor.Uint8, 4096)
	require.NoError(t, err)
	require.NoError(t, src.Access(true, func(b []byte) error { copy(b, "keys and values"); return nil }))
	owner, err := m.NewTransfer(transfer.Config{})
	require.NoError(t, err)
	reader, err := m.NewTransfer(transfer.Config{})
	require.NoError(t, err)
	reg, err := owner.Register(src)
	require.NoError(t, err)
	desc, err := reg.Descriptor()
	require.NoError(t, err)
	mine, err := reader.Register(dst)
	require.NoError(t, err)
	ctx := context.Background()
	peer, err := reader.Connect(ctx, owner.Addr())
	require.NoError(t, err)
	require.NoError(t, peer.Get(ctx, transfer.Op{Local: mine, Remote: desc, Len: desc.Len}))
	require.NoError(t, dst.Access(false, func(b []byte) error {
		require.Equal(t, "keys and values", string(b[:15]))
		return nil
	}))

	// The sleep manager's allocation is live: Close closes the engines,
	// the arena (its tensors are released first) and the pool, then
	// refuses at the manager, leaving the allocator and the layers open.
	require.NoError(t, src.Release())
	require.NoError(t, dst.Release())
	err = m.Close()
	require.ErrorIs(t, err, driver.ErrBusy)
	require.ErrorContains(t, err, "sleep manager")
	require.ErrorIs(t, owner.Close(), driver.ErrClosed, "closed by the Memory")
	require.True(t, a.Closed())
	_, err = m.NewArena(mib)
	require.ErrorIs(t, err, driver.ErrClosed, "nothing is made after Close")
	require.Equal(t, tagged, used(), "the tag's memory alone is left")
	require.NoError(t, sm.Free(p))
	require.NoError(t, m.Close())
	_, err = m.Usage()
	require.ErrorIs(t, err, driver.ErrClosed)
}

// TestMadeOnZeroMemory: every maker on a nil or zero Memory is ErrInvalid.
func TestMadeOnZeroMemory(t *testing.T) {
	for _, m := range []*vmarena.Memory{nil, new(vmarena.Memory)} {
		_, err := m.NewSleep(sleep.Options{})
		require.ErrorIs(t, err, driver.ErrInvalid)
		_, err = m.NewPool(pool.Props{})
		require.ErrorIs(t, err, driver.ErrInvalid)
		_, err = m.NewMultiDeviceArena(multidev.Options{})
		require.ErrorIs(t, err, driver.ErrInvalid)
		_, err = m.NewTransfer(transfer.Config{})
		require.ErrorIs(t, err, driver.ErrInvalid)
		_, err = m.Usage()
		require.ErrorIs(t, err, driver.ErrInvalid)
	}
}
