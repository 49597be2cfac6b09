package kvcache

import (
	"fmt"
	"slices"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/isnil"
	"github.com/vmarena/vmarena/internal/lockrank"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/vaspace"
)

// GroupKind is the kind of a hybrid model's layer group.
type GroupKind uint8

const (
	// FullAttention layers attend to every token before: each token keeps
	// a key and a value of KVHeads*HeadDim elements a layer.
	FullAttention GroupKind = iota
	// SlidingWindow layers attend to the last Window tokens only.
	SlidingWindow
	// Latent layers keep one latent row a token and a layer (multi-head
	// latent attention, DeepSeek-V2/V3): HeadDim elements, no separate key
	// and value.
	Latent
	// Recurrent layers (Mamba, linear attention) keep a fixed-size state
	// per sequence, StateBytes a layer, whatever its length.
	Recurrent
	numGroupKinds
)

func (k GroupKind) String() string {
	switch k {
	case FullAttention:
		return "full"
	case SlidingWindow:
		return "window"
	case Latent:
		return "latent"
	case Recurrent:
		return "recurrent"
	}
	return fmt.Sprintf("GroupKind(%d)", uint8(k))
}

// attends says a group of kind k keeps rows a token (a Cache of its own).
func (k GroupKind) attends() bool { return k < Recurrent }

// Group is one layer group of a hybrid model: layers of one kind and
// shape.
type Group struct {
	Kind GroupKind
	// Layers is the number of layers of this kind.
	Layers int
	// KVHeads is the attention kinds' KV heads (Latent: 1).
	KVHeads int
	// HeadDim is the attention kinds' head width (Latent: the latent
	// row's width, one row a token and a layer, not a K and a V).
	HeadDim int
	// Window is SlidingWindow's tokens attended.
	Window int
	// StateBytes is Recurrent's bytes of state a layer keeps per sequence
	// (1 to 2^40; a Hybrid's recurrent layers are at most 2^20 in all,
	// their state at most 2^40 bytes a sequence).
	StateBytes uint64
}

// HybridConfig is the shape of a hybrid cache: its groups, the sequences
// it holds and the one budget they all draw on.
type HybridConfig struct {
	// Groups are the model's layer groups, at least one.
	Groups []Group
	DType  tensor.DType
	// BlockTokens is the unit of prefix hashing and of recurrent
	// checkpoints, in tokens (default 16).
	BlockTokens int
	// MaxContext is the most tokens one sequence holds.
	MaxContext int
	// MaxSeqs is the number of sequence slots (every group has as many).
	MaxSeqs int
	// Budget is the most memory all groups together keep committed
	// (default, 0: the device's capacity). SetBudget changes it.
	Budget uint64
	// PageSize is every group's unit of commit (default, 0: the device's
	// recommended granularity).
	PageSize uint64
	// Device holds every page.
	Device driver.DeviceID
	// Ring asks sliding-window groups for the double-mapped ring (the
	// last Window tokens one contiguous slice).
	Ring bool
	// MapAhead is every attention group's mapping-ahead watermark in
	// tokens (Config.MapAhead: default, 0, BlockTokens; negative: none):
	// each group's goroutine commits a running sequence's next unit
	// within the one budget's free memory, between the Hybrid's calls.
	MapAhead int
	// PrefillChunk is the most tokens the caller appends at once while a
	// prompt is prefilled after Admit (a chunked prefill: an engine's
	// token budget a step), or 0: the rest of the prompt in one Append.
	// CanAdmit and Admit plan a sliding-window group for what a prefill
	// in such chunks holds at its peak — the window behind a chunk and
	// the chunk — rather than the whole prompt, which one Append holds
	// at once before anything goes behind the window; the other groups
	// hold the whole prompt either way. An Append of more than
	// PrefillChunk tokens may then find no room (ErrOutOfMemory).
	PrefillChunk int
	// NoPrefixSharing turns prefix sharing off in every group.
	NoPrefixSharing bool
	// Events, when set, is told every group's prefix index changes, each
	// BlockStored and BlockRemoved naming its group (GroupIdx), with the
	// Hybrid's lock held: it must not call the Hybrid.
	Events func(EventBatch)
}

// Hybrid is a KV cache of a model whose layers are of several kinds: one
// Cache per attention group and a state store for the recurrent groups,
// under one budget (hybrid_share.go). Safe for concurrent use.
type Hybrid struct {
	cfg HybridConfig
	// mu orders every call: the groups' budgets move under it, and it is
	// held across the groups' calls (lockrank KVHybrid, before KVCache).
	mu     lockrank.Mutex[lockrank.KVHybrid]
	groups []hybridGroup
	rec    *recurrentStore // nil without a recurrent group
	budget uint64
	seqs   map[*HybridSeq]struct{}
	tick   uint64
	closed bool
	// budgetWarmed says WarmBudget filled the pools: a group's commit
	// then takes the other groups' pooled pages before its own cached
	// units (runLocked).
	budgetWarmed bool
	counts       hybridCounts
}

// hybridGroup is one group: its Cache (attention kinds), or its first
// layer in the recurrent store's numbering.
type hybridGroup struct {
	Group
	c *Cache
	// windowHeld says the Cache keeps only the window (Config.Window);
	// false where sliding windows are not built: the group holds every
	// token as a full-attention group does.
	windowHeld bool
	first      int
}

// groupWhat names group i's part of the call what names, for the
// group's own refusals.
func (h *Hybrid) groupWhat(what func() string, i int) func() string {
	return func() string { return fmt.Sprintf("%s: group %d (%s)", what(), i, h.groups[i].Kind) }
}

// maxRecurrentLayers and maxStateBytes bound a Hybrid's recurrent layers
// in all and a sequence's state, every recurrent layer's StateBytes.
const (
	maxRecurrentLayers = 1 << 20
	maxStateBytes      = 1 << 40
)

type hybridCounts struct {
	admits, failedAdmits, frees, forks, preemptions, resumes, checkpointHits int
}

// HybridSeq is one sequence of a Hybrid: a Seq in every attention group
// and a state slot in the recurrent store, all of the same tokens.
//
// Invariant: every group's Seq holds at least n tokens (a group whose
// prefix store lent more holds more: the next Append gives it only the
// tokens past its own); a running sequence with recurrent groups has a
// state, of its first n tokens.
type HybridSeq struct {
	h        *Hybrid
	seqs     []*Seq // per group; nil for a recurrent group
	state    *stateSlot
	prompt   []int
	chain    []uint64
	n        int
	matched  int
	written  int
	running  bool
	freed    bool
	admitted uint64
}

// HybridStep is what an Append or a Resume made room for: positions
// [Pos, Pos+N) for the caller to compute (the recurrent state is that of
// the first Pos tokens). Groups[i] is group i's Step (zero for a
// recurrent group): after an Admit or a Resume a group may start later
// than Pos (its rows below its own Pos are there, and may be shared and
// read-only), and the caller writes each group's rows from its own Pos.
type HybridStep struct {
	Pos, N int
	Groups []Step
}

// HybridStats is a Hybrid's figures.
type HybridStats struct {
	// Budget is the one budget; Committed the memory all groups keep
	// committed (pooled pages and recurrent states included).
	Budget, Committed uint64
	// Groups[i] is attention group i's Stats (zero for a recurrent one).
	Groups []Stats
	// WindowHeld[i] says sliding-window group i keeps only its window
	// (false where sliding windows are not built: it holds every token).
	WindowHeld []bool
	// StateBytes is the recurrent store's committed memory: sequences'
	// states and checkpoints; StateSlots and Checkpoints count them.
	StateBytes              uint64
	StateSlots, Checkpoints int
	// CheckpointHits is the admissions and resumes that started from a
	// checkpoint; CheckpointsMade and CheckpointsEvicted are cumulative.
	CheckpointHits, CheckpointsMade, CheckpointsEvicted int
	// Sequences are live, Running of them running.
	Sequences, Running int
	// Admits, FailedAdmits (refused for memory, nothing changed), Frees,
	// Forks, Preemptions and Resumes are cumulative.
	Admits, FailedAdmits, Frees, Forks, Preemptions, Resumes int
}

// NewHybrid makes a hybrid cache of cfg's groups on space and mem: one
// Cache per attention group (Latent groups in the Contiguous layout, the
// others in the layout PickLayout picks; each mapping ahead as
// cfg.MapAhead says) and one
// recurrent state store, every page counted against cfg.Budget. It
// refuses a config it cannot hold (ErrInvalid, naming the field).
func NewHybrid(space *vaspace.Space, mem *physical.Memory, cfg HybridConfig) (*Hybrid, error) {
	bad := func(format string, args ...any) error {
		return errors.Wrapf(driver.ErrInvalid, "kvcache: new hybrid cache: "+format, args...)
	}
	if isnil.Is(space) || isnil.Is(mem) || isnil.Is(space.Driver()) {
		return nil, bad("the address space or the physical memory is nil, or has no driver")
	}
	if len(cfg.Groups) == 0 || len(cfg.Groups) > 64 {
		return nil, errors.WithHint(bad("%d groups: a hybrid cache has 1 to 64", len(cfg.Groups)), "start from a preset: kvcache.HybridPreset(\"gemma-3-27b\")")
	}
	cfg.Groups = slices.Clone(cfg.Groups)
	attention, windows := 0, 0
	// recLayers and stateBytes are the recurrent layers in all and a
	// sequence's state (every recurrent layer's StateBytes): at most
	// maxRecurrentLayers and maxStateBytes, so that the store's slot
	// and its range are products that fit.
	recLayers, stateBytes := 0, uint64(0)
	for i, g := range cfg.Groups {
		switch {
		case g.Kind >= numGroupKinds:
			return nil, bad("group %d: Kind %d is none of FullAttention, SlidingWindow, Latent, Recurrent", i, g.Kind)
		case g.Layers < 1:
			return nil, bad("group %d: Layers %d must be at least 1", i, g.Layers)
		case g.Kind.attends() && (g.KVHeads < 1 || g.HeadDim < 1):
			return nil, bad("group %d (%s): KVHeads %d and HeadDim %d must be at least 1", i, g.Kind, g.KVHeads, g.HeadDim)
		case g.Kind == Latent && (g.KVHeads != 1 || g.HeadDim%2 != 0):
			return nil, bad("group %d (latent): KVHeads %d must be 1 and HeadDim %d even (the latent row is kept as two halves)", i, g.KVHeads, g.HeadDim)
		case g.Kind == SlidingWindow && g.Window < 1:
			return nil, bad("group %d (window): Window %d must be at least 1 token", i, g.Window)
		case g.Kind != SlidingWindow && g.Window != 0:
			return nil, bad("group %d (%s): Window %d is for sliding-window groups only", i, g.Kind, g.Window)
		case g.Kind == Recurrent && (g.StateBytes == 0 || g.StateBytes > 1<<40 || g.KVHeads != 0 || g.HeadDim != 0):
			return nil, bad("group %d (recurrent): StateBytes %d must be 1 to 2^40, KVHeads and HeadDim 0", i, g.StateBytes)
		case g.Kind != Recurrent && g.StateBytes != 0:
			return nil, bad("group %d (%s): StateBytes is for recurrent groups only", i, g.Kind)
		}
		if g.Kind == Recurrent {
			if g.Layers > maxRecurrentLayers-recLayers || uint64(g.Layers) > (maxStateBytes-stateBytes)/g.StateBytes {
				return nil, bad("group %d (recurrent): %d layers of %d bytes: the recurrent layers are at most %d in all, their state at most 2^40 bytes a sequence",
					i, g.Layers, g.StateBytes, maxRecurrentLayers)
			}
			recLayers += g.Layers
			stateBytes += uint64(g.Layers) * g.StateBytes
		}
		attention += b2i(g.Kind.attends())
		windows += b2i(g.Kind == SlidingWindow)
	}
	if attention == 0 {
		return nil, bad("no attention group: a hybrid cache needs at least one (a model of recurrent layers only keeps no KV)")
	}
	if cfg.Ring && windows == 0 {
		return nil, bad("Ring needs a sliding-window group")
	}
	if cfg.PrefillChunk < 0 || cfg.PrefillChunk > cfg.MaxContext {
		return nil, bad("PrefillChunk %d: want 0 (the whole prompt in one Append) to MaxContext %d", cfg.PrefillChunk, cfg.MaxContext)
	}
	if cfg.BlockTokens == 0 {
		cfg.BlockTokens = 16
	}
	if cfg.MapAhead == 0 {
		cfg.MapAhead = cfg.BlockTokens
	}
	devs := space.Driver().Devices()
	if err := driver.CheckDevice(func() string { return "kvcache: new hybrid cache" }, cfg.Device, len(devs)); err != nil {
		return nil, err
	}
	if cfg.PageSize == 0 {
		cfg.PageSize = devs[cfg.Device].RecommendedGranularity
	}
	u, err := mem.Usage(cfg.Device)
	if err != nil {
		return nil, errors.Wrapf(err, "kvcache: new hybrid cache")
	}
	if cfg.Budget == 0 {
		cfg.Budget = u.Capacity
	}
	h := &Hybrid{cfg: cfg, budget: cfg.Budget, seqs: map[*HybridSeq]struct{}{}}
	fail := func(err error) (*Hybrid, error) { return nil, errors.CombineErrors(err, h.closeParts()) }
	nrec := 0
	for i, g := range cfg.Groups {
		hg := hybridGroup{Group: g}
		if !g.Kind.attends() {
			hg.first = nrec
			nrec += g.Layers
			h.groups = append(h.groups, hg)
			continue
		}
		cc := Config{Layers: g.Layers, KVHeads: g.KVHeads, HeadDim: g.HeadDim, DType: cfg.DType,
			BlockTokens: cfg.BlockTokens, MaxContext: cfg.MaxContext, MaxSeqs: cfg.MaxSeqs, Budget: cfg.Budget,
			PageSize: cfg.PageSize, Layout: AutoLayout, Device: cfg.Device, MapAhead: cfg.MapAhead, NoPrefixSharing: cfg.NoPrefixSharing}
		if g.Kind == Latent {
			// The latent row kept as a "key" and a "value" of half of it
			// each, side by side in the Contiguous layout: layer l's row of
			// a token is its K's HeadDim/2 elements then its V's.
			cc.HeadDim, cc.Layout = g.HeadDim/2, Contiguous
		}
		if cfg.Events != nil {
			idx, events, kind := i, cfg.Events, ""
			switch g.Kind {
			case SlidingWindow:
				kind = "sliding_window"
			case Latent:
				kind = "mla_attention"
			}
			cc.Events = func(b EventBatch) {
				for _, e := range b.Events {
					switch e := e.(type) {
					case *BlockStored:
						e.GroupIdx, e.SpecKind, e.SlidingWindow = idx, kind, g.Window
					case *BlockRemoved:
						e.GroupIdx = idx
					}
				}
				events(b)
			}
		}
		if g.Kind == SlidingWindow {
			cc.Window, cc.Ring = g.Window, cfg.Ring
			if cfg.Ring {
				// A ring is PerLayer, and shares nothing (its pages are
				// written over as it wraps): with it no prefix is shared
				// in any group.
				cc.Layout, cc.NoPrefixSharing = PerLayer, true
			}
		}
		c, err := newCache(space, mem, cc, h)
		if g.Kind == SlidingWindow && errors.Is(err, driver.ErrUnsupported) {
			// Sliding windows not built: the group keeps every token.
			cc.Window, cc.Ring = 0, false
			c, err = newCache(space, mem, cc, h)
		} else {
			hg.windowHeld = g.Kind == SlidingWindow
		}
		if err != nil {
			return fail(errors.Wrapf(err, "kvcache: new hybrid cache: group %d (%s)", i, g.Kind))
		}
		hg.c = c
		h.groups = append(h.groups, hg)
		c.shareGrant(0)
	}
	if nrec > 0 {
		if h.rec, err = newRecurrentStore(space, mem, cfg.Groups, cfg.PageSize, cfg.Device, cfg.MaxSeqs, u.Capacity); err != nil {
			return fail(err)
		}
	}
	return h, nil
}

// closeParts closes the groups' caches and the recurrent store.
func (h *Hybrid) closeParts() error {
	var errs error
	for _, g := range h.groups {
		if g.c != nil {
			errs = errors.CombineErrors(errs, g.c.Close())
		}
	}
	if h.rec != nil {
		errs = errors.CombineErrors(errs, h.rec.close())
	}
	return errs
}

// Config is the config the cache was made with, defaults filled in.
func (h *Hybrid) Config() HybridConfig {
	if h == nil {
		return HybridConfig{}
	}
	cfg := h.cfg
	cfg.Groups = slices.Clone(cfg.Groups)
	return cfg
}

// lock takes h's lock, or says why h cannot be used: not made by
// NewHybrid (ErrInvalid), closed (ErrClosed).
func (h *Hybrid) lock(what func() string) error {
	if h == nil || h.groups == nil {
		return errors.Wrapf(driver.ErrInvalid, "%s: not a cache made by NewHybrid", what())
	}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return driver.Closed(what() + ": the cache is closed")
	}
	return nil
}

// heldLocked is the memory every group and the recurrent store hold.
func (h *Hybrid) heldLocked() uint64 {
	var n uint64
	for _, g := range h.groups {
		if g.c != nil {
			n += g.c.shareHeld()
		}
	}
	if h.rec != nil {
		n += h.rec.held()
	}
	return n
}

// freeLocked is the one budget's memory no group holds.
func (h *Hybrid) freeLocked() uint64 {
	held := h.heldLocked()
	return h.budget - min(held, h.budget)
}

// need is one group's pages for a call, and the room it has without the
// others, in bytes.
type need struct{ need, room uint64 }

// fits says a call whose groups need needs (and the recurrent store
// recNeed, with recRoom of its own) fits in the free memory and what
// each group can spare beyond its own need.
func (h *Hybrid) fits(needs []need, recNeed, recRoom uint64) bool {
	short, spare := uint64(0), h.freeLocked()
	for _, n := range append(needs, need{recNeed, recRoom}) {
		if n.need > n.room {
			short += n.need - n.room
		} else {
			spare += n.room - n.need
		}
	}
	return short <= spare
}

// shortLocked is how far the free memory falls short of want (the
// groups holding more than the budget count too).
func (h *Hybrid) shortLocked(want uint64) uint64 {
	held := h.heldLocked() + want
	return held - min(held, h.budget)
}

// makeFreeLocked gives back memory from every group but skip (and the
// recurrent store's checkpoints but keepCkpt) until want bytes are free
// within the budget, stage by stage across the groups (pooled pages, then
// cached prefix units and checkpoints, then idle slots, then surplus);
// spare bounds what each group gives (nil: no bound). It never preempts:
// what it could not free is ErrOutOfMemory, what it gave back staying
// given back.
func (h *Hybrid) makeFreeLocked(want uint64, skip int, spare []uint64, keepCkpt *checkpoint) error {
	for stage := 0; stage < numYieldStages; stage++ {
		if err := h.yieldStageLocked(want, skip, spare, stage); err != nil {
			return err
		}
		if h.shortLocked(want) == 0 {
			return nil
		}
		for stage == yieldCached && h.rec != nil && h.shortLocked(want) > 0 {
			ok, err := h.rec.evictOne(keepCkpt)
			if err != nil {
				return err
			}
			if !ok {
				break
			}
		}
	}
	if short := h.shortLocked(want); short > 0 {
		return errors.Wrapf(driver.ErrOutOfMemory, "kvcache: hybrid: %s wanted free in the budget of %s, %s short after giving back what every group could",
			units.Bytes(want), units.Bytes(h.budget), units.Bytes(short))
	}
	return nil
}

// yieldStageLocked has the groups but skip give back memory of stage
// (yieldPool, ...) until want more bytes are free within the budget, or
// they have none of it; spare bounds what each gives (nil: no bound) and
// is lowered by it.
func (h *Hybrid) yieldStageLocked(want uint64, skip int, spare []uint64, stage int) error {
	for j, g := range h.groups {
		short := h.shortLocked(want)
		if short == 0 {
			return nil
		}
		if j == skip || g.c == nil {
			continue
		}
		if spare != nil {
			short = min(short, spare[j])
		}
		if short == 0 {
			continue
		}
		gave, err := g.c.shareYield(short, stage, nil, 0)
		if spare != nil {
			spare[j] -= min(gave, spare[j])
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// spares is what each group can give beyond its own need.
func spares(needs []need) []uint64 {
	out := make([]uint64, len(needs))
	for i, n := range needs {
		if n.room > n.need {
			out[i] = n.room - n.need
		}
	}
	return out
}

// runLocked runs op on group i's cache, granted the free memory (after
// the others gave back what group i's need beyond its own room asks),
// and tightens its budget after.
func (h *Hybrid) runLocked(i int, n need, spare []uint64, op func(c *Cache) error) error {
	c := h.groups[i].c
	// After a budget warm, what the free budget and group i's own pool
	// cannot give comes from the other groups' pools first, before group
	// i evicts its own cached units for it: a pooled page holds no one's
	// data (a share of the warm that the mix of sequences proved wrong).
	// A step's warm leaves pools of a chunk's pages, which the stages of
	// makeFreeLocked take as before.
	if own := h.freeLocked() + c.sharePooled(); h.budgetWarmed && n.need > own {
		if err := h.yieldStageLocked(n.need-own, i, spare, yieldPool); err != nil {
			return err
		}
	}
	if n.need > n.room {
		if err := h.makeFreeLocked(n.need-n.room, i, spare, nil); err != nil {
			return err
		}
	}
	c.shareGrant(h.freeLocked())
	err := op(c)
	c.shareGrant(0)
	return err
}

// takeStateLocked commits a recurrent state slot (a copy of cp, or zero)
// within the free memory, giving back other memory for it if it must.
func (h *Hybrid) takeStateLocked(cp *checkpoint) (*stateSlot, error) {
	if err := h.makeFreeLocked(h.rec.slotBytes, -1, nil, cp); err != nil {
		return nil, err
	}
	idx, err := h.rec.take(cp)
	if err != nil {
		return nil, err
	}
	if cp != nil {
		h.rec.touch(cp)
		h.rec.hits++
	}
	return &stateSlot{idx: idx}, nil
}

// checkPrompt refuses a prompt no group could hold.
func (h *Hybrid) checkPrompt(what func() string, prompt []int) error {
	if len(prompt) == 0 || len(prompt) > h.cfg.MaxContext {
		return errors.Wrapf(driver.ErrInvalid, "%s: a prompt has 1 to MaxContext (%d) tokens", what(), h.cfg.MaxContext)
	}
	return checkTokens(what, prompt, 0)
}

// matchLocked is the longest prefix of prompt (all but its last token)
// every group can serve: what each attention group's store lends, and a
// recurrent checkpoint at that boundary (the checkpoint, nil if none).
func (h *Hybrid) matchLocked(prompt []int, ch []uint64) (int, *checkpoint) {
	m := len(prompt) - 1
	if h.cfg.NoPrefixSharing {
		return 0, nil
	}
	var cp *checkpoint
	for {
		m2 := m
		for _, g := range h.groups {
			if g.c != nil && m2 > 0 {
				m2 = min(m2, g.c.matchTokens(prompt, m2))
			}
		}
		if h.rec != nil {
			cp = nil
			if m2 > 0 {
				cp = h.rec.find(prompt, ch, h.cfg.BlockTokens, m2)
			}
			m2 = 0
			if cp != nil {
				m2 = len(cp.tokens)
			}
		}
		if m2 == m {
			return m, cp
		}
		m = m2
	}
}

// chainOf is prompt's block hash chain (nil without a recurrent group:
// only checkpoints need it here).
func (h *Hybrid) chainOf(prompt []int) []uint64 {
	if h.rec == nil || h.cfg.NoPrefixSharing {
		return nil
	}
	return chain(prompt, 0, h.cfg.BlockTokens)
}

// planAdmitLocked is what an admission of prompt, matching its first m
// tokens, followed by the Append to total tokens, needs in every group.
func (h *Hybrid) planAdmitLocked(what func() string, prompt []int, m, total int, cp *checkpoint) ([]need, error) {
	needs := make([]need, len(h.groups))
	for i, g := range h.groups {
		if g.c == nil {
			continue
		}
		c := g.c
		c.mu.Lock()
		mm := c.findAtMostLocked(prompt, m)
		p := c.planAdmitChunkedLocked(mm, total, h.cfg.PrefillChunk)
		c.mu.Unlock()
		if p.sl == nil {
			return nil, errors.WithHint(errors.Wrapf(driver.ErrBusy, "%s: all %d slots hold sequences", what(), h.cfg.MaxSeqs),
				"free or finish a sequence first (MaxSeqs sets the slots)")
		}
		needs[i] = need{uint64(p.need) * c.g.page, uint64(max(p.room, 0)) * c.g.page}
	}
	return needs, nil
}

// recNeedLocked is the recurrent store's need for one more state and the
// room its checkpoints (but keep) give.
func (h *Hybrid) recNeedLocked(keep *checkpoint) (uint64, uint64) {
	if h.rec == nil {
		return 0, 0
	}
	return h.rec.slotBytes, h.rec.evictable(keep)
}

// CanAdmit says whether Admit of prompt, followed by the Append of the
// rest of it and expectedOutput more tokens (MaxContext at most), would
// fit now in every group, changing nothing: Admit's plan.
func (h *Hybrid) CanAdmit(prompt []int, expectedOutput int) (bool, error) {
	what := func() string {
		return fmt.Sprintf("kvcache: hybrid: can a prompt of %d tokens be admitted", len(prompt))
	}
	if err := h.lock(what); err != nil {
		return false, err
	}
	defer h.mu.Unlock()
	if expectedOutput < 0 {
		return false, errors.Wrapf(driver.ErrInvalid, "%s: a negative output", what())
	}
	if err := h.checkPrompt(what, prompt); err != nil {
		return false, err
	}
	m, cp := h.matchLocked(prompt, h.chainOf(prompt))
	needs, err := h.planAdmitLocked(what, prompt, m, upTo(len(prompt), expectedOutput, h.cfg.MaxContext), cp)
	if errors.Is(err, driver.ErrBusy) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	rn, rr := h.recNeedLocked(cp)
	return h.fits(needs, rn, rr), nil
}

// Admit starts a sequence of prompt in every group, from the longest
// prefix every group can serve (full and latent units the stores hold,
// window units still held, a recurrent checkpoint at that boundary): the
// caller then appends the rest of the prompt (Append(prompt[Len():]))
// with no other call between. It plans every group's pages for the whole
// prompt, and the room each has and can give the others, before any
// driver call: a refusal (ErrBusy: every slot holds a sequence;
// ErrOutOfMemory, counted in FailedAdmits) changes nothing else. A bad
// prompt is ErrInvalid.
func (h *Hybrid) Admit(prompt []int) (*HybridSeq, error) {
	what := func() string { return fmt.Sprintf("kvcache: hybrid: admit a prompt of %d tokens", len(prompt)) }
	if err := h.lock(what); err != nil {
		return nil, err
	}
	defer h.unlock()
	if err := h.checkPrompt(what, prompt); err != nil {
		return nil, err
	}
	ch := h.chainOf(prompt)
	m, cp := h.matchLocked(prompt, ch)
	needs, err := h.planAdmitLocked(what, prompt, m, len(prompt), cp)
	if err != nil {
		return nil, err
	}
	rn, rr := h.recNeedLocked(cp)
	if !h.fits(needs, rn, rr) {
		h.counts.failedAdmits++
		return nil, errors.WithHint(errors.Wrapf(driver.ErrOutOfMemory, "%s: its groups' pages do not fit in the budget of %s, with what every group can give back",
			what(), units.Bytes(h.budget)), "ask CanAdmit first; free or preempt sequences, or raise the budget (SetBudget)")
	}
	h.tick++
	s := &HybridSeq{h: h, seqs: make([]*Seq, len(h.groups)), prompt: slices.Clone(prompt), chain: ch, running: true, admitted: h.tick}
	undo := func(err error) (*HybridSeq, error) {
		for _, gs := range s.seqs {
			if gs != nil {
				err = errors.CombineErrors(err, gs.Free())
			}
		}
		h.retightenLocked()
		return nil, err
	}
	n := len(prompt)
	for i, g := range h.groups {
		if g.c == nil {
			continue
		}
		var gs *Seq
		// Only the partly shared unit's copy is committed now: the
		// prompt's pages come with the Append, planned above.
		err := h.runLocked(i, need{}, nil, func(c *Cache) error {
			var err error
			gs, err = c.admitUpTo(prompt, m, m)
			return err
		})
		if err != nil {
			return undo(errors.Wrapf(err, "%s: group %d (%s)", what(), i, g.Kind))
		}
		s.seqs[i] = gs
		n = min(n, gs.Len())
	}
	if h.rec != nil {
		if cp != nil && len(cp.tokens) > n {
			cp = h.rec.find(prompt, ch, h.cfg.BlockTokens, n) // a group lent less than planned
		}
		n = 0
		if cp != nil {
			n = len(cp.tokens)
		}
		if s.state, err = h.takeStateLocked(cp); err != nil {
			return undo(errors.Wrapf(err, "%s: its recurrent state", what()))
		}
	}
	s.n, s.matched, s.written = n, n, n
	h.seqs[s] = struct{}{}
	h.counts.admits++
	return s, nil
}

// wakeMappers tells every group's mapping-ahead goroutine to look: a
// call that may have left the one budget memory free (a sequence freed or
// preempted, a budget raised) wakes them all, since any group's running
// sequences may take it; a group's own calls wake its own. It never
// blocks.
func (h *Hybrid) wakeMappers() {
	for _, g := range h.groups {
		if g.c != nil {
			g.c.wakeMapper()
		}
	}
}

// retightenLocked sets every group's budget to what it holds.
func (h *Hybrid) retightenLocked() {
	for _, g := range h.groups {
		if g.c != nil {
			g.c.shareGrant(0)
		}
	}
}

// unlock lets the lock go.
func (h *Hybrid) unlock() { h.mu.Unlock() }

// Stats is the cache's figures now (zero for a nil, zero or closed
// cache).
func (h *Hybrid) Stats() HybridStats {
	if h == nil || h.groups == nil {
		return HybridStats{}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	st := HybridStats{Budget: h.budget, Groups: make([]Stats, len(h.groups)), WindowHeld: make([]bool, len(h.groups)),
		Admits: h.counts.admits, FailedAdmits: h.counts.failedAdmits, Frees: h.counts.frees, Forks: h.counts.forks,
		Preemptions: h.counts.preemptions, Resumes: h.counts.resumes, Sequences: len(h.seqs)}
	if h.closed {
		return st
	}
	st.Committed = h.heldLocked()
	for i, g := range h.groups {
		if g.c != nil {
			st.Groups[i] = g.c.Stats()
			st.WindowHeld[i] = g.windowHeld
		}
	}
	for s := range h.seqs {
		st.Running += b2i(s.running)
	}
	if r := h.rec; r != nil {
		st.StateBytes, st.Checkpoints = r.held(), r.lru.Len()
		st.StateSlots = r.committed - r.lru.Len()
		st.CheckpointHits, st.CheckpointsMade, st.CheckpointsEvicted = r.hits, r.made, r.evicted
	}
	return st
}

// SetBudget changes the one budget. Raising it is immediate; lowered
// below what the groups hold, they give back (every group's pooled pages,
// then cached prefix units and recurrent checkpoints, then idle slots'
// pages, then surplus) and, if that is not enough, the latest admitted
// running sequences are preempted in mode, in every group, until all fits;
// it returns them. What stays committed with every sequence it can
// preempt preempted — a ring group's sequences, which are never
// preempted, and the recurrent states that swapped sequences keep in
// their slots — bounds it: the budget is then set to that, and the error
// (ErrOutOfMemory) says so, the sequences it preempted staying
// preempted. A zero budget or a bad mode is ErrInvalid, nothing changed.
func (h *Hybrid) SetBudget(budget uint64, mode PreemptMode) ([]*HybridSeq, error) {
	what := func() string { return fmt.Sprintf("kvcache: hybrid: set the budget to %s", units.Bytes(budget)) }
	if err := h.lock(what); err != nil {
		return nil, err
	}
	defer h.unlock()
	if budget == 0 {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: a budget of zero holds nothing", what())
	}
	if err := checkMode(what, mode); err != nil {
		return nil, err
	}
	h.budget = budget
	if h.heldLocked() <= budget {
		h.wakeMappers() // free memory, maybe: the groups' goroutines look
		return nil, nil
	}
	if err := h.makeFreeLocked(0, -1, nil, nil); err != nil && !errors.Is(err, driver.ErrOutOfMemory) {
		return nil, err
	}
	var running []*HybridSeq
	for s := range h.seqs {
		if s.running {
			running = append(running, s)
		}
	}
	slices.SortFunc(running, func(a, b *HybridSeq) int { return int(b.admitted) - int(a.admitted) })
	var preempted []*HybridSeq
	for _, s := range running {
		if h.heldLocked() <= budget {
			break
		}
		m := mode
		if m == Swap && s.preemptableLocked(what, Swap) != nil {
			m = Drop // a window group released units: only a drop preempts it
		}
		if s.preemptableLocked(what, m) != nil {
			continue // a ring keeps no preempted sequence
		}
		if err := s.preemptLocked(what, m); err != nil {
			return preempted, err
		}
		preempted = append(preempted, s)
		if err := h.makeFreeLocked(0, -1, nil, nil); err != nil && !errors.Is(err, driver.ErrOutOfMemory) {
			return preempted, err
		}
	}
	if held := h.heldLocked(); held > budget {
		// What no stage gives back and no preemption frees: a ring
		// group's sequences (never preempted) and the recurrent states
		// swapped sequences keep. The budget stops at it, so that the
		// groups never hold past the budget.
		h.budget = held
		return preempted, errors.WithHint(errors.Wrapf(driver.ErrOutOfMemory, "%s: %s stays committed with every sequence it can preempt preempted (a ring group's sequences, swapped sequences' recurrent states): the budget is %s",
			what(), units.Bytes(held), units.Bytes(held)), "preempt with Drop, which gives the recurrent states back, or free sequences")
	}
	return preempted, nil
}

// overLocked is how far the groups hold past the budget (0: within).
func (h *Hybrid) overLocked() uint64 {
	held := h.heldLocked()
	return held - min(held, h.budget)
}

// Check walks every group's books and the recurrent store's, and the
// sequences' agreement across groups.
func (h *Hybrid) Check() error {
	what := func() string { return "kvcache: hybrid: check" }
	if err := h.lock(what); err != nil {
		return err
	}
	defer h.unlock()
	var errs error
	for i, g := range h.groups {
		if g.c != nil {
			if err := g.c.Check(); err != nil {
				errs = errors.CombineErrors(errs, errors.Wrapf(err, "group %d", i))
			}
		}
	}
	states := 0
	for s := range h.seqs {
		if s.freed {
			errs = errors.CombineErrors(errs, errors.AssertionFailedf("a freed sequence is live"))
		}
		for i, gs := range s.seqs {
			if (gs == nil) != (h.groups[i].c == nil) {
				errs = errors.CombineErrors(errs, errors.AssertionFailedf("a sequence lacks group %d's", i))
				continue
			}
			if gs == nil {
				continue
			}
			gs.c.mu.Lock()
			n, st := gs.n, gs.state
			gs.c.mu.Unlock()
			if n < s.n || (st == seqRunning) != s.running || st == seqFreed {
				errs = errors.CombineErrors(errs, errors.AssertionFailedf("group %d's sequence holds %d tokens (running %v), the hybrid's %d (running %v)", i, n, st == seqRunning, s.n, s.running))
			}
		}
		if s.state != nil {
			states++
		}
		if h.rec != nil && s.running && s.state == nil {
			errs = errors.CombineErrors(errs, errors.AssertionFailedf("a running sequence has no recurrent state"))
		}
	}
	if h.rec != nil {
		errs = errors.CombineErrors(errs, h.rec.check(states))
	}
	if over := h.overLocked(); over > 0 {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf("the groups hold %s past the budget of %s", units.Bytes(over), units.Bytes(h.budget)))
	}
	return errs
}

// Close frees every sequence and releases every group's memory. Closing
// twice is ErrClosed.
func (h *Hybrid) Close() error {
	what := func() string { return "kvcache: hybrid: close" }
	if h != nil {
		// The groups' goroutines plan under the Hybrid's lock: they stop
		// before Close takes it.
		for _, g := range h.groups {
			if g.c != nil {
				g.c.stopMapper()
			}
		}
	}
	if err := h.lock(what); err != nil {
		return err
	}
	defer h.unlock()
	var errs error
	for s := range h.seqs {
		if s.state != nil {
			errs = errors.CombineErrors(errs, h.rec.drop(s.state))
			s.state = nil
		}
		s.freed, s.running = true, false
	}
	clear(h.seqs)
	errs = errors.CombineErrors(errs, h.closeParts())
	h.closed = true
	return errs
}

// lock takes s's cache's lock, or says why s cannot be used.
func (s *HybridSeq) lock(what func() string) (*Hybrid, error) {
	if s == nil || s.h == nil {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: not a sequence made by Hybrid.Admit", what())
	}
	h := s.h
	if err := h.lock(what); err != nil {
		return nil, err
	}
	if s.freed {
		h.mu.Unlock()
		return nil, driver.Closed(what() + ": the sequence was freed")
	}
	return h, nil
}

// Append adds tokens (at least one; MaxContext in all) to the sequence in
// every group and makes room for their rows; each group is given only the
// tokens past those it holds (after an Admit where its store lent more).
// It plans every group's pages, and what the others can give back for
// them, before any driver call: a refusal (ErrOutOfMemory; ErrInvalid for
// bad tokens, a preempted sequence, or more tokens than a ring group
// takes in one Append) changes nothing.
func (s *HybridSeq) Append(tokens []int) (HybridStep, error) {
	what := func() string { return fmt.Sprintf("kvcache: hybrid: append %d tokens", len(tokens)) }
	h, err := s.lock(what)
	if err != nil {
		return HybridStep{}, err
	}
	defer h.unlock()
	switch {
	case !s.running:
		return HybridStep{}, errors.Wrapf(driver.ErrInvalid, "%s: the sequence is preempted; Resume it first", what())
	case len(tokens) == 0 || len(tokens) > h.cfg.MaxContext-s.n:
		return HybridStep{}, errors.Wrapf(driver.ErrInvalid, "%s: 1 to %d more tokens fit (MaxContext %d)", what(), h.cfg.MaxContext-s.n, h.cfg.MaxContext)
	}
	if err := checkTokens(what, tokens, s.n); err != nil {
		return HybridStep{}, err
	}
	for i, t := range tokens {
		if p := s.n + i; p < len(s.prompt) && s.prompt[p] != t {
			return HybridStep{}, errors.Wrapf(driver.ErrInvalid, "%s: token %d at position %d is not the prompt's %d", what(), t, p, s.prompt[p])
		}
	}
	end := s.n + len(tokens)
	needs := make([]need, len(h.groups))
	for i, gs := range s.seqs {
		if gs == nil {
			continue
		}
		c := gs.c
		c.mu.Lock()
		// What the group's Append would refuse of its tokens (a ring's
		// most an Append) is refused here, before any group appends.
		var err error
		if have := gs.n; have < end && c.g.ring > 0 {
			gwhat := h.groupWhat(what, i)
			err = c.ringAppendableLocked(gwhat, end-have)
		}
		nd, room := c.appendPlanLocked(gs, end-gs.n)
		c.mu.Unlock()
		if err != nil {
			return HybridStep{}, err
		}
		needs[i] = need{uint64(nd) * c.g.page, uint64(max(room, 0)) * c.g.page}
	}
	// The recurrent store's checkpoints are room too: makeFreeLocked
	// evicts them with the cached units, as CanAdmit counted them.
	_, ckpts := h.recNeedLocked(nil)
	if !h.fits(needs, 0, ckpts) {
		return HybridStep{}, errors.WithHint(errors.Wrapf(driver.ErrOutOfMemory, "%s: its groups' pages do not fit in the budget of %s, with what every group can give back",
			what(), units.Bytes(h.budget)), "free or preempt sequences, or raise the budget (SetBudget)")
	}
	step := HybridStep{Pos: s.n, N: len(tokens), Groups: make([]Step, len(h.groups))}
	spare := spares(needs)
	for i, gs := range s.seqs {
		if gs == nil {
			continue
		}
		have := gs.Len()
		if have >= end {
			step.Groups[i] = Step{Pos: end}
			continue
		}
		err := h.runLocked(i, needs[i], spare, func(*Cache) error {
			st, err := gs.Append(tokens[have-s.n:])
			step.Groups[i] = st
			return err
		})
		if err != nil {
			return HybridStep{}, errors.Wrapf(err, "%s: group %d (%s)", what(), i, h.groups[i].Kind)
		}
	}
	s.n = end
	return step, nil
}

// MarkWritten says the first n tokens' rows are written in every group
// and the recurrent state is that of exactly n tokens (n is Len()): whole
// prompt units become shareable (Seq.MarkWritten), and when n is a
// multiple of BlockTokens within the prompt, the recurrent state is
// checkpointed there (copied, if the free memory or older checkpoints
// have room: a checkpoint never takes a group's memory), so that a prompt
// starting with the same n tokens starts from it. A prefill chunked at
// unit boundaries, marked after each chunk, leaves a checkpoint at each.
// It refuses n past Len() or below what is marked (ErrInvalid).
func (s *HybridSeq) MarkWritten(n int) error {
	what := func() string { return fmt.Sprintf("kvcache: hybrid: mark %d tokens written", n) }
	h, err := s.lock(what)
	if err != nil {
		return err
	}
	defer h.unlock()
	if !s.running || n < 0 || n > s.n {
		return errors.Wrapf(driver.ErrInvalid, "%s: the sequence holds %d tokens (running %v)", what(), s.n, s.running)
	}
	if n < s.written {
		return errors.Wrapf(driver.ErrInvalid, "%s: %d are marked already (the count only grows)", what(), s.written)
	}
	for i, gs := range s.seqs {
		if gs == nil || n <= gs.Written() {
			continue
		}
		if err := gs.MarkWritten(n); err != nil {
			return errors.Wrapf(err, "%s: group %d", what(), i)
		}
	}
	s.written = n
	b := h.cfg.BlockTokens
	if h.rec == nil || h.cfg.NoPrefixSharing || n != s.n || n == 0 || n%b != 0 || n > len(s.prompt) {
		return nil
	}
	r := h.rec
	for h.freeLocked() < r.slotBytes && r.lru.Len() > 0 {
		if _, err := r.evictOne(nil); err != nil {
			return err
		}
	}
	// Slots stay free for every sequence that may take a state yet.
	if h.freeLocked() < r.slotBytes || len(r.free) <= h.cfg.MaxSeqs-(r.committed-r.lru.Len()) {
		return nil // no room: no checkpoint
	}
	return r.checkpoint(s.state.idx, s.prompt[:n], s.chain[n/b-1])
}

// Len is the sequence's tokens (those every group holds).
func (s *HybridSeq) Len() int {
	if s == nil || s.h == nil {
		return 0
	}
	s.h.mu.Lock()
	defer s.h.mu.Unlock()
	return s.n
}

// Matched is the tokens Admit (or the last Resume) found in every group.
func (s *HybridSeq) Matched() int {
	if s == nil || s.h == nil {
		return 0
	}
	s.h.mu.Lock()
	defer s.h.mu.Unlock()
	return s.matched
}

// Fork makes a child sharing the sequence's pages in every attention
// group (Seq.Fork: read-only in both, the partly written last unit copied
// on the first write of either) and a copy of its recurrent state (copied,
// not shared: a recurrent layer rewrites its whole state every step, so a
// shared one would be copied on the next step anyway). It plans every
// group first; a refusal changes nothing.
func (s *HybridSeq) Fork() (*HybridSeq, error) {
	what := func() string { return "kvcache: hybrid: fork a sequence" }
	h, err := s.lock(what)
	if err != nil {
		return nil, err
	}
	defer h.unlock()
	if !s.running {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: the sequence is preempted; Resume it first", what())
	}
	needs := make([]need, len(h.groups))
	for i, gs := range s.seqs {
		if gs == nil {
			continue
		}
		c := gs.c
		gwhat := h.groupWhat(what, i)
		c.mu.Lock()
		nd, room, err := c.forkNeedLocked(gwhat, gs)
		n := gs.n
		c.mu.Unlock()
		if err != nil {
			return nil, err
		}
		if n != s.n {
			return nil, errors.Wrapf(driver.ErrInvalid, "%s: group %d holds %d tokens, the sequence %d: append first", what(), i, n, s.n)
		}
		needs[i] = need{uint64(nd) * c.g.page, uint64(max(room, 0)) * c.g.page}
	}
	var rn, rr uint64
	if h.rec != nil {
		rn, rr = h.recNeedLocked(nil)
	}
	if !h.fits(needs, rn, rr) {
		return nil, errors.Wrapf(driver.ErrOutOfMemory, "%s: its groups' copies and its recurrent state do not fit in the budget of %s, with what every group can give back",
			what(), units.Bytes(h.budget))
	}
	spare := spares(needs)
	h.tick++
	child := &HybridSeq{h: h, seqs: make([]*Seq, len(h.groups)), prompt: s.prompt, chain: s.chain, n: s.n, matched: s.n, written: s.written, running: true, admitted: h.tick}
	undo := func(err error) (*HybridSeq, error) {
		for _, gs := range child.seqs {
			if gs != nil {
				err = errors.CombineErrors(err, gs.Free())
			}
		}
		h.retightenLocked()
		return nil, err
	}
	for i, gs := range s.seqs {
		if gs == nil {
			continue
		}
		err := h.runLocked(i, needs[i], spare, func(*Cache) error {
			var err error
			child.seqs[i], err = gs.Fork()
			return err
		})
		if err != nil {
			return undo(errors.Wrapf(err, "%s: group %d", what(), i))
		}
	}
	if h.rec != nil {
		st, err := h.takeStateLocked(nil)
		if err == nil {
			if err = h.rec.copy(st.idx, s.state.idx); err != nil {
				err = errors.CombineErrors(err, h.rec.drop(st))
			}
		}
		if err != nil {
			return undo(errors.Wrapf(err, "%s: copy its recurrent state", what()))
		}
		child.state = st
	}
	h.seqs[child] = struct{}{}
	h.counts.forks++
	return child, nil
}

// Preempt preempts the sequence in every group (mode as Seq.Preempt).
// After Swap its recurrent state stays in its slot (Resume continues from
// every token); after Drop the state goes with the rows, and Resume
// recomputes from the longest prefix the groups' stores and a recurrent
// checkpoint still hold.
func (s *HybridSeq) Preempt(mode PreemptMode) error {
	what := func() string { return fmt.Sprintf("kvcache: hybrid: preempt a sequence (%s)", mode) }
	h, err := s.lock(what)
	if err != nil {
		return err
	}
	defer h.unlock()
	if err := checkMode(what, mode); err != nil {
		return err
	}
	if !s.running {
		return errors.Wrapf(driver.ErrInvalid, "%s: it is preempted already", what())
	}
	return s.preemptLocked(what, mode)
}

// preemptableLocked says why a group would refuse to preempt s in mode
// (a ring; a swap of a window group's sequence with units released).
func (s *HybridSeq) preemptableLocked(what func() string, mode PreemptMode) error {
	for i, gs := range s.seqs {
		if gs == nil {
			continue
		}
		gwhat := s.h.groupWhat(what, i)
		gs.c.mu.Lock()
		err := gs.c.preemptableLocked(gwhat, gs, mode)
		gs.c.mu.Unlock()
		if err != nil {
			return err
		}
	}
	return nil
}

func (s *HybridSeq) preemptLocked(what func() string, mode PreemptMode) error {
	h := s.h
	if err := s.preemptableLocked(what, mode); err != nil {
		return err
	}
	var errs error
	for i, gs := range s.seqs {
		if gs == nil {
			continue
		}
		err := h.runLocked(i, need{}, nil, func(*Cache) error { return gs.Preempt(mode) })
		if err != nil {
			errs = errors.CombineErrors(errs, errors.Wrapf(err, "%s: group %d", what(), i))
		}
	}
	if errs != nil {
		return errs
	}
	if s.state != nil && mode == Drop {
		errs = h.rec.drop(s.state)
		s.state = nil
	}
	s.running = false
	h.counts.preemptions++
	h.wakeMappers()
	return errs
}

// Resume brings a preempted sequence back in every group. After Swap the
// step is empty; after Drop it covers what to recompute, from Pos: the
// longest prefix every group still serves, at a recurrent checkpoint
// where there are recurrent groups (each group's own Step may start
// later). It plans every group first: a refusal (ErrOutOfMemory)
// leaves the sequence preempted and changes nothing.
func (s *HybridSeq) Resume() (HybridStep, error) {
	what := func() string { return "kvcache: hybrid: resume a sequence" }
	h, err := s.lock(what)
	if err != nil {
		return HybridStep{}, err
	}
	defer h.unlock()
	if s.running {
		return HybridStep{}, errors.Wrapf(driver.ErrInvalid, "%s: it is running, not preempted", what())
	}
	needs := make([]need, len(h.groups))
	for i, gs := range s.seqs {
		if gs == nil {
			continue
		}
		c := gs.c
		c.mu.Lock()
		p := c.planResumeLocked(gs, gs.n)
		c.mu.Unlock()
		needs[i] = need{uint64(p.need) * c.g.page, uint64(max(p.room, 0)) * c.g.page}
	}
	var rn, rr uint64
	if h.rec != nil && s.state == nil {
		rn, rr = h.recNeedLocked(nil)
	}
	if !h.fits(needs, rn, rr) {
		return HybridStep{}, errors.WithHint(errors.Wrapf(driver.ErrOutOfMemory, "%s: its groups' pages do not fit in the budget of %s, with what every group can give back",
			what(), units.Bytes(h.budget)), "free or preempt sequences, or raise the budget (SetBudget)")
	}
	step := HybridStep{Pos: s.n, Groups: make([]Step, len(h.groups))}
	spare := spares(needs)
	var resumed []*Seq
	for i, gs := range s.seqs {
		if gs == nil {
			continue
		}
		err := h.runLocked(i, needs[i], spare, func(*Cache) error {
			st, err := gs.Resume()
			step.Groups[i] = st
			return err
		})
		if err != nil {
			for _, r := range resumed {
				err = errors.CombineErrors(err, r.Preempt(Drop))
			}
			h.retightenLocked()
			return HybridStep{}, errors.Wrapf(err, "%s: group %d", what(), i)
		}
		resumed = append(resumed, gs)
		if st := step.Groups[i]; st.N > 0 {
			step.Pos = min(step.Pos, st.Pos)
		}
	}
	if h.rec != nil && s.state == nil {
		var cp *checkpoint
		if step.Pos > 0 && !h.cfg.NoPrefixSharing {
			cp = h.rec.find(s.prompt, s.chain, h.cfg.BlockTokens, min(step.Pos, len(s.prompt)))
		}
		st, err := h.takeStateLocked(cp)
		if err != nil {
			for _, r := range resumed {
				err = errors.CombineErrors(err, r.Preempt(Drop))
			}
			h.retightenLocked()
			return HybridStep{}, errors.Wrapf(err, "%s: its recurrent state", what())
		}
		s.state = st
		step.Pos = 0
		if cp != nil {
			step.Pos = len(cp.tokens)
		}
	}
	step.N = s.n - step.Pos
	s.matched = step.Pos
	s.written = min(s.written, step.Pos)
	s.running = true
	h.counts.resumes++
	return step, nil
}

// Free ends the sequence in every group and gives its recurrent state
// back. Freeing twice is ErrClosed.
func (s *HybridSeq) Free() error {
	what := func() string { return "kvcache: hybrid: free a sequence" }
	h, err := s.lock(what)
	if err != nil {
		return err
	}
	defer h.unlock()
	var errs error
	for i, gs := range s.seqs {
		if gs != nil {
			if err := gs.Free(); err != nil {
				errs = errors.CombineErrors(errs, errors.Wrapf(err, "%s: group %d", what(), i))
			}
		}
	}
	if s.state != nil {
		errs = errors.CombineErrors(errs, h.rec.drop(s.state))
		s.state = nil
	}
	h.retightenLocked()
	s.freed, s.running = true, false
	delete(h.seqs, s)
	h.counts.frees++
	h.wakeMappers()
	return errs
}

// Group is attention group i's sequence (nil for a recurrent group, an
// index out of range, or a nil sequence), for its tensors (K, V and the
// Rows of a Step) and figures only: Append, Fork, Preempt, Resume,
// MarkWritten and Free go through the HybridSeq. A Latent group's layer l
// row of a token is its K's HeadDim/2 elements followed by its V's, one
// contiguous run.
func (s *HybridSeq) Group(i int) *Seq {
	if s == nil || i < 0 || i >= len(s.seqs) {
		return nil
	}
	return s.seqs[i]
}

// State is the recurrent state of recurrent layer layer (numbered across
// the recurrent groups in order, from 0): a Uint8 tensor of its
// StateBytes, for the caller to read and write, revoked (ErrClosed) when
// the sequence is freed or dropped. A new sequence's state is zero, or a
// checkpoint's copy. It refuses a layer out of range (ErrInvalid), a
// preempted sequence (ErrInvalid) and a driver whose memory this process
// cannot address (ErrUnsupported).
func (s *HybridSeq) State(layer int) (*tensor.Tensor, error) {
	what := func() string { return fmt.Sprintf("kvcache: hybrid: recurrent state of layer %d", layer) }
	h, err := s.lock(what)
	if err != nil {
		return nil, err
	}
	defer h.unlock()
	switch {
	case h.rec == nil || layer < 0 || layer >= len(h.rec.layerOff):
		n := 0
		if h.rec != nil {
			n = len(h.rec.layerOff)
		}
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: the cache has %d recurrent layers", what(), n)
	case !s.running:
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: the sequence is preempted; Resume it first", what())
	}
	return h.rec.tensor(s.state, layer)
}
