package tensor

import (
	"fmt"
	"slices"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/sentinel"
)

// The view operations return a new tensor over the same storage: no byte
// is read or written, and the result stays valid exactly as long as t.

// view returns a tensor over t's storage with the given layout.
func (t *Tensor) view(shape, strides []int, offset int) *Tensor {
	n := 1
	for _, s := range shape {
		n *= s
	}
	return &Tensor{st: t.st, dt: t.dt, shape: shape, strides: strides, offset: offset, n: n}
}

// checkDim returns an error unless dim names one of t's dims.
func (t *Tensor) checkDim(what func() string, dim int) error {
	if dim < 0 || dim >= len(t.shape) {
		if len(t.shape) == 0 {
			return errors.Wrapf(driver.ErrInvalid, "%s: dim %d: a scalar has no dims", what(), dim)
		}
		return errors.Wrapf(driver.ErrInvalid, "%s: dim %d is not one of its %d dims (0 to %d)",
			what(), dim, len(t.shape), len(t.shape)-1)
	}
	return nil
}

// Narrow returns the view of elements [start, start+length) of dim.
// length may be 0 (an empty view).
func (t *Tensor) Narrow(dim, start, length int) (*Tensor, error) {
	what := func() string {
		return fmt.Sprintf("tensor: narrow dim %d to [%d, %d+%d) of %s", dim, start, start, length, t)
	}
	if err := t.live(what); err != nil {
		return nil, err
	}
	if err := t.checkDim(what, dim); err != nil {
		return nil, err
	}
	size := t.shape[dim]
	if start < 0 || length < 0 || start > size || length > size-start {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: start %d and length %d do not fit dim %d of size %d",
			what(), start, length, dim, size)
	}
	shape := slices.Clone(t.shape)
	shape[dim] = length
	return t.view(shape, slices.Clone(t.strides), t.offsetAt(shape, dim, start)), nil
}

// offsetAt is the offset of a view of t whose dim starts at start, with
// shape. An empty view names no element, and its offset (PyTorch's
// storage_offset: start's) is kept at most the storage's end: moved view
// after view past it, with strides no storage bounds (an empty tensor's
// reshaped to 2^62), it would grow until it wrapped.
func (t *Tensor) offsetAt(shape []int, dim, start int) int {
	if !slices.Contains(shape, 0) {
		return t.offset + start*t.strides[dim] // inside the storage
	}
	end := t.st.length() / t.dt.Size()
	if t.offset >= end {
		return t.offset
	}
	if s := t.strides[dim]; start > 0 && s > (end-t.offset)/start {
		return end
	}
	return min(t.offset+start*t.strides[dim], end)
}

// Slice returns the view of elements start, start+step, ... below end of
// dim. step must be at least 1; 0 <= start <= end <= the dim's size.
func (t *Tensor) Slice(dim, start, end, step int) (*Tensor, error) {
	what := func() string {
		return fmt.Sprintf("tensor: slice dim %d [%d:%d:%d] of %s", dim, start, end, step, t)
	}
	if err := t.live(what); err != nil {
		return nil, err
	}
	if err := t.checkDim(what, dim); err != nil {
		return nil, err
	}
	if step < 1 {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: step %d is below 1", what(), step)
	}
	size := t.shape[dim]
	if start < 0 || start > end || end > size {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: [%d, %d) is not a range inside dim %d of size %d",
			what(), start, end, dim, size)
	}
	shape := slices.Clone(t.shape)
	strides := slices.Clone(t.strides)
	// ceil((end-start)/step) without end-start+step-1, which wraps for
	// steps near MaxInt.
	if n := end - start; n > 0 {
		shape[dim] = 1 + (n-1)/step
	} else {
		shape[dim] = 0
	}
	if shape[dim] > 1 { // step < end-start here, so the product stays inside the storage
		strides[dim] *= step
	}
	return t.view(shape, strides, t.offsetAt(shape, dim, start)), nil
}

// Permute returns the view whose dim i is t's dim dims[i]; dims must be a
// permutation of 0 .. Dims()-1.
func (t *Tensor) Permute(dims ...int) (*Tensor, error) {
	what := func() string { return fmt.Sprintf("tensor: permute %s by %v", t, dims) }
	if err := t.live(what); err != nil {
		return nil, err
	}
	if len(dims) != len(t.shape) {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: %d dims named, the tensor has %d", what(), len(dims), len(t.shape))
	}
	seen := make([]bool, len(dims))
	shape := make([]int, len(dims))
	strides := make([]int, len(dims))
	for i, d := range dims {
		if err := t.checkDim(what, d); err != nil {
			return nil, err
		}
		if seen[d] {
			return nil, errors.Wrapf(driver.ErrInvalid, "%s: dim %d named twice", what(), d)
		}
		seen[d] = true
		shape[i], strides[i] = t.shape[d], t.strides[d]
	}
	return t.view(shape, strides, t.offset), nil
}

// Transpose returns the view with dims a and b swapped.
func (t *Tensor) Transpose(a, b int) (*Tensor, error) {
	what := func() string { return fmt.Sprintf("tensor: transpose dims %d and %d of %s", a, b, t) }
	if err := t.live(what); err != nil {
		return nil, err
	}
	for _, d := range []int{a, b} {
		if err := t.checkDim(what, d); err != nil {
			return nil, err
		}
	}
	shape, strides := slices.Clone(t.shape), slices.Clone(t.strides)
	shape[a], shape[b] = shape[b], shape[a]
	strides[a], strides[b] = strides[b], strides[a]
	return t.view(shape, strides, t.offset), nil
}

// Reshape returns a view of t's elements, in row-major order, with a new
// shape of the same number of elements; one dim may be -1, inferred from
// the others. It is a view whenever strides exist that visit the same
// elements in the same order: always for a contiguous tensor, and for a
// strided one when each group of new dims falls inside a run of old dims
// that step through memory evenly (merging or splitting dims only there).
// Otherwise it refuses (ErrInvalid): make a contiguous copy first.
func (t *Tensor) Reshape(shape ...int) (*Tensor, error) {
	what := func() string { return fmt.Sprintf("tensor: reshape %s to %v", t, shape) }
	if err := t.live(what); err != nil {
		return nil, err
	}
	shape = slices.Clone(shape)
	if shape == nil {
		shape = []int{}
	}
	infer := -1
	for d, s := range shape {
		switch {
		case s == -1 && infer >= 0:
			return nil, errors.Wrapf(driver.ErrInvalid, "%s: dims %d and %d are both -1; at most one can be inferred", what(), infer, d)
		case s == -1:
			infer = d
		case s < 0:
			return nil, errors.Wrapf(driver.ErrInvalid, "%s: dim %d is %d, below zero", what(), d, s)
		}
	}
	if infer >= 0 {
		shape[infer] = 1
	}
	known, err := numElements(shape)
	if err != nil {
		return nil, sentinel.Mark(errors.Wrapf(err, "%s", what()), driver.ErrInvalid)
	}
	if infer >= 0 {
		if known == 0 || t.n%known != 0 {
			return nil, errors.Wrapf(driver.ErrInvalid, "%s: cannot infer dim %d: %d elements are not a multiple of the other dims' %d",
				what(), infer, t.n, known)
		}
		shape[infer] = t.n / known
		known = t.n
	}
	if known != t.n {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: %v has %d elements, the tensor %d", what(), shape, known, t.n)
	}
	strides, ok := viewStrides(t.shape, t.strides, shape, t.n)
	if !ok {
		return nil, errors.Wrapf(driver.ErrInvalid,
			"%s: its strides do not allow a view of that shape; make it contiguous first (Contiguous) and reshape the copy", what())
	}
	return t.view(shape, strides, t.offset), nil
}

// viewStrides returns strides that lay newShape over the elements of a
// tensor of oldShape and oldStrides in the same row-major order, and
// whether there are any. It walks old dims from the last, grouping them
// into chunks that step evenly through memory (dim d-1 steps over all of
// dims d.. at once), and requires the new dims to split exactly at chunk
// boundaries; within a chunk any regrouping is a view. (This is the
// algorithm of PyTorch's computeStride.)
func viewStrides(oldShape, oldStrides, newShape []int, n int) ([]int, bool) {
	if n == 0 || len(oldShape) == 0 {
		return rowMajor(newShape), true
	}
	strides := make([]int, len(newShape))
	vd := len(newShape) - 1
	base := oldStrides[len(oldStrides)-1] // the stride of the chunk's last dim
	oldN, newN := 1, 1
	for d := len(oldShape) - 1; d >= 0; d-- {
		oldN *= oldShape[d]
		if d == 0 || oldShape[d-1] != 1 && oldStrides[d-1] != oldN*base {
			// Dims d.. (down to the last boundary) are one chunk: lay the
			// new dims over it until they hold as many elements.
			for vd >= 0 && (newN < oldN || newShape[vd] == 1) {
				strides[vd] = newN * base
				newN *= newShape[vd]
				vd--
			}
			if newN != oldN {
				return nil, false
			}
			if d > 0 {
				base = oldStrides[d-1]
				oldN, newN = 1, 1
			}
		}
	}
	return strides, vd == -1
}
