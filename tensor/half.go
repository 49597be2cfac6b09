package tensor

import "math"

// F16 is an IEEE 754 binary16 value as stored: 1 sign bit, 5 exponent
// bits (bias 15), 10 fraction bits; largest finite 65504, smallest
// subnormal 2^-24. It is the storage type of the Float16 dtype (named like
// Rust's half::f16: the DType constant has the plain name).
type F16 uint16

// BF16 is a bfloat16 value as stored: the top 16 bits of a binary32 (1
// sign bit, 8 exponent bits, 7 fraction bits), so it has float32's range
// with 8 bits of precision. It is the storage type of the BFloat16 dtype.
type BF16 uint16

// A narrow float format: exponent and fraction widths.
type floatFormat struct{ expBits, fracBits uint }

var (
	half  = floatFormat{5, 10}
	bhalf = floatFormat{8, 7}
)

// F16FromFloat32 rounds f to the nearest binary16, ties to even.
// Values beyond the largest finite half round to ±Inf as IEEE says (65520
// and up), tiny ones to subnormals or ±0, and a NaN stays a (quiet) NaN.
func F16FromFloat32(f float32) F16 { return F16(half.round(float64(f))) }

// F16FromFloat64 rounds f to the nearest binary16, ties to even, in one
// rounding (going through float32 first could round twice).
func F16FromFloat64(f float64) F16 { return F16(half.round(f)) }

// Float32 is h exactly (every binary16 is a binary32).
func (h F16) Float32() float32 { return float32(half.decode(uint16(h))) }

// Float64 is h exactly.
func (h F16) Float64() float64 { return half.decode(uint16(h)) }

// BF16FromFloat32 rounds f to the nearest bfloat16, ties to even: the
// top 16 bits of f, rounded on the 16 it drops. A NaN stays a (quiet) NaN
// rather than rounding into Inf.
func BF16FromFloat32(f float32) BF16 { return BF16(bhalf.round(float64(f))) }

// BF16FromFloat64 rounds f to the nearest bfloat16, ties to even, in one
// rounding.
func BF16FromFloat64(f float64) BF16 { return BF16(bhalf.round(f)) }

// Float32 is b exactly: b shifted into the top half of a binary32.
func (b BF16) Float32() float32 { return math.Float32frombits(uint32(b) << 16) }

// Float64 is b exactly.
func (b BF16) Float64() float64 { return float64(b.Float32()) }

// round returns the format's bits for the value nearest f, ties to even.
// f is exact in float64 (a widened float32 is), so this is the one and only
// rounding.
func (ff floatFormat) round(f float64) uint16 {
	bits := math.Float64bits(f)
	sign := uint16(bits>>63) << (ff.expBits + ff.fracBits)
	exp := int(bits>>52) & 0x7ff
	frac := bits & (1<<52 - 1)
	expMax := uint64(1)<<ff.expBits - 1 // the all-ones exponent: Inf and NaN
	inf := sign | uint16(expMax<<ff.fracBits)
	switch {
	case exp == 0x7ff && frac != 0: // NaN: quiet, keep the top payload bits
		return inf | uint16(1)<<(ff.fracBits-1) | uint16(frac>>(52-ff.fracBits))
	case exp == 0x7ff:
		return inf
	case exp == 0 && frac == 0:
		return sign
	}
	// f = full * 2^(exp-1075), full < 2^53 (float64 subnormals are far below
	// either format's smallest subnormal and round to zero below).
	full := frac
	if exp != 0 {
		full |= 1 << 52
	} else {
		exp = 1
	}
	bias := int(expMax >> 1)
	e := exp - 1023 + bias // the biased exponent f would have in the format
	if e >= int(expMax) {
		return inf
	}
	// Keep fracBits+1 bits (normal) or fewer (subnormal: the format's unit
	// is 2^(1-bias-fracBits), so shift by one more per step of e below 1).
	shift := uint(52 - ff.fracBits)
	if e < 1 {
		shift += uint(1 - e)
		e = 0
	}
	if shift > 63 {
		return sign
	}
	kept := full >> shift
	rest := full & (1<<shift - 1)
	halfway := uint64(1) << (shift - 1)
	var out uint64
	if e == 0 {
		out = kept // subnormal: no implicit bit
	} else {
		out = uint64(e)<<ff.fracBits | kept&(1<<ff.fracBits-1)
	}
	if rest > halfway || rest == halfway && out&1 == 1 {
		// A carry out of the fraction moves to the next exponent (the
		// largest subnormal rounds to the smallest normal, the largest
		// finite to Inf), which is what the encoding does by itself.
		out++
	}
	return sign | uint16(out)
}

// decode returns the value of the format's bits, exactly.
func (ff floatFormat) decode(b uint16) float64 {
	sign := 1.0
	if b>>(ff.expBits+ff.fracBits) != 0 {
		sign = -1
	}
	expMax := 1<<ff.expBits - 1
	exp := int(b>>ff.fracBits) & expMax
	frac := uint64(b) & (1<<ff.fracBits - 1)
	bias := expMax >> 1
	switch {
	case exp == expMax && frac != 0:
		return math.NaN()
	case exp == expMax:
		return math.Inf(int(sign))
	case exp == 0:
		return sign * math.Ldexp(float64(frac), 1-bias-int(ff.fracBits))
	}
	return sign * math.Ldexp(float64(frac|1<<ff.fracBits), exp-bias-int(ff.fracBits))
}
