package serving

// The paged baseline for a hybrid model: vLLM's hybrid KV cache manager,
// as bookkeeping.

import (
	"fmt"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/invariants"
	"github.com/vmarena/vmarena/internal/units"
)

// HybridBlockTable is vLLM's hybrid KV cache manager (V1's
// HybridKVCacheCoordinator over one block pool) as pure bookkeeping with
// no memory behind it, for a model of several kinds of layers
// (Model.Groups): the paged baseline of such a model.
//
//   - KV cache groups of a uniform page size
//     (vllm/v1/core/kv_cache_utils.py,
//     _get_kv_cache_groups_uniform_page_size): each kind's layers are cut
//     into groups of groupSize layers (the fewest layers any kind has, or
//     the most where that is under 1.5 times the fewest), a kind's last
//     group short of groupSize layers padded to it. Every block of the one
//     pool is groupSize layers of BlockTokens tokens, whichever group
//     takes it, and the pool is Budget / that many blocks.
//   - Full (and latent) attention groups hold ceil(tokens / BlockTokens)
//     blocks a sequence. A sliding-window group
//     (vllm/v1/core/single_type_kv_cache_manager.py,
//     SlidingWindowManager) frees, before each Append, the blocks wholly
//     behind the window of the tokens computed so far: the first
//     (tokens - Window + 1) / BlockTokens of them (remove_skipped_blocks).
//   - A recurrent group holds one block a sequence, taken at admission
//     (MambaManager). Where a layer's state exceeds a layer's page, vLLM
//     grows the attention block until its page holds the state
//     (vllm/model_executor/models/config.py,
//     HybridAttentionMambaModelConfig: the block a multiple of 16 tokens,
//     the state padded to the page); so does this table, and the padding
//     is waste.
//
// Prefix caching, as vLLM's coordinator does it: a full block is known in
// each group by a chained hash of the request's tokens and the group; the
// hit is the longest run of whole blocks that every full-attention group
// holds from the first, cut until every window group holds the
// ceil((Window-1) / BlockTokens) blocks just before its end
// (find_longest_cache_hit). A window group's blocks freed behind the
// window stay cached, as every freed block does, until the free list
// hands them out again. A model with recurrent groups caches no prefix:
// a recurrent state at a block boundary is not kept (vLLM's prefix
// caching of Mamba layers is an experimental mode), so every request
// computes its prompt whole.
//
// Stats: InUse is the blocks in use; Logical the exact need of the
// running sequences (Model.ExactNeed of each: every full layer's tokens,
// every window layer's last Window, the recurrent states); Stored that,
// less what sharing spares (a shared block counted once, whole): InUse -
// Stored is the waste beyond the exact need — the last blocks' tails,
// the window's blocks behind it not freed yet, the padded groups and
// states. Preemption drops a sequence's blocks (recompute).
type HybridBlockTable struct {
	model       Model
	blockTokens int
	// groupSize is the layers of a KV cache group, blockBytes a block's
	// bytes.
	groupSize  int
	blockBytes uint64
	// groups are the KV cache groups; kinds the model's groups (for the
	// exact need).
	groups []pagedGroup
	kinds  []LayerGroup
	// prefix says prefix caching is on (no recurrent group).
	prefix bool

	blockPool
	seqs   map[int]*hybridPagedSeq
	chains map[int][]uint64

	// inUse counts blocks with ref > 0, cachedFree the hashed free ones;
	// logical is the running sequences' exact need, saved what shared
	// blocks spare of it (bytes).
	inUse, cachedFree int
	logical, saved    uint64
	counts            Stats
}

// pagedGroup is one KV cache group: layers of one kind (at most
// groupSize; the block is groupSize's all the same).
type pagedGroup struct {
	kind   GroupKind
	layers int
	window int
	// salt tells the group's block hashes from the others'.
	salt uint64
	// hitBlocks is a window group's blocks a prefix hit must end with.
	hitBlocks int
}

// hybridPagedSeq is a running sequence: a table per KV cache group. A
// full group's table holds ceil(tokens/blockTokens) blocks, a window
// group's as many entries of which the first skipped are none (freed
// behind the window), a recurrent group's one block.
type hybridPagedSeq struct {
	tables     [][]int32
	skipped    []int
	tokens     int
	registered int
	// last is the tokens of the last Append (0 before the first), need
	// the exact need.
	last int
	need uint64
}

// HybridPagedName is the hybrid paged scheme's Name.
const HybridPagedName = "paged (vLLM hybrid)"

// pagedGroupSize is the layers of one of vLLM's KV cache groups for a
// model of groups gs (see HybridBlockTable).
func pagedGroupSize(gs []LayerGroup) int {
	size, most := gs[0].Layers, gs[0].Layers
	for _, g := range gs {
		size, most = min(size, g.Layers), max(most, g.Layers)
	}
	if 2*most < 3*size {
		size = most // vLLM's heuristic: fewer padding layers where the kinds are near even
	}
	return size
}

// NewHybridBlockTable makes the hybrid paged scheme over cfg's budget. cfg
// must pass Config.Check; a budget of more than MaxBlocks blocks, or one
// whose pool cannot hold one sequence of MaxContext tokens, is refused
// (driver.ErrInvalid). A model of one kind of layers is served as one
// group: the plain BlockTable's books, less its figures' names.
func NewHybridBlockTable(cfg Config) (*HybridBlockTable, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	cfg.defaults()
	m := cfg.Model
	kinds := m.Groups()
	size := pagedGroupSize(kinds)
	layerToken := m.LayerTokenBytes()
	bt := cfg.BlockTokens
	for _, g := range kinds {
		if g.Kind != Recurrent {
			continue
		}
		// The attention page grows to hold a layer's state, in steps of
		// BlockTokens tokens.
		perLayer := g.StateBytes / uint64(g.Layers)
		unit := uint64(cfg.BlockTokens) * layerToken
		if k := (perLayer + unit - 1) / unit; k > 1 {
			if k*uint64(cfg.BlockTokens) > maxBlockTokens {
				return nil, errors.Wrapf(driver.ErrInvalid, "serving: paged hybrid: a recurrent layer's state of %s needs a block of %d tokens, more than %d",
					units.Bytes(perLayer), k*uint64(cfg.BlockTokens), maxBlockTokens)
			}
			bt = int(k) * cfg.BlockTokens
		}
	}
	t := &HybridBlockTable{model: m, blockTokens: bt, groupSize: size, blockBytes: uint64(bt) * layerToken * uint64(size),
		kinds: kinds, prefix: m.RecurrentLayers == 0, seqs: map[int]*hybridPagedSeq{}, chains: map[int][]uint64{}}
	for _, g := range kinds {
		for l := 0; l < g.Layers; l += size {
			pg := pagedGroup{kind: g.Kind, layers: min(size, g.Layers-l), window: g.Window, salt: mix64(uint64(len(t.groups)) + 0x6b76_6772_6f75_7030)}
			if g.Kind == SlidingWindow {
				pg.hitBlocks = (g.Window - 1 + bt - 1) / bt
			}
			t.groups = append(t.groups, pg)
		}
	}
	n := cfg.Budget / t.blockBytes
	if err := checkBlocks("paged hybrid", cfg.Budget, n, bt); err != nil {
		return nil, err
	}
	if need := t.blocksAt(cfg.MaxContext); uint64(need) > n {
		return nil, errors.Wrapf(driver.ErrInvalid, "serving: paged hybrid: a budget of %s is %d blocks of %d tokens in %d-layer groups (%s each), and one sequence of %d tokens of %s takes %d: want a larger budget or a shorter max context",
			units.Bytes(cfg.Budget), n, bt, size, units.Bytes(t.blockBytes), cfg.MaxContext, m.Name, need)
	}
	t.blockPool = newBlockPool(int(n))
	return t, nil
}

// Name is HybridPagedName.
func (t *HybridBlockTable) Name() string { return HybridPagedName }

// Blocks is the number of blocks in the budget.
func (t *HybridBlockTable) Blocks() int {
	if t == nil {
		return 0
	}
	return len(t.blocks)
}

// BlockTokens is the tokens of a block: Config.BlockTokens, or more where
// a recurrent layer's state needs a larger page.
func (t *HybridBlockTable) BlockTokens() int {
	if t == nil {
		return 0
	}
	return t.blockTokens
}

// KVGroups is the number of KV cache groups the model's layers are cut
// into.
func (t *HybridBlockTable) KVGroups() int {
	if t == nil {
		return 0
	}
	return len(t.groups)
}

func (t *HybridBlockTable) made(op string) error {
	if t == nil || t.seqs == nil {
		return errors.Wrapf(driver.ErrInvalid, "serving: paged hybrid: %s: the block table was not made by NewHybridBlockTable", op)
	}
	return nil
}

func (t *HybridBlockTable) usable(op string, r *SimRequest) error {
	if err := t.made(op); err != nil {
		return err
	}
	return checkRequest("paged hybrid", op, r)
}

func (t *HybridBlockTable) blocksFor(n int) int { return (n + t.blockTokens - 1) / t.blockTokens }

// skippedAt is a window group's blocks wholly behind the window of
// tokens computed tokens.
func (t *HybridBlockTable) skippedAt(g *pagedGroup, tokens int) int {
	return max(tokens-g.window+1, 0) / t.blockTokens
}

// blocksAt is the blocks one sequence of tokens tokens holds in every
// group.
func (t *HybridBlockTable) blocksAt(tokens int) int {
	n := 0
	for i := range t.groups {
		g := &t.groups[i]
		switch g.kind {
		case Recurrent:
			n++
		case SlidingWindow:
			n += t.blocksFor(tokens) - t.skippedAt(g, max(tokens-1, 0))
		default:
			n += t.blocksFor(tokens)
		}
	}
	return n
}

// need is the exact need of a sequence of tokens tokens, the last chunk
// of them computed in the step (see exactNeed).
func (t *HybridBlockTable) need(tokens, chunk int) uint64 { return exactNeed(t.kinds, tokens, chunk) }

// blockNeed is what a block of group g spares when shared: its tokens'
// KV in the group's layers.
func (t *HybridBlockTable) blockNeed(g *pagedGroup) uint64 {
	return uint64(t.blockTokens) * t.model.LayerTokenBytes() * uint64(g.layers)
}

func (t *HybridBlockTable) key(g *pagedGroup, h uint64) uint64 { return mix64(h ^ g.salt) }

func (t *HybridBlockTable) isCached(g *pagedGroup, h uint64) bool {
	_, ok := t.cached[t.key(g, h)]
	return ok
}

func (t *HybridBlockTable) chain(r *SimRequest, n int) []uint64 {
	c := extendChain(t.chains[r.id], r, n, t.blockTokens)
	t.chains[r.id] = c
	return c
}

// match is the prefix hit of r in whole blocks (see HybridBlockTable),
// and its chain.
func (t *HybridBlockTable) match(r *SimRequest) (int, []uint64) {
	if !t.prefix {
		return 0, nil
	}
	n := max(r.context-1, 0) / t.blockTokens
	c := t.chain(r, n)
	hit := n
	for i := range t.groups {
		g := &t.groups[i]
		if g.kind == SlidingWindow {
			continue
		}
		run := 0
		for run < hit && t.isCached(g, c[run]) {
			run++
		}
		hit = run
	}
	for changed := true; changed && hit > 0; {
		changed = false
		for i := range t.groups {
			g := &t.groups[i]
			if g.kind != SlidingWindow {
				continue
			}
			if h := t.windowHit(g, c, hit); h < hit {
				hit, changed = h, true
			}
		}
	}
	return hit, c
}

// windowHit is a window group's longest hit of at most most blocks:
// ending with hitBlocks cached blocks, or a run of cached blocks from the
// first (vLLM's SlidingWindowManager.find_longest_cache_hit).
func (t *HybridBlockTable) windowHit(g *pagedGroup, c []uint64, most int) int {
	if g.hitBlocks == 0 {
		return most
	}
	run := 0
	for i := most - 1; i >= 0; i-- {
		if !t.isCached(g, c[i]) {
			run = 0
			continue
		}
		run++
		if run >= g.hitBlocks {
			return i + run
		}
	}
	return run
}

// hitBlock is group g's block of a hit's block k, or none where a window
// group needs it not (behind the window of hit blocks).
func (t *HybridBlockTable) hitBlock(g *pagedGroup, c []uint64, k, hit int) int32 {
	if g.kind == SlidingWindow && k < hit-g.hitBlocks {
		return none
	}
	return t.cached[t.key(g, c[k])]
}

// startNeed is the free blocks a start of r with a hit of hit blocks
// takes at once (its recurrent blocks, its hit blocks now free) and for
// its whole context.
func (t *HybridBlockTable) startNeed(r *SimRequest, hit int, c []uint64) (now, whole int) {
	whole = t.blocksAt(r.context)
	for i := range t.groups {
		g := &t.groups[i]
		if g.kind == Recurrent {
			now++
			continue
		}
		for k := range hit {
			if b := t.hitBlock(g, c, k, hit); b != none {
				whole-- // held by the hit, not taken for the context
				if t.blocks[b].ref == 0 {
					now++
					whole++ // a cached free block: the hit takes it off the free list
				}
			}
		}
	}
	return now, max(whole, now)
}

// CanAdmit says whether the free blocks (cached ones included) hold r's
// whole context in every group, less the blocks of its prefix hit that
// running sequences hold already.
func (t *HybridBlockTable) CanAdmit(r *SimRequest) bool {
	if t.usable("can admit", r) != nil || t.seqs[r.id] != nil {
		return false
	}
	hit, c := t.match(r)
	_, whole := t.startNeed(r, hit, c)
	return whole <= t.freeLen
}

// Admit shares r's prefix hit in every group, takes its recurrent blocks,
// and returns the hit's tokens.
func (t *HybridBlockTable) Admit(r *SimRequest) (int, error) { return t.start("admit", r) }

// Resume does what Admit does (recompute preemption).
func (t *HybridBlockTable) Resume(r *SimRequest) (int, error) { return t.start("resume", r) }

func (t *HybridBlockTable) start(op string, r *SimRequest) (int, error) {
	if err := t.usable(op, r); err != nil {
		return 0, err
	}
	if t.seqs[r.id] != nil {
		return 0, errors.Wrapf(driver.ErrInvalid, "serving: paged hybrid: %s request %d: it is running already", op, r.id)
	}
	hit, c := t.match(r)
	if now, _ := t.startNeed(r, hit, c); now > t.freeLen {
		return 0, errors.Wrapf(driver.ErrOutOfMemory, "serving: paged hybrid: %s request %d: needs %d blocks now (its recurrent groups' and its cached prefix's), %d of %d are free",
			op, r.id, now, t.freeLen, len(t.blocks))
	}
	tokens := hit * t.blockTokens
	s := &hybridPagedSeq{tables: make([][]int32, len(t.groups)), skipped: make([]int, len(t.groups)), tokens: tokens, registered: hit, need: t.need(tokens, 0)}
	for i := range t.groups {
		g := &t.groups[i]
		if g.kind == Recurrent {
			s.tables[i] = []int32{t.take()}
			continue
		}
		s.tables[i] = make([]int32, 0, t.blocksFor(r.context))
		for k := range hit {
			b := t.hitBlock(g, c, k, hit)
			if b == none {
				s.skipped[i]++
			} else {
				t.ref(g, b)
			}
			s.tables[i] = append(s.tables[i], b)
		}
	}
	t.seqs[r.id] = s
	t.logical += s.need
	if t.prefix {
		t.counts.PrefixQueried += int64(max(r.context-1, 0) / t.blockTokens * t.blockTokens)
		t.counts.PrefixHit += int64(tokens)
	}
	t.checkAfter(op)
	return tokens, nil
}

// ref adds a reference to block b of group g: a cached free block leaves
// the free list, a shared one spares its KV.
func (t *HybridBlockTable) ref(g *pagedGroup, b int32) {
	blk := &t.blocks[b]
	if blk.ref == 0 {
		t.unlinkFree(b)
		t.cachedFree--
		t.inUse++
	} else {
		t.saved += t.blockNeed(g)
	}
	blk.ref++
}

// unref drops a reference to block b of group g; the last one frees it,
// to the free list's tail.
func (t *HybridBlockTable) unref(g *pagedGroup, b int32) {
	blk := &t.blocks[b]
	blk.ref--
	if blk.ref > 0 {
		t.saved -= t.blockNeed(g)
		return
	}
	t.inUse--
	if blk.hashed {
		t.cachedFree++
	}
	t.pushFree(b)
}

// take hands out the free list's head, evicting its cached content.
func (t *HybridBlockTable) take() int32 {
	b := t.freeHead
	t.unlinkFree(b)
	blk := &t.blocks[b]
	if blk.hashed {
		delete(t.cached, blk.hash)
		blk.hashed = false
		t.cachedFree--
		t.counts.Evictions++
	}
	blk.ref = 1
	t.inUse++
	t.counts.Commits++
	return b
}

// Append frees each window group's blocks behind the window of the
// tokens r holds (computed), then takes blocks for n more tokens in every
// attention group, and registers the blocks they fill in the cache. An
// Append of no token changes nothing.
func (t *HybridBlockTable) Append(r *SimRequest, n int) error {
	if err := t.usable("append", r); err != nil {
		return err
	}
	s := t.seqs[r.id]
	switch {
	case s == nil:
		return errors.Wrapf(driver.ErrInvalid, "serving: paged hybrid: append to request %d: it is not running", r.id)
	case n < 0 || n > 2*MaxTokens-s.tokens:
		return errors.Wrapf(driver.ErrInvalid, "serving: paged hybrid: append %d tokens to request %d: want 0 to %d", n, r.id, 2*MaxTokens-s.tokens)
	}
	if n == 0 {
		return nil // nothing computed: the windows stay where they are
	}
	end := t.blocksFor(s.tokens + n)
	need, freed := 0, 0
	for i := range t.groups {
		g := &t.groups[i]
		switch g.kind {
		case Recurrent:
			continue
		case SlidingWindow:
			for k := s.skipped[i]; k < min(t.skippedAt(g, s.tokens), len(s.tables[i])); k++ {
				if b := s.tables[i][k]; b != none && t.blocks[b].ref == 1 {
					freed++ // a shared one stays in use
				}
			}
		}
		need += end - len(s.tables[i])
	}
	if need > t.freeLen+freed {
		return errors.Wrapf(driver.ErrOutOfMemory, "serving: paged hybrid: append %d tokens to request %d (%d held): needs %d more blocks of %d tokens, %d of %d are free (%d more behind its windows)",
			n, r.id, s.tokens, need, t.blockTokens, t.freeLen, len(t.blocks), freed)
	}
	for i := range t.groups { // the windows' blocks first: the others may take them
		g := &t.groups[i]
		if g.kind != SlidingWindow {
			continue
		}
		for to := min(t.skippedAt(g, s.tokens), len(s.tables[i])); s.skipped[i] < to; s.skipped[i]++ {
			k := s.skipped[i]
			if b := s.tables[i][k]; b != none {
				t.unref(g, b)
				s.tables[i][k] = none
			}
		}
	}
	for i := range t.groups {
		for t.groups[i].kind != Recurrent && len(s.tables[i]) < end {
			s.tables[i] = append(s.tables[i], t.take())
		}
	}
	s.tokens += n
	s.last = n
	t.logical -= s.need
	s.need = t.need(s.tokens, s.last)
	t.logical += s.need
	if full := s.tokens / t.blockTokens; t.prefix && full > s.registered {
		c := t.chain(r, full)
		for i := range t.groups {
			g := &t.groups[i]
			for k := s.registered; k < full; k++ {
				b := s.tables[i][k]
				if b == none {
					continue
				}
				if key := t.key(g, c[k]); !t.blocks[b].hashed {
					if _, dup := t.cached[key]; !dup {
						t.cached[key] = b
						t.blocks[b].hashed, t.blocks[b].hash = true, key
					}
				}
			}
		}
		s.registered = full
	} else if !t.prefix {
		s.registered = s.tokens / t.blockTokens
	}
	t.checkAfter("append")
	return nil
}

// Finish frees r's blocks; the hashed ones stay cached.
func (t *HybridBlockTable) Finish(r *SimRequest) error {
	if err := t.release("finish", r); err != nil {
		return err
	}
	delete(t.chains, r.id)
	t.checkAfter("finish")
	return nil
}

// Preempt frees r's blocks as Finish does: r is recomputed from its
// prefix hit when it resumes.
func (t *HybridBlockTable) Preempt(r *SimRequest) (recompute bool, err error) {
	if err := t.release("preempt", r); err != nil {
		return false, err
	}
	t.checkAfter("preempt")
	return true, nil
}

// release gives r's blocks back, each group's last to first, so that the
// free list evicts its prefix last.
func (t *HybridBlockTable) release(op string, r *SimRequest) error {
	if err := t.usable(op, r); err != nil {
		return err
	}
	s := t.seqs[r.id]
	if s == nil {
		return errors.Wrapf(driver.ErrInvalid, "serving: paged hybrid: %s request %d: it is not running", op, r.id)
	}
	for k := s.maxTable() - 1; k >= 0; k-- {
		for i := range t.groups {
			if k < len(s.tables[i]) && s.tables[i][k] != none {
				t.unref(&t.groups[i], s.tables[i][k])
			}
		}
	}
	t.logical -= s.need
	delete(t.seqs, r.id)
	return nil
}

func (s *hybridPagedSeq) maxTable() int {
	n := 0
	for _, tb := range s.tables {
		n = max(n, len(tb))
	}
	return n
}

// Stats: InUse is the blocks in use, Cached the hashed free ones; Logical
// the exact need, Stored it less what sharing spares (see
// HybridBlockTable).
func (t *HybridBlockTable) Stats() Stats {
	if t == nil {
		return Stats{}
	}
	s := t.counts
	s.InUse = uint64(t.inUse) * t.blockBytes
	s.Logical = t.logical
	s.Stored = t.logical - min(t.saved, t.logical)
	s.Cached = uint64(t.cachedFree) * t.blockBytes
	return s
}

func (t *HybridBlockTable) checkAfter(op string) {
	if invariants.Enabled {
		invariants.Fail("serving: paged hybrid: "+op, t.Check())
	}
}

// Check walks every block, the free list, the cache and every sequence's
// tables, and reports every inconsistency: references that disagree with
// the tables, a table of the wrong length or holding a block behind a
// window, a free list that is not exactly the free blocks, a cache entry
// that is not its block's, counts that disagree with a recount.
func (t *HybridBlockTable) Check() error {
	if err := t.made("check"); err != nil {
		return err
	}
	var errs error
	fail := func(format string, args ...any) {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf("serving: paged hybrid: "+format, args...))
	}
	refs := make([]int32, len(t.blocks))
	var logical, saved uint64
	for id, s := range t.seqs {
		if len(s.tables) != len(t.groups) || len(s.skipped) != len(t.groups) {
			fail("request %d has %d tables for %d groups", id, len(s.tables), len(t.groups))
			continue
		}
		for i, tb := range s.tables {
			g := &t.groups[i]
			want := t.blocksFor(s.tokens)
			if g.kind == Recurrent {
				want = 1
			}
			if len(tb) != want {
				fail("request %d holds %d tokens in %d blocks of group %d (%s), want %d", id, s.tokens, len(tb), i, g.kind, want)
			}
			for k, b := range tb {
				if b == none {
					if g.kind != SlidingWindow || k >= s.skipped[i] {
						fail("request %d's block %d of group %d (%s) is none, %d skipped", id, k, i, g.kind, s.skipped[i])
					}
					continue
				}
				if b < 0 || int(b) >= len(t.blocks) {
					fail("request %d's block %d of group %d is %d, not a block", id, k, i, b)
					continue
				}
				if k < s.skipped[i] {
					fail("request %d's block %d of group %d is held, behind its %d skipped", id, k, i, s.skipped[i])
				}
				if refs[b] > 0 {
					saved += t.blockNeed(g)
				}
				refs[b]++
			}
		}
		if want := t.need(s.tokens, s.last); s.need != want {
			fail("request %d needs %d bytes, recounted %d", id, s.need, want)
		}
		logical += s.need
	}
	inUse, cachedFree := 0, 0
	for b := range t.blocks {
		blk := &t.blocks[b]
		if blk.ref != refs[b] {
			fail("block %d has %d references, the tables hold it %d times", b, blk.ref, refs[b])
		}
		if blk.ref > 0 {
			inUse++
		} else if blk.hashed {
			cachedFree++
		}
		if blk.hashed && t.cached[blk.hash] != int32(b) {
			fail("block %d is hashed %#x, but the cache maps it to %d", b, blk.hash, t.cached[blk.hash])
		}
	}
	for h, b := range t.cached {
		if b < 0 || int(b) >= len(t.blocks) || !t.blocks[b].hashed || t.blocks[b].hash != h {
			fail("the cache maps %#x to block %d, which is not hashed so", h, b)
		}
	}
	onList := 0
	for b := t.freeHead; b != none; b = t.blocks[b].next {
		if onList > len(t.blocks) {
			fail("the free list loops")
			break
		}
		if t.blocks[b].ref != 0 {
			fail("block %d is on the free list with %d references", b, t.blocks[b].ref)
		}
		onList++
	}
	if free := len(t.blocks) - inUse; onList != free || t.freeLen != free {
		fail("%d blocks are free, the free list holds %d and counts %d", free, onList, t.freeLen)
	}
	if t.inUse != inUse || t.cachedFree != cachedFree || t.logical != logical || t.saved != saved {
		fail("counted %d in use, %d cached, %d bytes needed and %d saved; recounted %d, %d, %d and %d",
			t.inUse, t.cachedFree, t.logical, t.saved, inUse, cachedFree, logical, saved)
	}
	return errs
}

// String is the table's state in a line.
func (t *HybridBlockTable) String() string {
	if t == nil || t.seqs == nil {
		return "paged hybrid: not made by NewHybridBlockTable"
	}
	return fmt.Sprintf("paged hybrid: %d blocks of %d tokens in %d KV cache groups of %d layers (%s a block): %d in use, %d free (%d cached), %d sequences",
		len(t.blocks), t.blockTokens, len(t.groups), t.groupSize, units.Bytes(t.blockBytes), t.inUse, t.freeLen, t.cachedFree, len(t.seqs))
}
