package disagg

import (
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/internal/transformer"
	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/tensor"
)

// KV is where a model stores and loads a sequence's keys and values, per
// layer and position (the reference transformer's KV).
type KV = transformer.KV

// Model is what each side computes with: Step decodes token at position
// pos, storing its keys and values through kv (which holds positions
// 0..pos-1) and returning the logits that predict the next token. The
// reference transformer (internal/transformer) is one; it must be
// deterministic for the two sides to agree with one process.
type Model interface {
	Step(kv KV, pos, token int) ([]float32, error)
}

// seqKV is a cache sequence as a model's KV: Store writes into the rows
// the last Append handed out, Load reads the sequence's K and V.
type seqKV struct {
	seq  *kvcache.Seq
	step kvcache.Step
	// k[l][g], v[l][g] are layer l's keys and values of page group g
	// (TokenMajor; PerLayer has one group, every position) as of the last
	// Append, read from the cache on the first Load after it. They alias
	// the cache's memory: valid while the sequence runs, and dropped at
	// every Append.
	k, v [][][]float32
	tpg  int // positions a group holds; 0: one group (PerLayer)
}

func newSeqKV(s *kvcache.Seq, layers, tpg int) *seqKV {
	return &seqKV{seq: s, k: make([][][]float32, layers), v: make([][][]float32, layers), tpg: tpg}
}

// appended takes the views of the rows an Append made room for.
func (a *seqKV) appended(step kvcache.Step) {
	a.step = step
	clear(a.k)
	clear(a.v)
}

func (a *seqKV) Store(layer, pos int, k, v []float32) error {
	if layer < 0 || layer >= len(a.step.Layers) {
		return errors.AssertionFailedf("disagg: store of layer %d of %d", layer, len(a.step.Layers))
	}
	for _, r := range a.step.Layers[layer] {
		if n := r.K.Shape()[0]; pos < r.Pos || pos >= r.Pos+n {
			continue
		}
		for _, x := range [2]struct {
			dst *tensor.Tensor
			src []float32
		}{{r.K, k}, {r.V, v}} {
			d, err := tensor.Data[float32](x.dst)
			if err != nil {
				return err
			}
			copy(d[(pos-r.Pos)*len(x.src):], x.src)
		}
		return nil
	}
	return errors.AssertionFailedf("disagg: position %d is not among the rows the last Append handed out (%d from %d)",
		pos, a.step.N, a.step.Pos)
}

func (a *seqKV) Load(layer, pos int, k, v []float32) error {
	if layer < 0 || layer >= len(a.k) {
		return errors.AssertionFailedf("disagg: load of layer %d of %d", layer, len(a.k))
	}
	if a.k[layer] == nil {
		for _, x := range [2]struct {
			get func(int) (*tensor.Tensor, error)
			dst *[][]float32
		}{{a.seq.K, &a.k[layer]}, {a.seq.V, &a.v[layer]}} {
			t, err := x.get(layer)
			if err != nil {
				return err
			}
			if *x.dst, err = groups(t, a.tpg); err != nil {
				return err
			}
		}
	}
	g, j := 0, pos
	if a.tpg > 0 {
		g, j = pos/a.tpg, pos%a.tpg
	}
	w := len(k)
	if g >= len(a.k[layer]) || (j+1)*w > len(a.k[layer][g]) {
		return errors.AssertionFailedf("disagg: load of position %d beyond the sequence's rows", pos)
	}
	copy(k, a.k[layer][g][j*w:])
	copy(v, a.v[layer][g][j*w:])
	return nil
}

// groups are t's rows as float32 slices: PerLayer's t [tokens, heads,
// dim] whole (tpg 0); TokenMajor's [groups, tpg, heads, dim] one slice a
// group, each contiguous.
func groups(t *tensor.Tensor, tpg int) ([][]float32, error) {
	if tpg == 0 {
		d, err := tensor.Data[float32](t)
		return [][]float32{d}, err
	}
	out := make([][]float32, t.Shape()[0])
	for g := range out {
		gt, err := t.Narrow(0, g, 1)
		if err != nil {
			return nil, err
		}
		if out[g], err = tensor.Data[float32](gt); err != nil {
			return nil, err
		}
	}
	return out, nil
}
