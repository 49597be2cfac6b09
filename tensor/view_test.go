package tensor_test

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/tensor"
)

// base234 is a float64 tensor of shape [2 3 4] holding 0 .. 23.
func base234(t *testing.T) *tensor.Tensor {
	x, err := tensor.New(newHeap(24*8), tensor.Float64, 2, 3, 4)
	require.NoError(t, err)
	fill(t, x, func(k int) float64 { return float64(k) })
	return x
}

// viewCase is an operation on a tensor and the layout it must give.
type viewCase struct {
	name    string
	op      func(*tensor.Tensor) (*tensor.Tensor, error)
	shape   []int
	strides []int
	offset  int
	contig  bool
	want    error // a refusal: its sentinel
	frags   []string
}

func runViewCases(t *testing.T, cases []viewCase) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			x := base234(t)
			before := layoutOf(x)
			v, err := c.op(x)
			require.Equal(t, before, layoutOf(x), "the tensor is unchanged")
			if c.want != nil {
				drivertest.RequireIs(t, err, c.want, c.frags...)
				require.Nil(t, v)
				return
			}
			require.NoError(t, err)
			require.NoError(t, v.Check())
			require.True(t, v.SharesStorage(x))
			require.Equal(t, c.shape, v.Shape(), "shape")
			require.Equal(t, c.strides, v.Strides(), "strides")
			require.Equal(t, c.offset, v.Offset(), "offset")
			require.Equal(t, c.contig, v.IsContiguous(), "contiguous")
		})
	}
}

func TestNarrow(t *testing.T) {
	narrow := func(dim, start, length int) func(*tensor.Tensor) (*tensor.Tensor, error) {
		return func(x *tensor.Tensor) (*tensor.Tensor, error) { return x.Narrow(dim, start, length) }
	}
	runViewCases(t, []viewCase{
		{name: "dim 0", op: narrow(0, 1, 1), shape: []int{1, 3, 4}, strides: []int{12, 4, 1}, offset: 12, contig: true},
		{name: "dim 1", op: narrow(1, 1, 2), shape: []int{2, 2, 4}, strides: []int{12, 4, 1}, offset: 4},
		{name: "dim 2", op: narrow(2, 3, 1), shape: []int{2, 3, 1}, strides: []int{12, 4, 1}, offset: 3},
		{name: "whole", op: narrow(2, 0, 4), shape: []int{2, 3, 4}, strides: []int{12, 4, 1}, contig: true},
		{name: "empty at the end", op: narrow(1, 3, 0), shape: []int{2, 0, 4}, strides: []int{12, 4, 1}, offset: 12, contig: true},
		{name: "past the end", op: narrow(1, 2, 2), want: driver.ErrInvalid,
			frags: []string{"tensor: narrow dim 1 to [2, 2+2) of float64[2 3 4]", "start 2 and length 2 do not fit dim 1 of size 3"}},
		{name: "start past", op: narrow(0, 3, 0), want: driver.ErrInvalid, frags: []string{"start 3 and length 0"}},
		{name: "negative start", op: narrow(0, -1, 1), want: driver.ErrInvalid, frags: []string{"start -1"}},
		{name: "negative length", op: narrow(0, 1, -1), want: driver.ErrInvalid, frags: []string{"length -1"}},
		{name: "no such dim", op: narrow(3, 0, 1), want: driver.ErrInvalid, frags: []string{"dim 3 is not one of its 3 dims (0 to 2)"}},
		{name: "negative dim", op: narrow(-1, 0, 1), want: driver.ErrInvalid, frags: []string{"dim -1 is not one of"}},
	})
}

// TestEmptyViewsKeepTheirOffset: an empty view's offset stays at most
// the storage's end, however far views of it move it: reshaped to huge
// strides and narrowed again and again, it never wraps.
func TestEmptyViewsKeepTheirOffset(t *testing.T) {
	x := base234(t)
	v, err := x.Narrow(0, 0, 0)
	require.NoError(t, err)
	for range 4 {
		v, err = v.Reshape(0, 1<<62)
		require.NoError(t, err)
		v, err = v.Narrow(1, 1<<62, 0)
		require.NoError(t, err)
		require.NoError(t, v.Check())
		require.LessOrEqual(t, v.Offset(), 24)
		v, err = v.Slice(1, 0, 0, math.MaxInt)
		require.NoError(t, err)
		require.NoError(t, v.Check())
	}
}

func TestSlice(t *testing.T) {
	slice := func(dim, start, end, step int) func(*tensor.Tensor) (*tensor.Tensor, error) {
		return func(x *tensor.Tensor) (*tensor.Tensor, error) { return x.Slice(dim, start, end, step) }
	}
	runViewCases(t, []viewCase{
		{name: "step 1 is narrow", op: slice(1, 1, 3, 1), shape: []int{2, 2, 4}, strides: []int{12, 4, 1}, offset: 4},
		{name: "every other", op: slice(2, 0, 4, 2), shape: []int{2, 3, 2}, strides: []int{12, 4, 2}},
		{name: "odd ones", op: slice(2, 1, 4, 2), shape: []int{2, 3, 2}, strides: []int{12, 4, 2}, offset: 1},
		{name: "rounds up", op: slice(1, 0, 3, 2), shape: []int{2, 2, 4}, strides: []int{12, 8, 1}},
		{name: "one element keeps the stride", op: slice(2, 1, 4, 3), shape: []int{2, 3, 1}, strides: []int{12, 4, 1}, offset: 1},
		{name: "step past the end", op: slice(0, 0, 2, 5), shape: []int{1, 3, 4}, strides: []int{12, 4, 1}, contig: true},
		{name: "empty", op: slice(2, 2, 2, 3), shape: []int{2, 3, 0}, strides: []int{12, 4, 1}, offset: 2, contig: true},
		// Steps near MaxInt: end-start+step-1 would wrap in int, giving an empty view.
		{name: "step MaxInt", op: slice(2, 0, 4, math.MaxInt), shape: []int{2, 3, 1}, strides: []int{12, 4, 1}},
		{name: "step MaxInt from 3", op: slice(2, 3, 4, math.MaxInt), shape: []int{2, 3, 1}, strides: []int{12, 4, 1}, offset: 3},
		{name: "step MaxInt-1 over the dim", op: slice(0, 0, 2, math.MaxInt-1), shape: []int{1, 3, 4}, strides: []int{12, 4, 1}, contig: true},
		{name: "step MaxInt over nothing", op: slice(1, 3, 3, math.MaxInt), shape: []int{2, 0, 4}, strides: []int{12, 4, 1}, offset: 12, contig: true},
		{name: "step 0", op: slice(2, 0, 4, 0), want: driver.ErrInvalid, frags: []string{"tensor: slice dim 2 [0:4:0] of float64[2 3 4]", "step 0 is below 1"}},
		{name: "negative step", op: slice(2, 4, 0, -1), want: driver.ErrInvalid, frags: []string{"step -1"}},
		{name: "end past", op: slice(2, 0, 5, 1), want: driver.ErrInvalid, frags: []string{"[0, 5) is not a range inside dim 2 of size 4"}},
		{name: "start after end", op: slice(2, 3, 2, 1), want: driver.ErrInvalid, frags: []string{"[3, 2)"}},
		{name: "no such dim", op: slice(5, 0, 1, 1), want: driver.ErrInvalid, frags: []string{"dim 5"}},
	})
}

func TestPermute(t *testing.T) {
	permute := func(dims ...int) func(*tensor.Tensor) (*tensor.Tensor, error) {
		return func(x *tensor.Tensor) (*tensor.Tensor, error) { return x.Permute(dims...) }
	}
	transpose := func(a, b int) func(*tensor.Tensor) (*tensor.Tensor, error) {
		return func(x *tensor.Tensor) (*tensor.Tensor, error) { return x.Transpose(a, b) }
	}
	runViewCases(t, []viewCase{
		{name: "identity", op: permute(0, 1, 2), shape: []int{2, 3, 4}, strides: []int{12, 4, 1}, contig: true},
		{name: "rotate", op: permute(2, 0, 1), shape: []int{4, 2, 3}, strides: []int{1, 12, 4}},
		{name: "reverse", op: permute(2, 1, 0), shape: []int{4, 3, 2}, strides: []int{1, 4, 12}},
		{name: "repeated", op: permute(0, 0, 1), want: driver.ErrInvalid, frags: []string{"tensor: permute float64[2 3 4]", "by [0 0 1]", "dim 0 named twice"}},
		{name: "too few", op: permute(1, 0), want: driver.ErrInvalid, frags: []string{"2 dims named, the tensor has 3"}},
		{name: "out of range", op: permute(0, 1, 3), want: driver.ErrInvalid, frags: []string{"dim 3 is not one of its 3 dims"}},
		{name: "transpose", op: transpose(0, 2), shape: []int{4, 3, 2}, strides: []int{1, 4, 12}},
		{name: "transpose with itself", op: transpose(1, 1), shape: []int{2, 3, 4}, strides: []int{12, 4, 1}, contig: true},
		{name: "transpose out of range", op: transpose(0, 3), want: driver.ErrInvalid, frags: []string{"tensor: transpose dims 0 and 3", "dim 3"}},
	})
}

func TestReshape(t *testing.T) {
	reshape := func(shape ...int) func(*tensor.Tensor) (*tensor.Tensor, error) {
		return func(x *tensor.Tensor) (*tensor.Tensor, error) { return x.Reshape(shape...) }
	}
	// chain applies ops in order.
	chain := func(ops ...func(*tensor.Tensor) (*tensor.Tensor, error)) func(*tensor.Tensor) (*tensor.Tensor, error) {
		return func(x *tensor.Tensor) (*tensor.Tensor, error) {
			var err error
			for _, op := range ops {
				if x, err = op(x); err != nil {
					return nil, err
				}
			}
			return x, nil
		}
	}
	tr := func(a, b int) func(*tensor.Tensor) (*tensor.Tensor, error) {
		return func(x *tensor.Tensor) (*tensor.Tensor, error) { return x.Transpose(a, b) }
	}
	narrow := func(dim, start, length int) func(*tensor.Tensor) (*tensor.Tensor, error) {
		return func(x *tensor.Tensor) (*tensor.Tensor, error) { return x.Narrow(dim, start, length) }
	}
	slice := func(dim, start, end, step int) func(*tensor.Tensor) (*tensor.Tensor, error) {
		return func(x *tensor.Tensor) (*tensor.Tensor, error) { return x.Slice(dim, start, end, step) }
	}
	runViewCases(t, []viewCase{
		{name: "flatten", op: reshape(24), shape: []int{24}, strides: []int{1}, contig: true},
		{name: "infer", op: reshape(-1, 6), shape: []int{4, 6}, strides: []int{6, 1}, contig: true},
		{name: "infer last", op: reshape(2, 2, -1), shape: []int{2, 2, 6}, strides: []int{12, 6, 1}, contig: true},
		{name: "split and add ones", op: reshape(1, 2, 3, 2, 2, 1), shape: []int{1, 2, 3, 2, 2, 1}, strides: []int{24, 12, 4, 2, 1, 1}, contig: true},
		{name: "same", op: reshape(2, 3, 4), shape: []int{2, 3, 4}, strides: []int{12, 4, 1}, contig: true},
		// Strided tensors: a view when the regrouping stays inside runs that step evenly.
		{name: "narrowed rows merge their leading dims", op: chain(narrow(2, 1, 2), reshape(6, 2)),
			shape: []int{6, 2}, strides: []int{4, 1}, offset: 1},
		{name: "narrowed rows split a leading dim", op: chain(narrow(2, 0, 2), reshape(2, 3, 1, 2)),
			shape: []int{2, 3, 1, 2}, strides: []int{12, 4, 2, 1}},
		{name: "transposed inner dims keep the outer", op: chain(tr(1, 2), reshape(2, 12)),
			want: driver.ErrInvalid, frags: []string{"tensor: reshape float64[2 4 3] strides [12 1 4] offset 0 to [2 12]", "do not allow a view", "make it contiguous first"}},
		{name: "transposed split the outer dim", op: chain(tr(0, 2), reshape(2, 2, 3, 2)),
			shape: []int{2, 2, 3, 2}, strides: []int{2, 1, 4, 12}},
		{name: "transposed flatten", op: chain(tr(0, 1), reshape(24)), want: driver.ErrInvalid, frags: []string{"do not allow a view"}},
		{name: "stepped rows do not merge", op: chain(slice(1, 0, 3, 2), reshape(2, 8)), want: driver.ErrInvalid, frags: []string{"do not allow a view"}},
		{name: "evenly stepped dims merge", op: chain(slice(2, 0, 4, 2), reshape(3, 2, 2)), shape: []int{3, 2, 2}, strides: []int{8, 4, 2}},
		{name: "stepped dim keeps its stride", op: chain(slice(2, 0, 4, 2), reshape(6, 2)), shape: []int{6, 2}, strides: []int{4, 2}},
		{name: "size-1 dims are free", op: chain(narrow(1, 1, 1), reshape(2, 4)), shape: []int{2, 4}, strides: []int{12, 1}, offset: 4},
		{name: "empty strided reshapes anything", op: chain(tr(0, 2), narrow(1, 0, 0), reshape(0, 7, 3)),
			shape: []int{0, 7, 3}, strides: []int{21, 3, 1}, contig: true},
		{name: "empty infer refused", op: chain(narrow(1, 0, 0), reshape(-1, 0)), want: driver.ErrInvalid, frags: []string{"cannot infer dim 0"}},
		{name: "to a scalar", op: chain(narrow(0, 1, 1), narrow(1, 2, 1), narrow(2, 3, 1), reshape()),
			shape: []int{}, strides: []int{}, offset: 23, contig: true},
		{name: "wrong count", op: reshape(5, 5), want: driver.ErrInvalid, frags: []string{"[5 5] has 25 elements, the tensor 24"}},
		{name: "two -1", op: reshape(-1, -1), want: driver.ErrInvalid, frags: []string{"dims 0 and 1 are both -1"}},
		{name: "not divisible", op: reshape(-1, 5), want: driver.ErrInvalid, frags: []string{"cannot infer dim 0: 24 elements are not a multiple of the other dims' 5"}},
		{name: "negative", op: reshape(-2, 12), want: driver.ErrInvalid, frags: []string{"dim 0 is -2, below zero"}},
		{name: "overflow", op: reshape(1<<40, 1<<40), want: driver.ErrInvalid, frags: []string{"multiply past the largest int"}},
	})
	// A reshaped view reads the same elements in the same order.
	x := base234(t)
	xt, err := x.Transpose(0, 2)
	require.NoError(t, err)
	r, err := xt.Reshape(2, 2, 3, 2)
	require.NoError(t, err)
	require.Equal(t, values(t, xt), values(t, r))
}

// TestAtSetReference reads and writes through chains of views and compares
// with a plain []float64 model of the [3 4 5] base, indexed by hand-written
// loops.
func TestAtSetReference(t *testing.T) {
	const I, J, K = 3, 4, 5
	flat := func(i, j, k int) int { return i*J*K + j*K + k }
	type ref struct {
		name  string
		view  func(*tensor.Tensor) (*tensor.Tensor, error)
		shape []int
		// at maps an index of the view to the base's flat index.
		at func(idx []int) int
	}
	refs := []ref{
		{"base", func(x *tensor.Tensor) (*tensor.Tensor, error) { return x, nil }, []int{I, J, K},
			func(p []int) int { return flat(p[0], p[1], p[2]) }},
		{"permute 2 0 1", func(x *tensor.Tensor) (*tensor.Tensor, error) { return x.Permute(2, 0, 1) }, []int{K, I, J},
			func(p []int) int { return flat(p[1], p[2], p[0]) }},
		{"transpose 0 1", func(x *tensor.Tensor) (*tensor.Tensor, error) { return x.Transpose(0, 1) }, []int{J, I, K},
			func(p []int) int { return flat(p[1], p[0], p[2]) }},
		{"slice k 1:5:2", func(x *tensor.Tensor) (*tensor.Tensor, error) { return x.Slice(2, 1, 5, 2) }, []int{I, J, 2},
			func(p []int) int { return flat(p[0], p[1], 1+2*p[2]) }},
		{"narrow j then permute", func(x *tensor.Tensor) (*tensor.Tensor, error) {
			n, err := x.Narrow(1, 1, 3)
			if err != nil {
				return nil, err
			}
			return n.Permute(1, 2, 0)
		}, []int{3, K, I}, func(p []int) int { return flat(p[2], 1+p[0], p[1]) }},
		{"permute, slice, narrow", func(x *tensor.Tensor) (*tensor.Tensor, error) {
			p, err := x.Permute(2, 1, 0) // [K J I]
			if err != nil {
				return nil, err
			}
			s, err := p.Slice(0, 0, 5, 2) // k = 0, 2, 4
			if err != nil {
				return nil, err
			}
			return s.Narrow(2, 1, 2) // i = 1, 2
		}, []int{3, J, 2}, func(p []int) int { return flat(1+p[2], p[1], 2*p[0]) }},
		{"reshape of a narrow", func(x *tensor.Tensor) (*tensor.Tensor, error) {
			n, err := x.Narrow(2, 0, 4) // [I J 4]: rows of 4 of the 5
			if err != nil {
				return nil, err
			}
			return n.Reshape(I, J, 2, 2)
		}, []int{I, J, 2, 2}, func(p []int) int { return flat(p[0], p[1], 2*p[2]+p[3]) }},
	}
	for _, r := range refs {
		t.Run(r.name, func(t *testing.T) {
			model := make([]float64, I*J*K)
			for i := range model {
				model[i] = float64(i)
			}
			x, err := tensor.New(newHeap(I*J*K*4), tensor.Float32, I, J, K)
			require.NoError(t, err)
			fill(t, x, func(k int) float64 { return model[k] })
			v, err := r.view(x)
			require.NoError(t, err)
			require.NoError(t, v.Check())
			require.Equal(t, r.shape, v.Shape())
			n := 0
			forEachIndex(r.shape, func(idx []int) {
				got, err := v.At(idx...)
				require.NoError(t, err)
				require.Equal(t, model[r.at(idx)], got, "at %v", idx)
				// Write through the view; the model and the base see it.
				model[r.at(idx)] = float64(-1000 - n)
				require.NoError(t, v.Set(float64(-1000-n), idx...))
				n++
			})
			d, err := tensor.Data[float32](x)
			require.NoError(t, err)
			for i := range model {
				require.Equal(t, float32(model[i]), d[i], "base element %d", i)
			}
			// Out of range on each dim names it.
			for dim := range r.shape {
				idx := make([]int, len(r.shape))
				idx[dim] = r.shape[dim]
				_, err := v.At(idx...)
				drivertest.RequireIs(t, err, driver.ErrInvalid, "of dim "+name(dim)+" is out of range")
			}
		})
	}
}

// addresses lists the storage offset of each element of x, row-major.
func addresses(x *tensor.Tensor) []int {
	var out []int
	strides := x.Strides()
	forEachIndex(x.Shape(), func(idx []int) {
		a := x.Offset()
		for d, i := range idx {
			a += i * strides[d]
		}
		out = append(out, a)
	})
	return out
}

// factorisations lists every shape of 1 to maxDims dims whose product is n.
func factorisations(n, maxDims int) [][]int {
	var out [][]int
	var rec func(prefix []int, rem int)
	rec = func(prefix []int, rem int) {
		if len(prefix) > 0 && rem == 1 {
			out = append(out, slices.Clone(prefix))
		}
		if len(prefix) == maxDims {
			return
		}
		for d := 1; d <= rem; d++ {
			if rem%d == 0 {
				rec(append(prefix, d), rem/d)
			}
		}
	}
	rec(nil, n)
	return out
}

// TestReshapeBruteForce: for random strided views of small tensors and
// every shape of the same size up to 4 dims, Reshape makes a view exactly
// when strides exist that visit the same elements in the same order
// (decided by brute force), and the view it makes visits them.
func TestReshapeBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	buf := newHeap(4096)
	views, strided := 0, 0
	for range 300 {
		shape := make([]int, 1+rng.IntN(4))
		for d := range shape {
			shape[d] = 1 + rng.IntN(4)
		}
		x, err := tensor.New(buf, tensor.Uint8, shape...)
		require.NoError(t, err)
		for range rng.IntN(4) {
			nd := x.Dims()
			dim := rng.IntN(nd)
			size := x.Shape()[dim]
			switch rng.IntN(3) {
			case 0:
				x, err = x.Permute(rng.Perm(nd)...)
			case 1:
				start := rng.IntN(size)
				x, err = x.Narrow(dim, start, 1+rng.IntN(size-start))
			case 2:
				start := rng.IntN(size)
				x, err = x.Slice(dim, start, size, 1+rng.IntN(3))
			}
			require.NoError(t, err)
		}
		addrs := addresses(x)
		for _, target := range factorisations(x.NumElements(), 4) {
			r, err := x.Reshape(target...)
			if !viewable(addrs, target) {
				drivertest.RequireIs(t, err, driver.ErrInvalid, "do not allow a view")
				continue
			}
			require.NoError(t, err, "reshape %s to %v", x, target)
			require.Equal(t, addrs, addresses(r), "reshape %s to %v", x, target)
			views++
			if !x.IsContiguous() {
				strided++
			}
		}
	}
	t.Logf("%d views, %d of them of strided tensors", views, strided)
	require.Greater(t, strided, 100)
}
