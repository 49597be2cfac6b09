package transformer

import (
	"reflect"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/internal/attention"
)

// KV stores the keys and values of a sequence's tokens, per layer: what a
// KV cache keeps for one sequence. Step writes through it and reads back
// through it, so a cache implementing it is checked on everything it
// returns, the current token included.
type KV interface {
	// Store writes token pos's keys and values of layer (len KVHeads*HeadDim
	// each, the heads side by side). The slices are the caller's: copy them.
	Store(layer, pos int, k, v []float32) error
	// Load reads them back into k and v (len KVHeads*HeadDim each).
	Load(layer, pos int, k, v []float32) error
}

// Step decodes one token: token at position pos, whose predecessors'
// keys and values (positions 0..pos-1) kv already holds for every layer.
// For each layer it computes the token's keys and values, stores them
// through kv, then loads positions 0..pos back through kv and attends over
// them. It returns the logits that predict the next token: within
// tolerance of Forward(sequence[:pos+1])[pos].
//
// Positions run from 0 to a bound that keeps one step's loaded keys and
// values within 1 GiB each (524287 with the default configuration).
//
// A KV error stops the step at once and comes back wrapped (errors.Is
// finds it), naming the layer and position; kv may then hold this token's
// keys and values for some layers and not others. A panic in kv reaches
// the caller: Step keeps no state of its own.
func (m *Model) Step(kv KV, pos int, token int) ([]float32, error) {
	if err := m.checkStep(kv, pos); err != nil {
		return nil, err
	}
	if err := m.checkToken(-1, token); err != nil {
		return nil, err
	}
	cfg := m.cfg
	w, kw, d := cfg.Width(), cfg.KVWidth(), cfg.HeadDim
	group := cfg.Heads / cfg.KVHeads
	x := make([]float32, w)
	copy(x, m.embed.w[token*w:(token+1)*w])
	rot := rotaryAt(pos, d)
	s := m.newScratch()
	q, k, v, att := make([]float32, w), make([]float32, kw), make([]float32, kw), make([]float32, w)
	// keys[j], values[j]: position j's as loaded; one allocation for all
	// layers of the step.
	keys, values := make([]float32, (pos+1)*kw), make([]float32, (pos+1)*kw)
	scores := make([]float32, pos+1)
	for l := range m.layers {
		m.project(l, x, rot, s.h, q, k, v)
		if err := kv.Store(l, pos, k, v); err != nil {
			return nil, errors.Wrapf(err, "transformer: step at position %d: storing layer %d", errors.Safe(pos), errors.Safe(l))
		}
		for j := 0; j <= pos; j++ {
			if err := kv.Load(l, j, keys[j*kw:(j+1)*kw], values[j*kw:(j+1)*kw]); err != nil {
				return nil, errors.Wrapf(err, "transformer: step at position %d: loading layer %d position %d",
					errors.Safe(pos), errors.Safe(l), errors.Safe(j))
			}
		}
		for hd := range cfg.Heads {
			qo, ko := hd*d, (hd/group)*d
			for j := range scores {
				scores[j] = attention.Dot(q[qo:qo+d], keys[j*kw+ko:j*kw+ko+d]) * m.scale
			}
			softmax(scores)
			out := att[qo : qo+d]
			clear(out)
			for j, p := range scores {
				attention.Axpy(out, p, values[j*kw+ko:j*kw+ko+d])
			}
		}
		m.finish(l, x, att, s)
	}
	return m.logits(x, s), nil
}

// Prefill runs Step for tokens at positions start, start+1, ... in turn
// (kv holding positions 0..start-1 already) and returns each position's
// logits. It stops at the first error, which names the position; kv then
// holds the positions before it.
func (m *Model) Prefill(kv KV, tokens []int, start int) ([][]float32, error) {
	if err := m.checkStep(kv, start); err != nil {
		return nil, err
	}
	if len(tokens) > 0 {
		if err := m.checkStep(kv, start+len(tokens)-1); err != nil {
			return nil, err
		}
	}
	for i, t := range tokens {
		if err := m.checkToken(i, t); err != nil {
			return nil, err
		}
	}
	logits := make([][]float32, len(tokens))
	for i, t := range tokens {
		var err error
		if logits[i], err = m.Step(kv, start+i, t); err != nil {
			return nil, err
		}
	}
	return logits, nil
}

// maxLoaded bounds the keys (and as many values) one step loads, in
// float32s: a step at position pos holds (pos+1)*KVWidth of each at once.
const maxLoaded = 1 << 28

// maxPosition is the last position Step accepts: the keys and values it
// loads for one step stay within 1 GiB each (524287 with the default
// configuration).
func (m *Model) maxPosition() int { return maxLoaded/m.cfg.KVWidth() - 1 }

// checkStep refuses a nil model, a nil (or typed nil) KV and a position
// that is negative or past maxPosition.
func (m *Model) checkStep(kv KV, pos int) error {
	if m == nil {
		return errors.Wrap(ErrInvalid, "transformer: step on a nil *Model")
	}
	if isNil(kv) {
		return errors.Wrapf(ErrInvalid, "transformer: step with a nil KV (%T)", kv)
	}
	if pos < 0 {
		return errors.Wrapf(ErrInvalid, "transformer: step at position %d; positions start at 0", errors.Safe(pos))
	}
	if last := m.maxPosition(); pos > last {
		return errors.Wrapf(ErrInvalid, "transformer: step at position %d; this model's last position is %d",
			errors.Safe(pos), errors.Safe(last))
	}
	return nil
}

// isNil reports whether v is nil or an interface holding a nil pointer,
// map, slice, channel or function, whose first method call would panic.
// (internal/isnil says the same; this package imports no other vmarena
// package, so it keeps its own three lines.)
func isNil(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Chan, reflect.Func, reflect.Interface:
		return rv.IsNil()
	}
	return false
}

// Greedy is the token greedy decoding picks from logits: the index of the
// largest, the first of equals; 0 for no logits.
func Greedy(logits []float32) int {
	best := 0
	for i, x := range logits {
		if x > logits[best] {
			best = i
		}
	}
	return best
}
