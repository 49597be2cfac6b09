package transformer

import (
	"math"

	"github.com/vmarena/vmarena/internal/attention"
)

// The arithmetic every path shares. Forward and Step call these same
// functions on the same values in the same order, so where the KV store
// returns exactly what it was given the two agree bit for bit; the 1e-4
// tolerance leaves room for a store that does not (another summation order
// in a caller's kernel, a conversion).

// normEps keeps RMSNorm finite on an all-zero vector.
const normEps = 1e-5

// ropeBase is the rotary embeddings' base: pair i turns by
// pos * ropeBase^(-2i/HeadDim) radians.
const ropeBase = 10000

// matrix is a dense row-major rows×cols matrix: w[r*cols+c]. It maps a
// vector of cols values to one of rows values (each output is the dot of
// one row with the input). Invariant: len(w) == rows*cols.
type matrix struct {
	rows, cols int
	w          []float32
}

// apply sets dst[r] = row r · x. len(dst) == rows, len(x) == cols.
func (m *matrix) apply(dst, x []float32) {
	for r := range dst[:m.rows] {
		dst[r] = attention.Dot(m.w[r*m.cols:(r+1)*m.cols], x)
	}
}

// add adds x to y.
func add(y, x []float32) {
	x = x[:len(y)]
	for i := range y {
		y[i] += x[i]
	}
}

// rmsNorm sets dst to x / rms(x) * gain, the mean of squares taken in
// float64.
func rmsNorm(dst, x, gain []float32) {
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	inv := float32(1 / math.Sqrt(ss/float64(len(x))+normEps))
	gain = gain[:len(x)]
	dst = dst[:len(x)]
	for i, v := range x {
		dst[i] = v * inv * gain[i]
	}
}

// rotary holds the rotation of one position: cos and sin of each pair's
// angle, HeadDim/2 of each.
type rotary struct{ cos, sin []float32 }

// rotaryAt computes the rotation of position pos for heads of dimension
// headDim; the angles are taken in float64 so that far positions keep
// their precision.
func rotaryAt(pos, headDim int) rotary {
	r := rotary{cos: make([]float32, headDim/2), sin: make([]float32, headDim/2)}
	for i := range r.cos {
		theta := float64(pos) * math.Pow(ropeBase, -float64(2*i)/float64(headDim))
		s, c := math.Sincos(theta)
		r.cos[i], r.sin[i] = float32(c), float32(s)
	}
	return r
}

// rotate turns each head of x (heads of len(r.cos)*2 values, one after
// another) pair by pair: (x[2i], x[2i+1]) by pair i's angle.
func (r rotary) rotate(x []float32) {
	d := 2 * len(r.cos)
	for h := 0; h+d <= len(x); h += d {
		head := x[h : h+d]
		for i, c := range r.cos {
			s := r.sin[i]
			a, b := head[2*i], head[2*i+1]
			head[2*i] = a*c - b*s
			head[2*i+1] = a*s + b*c
		}
	}
}

// softmax turns scores into weights summing to one, in place. A score of
// -Inf (a masked position) gets weight 0; at least one score must be
// finite.
func softmax(scores []float32) {
	m := float32(math.Inf(-1))
	for _, s := range scores {
		m = max(m, s)
	}
	var sum float64
	for i, s := range scores {
		e := math.Exp(float64(s - m))
		scores[i] = float32(e)
		sum += e
	}
	inv := float32(1 / sum)
	for i := range scores {
		scores[i] *= inv
	}
}

// silu is x*sigmoid(x).
func silu(x float32) float32 {
	return x / (1 + float32(math.Exp(-float64(x))))
}
