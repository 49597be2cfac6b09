package tensor_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/tensor"
)

// panicBuffer is a Buffer whose Bytes panics.
type panicBuffer struct{}

func (panicBuffer) Bytes() ([]byte, error) { panic("buffer bug") }

// TestNilArguments: nil and typed-nil arguments, zero objects and a
// buffer that panics get driver.ErrInvalid (or ErrClosed for an arena or
// allocator that cannot be used), never a panic; a real tensor next to
// them is untouched.
func TestNilArguments(t *testing.T) {
	x, err := tensor.New(newHeap(16), tensor.Float32, 4)
	require.NoError(t, err)
	require.NoError(t, x.Set(3, 2))

	_, err = tensor.New(nil, tensor.Float32, 4)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "the buffer is nil")
	_, err = tensor.New((*arena.View)(nil), tensor.Float32, 4)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "the buffer is nil")
	_, err = tensor.New(panicBuffer{}, tensor.Float32, 4)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "the tensor_test.panicBuffer buffer panicked: buffer bug")
	_, err = x.Contiguous(nil)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "the buffer is nil")

	_, err = tensor.OnArena(&arena.Arena{}, tensor.Float32, 4)
	drivertest.RequireIs(t, err, driver.ErrClosed, "not made by arena.New")
	_, err = tensor.NewGrowable(&arena.Arena{}, tensor.Float32, 4)
	drivertest.RequireIs(t, err, driver.ErrClosed, "not made by arena.New")
	_, err = tensor.Empty(&arena.Allocator{}, tensor.Float32, 4)
	drivertest.RequireIs(t, err, driver.ErrClosed, "not made by arena.NewAllocator")

	for name, z := range map[string]*tensor.Tensor{"nil": nil, "zero": {}} {
		t.Run(name, func(t *testing.T) {
			_, err := z.At(0)
			drivertest.RequireIs(t, err, driver.ErrInvalid, "not a tensor made by New")
			drivertest.RequireIs(t, z.Set(1, 0), driver.ErrInvalid)
			drivertest.RequireIs(t, z.Release(), driver.ErrInvalid)
			drivertest.RequireIs(t, z.Check(), driver.ErrInvalid)
			_, err = z.Narrow(0, 0, 1)
			drivertest.RequireIs(t, err, driver.ErrInvalid)
			_, err = tensor.Data[float32](z)
			drivertest.RequireIs(t, err, driver.ErrInvalid)
			drivertest.RequireIs(t, tensor.Copy(x, z), driver.ErrInvalid)
			drivertest.RequireIs(t, tensor.Copy(z, x), driver.ErrInvalid)
			require.True(t, z.Released())
			require.Zero(t, z.Addr())
			require.False(t, x.SharesStorage(z))
			require.False(t, z.SharesStorage(x))
		})
	}
	drivertest.RequireIs(t, tensor.Copy(nil, x), driver.ErrInvalid)
	_, err = tensor.Data[float32](nil)
	drivertest.RequireIs(t, err, driver.ErrInvalid)

	v, err := x.At(2)
	require.NoError(t, err)
	require.Equal(t, 3.0, v)
	require.NoError(t, x.Check())
}

// TestShapeBytesOverflowNamed: a shape whose element count fits an int
// but whose bytes do not (float32 [MaxInt], [MaxInt/4+1]) is refused by
// New and NewLeased with ErrInvalid saying that the bytes overflow an
// int; the message never shows a wrapped, negative byte count. A valid
// tensor over the same buffer is made afterwards.
func TestShapeBytesOverflowNamed(t *testing.T) {
	h := newHeap(64)
	for _, n := range []int{math.MaxInt, math.MaxInt/4 + 1} {
		_, err := tensor.New(h, tensor.Float32, n)
		drivertest.RequireIs(t, err, driver.ErrInvalid, "tensor: new float32 tensor", "elements of 4 bytes overflow an int")
		require.NotContains(t, err.Error(), "-")
		_, err = tensor.NewLeased(tensor.NewLease(), h, tensor.Float32, n)
		drivertest.RequireIs(t, err, driver.ErrInvalid, "tensor: new leased float32 tensor", "elements of 4 bytes overflow an int")
		require.NotContains(t, err.Error(), "-")
	}
	x, err := tensor.New(h, tensor.Float32, 16)
	require.NoError(t, err)
	require.NoError(t, x.Check())
}
