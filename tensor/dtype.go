package tensor

import "fmt"

// DType is the element type of a tensor.
type DType uint8

// The element types. Values are stable: they may be stored.
const (
	Float32  DType = iota // IEEE 754 binary32, Go float32
	Float16               // IEEE 754 binary16, stored as F16
	BFloat16              // bfloat16 (the top half of a binary32), stored as BF16
	Float64               // IEEE 754 binary64, Go float64
	Int8                  // Go int8
	Uint8                 // Go uint8
	Int32                 // Go int32
	Int64                 // Go int64
	numDTypes
)

var dtypeInfo = [numDTypes]struct {
	size int
	name string
}{
	Float32:  {4, "float32"},
	Float16:  {2, "float16"},
	BFloat16: {2, "bfloat16"},
	Float64:  {8, "float64"},
	Int8:     {1, "int8"},
	Uint8:    {1, "uint8"},
	Int32:    {4, "int32"},
	Int64:    {8, "int64"},
}

// DTypes lists every element type, in value order.
func DTypes() []DType {
	out := make([]DType, numDTypes)
	for i := range out {
		out[i] = DType(i)
	}
	return out
}

// Valid reports whether d is one of the defined element types.
func (d DType) Valid() bool { return d < numDTypes }

// Size is the size of one element in bytes (0 for an undefined DType).
func (d DType) Size() int {
	if !d.Valid() {
		return 0
	}
	return dtypeInfo[d].size
}

// String is the element type's name: "float32", "bfloat16", ...
func (d DType) String() string {
	if !d.Valid() {
		return fmt.Sprintf("DType(%d)", uint8(d))
	}
	return dtypeInfo[d].name
}

// isInt reports whether d is an integer type.
func (d DType) isInt() bool { return d >= Int8 && d <= Int64 }

// Element is the set of Go types a tensor's elements can be read as (Data):
// exactly one per DType. F16 and BF16 are the storage types of the
// 16-bit floats Float16 and BFloat16.
type Element interface {
	float32 | F16 | BF16 | float64 | int8 | uint8 | int32 | int64
}

// DTypeOf is the DType whose elements are stored as T.
func DTypeOf[T Element]() DType {
	var z T
	switch any(z).(type) {
	case float32:
		return Float32
	case F16:
		return Float16
	case BF16:
		return BFloat16
	case float64:
		return Float64
	case int8:
		return Int8
	case uint8:
		return Uint8
	case int32:
		return Int32
	case int64:
		return Int64
	}
	panic("unreachable: Element has one case per DType")
}
