package disagg

import (
	"context"
	"fmt"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/lockrank"
	"github.com/vmarena/vmarena/internal/transformer"
	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/tensor"
)

// Result is what decoding one request gave.
type Result struct {
	// Tokens are the tokens generated: the handoff's First, then one per
	// decode step.
	Tokens []int
	// Logits[i] are the logits decode step i computed, which chose
	// Tokens[i+1].
	Logits [][]float32
	// Units is the prompt's units; Cached of them were in the decode
	// cache's prefix store already (whole units of matched tokens),
	// Fetched = Units - Cached came from the prefill side, Bytes bytes.
	Units, Cached, Fetched int
	Bytes                  uint64
}

// DecodeStats counts what a Decode did.
type DecodeStats struct {
	Requests int    // requests decoded
	Cached   int    // prompt units found in the decode cache's prefix store
	Fetched  int    // prompt units fetched from the prefill side
	Extents  int    // extents fetched
	Bytes    uint64 // bytes fetched
	Tokens   int    // tokens generated
}

// Decode is the decode side: a cache, a model and the fetching half of a
// transport (none of which it closes). Safe for concurrent use: each
// request decodes on its own sequence.
type Decode struct {
	cache *kvcache.Cache
	model Model
	fetch Fetcher
	tpg   int
	vocab int // the model's vocabulary, when it tells it; 0 if not

	// mu guards stats.
	mu    lockrank.Mutex[lockrank.DisaggDecode]
	stats DecodeStats
}

// NewDecode makes the decode side over cache (float32 keys and values:
// the model's), model and fetch. A nil argument is ErrInvalid, and so is
// a model whose shape (when it tells it) is not the cache's.
func NewDecode(cache *kvcache.Cache, model Model, fetch Fetcher) (*Decode, error) {
	tpg, err := checkSide("new decode side", cache, model)
	if err != nil {
		return nil, err
	}
	if fetch == nil {
		return nil, errors.Wrap(driver.ErrInvalid, "disagg: new decode side: no fetcher")
	}
	d := &Decode{cache: cache, model: model, fetch: fetch, tpg: tpg}
	if m, ok := model.(interface{ Config() transformer.Config }); ok {
		d.vocab = m.Config().Vocab
	}
	return d, nil
}

// Decode takes request h from src and generates n tokens (h.First and n-1
// decode steps; none for n 0). It admits h.Prompt in the decode cache,
// asks src for the units its prefix store does not hold, fetches them
// into its own units, releases the request at src, marks the prompt
// written, and decodes greedily. The sequence is freed at the end; its
// prompt's whole units stay cached in the decode cache's prefix store, so
// a later request sharing them fetches less.
//
// It refuses a nil context or source, a negative n, and a handoff from a
// cache of another shape, with a prompt of another number of units or
// with a token (the first, or one of the prompt) outside the model's
// vocabulary when the model tells it (ErrInvalid), before admitting
// anything. After that src is released
// whatever happens, and on failure the decode cache ends as it was but
// for its prefix store (what it publishes only once the prompt is
// written).
func (d *Decode) Decode(ctx context.Context, src Source, h Handoff, n int) (Result, error) {
	what := func() string {
		return fmt.Sprintf("disagg: decode %d tokens of request %d (a prompt of %d tokens)", n, h.ID, len(h.Prompt))
	}
	if d == nil || d.cache == nil {
		return Result{}, errors.Wrapf(driver.ErrInvalid, "%s: not a decode side made by NewDecode", what())
	}
	switch shape := shapeOf(d.cache); {
	case src == nil || ctx == nil:
		return Result{}, errors.Wrapf(driver.ErrInvalid, "%s: no source or no context", what())
	case n < 0:
		return Result{}, errors.Wrapf(driver.ErrInvalid, "%s: a negative count", what())
	case h.Shape != shape:
		return Result{}, errors.WithHint(errors.Wrapf(driver.ErrInvalid, "%s: the prefill cache's shape %+v is not the decode cache's %+v", what(), h.Shape, shape),
			"both sides need the same Layers, KVHeads, HeadDim, DType, PageSize and Layout")
	case len(h.Prompt) == 0 || d.cache.UnitsFor(len(h.Prompt)) != h.Units:
		return Result{}, errors.Wrapf(driver.ErrInvalid, "%s: the handoff says %d units, the decode cache puts the prompt in %d",
			what(), h.Units, d.cache.UnitsFor(len(h.Prompt)))
	}
	if err := d.checkTokens(h); err != nil {
		return Result{}, errors.Wrapf(err, "%s", what())
	}
	res, err := d.take(ctx, src, h)
	if rerr := src.Release(ctx, h.ID); rerr != nil {
		err = errors.CombineErrors(err, errors.Wrapf(rerr, "%s", what()))
	}
	if err != nil {
		return Result{}, errors.CombineErrors(errors.Wrapf(err, "%s", what()), freeSeq(res.seq))
	}
	err = d.generate(res.seq, h, n, &res.Result)
	err = errors.CombineErrors(err, res.seq.Free())
	if err != nil {
		return Result{}, errors.Wrapf(err, "%s", what())
	}
	d.mu.Lock()
	d.stats.Requests++
	d.stats.Cached += res.Cached
	d.stats.Fetched += res.Fetched
	d.stats.Bytes += res.Bytes
	d.stats.Tokens += len(res.Tokens)
	d.mu.Unlock()
	return res.Result, nil
}

// checkTokens refuses a handoff whose first token or a prompt token is
// outside the model's vocabulary, when the model tells it.
func (d *Decode) checkTokens(h Handoff) error {
	if d.vocab <= 0 {
		return nil
	}
	if h.First < 0 || h.First >= d.vocab {
		return errors.Wrapf(driver.ErrInvalid, "the first token %d is outside the vocabulary 0..%d", h.First, d.vocab-1)
	}
	for i, tok := range h.Prompt {
		if tok < 0 || tok >= d.vocab {
			return errors.Wrapf(driver.ErrInvalid, "prompt token %d (%d) is outside the vocabulary 0..%d", i, tok, d.vocab-1)
		}
	}
	return nil
}

// freeSeq frees s if there is one.
func freeSeq(s *kvcache.Seq) error {
	if s == nil {
		return nil
	}
	return s.Free()
}

// taken is a request whose prompt is in place: its sequence and counts.
type taken struct {
	Result
	seq *kvcache.Seq
}

// take admits h's prompt and fetches the units the decode cache lacks.
// Whatever it admitted is in the result, also on failure.
func (d *Decode) take(ctx context.Context, src Source, h Handoff) (taken, error) {
	s, err := d.cache.Admit(h.Prompt, h.Extra)
	if err != nil {
		return taken{}, err
	}
	res := taken{seq: s, Result: Result{Units: h.Units}}
	matched := s.Matched()
	// Cached units: those all of whose tokens are matched (the shared
	// ones; the unit after them may hold matched tokens copied, but not
	// all of its tokens).
	for res.Cached < h.Units {
		if _, end := d.cache.UnitTokens(res.Cached); end > matched {
			break
		}
		res.Cached++
	}
	if _, err := s.Append(h.Prompt[s.Len():]); err != nil {
		return res, err
	}
	refs, err := src.Units(ctx, h.ID, res.Cached, h.Units)
	if err != nil {
		return res, err
	}
	if len(refs) != h.Units-res.Cached {
		return res, errors.Wrapf(driver.ErrInvalid, "disagg: asked units [%d, %d), got %d", res.Cached, h.Units, len(refs))
	}
	var dst []*tensor.Tensor
	var flat []Ref
	for i, unit := range refs {
		u := res.Cached + i
		ts, err := s.UnitBytes(u)
		if err != nil {
			return res, err
		}
		if len(ts) != len(unit) {
			return res, errors.Wrapf(driver.ErrInvalid, "disagg: unit %d has %d extents here, %d at the prefill side", u, len(ts), len(unit))
		}
		for j, t := range ts {
			if n := tensorBytes(t); unit[j].Len != n {
				return res, errors.Wrapf(driver.ErrInvalid, "disagg: extent %d of unit %d has %d bytes here, the prefill side's ref says %d", j, u, n, unit[j].Len)
			}
		}
		dst = append(dst, ts...)
		flat = append(flat, unit...)
	}
	if err := d.fetch.Fetch(ctx, dst, flat); err != nil {
		return res, err
	}
	res.Fetched = len(refs)
	for _, t := range dst {
		res.Bytes += tensorBytes(t)
	}
	d.mu.Lock()
	d.stats.Extents += len(dst)
	d.mu.Unlock()
	return res, s.MarkWritten(len(h.Prompt))
}

// generate decodes n tokens of s from h.First into res.
func (d *Decode) generate(s *kvcache.Seq, h Handoff, n int, res *Result) (err error) {
	if n == 0 {
		return nil
	}
	kv := newSeqKV(d.cache, s, d.cache.Config().Layers, d.tpg)
	defer func() { err = errors.CombineErrors(err, kv.close()) }()
	tok := h.First
	res.Tokens = append(res.Tokens, tok)
	for len(res.Tokens) < n {
		step, err := s.Append([]int{tok})
		if err != nil {
			return err
		}
		kv.appended(step)
		pos := s.Len() - 1
		logits, err := d.model.Step(kv, pos, tok)
		if err != nil {
			return err
		}
		if err := s.MarkWritten(pos + 1); err != nil {
			return err
		}
		tok = transformer.Greedy(logits)
		res.Logits = append(res.Logits, logits)
		res.Tokens = append(res.Tokens, tok)
	}
	return nil
}

// Stats returns the counts so far (zero for a nil or zero Decode).
func (d *Decode) Stats() DecodeStats {
	if d == nil || d.cache == nil {
		return DecodeStats{}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stats
}
