package tensor

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"unsafe"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// Elements are stored in the machine's byte order, as a Go []T would hold
// them: Data hands out exactly those bytes.
var ne = binary.NativeEndian

// index returns the storage offset (in elements) of idx, or an error naming
// the first dim it is out of range in.
func (t *Tensor) index(what func() string, idx []int) (int, error) {
	if len(idx) != len(t.shape) {
		return 0, errors.Wrapf(driver.ErrInvalid, "%s: %d indices for %d dims", what(), len(idx), len(t.shape))
	}
	off := t.offset
	for d, i := range idx {
		if i < 0 || i >= t.shape[d] {
			return 0, errors.Wrapf(driver.ErrInvalid, "%s: index %d of dim %d is out of range [0, %d)",
				what(), i, d, t.shape[d])
		}
		off += i * t.strides[d]
	}
	return off, nil
}

// At returns the element at idx (one index per dim; none for a scalar),
// converted to float64: exact for every dtype but int64 beyond ±2^53.
func (t *Tensor) At(idx ...int) (float64, error) {
	// idx is cloned for the message so that it does not escape: the
	// caller's variadic slice then stays on its stack (no allocation per
	// element).
	what := func() string { return fmt.Sprintf("tensor: at %v of %s", slices.Clone(idx), t) }
	if err := t.enter(what); err != nil {
		return 0, err
	}
	defer t.st.exit()
	if err := t.hostBytes(what); err != nil {
		return 0, err
	}
	off, err := t.index(what, idx)
	if err != nil {
		return 0, err
	}
	return load(t.st.bytes, t.dt, off), nil
}

// Set stores v at idx. Floats are rounded to the dtype, to nearest, ties
// to even (too large becomes ±Inf). Integer dtypes refuse (ErrInvalid) a v
// that is not an integer inside their range: Set never truncates or wraps
// silently.
func (t *Tensor) Set(v float64, idx ...int) error {
	what := func() string { return fmt.Sprintf("tensor: set %v at %v of %s", v, slices.Clone(idx), t) }
	if err := t.enter(what); err != nil {
		return err
	}
	defer t.st.exit()
	if err := t.hostBytes(what); err != nil {
		return err
	}
	off, err := t.index(what, idx)
	if err != nil {
		return err
	}
	if err := checkValue(what, t.dt, v); err != nil {
		return err
	}
	if off*t.dt.Size() < t.st.readOnly {
		return errors.WithHint(errors.Wrapf(driver.ErrAccessDenied, "%s: the element lies in the first %s of its memory, which are read-only",
			what(), units.Bytes(uint64(t.st.readOnly))), "its owner shares that memory (a KV cache's prefix pages): write elsewhere")
	}
	store(t.st.bytes, t.dt, off, v)
	return nil
}

// intRange is the range of each integer dtype as float64 bounds (exact:
// powers of two), lo inclusive and hi exclusive, and as it reads.
var intRange = map[DType]struct {
	lo, hi float64
	text   string
}{
	Int8:  {math.MinInt8, math.MaxInt8 + 1, "[-128, 127]"},
	Uint8: {0, math.MaxUint8 + 1, "[0, 255]"},
	Int32: {math.MinInt32, math.MaxInt32 + 1, "[-2147483648, 2147483647]"},
	Int64: {math.MinInt64, -math.MinInt64, "[-9223372036854775808, 9223372036854775807]"},
}

// checkValue refuses a value an integer dtype cannot hold exactly.
func checkValue(what func() string, dt DType, v float64) error {
	if !dt.isInt() {
		return nil
	}
	r := intRange[dt]
	if v != math.Trunc(v) || !(v >= r.lo && v < r.hi) {
		return errors.Wrapf(driver.ErrInvalid, "%s: %v is not an integer in the %s range %s", what(), v, dt, r.text)
	}
	return nil
}

// load reads element off (in elements) of b as float64.
func load(b []byte, dt DType, off int) float64 {
	switch dt {
	case Float32:
		return float64(math.Float32frombits(ne.Uint32(b[off*4:])))
	case Float16:
		return F16(ne.Uint16(b[off*2:])).Float64()
	case BFloat16:
		return BF16(ne.Uint16(b[off*2:])).Float64()
	case Float64:
		return math.Float64frombits(ne.Uint64(b[off*8:]))
	case Int8:
		return float64(int8(b[off]))
	case Uint8:
		return float64(b[off])
	case Int32:
		return float64(int32(ne.Uint32(b[off*4:])))
	case Int64:
		return float64(int64(ne.Uint64(b[off*8:])))
	}
	panic(errors.AssertionFailedf("tensor: load of undefined dtype %d", uint8(dt)))
}

// store writes v, already checked by checkValue, as element off of b.
func store(b []byte, dt DType, off int, v float64) {
	switch dt {
	case Float32:
		ne.PutUint32(b[off*4:], math.Float32bits(float32(v)))
	case Float16:
		ne.PutUint16(b[off*2:], uint16(F16FromFloat64(v)))
	case BFloat16:
		ne.PutUint16(b[off*2:], uint16(BF16FromFloat64(v)))
	case Float64:
		ne.PutUint64(b[off*8:], math.Float64bits(v))
	case Int8:
		b[off] = byte(int8(v))
	case Uint8:
		b[off] = uint8(v)
	case Int32:
		ne.PutUint32(b[off*4:], uint32(int32(v)))
	case Int64:
		ne.PutUint64(b[off*8:], uint64(int64(v)))
	default:
		panic(errors.AssertionFailedf("tensor: store of undefined dtype %d", uint8(dt)))
	}
}

// Data returns the elements of a contiguous tensor as a []T aliasing its
// memory (writes through it are writes to the tensor). T must be the
// dtype's storage type: float32 for Float32, F16 for Float16, BF16 for
// BFloat16, float64, int8, uint8, int32, int64 for the others. A
// mismatched T or a strided tensor is refused (ErrInvalid); make a
// contiguous copy first for the latter. The slice is valid while the
// tensor's memory is (see the package doc).
func Data[T Element](t *Tensor) ([]T, error) {
	var z T
	want := DTypeOf[T]()
	what := func() string { return fmt.Sprintf("tensor: data as []%T of %s", z, t) }
	if err := t.live(what); err != nil {
		return nil, err
	}
	if err := t.hostBytes(what); err != nil {
		return nil, err
	}
	if t.dt != want {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: []%T holds %s elements, the tensor's are %s",
			what(), z, want, t.dt)
	}
	if !t.IsContiguous() {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: the tensor is not contiguous; make a contiguous copy first (Contiguous)", what())
	}
	if t.n == 0 {
		return []T{}, nil
	}
	sz := t.dt.Size()
	b := t.st.bytes[t.offset*sz : (t.offset+t.n)*sz]
	// The storage is aligned to sz (checked when it was made) and T has no
	// pointers, so the slice is a plain typed view of the same bytes.
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), t.n), nil
}
