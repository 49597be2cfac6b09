package vaspace

import (
	"fmt"

	"github.com/vmarena/vmarena/driver"
)

// Range is the address range [Base, Base+Size): Base inclusive, End
// exclusive. A Range with Size 0 is empty: it contains no address and
// overlaps nothing.
type Range struct {
	Base driver.Addr
	Size uint64
}

// End is the first address after the range.
func (r Range) End() driver.Addr { return r.Base + driver.Addr(r.Size) }

// Contains reports whether a lies inside r.
func (r Range) Contains(a driver.Addr) bool { return a >= r.Base && a < r.End() }

// ContainsRange reports whether all of o lies inside r. An empty o is
// contained when its base lies inside r or at its end.
func (r Range) ContainsRange(o Range) bool {
	return o.Base >= r.Base && o.End() >= o.Base && o.End() <= r.End()
}

// Overlaps reports whether r and o share at least one address.
func (r Range) Overlaps(o Range) bool {
	return r.Size > 0 && o.Size > 0 && r.Base < o.End() && o.Base < r.End()
}

// String formats r as "[0x..., 0x...)".
func (r Range) String() string { return fmt.Sprintf("[%s, %s)", r.Base, r.End()) }
