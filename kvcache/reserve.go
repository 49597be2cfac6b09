package kvcache

import (
	"fmt"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// Reserve commits, ahead of the Append that will hold them, the pages of
// the sequence's next n tokens past Len — as many of them as fit in the
// budget's free pages (the page pool's first), the pages of idle slots
// and of cached prefix units, which it evicts least recently used first
// as the Append would, and the prefix store's free units. It never
// preempts, takes another running sequence's pages (its surplus) or
// gives back a page the cache needs, and it appends no token: Len is
// unchanged, and the Append of those tokens finds their pages mapped and
// makes no driver call for them. Whole units of the prompt are committed
// in the prefix store, as Append commits them (published only once
// MarkWritten covers them).
//
// It is what an engine that schedules a step ahead calls for a prompt
// chunk of the next step — an admitted or resumed sequence's first chunk,
// or the next chunk of a prefill — while the GPU computes the step before,
// so that the driver's latency hides behind it, as mapping ahead does for
// decodes; its evictions are the ones that Append would make a step
// later, made where they hide (vLLM's scheduler, which allocates a
// step's blocks when it schedules the step, evicts cached blocks then
// too). It returns how many of the n tokens have their pages now (those
// committed before it included), from the first: fewer when the rest
// would need another sequence's pages, which the Append then takes
// itself, or a preemption.
//
// Pages reserved past Len are the sequence's surplus (Stats.SurplusPages)
// until its tokens reach them: a budget squeeze may take them back, and a
// Preempt or Free gives them back with the rest.
//
// It refuses a preempted sequence, a negative n or one past MaxContext
// (ErrInvalid), a freed sequence or a closed cache (ErrClosed); a refusal
// changes nothing. A unit the mapping-ahead goroutine is committing ends
// the reservation there.
//
// A fork's partly written last unit, still shared read-only, is not
// reserved: the Append that writes there copies it on write, or grants
// its slot write access in place when no other maps it (fork.go);
// Reserve commits the units past it.
func (s *Seq) Reserve(n int) (int, error) {
	what := func() string { return fmt.Sprintf("kvcache: reserve %d tokens ahead", n) }
	c, err := s.lock(what)
	if err != nil {
		return 0, err
	}
	defer c.unlock()
	if err := s.runningLocked(what); err != nil {
		return 0, err
	}
	if n < 0 || n > c.cfg.MaxContext-s.n {
		return 0, errors.Wrapf(driver.ErrInvalid, "%s: a sequence of %d tokens takes 0 to %d more (MaxContext %d)",
			what(), s.n, c.cfg.MaxContext-s.n, c.cfg.MaxContext)
	}
	if c.g.ring > 0 {
		return c.ringReserveLocked(what, s, n)
	}
	from, need := c.g.unitsFor(s.n), c.g.unitsFor(s.n+n)
	k := c.reserveUnitsLocked(s, from, need)
	if k > from {
		if _, err := c.backLocked(what, s, from, k); err != nil {
			return 0, err
		}
	}
	if c.cfg.MapAhead > 0 {
		c.wantAheadLocked(s.sl)
	}
	c.checkAfter("reserve")
	return c.roomLocked(s, n), nil
}

// reserveUnitsLocked is the end of the units from from on, up to need,
// that Reserve can back without taking a sequence's pages: each empty
// unit takes a page of every region from the free budget, an idle slot
// or a cached unit, each whole prompt unit (empty, or a kept page the
// store unit replaces) a free unit of the store or a cached one's. It
// stops at the first that does not fit, and at a unit in flight.
func (c *Cache) reserveUnitsLocked(s *Seq, from, need int) int {
	sl := s.sl
	free := c.freePagesLocked()
	store := 0
	if c.sharing() {
		store = len(c.ps.spare) + len(c.ps.free)
	}
	// Idle slots' pages are taken and cached units evicted for the rest,
	// as Append would (makeRoomLocked, which takes idle pages first): a
	// cached unit gives its pages and its place in the store.
	idle, _ := c.reclaimableLocked(sl, need)
	free += idle + c.evictablePagesLocked()
	store += c.ps.lru.Len()
	up := c.g.unitPages()
	past := c.g.unitsFor(s.n)
	u := from
	for ; u < need; u++ {
		bound := c.storeBoundLocked(s, u)
		switch st := sl.units[u].state; {
		case st == unitCommitting:
			return u
		case st == unitEmpty:
			if free < up || (bound && store < 1) {
				return u
			}
			free -= up
			if bound {
				store--
			}
		case st == unitOwned && u >= past && bound:
			if store < 1 {
				return u
			}
			store--
		}
	}
	return u
}

// roomLocked is how many of s's next n tokens have their pages: those
// the committed units from unitsFor(Len) on hold whole, up to a kept page
// under a whole prompt unit (Append gives it back for a store unit).
func (c *Cache) roomLocked(s *Seq, n int) int {
	sl := s.sl
	k := c.g.unitsFor(s.n)
	for k < len(sl.units) {
		st := sl.units[k].state
		if st != unitBorrowed && (st != unitOwned || c.storeBoundLocked(s, k)) {
			break
		}
		k++
	}
	if k == len(sl.units) {
		return n
	}
	return min(max(c.g.roomIn(k)-s.n, 0), n)
}
