package attention

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// fill sets x to random values in [-1, 1).
func fill(rng *rand.Rand, x []float32) {
	for i := range x {
		x[i] = 2*rng.Float32() - 1
	}
}

// paged lays k and v ([tokens, KVHeads, HeadDim]) out as a pool of
// poolBlocks blocks of blockTokens tokens, the sequence's blocks at random
// distinct places, the rest of the pool filled with other numbers (another
// sequence's), and returns the pools and the block table.
func paged(rng *rand.Rand, s Shape, k, v []float32, tokens, blockTokens, poolBlocks int) (kPool, vPool []float32, table []int32) {
	rl := s.RowLen()
	blockLen := blockTokens * rl
	kPool, vPool = make([]float32, poolBlocks*blockLen), make([]float32, poolBlocks*blockLen)
	fill(rng, kPool)
	fill(rng, vPool)
	nblocks := (tokens + blockTokens - 1) / blockTokens
	for _, b := range rng.Perm(poolBlocks)[:nblocks] {
		table = append(table, int32(b))
	}
	for i, b := range table {
		t0 := i * blockTokens
		n := min(blockTokens, tokens-t0)
		copy(kPool[int(b)*blockLen:], k[t0*rl:(t0+n)*rl])
		copy(vPool[int(b)*blockLen:], v[t0*rl:(t0+n)*rl])
	}
	return kPool, vPool, table
}

// reference is attention computed the plain way in float64, query head by
// query head.
func reference(s Shape, q, k, v []float32, tokens int) []float64 {
	d, rl, group := s.HeadDim, s.RowLen(), s.Heads/s.KVHeads
	out := make([]float64, s.Heads*d)
	w := make([]float64, tokens)
	for h := range s.Heads {
		g := h / group
		m := math.Inf(-1)
		for t := range tokens {
			var dotv float64
			for i := range d {
				dotv += float64(q[h*d+i]) * float64(k[t*rl+g*d+i])
			}
			w[t] = dotv / math.Sqrt(float64(d))
			m = max(m, w[t])
		}
		var sum float64
		for t := range tokens {
			w[t] = math.Exp(w[t] - m)
			sum += w[t]
		}
		for t := range tokens {
			for i := range d {
				out[h*d+i] += w[t] / sum * float64(v[t*rl+g*d+i])
			}
		}
	}
	return out
}

// TestPagedEqualsContiguous: the same keys and values, contiguous and
// scattered over a pool of 16-token blocks (vLLM's size), give bit-identical
// outputs and weights, for sequences shorter than a block, a block less one,
// one, one more, and many; grouped-query and multi-head; and both match a
// float64 reference closely.
func TestPagedEqualsContiguous(t *testing.T) {
	shapes := map[string]Shape{
		"GQA": {Heads: 8, KVHeads: 2, HeadDim: 16},
		"MHA": {Heads: 4, KVHeads: 4, HeadDim: 12},
		"MQA": {Heads: 6, KVHeads: 1, HeadDim: 7}, // an odd head dim: the dot's tail loop
	}
	for name, s := range shapes {
		for _, tokens := range []int{1, 15, 16, 17, 1000} {
			t.Run(fmt.Sprintf("%s/T=%d", name, tokens), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(tokens), uint64(s.Heads)))
				rl, w := s.RowLen(), s.Heads*s.HeadDim
				q, k, v := make([]float32, w), make([]float32, tokens*rl), make([]float32, tokens*rl)
				fill(rng, q)
				fill(rng, k)
				fill(rng, v)
				const blockTokens = 16
				nblocks := (tokens + blockTokens - 1) / blockTokens
				kPool, vPool, table := paged(rng, s, k, v, tokens, blockTokens, 2*nblocks+3)

				outC, scoresC := make([]float32, w), make([]float32, s.ScoresLen(tokens))
				require.NoError(t, Contiguous(s, outC, q, k, v, tokens, scoresC))
				outP, scoresP := make([]float32, w), make([]float32, s.ScoresLen(tokens))
				fill(rng, outP) // out is overwritten, not added to
				require.NoError(t, Paged(s, outP, q, kPool, vPool, blockTokens, table, tokens, scoresP))
				for i := range outC {
					require.Equal(t, math.Float32bits(outC[i]), math.Float32bits(outP[i]), "out[%d]: %v contiguous, %v paged", i, outC[i], outP[i])
				}
				for i := range scoresC {
					require.Equal(t, math.Float32bits(scoresC[i]), math.Float32bits(scoresP[i]), "weight %d", i)
				}

				want := reference(s, q, k, v, tokens)
				for i, x := range want {
					require.InDelta(t, x, float64(outC[i]), 1e-5, "out[%d]", i)
				}
				for h := range s.Heads {
					var sum float64
					for _, p := range scoresC[h*tokens : (h+1)*tokens] {
						sum += float64(p)
					}
					require.InDelta(t, 1, sum, 1e-5, "head %d's weights", h)
				}
			})
		}
	}
}

// TestBlockSizes: any block size gives Contiguous's numbers, a block of
// one token and a block larger than the sequence included.
func TestBlockSizes(t *testing.T) {
	s := Shape{Heads: 4, KVHeads: 2, HeadDim: 8}
	const tokens = 37
	rng := rand.New(rand.NewPCG(1, 2))
	q, k, v := make([]float32, 32), make([]float32, tokens*s.RowLen()), make([]float32, tokens*s.RowLen())
	fill(rng, q)
	fill(rng, k)
	fill(rng, v)
	want := make([]float32, 32)
	require.NoError(t, Contiguous(s, want, q, k, v, tokens, make([]float32, s.ScoresLen(tokens))))
	for _, bt := range []int{1, 2, 5, 16, 37, 64} {
		nblocks := (tokens + bt - 1) / bt
		kPool, vPool, table := paged(rng, s, k, v, tokens, bt, nblocks+1)
		got := make([]float32, 32)
		require.NoError(t, Paged(s, got, q, kPool, vPool, bt, table, tokens, make([]float32, s.ScoresLen(tokens))))
		require.Equal(t, want, got, "blocks of %d", bt)
	}
}

// TestNoAllocation: the kernels allocate nothing.
func TestNoAllocation(t *testing.T) {
	s := Shape{Heads: 8, KVHeads: 2, HeadDim: 16}
	const tokens = 40
	rng := rand.New(rand.NewPCG(3, 4))
	q, k, v := make([]float32, 128), make([]float32, tokens*s.RowLen()), make([]float32, tokens*s.RowLen())
	fill(rng, q)
	fill(rng, k)
	fill(rng, v)
	kPool, vPool, table := paged(rng, s, k, v, tokens, 16, 5)
	out, scores := make([]float32, 128), make([]float32, s.ScoresLen(tokens))
	require.Zero(t, testing.AllocsPerRun(10, func() {
		_ = Contiguous(s, out, q, k, v, tokens, scores)
	}))
	require.Zero(t, testing.AllocsPerRun(10, func() {
		_ = Paged(s, out, q, kPool, vPool, 16, table, tokens, scores)
	}))
}

// TestBadInput: every bad argument is ErrInvalid, and out is left as it
// was.
func TestBadInput(t *testing.T) {
	s := Shape{Heads: 4, KVHeads: 2, HeadDim: 8}
	const tokens = 20
	rl, w := s.RowLen(), 32
	q, k, v := make([]float32, w), make([]float32, tokens*rl), make([]float32, tokens*rl)
	pool := make([]float32, 3*16*rl)
	table := []int32{2, 0}
	scores := make([]float32, s.ScoresLen(tokens))
	out := make([]float32, w)
	for i := range out {
		out[i] = 7
	}
	calls := map[string]func() error{
		"zero shape":   func() error { return Contiguous(Shape{}, out, q, k, v, tokens, scores) },
		"negative dim": func() error { return Contiguous(Shape{4, 2, -8}, out, q, k, v, tokens, scores) },
		"heads not a multiple": func() error {
			return Contiguous(Shape{Heads: 3, KVHeads: 2, HeadDim: 8}, out, q, k, v, tokens, scores)
		},
		"overflowing shape": func() error {
			return Contiguous(Shape{Heads: 2, KVHeads: 2, HeadDim: math.MaxInt/2 + 1}, out, q, k, v, tokens, scores)
		},
		"no tokens":       func() error { return Contiguous(s, out, q, k, v, 0, scores) },
		"negative tokens": func() error { return Contiguous(s, out, q, k, v, -1, scores) },
		"short q":         func() error { return Contiguous(s, out, q[:w-1], k, v, tokens, scores) },
		"short out":       func() error { return Contiguous(s, out[:w-1], q, k, v, tokens, scores) },
		"short k":         func() error { return Contiguous(s, out, q, k[:len(k)-1], v, tokens, scores) },
		"short v":         func() error { return Contiguous(s, out, q, k, nil, tokens, scores) },
		"short scores":    func() error { return Contiguous(s, out, q, k, v, tokens, scores[:len(scores)-1]) },
		"paged zero block": func() error {
			return Paged(s, out, q, pool, pool, 0, table, tokens, scores)
		},
		"paged overflowing block": func() error {
			return Paged(s, out, q, pool, pool, math.MaxInt/2, table, tokens, scores)
		},
		"paged short table": func() error {
			return Paged(s, out, q, pool, pool, 16, table[:1], tokens, scores)
		},
		"paged block past the pool": func() error {
			return Paged(s, out, q, pool, pool, 16, []int32{0, 3}, tokens, scores)
		},
		"paged block past the shorter pool": func() error {
			return Paged(s, out, q, pool, pool[:2*16*rl], 16, table, tokens, scores)
		},
		"paged negative block": func() error {
			return Paged(s, out, q, pool, pool, 16, []int32{-1, 0}, tokens, scores)
		},
		"paged bad shape": func() error {
			return Paged(Shape{Heads: 4, KVHeads: 3, HeadDim: 8}, out, q, pool, pool, 16, table, tokens, scores)
		},
	}
	for name, call := range calls {
		err := call()
		require.ErrorIs(t, err, ErrInvalid, name)
		require.ErrorContains(t, err, "attention: ", name)
		for i := range out {
			require.Equal(t, float32(7), out[i], "%s: out changed", name)
		}
	}
	// The unread tail of a long table may hold anything.
	require.NoError(t, Paged(s, out, q, pool, pool, 16, []int32{2, 0, -5}, tokens, scores))
}
