package serving

// This library's cache of a hybrid model (kvcache.Hybrid) as a KV
// scheme, on the sim driver with model-sized memory.

import (
	"fmt"
	"math/bits"
	"strings"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/invariants"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// HybridCacheName is the hybrid cache scheme's Name.
const HybridCacheName = "this cache (hybrid)"

// HybridCache is this library's cache of a model of several kinds of
// layers (package kvcache's Hybrid: a Cache a group, sliding windows
// holding their window, recurrent states in a store of their own, one
// budget) as a KV scheme: a *kvcache.Hybrid on a sim driver whose one
// device holds the budget, and a *kvcache.HybridSeq for each request
// admitted and not yet finished.
//
// Its choices, where the simulation leaves one: the groups are
// Model.Groups (a latent KV a kvcache.Latent group); BlockTokens is the
// unit of prefix hashing and of recurrent checkpoints; pages of
// PageSize (0: 2 MiB); preemption drops (recompute, as vLLM and the
// hybrid paged scheme: a window group that gave units back cannot swap);
// CanAdmit asks kvcache's CanAdmit for a new request's prompt (no
// expected output, as the paged schemes) and CanResume for a preempted
// one's whole context; it maps ahead as kvcache.Hybrid's groups do by
// default (HybridCacheOptions), modelled as Cache's is (MapAhead: a
// decode's commits in the background of the step before).
//
// Stats: InUse is what the groups and the state store hold committed,
// less what they keep for reuse (Cached: cached prefix store pages, idle
// slots' and surplus pages, the page pools, recurrent checkpoints);
// Logical is the exact need of the running sequences (Model.ExactNeed of
// each), Stored that less what sharing spares (the groups' SavedBytes),
// so that InUse - Stored is the waste beyond the exact need, as
// HybridBlockTable counts it. Commits counts the groups' commit calls,
// Evictions their prefix store units evicted; the prefix figures are the
// tokens each Admit and Resume looked up (whole blocks of the context but
// its last token) and found, as the paged scheme's.
type HybridCache struct {
	cfg  Config
	opts HybridCacheOptions
	page uint64

	drv   *sim.Driver
	space *vaspace.Space
	mem   *physical.Memory
	h     *kvcache.Hybrid

	seqs map[int]*hybridCacheSeq
	// kinds are the model's groups, for the exact need.
	kinds []LayerGroup
	// logical is the running sequences' exact need; queried and hit the
	// prefix tokens looked up and found by every Admit and Resume (whole
	// blocks, as the paged scheme counts them: the match every group and a
	// checkpoint agree on, not each group's own).
	logical      uint64
	queried, hit int64
	// prompt is the tokens of the last prompt CanAdmit was asked about,
	// of request promptOf; step the tokens of one Append, reused.
	prompt   []int
	promptOf int
	step     []int
}

// hybridCacheSeq is a live sequence (see cacheSeq).
type hybridCacheSeq struct {
	seq       *kvcache.HybridSeq
	preempted bool
	next      int
	marked    int
	// last is the tokens of the last Append (0 before the first), need
	// the exact need (see exactNeed).
	last int
	need uint64
}

// HybridCacheOptions are the hybrid cache scheme's choices.
type HybridCacheOptions struct {
	// PageSize is every group's page (0: 2 MiB), a power of two from
	// 4 KiB to 1 GiB.
	PageSize uint64
	// NoMapAhead turns mapping ahead off: every page is committed by the
	// call that needs it, on the step's path, but for what a step
	// scheduled ahead (Options.AdmitAhead) reserves: the prompt chunks
	// and each decode's next token. The zero value maps ahead, as
	// kvcache.Hybrid does by default.
	NoMapAhead bool
	// PrefillChunk is the most tokens of a prompt the simulation appends
	// at once, its Options.MaxBatchedTokens (0: DefaultMaxBatchedTokens):
	// kvcache's HybridConfig.PrefillChunk, so that a sliding-window
	// group is asked at admission for its window and a chunk, not the
	// whole prompt. Simulate refuses a MaxBatchedTokens larger than it.
	PrefillChunk int
}

// NewHybridCache makes the scheme: a sim driver of one device holding
// cfg.Budget (rounded up to the page), and a kvcache.Hybrid of the
// model's groups over it (its mapping ahead modelled: see MapAhead).
// cfg must pass Config.Check; a page that is not a power of two from
// 4 KiB to 1 GiB, and a model kvcache refuses (an odd latent, an element
// size it has no dtype of), are errors marked driver.ErrInvalid. Close
// releases it all.
func NewHybridCache(cfg Config, opts HybridCacheOptions) (*HybridCache, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	cfg.defaults()
	pageSize := opts.PageSize
	if pageSize == 0 {
		pageSize = 2 * units.MiB
	}
	if pageSize&(pageSize-1) != 0 || pageSize < 4*units.KiB || pageSize > units.GiB {
		return nil, errors.Wrapf(driver.ErrInvalid, "serving: hybrid cache: a page of %d bytes, want a power of two from 4 KiB to 1 GiB", pageSize)
	}
	dt, err := elemDType(cfg.Model)
	if err != nil {
		return nil, err
	}
	groups, err := hybridGroups(cfg.Model, cfg.MaxContext)
	if err != nil {
		return nil, err
	}
	capacity := (cfg.Budget + pageSize - 1) / pageSize * pageSize
	drv, err := sim.New(sim.Options{Devices: 1, Capacity: capacity, Granularity: pageSize})
	if err != nil {
		return nil, errors.Wrapf(err, "serving: hybrid cache: a sim device of %s", units.Bytes(capacity))
	}
	opts.PageSize = pageSize
	if opts.PrefillChunk == 0 {
		opts.PrefillChunk = DefaultMaxBatchedTokens
	}
	if opts.PrefillChunk < 0 || opts.PrefillChunk > maxBatchedTokens {
		return nil, errors.CombineErrors(errors.Wrapf(driver.ErrInvalid, "serving: hybrid cache: a prefill chunk of %d tokens, want 1 to %d", opts.PrefillChunk, maxBatchedTokens), drv.Close())
	}
	k := &HybridCache{cfg: cfg, opts: opts, page: pageSize, drv: drv, space: vaspace.New(drv), mem: physical.New(drv),
		seqs: map[int]*hybridCacheSeq{}, kinds: cfg.Model.Groups(), promptOf: -1}
	k.h, err = kvcache.NewHybrid(k.space, k.mem, kvcache.HybridConfig{Groups: groups, DType: dt,
		BlockTokens: cfg.BlockTokens, MaxContext: cfg.MaxContext, MaxSeqs: cfg.MaxSeqs, Budget: cfg.Budget, PageSize: pageSize,
		// Mapping ahead modelled (MapAhead), not run: no goroutine, so
		// that every call's driver calls are its own.
		MapAhead: -1, PrefillChunk: min(opts.PrefillChunk, cfg.MaxContext)})
	if err != nil {
		return nil, errors.CombineErrors(errors.Wrapf(err, "serving: hybrid cache"), k.closeDriver())
	}
	return k, nil
}

// PrefillChunk is the most tokens of a prompt the scheme plans one
// Append for (HybridCacheOptions.PrefillChunk).
func (k *HybridCache) PrefillChunk() int {
	if k == nil {
		return 0
	}
	return k.opts.PrefillChunk
}

// hybridGroups is m's groups as kvcache's, for sequences of at most
// maxContext tokens: a window that holds them all (a group that never
// drops a token) is kept as full attention.
func hybridGroups(m Model, maxContext int) ([]kvcache.Group, error) {
	var out []kvcache.Group
	for _, g := range m.Groups() {
		switch g.Kind {
		case FullAttention:
			out = append(out, kvcache.Group{Kind: kvcache.FullAttention, Layers: g.Layers, KVHeads: m.KVHeads, HeadDim: m.HeadDim})
		case LatentAttention:
			if m.HeadDim%2 != 0 {
				return nil, errors.Wrapf(driver.ErrInvalid, "serving: hybrid cache: model %q has a latent KV of %d elements, an odd number this cache cannot keep as two halves", m.Name, m.HeadDim)
			}
			out = append(out, kvcache.Group{Kind: kvcache.Latent, Layers: g.Layers, KVHeads: 1, HeadDim: m.HeadDim})
		case SlidingWindow:
			if g.Window >= maxContext {
				out = append(out, kvcache.Group{Kind: kvcache.FullAttention, Layers: g.Layers, KVHeads: m.KVHeads, HeadDim: m.HeadDim})
				continue
			}
			out = append(out, kvcache.Group{Kind: kvcache.SlidingWindow, Layers: g.Layers, KVHeads: m.KVHeads, HeadDim: m.HeadDim, Window: g.Window})
		case Recurrent:
			out = append(out, kvcache.Group{Kind: kvcache.Recurrent, Layers: g.Layers, StateBytes: m.StateBytes})
		}
	}
	return out, nil
}

func (k *HybridCache) closeDriver() error {
	return errors.CombineErrors(errors.CombineErrors(k.space.Close(), k.mem.Close()), k.drv.Close())
}

// Close ends every sequence and releases the cache, its address space,
// its memory and the sim driver. Closing twice is an error marked
// driver.ErrClosed.
func (k *HybridCache) Close() error {
	if err := k.made("close"); err != nil {
		return err
	}
	if k.seqs == nil {
		return driver.Closed("serving: hybrid cache: close: closed already")
	}
	err := k.h.Close()
	k.seqs = nil
	return errors.CombineErrors(err, k.closeDriver())
}

// Name is HybridCacheName.
func (k *HybridCache) Name() string { return HybridCacheName }

// String is the cache's groups in a line.
func (k *HybridCache) String() string {
	if k == nil || k.h == nil {
		return "hybrid cache: not made by NewHybridCache"
	}
	st := k.h.Stats()
	var parts []string
	for i, g := range k.h.Config().Groups {
		p := fmt.Sprintf("%s %d layers", g.Kind, g.Layers)
		switch {
		case g.Kind == kvcache.SlidingWindow && i < len(st.WindowHeld) && st.WindowHeld[i]:
			p += fmt.Sprintf(" holding their last %d tokens", g.Window)
		case g.Kind == kvcache.SlidingWindow:
			p += " holding every token (windows not built)"
		case g.Kind == kvcache.Recurrent:
			p += fmt.Sprintf(" of %s state each", units.Bytes(g.StateBytes))
		}
		parts = append(parts, p)
	}
	return fmt.Sprintf("kvcache.Hybrid of %d groups (%s) in pages of %s", len(parts), strings.Join(parts, ", "), units.Bytes(k.page))
}

// Reserved is 0: kvcache.Hybrid does not report its groups' address
// space.
func (k *HybridCache) Reserved() uint64 { return 0 }

// DriverCalls is every driver call the cache has made, as its sim driver
// counts them.
func (k *HybridCache) DriverCalls() sim.Calls {
	if k == nil || k.drv == nil {
		return sim.Calls{}
	}
	return k.drv.Calls()
}

// MapAhead is the window of mapping ahead Simulate models, in tokens:
// BlockTokens (kvcache.Hybrid's default), 0 with NoMapAhead. The
// kvcache.Hybrid under it maps nothing ahead itself (a goroutine's calls
// would land in whichever call came next); Simulate counts a decode's
// commits as the groups' goroutines would have made them, during the
// step before.
func (k *HybridCache) MapAhead() int {
	if k == nil || k.opts.NoMapAhead {
		return 0
	}
	return k.cfg.BlockTokens
}

func (k *HybridCache) made(op string) error {
	if k == nil || k.h == nil {
		return errors.Wrapf(driver.ErrInvalid, "serving: hybrid cache: %s: the scheme was not made by NewHybridCache", op)
	}
	return nil
}

func (k *HybridCache) usable(op string, r *SimRequest) error {
	if err := k.made(op); err != nil {
		return err
	}
	if k.seqs == nil {
		return driver.Closed("serving: hybrid cache: " + op + ": closed")
	}
	return checkRequest("hybrid cache", op, r)
}

func (k *HybridCache) live(op string, r *SimRequest, preempted bool) (*hybridCacheSeq, error) {
	if err := k.usable(op, r); err != nil {
		return nil, err
	}
	cs := k.seqs[r.id]
	switch {
	case cs == nil:
		return nil, errors.Wrapf(driver.ErrInvalid, "serving: hybrid cache: %s request %d: it is not admitted", op, r.id)
	case cs.preempted != preempted:
		return nil, errors.Wrapf(driver.ErrInvalid, "serving: hybrid cache: %s request %d: it is %s", op, r.id,
			map[bool]string{false: "running", true: "preempted"}[cs.preempted])
	}
	return cs, nil
}

// promptTokens is r's prompt, kept for the next call about r (kvcache's
// Admit keeps a copy of its own).
func (k *HybridCache) promptTokens(r *SimRequest) []int {
	if k.promptOf != r.id {
		k.prompt = r.Tokens(k.prompt[:0], 0, r.Prompt())
		k.promptOf = r.id
	}
	return k.prompt
}

// setNeed makes cs's exact need that of tokens tokens (-1: not
// running), its last chunk computed in the step.
func (k *HybridCache) setNeed(cs *hybridCacheSeq, tokens int) {
	k.logical -= cs.need
	cs.need = 0
	if tokens >= 0 {
		cs.need = exactNeed(k.kinds, tokens, cs.last)
	}
	k.logical += cs.need
}

// CanAdmit asks kvcache's CanAdmit about a new request's prompt, and its
// CanResume about a preempted one's whole context.
func (k *HybridCache) CanAdmit(r *SimRequest) bool {
	if k.usable("can admit", r) != nil {
		return false
	}
	if cs := k.seqs[r.id]; cs != nil {
		if !cs.preempted {
			return false
		}
		ok, err := cs.seq.CanResume(max(r.Context()-cs.seq.Len(), 0))
		return err == nil && ok
	}
	if r.Prompt() < 1 {
		return false
	}
	ok, err := k.h.CanAdmit(k.promptTokens(r), 0)
	return err == nil && ok
}

// Admit admits r's prompt: the tokens every group (and a recurrent
// checkpoint) held of it are held.
func (k *HybridCache) Admit(r *SimRequest) (int, error) {
	if err := k.usable("admit", r); err != nil {
		return 0, err
	}
	if k.seqs[r.id] != nil {
		return 0, errors.Wrapf(driver.ErrInvalid, "serving: hybrid cache: admit request %d: it is admitted already", r.id)
	}
	seq, err := k.h.Admit(k.promptTokens(r))
	if err != nil {
		return 0, errors.Wrapf(err, "serving: hybrid cache: admit request %d", r.id)
	}
	held := seq.Matched()
	k.countMatch(r, held)
	cs := &hybridCacheSeq{seq: seq, next: held, marked: held}
	k.setNeed(cs, held)
	k.seqs[r.id] = cs
	k.checkAfter("admit")
	return held, nil
}

// Append appends r's tokens [next, next+n) to its sequence, those it
// does not hold already (after a recompute resume).
func (k *HybridCache) Append(r *SimRequest, n int) error {
	cs, err := k.live("append", r, false)
	if err != nil {
		return err
	}
	if n < 0 || n > r.context-cs.next {
		return errors.Wrapf(driver.ErrInvalid, "serving: hybrid cache: append %d tokens to request %d at %d: want 0 to %d",
			n, r.id, cs.next, r.context-cs.next)
	}
	from, to := max(cs.next, cs.seq.Len()), cs.next+n
	if from < to {
		k.step = r.Tokens(k.step[:0], from, to)
		if _, err := cs.seq.Append(k.step); err != nil {
			return errors.Wrapf(err, "serving: hybrid cache: append to request %d", r.id)
		}
	}
	cs.next = to
	if n > 0 {
		cs.last = n
	}
	k.setNeed(cs, cs.seq.Len())
	k.checkAfter("append")
	return nil
}

// Reserve commits ahead the pages of r's next n tokens, those after the
// ones appended, in every group (kvcache's HybridSeq.Reserve: within the
// free budget and the group's cached units, never a running sequence's
// pages), and returns how many of them have their pages:
// Options.AdmitAhead's reservation of the next step's prompt chunk and of
// a decode's next token (n 1, one past the context).
func (k *HybridCache) Reserve(r *SimRequest, n int) (int, error) {
	cs, err := k.live("reserve", r, false)
	if err != nil {
		return 0, err
	}
	// One past the context: a decode's next token, reserved a step ahead.
	if n < 0 || n > r.context+1-cs.next || cs.next+n > k.cfg.MaxContext {
		return 0, errors.Wrapf(driver.ErrInvalid, "serving: hybrid cache: reserve %d tokens of request %d at %d: want 0 to %d",
			n, r.id, cs.next, min(r.context+1, k.cfg.MaxContext)-cs.next)
	}
	held := max(cs.seq.Len()-cs.next, 0) // a recompute resume's pages
	if n <= held {
		return n, nil
	}
	got, err := cs.seq.Reserve(n - held)
	if err != nil {
		return 0, errors.Wrapf(err, "serving: hybrid cache: reserve for request %d", r.id)
	}
	k.checkAfter("reserve")
	return held + got, nil
}

// ChunkAlign is BlockTokens for a model with recurrent layers (Simulate
// ends a prompt chunk that stops short at a unit boundary, where
// MarkWritten checkpoints the state), 0 else.
func (k *HybridCache) ChunkAlign() int {
	if k == nil || k.h == nil || !k.recurrent() {
		return 0
	}
	return k.cfg.BlockTokens
}

// recurrent says the model has recurrent layers: a checkpoint of their
// state is the state after a step, which no sequence in the same step
// can read (so Simulate marks what a step writes once the step is
// launched, not as it schedules it).
func (k *HybridCache) recurrent() bool {
	for _, g := range k.kinds {
		if g.Kind == Recurrent {
			return true
		}
	}
	return false
}

// Warm fills the groups' page pools ahead with the pages of a prompt
// chunk of n tokens (kvcache's Hybrid.WarmAtMost, within the free
// budget), adding at most most pages (negative: no bound), so that the
// next admissions' first chunks map pages instead of creating them.
func (k *HybridCache) Warm(n, most int) error {
	if err := k.made("warm"); err != nil {
		return err
	}
	if n < 0 {
		return errors.Wrapf(driver.ErrInvalid, "serving: hybrid cache: warm the pool for %d tokens", n)
	}
	_, err := k.h.WarmAtMost(min(n, k.cfg.MaxContext), most)
	return errors.Wrapf(err, "serving: hybrid cache: warm the pools")
}

// warmBudget fills the groups' page pools before serving with the free
// budget (kvcache's Hybrid.WarmBudget), at most the pages n tokens of
// every layer take (Options.WarmBudget: every token of the trace).
func (k *HybridCache) warmBudget(n int) error {
	if err := k.made("warm"); err != nil {
		return err
	}
	pages := -1
	if hi, b := bits.Mul64(uint64(max(n, 0)), k.cfg.Model.TokenBytes()); hi == 0 && b/k.h.Config().PageSize < 1<<30 {
		pages = int(b/k.h.Config().PageSize) + 2*len(k.h.Config().Groups) // and a unit a group a chunk straddles
	}
	_, err := k.h.WarmBudget(pages)
	return errors.Wrapf(err, "serving: hybrid cache: warm the pools with the budget")
}

// Computed marks the tokens appended to r written (kvcache's
// MarkWritten: whole prompt units shareable, a recurrent checkpoint at a
// unit boundary).
func (k *HybridCache) Computed(r *SimRequest) error {
	cs, err := k.live("mark computed", r, false)
	if err != nil {
		return err
	}
	return errors.Wrapf(k.markComputed(cs), "serving: hybrid cache: mark request %d computed", r.id)
}

func (k *HybridCache) markComputed(cs *hybridCacheSeq) error {
	if cs.preempted || cs.next <= cs.marked {
		return nil
	}
	if err := cs.seq.MarkWritten(cs.next); err != nil {
		return err
	}
	cs.marked = cs.next
	return nil
}

// Fork starts child as a fork of parent's sequence in every group
// (kvcache's HybridSeq.Fork: the pages shared, each group's partly
// written last unit copied at the next Append, the recurrent state
// copied). parent must be running with every token appended computed;
// child another sample of its request, not admitted. kvcache's refusals
// come back marked as they are (ErrOutOfMemory, ErrBusy, ErrUnsupported:
// a window group that released units, a ring) and change nothing.
func (k *HybridCache) Fork(parent, child *SimRequest) error {
	cs, err := k.live("fork", parent, false)
	if err != nil {
		return err
	}
	if err := k.usable("fork", child); err != nil {
		return err
	}
	if err := checkFork("hybrid cache", parent, child, k.seqs[child.id] != nil, cs.next, cs.seq.Len()); err != nil {
		return err
	}
	if err := k.markComputed(cs); err != nil {
		return errors.Wrapf(err, "serving: hybrid cache: fork request %d", parent.id)
	}
	seq, err := cs.seq.Fork()
	if err != nil {
		return errors.Wrapf(err, "serving: hybrid cache: fork request %d into %d", parent.id, child.id)
	}
	ccs := &hybridCacheSeq{seq: seq, next: cs.next, marked: cs.next, last: cs.last}
	k.setNeed(ccs, seq.Len())
	k.seqs[child.id] = ccs
	k.checkAfter("fork")
	return nil
}

// Finish frees r's sequence in every group.
func (k *HybridCache) Finish(r *SimRequest) error {
	if err := k.usable("finish", r); err != nil {
		return err
	}
	cs := k.seqs[r.id]
	if cs == nil {
		return errors.Wrapf(driver.ErrInvalid, "serving: hybrid cache: finish request %d: it is not admitted", r.id)
	}
	if err := errors.CombineErrors(k.markComputed(cs), cs.seq.Free()); err != nil {
		return errors.Wrapf(err, "serving: hybrid cache: finish request %d", r.id)
	}
	k.setNeed(cs, -1)
	delete(k.seqs, r.id)
	k.checkAfter("finish")
	return nil
}

// Preempt drops r's sequence in every group: it is recomputed.
func (k *HybridCache) Preempt(r *SimRequest) (recompute bool, err error) {
	cs, err := k.live("preempt", r, false)
	if err != nil {
		return false, err
	}
	if err := cs.seq.Preempt(kvcache.Drop); err != nil {
		return false, errors.Wrapf(err, "serving: hybrid cache: preempt request %d", r.id)
	}
	cs.preempted = true
	k.setNeed(cs, -1)
	k.checkAfter("preempt")
	return true, nil
}

// Resume resumes r's sequence: it holds the prefix every group and a
// recurrent checkpoint still hold, and pages for the rest, which
// Simulate recomputes.
func (k *HybridCache) Resume(r *SimRequest) (int, error) {
	cs, err := k.live("resume", r, true)
	if err != nil {
		return 0, err
	}
	step, err := cs.seq.Resume()
	if err != nil {
		return 0, errors.Wrapf(err, "serving: hybrid cache: resume request %d", r.id)
	}
	cs.preempted, cs.next, cs.marked, cs.last = false, step.Pos, step.Pos, 0
	k.countMatch(r, step.Pos)
	k.setNeed(cs, cs.seq.Len())
	k.checkAfter("resume")
	return step.Pos, nil
}

// countMatch counts an admission's lookup of r's prompt that found held
// tokens.
func (k *HybridCache) countMatch(r *SimRequest, held int) {
	bt := k.cfg.BlockTokens
	k.queried += int64(max(r.context-1, 0) / bt * bt)
	k.hit += int64(held)
}

// Stats maps the cache's figures (see HybridCache).
func (k *HybridCache) Stats() Stats {
	if k == nil || k.h == nil || k.seqs == nil {
		return Stats{}
	}
	st := k.h.Stats()
	var cached, saved uint64
	var s Stats
	for _, g := range st.Groups {
		cached += uint64(g.CachedPages+g.IdlePages+g.SurplusPages+g.PooledPages) * k.page
		saved += g.SavedBytes
		s.Commits += int64(g.Commits)
		s.Evictions += int64(g.Evictions)
	}
	if n := st.StateSlots + st.Checkpoints; n > 0 {
		cached += st.StateBytes / uint64(n) * uint64(st.Checkpoints)
	}
	s.Cached = min(cached, st.Committed)
	s.InUse = st.Committed - s.Cached
	s.Logical = k.logical
	s.PrefixQueried, s.PrefixHit = k.queried, k.hit
	s.Stored = k.logical - min(saved, k.logical)
	return s
}

func (k *HybridCache) checkAfter(op string) {
	if invariants.Enabled {
		invariants.Fail("serving: hybrid cache: "+op, k.checkSeqs())
	}
}

// Check runs the cache's Check and compares the scheme's sequences and
// exact need with the cache's.
func (k *HybridCache) Check() error {
	if err := k.made("check"); err != nil {
		return err
	}
	if k.seqs == nil {
		return driver.Closed("serving: hybrid cache: check: closed")
	}
	return errors.CombineErrors(k.h.Check(), k.checkSeqs())
}

func (k *HybridCache) checkSeqs() error {
	var errs error
	fail := func(format string, args ...any) {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf("serving: hybrid cache: "+format, args...))
	}
	running := 0
	var logical uint64
	for id, cs := range k.seqs {
		if cs.preempted {
			if cs.need != 0 {
				fail("preempted request %d needs %d bytes", id, cs.need)
			}
			continue
		}
		running++
		n := cs.seq.Len()
		if n < cs.next {
			fail("request %d is at token %d, its sequence holds %d", id, cs.next, n)
		}
		if want := exactNeed(k.kinds, n, cs.last); cs.need != want {
			fail("request %d of %d tokens needs %d bytes, counted %d", id, n, want, cs.need)
		}
		logical += cs.need
	}
	if st := k.h.Stats(); st.Running != running || st.Sequences != len(k.seqs) {
		fail("%d sequences live and %d running, the cache has %d and %d", len(k.seqs), running, st.Sequences, st.Running)
	}
	if logical != k.logical {
		fail("the running sequences need %d bytes, counted %d", logical, k.logical)
	}
	return errs
}
