package transformer

import (
	"math"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/internal/attention"
)

// Model is a transformer with fixed weights. It is immutable after New:
// safe for concurrent use, by Forward and by Steps over different KVs.
type Model struct {
	cfg       Config
	embed     matrix // Vocab × Width: row t is token t's embedding
	layers    []layer
	finalNorm []float32 // Width gains
	out       matrix    // Vocab × Width: the output head, untied from embed
	scale     float32   // 1/sqrt(HeadDim), the attention scores' scale
}

// layer is one block's weights. Invariant: every matrix's shape is the one
// its comment gives, for the model's Config.
type layer struct {
	attnNorm []float32 // Width gains
	wq       matrix    // Width × Width (Heads*HeadDim outputs)
	wk, wv   matrix    // KVWidth × Width
	wo       matrix    // Width × Width
	mlpNorm  []float32 // Width gains
	gate, up matrix    // Hidden × Width
	down     matrix    // Width × Hidden
}

// New builds the model of cfg (zero fields take their defaults) with
// weights drawn from seed. The same cfg and seed always give the same
// weights, on every platform: they come from an integer generator of this
// package (splitmix64), not from math/rand, whose streams may change.
func New(cfg Config, seed uint64) (*Model, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	w, kw := cfg.Width(), cfg.KVWidth()
	r := &splitMix{state: seed}
	m := &Model{cfg: cfg, scale: float32(1 / math.Sqrt(float64(cfg.HeadDim)))}
	// Embeddings are uniform in [-1, 1); each projection's entries have
	// variance 1/fan-in, so activations stay of order one through the
	// blocks; norm gains are near 1. The output head gets one more factor
	// 1/sqrt(3) (variance 1/(3*Width)) so logits have a spread below one.
	m.embed = r.matrix(cfg.Vocab, w, 1)
	m.layers = make([]layer, cfg.Layers)
	for i := range m.layers {
		m.layers[i] = layer{
			attnNorm: r.gains(w),
			wq:       r.matrix(w, w, fanIn(w)),
			wk:       r.matrix(kw, w, fanIn(w)),
			wv:       r.matrix(kw, w, fanIn(w)),
			wo:       r.matrix(w, w, fanIn(w)),
			mlpNorm:  r.gains(w),
			gate:     r.matrix(cfg.Hidden, w, fanIn(w)),
			up:       r.matrix(cfg.Hidden, w, fanIn(w)),
			down:     r.matrix(w, cfg.Hidden, fanIn(cfg.Hidden)),
		}
	}
	m.finalNorm = r.gains(w)
	m.out = r.matrix(cfg.Vocab, w, fanIn(w)/math.Sqrt(3))
	return m, nil
}

// Config returns the model's configuration, defaults filled in (the zero
// Config for a nil *Model, which every other method refuses).
func (m *Model) Config() Config {
	if m == nil {
		return Config{}
	}
	return m.cfg
}

// fanIn is the half-width of a uniform distribution of variance 1/n:
// uniform on [-a, a) has variance a²/3.
func fanIn(n int) float64 { return math.Sqrt(3 / float64(n)) }

// splitMix is the splitmix64 generator: a 64-bit counter stepped by the
// golden ratio and mixed. Its stream is fixed by its definition, which is
// what makes a seed's weights the same everywhere.
type splitMix struct{ state uint64 }

func (r *splitMix) next() uint64 {
	r.state += 0x9e3779b97f4a7c15
	z := r.state
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// uniform is in [-1, 1), a multiple of 2^-23 (exact in float32).
func (r *splitMix) uniform() float32 {
	return float32(r.next()>>40)/(1<<23) - 1
}

// matrix draws a rows×cols matrix uniform in [-a, a).
func (r *splitMix) matrix(rows, cols int, a float64) matrix {
	m := matrix{rows: rows, cols: cols, w: make([]float32, rows*cols)}
	fa := float32(a)
	for i := range m.w {
		m.w[i] = r.uniform() * fa
	}
	return m
}

// gains draws n norm gains uniform in [0.9, 1.1). The conversion rounds
// the product before the sum: without it Go may fuse the two into one
// multiply-add on some platforms, and the weights would differ there.
func (r *splitMix) gains(n int) []float32 {
	g := make([]float32, n)
	for i := range g {
		g[i] = 1 + float32(0.1*r.uniform())
	}
	return g
}

// checkToken refuses a token id outside the vocabulary; i is its index in
// the caller's sequence, or -1 for a lone token.
func (m *Model) checkToken(i, token int) error {
	if token >= 0 && token < m.cfg.Vocab {
		return nil
	}
	if i < 0 {
		return errors.Wrapf(ErrInvalid, "transformer: token %d is outside the vocabulary 0..%d",
			errors.Safe(token), errors.Safe(m.cfg.Vocab-1))
	}
	return errors.Wrapf(ErrInvalid, "transformer: token %d (index %d) is outside the vocabulary 0..%d",
		errors.Safe(token), errors.Safe(i), errors.Safe(m.cfg.Vocab-1))
}

// project computes one token's queries, keys and values for layer l from
// its residual x, rotated for its position: the part of a block before
// attention, shared by Forward and Step. h is Width scratch.
func (m *Model) project(l int, x []float32, rot rotary, h, q, k, v []float32) {
	ly := &m.layers[l]
	rmsNorm(h, x, ly.attnNorm)
	ly.wq.apply(q, h)
	ly.wk.apply(k, h)
	ly.wv.apply(v, h)
	rot.rotate(q)
	rot.rotate(k)
}

// finish completes layer l for one token once attention has produced att
// (Width values, the heads side by side): the output projection and MLP,
// each added to the residual x. s is scratch.
func (m *Model) finish(l int, x, att []float32, s *scratch) {
	ly := &m.layers[l]
	ly.wo.apply(s.h, att)
	add(x, s.h)
	rmsNorm(s.h, x, ly.mlpNorm)
	ly.gate.apply(s.gate, s.h)
	ly.up.apply(s.up, s.h)
	for i, g := range s.gate {
		s.gate[i] = silu(g) * s.up[i]
	}
	ly.down.apply(s.h, s.gate)
	add(x, s.h)
}

// logits computes the output head's Vocab logits from the final residual x.
func (m *Model) logits(x []float32, s *scratch) []float32 {
	rmsNorm(s.h, x, m.finalNorm)
	out := make([]float32, m.cfg.Vocab)
	m.out.apply(out, s.h)
	return out
}

// scratch is one token's working space.
type scratch struct {
	h        []float32 // Width
	gate, up []float32 // Hidden
}

func (m *Model) newScratch() *scratch {
	return &scratch{
		h:    make([]float32, m.cfg.Width()),
		gate: make([]float32, m.cfg.Hidden),
		up:   make([]float32, m.cfg.Hidden),
	}
}

// Forward computes the logits of every position of tokens (Vocab values
// each; logits[i] predicts the token after tokens[i]) by full causal
// attention over the whole sequence, with no cache: each layer computes
// every position's keys and values afresh and a T×T score matrix per head
// with the positions after the query masked out. It is the reference the
// KV cache is checked against.
func (m *Model) Forward(tokens []int) ([][]float32, error) {
	if m == nil {
		return nil, errors.Wrap(ErrInvalid, "transformer: Forward on a nil *Model")
	}
	if len(tokens) == 0 {
		return nil, errors.Wrap(ErrInvalid, "transformer: Forward of no tokens")
	}
	for i, t := range tokens {
		if err := m.checkToken(i, t); err != nil {
			return nil, err
		}
	}
	cfg := m.cfg
	n, w, kw, d := len(tokens), cfg.Width(), cfg.KVWidth(), cfg.HeadDim
	group := cfg.Heads / cfg.KVHeads
	rows := func(width int) [][]float32 {
		flat := make([]float32, n*width)
		r := make([][]float32, n)
		for i := range r {
			r[i] = flat[i*width : (i+1)*width]
		}
		return r
	}
	x, q, k, v, att := rows(w), rows(w), rows(kw), rows(kw), rows(w)
	rots := make([]rotary, n)
	for i, t := range tokens {
		copy(x[i], m.embed.w[t*w:(t+1)*w])
		rots[i] = rotaryAt(i, d)
	}
	s := m.newScratch()
	scores := make([]float32, n)
	for l := range m.layers {
		for i := range n {
			m.project(l, x[i], rots[i], s.h, q[i], k[i], v[i])
		}
		for hd := range cfg.Heads {
			qo, ko := hd*d, (hd/group)*d
			for i := range n {
				for j := range n {
					if j > i {
						scores[j] = float32(math.Inf(-1)) // causal mask
						continue
					}
					scores[j] = attention.Dot(q[i][qo:qo+d], k[j][ko:ko+d]) * m.scale
				}
				softmax(scores)
				out := att[i][qo : qo+d]
				clear(out)
				for j := 0; j <= i; j++ {
					attention.Axpy(out, scores[j], v[j][ko:ko+d])
				}
			}
		}
		for i := range n {
			m.finish(l, x[i], att[i], s)
		}
	}
	logits := make([][]float32, n)
	for i := range n {
		logits[i] = m.logits(x[i], s)
	}
	return logits, nil
}
