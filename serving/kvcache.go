package serving

// This file is the only one in the package that knows package kvcache:
// the KV scheme the serving simulation runs this cache as, on the sim
// driver with model-sized memory.

import (
	"fmt"
	"math/bits"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/invariants"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/vaspace"
)

// CacheOptions configure NewCache: what the baselines have no choice
// of.
type CacheOptions struct {
	// Layout is the cache's layout (the zero value: kvcache.PerLayer;
	// kvcache.AutoLayout: the one kvcache.PickLayout picks for the model
	// and PageSize, the layout of least worst-case waste per sequence —
	// what vmarena kv simulate runs unless told).
	Layout kvcache.Layout
	// Preempt is what a preemption does with a sequence's KV: kvcache.Drop
	// (the default, 0) loses it and the sequence is recomputed from its
	// cached prefix when it resumes, as vLLM does; kvcache.Swap copies it
	// to host memory (counted only, on the sim driver) and the sequence
	// resumes with all of it.
	Preempt kvcache.PreemptMode
	// PageSize is the cache's page, its unit of commit (0: 2 MiB, the
	// sim driver's recommended granularity, as on a GPU); a power of two
	// from 4 KiB to 1 GiB.
	PageSize uint64
	// ExpectOutput makes CanAdmit ask for room for an expected output as
	// well as the prompt (see Cache). The zero value asks for the
	// prompt's room alone, as vLLM and the paged scheme do: more
	// sequences start, and more are preempted when their outputs grow.
	ExpectOutput bool
	// NoMapAhead turns mapping ahead off: every page is committed by the
	// call that needs it, on the step's path. The zero value maps ahead
	// (see Cache).
	NoMapAhead bool
	// Events, when set, is the cache's kvcache.Config.Events: it is told
	// the prefix index's changes as vLLM's KV events.
	Events func(kvcache.EventBatch)
}

// Cache is this library's KV cache (package kvcache) as a KV scheme: a
// *kvcache.Cache on a sim driver whose one device holds the budget, and a
// *kvcache.Seq for each request admitted and not yet finished. The cache
// keeps every book (slots, pages, the prefix store, the budget) and hands
// out no tensors; the scheme only translates requests into its calls.
//
// Its choices, where the simulation leaves one:
//
//   - Shape: the cache is built from the Config the baselines are —
//     Model's attention layers (AttentionLayers: a recurrent layer keeps
//     no KV a token, so a token is Model.TokenBytes, as the baselines
//     count it; its state is the hybrid schemes'), KVHeads, HeadDim and
//     ElemBytes (a latent KV as a key and a value of half its elements
//     each), BlockTokens (the unit
//     of prefix hashing), MaxContext, MaxSeqs (its slots: a preempted
//     sequence keeps its slot, which Simulate allows for, as it resumes
//     preempted requests before it admits new ones) and Budget.
//   - Tokens: a request's prompt is SimRequest.Tokens, so Mooncake's equal
//     hash_ids give equal tokens and the cache's own chained hash finds
//     the shared prefixes; no extra key.
//   - Expected output, for kvcache's CanAdmit: 0 (room for the prompt
//     alone, as the paged scheme admits) unless ExpectOutput is set; then
//     what a server knows, not the trace's output — the mean output
//     length of the requests finished so far, rounded up (0 before the
//     first finishes), less what the request has generated. A preempted
//     request, which keeps a slot of its own, is asked about with
//     kvcache's CanResume, for its whole context (and the expected output
//     left) as the paged scheme asks: the plan its Resume carries out, so
//     that a Resume the simulation makes never fails, and one whose next
//     chunk would preempt it again waits.
//   - Scheduling a step ahead (Options.AdmitAhead): Reserve is
//     kvcache's Seq.Reserve, which commits a prompt chunk's pages within
//     the free budget while the step before computes; the Append of the
//     chunk then finds them.
//   - Mapping ahead, modelled rather than run: simulated steps do not run
//     in wall time, so the cache's mapping-ahead goroutine is off
//     (kvcache's MapAhead -1) and every page is committed by the Append
//     that needs it, which keeps the run deterministic. Simulate counts
//     the driver calls of each call (DriverCalls) and, unless NoMapAhead,
//     prices those of a decode that only commit memory as the goroutine's,
//     made during the step before (MapAhead is BlockTokens, kvcache's
//     default window): see DriverCost. The cache's calls are the same
//     either way, only whose path they are on differs.
//
// Stats, from kvcache.Stats: Stored is the bytes holding a running
// sequence's token, each once however many sequences map it; Logical the
// tokens of the running sequences, a shared one in each. Cached is what
// the cache keeps for reuse and gives back first when memory is needed
// (before it fails an Append): cached prefix store units, the pages idle
// slots keep (deferred reclaim) and the surplus pages of running
// sequences' slots (a short sequence in a slot a longer one left).
// InUse is the rest of what it has committed: the pages holding the
// running sequences' tokens, their own and the prefix store's they map,
// so that InUse - Stored is the waste of the pages in use — the tail
// of each sequence's last page (PerLayer: of each region's) — as the
// paged scheme's is the tail of its last block; InUse + Cached is all
// the cache has committed, kvcache.Stats.Committed. Commits counts the
// cache's commit calls to its arena (one per region of a run of units in
// the PerLayer layout; one for a run of prefix store units side by side;
// none for a store unit that reuses an evicted one's memory; borrowing a
// store unit's pages is not one: it takes no memory). The prefix figures are the cache's, in tokens (whole blocks of
// BlockTokens); Evictions counts the prefix store units evicted.
type Cache struct {
	cfg  Config
	opts CacheOptions

	drv   *sim.Driver
	space *vaspace.Space
	mem   *physical.Memory
	cache *kvcache.Cache

	// seqs are the live sequences (running or preempted), by request ID.
	seqs map[int]*cacheSeq
	// finished and outputs count the requests finished and the output
	// tokens they generated: the expected output's mean.
	finished int
	outputs  int64
	// prompt is the tokens of the last prompt CanAdmit was asked about (a
	// request waits at the front of the queue, asked every step), in
	// spare's memory before: kvcache's CanAdmit remembers the last slice
	// it was asked about, which must not change under it, so a new
	// request's tokens go to the other buffer.
	prompt, spare []int
	promptOf      int
	// step holds the tokens of one Append, reused: a decode step appends
	// one token to every running sequence, and allocates nothing for it.
	step []int
}

// cacheSeq is a live sequence: its kvcache.Seq, whether it is preempted,
// and next, the position of its next token Simulate appends. The cache's
// Seq holds Len() >= next tokens: after a recompute resume, the tokens
// from next to Len() have their pages already (Resume committed them)
// and are recomputed into them.
type cacheSeq struct {
	seq       *kvcache.Seq
	preempted bool
	next      int
	// marked is what the sequence was last told is written (MarkWritten).
	marked int
}

// markComputed tells cs's sequence that its tokens below next are
// written (MarkWritten), so its whole prompt units become shareable as a
// model's would, and none it never computed.
func (cs *cacheSeq) markComputed() error {
	if cs.next <= cs.marked {
		return nil
	}
	if err := cs.seq.MarkWritten(cs.next); err != nil {
		return err
	}
	cs.marked = cs.next
	return nil
}

// NewCache makes the scheme: a sim driver of one device holding
// cfg.Budget (rounded up to the page), and a cache over it. cfg must pass
// Config.Check; options kvcache refuses (a bad layout, mode or page)
// are errors marked driver.ErrInvalid. Close releases it all.
func NewCache(cfg Config, opts CacheOptions) (*Cache, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	cfg.defaults()
	if opts.Preempt == 0 {
		opts.Preempt = kvcache.Drop
	}
	if opts.Preempt != kvcache.Drop && opts.Preempt != kvcache.Swap {
		return nil, errors.Wrapf(driver.ErrInvalid, "serving: kvcache: preempt mode %s, want drop or swap", opts.Preempt)
	}
	if opts.PageSize == 0 {
		opts.PageSize = 2 * units.MiB
	}
	page := opts.PageSize
	if page&(page-1) != 0 || page < 4*units.KiB || page > units.GiB {
		return nil, errors.Wrapf(driver.ErrInvalid, "serving: kvcache: a page of %d bytes, want a power of two from 4 KiB to 1 GiB", page)
	}
	dt, err := elemDType(cfg.Model)
	if err != nil {
		return nil, err
	}
	kvHeads, headDim, err := cacheShape(cfg.Model)
	if err != nil {
		return nil, err
	}
	capacity := (cfg.Budget + page - 1) / page * page
	drv, err := sim.New(sim.Options{Devices: 1, Capacity: capacity, Granularity: page})
	if err != nil {
		return nil, errors.Wrapf(err, "serving: kvcache: a sim device of %s", units.Bytes(capacity))
	}
	k := &Cache{cfg: cfg, opts: opts, drv: drv, space: vaspace.New(drv), mem: physical.New(drv),
		seqs: map[int]*cacheSeq{}, promptOf: -1}
	k.cache, err = kvcache.New(k.space, k.mem, kvcache.Config{
		Layers: cfg.Model.AttentionLayers(), KVHeads: kvHeads, HeadDim: headDim, DType: dt,
		BlockTokens: cfg.BlockTokens, MaxContext: cfg.MaxContext, MaxSeqs: cfg.MaxSeqs,
		Budget: cfg.Budget, PageSize: page, Layout: opts.Layout, MapAhead: -1, Events: opts.Events,
	})
	if err != nil {
		return nil, errors.CombineErrors(errors.Wrapf(err, "serving"), k.closeDriver())
	}
	return k, nil
}

// cacheShape is the KVHeads and HeadDim of package kvcache's Config for
// m. The cache keeps a key and a value a layer; a latent KV (MLA) is one
// vector, which it keeps as two halves of HeadDim/2, the same bytes a
// token and a layer. An odd latent has no such halves and is refused.
func cacheShape(m Model) (kvHeads, headDim int, err error) {
	if !m.Latent {
		return m.KVHeads, m.HeadDim, nil
	}
	if m.HeadDim%2 != 0 {
		return 0, 0, errors.Wrapf(driver.ErrInvalid, "serving: kvcache: model %q has a latent KV of %d elements, an odd number this cache cannot keep as a key and a value of half each", m.Name, m.HeadDim)
	}
	return m.KVHeads, m.HeadDim / 2, nil
}

// elemDType is a dtype of the model's element size: the cache cares
// about the bytes only.
func elemDType(m Model) (tensor.DType, error) {
	switch m.ElemBytes {
	case 1:
		return tensor.Uint8, nil
	case 2:
		return tensor.Float16, nil
	case 4:
		return tensor.Float32, nil
	case 8:
		return tensor.Float64, nil
	}
	return 0, errors.Wrapf(driver.ErrInvalid, "serving: kvcache: model %q has %d-byte elements, want 1, 2, 4 or 8", m.Name, m.ElemBytes)
}

// Close ends every sequence and releases the cache, its address space,
// its memory and the sim driver. Closing twice is an error marked
// driver.ErrClosed.
func (k *Cache) Close() error {
	if err := k.made("close"); err != nil {
		return err
	}
	if k.cache.Closed() {
		return driver.Closed("serving: kvcache: close: closed already")
	}
	err := k.cache.Close()
	clear(k.seqs)
	return errors.CombineErrors(err, k.closeDriver())
}

func (k *Cache) closeDriver() error {
	return errors.CombineErrors(errors.CombineErrors(k.space.Close(), k.mem.Close()), k.drv.Close())
}

// DriverCalls is every driver call the cache has made, as its sim driver
// counts them.
func (k *Cache) DriverCalls() sim.Calls {
	if k == nil || k.drv == nil {
		return sim.Calls{}
	}
	return k.drv.Calls()
}

// MapAhead is the window of mapping ahead Simulate models, in tokens:
// BlockTokens (kvcache's default), 0 with NoMapAhead.
func (k *Cache) MapAhead() int {
	if k == nil || k.opts.NoMapAhead {
		return 0
	}
	return k.cfg.BlockTokens
}

// Name is "this cache (LAYOUT)".
func (k *Cache) Name() string {
	if k == nil {
		return "this cache"
	}
	if k.cache != nil && !k.cache.Closed() {
		return fmt.Sprintf("this cache (%s)", k.cache.Config().Layout)
	}
	return fmt.Sprintf("this cache (%s)", k.opts.Layout)
}

// String is the cache's shape in a line.
func (k *Cache) String() string {
	if k == nil || k.cache == nil {
		return "kvcache: not made by NewCache"
	}
	return k.cache.String()
}

// Reserved is the address space the cache's slots reserve: MaxSeqs slots
// of MaxContext tokens each, committed only as tokens arrive.
func (k *Cache) Reserved() uint64 {
	if k == nil || k.cache == nil {
		return 0
	}
	return k.cache.SlotBytes() * uint64(k.cfg.MaxSeqs)
}

// made refuses a scheme NewCache did not make (nil, or the zero value).
func (k *Cache) made(op string) error {
	if k == nil || k.cache == nil {
		return errors.Wrapf(driver.ErrInvalid, "serving: kvcache: %s: the scheme was not made by NewCache", op)
	}
	return nil
}

func (k *Cache) usable(op string, r *SimRequest) error {
	if err := k.made(op); err != nil {
		return err
	}
	return checkRequest("kvcache", op, r)
}

// live is r's sequence, which must be live and, unless preempted is
// wanted, running.
func (k *Cache) live(op string, r *SimRequest, preempted bool) (*cacheSeq, error) {
	if err := k.usable(op, r); err != nil {
		return nil, err
	}
	cs := k.seqs[r.id]
	switch {
	case cs == nil:
		return nil, errors.Wrapf(driver.ErrInvalid, "serving: kvcache: %s request %d: it is not admitted", op, r.id)
	case cs.preempted != preempted:
		return nil, errors.Wrapf(driver.ErrInvalid, "serving: kvcache: %s request %d: it is %s", op, r.id,
			map[bool]string{false: "running", true: "preempted"}[cs.preempted])
	}
	return cs, nil
}

// expectedOutput is the guess for a request that has generated generated
// tokens: the mean output of the finished requests, rounded up, less
// those; 0 unless the options ask for it.
func (k *Cache) expectedOutput(generated int) int {
	if !k.opts.ExpectOutput || k.finished == 0 {
		return 0
	}
	mean := int((k.outputs + int64(k.finished) - 1) / int64(k.finished))
	return max(mean-generated, 0)
}

// promptTokens is r's prompt, kept for the next call about r.
func (k *Cache) promptTokens(r *SimRequest) []int {
	if k.promptOf != r.id {
		k.prompt, k.spare = r.Tokens(k.spare[:0], 0, r.Prompt()), k.prompt
		k.promptOf = r.id
	}
	return k.prompt
}

// CanAdmit asks kvcache's CanAdmit about a new request's prompt and
// expected output, and its CanResume about a preempted one (see Cache).
func (k *Cache) CanAdmit(r *SimRequest) bool {
	if k.usable("can admit", r) != nil {
		return false
	}
	if cs := k.seqs[r.id]; cs != nil {
		if !cs.preempted {
			return false
		}
		// Room for its whole context, as the paged scheme asks: a resume
		// whose next chunk would preempt it again waits.
		more := r.Context() - cs.seq.Len() + k.expectedOutput(r.Context()-r.Prompt())
		ok, err := cs.seq.CanResume(max(more, 0))
		return err == nil && ok
	}
	if r.Prompt() < 1 {
		return false
	}
	ok, err := k.cache.CanAdmit(k.promptTokens(r), 0, k.expectedOutput(r.Context()-r.Prompt()))
	return err == nil && ok
}

// Admit admits r's prompt: the tokens the prefix store held of it are
// held.
func (k *Cache) Admit(r *SimRequest) (int, error) {
	if err := k.usable("admit", r); err != nil {
		return 0, err
	}
	if k.seqs[r.id] != nil {
		return 0, errors.Wrapf(driver.ErrInvalid, "serving: kvcache: admit request %d: it is admitted already", r.id)
	}
	seq, err := k.cache.Admit(k.promptTokens(r), 0)
	if err != nil {
		return 0, errors.Wrapf(err, "serving: kvcache: admit request %d", r.id)
	}
	held := seq.Matched()
	k.seqs[r.id] = &cacheSeq{seq: seq, next: held, marked: held}
	k.checkAfter("admit")
	return held, nil
}

// Fork starts child as a fork of parent's sequence (kvcache's Seq.Fork):
// it shares the pages of parent's tokens, the prompt's last, partly
// written unit copied at the child's (or parent's) next Append. parent
// must be running with every token appended computed; child must be
// another sample of its request, not admitted. kvcache's refusals come
// back marked as they are (ErrOutOfMemory, ErrBusy, ErrUnsupported) and
// change nothing.
func (k *Cache) Fork(parent, child *SimRequest) error {
	cs, err := k.live("fork", parent, false)
	if err != nil {
		return err
	}
	if err := k.usable("fork", child); err != nil {
		return err
	}
	if err := checkFork("kvcache", parent, child, k.seqs[child.id] != nil, cs.next, cs.seq.Len()); err != nil {
		return err
	}
	if err := cs.markComputed(); err != nil {
		return errors.Wrapf(err, "serving: kvcache: fork request %d", parent.id)
	}
	seq, err := cs.seq.Fork()
	if err != nil {
		return errors.Wrapf(err, "serving: kvcache: fork request %d into %d", parent.id, child.id)
	}
	k.seqs[child.id] = &cacheSeq{seq: seq, next: cs.next, marked: cs.next}
	k.checkAfter("fork")
	return nil
}

// Append appends r's tokens [next, next+n) to its sequence — those it
// does not hold room for already.
func (k *Cache) Append(r *SimRequest, n int) error {
	cs, err := k.live("append", r, false)
	if err != nil {
		return err
	}
	if n < 0 || n > r.context-cs.next {
		return errors.Wrapf(driver.ErrInvalid, "serving: kvcache: append %d tokens to request %d at %d: want 0 to %d",
			n, r.id, cs.next, r.context-cs.next)
	}
	from, to := max(cs.next, cs.seq.Len()), cs.next+n
	if from < to {
		k.step = r.Tokens(k.step[:0], from, to)
		if _, err := cs.seq.Append(k.step); err != nil {
			return errors.Wrapf(err, "serving: kvcache: append to request %d", r.id)
		}
	}
	cs.next = to
	k.checkAfter("append")
	return nil
}

// Reserve commits ahead the pages of r's next n tokens, those after the
// ones appended (kvcache's Seq.Reserve: the free budget's, idle slots'
// and cached units' pages, evicting those as the Append would, never a
// running sequence's), and returns how many of them have their pages: n
// may reach one past the context, a decode's next token.
func (k *Cache) Reserve(r *SimRequest, n int) (int, error) {
	cs, err := k.live("reserve", r, false)
	if err != nil {
		return 0, err
	}
	if n < 0 || n > r.context+1-cs.next || cs.next+n > k.cfg.MaxContext {
		return 0, errors.Wrapf(driver.ErrInvalid, "serving: kvcache: reserve %d tokens of request %d at %d: want 0 to %d",
			n, r.id, cs.next, min(r.context+1, k.cfg.MaxContext)-cs.next)
	}
	// Tokens below Len have their pages already (a recompute resume's).
	held := max(cs.seq.Len()-cs.next, 0)
	if n <= held {
		return n, nil
	}
	got, err := cs.seq.Reserve(n - held)
	if err != nil {
		return 0, errors.Wrapf(err, "serving: kvcache: reserve for request %d", r.id)
	}
	k.checkAfter("reserve")
	return held + got, nil
}

// Warm fills the cache's page pool with the pages n tokens' KV takes
// (kvcache's Cache.Warm: created ahead, within the free budget; where the
// budget is spent, idle slots' pages taken into the pool and the kept
// mappings of the cached units the commits would evict unmapped, ahead),
// adding at most most pages to what it keeps (negative: no bound), so
// that the commits of the next prompt chunks only map.
func (k *Cache) Warm(n, most int) error {
	_, err := k.warm(n, most)
	return err
}

// warm is Warm, and reports whether most bounded what it asked for
// (warmWithin asks again with a larger most while time is left).
func (k *Cache) warm(n, most int) (bounded bool, err error) {
	if err := k.made("warm"); err != nil {
		return false, err
	}
	if n < 0 {
		return false, errors.Wrapf(driver.ErrInvalid, "serving: kvcache: warm the pool for %d tokens", n)
	}
	page := k.cache.Config().PageSize
	const maxPages = uint64(1) << 30 // the budget bounds them first
	pages := maxPages
	if hi, b := bits.Mul64(uint64(n), k.cfg.Model.TokenBytes()); hi == 0 && b/page < maxPages {
		pages = b/page + 1 // and a page a chunk straddles
		if b%page != 0 {
			pages++
		}
	}
	if most >= 0 {
		if most := uint64(k.cache.Stats().PooledPages) + uint64(most); most < pages {
			pages, bounded = most, true
		}
	}
	_, err = k.cache.Warm(int(min(pages, maxPages)))
	return bounded, errors.Wrapf(err, "serving: kvcache: warm the pool")
}

// ClearKept unmaps, ahead, at most pages pages of the kept mappings the
// cache's free slots hold that no match has borrowed (kvcache's
// Cache.ClearKept), so that the admission sharing a slot's prefix
// reuses the rest with no unmap on its path.
func (k *Cache) ClearKept(pages int) error {
	if err := k.made("clear kept mappings"); err != nil {
		return err
	}
	_, err := k.cache.ClearKept(pages)
	return errors.Wrapf(err, "serving: kvcache: clear kept mappings")
}

// Computed marks the tokens appended to r's sequence written
// (kvcache's MarkWritten). Simulate calls it as soon as Append has
// scheduled them into a step, whose every layer writes the batch's keys
// and values before its attention reads any, so that a request admitted
// later in the same pass shares them, as the paged scheme shares the
// blocks it registers at Append (see marksScheduled). A sequence
// preempted before it is told never shares its prefix store units of
// that step.
func (k *Cache) Computed(r *SimRequest) error {
	cs, err := k.live("mark computed", r, false)
	if err != nil {
		return err
	}
	if err := cs.markComputed(); err != nil {
		return errors.Wrapf(err, "serving: kvcache: mark request %d computed", r.id)
	}
	return nil
}

// Finish frees r's sequence: its slot keeps its pages, its prompt's
// store units stay cached. Its output counts in the expected output.
func (k *Cache) Finish(r *SimRequest) error {
	if err := k.usable("finish", r); err != nil {
		return err
	}
	cs := k.seqs[r.id]
	if cs == nil {
		return errors.Wrapf(driver.ErrInvalid, "serving: kvcache: finish request %d: it is not admitted", r.id)
	}
	if err := errors.CombineErrors(cs.markComputed(), cs.seq.Free()); err != nil {
		return errors.Wrapf(err, "serving: kvcache: finish request %d", r.id)
	}
	delete(k.seqs, r.id)
	k.finished++
	k.outputs += int64(r.Context() - r.Prompt())
	k.checkAfter("finish")
	return nil
}

// Preempt preempts r's sequence with the scheme's mode: recompute with
// Drop.
func (k *Cache) Preempt(r *SimRequest) (recompute bool, err error) {
	cs, err := k.live("preempt", r, false)
	if err != nil {
		return false, err
	}
	if err := cs.seq.Preempt(k.opts.Preempt); err != nil {
		return false, errors.Wrapf(err, "serving: kvcache: preempt request %d", r.id)
	}
	cs.preempted = true
	k.checkAfter("preempt")
	return k.opts.Preempt == kvcache.Drop, nil
}

// Resume resumes r's sequence in its slot: after a swap it holds all its
// tokens; after a drop, the prefix the store still held (Matched), and
// pages for the rest, which Simulate recomputes.
func (k *Cache) Resume(r *SimRequest) (int, error) {
	cs, err := k.live("resume", r, true)
	if err != nil {
		return 0, err
	}
	step, err := cs.seq.Resume()
	if err != nil {
		return 0, errors.Wrapf(err, "serving: kvcache: resume request %d", r.id)
	}
	cs.preempted, cs.next = false, step.Pos
	cs.marked = cs.seq.Written() // what a swap brought back, or the prefix matched again
	k.checkAfter("resume")
	return step.Pos, nil
}

// Stats maps the cache's figures (see Cache).
func (k *Cache) Stats() Stats {
	if k == nil || k.cache == nil {
		return Stats{}
	}
	st := k.cache.Stats()
	page := k.cache.Config().PageSize
	block := int64(k.cfg.BlockTokens)
	cached := uint64(st.CachedPages+st.IdlePages+st.SurplusPages) * page
	return Stats{
		InUse:         st.Committed - min(cached, st.Committed),
		Stored:        st.UsedBytes,
		Logical:       uint64(st.TokensStored) * k.cfg.Model.TokenBytes(),
		Cached:        cached,
		Commits:       int64(st.Commits),
		PrefixQueried: int64(st.PrefixQueries) * block,
		PrefixHit:     int64(st.PrefixHits) * block,
		Evictions:     int64(st.Evictions),
	}
}

// checkAfter checks the scheme's books against the cache's after a
// change, in builds with the invariants tag (the cache checks its own
// then).
func (k *Cache) checkAfter(op string) {
	if invariants.Enabled {
		invariants.Fail("serving: kvcache: "+op, k.checkSeqs())
	}
}

// Check runs the cache's Check, and compares the scheme's sequences with
// the cache's.
func (k *Cache) Check() error {
	if err := k.made("check"); err != nil {
		return err
	}
	return errors.CombineErrors(k.cache.Check(), k.checkSeqs())
}

// checkSeqs reports every sequence of the scheme's that is not as the
// cache has it: live in it, running or preempted as the scheme says, a
// running one holding at least the tokens Simulate appended.
func (k *Cache) checkSeqs() error {
	var errs error
	fail := func(format string, args ...any) {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf("serving: kvcache: "+format, args...))
	}
	running, preempted := 0, 0
	for id, cs := range k.seqs {
		if cs.preempted {
			preempted++
		} else {
			running++
			if n := cs.seq.Len(); n < cs.next {
				fail("request %d is at token %d, its sequence holds %d", id, cs.next, n)
			}
		}
	}
	if st := k.cache.Stats(); st.Running != running || st.Preempted != preempted {
		fail("%d sequences running and %d preempted, the cache has %d and %d", running, preempted, st.Running, st.Preempted)
	}
	return errs
}
