package vaspace

import (
	"fmt"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// Range is the address range [Base, Base+Size): Base inclusive, End
// exclusive. A Range with Size 0 is empty: it contains no address and
// overlaps nothing.
//
// A Range whose end would lie past the top of the 64-bit address space is
// not Valid; the predicates (Contains, ContainsRange, Overlaps) still
// answer for it as for the addresses it names, without wrapping around,
// and every call that takes a Range refuses one (driver.ErrInvalid).
type Range struct {
	Base driver.Addr
	Size uint64
}

// Valid reports whether r ends inside the address space: Base+Size does
// not pass 2^64-1, so End is its first address after it.
func (r Range) Valid() bool { return r.Size <= uint64(^driver.Addr(0)-r.Base) }

// End is the first address after the range. For a range that is not
// Valid it is the highest address, 2^64-1, never a wrapped-around one.
func (r Range) End() driver.Addr {
	if !r.Valid() {
		return ^driver.Addr(0)
	}
	return r.Base + driver.Addr(r.Size)
}

// Contains reports whether a lies inside r.
func (r Range) Contains(a driver.Addr) bool { return a >= r.Base && uint64(a-r.Base) < r.Size }

// ContainsRange reports whether all of o lies inside r. An empty o is
// contained when its base lies inside r or at its end.
func (r Range) ContainsRange(o Range) bool {
	if o.Base < r.Base {
		return false
	}
	off := uint64(o.Base - r.Base)
	return off <= r.Size && o.Size <= r.Size-off
}

// Overlaps reports whether r and o share at least one address.
func (r Range) Overlaps(o Range) bool {
	if r.Size == 0 || o.Size == 0 {
		return false
	}
	if r.Base <= o.Base {
		return uint64(o.Base-r.Base) < r.Size
	}
	return uint64(r.Base-o.Base) < o.Size
}

// String formats r as "[0x..., 0x...)"; a range that is not Valid as
// "[0x..., +size past the end of the address space)".
func (r Range) String() string {
	if !r.Valid() {
		return fmt.Sprintf("[%s, +%s past the end of the address space)", r.Base, units.Bytes(r.Size))
	}
	return fmt.Sprintf("[%s, %s)", r.Base, r.End())
}
