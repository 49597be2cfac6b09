package arena

import "fmt"

// Policy says how many bytes a request takes and where it may start.
type Policy uint8

const (
	// PolicyDefault: sizes round up to 256 bytes and starts are 256-byte
	// aligned, like device allocators (cudaMalloc returns 256-byte aligned
	// pointers).
	PolicyDefault Policy = iota
	// PolicyAscend: AscendCL's rule for carving one allocation into many
	// (secondary allocation in the AscendCL memory docs): a piece of len bytes takes ALIGN_UP(len,32)+32 bytes and
	// starts 64-byte aligned.
	PolicyAscend
	// PolicyAscendMedia: the same footprint, 128-byte aligned starts, for
	// buffers handed to media processing (acldvppMalloc).
	PolicyAscendMedia
)

func (p Policy) String() string {
	switch p {
	case PolicyDefault:
		return "default"
	case PolicyAscend:
		return "ascend"
	case PolicyAscendMedia:
		return "ascend-media"
	}
	return fmt.Sprintf("policy(%d)", uint8(p))
}

// Quantum is the policy's start alignment; every block is a multiple of it.
func (p Policy) Quantum() uint64 {
	switch p {
	case PolicyAscend:
		return 64
	case PolicyAscendMedia:
		return 128
	}
	return 256
}

// Footprint is the bytes a request of n bytes takes under the policy,
// before rounding to the quantum: n rounded up to 256 by default,
// ALIGN_UP(n,32)+32 under the AscendCL rule. It saturates rather than
// wrap for n near 2^64.
func (p Policy) Footprint(n uint64) uint64 {
	if p == PolicyDefault {
		return alignUp(n, 256)
	}
	return satAdd(alignUp(n, 32), 32)
}

// alignUp rounds x up to a multiple of a (a power of two, or any positive
// a), saturating at the largest multiple below 2^64 instead of wrapping.
// A power of two takes masks rather than a division: these run several
// times an allocation.
func alignUp(x, a uint64) uint64 {
	if a != 0 && a&(a-1) == 0 {
		r := (x + a - 1) &^ (a - 1)
		if r < x {
			return ^uint64(0) &^ (a - 1)
		}
		return r
	}
	r := (x + a - 1) / a * a
	if r < x {
		return ^uint64(0) / a * a
	}
	return r
}

func alignDown(x, a uint64) uint64 {
	if a != 0 && a&(a-1) == 0 {
		return x &^ (a - 1)
	}
	return x / a * a
}

// satAdd is a+b, or the largest uint64 when that overflows.
func satAdd(a, b uint64) uint64 {
	if a+b < a {
		return ^uint64(0)
	}
	return a + b
}

// satMul is a*b, or the largest uint64 when that overflows.
func satMul(a, b uint64) uint64 {
	if b != 0 && a > ^uint64(0)/b {
		return ^uint64(0)
	}
	return a * b
}
