// Package attention is decode attention in plain Go, float32: one query
// token attending over the cached keys and values of one sequence's tokens,
// for one layer. It comes in the two layouts serving engines keep a KV
// cache in:
//
//   - Contiguous: the sequence's keys (and values) are one row-major
//     [tokens, KVHeads, HeadDim] tensor, as the KV cache's per-layer layout
//     gives them (vAttention's way: virtually contiguous memory).
//   - Paged: they lie in fixed-size blocks of a shared pool
//     [blocks, BlockTokens, KVHeads, HeadDim], and a block table maps the
//     sequence's logical block i to a physical block of the pool (vLLM's
//     way). The kernel walks the table a block at a time, as vLLM's does.
//
// Both forms run the same code over runs of consecutive tokens — the whole
// sequence for Contiguous, one block at a time for Paged — so every score
// and every output element is computed from the same numbers in the same
// order: the same keys and values give bit-identical outputs in both
// layouts, and what differs between them is the layout's cost alone (the
// block table, the jumps between blocks). That is what a benchmark
// comparing them measures.
//
// The arithmetic, per query head h reading key/value head g = h/(Heads/KVHeads)
// (grouped-query attention when KVHeads < Heads): score[t] = (q_h · k[t,g]) *
// 1/sqrt(HeadDim), the dot in four interleaved partial sums; softmax over t
// with the maximum subtracted, the exponentials and their sum in float64;
// out_h = Σ_t weight[t] * v[t,g], accumulated in token order.
//
// What it never does: import another vmarena package (it is layer 0, so
// benchmarks and the KV cache can both use it), allocate (the caller passes
// the scratch for the scores), keep state between calls, or reorder a sum
// for speed.
package attention

import (
	"math"

	"github.com/vmarena/vmarena/internal/errors"
)

// ErrInvalid marks every error about a bad argument: a shape, a slice too
// short for the tokens asked, a block table entry outside the pool.
var ErrInvalid = errors.New("attention: invalid argument")

// Shape is the shape of one layer's attention. Query head h reads
// key/value head h/(Heads/KVHeads).
type Shape struct {
	Heads   int // query heads: q and out hold Heads*HeadDim values
	KVHeads int // key/value heads; Heads must be a multiple of it
	HeadDim int // values per head
}

// RowLen is the number of values one token holds in K (or V):
// KVHeads*HeadDim.
func (s Shape) RowLen() int { return s.KVHeads * s.HeadDim }

// ScoresLen is the length of the scratch Contiguous and Paged need for
// tokens tokens: Heads*tokens.
func (s Shape) ScoresLen(tokens int) int { return s.Heads * tokens }

// Contiguous sets out (Heads*HeadDim values) to the attention of q
// (Heads*HeadDim values, the query heads side by side) over the first
// tokens tokens of k and v, each row-major [tokens, KVHeads, HeadDim]
// (longer slices are fine: the rest is not read). scores is scratch of at
// least s.ScoresLen(tokens) values; on return scores[h*tokens+t] is query
// head h's weight of token t. tokens must be at least 1.
func Contiguous(s Shape, out, q, k, v []float32, tokens int, scores []float32) error {
	if err := s.check(out, q, tokens, scores); err != nil {
		return err
	}
	rl := s.RowLen()
	for _, side := range []struct {
		name string
		x    []float32
	}{{"k", k}, {"v", v}} {
		if len(side.x)/rl < tokens {
			return errors.Wrapf(ErrInvalid, "attention: %s holds %d values, %d tokens of %d (KVHeads*HeadDim) need %d",
				errors.Safe(side.name), errors.Safe(len(side.x)), errors.Safe(tokens), errors.Safe(rl), errors.Safe(tokens*rl))
		}
	}
	scores = scores[:s.ScoresLen(tokens)]
	scale := s.scale()
	scoreRun(s, scale, q, k[:tokens*rl], 0, tokens, scores)
	softmaxHeads(s.Heads, tokens, scores)
	clear(out[:s.Heads*s.HeadDim])
	valueRun(s, out, v[:tokens*rl], 0, tokens, scores)
	return nil
}

// Paged is Contiguous over a paged cache: kPool and vPool are pools of
// blocks, each row-major [blocks, blockTokens, KVHeads, HeadDim], and
// table[i] is the pool block that holds the sequence's tokens
// i*blockTokens .. (i+1)*blockTokens-1. The first ceil(tokens/blockTokens)
// entries of table are read (each must name a block of both pools); the
// last block may be partly filled. Given the same keys and values, out and
// scores are bit for bit those of Contiguous.
func Paged(s Shape, out, q, kPool, vPool []float32, blockTokens int, table []int32, tokens int, scores []float32) error {
	if err := s.check(out, q, tokens, scores); err != nil {
		return err
	}
	if blockTokens < 1 {
		return errors.Wrapf(ErrInvalid, "attention: %d tokens a block; at least 1", errors.Safe(blockTokens))
	}
	rl := s.RowLen()
	if blockTokens > math.MaxInt/rl {
		return errors.Wrapf(ErrInvalid, "attention: blocks of %d tokens of %d values overflow an int", errors.Safe(blockTokens), errors.Safe(rl))
	}
	blockLen := blockTokens * rl
	nblocks := (tokens-1)/blockTokens + 1
	if len(table) < nblocks {
		return errors.Wrapf(ErrInvalid, "attention: the block table has %d entries, %d tokens in blocks of %d need %d",
			errors.Safe(len(table)), errors.Safe(tokens), errors.Safe(blockTokens), errors.Safe(nblocks))
	}
	poolBlocks := min(len(kPool), len(vPool)) / blockLen
	for i, b := range table[:nblocks] {
		if b < 0 || int(b) >= poolBlocks {
			return errors.WithHint(errors.Wrapf(ErrInvalid, "attention: block table entry %d is %d; the pools hold blocks 0..%d",
				errors.Safe(i), errors.Safe(b), errors.Safe(poolBlocks-1)),
				"a pool holds len/(blockTokens*KVHeads*HeadDim) whole blocks; the shorter of K's and V's counts")
		}
	}
	scores = scores[:s.ScoresLen(tokens)]
	scale := s.scale()
	for i, b := range table[:nblocks] {
		t0 := i * blockTokens
		n := min(blockTokens, tokens-t0)
		base := int(b) * blockLen
		scoreRun(s, scale, q, kPool[base:base+n*rl], t0, n, scores)
	}
	softmaxHeads(s.Heads, tokens, scores)
	clear(out[:s.Heads*s.HeadDim])
	for i, b := range table[:nblocks] {
		t0 := i * blockTokens
		n := min(blockTokens, tokens-t0)
		base := int(b) * blockLen
		valueRun(s, out, vPool[base:base+n*rl], t0, n, scores)
	}
	return nil
}

// check checks what both forms take: the shape, out, q, tokens and the
// scratch.
func (s Shape) check(out, q []float32, tokens int, scores []float32) error {
	if s.Heads < 1 || s.KVHeads < 1 || s.HeadDim < 1 {
		return errors.Wrapf(ErrInvalid, "attention: shape %+v; every field must be positive", errors.Safe(s))
	}
	if s.Heads%s.KVHeads != 0 {
		return errors.WithHint(errors.Wrapf(ErrInvalid, "attention: %d query heads over %d KV heads", errors.Safe(s.Heads), errors.Safe(s.KVHeads)),
			"query heads must be a multiple of KV heads")
	}
	if s.Heads > math.MaxInt/s.HeadDim || s.KVHeads > math.MaxInt/s.HeadDim {
		return errors.Wrapf(ErrInvalid, "attention: shape %+v overflows an int", errors.Safe(s))
	}
	if tokens < 1 {
		return errors.Wrapf(ErrInvalid, "attention: over %d tokens; at least 1 (softmax needs a score)", errors.Safe(tokens))
	}
	w := s.Heads * s.HeadDim
	if len(q) < w || len(out) < w {
		return errors.Wrapf(ErrInvalid, "attention: q holds %d values and out %d; Heads*HeadDim = %d each",
			errors.Safe(len(q)), errors.Safe(len(out)), errors.Safe(w))
	}
	if len(scores)/s.Heads < tokens {
		return errors.Wrapf(ErrInvalid, "attention: scores scratch holds %d values; %d heads over %d tokens need %d",
			errors.Safe(len(scores)), errors.Safe(s.Heads), errors.Safe(tokens), errors.Safe(s.Heads*tokens))
	}
	return nil
}

// scale is 1/sqrt(HeadDim), the scores' scale.
func (s Shape) scale() float32 { return float32(1 / math.Sqrt(float64(s.HeadDim))) }

// scoreRun sets the scaled scores of n consecutive tokens t0..t0+n-1 whose
// key rows are k (n rows of RowLen values): scores[h*T+t] for every query
// head h, T = len(scores)/Heads. Token by token, so each key row is read
// from memory once and reused from cache by every query head of its group.
func scoreRun(s Shape, scale float32, q, k []float32, t0, n int, scores []float32) {
	d, rl := s.HeadDim, s.RowLen()
	group := s.Heads / s.KVHeads
	total := len(scores) / s.Heads
	for i := range n {
		row := k[i*rl : (i+1)*rl]
		for h := range s.Heads {
			g := h / group
			scores[h*total+t0+i] = Dot(q[h*d:(h+1)*d], row[g*d:(g+1)*d]) * scale
		}
	}
}

// valueRun adds to out the weighted values of n consecutive tokens
// t0..t0+n-1 whose value rows are v: out_h += weight[h][t] * v[t,g].
func valueRun(s Shape, out, v []float32, t0, n int, scores []float32) {
	d, rl := s.HeadDim, s.RowLen()
	group := s.Heads / s.KVHeads
	total := len(scores) / s.Heads
	for i := range n {
		row := v[i*rl : (i+1)*rl]
		for h := range s.Heads {
			g := h / group
			Axpy(out[h*d:(h+1)*d], scores[h*total+t0+i], row[g*d:(g+1)*d])
		}
	}
}

// softmaxHeads turns each head's tokens scores into weights summing to
// one, in place.
func softmaxHeads(heads, tokens int, scores []float32) {
	for h := range heads {
		softmax(scores[h*tokens : (h+1)*tokens])
	}
}

// softmax turns scores (at least one, all finite) into weights summing to
// one, in place: the maximum subtracted, exponentials and their sum in
// float64.
func softmax(scores []float32) {
	m := scores[0]
	for _, x := range scores[1:] {
		m = max(m, x)
	}
	var sum float64
	for i, x := range scores {
		e := math.Exp(float64(x - m))
		scores[i] = float32(e)
		sum += e
	}
	inv := float32(1 / sum)
	for i := range scores {
		scores[i] *= inv
	}
}

// Dot is a·b over len(a) values, in four interleaved partial sums: the
// summation order every kernel of this package and internal/transformer
// shares, so that their results agree bit for bit. len(b) >= len(a).
func Dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// Axpy adds a*x to y. len(x) >= len(y).
func Axpy(y []float32, a float32, x []float32) {
	x = x[:len(y)]
	for i := range y {
		y[i] += a * x[i]
	}
}
