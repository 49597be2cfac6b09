package kvcache

import (
	"cmp"
	"container/list"
	"fmt"
	"slices"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// Prefix sharing. The whole units of a prompt — units all of whose
// tokens lie in the prompt — are not committed in the slot but in a
// second arena.Sparse, the prefix store, and borrowed into the slot
// (arena.Sparse.Borrow: the same physical pages at the slot's addresses).
// A store unit is keyed by the chained hash of the tokens up to its end
// (blocks of BlockTokens, each hash(hash of the blocks before, extra key,
// the block's tokens); a unit ending inside a block hashes the block's
// tokens so far onto it) and keeps its tokens, so a match is exact. It
// becomes matchable once its owner has written it: published when the
// owner's MarkWritten covers it, never before (a unit given back
// unwritten is freed). A later sequence whose prompt starts with the same
// units under the same extra key borrows them — no copy, no new memory,
// read-only to it (protectSharedLocked); the unit after them, if a published unit that
// continues the same prefix shares some of its first whole blocks, is
// copied once into the sequence's own unit. At least the prompt's last
// token is always left to compute (its logits are needed).
//
// A store unit no sequence maps stays cached, listed in LRU order, and is
// evicted (decommitted whole: its pages hold nothing else) when memory is
// needed, before any running sequence is touched — or, when the memory is
// needed for new store units (backLocked), kept committed as a spare
// unit that one of them fills in place (recycling). A unit published while
// another with its key is listed stays unlisted and goes when its last
// borrower gives it back.
//
// Sharing needs units that hold whole tokens: in the PerLayer layout a
// page must be a whole number of rows, otherwise sharing is off. In the
// Contiguous layout a token may straddle two pages: a store unit is one
// page, keyed by the tokens with bytes in it, and a match that ends at a
// page boundary a token straddles (the token's head in the last matched
// page, its tail past it) borrows the pages before the one that token
// starts in and copies that one into the sequence's own page, so the
// sequence writes the token's rows in memory of its own (cut).

// errNoStoreRoom says the prefix store has no unit to give: the unit is
// then the slot's own. It never leaves the package.
var errNoStoreRoom = errors.New("kvcache: the prefix store has no room")

// storeUnit is one unit of the prefix store: regions side by side at
// idx*storeUnitBytes, region r's part at +r*unitBytes.
//
// Invariants: refs is the number of slot units mapping it; owner is the
// sequence writing it until it is published, nil after; listed units are
// published and are byKey[key]; a unit with no borrower is listed and in
// the LRU list (elem), never otherwise.
type storeUnit struct {
	idx       int
	u         int    // the unit index it holds in every slot that maps it
	key       uint64 // prefix hash at its end token
	parent    uint64 // prefix hash at its first token (keyTokens)
	tokens    []int  // the tokens it is listed with (keyTokens)
	refs      int
	owner     *Seq
	published bool
	listed    bool
	lastUse   uint64
	elem      *list.Element
	// used is the bytes of the unit that hold tokens, when not all of
	// them do (0: all): a fork's last unit, shared while partly written
	// (fork.go). Set only while one slot maps it.
	used uint64
	// keptIn is the slots that keep it mapped at unit u (kept.go).
	keptIn []*slot
	// hits counts the admissions and resumes whose match borrowed it
	// (countMatchLocked): none for a unit only its writer has mapped,
	// whose kept mappings ClearKept unmaps ahead.
	hits int
	// clear says it is one of the cached units at the LRU list's front
	// that keep no mapping (prefixStore.clearN).
	clear bool
	// prevKid and nextKid link the listed units of its parent key
	// (prefixStore.children).
	prevKid, nextKid *storeUnit
}

// kids is the listed units of one parent key, linked through prevKid and
// nextKid from first to last: listing and unlisting a unit touch its
// neighbours, never the others, and allocate nothing.
type kids struct{ first, last *storeUnit }

// addKidLocked lists su under its parent key, last.
func (c *Cache) addKidLocked(su *storeUnit) {
	k := c.ps.children[su.parent]
	su.prevKid, su.nextKid = k.last, nil
	if k.last != nil {
		k.last.nextKid = su
	} else {
		k.first = su
	}
	k.last = su
	c.ps.children[su.parent] = k
}

// dropKidLocked takes su out of its parent key's list.
func (c *Cache) dropKidLocked(su *storeUnit) {
	k := c.ps.children[su.parent]
	if su.prevKid != nil {
		su.prevKid.nextKid = su.nextKid
	} else {
		k.first = su.nextKid
	}
	if su.nextKid != nil {
		su.nextKid.prevKid = su.prevKid
	} else {
		k.last = su.prevKid
	}
	su.prevKid, su.nextKid = nil, nil
	if k.first == nil {
		delete(c.ps.children, su.parent)
		return
	}
	c.ps.children[su.parent] = k
}

// usedBytes is the bytes of su that hold tokens: what each mapping of it
// past the first spares.
func (su *storeUnit) usedBytes(g *geometry) uint64 {
	if su.used != 0 {
		return su.used
	}
	return g.fullUnitBytes()
}

// prefixStore is the cache's store books (mu guards them).
//
// Invariants: sharedUnits counts the units mapped by two or more slots,
// extraRefs the mappings past each unit's first (the sum of refs-1 over
// them), extraBytes those mappings' bytes that hold tokens (the sum of
// (refs-1)*usedBytes): what Stats' SharedPages, SavedBytes and UsedBytes
// read.
type prefixStore struct {
	s        *arena.Sparse // nil when sharing is off
	units    []*storeUnit  // by idx; nil where free
	free     []int         // free idx, a stack
	byKey    map[uint64]*storeUnit
	children map[uint64]kids // listed units by parent key, in the order listed
	lru      *list.List      // cached units (no borrower), least recently used first
	pages    int

	// clearN is how many cached units at the LRU list's front are known
	// to keep no mapping anywhere (each flagged clear), and clearEnd the
	// element after them (nil when they are the whole list): a cached
	// unit never gains a kept mapping (only a borrowed one is kept, and
	// it joins the list's end then), so unmapKeptAheadLocked starts past
	// them instead of walking them again on every call.
	clearN   int
	clearEnd *list.Element

	// spare is the idx of units evicted by the backLocked running now
	// whose memory stays committed for the store units it backs next
	// (reused in place: no decommit, no commit); recycle is how many more
	// it may keep. Counted in neither pages nor the budget's: the
	// backLocked decommits those it did not use before it commits
	// anything else and before it returns, so spare is empty whenever mu
	// is let go.
	spare   []int
	recycle int

	sharedUnits, extraRefs int
	extraBytes             uint64
}

// refLocked adds d to su's borrowers, keeping the sharing counters.
func (c *Cache) refLocked(su *storeUnit, d int) {
	before := su.refs
	su.refs += d
	extra := max(su.refs-1, 0) - max(before-1, 0)
	c.ps.extraRefs += extra
	// One more mapping or one fewer: unsigned arithmetic wraps exactly.
	c.ps.extraBytes += uint64(extra) * su.usedBytes(c.g)
	c.ps.sharedUnits += b2i(su.refs > 1) - b2i(before > 1)
}

// lruPushLocked caches su, borrowed by no one: it joins the LRU list's
// end.
func (c *Cache) lruPushLocked(su *storeUnit) {
	su.elem = c.ps.lru.PushBack(su)
	su.clear = false
	if c.ps.clearEnd == nil {
		c.ps.clearEnd = su.elem
	}
}

// lruRemoveLocked takes su, cached, out of the LRU list.
func (c *Cache) lruRemoveLocked(su *storeUnit) {
	if su.elem == c.ps.clearEnd {
		c.ps.clearEnd = su.elem.Next()
	}
	if su.clear {
		su.clear = false
		c.ps.clearN--
	}
	c.ps.lru.Remove(su.elem)
	su.elem = nil
}

// openStore reserves the prefix store: as many units as the device could
// hold. Sharing stays off when turned off, or when units straddle tokens.
func (c *Cache) openStore(capacity uint64) error {
	g := c.g
	c.ps = prefixStore{byKey: map[uint64]*storeUnit{}, children: map[uint64]kids{}, lru: list.New()}
	if c.cfg.NoPrefixSharing || (g.layout == PerLayer && g.page%g.row != 0) {
		return nil
	}
	sub := g.storeUnitBytes()
	n := int(min(capacity/sub, uint64(1)<<30))
	if n == 0 {
		return nil
	}
	s, err := arena.NewSparse(c.space, c.mem, arena.SparseOptions{
		Max: uint64(n) * sub, ChunkSize: g.page, MaxChunk: g.unitBytes, Device: c.cfg.Device, Pool: c.pool,
	})
	if err != nil {
		return errors.Wrapf(err, "kvcache: new cache: the prefix store of %d units of %s", n, units.Bytes(sub))
	}
	c.ps.s = s
	c.ps.units = make([]*storeUnit, n)
	c.ps.free = make([]int, n)
	for i := range c.ps.free {
		c.ps.free[i] = n - 1 - i
	}
	return nil
}

// storeUnitBytes is the size of one store unit: one unit of every region.
func (g *geometry) storeUnitBytes() uint64 { return uint64(g.regions) * g.unitBytes }

// The hashes. mix is a 64-bit multiply-xorshift step.
func mix(h, x uint64) uint64 {
	h ^= x
	h *= 0x9e3779b97f4a7c15
	return h ^ h>>32
}

// blockHash is hash(prev, extra, tokens): a block's (or a part's) hash
// chained onto the hash of what comes before it.
func blockHash(prev, extra uint64, tokens []int) uint64 {
	h := mix(prev, extra)
	for _, t := range tokens {
		h = mix(h, uint64(t))
	}
	return mix(h, uint64(len(tokens))<<1|1)
}

// chain returns the hashes at every block boundary of tokens under extra:
// chain[0] is the seed, chain[i] the hash of blocks [0, i).
func chain(tokens []int, extra uint64, block int) []uint64 {
	return chainTo(make([]uint64, 0, 1+len(tokens)/block), tokens, extra, block, len(tokens)/block)
}

// chainTo extends ch, a chain of tokens under extra, to hold the hashes
// of blocks [0, b) (b at most len(tokens)/block): a lookup hashes only as
// far as it matches.
func chainTo(ch []uint64, tokens []int, extra uint64, block, b int) []uint64 {
	if len(ch) == 0 {
		ch = append(ch, mix(0x6b76636163686521, extra)) // "kvcache!"
	}
	for i := len(ch) - 1; i < b; i++ {
		ch = append(ch, blockHash(ch[i], extra, tokens[i*block:(i+1)*block]))
	}
	return ch
}

// prefixKey is the hash of tokens[:e] under extra, from its chain (which
// reaches block e/block).
func prefixKey(ch []uint64, tokens []int, extra uint64, block, e int) uint64 {
	b := e / block
	if e%block == 0 {
		return ch[b]
	}
	return blockHash(ch[b], extra, tokens[b*block:e])
}

// unitKey is the key of a store unit u whose tokens end at e: the prefix
// hash at e — and, where a token is larger than a page in the Contiguous
// layout (so that pages may complete no token, and two units end at the
// same token), the unit's index too. parentKey is the key of the unit
// before u, whose tokens end at e (the prefix hash at e for unit 0).
func (g *geometry) unitKey(ch []uint64, tokens []int, extra uint64, e, u int) uint64 {
	k := prefixKey(ch, tokens, extra, g.block, e)
	if g.layout == Contiguous && g.stride > g.page {
		k = mix(k, uint64(u)<<1|1)
	}
	return k
}

func (g *geometry) parentKey(ch []uint64, tokens []int, extra uint64, e, u int) uint64 {
	if u == 0 {
		return prefixKey(ch, tokens, extra, g.block, e)
	}
	return g.unitKey(ch, tokens, extra, e, u-1)
}

// sharing reports whether the store is open.
func (c *Cache) sharing() bool { return c.ps.s != nil }

// storeBoundLocked reports whether unit u of s belongs in the store: all
// its tokens are the prompt's.
func (c *Cache) storeBoundLocked(s *Seq, u int) bool {
	if !c.sharing() {
		return false
	}
	_, end := c.g.unitTokens(u)
	return end <= len(s.prompt)
}

// storeOff is where region r of store unit idx lies in the store.
func (c *Cache) storeOff(idx, r int) uint64 {
	return uint64(idx)*c.g.storeUnitBytes() + uint64(r)*c.g.unitBytes
}

// takeStoreIdxLocked returns a store unit to fill and whether its memory
// is committed already (a spare one, reused in place): a spare if there
// is one, else a free one, evicting the least recently used cached unit
// (and reusing its memory) if there is none; errNoStoreRoom when every
// unit is mapped.
func (c *Cache) takeStoreIdxLocked() (idx int, committed bool, err error) {
	if len(c.ps.spare) == 0 && len(c.ps.free) == 0 {
		if c.ps.lru.Len() == 0 {
			return 0, false, errNoStoreRoom
		}
		c.ps.recycle++
		if err := c.evictOneLocked(); err != nil {
			return 0, false, err
		}
	}
	if n := len(c.ps.spare); n > 0 {
		idx = c.ps.spare[n-1]
		c.ps.spare = c.ps.spare[:n-1]
		return idx, true, nil
	}
	idx = c.ps.free[len(c.ps.free)-1]
	c.ps.free = c.ps.free[:len(c.ps.free)-1]
	return idx, false, nil
}

// storeRoomLocked is how many units takeStoreIdxLocked can give now:
// spare, free and cached ones (every unit not mapped).
func (c *Cache) storeRoomLocked() int {
	return len(c.ps.spare) + len(c.ps.free) + c.ps.lru.Len()
}

// backFromStoreLocked makes units [u0, u1) of s — empty, consecutive,
// each a whole unit of its prompt — new store units s owns, borrowed into
// its slot, each in a spare unit's memory if there is one, else in a new
// commit. The budget has room (the caller made it). It returns how many
// it backed, from u0: fewer than asked, with no error, when the store has
// no unit left to give (every unit mapped). On failure those it backed
// are in the books (the caller gives them back) and the rest changed
// nothing but spare units' books (committed memory not used stays spare).
//
// The places the store gives go to the units in the store's order: those
// side by side there are committed, and borrowed when a unit is one
// region, in one arena call each run.
func (c *Cache) backFromStoreLocked(s *Seq, u0, u1 int) (int, error) {
	g := c.g
	type taken struct {
		idx       int
		committed bool
	}
	took := make([]taken, 0, u1-u0)
	// Those not made store units go back: spare if committed.
	giveBack := func(from int) {
		for _, t := range took[from:] {
			if t.committed {
				c.ps.spare = append(c.ps.spare, t.idx)
			} else {
				c.ps.free = append(c.ps.free, t.idx)
			}
		}
	}
	for u := u0; u < u1; u++ {
		idx, committed, err := c.takeStoreIdxLocked()
		if errors.Is(err, errNoStoreRoom) {
			break
		}
		if err != nil {
			giveBack(0)
			return 0, err
		}
		took = append(took, taken{idx, committed})
	}
	// Which unit's memory backs which is free to choose: in the store's
	// order, units side by side are committed, and borrowed, in one call.
	// Evicted units come in LRU order — a chain from its end, so a run of
	// the store backwards — and free ones in any order.
	slices.SortFunc(took, func(a, b taken) int { return cmp.Compare(a.idx, b.idx) })
	sub := g.storeUnitBytes()
	for i := 0; i < len(took); {
		if took[i].committed {
			i++
			continue
		}
		j := i + 1
		for j < len(took) && !took[j].committed && took[j].idx == took[j-1].idx+1 {
			j++
		}
		if err := c.ps.s.Commit(uint64(took[i].idx)*sub, uint64(j-i)*sub); err != nil {
			giveBack(0)
			return 0, errors.Wrapf(err, "kvcache: prefix store units for units [%d, %d)", u0+i, u0+j)
		}
		c.counts.commits++
		for k := i; k < j; k++ {
			took[k].committed = true
		}
		i = j
	}
	if s.chain == nil {
		s.chain = chain(s.prompt, s.extra, g.block)
	}
	ch := s.chain
	sus := make([]*storeUnit, len(took))
	for i, t := range took {
		start, end := g.keyTokens(u0 + i)
		sus[i] = &storeUnit{idx: t.idx, u: u0 + i, owner: s, lastUse: c.tick,
			key:    g.unitKey(ch, s.prompt, s.extra, end, u0+i),
			parent: g.parentKey(ch, s.prompt, s.extra, start, u0+i),
			tokens: slices.Clone(s.prompt[start:end])}
	}
	n, err := c.borrowRunLocked(s.sl, u0, sus)
	for _, su := range sus[:n] {
		s.unpublished = append(s.unpublished, su)
		c.ps.units[su.idx] = su
		c.ps.pages += g.unitPages()
		c.pages += g.unitPages()
	}
	giveBack(n)
	return n, err
}

// borrowRunLocked maps store units sus at units u0, u0+1, ... of sl in
// one arena call a region, whose access is granted over the run in one
// driver call: arena.Sparse.Borrow for units side by side in the store
// (one region each), arena.Sparse.BorrowEach otherwise (the units a
// store unit apart, or scattered). It returns how
// many it mapped (all unless it fails; those it mapped are in the books).
func (c *Cache) borrowRunLocked(sl *slot, u0 int, sus []*storeUnit) (int, error) {
	if len(sus) == 0 {
		return 0, nil
	}
	if c.g.regions > 1 {
		if len(sus) == 1 {
			if err := c.borrowLocked(sl, u0, sus[0]); err != nil {
				return 0, err
			}
			return 1, nil
		}
		return c.borrowEachLocked(sl, u0, sus, driver.AccessReadWrite)
	}
	if !slices.IsSortedFunc(sus, func(a, b *storeUnit) int { return a.idx - b.idx }) || sus[len(sus)-1].idx-sus[0].idx != len(sus)-1 {
		// Not side by side in the store: one call all the same.
		return c.borrowEachLocked(sl, u0, sus, driver.AccessReadWrite)
	}
	for i := 0; i < len(sus); {
		j := i + 1
		for j < len(sus) && sus[j].idx == sus[j-1].idx+1 {
			j++
		}
		n := uint64(j-i) * c.g.unitBytes
		if err := c.slots.Borrow(c.slotOff(sl, 0, u0+i), c.ps.s, c.storeOff(sus[i].idx, 0), n); err != nil {
			return i, errors.Wrapf(err, "kvcache: map prefix store units %d to %d at units [%d, %d) of slot %d", sus[i].idx, sus[j-1].idx, u0+i, u0+j, sl.idx)
		}
		c.counts.borrows++
		for k := i; k < j; k++ {
			c.borrowedLocked(sl, u0+k, sus[k])
		}
		i = j
	}
	return len(sus), nil
}

// dropSpareLocked decommits the spare units backLocked did not reuse and
// ends its recycling.
func (c *Cache) dropSpareLocked() error {
	c.ps.recycle = 0
	var errs error
	sub := c.g.storeUnitBytes()
	for len(c.ps.spare) > 0 {
		idx := c.ps.spare[len(c.ps.spare)-1]
		c.ps.spare = c.ps.spare[:len(c.ps.spare)-1]
		if err := c.ps.s.Decommit(uint64(idx)*sub, sub); err != nil {
			errs = errors.CombineErrors(errs, errors.WithAssertionFailure(errors.Wrapf(err, "kvcache: decommit prefix store unit %d", idx)))
			continue // its memory is lost to the books: Check reports it
		}
		c.counts.decommits++
		c.ps.free = append(c.ps.free, idx)
	}
	return errs
}

// borrowSharedLocked maps a match's store units sus at units u0, u0+1,
// ... of sl, read-only where the cache protects shared units — in the
// borrow's own grant, one driver call a region, not a borrow and then a
// read-only grant — and reports whether it did. A driver that cannot
// grant read-only access gets them writable (and the cache stops
// asking: protectSharedLocked's fallback).
func (c *Cache) borrowSharedLocked(sl *slot, u0 int, sus []*storeUnit) (n int, readOnly bool, err error) {
	if c.protects && len(sus) > 0 {
		n, err = c.borrowEachLocked(sl, u0, sus, driver.AccessRead)
		if !errors.Is(err, driver.ErrUnsupported) {
			return n, err == nil, err
		}
		c.protects = false // nothing was mapped
	}
	n, err = c.borrowRunLocked(sl, u0, sus)
	return n, false, err
}

// borrowEachLocked maps store units sus at units u0, u0+1, ... of sl in
// every region, one arena call a region, with access at most most. On
// failure nothing changed.
func (c *Cache) borrowEachLocked(sl *slot, u0 int, sus []*storeUnit, most driver.Access) (int, error) {
	g := c.g
	offs := make([]uint64, len(sus))
	n := uint64(len(sus)) * g.unitBytes
	for r := 0; r < g.regions; r++ {
		for i, su := range sus {
			offs[i] = c.storeOff(su.idx, r)
		}
		if err := c.slots.BorrowEach(c.slotOff(sl, r, u0), c.ps.s, offs, most); err != nil {
			var undo error
			for q := 0; q < r; q++ {
				undo = errors.CombineErrors(undo, c.slots.Decommit(c.slotOff(sl, q, u0), n))
			}
			if undo != nil {
				err = errors.CombineErrors(err, errors.WithAssertionFailure(undo))
			}
			return 0, errors.Wrapf(err, "kvcache: map prefix store units %d to %d at units [%d, %d) of slot %d",
				sus[0].idx, sus[len(sus)-1].idx, u0, u0+len(sus), sl.idx)
		}
	}
	c.counts.borrows += g.regions
	for i, su := range sus {
		c.borrowedLocked(sl, u0+i, su)
	}
	return len(sus), nil
}

// borrowLocked maps store unit su at unit u of sl, one borrow per region.
// On failure nothing changed.
func (c *Cache) borrowLocked(sl *slot, u int, su *storeUnit) error {
	g := c.g
	for r := 0; r < g.regions; r++ {
		if err := c.slots.Borrow(c.slotOff(sl, r, u), c.ps.s, c.storeOff(su.idx, r), g.unitBytes); err != nil {
			var undo error
			for q := 0; q < r; q++ {
				undo = errors.CombineErrors(undo, c.slots.Decommit(c.slotOff(sl, q, u), g.unitBytes))
			}
			if undo != nil {
				err = errors.CombineErrors(err, errors.WithAssertionFailure(undo))
			}
			return errors.Wrapf(err, "kvcache: map prefix store unit %d at unit %d of slot %d", su.idx, u, sl.idx)
		}
	}
	c.counts.borrows += g.regions
	c.borrowedLocked(sl, u, su)
	return nil
}

// borrowedLocked books su as mapped at unit u of sl.
func (c *Cache) borrowedLocked(sl *slot, u int, su *storeUnit) {
	if su.elem != nil {
		c.lruRemoveLocked(su)
	}
	c.refLocked(su, 1)
	su.lastUse = c.tick
	c.setUnitLocked(sl, u, unitBorrowed, su)
}

// freeStoreUnitLocked decommits su (mapped nowhere) and frees its place
// — or, while backLocked recycles, keeps its memory as a spare unit.
func (c *Cache) freeStoreUnitLocked(su *storeUnit) error {
	if c.ps.units[su.idx] == su {
		c.ps.units[su.idx] = nil
		c.ps.pages -= c.g.unitPages()
		c.pages -= c.g.unitPages()
	}
	if c.ps.recycle > 0 {
		c.ps.recycle--
		c.ps.spare = append(c.ps.spare, su.idx)
		return nil
	}
	sub := c.g.storeUnitBytes()
	if err := c.ps.s.Decommit(uint64(su.idx)*sub, sub); err != nil {
		return errors.WithAssertionFailure(errors.Wrapf(err, "kvcache: decommit prefix store unit %d", su.idx))
	}
	c.counts.decommits++
	c.ps.free = append(c.ps.free, su.idx)
	return nil
}

// giveBackLocked ends one mapping of su (its slot units are already
// decommitted): a unit no one maps is cached if listed, freed otherwise
// (never published: its bytes mean nothing).
func (c *Cache) giveBackLocked(su *storeUnit) {
	c.refLocked(su, -1)
	if o := su.owner; o != nil {
		// Given back unwritten: units go back last first, so it is the
		// owner's last unpublished one (Preempt and Free drop the rest).
		if n := len(o.unpublished); n > 0 && o.unpublished[n-1] == su {
			o.unpublished[n-1] = nil
			o.unpublished = o.unpublished[:n-1]
		}
		su.owner = nil
	}
	if su.refs > 0 {
		return
	}
	su.lastUse = c.tick
	if su.listed {
		c.lruPushLocked(su)
		return
	}
	if err := c.freeStoreUnitLocked(su); err != nil {
		c.lostErr = errors.CombineErrors(c.lostErr, err) // reported by Check
	}
}

// publishLocked makes the store units s owns whose tokens are all below
// upTo — written — matchable: the front of s.unpublished, in unit order.
func (c *Cache) publishLocked(s *Seq, upTo int) {
	i := 0
	for ; i < len(s.unpublished); i++ {
		su := s.unpublished[i]
		if su.owner != s {
			continue // given back unwritten
		}
		if _, end := c.g.unitTokens(su.u); end > upTo {
			break
		}
		su.owner, su.published = nil, true
		old, taken := c.ps.byKey[su.key]
		if !taken {
			su.listed = true
			c.ps.byKey[su.key] = su
			c.addKidLocked(su)
			c.storedLocked(su)
			continue
		}
		if old.refs == 0 && old.u == su.u && slices.Equal(old.tokens, su.tokens) {
			c.replaceListedLocked(old, su)
		}
	}
	if i > 0 {
		n := copy(s.unpublished, s.unpublished[i:])
		clear(s.unpublished[n:])
		s.unpublished = s.unpublished[:n]
	}
}

// replaceListedLocked lists su, just written, under the key of old, a
// cached unit of the same tokens at the same place that no one maps, and
// frees old. A sequence writes such a unit where its match ended inside
// the unit before (a copy of the cached unit, the token straddling out of
// it recomputed) or where it computed a prefix another sequence was
// computing too. Left cached, old would be evicted before the units the
// sequence publishes after it — those are held while it runs, and given
// back after it — leaving a hole in the prefix that ends every later
// match there; listed in its place, su is held and given back in the
// prefix's order, and old's pages go back. The prefix's hash stays in the
// index (no event). A kept mapping of old that cannot be unmapped leaves
// old listed and is reported by Check.
func (c *Cache) replaceListedLocked(old, su *storeUnit) {
	if err := c.unmapKeptOfLocked(old); err != nil {
		c.lostErr = errors.CombineErrors(c.lostErr, err)
		return
	}
	c.lruRemoveLocked(old)
	old.listed = false
	c.dropKidLocked(old)
	su.listed = true
	c.ps.byKey[su.key] = su
	c.addKidLocked(su)
	if err := c.freeStoreUnitLocked(old); err != nil {
		c.lostErr = errors.CombineErrors(c.lostErr, err)
	}
}

// unlistLocked takes su out of the index.
func (c *Cache) unlistLocked(su *storeUnit) {
	if !su.listed {
		return
	}
	su.listed = false
	c.removedLocked(su)
	delete(c.ps.byKey, su.key)
	c.dropKidLocked(su)
}

// evictablePagesLocked is the pages of cached units.
func (c *Cache) evictablePagesLocked() int { return c.ps.lru.Len() * c.g.unitPages() }

// evictLocked evicts cached units, least recently used first, until need
// more pages fit in the budget.
func (c *Cache) evictLocked(need int) error {
	for c.freePagesLocked() < need && c.ps.lru.Len() > 0 {
		if err := c.evictOneLocked(); err != nil {
			return err
		}
	}
	return nil
}

// evictOneLocked evicts the least recently used cached unit.
func (c *Cache) evictOneLocked() error {
	return c.evictUnitLocked(c.ps.lru.Front().Value.(*storeUnit))
}

// evictUnitLocked evicts su, a cached unit.
func (c *Cache) evictUnitLocked(su *storeUnit) error {
	c.lruRemoveLocked(su)
	c.unlistLocked(su)
	if err := c.unmapKeptOfLocked(su); err != nil {
		return err
	}
	if err := c.freeStoreUnitLocked(su); err != nil {
		return err
	}
	c.counts.evictions++
	c.counts.evictedPages += c.g.unitPages()
	return nil
}

// match is what the store holds of a prefix: units [0, len(units)) to
// borrow, and the tokens matched in all (M), past the units when the next
// unit is to be copied from partial.
type match struct {
	units   []*storeUnit
	tokens  int
	partial *storeUnit
}

// matchLocked gives a new sequence (in its slot, nothing borrowed yet)
// the prefix the store holds of its prompt.
// m is what the store holds of the prompt (the plan's).
func (c *Cache) matchLocked(what func() string, s *Seq, m match) error {
	if !c.sharing() {
		return nil
	}
	_, err := c.applyMatchLocked(what, s, m, true)
	if err != nil {
		return err
	}
	s.n, s.written = s.matched, s.matched
	c.countMatchLocked(s)
	return nil
}

// countMatchLocked counts, once an Admit or a Resume has succeeded, the
// lookup of s's prompt blocks and those it found (Matched): a call that
// fails counts nothing.
func (c *Cache) countMatchLocked(s *Seq) {
	if !c.sharing() {
		return
	}
	c.counts.queries += len(s.prompt) / c.g.block
	c.counts.hits += s.matched / c.g.block
	for sl, u := s.sl, s.sl.lo; u < sl.shared; u++ {
		su := sl.units[u].su
		if su == nil {
			continue
		}
		if su.hits == 0 {
			// The slots keeping it may now keep units above it that no
			// match borrowed: ClearKept walks them again.
			for _, x := range su.keptIn {
				x.cleared = false
			}
		}
		su.hits++
	}
}

// rematchLocked borrows again, for a preempted sequence being resumed,
// m, what the store holds of its first tokens (the plan's); a partly
// shared unit is copied only when copy (the bytes are not coming from
// host memory). It returns the units it backed (for undoing).
func (c *Cache) rematchLocked(what func() string, s *Seq, m match, copy bool) ([]int, error) {
	if !c.sharing() {
		s.matched = 0
		return nil, nil
	}
	return c.applyMatchLocked(what, s, m, copy)
}

// applyMatchLocked borrows m's units into s's slot (after giving back the
// pages the slot kept there) and, when copy, backs the next unit and
// copies the partly matched blocks into it — if the budget allows; if not,
// the match stops at the whole units. It sets s.matched and returns the
// units it backed. On failure nothing is borrowed or backed.
func (c *Cache) applyMatchLocked(what func() string, s *Seq, m match, copy bool) ([]int, error) {
	g, sl := c.g, s.sl
	k := len(m.units)
	s.matched = 0
	if !copy {
		m.partial = nil
	}
	writable, err := c.takeKeptLocked(sl, m.units)
	if err != nil {
		return nil, errors.Wrapf(err, "%s", what())
	}
	if k == 0 && m.partial == nil {
		return nil, nil
	}
	// The slot's own pages where the shared units go are given back.
	for u := 0; u < k; u++ {
		if sl.units[u].state == unitOwned {
			if err := c.decommitUnitsLocked(sl, u, u+1); err != nil {
				return nil, err
			}
			c.counts.reclaimedPages += g.unitPages()
		}
	}
	// A window cache's match leaves the units behind the window of its
	// first token past it unborrowed (nil): the slot starts past them.
	lo0, lo := sl.lo, 0
	for lo < k && m.units[lo] == nil {
		lo++
	}
	if lo > sl.lo {
		c.setLoLocked(sl, lo)
	}
	var backed []int
	undo := func(err error) ([]int, error) {
		err = errors.CombineErrors(err, c.unbackLocked(sl, backed))
		c.setLoLocked(sl, lo0)
		return nil, err
	}
	// Borrowed, the units are no longer cached: making room for the
	// copy below cannot evict them. Other sequences read them: they are
	// read-only to this one. The units the slot kept mapped and the match
	// reuses are borrowed already (takeKeptLocked); the rest are mapped
	// in runs.
	readOnly := !writable
	for a := sl.lo; a < k; {
		if sl.units[a].state == unitBorrowed {
			backed = append(backed, a)
			a++
			continue
		}
		b := a + 1
		for b < k && sl.units[b].state != unitBorrowed {
			b++
		}
		n, ro, err := c.borrowSharedLocked(sl, a, m.units[a:b])
		for u := a; u < a+n; u++ {
			backed = append(backed, u)
		}
		if err != nil {
			return undo(errors.Wrapf(err, "%s", what()))
		}
		readOnly = readOnly && ro
		a = b
	}
	if readOnly && c.protects {
		sl.shared = k // mapped read-only as they were borrowed
	} else if err := c.protectSharedLocked(what, sl, k); err != nil {
		return undo(err)
	}
	if p := m.partial; p != nil {
		// Held (as a borrow would) while room is made, so it is not
		// evicted for its own copy; used last when let go.
		c.holdLocked(p)
		copied, err := c.copyPartialLocked(what, s, p, k)
		c.letGoLocked(p)
		if err != nil {
			return undo(err)
		}
		if copied == nil {
			m.partial = nil
		}
		backed = append(backed, copied...)
		if a := g.cleanBelow(k); copied == nil && a < k {
			// A token straddles into unit k from the borrowed unit k-1
			// and the copy that would have held it has no room: the
			// borrowed units back to a boundary no token straddles go
			// too, so the sequence writes no borrowed page.
			if t, _ := g.unitTokens(a); sl.lo > 0 && (a < sl.lo || g.unitsBehind(t+1-c.cfg.Window) < sl.lo) {
				// A window's match: the units [sl.lo, a) would not
				// hold the window of the token past them; none is kept.
				a = sl.lo
			}
			if err := c.decommitUnitsLocked(sl, a, k); err != nil {
				return undo(err)
			}
			backed = backed[:a-sl.lo]
			sl.shared, k = a, a
			if a == sl.lo {
				c.setLoLocked(sl, lo0)
				sl.shared, k = 0, 0
			}
		}
	}
	if m.partial == nil {
		m.tokens, _ = g.unitTokens(k)
	}
	s.matched = m.tokens
	return backed, nil
}

// copyPartialLocked backs unit k of s — the slot's own page it kept
// serves unless the unit belongs in the store — and copies p into it. It
// returns the units it backed (unit k, or none if kept), and nil with no
// error when the budget has no room (nothing changed).
func (c *Cache) copyPartialLocked(what func() string, s *Seq, p *storeUnit, k int) ([]int, error) {
	sl := s.sl
	bound := c.storeBoundLocked(s, k)
	st := sl.units[k].state
	if st == unitEmpty || (st == unitOwned && bound) {
		if err := c.makeRoomLocked(what, c.g.unitPages(), sl, k+1); err != nil {
			return nil, nil
		}
	}
	if st == unitOwned && bound {
		if err := c.decommitUnitsLocked(sl, k, k+1); err != nil {
			return nil, err
		}
		c.counts.reclaimedPages += c.g.unitPages()
	}
	backed := []int{}
	if sl.units[k].state == unitEmpty {
		b, err := c.backLocked(what, s, k, k+1)
		if err != nil {
			return nil, err
		}
		backed = b
	}
	if err := c.copyUnitLocked(what, p, sl, k); err != nil {
		return nil, errors.CombineErrors(err, c.unbackLocked(sl, backed))
	}
	return backed, nil
}

// holdLocked keeps a listed unit out of the cache (not evictable) as a
// borrow does, without mapping it; letGoLocked ends that, the unit then
// used last.
func (c *Cache) holdLocked(su *storeUnit) {
	if su.elem != nil {
		c.lruRemoveLocked(su)
	}
	c.refLocked(su, 1)
}

func (c *Cache) letGoLocked(su *storeUnit) {
	c.refLocked(su, -1)
	su.lastUse = c.tick
	if su.refs == 0 {
		c.lruPushLocked(su)
	}
}

// copyUnitLocked copies store unit from, region by region, into unit u
// of sl: the partly shared page, copied once.
func (c *Cache) copyUnitLocked(what func() string, from *storeUnit, sl *slot, u int) error {
	c.counts.copies++
	c.counts.copiedBytes += c.g.storeUnitBytes()
	return c.copyStoreUnitLocked(what, from, sl, u)
}

// copyStoreUnitLocked copies the bytes of store unit from into unit u of
// sl (nothing on a driver without bytes), counting nothing.
func (c *Cache) copyStoreUnitLocked(what func() string, from *storeUnit, sl *slot, u int) error {
	g := c.g
	if !c.bytes {
		return nil
	}
	if c.str == nil {
		return errors.Wrapf(driver.ErrUnsupported, "%s: the %s driver has no streams to copy a shared page with", what(), c.slots.Driver().Name())
	}
	for r := 0; r < g.regions; r++ {
		dst := c.slots.Base() + driver.Addr(c.slotOff(sl, r, u))
		src := c.ps.s.Base() + driver.Addr(c.storeOff(from.idx, r))
		if err := c.str.CopyDtoDSync(dst, src, g.unitBytes); err != nil {
			return errors.Wrapf(err, "%s: copy the partly shared unit %d", what(), u)
		}
	}
	return nil
}

// closeStoreLocked frees every store unit (none is mapped: the slots gave
// theirs back) and the store range.
func (c *Cache) closeStoreLocked() error {
	if !c.sharing() {
		return nil
	}
	var errs error
	for c.ps.lru.Len() > 0 {
		errs = errors.CombineErrors(errs, c.evictOneLocked())
	}
	for _, su := range c.ps.units {
		if su != nil {
			errs = errors.CombineErrors(errs, errors.AssertionFailedf("kvcache: close: prefix store unit %d is still mapped %d times", su.idx, su.refs))
		}
	}
	return errors.CombineErrors(errs, c.ps.s.Close())
}

// checkStoreRangeLocked checks the store range against its books.
func (c *Cache) checkStoreRangeLocked() error {
	if !c.sharing() {
		return nil
	}
	errs := c.ps.s.Check()
	if got := c.ps.s.Committed(); got != uint64(c.ps.pages)*c.g.page {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf("kvcache: the prefix store holds %s, its units %d pages", units.Bytes(got), c.ps.pages))
	}
	return errs
}

// checkStoreLocked checks the store's books against the slots' and
// returns the pages its units hold.
func (c *Cache) checkStoreLocked(fail func(string, ...any)) int {
	if !c.sharing() {
		if c.ps.pages != 0 || c.ps.lru.Len() != 0 {
			fail("no prefix store, but %d pages and %d cached units", c.ps.pages, c.ps.lru.Len())
		}
		return 0
	}
	refs := map[*storeUnit]int{}
	for _, sl := range c.slotList {
		for _, ui := range sl.units {
			if ui.state == unitBorrowed {
				refs[ui.su]++
			}
		}
	}
	live := 0
	for idx, su := range c.ps.units {
		if su == nil {
			continue
		}
		live++
		if su.idx != idx {
			fail("prefix store unit at %d says %d", idx, su.idx)
		}
		if su.refs != refs[su] {
			fail("prefix store unit %d counts %d borrowers, %d slots map it", idx, su.refs, refs[su])
		}
		if su.owner != nil && su.published {
			fail("prefix store unit %d is published but has an owner", idx)
		}
		if su.listed && (!su.published || c.ps.byKey[su.key] != su) {
			fail("prefix store unit %d is listed but not published or not its key's", idx)
		}
		if (su.refs == 0) != (su.elem != nil) || (su.refs == 0 && !su.listed) {
			fail("prefix store unit %d: %d borrowers, cached %t, listed %t", idx, su.refs, su.elem != nil, su.listed)
		}
		delete(refs, su)
	}
	if len(refs) > 0 {
		fail("slots map %d store units the store does not hold", len(refs))
	}
	for key, su := range c.ps.byKey {
		if su.key != key || !su.listed || c.ps.units[su.idx] != su {
			fail("the prefix index lists a unit under %#x that is not there", key)
		}
	}
	byParent := 0
	for parent, l := range c.ps.children {
		var prev *storeUnit
		for su := l.first; su != nil; prev, su = su, su.nextKid {
			byParent++
			if su.prevKid != prev || su.parent != parent || !su.listed {
				fail("prefix store unit %d is listed under parent key %#x out of its place (parent %#x, listed %t)", su.idx, parent, su.parent, su.listed)
				break
			}
			if byParent > len(c.ps.byKey) {
				break // a cycle: reported below
			}
		}
		if prev != l.last {
			fail("the units listed under parent key %#x do not end at its last", parent)
		}
	}
	if byParent != len(c.ps.byKey) {
		fail("%d units listed by key, %d by parent", len(c.ps.byKey), byParent)
	}
	if len(c.ps.spare) != 0 || c.ps.recycle != 0 {
		fail("%d spare store units and %d to recycle outside a commit", len(c.ps.spare), c.ps.recycle)
	}
	if live+len(c.ps.free)+len(c.ps.spare) != len(c.ps.units) {
		fail("%d store units live, %d free and %d spare of %d", live, len(c.ps.free), len(c.ps.spare), len(c.ps.units))
	}
	if live*c.g.unitPages() != c.ps.pages {
		fail("%d store units live, %d pages counted", live, c.ps.pages)
	}
	shared, extra, owned := 0, 0, map[*Seq]int{}
	var extraBytes uint64
	for _, su := range c.ps.units {
		if su != nil {
			shared += b2i(su.refs > 1)
			extra += max(su.refs-1, 0)
			extraBytes += uint64(max(su.refs-1, 0)) * su.usedBytes(c.g)
			if su.owner != nil {
				owned[su.owner]++
			}
		}
	}
	if shared != c.ps.sharedUnits || extra != c.ps.extraRefs || extraBytes != c.ps.extraBytes {
		fail("%d store units are shared by %d extra mappings of %d bytes, counted %d by %d of %d",
			shared, extra, extraBytes, c.ps.sharedUnits, c.ps.extraRefs, c.ps.extraBytes)
	}
	for s := range c.seqs {
		last, n := -1, 0
		for _, su := range s.unpublished {
			if su.owner != s {
				continue
			}
			if su.u <= last {
				fail("slot %d's unpublished store units are out of unit order", s.sl.idx)
			}
			last = su.u
			n++
		}
		if n != owned[s] {
			fail("slot %d's sequence lists %d unpublished store units, owns %d", s.sl.idx, n, owned[s])
		}
	}
	return c.ps.pages
}

// String describes a store unit for messages.
func (su *storeUnit) String() string {
	return fmt.Sprintf("prefix store unit %d (unit %d, %d borrowers)", su.idx, su.u, su.refs)
}
