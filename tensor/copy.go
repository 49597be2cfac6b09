package tensor

import (
	"fmt"
	"slices"
	"unsafe"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// Copy writes src's elements into dst, index by index, for any strides of
// either. Shapes and dtypes must match exactly (ErrInvalid otherwise: Copy
// never converts or broadcasts).
//
// Device tensors (memory the process cannot address) are refused
// (ErrUnsupported): move their bytes with the driver's copies under
// AccessDevice.
//
// Overlap: when the byte ranges the two tensors' elements lie in overlap
// (views of the same storage, or of buffers over the same memory), Copy
// reads all of src into a temporary first, so dst ends up holding what src
// held before the call, as if the two were apart. Ranges that merely
// interleave without sharing an element take the same path: the check is
// on address ranges, cheap and conservative.
func Copy(dst, src *Tensor) error {
	what := func() string { return fmt.Sprintf("tensor: copy %s into %s", src, dst) }
	if dst == nil || src == nil {
		return errors.Wrap(driver.ErrInvalid, "tensor: copy: a nil tensor")
	}
	if err := src.enter(what); err != nil {
		return err
	}
	defer src.st.exit()
	if err := dst.enter(what); err != nil {
		return err
	}
	defer dst.st.exit()
	if err := src.hostBytes(what); err != nil {
		return err
	}
	if err := dst.hostBytes(what); err != nil {
		return err
	}
	if dst.dt != src.dt {
		return errors.Wrapf(driver.ErrInvalid, "%s: the dtypes differ (%s into %s); Copy does not convert", what(), src.dt, dst.dt)
	}
	if !slices.Equal(dst.shape, src.shape) {
		return errors.Wrapf(driver.ErrInvalid, "%s: the shapes differ (%v into %v)", what(), src.shape, dst.shape)
	}
	if src.n == 0 {
		return nil
	}
	if err := dst.writable(what); err != nil {
		return err
	}
	if overlap(dst, src) {
		tmp := &Tensor{st: &storage{bytes: make([]byte, src.n*src.dt.Size())}, dt: src.dt,
			shape: src.shape, strides: rowMajor(src.shape), n: src.n}
		copyElements(tmp, src)
		src = tmp
	}
	copyElements(dst, src)
	return nil
}

// Contiguous copies t into a new row-major tensor at offset 0 of dst (which
// must hold NumElements()*DType().Size() bytes) and returns it. The copy
// lives in dst: it is valid while dst is, and the caller ends dst itself.
// dst may overlap t (see Copy).
func (t *Tensor) Contiguous(dst Buffer) (*Tensor, error) {
	what := func() string { return fmt.Sprintf("tensor: contiguous copy of %s", t) }
	if err := t.live(what); err != nil {
		return nil, err
	}
	c, err := New(dst, t.dt, t.shape...)
	if err != nil {
		return nil, errors.Wrapf(err, "%s", what())
	}
	if err := Copy(c, t); err != nil {
		return nil, errors.Wrapf(err, "%s", what())
	}
	return c, nil
}

// overlap reports whether the memory the elements of a and b lie in
// overlaps. Addresses are compared as numbers only, within this call.
func overlap(a, b *Tensor) bool {
	alo, ahi := a.span()
	blo, bhi := b.span()
	if alo == ahi || blo == bhi {
		return false
	}
	abase := uintptr(unsafe.Pointer(unsafe.SliceData(a.st.bytes)))
	bbase := uintptr(unsafe.Pointer(unsafe.SliceData(b.st.bytes)))
	return abase+uintptr(alo) < bbase+uintptr(bhi) && bbase+uintptr(blo) < abase+uintptr(ahi)
}

// copyElements copies src into dst (same dtype and shape, not empty, not
// overlapping) row by row of the last dim: one copy per row when both
// rows are contiguous, one per element otherwise.
func copyElements(dst, src *Tensor) {
	sz := dst.dt.Size()
	db, sb := dst.st.bytes, src.st.bytes
	if dst.IsContiguous() && src.IsContiguous() {
		copy(db[dst.offset*sz:(dst.offset+dst.n)*sz], sb[src.offset*sz:(src.offset+src.n)*sz])
		return
	}
	last := len(dst.shape) - 1
	n, ds, ss := dst.shape[last], dst.strides[last], src.strides[last]
	eachRow(dst.shape, dst.strides, src.strides, dst.offset, src.offset, func(do, so int) {
		if ds == 1 && ss == 1 {
			copy(db[do*sz:(do+n)*sz], sb[so*sz:(so+n)*sz])
			return
		}
		for range n {
			copy(db[do*sz:(do+1)*sz], sb[so*sz:(so+1)*sz])
			do += ds
			so += ss
		}
	})
}

// eachRow calls fn with the storage offsets of the first element of every
// row along the last dim, for two layouts of the same shape stepped
// together in row-major order. The shape has at least one dim and no zero
// dims.
func eachRow(shape, as, bs []int, ao, bo int, fn func(ao, bo int)) {
	outer := len(shape) - 1
	idx := make([]int, outer)
	for {
		fn(ao, bo)
		d := outer - 1
		for ; d >= 0; d-- {
			idx[d]++
			ao += as[d]
			bo += bs[d]
			if idx[d] < shape[d] {
				break
			}
			ao -= as[d] * shape[d]
			bo -= bs[d] * shape[d]
			idx[d] = 0
		}
		if d < 0 {
			return
		}
	}
}
