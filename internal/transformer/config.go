package transformer

import (
	"github.com/vmarena/vmarena/internal/errors"
)

// ErrInvalid marks every error about a bad argument: a configuration New
// refuses, a token outside the vocabulary, a negative position, a nil
// model or KV. Errors a KV returns are wrapped as they are, not marked.
var ErrInvalid = errors.New("transformer: invalid argument")

// Config is the shape of a model. A zero field takes its default (see
// DefaultConfig); a negative one is refused.
type Config struct {
	Layers  int // transformer blocks (default 4)
	Heads   int // query heads (default 8)
	KVHeads int // key/value heads; Heads must be a multiple (default: Heads)
	HeadDim int // dimension of one head, even for the rotary pairs (default 64)
	Vocab   int // token ids are 0..Vocab-1 (default 256)
	Hidden  int // MLP hidden size (default 2*Heads*HeadDim)
}

// Bounds that keep a configuration's arithmetic far from overflow and its
// weights within memory a test machine has: a field above maxDim, or a
// model of more than maxParams weights (4 GiB of float32), is refused.
const (
	maxDim    = 1 << 20
	maxParams = 1 << 30
)

// DefaultConfig is the configuration of Config{}: 4 layers, 8 heads and 8
// key/value heads of dimension 64 (width 512), vocabulary 256, MLP hidden
// size 1024 — the shape of kvcache's "tiny" preset.
func DefaultConfig() Config {
	c, _ := Config{}.withDefaults()
	return c
}

// Width is the model's residual width, Heads*HeadDim.
func (c Config) Width() int { return c.Heads * c.HeadDim }

// KVWidth is the length of one token's keys (or values) for one layer,
// KVHeads*HeadDim: what KV.Store and KV.Load take.
func (c Config) KVWidth() int { return c.KVHeads * c.HeadDim }

// withDefaults fills the zero fields and checks the result.
func (c Config) withDefaults() (Config, error) {
	for _, f := range []struct {
		name string
		v    int
	}{
		{"Layers", c.Layers}, {"Heads", c.Heads}, {"KVHeads", c.KVHeads},
		{"HeadDim", c.HeadDim}, {"Vocab", c.Vocab}, {"Hidden", c.Hidden},
	} {
		if f.v < 0 {
			return c, errors.Wrapf(ErrInvalid, "transformer: config %s is %d; want a positive value (or 0 for the default)",
				errors.Safe(f.name), errors.Safe(f.v))
		}
		if f.v > maxDim {
			return c, errors.Wrapf(ErrInvalid, "transformer: config %s is %d; at most %d",
				errors.Safe(f.name), errors.Safe(f.v), errors.Safe(maxDim))
		}
	}
	if c.Layers == 0 {
		c.Layers = 4
	}
	if c.Heads == 0 {
		c.Heads = 8
	}
	if c.KVHeads == 0 {
		c.KVHeads = c.Heads
	}
	if c.HeadDim == 0 {
		c.HeadDim = 64
	}
	if c.Vocab == 0 {
		c.Vocab = 256
	}
	if c.HeadDim%2 != 0 {
		return c, errors.WithHint(errors.Wrapf(ErrInvalid, "transformer: config HeadDim is %d; it must be even",
			errors.Safe(c.HeadDim)), "rotary embeddings rotate pairs of dimensions")
	}
	if c.KVHeads > c.Heads || c.Heads%c.KVHeads != 0 {
		return c, errors.WithHint(errors.Wrapf(ErrInvalid, "transformer: config has %d heads over %d KV heads; heads must be a multiple of KV heads",
			errors.Safe(c.Heads), errors.Safe(c.KVHeads)), "each group of Heads/KVHeads query heads shares one key/value head")
	}
	if c.Width() > maxDim {
		return c, errors.Wrapf(ErrInvalid, "transformer: config width Heads*HeadDim is %d*%d = %d; at most %d",
			errors.Safe(c.Heads), errors.Safe(c.HeadDim), errors.Safe(c.Width()), errors.Safe(maxDim))
	}
	if c.Hidden == 0 {
		c.Hidden = 2 * c.Width()
	}
	// Every factor is at most maxDim = 2^20, so each product below fits in
	// 62 bits before the comparison.
	perLayer := uint64(c.Width())*uint64(c.Width()+2*c.KVWidth()) + // q, k, v
		uint64(c.Width())*uint64(c.Width()) + // output projection
		3*uint64(c.Width())*uint64(c.Hidden) + // gate, up, down
		2*uint64(c.Width()) // the two norms' gains
	if perLayer > maxParams || uint64(c.Layers)*perLayer+2*uint64(c.Vocab)*uint64(c.Width()) > maxParams {
		return c, errors.Wrapf(ErrInvalid, "transformer: config %+v needs more than %d weights", errors.Safe(c), errors.Safe(maxParams))
	}
	return c, nil
}
