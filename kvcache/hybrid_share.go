package kvcache

import (
	"fmt"
	"slices"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// The hook that lets several caches draw on one budget (a Hybrid's
// groups). Each group's Cache keeps its own budget, which the Hybrid sets,
// under its lock (lockrank KVHybrid, taken before any group's KVCache):
// between calls a group's budget is what it holds (tight: its pages in
// use and in flight, and its pooled pages), and the rest of the one
// budget is the Hybrid's free memory. A call into a group is granted all
// of it (its budget raised by the free memory), and tightened once the
// call returns, so the groups together never hold more than the one
// budget however the memory moved. One group's growth takes what another
// holds idle through yield: the other group's budget is lowered below
// what it holds and it gives back, in stages, pooled pages, cached prefix
// units (least recently used first), idle slots' pages and the surplus of
// running sequences, never a running sequence's tokens.

// Yield stages, in the order they are tried across every group.
const (
	yieldPool    = iota // pooled pages: no loss
	yieldCached         // cached prefix store units, least recently used first
	yieldIdle           // idle slots' kept pages
	yieldSurplus        // running sequences' pages past their tokens
	numYieldStages
)

// heldLocked is the memory c keeps committed: pages in use and in flight,
// and pooled pages.
func (c *Cache) heldLocked() uint64 {
	return uint64(c.pages+c.inflight)*c.g.page + c.pool.Bytes()
}

// shareHeld is heldLocked under the lock.
func (c *Cache) shareHeld() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.heldLocked()
}

// sharePooled is the bytes c's page pool keeps.
func (c *Cache) sharePooled() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pool.Bytes()
}

// shareGrant sets c's budget to what it holds and extra more (0: tight).
func (c *Cache) shareGrant(extra uint64) {
	c.mu.Lock()
	defer c.unlock()
	c.budget = c.heldLocked() + extra
	c.trimPoolLocked()
}

// shareYieldable is the memory stage would give back, c's sequence
// keep's slot below keepUnits aside (keep nil: none) and the cached units
// of m (that an admission will borrow) aside, in bytes.
func (c *Cache) shareYieldableLocked(stage int, keep *slot, keepUnits int, m match) uint64 {
	idle, surplus := c.reclaimableLocked(keep, keepUnits)
	var pages int
	switch stage {
	case yieldPool:
		return c.pool.Bytes()
	case yieldCached:
		pages = c.evictablePagesLocked() - c.cachedIn(m)
	case yieldIdle:
		pages = idle
	case yieldSurplus:
		pages = surplus
	}
	return uint64(max(pages, 0)) * c.g.page
}

// shareYield gives back up to want bytes in stage (keep's slot below
// keepUnits aside; keepUnits counted in units of c) and sets c's budget
// to what it holds after; it returns the bytes it gave back.
func (c *Cache) shareYield(want uint64, stage int, keep *Seq, keepUnits int) (uint64, error) {
	c.mu.Lock()
	defer c.unlock()
	var ks *slot
	if keep != nil && keep.state != seqFreed {
		ks = keep.sl
	}
	before := c.heldLocked()
	c.budget = before - min(want, before)
	var err error
	switch stage {
	case yieldCached:
		err = c.evictLocked(0)
	case yieldIdle:
		err = c.reclaimIdleLocked(0, ks)
	case yieldSurplus:
		err = c.reclaimSurplusLocked(0, ks, keepUnits)
	}
	c.trimPoolLocked()
	held := c.heldLocked()
	c.budget = held
	c.trimPoolLocked()
	if err != nil {
		err = errors.Wrapf(err, "kvcache: hybrid: a group gives back %s", units.Bytes(want))
	}
	return before - min(held, before), err
}

// appendPlanLocked is the pages an Append of k tokens to s needs (its
// empty units and a copy on write) and the room c has for them without
// another group: what makeRoomLocked would count.
func (c *Cache) appendPlanLocked(s *Seq, k int) (need, room int) {
	if s.state != seqRunning {
		return 0, 0
	}
	to := c.g.unitsFor(min(s.n+k, c.cfg.MaxContext))
	if c.g.ring > 0 {
		// A ring is committed whole at the first Append, in a range of
		// its own.
		need = b2i(!s.sl.ring) * c.g.ringPages()
		to = 0
	} else {
		need = c.emptyPagesLocked(s.sl, c.g.unitsFor(s.n), to) + c.cowPagesLocked(s)
	}
	idle, surplus := c.reclaimableLocked(s.sl, to)
	return need, c.freePagesLocked() + idle + surplus + c.evictablePagesLocked() + c.releasablePagesLocked(s)
}

// releasablePagesLocked is the pages the release behind s's window that
// its next Append makes first (releaseBehindLocked) gives back or leaves
// cached, evictable: its own units there, and the store units no other
// sequence maps. 0 outside a window cache (and in a ring).
func (c *Cache) releasablePagesLocked(s *Seq) int {
	if c.cfg.Window == 0 || c.g.ring > 0 || s.state != seqRunning {
		return 0
	}
	sl, n := s.sl, 0
	for u := sl.lo; u < min(c.windowFirstLocked(s), sl.hi); u++ {
		switch ui := sl.units[u]; ui.state {
		case unitOwned:
			n++
		case unitBorrowed:
			n += b2i(ui.su.refs == 1)
		}
	}
	return n * c.g.unitPages()
}

// admitUpTo is Admit with the prefix the store lends limited to the first
// limit tokens and the plan counting pages up to total tokens (the
// Hybrid plans the prompt's pages across groups itself): the prefix every
// group of a Hybrid can serve.
func (c *Cache) admitUpTo(prompt []int, limit, total int) (*Seq, error) {
	what := func() string { return fmt.Sprintf("kvcache: admit a prompt of %d tokens", len(prompt)) }
	c.mu.Lock()
	defer c.unlock()
	if err := c.usableLocked(what); err != nil {
		return nil, err
	}
	c.forgetAskedLocked()
	m := c.findAtMostLocked(prompt, limit)
	p := c.planAdmitLocked(m, max(total, m.tokens))
	sl := p.sl
	if sl == nil {
		return nil, errors.Wrapf(driver.ErrBusy, "%s: all %d slots hold sequences", what(), c.cfg.MaxSeqs)
	}
	if !p.fits() {
		c.counts.failedAdmits++
		return nil, errors.Wrapf(driver.ErrOutOfMemory, "%s: its pages need %d of %s; the budget of %s has %d free or to give back",
			what(), p.need, units.Bytes(c.g.page), units.Bytes(c.budget), p.room)
	}
	return c.admitIntoLocked(what, sl, prompt, 0, m)
}

// matchTokensLocked is how many of prompt's first tokens (at most limit)
// c's store would lend an admission.
func (c *Cache) matchTokens(prompt []int, limit int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.findAtMostLocked(prompt, limit).tokens
}

// findAtMostLocked is the longest match of prompt (never its last token)
// of at most atMost tokens: what a hybrid cache's groups, which must
// agree on one count, can each lend. It is idempotent —
// findAtMostLocked(p, findAtMostLocked(p, n).tokens) is the same match —
// so the groups' agreement (Hybrid.matchLocked) settles at the longest
// count every group can lend. In the Contiguous layout a unit's key
// reaches past the tokens it holds whole, so a match found with a lower
// limit (findFromLocked) would stop a unit short of it, and every round
// of that agreement would lose a unit more; the match is cut from the
// longest one instead: the units whole below the cut borrowed, the one
// the next token starts in copied.
func (c *Cache) findAtMostLocked(prompt []int, atMost int) match {
	g := c.g
	limit := min(atMost, len(prompt)-1)
	if g.layout != Contiguous || c.cfg.Window > 0 {
		m, _ := c.findFromLocked(prompt, 0, limit, nil, nil)
		return m
	}
	m, _ := c.findFromLocked(prompt, 0, len(prompt)-1, nil, nil)
	if m.tokens <= limit {
		return m
	}
	all := slices.Clip(m.units)
	if m.partial != nil {
		all = append(all, m.partial)
	}
	// k is the most units whose whole tokens are at most limit: the
	// largest k with floor(k*page/stride) <= limit (cut's tokens).
	k := int((uint64(limit+1)*g.stride - 1) / g.page)
	b, copyNext, tokens := g.cut(k)
	if b > len(all) || copyNext && b >= len(all) {
		m, _ := c.findFromLocked(prompt, 0, limit, nil, nil) // cannot be: the units are the longest match's
		return m
	}
	out := match{units: all[:b], tokens: tokens}
	if copyNext {
		out.partial = all[b]
	}
	return out
}

// forkNeedLocked is the pages a Fork of s may need (its partly written
// last unit's copy) and the room c has for them, or why c would refuse
// the fork, counting nothing (planForkLocked's checks).
func (c *Cache) forkNeedLocked(what func() string, s *Seq) (need, room int, err error) {
	if err := c.forkableLocked(what, s); err != nil {
		return 0, 0, err
	}
	g := c.g
	if c.pickSlotLocked(nil) == nil {
		return 0, 0, errors.Wrapf(driver.ErrBusy, "%s: all %d slots hold sequences", what(), c.cfg.MaxSeqs)
	}
	shared := g.unitsFor(s.n)
	if own := s.sl.ownedIn(0, shared); own > len(c.ps.free) {
		return 0, 0, errors.Wrapf(driver.ErrOutOfMemory, "%s: %d of its units are its slot's own, and the prefix store has room for %d",
			what(), own, len(c.ps.free))
	}
	idle, surplus := c.reclaimableLocked(nil, 0)
	room = c.freePagesLocked() + idle + surplus + c.evictablePagesLocked()
	if g.wholeUnits(s.n) < shared {
		need = g.unitPages()
	}
	return need, room, nil
}

// preemptableLocked refuses, as Preempt would, to preempt s in mode: a
// ring cache keeps no preempted sequence, and a swap keeps whole
// sequences only (none with units released behind its window).
func (c *Cache) preemptableLocked(what func() string, s *Seq, mode PreemptMode) error {
	if err := c.ringUnsupported(what); err != nil {
		return err
	}
	if mode == Swap && s.sl.lo > 0 {
		return errors.WithHint(errors.Wrapf(driver.ErrUnsupported, "%s: its first %d units are released behind its window; a swap keeps whole sequences only", what(), s.sl.lo),
			"preempt it with Drop: Resume then asks for its recomputation")
	}
	return nil
}

// shareSpare is what c could give back without preempting: every
// stage's yieldable memory, in bytes.
func (c *Cache) shareSpare() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n uint64
	for stage := range numYieldStages {
		n += c.shareYieldableLocked(stage, nil, 0, match{})
	}
	return n
}
