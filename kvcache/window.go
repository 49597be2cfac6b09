package kvcache

import (
	"github.com/vmarena/vmarena/internal/errors"
)

// Sliding windows (Config.Window = W): every layer of the cache attends
// to the last W tokens, so a sequence keeps only the units those reach.
// When an Append (or a Step) of tokens from position pos comes, the units
// wholly behind pos+1-W — tokens no token from pos on attends to — are
// given back at the same addresses: the slot's own decommitted (their
// pages back to the budget), the prefix store's unborrowed (cached there,
// evicted least recently used first as any other). The slot's lo is the
// first unit it still holds; units below lo are empty or kept (the listed
// store units a release left mapped: kept.go), and its running
// sequence's units [lo, unitsFor(Len)) are committed. A sequence thus
// holds at most the units of W-1 tokens, the tokens appended by the last
// call, and a unit at either end — O(W), whatever its length. Addresses
// never move: token p stays at the offset it would have in a full cache.
//
// The release is done before the Append commits anything, and stays done
// when the Append is then refused (ErrOutOfMemory): the units behind the
// next token's window are never read again, and their pages are what the
// budget needs for the next ones.

// unitsBehind is how many units, from unit 0, hold only tokens below t:
// the units a window whose first token is t no longer needs.
func (g *geometry) unitsBehind(t int) int {
	if t <= 0 {
		return 0
	}
	if g.layout == TokenMajor {
		return t / g.tpg
	}
	return int(uint64(t) * g.stride / g.page)
}

// firstWhole is the first token whose bytes lie wholly at or past unit
// lo: the first a slot that holds units from lo on holds whole.
func (g *geometry) firstWhole(lo int) int {
	if lo == 0 {
		return 0
	}
	if g.layout == TokenMajor {
		return lo * g.tpg
	}
	b := uint64(lo) * g.page
	return int((b + g.stride - 1) / g.stride)
}

// windowFirstLocked is the first unit s's next Append keeps: the unit of
// the first token the next token's window reaches.
func (c *Cache) windowFirstLocked(s *Seq) int {
	if c.cfg.Window == 0 {
		return 0
	}
	return c.g.unitsBehind(s.n + 1 - c.cfg.Window)
}

// releasePendingLocked says whether s's next Append releases units
// behind its window: that revokes its tensors, so no access through them
// may be in flight (the caller quiesces s first).
func (c *Cache) releasePendingLocked(s *Seq) bool {
	return c.cfg.Window > 0 && s.state == seqRunning && c.windowFirstLocked(s) > s.sl.lo
}

// revokePendingLocked says whether s's next Append revokes its tensors:
// a copy on write of a fork's last unit, or a release behind its window.
func (c *Cache) revokePendingLocked(s *Seq) bool {
	return c.cowCopyPendingLocked(s) || c.releasePendingLocked(s)
}

// releaseBehindLocked gives back the units of s (running, quiesced) wholly
// behind the window of its next token: one decommit per region.
func (c *Cache) releaseBehindLocked(what func() string, s *Seq) error {
	sl := s.sl
	lo := c.windowFirstLocked(s)
	if c.cfg.Window == 0 || lo <= sl.lo {
		return nil
	}
	if c.mapping.sl == sl && c.mapping.u < lo {
		return errors.AssertionFailedf("%s: unit %d behind the window is being committed", what(), c.mapping.u)
	}
	shared := sl.shared
	// The views start at WindowStart, which moves: they go first, as any
	// decommit under them would take them. The listed store units given
	// back stay cached (see What a window cache's store keeps, below) and
	// stay mapped here, kept (kept.go): no unmap on the Append's path; an
	// eviction unmaps them. The rest is decommitted.
	if sl.coverUnits > 0 {
		sl.revokeLocked()
		if err := c.releaseCoversLocked(sl); err != nil {
			return err
		}
	}
	if err := c.leaveRangeLocked(sl, sl.lo, lo, false); err != nil {
		return err
	}
	// decommitUnitsLocked keeps the shared units below the ones it gives
	// back; those past them are shared still.
	if shared > lo {
		sl.shared = shared
	} else {
		sl.shared = 0
	}
	c.counts.windowReleases++
	c.counts.windowUnits += lo - sl.lo
	c.setLoLocked(sl, lo)
	return nil
}

// Prefix hits in a window cache follow vLLM's sliding-window rule
// (SlidingWindowManager.find_longest_cache_hit): a match of a prompt's
// first units [0, k) needs in the store only the units the window of the
// first token past the match reaches — those from unitsBehind(M+1-W)
// on, M the tokens matched — not the units wholly behind it, which may
// have been evicted or never kept. The longest such k wins; the match's
// units behind the window are not borrowed (nil in match.units), the
// slot's lo starts past them (applyMatchLocked), and the next Append
// finds nothing to release there.

// windowLo is the first unit a match of units [0, k) (k > 0) of a
// window cache borrows: the first the window of the first token past it
// reaches, and at most k-1 — a match borrows a unit at least, so that a
// window of one token, whose match reaches no unit, still holds what it
// matched (the next Append releases it).
func (c *Cache) windowLo(k int) int {
	if k == 0 {
		return 0
	}
	_, _, t := c.g.cut(k)
	return min(c.g.unitsBehind(t+1-c.cfg.Window), k-1)
}

// windowHit says whether a match of units [0, k), all units of [from, k)
// in the store, serves the window of the first token past it.
func (c *Cache) windowHit(k, from int) bool { return from <= c.windowLo(k) }

// What a window cache's store keeps: a store unit that a release behind
// a window gives back stays cached (no slot maps it; it is evicted,
// least recently used first, when memory is wanted), as vLLM's
// SlidingWindowManager leaves the blocks it frees behind a window in its
// free queue with their hashes. Any unit can serve a hit: a prompt that
// shares a shorter prefix of the chain — a shared document under
// questions of their own — hits at its end through the units of that
// prefix's last window, which lie behind the longer prompt's.

// windowPoolPages is the most pages a window cache's page pool keeps
// across calls: the pages of the units the next BlockTokens tokens of a
// decode reach (one unit more for the one they start in), or what the
// last Warm filled it to (warmPages: a Hybrid's Warm of its groups) or
// a Hybrid's WarmBudget (budgetWarmPages), if more. What a release
// behind a window gives back past that — a prefill chunk's worth, left when the next call only decodes — is committed
// memory no sequence holds, so it goes back to the driver at the next
// Append or Step (boundWindowPoolLocked); within one call, a release's
// pages still serve the same call's commits.
func (c *Cache) windowPoolPages() int {
	return max((c.g.unitsFor(c.g.block)+1)*c.g.unitPages(), c.warmPages, c.budgetWarmPages)
}

// boundWindowPoolLocked releases pooled pages of a window cache down to
// windowPoolPages, before an Append or a Step releases behind its
// windows. A release the driver refuses is recorded for Check, as
// trimPoolLocked does.
func (c *Cache) boundWindowPoolLocked() {
	if c.cfg.Window == 0 || c.g.ring > 0 {
		return
	}
	if err := c.pool.Trim(uint64(c.windowPoolPages()) * c.g.page); err != nil {
		c.lostErr = errors.CombineErrors(c.lostErr, errors.WithAssertionFailure(errors.Wrap(err, "kvcache: bound a window cache's page pool")))
	}
}

// setLoLocked sets sl's first held unit, keeping behindUnits.
func (c *Cache) setLoLocked(sl *slot, lo int) {
	c.behindUnits += lo - sl.lo
	sl.lo = lo
}

// windowStartLocked is the first position of s whose keys and values the
// cache still holds whole: 0 but in a window cache.
func (c *Cache) windowStartLocked(s *Seq) int {
	return min(c.g.firstWhole(s.sl.lo), s.n)
}

// WindowStart is the first position whose keys and values the sequence
// still holds: 0 without a Window; with one, at most Len()+1-Window once
// the sequence has grown past it (the tokens the last Append's first
// token attends to, and those it appended). K and V start there. 0 for
// a nil, zero or preempted sequence.
func (s *Seq) WindowStart() int {
	if s == nil || s.c == nil {
		return 0
	}
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	if s.state != seqRunning || s.sl == nil || s.sl.seq != s {
		return 0
	}
	if s.c.g.ring > 0 {
		return s.c.ringStartLocked(s)
	}
	return s.c.windowStartLocked(s)
}

// checkWindowLocked checks sl's window: lo is 0 without one, and never
// past the units its sequence's next token needs.
func (c *Cache) checkWindowLocked(fail func(string, ...any), sl *slot) {
	s := sl.seq
	switch {
	case c.g.ring > 0 && sl.lo != 0:
		fail("slot %d of a ring cache starts at unit %d", sl.idx, sl.lo)
	case c.cfg.Window == 0 && sl.lo != 0:
		fail("slot %d starts at unit %d in a cache without a window", sl.idx, sl.lo)
	case sl.lo > c.g.unitsBehind(s.n+1-c.cfg.Window):
		fail("slot %d starts at unit %d, past the window of its sequence of %d tokens", sl.idx, sl.lo, s.n)
	}
}
