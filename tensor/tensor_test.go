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

func TestNew(t *testing.T) {
	for _, c := range []struct {
		name    string
		dt      tensor.DType
		shape   []int
		bytes   int
		strides []int
		n       int
	}{
		{"matrix", tensor.Float32, []int{2, 3}, 24, []int{3, 1}, 6},
		{"bigger buffer", tensor.Float32, []int{2, 3}, 100, []int{3, 1}, 6},
		{"3-d", tensor.Int64, []int{2, 3, 4}, 192, []int{12, 4, 1}, 24},
		{"vector", tensor.Uint8, []int{7}, 7, []int{1}, 7},
		{"scalar", tensor.Float64, nil, 8, []int{}, 1},
		{"empty", tensor.Float16, []int{0, 5}, 0, []int{5, 1}, 0},
		{"empty in the middle", tensor.BFloat16, []int{3, 0, 2}, 0, []int{2, 2, 1}, 0},
		{"ones", tensor.Int32, []int{1, 1, 4}, 16, []int{4, 4, 1}, 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			x, err := tensor.New(newHeap(c.bytes), c.dt, c.shape...)
			require.NoError(t, err)
			require.NoError(t, x.Check())
			require.Equal(t, c.dt, x.DType())
			if c.shape == nil {
				c.shape = []int{}
			}
			require.Equal(t, c.shape, x.Shape())
			require.Equal(t, c.strides, x.Strides())
			require.Zero(t, x.Offset())
			require.Equal(t, c.n, x.NumElements())
			require.True(t, x.IsContiguous())
			require.Zero(t, x.Addr(), "a heap buffer has no device address")
		})
	}
}

// misaligned is a buffer that starts one byte into an aligned one.
type misaligned struct{}

func (misaligned) Bytes() ([]byte, error) { return newHeap(64)[1:], nil }

// failing is a buffer whose Bytes fails, as a released view's does.
type failing struct{}

func (failing) Bytes() ([]byte, error) { return nil, driver.Closed("test: released buffer") }

func TestNewRefuses(t *testing.T) {
	for _, c := range []struct {
		name  string
		buf   tensor.Buffer
		dt    tensor.DType
		shape []int
		want  error
		frags []string
	}{
		{"too small", newHeap(20), tensor.Float32, []int{2, 3}, driver.ErrInvalid, []string{"tensor: new float32 tensor of shape [2 3]", "needs 24 bytes", "holds 20 B"}},
		{"negative dim", newHeap(64), tensor.Float32, []int{2, -3}, driver.ErrInvalid, []string{"dim 1 is -3, below zero"}},
		{"undefined dtype", newHeap(64), tensor.DType(9), []int{2}, driver.ErrInvalid, []string{"DType(9) is not a defined dtype"}},
		{"overflow", newHeap(64), tensor.Float32, []int{math.MaxInt / 2, 3}, driver.ErrInvalid, []string{"multiply past the largest int"}},
		{"overflow with a zero dim", newHeap(64), tensor.Float32, []int{math.MaxInt / 2, 3, 0}, driver.ErrInvalid, []string{"multiply past"}},
		{"nil buffer", nil, tensor.Float32, []int{2}, driver.ErrInvalid, []string{"the buffer is nil"}},
		{"misaligned", misaligned{}, tensor.Float32, []int{2}, driver.ErrMisaligned, []string{"multiple of the float32 element size, 4 bytes"}},
		{"buffer fails", failing{}, tensor.Float32, []int{2}, driver.ErrClosed, []string{"the buffer's bytes", "released buffer"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			x, err := tensor.New(c.buf, c.dt, c.shape...)
			drivertest.RequireIs(t, err, c.want, c.frags...)
			require.Nil(t, x)
		})
	}
	// A misaligned buffer is fine for bytes.
	_, err := tensor.New(misaligned{}, tensor.Uint8, 8)
	require.NoError(t, err)
}

func TestOnArena(t *testing.T) {
	a := newArena(t, 16*gran)
	x, err := tensor.OnArena(a, tensor.Uint8, 3)
	require.NoError(t, err)
	require.Equal(t, uint64(3), a.Len())
	require.Equal(t, a.Base(), x.Addr())

	// The next tensor is padded to its element size.
	y, err := tensor.OnArena(a, tensor.Float64, 4, 5)
	require.NoError(t, err)
	require.Equal(t, uint64(8+4*5*8), a.Len())
	require.Equal(t, a.Base()+8, y.Addr())
	require.NoError(t, y.Check())
	require.Equal(t, 2, a.Stats().Views)

	fill(t, y, func(k int) float64 { return float64(k) / 4 })
	d, err := tensor.Data[float64](y)
	require.NoError(t, err)
	require.Len(t, d, 20)
	for k, v := range d {
		require.Equal(t, float64(k)/4, v)
	}

	// Views share the storage and end with it.
	v, err := y.Narrow(0, 1, 2)
	require.NoError(t, err)
	require.True(t, v.SharesStorage(y))
	drivertest.RequireIs(t, v.Release(), driver.ErrInvalid, "it is a view", "tensor: release of")
	require.NoError(t, y.Release())
	require.Equal(t, 1, a.Stats().Views)
	require.True(t, v.Released())
	_, err = v.At(0, 0)
	drivertest.RequireIs(t, err, driver.ErrClosed, "its memory was released")
	drivertest.RequireIs(t, v.Set(1, 0, 0), driver.ErrClosed)
	_, err = tensor.Data[float64](y)
	drivertest.RequireIs(t, err, driver.ErrClosed)
	_, err = y.Narrow(0, 0, 1)
	drivertest.RequireIs(t, err, driver.ErrClosed)
	drivertest.RequireIs(t, y.Release(), driver.ErrClosed, "already released")
	require.Equal(t, []int{4, 5}, y.Shape(), "metadata stays readable")

	// The arena can shrink over released memory, not over live.
	drivertest.RequireIs(t, a.Shrink(a.Len()), driver.ErrBusy)
	require.NoError(t, x.Release())
	require.NoError(t, a.Shrink(a.Len()))

	// An empty tensor grows nothing and releases fine.
	e, err := tensor.OnArena(a, tensor.Float32, 0, 8)
	require.NoError(t, err)
	require.Zero(t, a.Len())
	require.Zero(t, e.NumElements())
	require.NoError(t, e.Release())
}

func TestOnArenaRefuses(t *testing.T) {
	a := newArena(t, gran)
	x, err := tensor.OnArena(a, tensor.Float32, 16)
	require.NoError(t, err)
	defer func() { require.NoError(t, x.Release()) }()
	before := a.Stats()
	for _, c := range []struct {
		name  string
		dt    tensor.DType
		shape []int
		want  error
		frags []string
	}{
		{"past max", tensor.Float32, []int{int(gran / 4)}, driver.ErrOutOfMemory, []string{"tensor: float32 tensor of shape [16384] on an arena", "past the arena's maximum"}},
		{"negative", tensor.Float32, []int{-1}, driver.ErrInvalid, []string{"below zero"}},
		{"undefined dtype", tensor.DType(8), []int{1}, driver.ErrInvalid, []string{"not a defined dtype"}},
		{"bytes overflow", tensor.Float64, []int{math.MaxInt / 4}, driver.ErrInvalid, []string{"overflow"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			y, err := tensor.OnArena(a, c.dt, c.shape...)
			drivertest.RequireIs(t, err, c.want, c.frags...)
			require.Nil(t, y)
			require.Equal(t, before, a.Stats(), "the arena is as it was")
		})
	}
	_, err = tensor.OnArena(nil, tensor.Float32, 1)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "the arena is nil")
	h, err := tensor.New(newHeap(8), tensor.Float32, 2)
	require.NoError(t, err)
	drivertest.RequireIs(t, h.Release(), driver.ErrInvalid, "belongs to the caller")
}

func TestData(t *testing.T) {
	buf := newHeap(64)
	type getter struct {
		dt  tensor.DType
		get func(*tensor.Tensor) (int, error)
	}
	getters := []getter{
		{tensor.Float32, func(x *tensor.Tensor) (int, error) { d, err := tensor.Data[float32](x); return len(d), err }},
		{tensor.Float16, func(x *tensor.Tensor) (int, error) { d, err := tensor.Data[tensor.F16](x); return len(d), err }},
		{tensor.BFloat16, func(x *tensor.Tensor) (int, error) { d, err := tensor.Data[tensor.BF16](x); return len(d), err }},
		{tensor.Float64, func(x *tensor.Tensor) (int, error) { d, err := tensor.Data[float64](x); return len(d), err }},
		{tensor.Int8, func(x *tensor.Tensor) (int, error) { d, err := tensor.Data[int8](x); return len(d), err }},
		{tensor.Uint8, func(x *tensor.Tensor) (int, error) { d, err := tensor.Data[uint8](x); return len(d), err }},
		{tensor.Int32, func(x *tensor.Tensor) (int, error) { d, err := tensor.Data[int32](x); return len(d), err }},
		{tensor.Int64, func(x *tensor.Tensor) (int, error) { d, err := tensor.Data[int64](x); return len(d), err }},
	}
	for _, g := range getters {
		for _, dt := range tensor.DTypes() {
			t.Run(g.dt.String()+"/"+dt.String(), func(t *testing.T) {
				x, err := tensor.New(buf, dt, 2, 4)
				require.NoError(t, err)
				n, err := g.get(x)
				if g.dt != dt {
					drivertest.RequireIs(t, err, driver.ErrInvalid, "tensor: data as []", "holds "+g.dt.String()+" elements, the tensor's are "+dt.String())
					return
				}
				require.NoError(t, err)
				require.Equal(t, 8, n)
			})
		}
	}

	// Data aliases the memory, at the view's offset.
	x, err := tensor.New(buf, tensor.Int32, 4, 4)
	require.NoError(t, err)
	row, err := x.Narrow(0, 2, 1)
	require.NoError(t, err)
	d, err := tensor.Data[int32](row)
	require.NoError(t, err)
	require.Len(t, d, 4)
	d[3] = -7
	v, err := x.At(2, 3)
	require.NoError(t, err)
	require.Equal(t, -7.0, v)
	require.NoError(t, x.Set(42, 2, 0))
	require.Equal(t, int32(42), d[0])

	// Strided: refused with a hint; empty: an empty slice.
	col, err := x.Narrow(1, 1, 1)
	require.NoError(t, err)
	_, err = tensor.Data[int32](col)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "not contiguous")
	empty, err := x.Narrow(0, 4, 0)
	require.NoError(t, err)
	e, err := tensor.Data[int32](empty)
	require.NoError(t, err)
	require.Empty(t, e)
	// A row of a column-major matrix is contiguous again (size-1 dims don't count).
	tr, err := x.Transpose(0, 1)
	require.NoError(t, err)
	one, err := tr.Narrow(1, 2, 1) // x's row 2, as a column
	require.NoError(t, err)
	require.True(t, one.IsContiguous())
	d1, err := tensor.Data[int32](one)
	require.NoError(t, err)
	require.Equal(t, []int32{42, 0, 0, -7}, d1)
}

func TestSetValues(t *testing.T) {
	for _, c := range []struct {
		dt      tensor.DType
		v, want float64 // want NaN: refused
	}{
		{tensor.Float32, 1.5, 1.5},
		{tensor.Float32, 0.1, float64(float32(0.1))},
		{tensor.Float32, 1e300, math.Inf(1)},
		{tensor.Float16, 0.1, tensor.F16FromFloat64(0.1).Float64()},
		{tensor.Float16, 70000, math.Inf(1)},
		{tensor.BFloat16, 3.14159, tensor.BF16FromFloat64(3.14159).Float64()},
		{tensor.Float64, 0.1, 0.1},
		{tensor.Int8, -128, -128},
		{tensor.Int8, 127, 127},
		{tensor.Int8, 128, math.NaN()},
		{tensor.Int8, -129, math.NaN()},
		{tensor.Int8, 1.5, math.NaN()},
		{tensor.Uint8, 255, 255},
		{tensor.Uint8, -1, math.NaN()},
		{tensor.Uint8, math.NaN(), math.NaN()},
		{tensor.Int32, -2147483648, -2147483648},
		{tensor.Int32, 2147483648, math.NaN()},
		{tensor.Int64, -9223372036854775808, -9223372036854775808},
		{tensor.Int64, 9223372036854775808, math.NaN()},
		{tensor.Int64, math.Inf(-1), math.NaN()},
		{tensor.Int64, 1 << 52, 1 << 52},
	} {
		t.Run(c.dt.String()+"/"+name(c.v), func(t *testing.T) {
			x, err := tensor.New(newHeap(16), c.dt, 2)
			require.NoError(t, err)
			require.NoError(t, x.Set(3, 1))
			err = x.Set(c.v, 1)
			got, aerr := x.At(1)
			require.NoError(t, aerr)
			if math.IsNaN(c.want) {
				drivertest.RequireIs(t, err, driver.ErrInvalid, "is not an integer in the "+c.dt.String()+" range [")
				require.Equal(t, 3.0, got, "a refused Set writes nothing")
				return
			}
			require.NoError(t, err)
			require.Equal(t, c.want, got)
		})
	}
	// NaN into a float stays NaN.
	x, err := tensor.New(newHeap(16), tensor.BFloat16, 2)
	require.NoError(t, err)
	require.NoError(t, x.Set(math.NaN(), 0))
	v, err := x.At(0)
	require.NoError(t, err)
	require.True(t, math.IsNaN(v))
}

func TestAtSetIndices(t *testing.T) {
	x, err := tensor.New(newHeap(96), tensor.Float32, 2, 3, 4)
	require.NoError(t, err)
	for _, c := range []struct {
		idx   []int
		frags []string
	}{
		{[]int{0, 3, 0}, []string{"tensor: at [0 3 0] of float32[2 3 4]", "index 3 of dim 1 is out of range [0, 3)"}},
		{[]int{-1, 0, 0}, []string{"index -1 of dim 0 is out of range [0, 2)"}},
		{[]int{0, 0, 4}, []string{"index 4 of dim 2 is out of range [0, 4)"}},
		{[]int{0, 0}, []string{"2 indices for 3 dims"}},
		{nil, []string{"0 indices for 3 dims"}},
	} {
		_, err := x.At(c.idx...)
		drivertest.RequireIs(t, err, driver.ErrInvalid, c.frags...)
		err = x.Set(1, c.idx...)
		drivertest.RequireIs(t, err, driver.ErrInvalid, c.frags[1:]...)
	}
	for _, v := range values(t, x) {
		require.Zero(t, v, "refused Sets wrote nothing")
	}
	// A scalar takes no indices.
	s, err := tensor.New(newHeap(8), tensor.Float64)
	require.NoError(t, err)
	require.NoError(t, s.Set(2.5))
	v, err := s.At()
	require.NoError(t, err)
	require.Equal(t, 2.5, v)
	_, err = s.At(0)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "1 indices for 0 dims")
}

// TestDriverCloseUnderLiveTensors: closing the driver while tensors hang
// from its memory is refused (ErrBusy, naming the live mappings) and
// changes nothing: every tensor still reads its values. Once the tensors
// are released and their arena and allocator closed, the driver closes.
// (Closed under them, it would unmap everything and leave At to fault.)
func TestDriverCloseUnderLiveTensors(t *testing.T) {
	s := newStack(t)
	a, err := arena.New(s.space, s.mem, arena.Options{Max: 16 * gran, ChunkSize: gran})
	require.NoError(t, err)
	x, err := tensor.OnArena(a, tensor.Float32, 4, 4)
	require.NoError(t, err)
	fill(t, x, func(k int) float64 { return float64(k) })
	al, err := arena.NewAllocator(s.space, s.mem, arena.AllocatorOptions{Max: 8 * gran, ChunkSize: gran})
	require.NoError(t, err)
	y, err := tensor.Empty(al, tensor.Int32, 100)
	require.NoError(t, err)
	require.NoError(t, y.Set(7, 99))
	ga, err := arena.New(s.space, s.mem, arena.Options{Max: 16 * gran, ChunkSize: gran})
	require.NoError(t, err)
	g, err := tensor.NewGrowable(ga, tensor.Uint8, 8)
	require.NoError(t, err)
	rows, err := g.AppendRows(3)
	require.NoError(t, err)
	require.NoError(t, rows.Set(5, 2, 7))

	before, err := s.mem.Usage(0)
	require.NoError(t, err)
	heap, err := s.drv.HeapBytes(0)
	require.NoError(t, err)
	drivertest.RequireIs(t, s.drv.Close(), driver.ErrBusy, "3 mapping(s) still live", x.Addr().String())
	after, err := s.mem.Usage(0)
	require.NoError(t, err)
	require.Equal(t, before, after)
	heapAfter, err := s.drv.HeapBytes(0)
	require.NoError(t, err)
	require.Equal(t, heap, heapAfter)
	base, err := s.drv.Reserve(gran, 0, 0) // still open
	require.NoError(t, err)
	require.NoError(t, s.drv.Unreserve(base, gran))
	for k := 0; k < 16; k++ {
		v, err := x.At(k/4, k%4)
		require.NoError(t, err)
		require.Equal(t, float64(k), v)
	}
	v, err := y.At(99)
	require.NoError(t, err)
	require.Equal(t, 7.0, v)
	v, err = rows.At(2, 7)
	require.NoError(t, err)
	require.Equal(t, 5.0, v)

	// The layers above refuse the same way while their memory is live.
	drivertest.RequireIs(t, a.Close(), driver.ErrBusy)
	drivertest.RequireIs(t, al.Close(), driver.ErrBusy)

	require.NoError(t, x.Release())
	require.NoError(t, y.Release())
	require.NoError(t, g.Release())
	require.NoError(t, a.Close())
	require.NoError(t, al.Close())
	require.NoError(t, ga.Close())
	// newStack's cleanup closes the driver and fails the test if it refuses.
}
