package transformer

import (
	"github.com/vmarena/vmarena/internal/errors"
)

// MemKV is the simplest KV: Go slices, grown as positions arrive. Tests
// use it as the store that cannot be wrong, next to the cache under test.
// It is not safe for concurrent use.
type MemKV struct {
	layers, width int
	// k[l][p*width:(p+1)*width] is layer l's keys of position p, valid when
	// stored[l][p]; likewise v. Invariant: len(k[l]) == len(v[l]) ==
	// len(stored[l])*width.
	k, v   [][]float32
	stored [][]bool
}

// NewMemKV returns an empty MemKV for models of cfg's shape (zero fields
// take their defaults, as in New).
func NewMemKV(cfg Config) (*MemKV, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &MemKV{
		layers: cfg.Layers, width: cfg.KVWidth(),
		k: make([][]float32, cfg.Layers), v: make([][]float32, cfg.Layers),
		stored: make([][]bool, cfg.Layers),
	}, nil
}

// check refuses a nil MemKV, a layer or position out of range (positions
// are bounded as Step bounds them) and slices of the wrong length.
func (s *MemKV) check(op string, layer, pos int, k, v []float32) error {
	if s == nil {
		return errors.Wrapf(ErrInvalid, "transformer: %s on a nil *MemKV", errors.Safe(op))
	}
	if layer < 0 || layer >= s.layers {
		return errors.Wrapf(ErrInvalid, "transformer: MemKV %s of layer %d; layers are 0..%d",
			errors.Safe(op), errors.Safe(layer), errors.Safe(s.layers-1))
	}
	if last := maxLoaded/s.width - 1; pos < 0 || pos > last {
		return errors.Wrapf(ErrInvalid, "transformer: MemKV %s of position %d; positions are 0..%d",
			errors.Safe(op), errors.Safe(pos), errors.Safe(last))
	}
	if len(k) != s.width || len(v) != s.width {
		return errors.Wrapf(ErrInvalid, "transformer: MemKV %s with %d keys and %d values; want %d each (KVHeads*HeadDim)",
			errors.Safe(op), errors.Safe(len(k)), errors.Safe(len(v)), errors.Safe(s.width))
	}
	return nil
}

// Store keeps copies of k and v as layer's keys and values of pos,
// replacing any stored before.
func (s *MemKV) Store(layer, pos int, k, v []float32) error {
	if err := s.check("Store", layer, pos, k, v); err != nil {
		return err
	}
	if n := pos + 1; n > len(s.stored[layer]) {
		grow := n - len(s.stored[layer])
		s.stored[layer] = append(s.stored[layer], make([]bool, grow)...)
		s.k[layer] = append(s.k[layer], make([]float32, grow*s.width)...)
		s.v[layer] = append(s.v[layer], make([]float32, grow*s.width)...)
	}
	copy(s.k[layer][pos*s.width:], k)
	copy(s.v[layer][pos*s.width:], v)
	s.stored[layer][pos] = true
	return nil
}

// Load copies layer's keys and values of pos into k and v; a position
// never stored is an error.
func (s *MemKV) Load(layer, pos int, k, v []float32) error {
	if err := s.check("Load", layer, pos, k, v); err != nil {
		return err
	}
	if pos >= len(s.stored[layer]) || !s.stored[layer][pos] {
		return errors.Wrapf(ErrInvalid, "transformer: MemKV Load of layer %d position %d, which was never stored",
			errors.Safe(layer), errors.Safe(pos))
	}
	copy(k, s.k[layer][pos*s.width:(pos+1)*s.width])
	copy(v, s.v[layer][pos*s.width:(pos+1)*s.width])
	return nil
}

// Len is the number of positions stored in every layer from 0 on: the
// length of the sequence the store holds whole.
func (s *MemKV) Len() int {
	if s == nil {
		return 0
	}
	n := -1
	for _, st := range s.stored {
		i := 0
		for i < len(st) && st[i] {
			i++
		}
		if n < 0 || i < n {
			n = i
		}
	}
	return max(n, 0)
}
