package disagg

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/lockrank"
	"github.com/vmarena/vmarena/internal/transformer"
	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/tensor"
)

// Shape is what two caches must share for a unit of one to be a unit of
// the other: the model's keys and values, the page and the layout.
type Shape struct {
	Layers, KVHeads, HeadDim int
	DType                    tensor.DType
	PageSize                 uint64
	Layout                   kvcache.Layout
}

// shapeOf is c's Shape.
func shapeOf(c *kvcache.Cache) Shape {
	cfg := c.Config()
	return Shape{Layers: cfg.Layers, KVHeads: cfg.KVHeads, HeadDim: cfg.HeadDim, DType: cfg.DType,
		PageSize: cfg.PageSize, Layout: cfg.Layout}
}

// Handoff is what the prefill side tells the decode side of a request
// once its prompt is computed: everything but the bytes, which the decode
// side asks for by unit (Source.Units).
type Handoff struct {
	// ID is the request at the prefill side, until Source.Release: 64
	// random bits (crypto/rand), never 0, so that a decode peer can name
	// only the requests whose handoffs it was given, not guess another
	// peer's.
	ID uint64
	// Prompt and Extra are the request's prompt and extra key (the decode
	// side admits the same).
	Prompt []int
	Extra  uint64
	// First is the token greedy decoding picked after the prompt: the
	// first the request generates.
	First int
	// Units is how many units the prompt's keys and values fill, all
	// written: unit u's extents are Source.Units' answer.
	Units int
	// Shape is the prefill cache's: the decode side's must be the same.
	Shape Shape
}

// Source is the prefill side as the decode side reaches it: Prefill
// itself in one process, a request/reply channel between two.
type Source interface {
	// Units exposes units [from, to) of request id and returns, unit by
	// unit, the refs of their extents (kvcache.Seq.UnitBytes' order).
	Units(ctx context.Context, id uint64, from, to int) ([][]Ref, error)
	// Release says the decode side has what it needs of request id: the
	// prefill side lets its extents and its sequence go.
	Release(ctx context.Context, id uint64) error
}

// PrefillStats counts what a Prefill did.
type PrefillStats struct {
	Requests int // prompts prefilled
	Computed int // positions the model computed
	Matched  int // positions the prefill cache's prefix store held
	Exported int // unit extents exported
	Held     int // requests prefilled and not released yet
}

// Prefill is the prefill side: a cache, a model and the exporting half of
// a transport (none of which it closes). Safe for concurrent use: each
// request computes on its own sequence.
type Prefill struct {
	cache *kvcache.Cache
	model Model
	exp   Exporter
	tpg   int

	// mu guards the fields below.
	mu     lockrank.Mutex[lockrank.DisaggPrefill]
	held   map[uint64]*held
	closed bool
	stats  PrefillStats
}

// held is a prefilled request the decode side has not released: its
// sequence, the refs of the units exported of it (refs[u], nil for a unit
// not exported) and the release of every extent exported.
type held struct {
	h        Handoff
	seq      *kvcache.Seq
	refs     [][]Ref
	releases []func() error
}

// NewPrefill makes the prefill side over cache (float32 keys and values:
// the model's), model and exp. A nil argument is ErrInvalid, and so is a
// model whose shape (when it tells it, as the reference transformer does)
// is not the cache's.
func NewPrefill(cache *kvcache.Cache, model Model, exp Exporter) (*Prefill, error) {
	tpg, err := checkSide("new prefill side", cache, model)
	if err != nil {
		return nil, err
	}
	if exp == nil {
		return nil, errors.Wrap(driver.ErrInvalid, "disagg: new prefill side: no exporter")
	}
	return &Prefill{cache: cache, model: model, exp: exp, tpg: tpg, held: map[uint64]*held{}}, nil
}

// checkSide checks a side's cache and model and returns the cache's
// tokens per group (0 in the PerLayer layout).
func checkSide(op string, cache *kvcache.Cache, model Model) (int, error) {
	if cache == nil || cache.Closed() || model == nil {
		return 0, errors.Wrapf(driver.ErrInvalid, "disagg: %s: a cache (open) and a model are needed", op)
	}
	cfg := cache.Config()
	if cfg.DType != tensor.Float32 {
		return 0, errors.Wrapf(driver.ErrInvalid, "disagg: %s: the cache holds %s, the model computes float32", op, cfg.DType)
	}
	if m, ok := model.(interface{ Config() transformer.Config }); ok {
		mc := m.Config()
		if mc.Layers != cfg.Layers || mc.KVHeads != cfg.KVHeads || mc.HeadDim != cfg.HeadDim {
			return 0, errors.Wrapf(driver.ErrInvalid, "disagg: %s: the model has %d layers of %d KV heads of %d, the cache %d of %d of %d",
				op, mc.Layers, mc.KVHeads, mc.HeadDim, cfg.Layers, cfg.KVHeads, cfg.HeadDim)
		}
	}
	return cache.TokensPerGroup(), nil
}

// made refuses a nil or zero Prefill, and a closed one.
func (p *Prefill) made(what func() string) error {
	if p == nil || p.cache == nil {
		return errors.Wrapf(driver.ErrInvalid, "%s: not a prefill side made by NewPrefill", what())
	}
	return nil
}

// Prefill admits prompt under extra in the prefill cache, computes with
// the model the positions the cache's prefix store does not hold, marks
// them written and picks the first token. The sequence is held for the
// decode side until Release (or Close). It refuses a closed side
// (ErrClosed) and passes the cache's and the model's refusals on
// (ErrInvalid for a bad prompt, ErrBusy with every slot held, ...); on
// failure nothing is held.
func (p *Prefill) Prefill(prompt []int, extra uint64) (Handoff, error) {
	what := func() string { return fmt.Sprintf("disagg: prefill a prompt of %d tokens", len(prompt)) }
	if err := p.made(what); err != nil {
		return Handoff{}, err
	}
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return Handoff{}, driver.Closed(what() + ": the prefill side is closed")
	}
	s, err := p.cache.Admit(prompt, extra)
	if err != nil {
		return Handoff{}, errors.Wrapf(err, "%s", what())
	}
	matched := s.Len()
	first, err := p.compute(s, prompt[matched:], matched)
	if err != nil {
		return Handoff{}, errors.CombineErrors(errors.Wrapf(err, "%s", what()), s.Free())
	}
	h := Handoff{Prompt: append([]int(nil), prompt...), Extra: extra, First: first,
		Units: p.cache.UnitsFor(len(prompt)), Shape: shapeOf(p.cache)}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return Handoff{}, errors.CombineErrors(driver.Closed(what()+": the prefill side was closed meanwhile"), s.Free())
	}
	h.ID = p.newIDLocked()
	p.held[h.ID] = &held{h: h, seq: s}
	p.stats.Requests++
	p.stats.Computed += len(prompt) - matched
	p.stats.Matched += matched
	p.stats.Held = len(p.held)
	return h, nil
}

// newIDLocked is a request ID no held request has: 64 bits from
// crypto/rand (whose Read does not fail), drawn again on 0 or a held one.
func (p *Prefill) newIDLocked() uint64 {
	var b [8]byte
	for {
		_, _ = rand.Read(b[:])
		if id := binary.LittleEndian.Uint64(b[:]); id != 0 && p.held[id] == nil {
			return id
		}
	}
}

// compute appends tokens (from position pos) to s, runs the model over
// them, marks them written and returns the greedy token after the last.
func (p *Prefill) compute(s *kvcache.Seq, tokens []int, pos int) (_ int, err error) {
	step, err := s.Append(tokens)
	if err != nil {
		return 0, err
	}
	kv := newSeqKV(p.cache, s, p.cache.Config().Layers, p.tpg)
	defer func() { err = errors.CombineErrors(err, kv.close()) }()
	kv.appended(step)
	var logits []float32
	for i, tok := range tokens {
		if logits, err = p.model.Step(kv, pos+i, tok); err != nil {
			return 0, err
		}
	}
	if err := s.MarkWritten(pos + len(tokens)); err != nil {
		return 0, err
	}
	return transformer.Greedy(logits), nil
}

// Units exports units [from, to) of request id (0 <= from <= to <=
// Handoff.Units) and returns their extents' refs, unit by unit. The
// extents stay exported until Release; a unit asked for again is not
// exported again: its refs are those it got the first time. It refuses a
// request it does not hold, a bad range and a nil context (ErrInvalid)
// and a closed side (ErrClosed); on failure nothing stays exported by the
// call.
func (p *Prefill) Units(ctx context.Context, id uint64, from, to int) ([][]Ref, error) {
	what := func() string { return fmt.Sprintf("disagg: units [%d, %d) of request %d", from, to, id) }
	if err := p.made(what); err != nil {
		return nil, err
	}
	if ctx == nil {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: a nil context", what())
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	hd, err := p.heldLocked(what, id)
	if err != nil {
		return nil, err
	}
	if from < 0 || from > to || to > hd.h.Units {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: the request's prompt fills units 0 to %d", what(), hd.h.Units-1)
	}
	if hd.refs == nil {
		hd.refs = make([][]Ref, hd.h.Units)
	}
	refs := make([][]Ref, 0, to-from)
	var releases []func() error
	var exported []int
	undo := func(err error) ([][]Ref, error) {
		for _, r := range releases {
			err = errors.CombineErrors(err, r())
		}
		for _, u := range exported {
			hd.refs[u] = nil
		}
		return nil, err
	}
	for u := from; u < to; u++ {
		if err := ctx.Err(); err != nil {
			return undo(errors.Wrapf(err, "%s", what()))
		}
		if hd.refs[u] != nil {
			refs = append(refs, cloneRefs(hd.refs[u]))
			continue
		}
		ts, err := hd.seq.UnitBytes(u)
		if err != nil {
			return undo(errors.Wrapf(err, "%s", what()))
		}
		unit := make([]Ref, len(ts))
		for i, t := range ts {
			r, release, err := p.exp.Export(t)
			if err != nil {
				return undo(errors.Wrapf(err, "%s: export extent %d of unit %d", what(), i, u))
			}
			unit[i] = r
			releases = append(releases, release)
		}
		hd.refs[u] = unit
		exported = append(exported, u)
		refs = append(refs, cloneRefs(unit))
	}
	hd.releases = append(hd.releases, releases...)
	p.stats.Exported += len(releases)
	return refs, nil
}

// cloneRefs is a copy of refs the caller may change.
func cloneRefs(refs []Ref) []Ref {
	out := make([]Ref, len(refs))
	for i, r := range refs {
		out[i] = Ref{Desc: append([]byte(nil), r.Desc...), Len: r.Len}
	}
	return out
}

// heldLocked is request id, or why it is not held.
func (p *Prefill) heldLocked(what func() string, id uint64) (*held, error) {
	if p.closed {
		return nil, driver.Closed(what() + ": the prefill side is closed")
	}
	hd, ok := p.held[id]
	if !ok {
		return nil, errors.WithHint(errors.Wrapf(driver.ErrInvalid, "%s: the prefill side holds no request %d", what(), id),
			"a request is held from Prefill to its Release")
	}
	return hd, nil
}

// Release lets request id go: its exported extents are released and its
// sequence freed (its prompt's whole units stay cached in the prefill
// cache's prefix store, for the next prompt that shares them). A request
// it does not hold (released already, or never) is ErrInvalid, a closed
// side ErrClosed.
func (p *Prefill) Release(_ context.Context, id uint64) error {
	what := func() string { return fmt.Sprintf("disagg: release request %d", id) }
	if err := p.made(what); err != nil {
		return err
	}
	p.mu.Lock()
	hd, err := p.heldLocked(what, id)
	if err != nil {
		p.mu.Unlock()
		return err
	}
	delete(p.held, id)
	p.stats.Held = len(p.held)
	p.mu.Unlock()
	return hd.let()
}

// let releases hd's extents, then frees its sequence.
func (hd *held) let() error {
	var errs error
	for _, r := range hd.releases {
		errs = errors.CombineErrors(errs, r())
	}
	return errors.CombineErrors(errs, hd.seq.Free())
}

// Stats returns the counts so far (zero for a nil or zero Prefill).
func (p *Prefill) Stats() PrefillStats {
	if p == nil || p.cache == nil {
		return PrefillStats{}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// Close releases every request held, as Release does. It closes neither
// the cache, the model nor the exporter. Closing twice is ErrClosed.
func (p *Prefill) Close() error {
	what := func() string { return "disagg: close the prefill side" }
	if err := p.made(what); err != nil {
		return err
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return driver.Closed(what() + ": closed already")
	}
	p.closed = true
	all := p.held
	p.held = map[uint64]*held{}
	p.stats.Held = 0
	p.mu.Unlock()
	var errs error
	for _, hd := range all {
		errs = errors.CombineErrors(errs, hd.let())
	}
	return errs
}
