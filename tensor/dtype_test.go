package tensor_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/tensor"
)

func TestDType(t *testing.T) {
	for _, c := range []struct {
		dt   tensor.DType
		size int
		name string
	}{
		{tensor.Float32, 4, "float32"},
		{tensor.Float16, 2, "float16"},
		{tensor.BFloat16, 2, "bfloat16"},
		{tensor.Float64, 8, "float64"},
		{tensor.Int8, 1, "int8"},
		{tensor.Uint8, 1, "uint8"},
		{tensor.Int32, 4, "int32"},
		{tensor.Int64, 8, "int64"},
		{tensor.DType(8), 0, "DType(8)"},
		{tensor.DType(255), 0, "DType(255)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.size, c.dt.Size())
			require.Equal(t, c.name, c.dt.String())
			require.Equal(t, c.size != 0, c.dt.Valid())
		})
	}
	require.Len(t, tensor.DTypes(), 8)
	require.Equal(t, tensor.Float32, tensor.DTypeOf[float32]())
	require.Equal(t, tensor.Float16, tensor.DTypeOf[tensor.F16]())
	require.Equal(t, tensor.BFloat16, tensor.DTypeOf[tensor.BF16]())
	require.Equal(t, tensor.Float64, tensor.DTypeOf[float64]())
	require.Equal(t, tensor.Int8, tensor.DTypeOf[int8]())
	require.Equal(t, tensor.Uint8, tensor.DTypeOf[uint8]())
	require.Equal(t, tensor.Int32, tensor.DTypeOf[int32]())
	require.Equal(t, tensor.Int64, tensor.DTypeOf[int64]())
}

var (
	inf32 = float32(math.Inf(1))
	nan32 = float32(math.NaN())
)

func TestF16KnownBits(t *testing.T) {
	sub := float32(math.Ldexp(1, -24)) // the smallest subnormal
	for _, c := range []struct {
		name string
		f    float32
		bits uint16
	}{
		{"one", 1, 0x3C00},
		{"minus two", -2, 0xC000},
		{"largest finite", 65504, 0x7BFF},
		{"inf", inf32, 0x7C00},
		{"minus inf", -inf32, 0xFC00},
		{"zero", 0, 0x0000},
		{"minus zero", float32(math.Copysign(0, -1)), 0x8000},
		{"smallest subnormal", sub, 0x0001},
		{"largest subnormal", float32(math.Ldexp(1023, -24)), 0x03FF},
		{"smallest normal", float32(math.Ldexp(1, -14)), 0x0400},
		{"one third", 1.0 / 3, 0x3555},
		{"half", 0.5, 0x3800},
		{"pi", math.Pi, 0x4248},
		// Rounding: ties to even, up past halfway, overflow to Inf.
		{"tie down to even", 1 + float32(math.Ldexp(1, -11)), 0x3C00},
		{"tie up to even", 1 + 3*float32(math.Ldexp(1, -11)), 0x3C02},
		{"past halfway", 1 + float32(math.Ldexp(1, -11)) + float32(math.Ldexp(1, -20)), 0x3C01},
		{"65519 rounds down", 65519, 0x7BFF},
		{"65520 rounds to inf", 65520, 0x7C00},
		{"1e6 is inf", 1e6, 0x7C00},
		{"half the smallest subnormal ties to zero", sub / 2, 0x0000},
		{"just past half the smallest subnormal", sub/2 + sub/1024, 0x0001},
		{"1.5 subnormals ties to even", 1.5 * sub, 0x0002},
		{"subnormal rounds up to the smallest normal", float32(math.Ldexp(1, -14)) - sub/4, 0x0400},
		{"1e-10 is zero", 1e-10, 0x0000},
		{"minus 1e-10 is minus zero", -1e-10, 0x8000},
	} {
		t.Run(c.name, func(t *testing.T) {
			require.Equalf(t, c.bits, uint16(tensor.F16FromFloat32(c.f)), "%g: want %#04x, got %#04x", c.f, c.bits, uint16(tensor.F16FromFloat32(c.f)))
			require.Equal(t, c.bits, uint16(tensor.F16FromFloat64(float64(c.f))))
		})
	}
	// Decoding.
	require.Equal(t, float32(1), tensor.F16(0x3C00).Float32())
	require.Equal(t, float32(-2), tensor.F16(0xC000).Float32())
	require.Equal(t, float32(65504), tensor.F16(0x7BFF).Float32())
	require.Equal(t, inf32, tensor.F16(0x7C00).Float32())
	require.Equal(t, -inf32, tensor.F16(0xFC00).Float32())
	require.Equal(t, sub, tensor.F16(0x0001).Float32())
	require.True(t, math.Signbit(tensor.F16(0x8000).Float64()))
	require.True(t, math.IsNaN(tensor.F16(0x7E00).Float64()))
	require.True(t, math.IsNaN(tensor.F16(0x7C01).Float64()))
	// NaN stays NaN (never rounds into Inf), keeps its sign.
	for _, f := range []float32{nan32, -nan32, math.Float32frombits(0x7F800001), math.Float32frombits(0xFF800001)} {
		h := tensor.F16FromFloat32(f)
		require.True(t, math.IsNaN(h.Float64()), "%#x -> %#x", math.Float32bits(f), uint16(h))
		require.Equal(t, math.Signbit(float64(f)), h&0x8000 != 0)
	}
}

func TestBF16KnownBits(t *testing.T) {
	for _, c := range []struct {
		name string
		f    float32
		bits uint16
	}{
		{"one", 1, 0x3F80},
		{"minus two", -2, 0xC000},
		{"inf", inf32, 0x7F80},
		{"minus inf", -inf32, 0xFF80},
		{"zero", 0, 0},
		{"pi", math.Pi, 0x4049},
		{"largest finite float32 rounds to inf", math.MaxFloat32, 0x7F80},
		{"tie down to even", math.Float32frombits(0x3F808000), 0x3F80},
		{"tie up to even", math.Float32frombits(0x3F818000), 0x3F82},
		{"past halfway", math.Float32frombits(0x3F808001), 0x3F81},
		{"below halfway", math.Float32frombits(0x3F807FFF), 0x3F80},
		{"subnormal", math.Float32frombits(0x00010000), 0x0001},
		{"subnormal tie to even", math.Float32frombits(0x00018000), 0x0002},
	} {
		t.Run(c.name, func(t *testing.T) {
			require.Equalf(t, c.bits, uint16(tensor.BF16FromFloat32(c.f)), "%g", c.f)
			require.Equal(t, c.bits, uint16(tensor.BF16FromFloat64(float64(c.f))))
		})
	}
	require.Equal(t, float32(1), tensor.BF16(0x3F80).Float32())
	for _, f := range []float32{nan32, math.Float32frombits(0x7F800001), math.Float32frombits(0x7FFFFFFF)} {
		require.True(t, math.IsNaN(tensor.BF16FromFloat32(f).Float64()), "%#x", math.Float32bits(f))
	}
}

// bf16Reference is the usual bit trick: add 0x7FFF plus the lowest kept
// bit, keep the top half (NaN handled apart).
func bf16Reference(f float32) uint16 {
	b := math.Float32bits(f)
	return uint16((b + 0x7FFF + (b>>16)&1) >> 16)
}

// TestRoundTrip: every 16-bit pattern decodes to a float32 that encodes
// back to itself (NaNs to a NaN), and every float32 is rounded to a nearest
// neighbour, ties to the even one.
func TestRoundTrip(t *testing.T) {
	// require only on a failure: it costs more than the conversions.
	for b := range 1 << 16 {
		h := tensor.F16(b)
		if math.IsNaN(h.Float64()) {
			if back := tensor.F16FromFloat32(h.Float32()); !math.IsNaN(back.Float64()) {
				require.Failf(t, "NaN lost", "%#04x -> %#04x", b, uint16(back))
			}
		} else if tensor.F16FromFloat32(h.Float32()) != h || tensor.F16FromFloat64(h.Float64()) != h {
			require.Equal(t, h, tensor.F16FromFloat32(h.Float32()), "%#04x", b)
			require.Equal(t, h, tensor.F16FromFloat64(h.Float64()), "%#04x", b)
		}
		bf := tensor.BF16(b)
		if math.IsNaN(bf.Float64()) {
			if back := tensor.BF16FromFloat32(bf.Float32()); !math.IsNaN(back.Float64()) {
				require.Failf(t, "NaN lost", "%#04x -> %#04x", b, uint16(back))
			}
		} else if back := tensor.BF16FromFloat32(bf.Float32()); back != bf {
			require.Equal(t, bf, back, "%#04x", b)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		f := math.Float32frombits(rng.Uint32())
		if math.IsNaN(float64(f)) {
			continue
		}
		if want, got := bf16Reference(f), uint16(tensor.BF16FromFloat32(f)); want != got {
			require.Equal(t, want, got, "%g (%#x)", f, math.Float32bits(f))
		}
		g := float32(math.Ldexp(float64(rng.Float32()*2-1), rng.IntN(44)-28)) // mostly in range
		requireNearestF16(t, g)
		requireNearestF16(t, f)
	}
}

// requireNearestF16 checks that F16FromFloat32(f) is a nearest half to f,
// and the even one on a tie (Inf counts as the next value past 65504, as
// IEEE's rounding to 2^16 does).
func requireNearestF16(t *testing.T, f float32) {
	h := tensor.F16FromFloat32(f)
	hv := h.Float64()
	x := float64(f)
	mag := h &^ 0x8000
	val := func(m tensor.F16) float64 {
		if m == 0x7C00 {
			return math.Copysign(65536, x)
		}
		return (m | h&0x8000).Float64()
	}
	if mag == 0x7C00 {
		if math.Abs(x) < 65520 {
			require.Failf(t, "rounded to Inf", "%g", f)
		}
		return
	}
	d := math.Abs(x - hv)
	if mag < 0x7C00 {
		if up := math.Abs(x - val(mag+1)); !(d < up || d == up && mag&1 == 0) {
			require.Failf(t, "the next half is closer", "%g -> %#04x (%g)", f, uint16(h), hv)
		}
	}
	if mag > 0 {
		if down := math.Abs(x - val(mag-1)); !(d < down || d == down && mag&1 == 0) {
			require.Failf(t, "the previous half is closer", "%g -> %#04x (%g)", f, uint16(h), hv)
		}
	}
}
