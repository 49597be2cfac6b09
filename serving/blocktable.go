package serving

// The paged baseline: vLLM's block table, as bookkeeping.

import (
	"fmt"
	"unsafe"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/invariants"
	"github.com/vmarena/vmarena/internal/units"
)

// BlockTable is vLLM's paged KV memory (its V1 KV cache manager), as pure
// bookkeeping with no memory behind it. The budget is cut into blocks of
// BlockTokens tokens; a sequence holds a table of blocks, and takes a new
// one from the free list when its last one is full.
//
// Prefix caching: a full block is known by a chained hash, of the hash of
// the block before it and the block's tokens (SimRequest.Token); two
// blocks with the same hash hold the same content, as vLLM takes them to
// (a 64-bit collision would share unequal blocks, with odds of about
// 2^-64 a pair). At admission the longest run of a request's first blocks
// found in the cache is shared, not computed; a block in use gains a
// reference, a free one leaves the free list. A freed block keeps its
// content and hash, and is evicted only when the free list hands it out
// again: the list gives out the least recently freed block first, and a
// sequence frees its blocks last to first, so its prefix stays longest.
// Blocks of generated tokens are cached too (vLLM V1 does), so a request
// preempted for recompute finds its own blocks when it resumes, if they
// were not taken meanwhile. When two sequences fill blocks of the same
// content, the first one registered is the cached one; the other is freed
// as a plain block.
//
// Preemption drops a sequence's blocks (recompute); vLLM does not swap.
type BlockTable struct {
	blockTokens int
	tokenBytes  uint64

	// blockPool is every block of the budget, its free list and the
	// cache of hashed blocks.
	blockPool
	// seqs are the running sequences, by request ID.
	seqs map[int]*pagedSeq
	// chains are each request's block hashes, its context's full blocks
	// first to last, kept from its first lookup to Finish: they depend on
	// its tokens alone.
	chains map[int][]uint64

	// inUse counts blocks with ref > 0; stored the tokens written in them
	// (a shared block once); logical the tokens of all running sequences;
	// cachedFree the hashed free blocks.
	inUse, stored, logical, cachedFree int
	// counts holds Stats' counts (Commits, Prefix*, Evictions).
	counts Stats
}

// none ends the free list.
const none = -1

// pagedBlock is one block. prev and next link it on the free list while
// it is free.
type pagedBlock struct {
	ref        int32
	prev, next int32
	hashed     bool
	hash       uint64
}

// pagedSeq is a running sequence: its table holds ceil(tokens/blockTokens)
// blocks, and its first registered full blocks were offered to the cache.
type pagedSeq struct {
	table      []int32
	tokens     int
	registered int
}

// MaxBlocks bounds the blocks of a paged scheme's budget: its pool keeps
// an entry for every block from the start, so a budget of more (a large
// one over tiny tokens, or blocks of one token) is refused instead of
// building them. 2^26 blocks of 16 tokens hold a billion tokens, over a
// thousand times what an 80 GiB GPU holds of llama3-8b's.
const MaxBlocks = 1 << 26

// checkBlocks refuses a budget of n blocks of bt tokens past MaxBlocks,
// naming the scheme (what).
func checkBlocks(what string, budget, n uint64, bt int) error {
	if n <= MaxBlocks {
		return nil
	}
	return errors.Wrapf(driver.ErrInvalid, "serving: %s: a budget of %s is %d blocks of %d tokens, more than MaxBlocks (%d; %d bytes of books each): give larger blocks or a smaller budget",
		what, units.Bytes(budget), n, bt, MaxBlocks, unsafe.Sizeof(pagedBlock{}))
}

// NewBlockTable makes a paged scheme over cfg's budget: Budget /
// (BlockTokens * Model.TokenBytes()) blocks, all free. cfg must pass
// Config.Check; a budget of more than MaxBlocks blocks is refused too.
func NewBlockTable(cfg Config) (*BlockTable, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	cfg.defaults()
	tb := cfg.Model.TokenBytes()
	n := cfg.Budget / (tb * uint64(cfg.BlockTokens))
	if err := checkBlocks("paged", cfg.Budget, n, cfg.BlockTokens); err != nil {
		return nil, err
	}
	t := &BlockTable{
		blockTokens: cfg.BlockTokens,
		tokenBytes:  tb,
		blockPool:   newBlockPool(int(n)),
		seqs:        map[int]*pagedSeq{},
		chains:      map[int][]uint64{},
	}
	return t, nil
}

// Name is "paged (vLLM)".
func (t *BlockTable) Name() string { return PagedName }

// PagedName is the paged scheme's Name, the column others are compared
// with.
const PagedName = "paged (vLLM)"

// Blocks is the number of blocks in the budget.
func (t *BlockTable) Blocks() int {
	if t == nil {
		return 0
	}
	return len(t.blocks)
}

// made refuses a block table NewBlockTable did not make (nil, or the zero
// value).
func (t *BlockTable) made(op string) error {
	if t == nil || t.seqs == nil {
		return errors.Wrapf(driver.ErrInvalid, "serving: paged: %s: the block table was not made by NewBlockTable", op)
	}
	return nil
}

func (t *BlockTable) usable(op string, r *SimRequest) error {
	if err := t.made(op); err != nil {
		return err
	}
	return checkRequest("paged", op, r)
}

// blocksFor is the blocks n tokens fill.
func (t *BlockTable) blocksFor(n int) int { return (n + t.blockTokens - 1) / t.blockTokens }

// chain is r's block hashes, extended to its first n blocks.
func (t *BlockTable) chain(r *SimRequest, n int) []uint64 {
	c := extendChain(t.chains[r.id], r, n, t.blockTokens)
	t.chains[r.id] = c
	return c
}

// match is the longest run of r's first blocks found in the cache, among
// the full blocks of its first Context()-1 tokens (the last token is
// always computed, for its logits), and how many of them are in use.
func (t *BlockTable) match(r *SimRequest) (hits []int32, inUse int) {
	n := max(r.context-1, 0) / t.blockTokens
	c := t.chain(r, n)
	for k := range n {
		b, ok := t.cached[c[k]]
		if !ok {
			break
		}
		hits = append(hits, b)
		if t.blocks[b].ref > 0 {
			inUse++
		}
	}
	return hits, inUse
}

// CanAdmit says whether the free blocks (cached ones included: they can be
// evicted) hold r's whole context, less the blocks of its cached prefix
// that running sequences hold already.
func (t *BlockTable) CanAdmit(r *SimRequest) bool {
	if t.usable("can admit", r) != nil || t.seqs[r.id] != nil {
		return false
	}
	_, inUse := t.match(r)
	return t.blocksFor(r.context)-inUse <= t.freeLen
}

// Admit shares r's cached prefix and returns its tokens.
func (t *BlockTable) Admit(r *SimRequest) (int, error) {
	return t.start("admit", r)
}

// Resume does what Admit does: after a recompute preemption, a request
// starts again from its cached prefix, which may be its own blocks.
func (t *BlockTable) Resume(r *SimRequest) (int, error) {
	return t.start("resume", r)
}

func (t *BlockTable) start(op string, r *SimRequest) (int, error) {
	if err := t.usable(op, r); err != nil {
		return 0, err
	}
	if t.seqs[r.id] != nil {
		return 0, errors.Wrapf(driver.ErrInvalid, "serving: paged: %s request %d: it is running already", op, r.id)
	}
	hits, _ := t.match(r)
	s := &pagedSeq{table: make([]int32, 0, t.blocksFor(r.context)), tokens: len(hits) * t.blockTokens, registered: len(hits)}
	for _, b := range hits {
		blk := &t.blocks[b]
		if blk.ref == 0 {
			t.unlinkFree(b)
			t.cachedFree--
			t.inUse++
			t.stored += t.blockTokens
		}
		blk.ref++
		s.table = append(s.table, b)
	}
	t.seqs[r.id] = s
	t.logical += s.tokens
	t.counts.PrefixQueried += int64(max(r.context-1, 0) / t.blockTokens * t.blockTokens)
	t.counts.PrefixHit += int64(s.tokens)
	t.checkAfter(op)
	return s.tokens, nil
}

// Append takes blocks for n more tokens of r from the head of the free
// list, evicting the cached ones it takes, and registers the blocks they
// fill in the cache.
func (t *BlockTable) Append(r *SimRequest, n int) error {
	if err := t.usable("append", r); err != nil {
		return err
	}
	s := t.seqs[r.id]
	switch {
	case s == nil:
		return errors.Wrapf(driver.ErrInvalid, "serving: paged: append to request %d: it is not running", r.id)
	case n < 0 || n > 2*MaxTokens-s.tokens:
		return errors.Wrapf(driver.ErrInvalid, "serving: paged: append %d tokens to request %d: want 0 to %d", n, r.id, 2*MaxTokens-s.tokens)
	}
	need := t.blocksFor(s.tokens+n) - len(s.table)
	if need > t.freeLen {
		return errors.Wrapf(driver.ErrOutOfMemory, "serving: paged: append %d tokens to request %d (%d held): needs %d more blocks of %d tokens, %d of %d are free",
			n, r.id, s.tokens, need, t.blockTokens, t.freeLen, len(t.blocks))
	}
	for range need {
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
		s.table = append(s.table, b)
	}
	s.tokens += n
	t.stored += n
	t.logical += n
	if full := s.tokens / t.blockTokens; full > s.registered {
		c := t.chain(r, full)
		for k := s.registered; k < full; k++ {
			if _, dup := t.cached[c[k]]; !dup {
				b := s.table[k]
				t.cached[c[k]] = b
				t.blocks[b].hashed, t.blocks[b].hash = true, c[k]
			}
		}
		s.registered = full
	}
	t.checkAfter("append")
	return nil
}

// Finish frees r's blocks; the full ones stay cached.
func (t *BlockTable) Finish(r *SimRequest) error {
	if err := t.release("finish", r); err != nil {
		return err
	}
	delete(t.chains, r.id)
	t.checkAfter("finish")
	return nil
}

// Preempt frees r's blocks as Finish does: r must be recomputed, from
// whatever of its blocks is still cached when it resumes.
func (t *BlockTable) Preempt(r *SimRequest) (recompute bool, err error) {
	if err := t.release("preempt", r); err != nil {
		return false, err
	}
	t.checkAfter("preempt")
	return true, nil
}

// release gives r's blocks back, last to first, so that the free list
// evicts its prefix last.
func (t *BlockTable) release(op string, r *SimRequest) error {
	if err := t.usable(op, r); err != nil {
		return err
	}
	s := t.seqs[r.id]
	if s == nil {
		return errors.Wrapf(driver.ErrInvalid, "serving: paged: %s request %d: it is not running", op, r.id)
	}
	for k := len(s.table) - 1; k >= 0; k-- {
		b := s.table[k]
		blk := &t.blocks[b]
		blk.ref--
		if blk.ref > 0 {
			continue
		}
		t.inUse--
		t.stored -= min(s.tokens-k*t.blockTokens, t.blockTokens)
		if blk.hashed {
			t.cachedFree++
		}
		t.pushFree(b)
	}
	t.logical -= s.tokens
	delete(t.seqs, r.id)
	return nil
}

// Stats: InUse is the blocks in use, Cached the hashed free blocks.
func (t *BlockTable) Stats() Stats {
	if t == nil {
		return Stats{}
	}
	s := t.counts
	bb := uint64(t.blockTokens) * t.tokenBytes
	s.InUse = uint64(t.inUse) * bb
	s.Stored = uint64(t.stored) * t.tokenBytes
	s.Logical = uint64(t.logical) * t.tokenBytes
	s.Cached = uint64(t.cachedFree) * bb
	return s
}

// checkAfter runs Check after a change, in builds with the invariants tag.
func (t *BlockTable) checkAfter(op string) {
	if invariants.Enabled {
		invariants.Fail("serving: paged: "+op, t.Check())
	}
}

// Check walks every block, the free list, the cache and every sequence's
// table, and reports every inconsistency: references that disagree with
// the tables, a free list that is not exactly the free blocks, a cache
// entry that is not its block's hash, counts that disagree with a
// recount.
func (t *BlockTable) Check() error {
	if err := t.made("check"); err != nil {
		return err
	}
	var errs error
	fail := func(format string, args ...any) {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf("serving: paged: "+format, args...))
	}
	refs := make([]int32, len(t.blocks))
	stored := make([]int, len(t.blocks))
	logical := 0
	for id, s := range t.seqs {
		if len(s.table) != t.blocksFor(s.tokens) {
			fail("request %d holds %d tokens in %d blocks", id, s.tokens, len(s.table))
		}
		if s.registered > s.tokens/t.blockTokens {
			fail("request %d registered %d blocks of %d full", id, s.registered, s.tokens/t.blockTokens)
		}
		for k, b := range s.table {
			if b < 0 || int(b) >= len(t.blocks) {
				fail("request %d's block %d is %d, not a block", id, k, b)
				continue
			}
			refs[b]++
			stored[b] = max(stored[b], min(s.tokens-k*t.blockTokens, t.blockTokens))
		}
		logical += s.tokens
	}
	inUse, storedSum, cachedFree := 0, 0, 0
	for b := range t.blocks {
		blk := &t.blocks[b]
		if blk.ref != refs[b] {
			fail("block %d has %d references, the tables hold it %d times", b, blk.ref, refs[b])
		}
		if blk.ref > 0 {
			inUse++
			storedSum += stored[b]
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
	prev := int32(none)
	for b := t.freeHead; b != none; b = t.blocks[b].next {
		if onList > len(t.blocks) {
			fail("the free list loops")
			break
		}
		if t.blocks[b].ref != 0 {
			fail("block %d is on the free list with %d references", b, t.blocks[b].ref)
		}
		if t.blocks[b].prev != prev {
			fail("block %d's prev is %d, want %d", b, t.blocks[b].prev, prev)
		}
		prev = b
		onList++
	}
	if prev != t.freeTail {
		fail("the free list ends at %d, its tail is %d", prev, t.freeTail)
	}
	if free := len(t.blocks) - inUse; onList != free || t.freeLen != free {
		fail("%d blocks are free, the free list holds %d and counts %d", free, onList, t.freeLen)
	}
	for _, c := range []struct {
		name      string
		got, want int
	}{{"blocks in use", t.inUse, inUse}, {"tokens stored", t.stored, storedSum}, {"tokens of sequences", t.logical, logical}, {"cached free blocks", t.cachedFree, cachedFree}} {
		if c.got != c.want {
			fail("%s: counted %d, recounted %d", c.name, c.got, c.want)
		}
	}
	return errs
}

// String is the table's state in a line, for messages and tests.
func (t *BlockTable) String() string {
	if t == nil || t.seqs == nil {
		return "paged: not made by NewBlockTable"
	}
	return fmt.Sprintf("paged: %d blocks of %d tokens: %d in use (%d tokens stored), %d free (%d cached), %d sequences",
		len(t.blocks), t.blockTokens, t.inUse, t.stored, t.freeLen, t.cachedFree, len(t.seqs))
}
