package tensor_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/tensor"
)

// TestCopyStrided copies between tensors of different strides and checks
// every element against the source's, index by index.
func TestCopyStrided(t *testing.T) {
	type mk func(t *testing.T) *tensor.Tensor // a [4 6] int32 tensor in some layout
	must := func(x *tensor.Tensor, err error) *tensor.Tensor {
		require.NoError(t, err)
		return x
	}
	layouts := map[string]mk{
		"contiguous": func(t *testing.T) *tensor.Tensor { return must(tensor.New(newHeap(96), tensor.Int32, 4, 6)) },
		"transposed": func(t *testing.T) *tensor.Tensor {
			return must(must(tensor.New(newHeap(96), tensor.Int32, 6, 4)).Transpose(0, 1))
		},
		"narrowed": func(t *testing.T) *tensor.Tensor {
			return must(must(must(tensor.New(newHeap(400), tensor.Int32, 10, 10)).Narrow(0, 3, 4)).Narrow(1, 2, 6))
		},
		"stepped": func(t *testing.T) *tensor.Tensor {
			return must(must(must(tensor.New(newHeap(8*13*4), tensor.Int32, 8, 13)).Slice(0, 1, 8, 2)).Slice(1, 0, 12, 2))
		},
		"permuted 3-d reshaped": func(t *testing.T) *tensor.Tensor {
			x := must(tensor.New(newHeap(96), tensor.Int32, 2, 3, 4)) // [2 3 4] -> [4 2 3] -> [4 6]
			return must(must(x.Permute(2, 0, 1)).Reshape(4, 6))
		},
	}
	for sname, src := range layouts {
		for dname, dst := range layouts {
			t.Run(sname+" into "+dname, func(t *testing.T) {
				s, d := src(t), dst(t)
				require.Equal(t, []int{4, 6}, s.Shape())
				require.Equal(t, []int{4, 6}, d.Shape())
				fill(t, s, func(k int) float64 { return float64(k*7 - 50) })
				fill(t, d, func(int) float64 { return 999 })
				require.NoError(t, tensor.Copy(d, s))
				require.Equal(t, values(t, s), values(t, d))
			})
		}
	}
}

func TestCopyRefuses(t *testing.T) {
	a, err := tensor.New(newHeap(96), tensor.Float32, 4, 6)
	require.NoError(t, err)
	fill(t, a, func(k int) float64 { return float64(k) })
	b, err := tensor.New(newHeap(96), tensor.Int32, 4, 6)
	require.NoError(t, err)
	c, err := tensor.New(newHeap(96), tensor.Float32, 6, 4)
	require.NoError(t, err)
	want := values(t, a)
	for _, tc := range []struct {
		name     string
		dst, src *tensor.Tensor
		frags    []string
	}{
		{"dtype", b, a, []string{"tensor: copy float32[4 6] strides [6 1] offset 0 into int32[4 6]", "the dtypes differ (float32 into int32); Copy does not convert"}},
		{"shape", c, a, []string{"the shapes differ ([4 6] into [6 4])"}},
		{"nil", nil, a, []string{"a nil tensor"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			drivertest.RequireIs(t, tensor.Copy(tc.dst, tc.src), driver.ErrInvalid, tc.frags...)
			require.Equal(t, want, values(t, a))
		})
	}
	for _, v := range values(t, c) {
		require.Zero(t, v, "nothing was written")
	}
}

// TestCopyOverlap: a copy between overlapping views of one storage behaves
// as if through a temporary: dst ends up with what src held.
func TestCopyOverlap(t *testing.T) {
	must := func(x *tensor.Tensor, err error) *tensor.Tensor {
		require.NoError(t, err)
		return x
	}
	for _, c := range []struct {
		name     string
		dst, src func(x *tensor.Tensor) *tensor.Tensor // views of a [10 10]
	}{
		{"shift right by one",
			func(x *tensor.Tensor) *tensor.Tensor { return must(x.Narrow(1, 1, 9)) },
			func(x *tensor.Tensor) *tensor.Tensor { return must(x.Narrow(1, 0, 9)) }},
		{"shift left by one",
			func(x *tensor.Tensor) *tensor.Tensor { return must(x.Narrow(1, 0, 9)) },
			func(x *tensor.Tensor) *tensor.Tensor { return must(x.Narrow(1, 1, 9)) }},
		{"transpose in place",
			func(x *tensor.Tensor) *tensor.Tensor { return x },
			func(x *tensor.Tensor) *tensor.Tensor { return must(x.Transpose(0, 1)) }},
		{"flat shift down a row",
			func(x *tensor.Tensor) *tensor.Tensor { return must(must(x.Reshape(100)).Narrow(0, 10, 90)) },
			func(x *tensor.Tensor) *tensor.Tensor { return must(must(x.Reshape(100)).Narrow(0, 0, 90)) }},
		{"itself",
			func(x *tensor.Tensor) *tensor.Tensor { return must(x.Slice(0, 0, 10, 3)) },
			func(x *tensor.Tensor) *tensor.Tensor { return must(x.Slice(0, 0, 10, 3)) }},
		{"interleaved columns",
			func(x *tensor.Tensor) *tensor.Tensor { return must(x.Slice(1, 0, 10, 2)) },
			func(x *tensor.Tensor) *tensor.Tensor { return must(x.Slice(1, 1, 10, 2)) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			x := must(tensor.New(newHeap(400), tensor.Float32, 10, 10))
			fill(t, x, func(k int) float64 { return float64(k) })
			dst, src := c.dst(x), c.src(x)
			want := values(t, src)
			require.NoError(t, tensor.Copy(dst, src))
			require.Equal(t, want, values(t, dst))
		})
	}
}

func TestContiguous(t *testing.T) {
	a := newArena(t, 4*gran)
	x, err := tensor.OnArena(a, tensor.BFloat16, 3, 4, 5)
	require.NoError(t, err)
	defer func() { require.NoError(t, x.Release()) }()
	fill(t, x, func(k int) float64 { return float64(k) })
	p, err := x.Permute(2, 0, 1)
	require.NoError(t, err)
	s, err := p.Slice(0, 1, 5, 2)
	require.NoError(t, err)
	require.False(t, s.IsContiguous())

	// Into a view of the same arena.
	n := s.NumElements() * 2
	out, err := tensor.OnArena(a, tensor.Uint8, n)
	require.NoError(t, err)
	defer func() { require.NoError(t, out.Release()) }()
	view, err := a.View(uint64(out.Addr()-a.Base()), uint64(n))
	require.NoError(t, err)
	defer func() { require.NoError(t, view.Release()) }()
	c, err := s.Contiguous(view)
	require.NoError(t, err)
	require.True(t, c.IsContiguous())
	require.Equal(t, s.Shape(), c.Shape())
	require.Equal(t, view.Addr(), c.Addr())
	require.Equal(t, values(t, s), values(t, c))
	d, err := tensor.Data[tensor.BF16](c)
	require.NoError(t, err)
	require.Equal(t, float32(1), d[0].Float32(), "c[0,0,0] is x[0,0,1]")
	require.Equal(t, float32(2*20+3*5+3), d[23].Float32(), "c[1,2,3] is x[2,3,3]")
	require.Equal(t, []int{2, 3, 4}, c.Shape())
	// The copy is apart from the source.
	require.NoError(t, c.Set(-1, 0, 0, 0))
	v, err := x.At(0, 0, 1)
	require.NoError(t, err)
	require.Equal(t, 1.0, v)

	// Too small a destination is refused and nothing is written.
	small := newHeap(n - 2)
	_, err = s.Contiguous(small)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "tensor: contiguous copy of bfloat16[2 3 4]", "needs 48 bytes")
	for _, b := range small {
		require.Zero(t, b)
	}
}
