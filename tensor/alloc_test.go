package tensor_test

import (
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/tensor"
)

func newAllocator(t *testing.T, max uint64) *arena.Allocator {
	s := newStack(t)
	al, err := arena.NewAllocator(s.space, s.mem, arena.AllocatorOptions{Max: max, ChunkSize: gran})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, al.Close()) })
	return al
}

func TestEmpty(t *testing.T) {
	al := newAllocator(t, 8*gran)
	x, err := tensor.Empty(al, tensor.Float16, 3, 5)
	require.NoError(t, err)
	require.Zero(t, uint64(x.Addr())%tensor.AllocAlign)
	require.NoError(t, x.Check())
	y, err := tensor.Empty(al, tensor.Uint8, 7)
	require.NoError(t, err)
	z, err := tensor.Empty(al, tensor.Int64, 2, 2)
	require.NoError(t, err)
	require.Zero(t, uint64(z.Addr())%tensor.AllocAlign)
	require.Equal(t, 3, al.Stats().Live)

	fill(t, x, func(k int) float64 { return float64(k) / 2 })
	fill(t, y, func(k int) float64 { return 200 + float64(k) })
	fill(t, z, func(k int) float64 { return -float64(k) })
	xt, err := x.Transpose(0, 1)
	require.NoError(t, err)
	v, err := xt.At(4, 2)
	require.NoError(t, err)
	require.Equal(t, 7.0, v)
	require.Equal(t, []float64{200, 201, 202, 203, 204, 205, 206}, values(t, y))

	// Release frees the allocation; views then refuse.
	require.NoError(t, x.Release())
	require.Equal(t, 2, al.Stats().Live)
	_, err = xt.At(0, 0)
	drivertest.RequireIs(t, err, driver.ErrClosed)
	drivertest.RequireIs(t, x.Release(), driver.ErrClosed)
	drivertest.RequireIs(t, xt.Release(), driver.ErrInvalid, "it is a view")
	drivertest.RequireIs(t, al.Free(x.Addr()), driver.ErrNotAllocated)
	require.Equal(t, []float64{0, -1, -2, -3}, values(t, z), "the others are untouched")

	// Refusals change nothing.
	before := al.Stats()
	for _, c := range []struct {
		name  string
		dt    tensor.DType
		shape []int
		want  error
		frag  string
	}{
		{"past max", tensor.Float32, []int{int(16 * gran)}, driver.ErrOutOfMemory, "tensor: empty float32 tensor of shape [1048576] from an allocator"},
		{"negative", tensor.Float32, []int{-2}, driver.ErrInvalid, "below zero"},
		{"dtype", tensor.DType(200), []int{2}, driver.ErrInvalid, "not a defined dtype"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := tensor.Empty(al, c.dt, c.shape...)
			drivertest.RequireIs(t, err, c.want, c.frag)
			require.Equal(t, before, al.Stats())
		})
	}
	_, err = tensor.Empty(nil, tensor.Float32, 1)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "the allocator is nil")

	e, err := tensor.Empty(al, tensor.Float32, 4, 0)
	require.NoError(t, err)
	require.Equal(t, before, al.Stats(), "an empty tensor allocates nothing")
	require.NoError(t, e.Release())

	require.NoError(t, y.Release())
	require.NoError(t, z.Release())
	require.Zero(t, al.Stats().Live)
	require.NoError(t, al.Check())
}

// TestEmptyKeepsItsBytesThroughChurn: a tensor over an allocation keeps
// every element while the allocator hands out, fills, frees and gives back
// memory all around it. (The old Allocator.Arena let a tensor be placed on
// the allocator's own range, where later Allocs overwrote rows of it; a
// tensor now reaches an allocator's memory only through an allocation.)
func TestEmptyKeepsItsBytesThroughChurn(t *testing.T) {
	al := newAllocator(t, 64*gran)
	x, err := tensor.Empty(al, tensor.Float32, 100, int(gran)/64) // more than a chunk
	require.NoError(t, err)
	defer func() { require.NoError(t, x.Release()) }()
	fill(t, x, func(k int) float64 { return float64(k % 1000) })
	rng := rand.New(rand.NewPCG(7, 7))
	var live []driver.Addr
	for i := range 400 {
		if len(live) > 0 && rng.IntN(2) == 0 {
			k := rng.IntN(len(live))
			require.NoError(t, al.Free(live[k]))
			live = append(live[:k], live[k+1:]...)
			if i%50 == 0 {
				require.NoError(t, al.Trim())
			}
			continue
		}
		p, err := al.Alloc(uint64(1+rng.IntN(int(2*gran))), 0)
		if err != nil {
			drivertest.RequireIs(t, err, driver.ErrOutOfMemory)
			continue
		}
		b, err := al.Bytes(p)
		require.NoError(t, err)
		for j := range b {
			b[j] = 0xEE
		}
		live = append(live, p)
	}
	for k, v := range values(t, x) {
		require.Equal(t, float64(k%1000), v, "element %d", k)
	}
	for _, p := range live {
		require.NoError(t, al.Free(p))
	}
	require.NoError(t, al.Check())
}

// TestReleaseWaitsForAccesses: Release of a tensor whose memory an
// Access is writing waits for the access to end before it frees the
// memory, so the next allocation, which may take the same address, is
// never written through the stale access.
func TestReleaseWaitsForAccesses(t *testing.T) {
	al := newAllocator(t, 8*gran)
	x, err := tensor.Empty(al, tensor.Uint8, 4*int(gran))
	require.NoError(t, err)
	started, goOn := make(chan struct{}), make(chan struct{})
	var finished atomic.Bool
	accessed := make(chan error, 1)
	go func() {
		accessed <- x.Access(true, func(b []byte) error {
			close(started)
			<-goOn
			b[100] = 0xab // the stale write, were the memory freed already
			finished.Store(true)
			return nil
		})
	}()
	<-started
	released := make(chan bool, 1)
	go func() {
		require.NoError(t, x.Release())
		released <- finished.Load()
	}()
	for !x.Released() {
		runtime.Gosched() // Release has begun: new accesses refuse from here
	}
	_, err = x.At(0)
	require.ErrorIs(t, err, driver.ErrClosed)
	close(goOn)
	require.NoError(t, <-accessed)
	require.True(t, <-released, "Release returned only after the access in flight ended")
	// The next allocation may take the same address: nothing writes it
	// through x any more.
	y, err := tensor.Empty(al, tensor.Uint8, 4*int(gran))
	require.NoError(t, err)
	require.NoError(t, y.Access(true, func(b []byte) error { b[100] = 7; return nil }))
	require.ErrorIs(t, x.Access(true, func(b []byte) error { b[100] = 0xab; return nil }), driver.ErrClosed)
	v, err := y.At(100)
	require.NoError(t, err)
	require.Equal(t, 7.0, v)
	require.NoError(t, y.Release())
}
