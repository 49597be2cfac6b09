package kvcache

import (
	"fmt"

	"github.com/vmarena/vmarena/internal/errors"
)

// Kept mappings. A sequence that ends (Free) or is preempted leaves the
// listed prefix store units it borrowed mapped where they are, in state
// kept, rather than unmapping them: the slot's address space is reserved
// anyway, and the next sequence admitted into the slot (or the preempted
// one resumed there) reuses every kept unit its match holds at the same
// unit index — prompts sharing a system prompt or a conversation's
// earlier turns — with no driver call but, for a unit it had mapped
// writable (the store unit its last sequence wrote), one read-only grant
// over the shared units. What differs is unmapped then.
//
// The books: a kept unit holds no page of the slot's (the store unit's
// pages are counted once, in the store); it is no borrower (refs), so a
// store unit only kept somewhere is cached, in the LRU list, and evicting
// it unmaps its kept mappings first (su.keptIn lists the slots keeping
// it, each at unit su.u). Memory pressure thus reclaims kept mappings
// before it preempts anyone, with the cached units they map. Only listed
// units are kept (an unpublished or unlisted unit's bytes are nobody
// else's: it goes as before); a running sequence's slot keeps nothing at
// or past its lo — an admission or a resume settles every kept unit of
// its slot first (takeKeptLocked) — so that Append, Step, Reserve and the
// mapper see only empty, owned, borrowed and committing units. Below lo a
// window cache's running slot may keep units: a release behind the
// window keeps the listed store units it borrowed mapped there, as a
// sequence that ends does (no unmap on the Append's path), and an
// eviction of one unmaps it there, outside the slot's views and its
// shared units.
//
// Picking a slot for an admission (pickSlotLocked) looks for the slot
// that keeps the deepest unit of the match it can find in a few probes:
// the slots keeping the match's last unit, then the unit halfway, and so
// on down to its first — the lowest idle one at the first probe that
// finds any. A slot's kept units are a prefix chain of its last match
// (eviction takes a chain from its end), so the deepest unit kept stands
// for all below it. The probes cost their number (log of the match's
// units) times the slots keeping each. That slot is taken where the maps
// its reuse saves outweigh the unmaps of its other kept units:
// pickSlotLocked weighs it against the free slot keeping the fewest (a
// walk of the MaxSeqs slots, fewestKeptFreeLocked), which Warm clears
// ahead where every free slot keeps units.
//
// A free slot whose last sequence matched a shared prefix (a system
// prompt, a document) and put its own question's units in the store
// keeps both, and the next admission sharing the prefix would unmap the
// question's units on its path, or take a clean slot and map the whole
// prefix again. ClearKept unmaps them ahead, in a step's spare time: in
// free slots, oldest free first, the kept units above the last one a
// match borrowed (su.hits counts the matches that borrowed a store
// unit; a slot keeping none a match borrowed keeps what it has, since no
// admission would reuse it where it is). A slot it walked is cleared
// until a sequence leaves it or a match first borrows a unit it keeps.

// keepable reports whether a borrowed su may stay mapped once its
// borrower ends: listed (published, matchable) and whole.
func keepable(su *storeUnit) bool { return su.listed && su.owner == nil && su.used == 0 }

// keepLocked turns unit u of sl, borrowed from a keepable store unit, into
// a kept one (ro: mapped read-only): no driver call. The store unit loses
// a borrower and is cached when no one else maps it, as a give-back makes
// it.
func (c *Cache) keepLocked(sl *slot, u int, ro bool) {
	su := sl.units[u].su
	c.refLocked(su, -1)
	if su.refs == 0 {
		su.lastUse = c.tick
		c.lruPushLocked(su)
	}
	c.setUnitLocked(sl, u, unitKept, su)
	sl.units[u].ro = ro
	sl.units[u].ki = int32(len(su.keptIn))
	su.keptIn = append(su.keptIn, sl)
}

// unkeepLocked takes kept unit u of sl out of its store unit's list (the
// caller unmaps it or borrows it again).
func (c *Cache) unkeepLocked(sl *slot, u int) {
	ui := sl.units[u]
	su := ui.su
	last := len(su.keptIn) - 1
	if moved := su.keptIn[last]; int(ui.ki) != last {
		su.keptIn[ui.ki] = moved
		moved.units[su.u].ki = ui.ki
	}
	su.keptIn[last] = nil
	su.keptIn = su.keptIn[:last]
}

// leaveLocked gives back what sl's sequence (ending or preempted, its
// views gone) holds in its units below to: its borrowed units of listed
// store units are kept, its other borrowed units given back, and its own
// units decommitted unless keepOwned (Free: deferred reclaim) — last to
// first, in one arena call a region for each run given back, so that
// cached units join the LRU list from a chain's end.
func (c *Cache) leaveLocked(sl *slot, to int, keepOwned bool) error {
	err := c.leaveRangeLocked(sl, 0, to, keepOwned)
	sl.shared, sl.cleared = 0, false
	return err
}

// leaveRangeLocked is leaveLocked of units [from, to) of sl (a window's
// release behind it, from the slot's lo: releaseBehindLocked), leaving
// sl.shared to the caller but as decommitUnitsLocked lowers it.
func (c *Cache) leaveRangeLocked(sl *slot, from, to int, keepOwned bool) error {
	ro := func(u int) bool { return u < sl.shared && c.protects }
	goes := func(u int) bool {
		switch ui := sl.units[u]; ui.state {
		case unitBorrowed:
			return !keepable(ui.su)
		case unitOwned:
			return !keepOwned
		}
		return false
	}
	var errs error
	for u := min(to, sl.hi) - 1; u >= from; u-- {
		if ui := sl.units[u]; ui.state == unitBorrowed && keepable(ui.su) {
			c.keepLocked(sl, u, ro(u))
			continue
		}
		if !goes(u) {
			continue
		}
		lo := u
		for lo > from && goes(lo-1) {
			lo--
		}
		// decommitUnitsLocked lowers shared to lo, which leaves ro of
		// the units below as it was.
		errs = errors.CombineErrors(errs, c.decommitUnitsLocked(sl, lo, u+1))
		u = lo
	}
	return errs
}

// takeKeptLocked settles sl's kept units for a sequence about to borrow
// sus at units 0, 1, ...: each kept unit that holds sus's unit at its
// place is borrowed again (no driver call), every other is unmapped, in
// one arena call a region for each run. It reports whether a unit
// borrowed again is mapped writable (the caller grants the shared units
// read-only). On failure those not yet settled stay kept.
func (c *Cache) takeKeptLocked(sl *slot, sus []*storeUnit) (writable bool, err error) {
	if sl.kept == 0 {
		return false, nil
	}
	reuse := func(u int) bool { return u < len(sus) && sl.units[u].su == sus[u] }
	for u := sl.hi - 1; u >= 0 && sl.kept > 0; u-- {
		if sl.units[u].state != unitKept {
			continue
		}
		if reuse(u) {
			writable = writable || !sl.units[u].ro
			c.unkeepLocked(sl, u)
			c.setUnitLocked(sl, u, unitEmpty, nil)
			c.borrowedLocked(sl, u, sus[u])
			c.counts.keptReused++
			continue
		}
		lo := u
		for lo > 0 && sl.units[lo-1].state == unitKept && !reuse(lo-1) {
			lo--
		}
		if err := c.decommitUnitsLocked(sl, lo, u+1); err != nil {
			return writable, err
		}
		u = lo
	}
	return writable, nil
}

// ClearKept unmaps, ahead, what free slots keep mapped that the next
// admission into them would unmap on its path: the units a slot's last
// sequence put in the prefix store itself and no match has borrowed since
// (its question, its part of a conversation), kept above the last unit
// any match borrowed (a system prompt, a shared document). The admission
// that shares the slot's prefix then reuses the kept units below them
// with no unmap (pickSlotLocked weighs every other kept unit of a slot as
// unmapMaps maps). The units stay in the store, cached and matchable: a
// later match maps them again (a map each, against an unmap each now).
// Free slots go oldest free first, each from its last kept unit down to
// the first a match borrowed; at most pages pages are unmapped, whole
// units (what a unit's pages would pass the bound is left, with the
// rest, for the next call). An engine calls it while a step computes,
// with the unmaps the time left pays for, as vmarena kv simulate does
// after Warm. It returns the pages it unmapped. It refuses a negative
// count (ErrInvalid) and a closed cache (ErrClosed); a driver failure
// ends it, the units unmapped before it gone.
func (c *Cache) ClearKept(pages int) (int, error) {
	what := func() string { return fmt.Sprintf("kvcache: clear free slots' kept units, at most %d pages", pages) }
	if err := c.lockCount(what, pages); err != nil {
		return 0, err
	}
	defer c.unlock()
	up := c.g.unitPages()
	n := 0
	for {
		sl := c.oldestUnclearedLocked()
		if sl == nil {
			break
		}
		k, whole, err := c.clearKeptOfLocked(sl, pages/up-n)
		n += k
		if err != nil {
			c.checkAfter("clear kept")
			return n * up, errors.Wrapf(err, "%s", what())
		}
		if !whole {
			break
		}
	}
	c.checkAfter("clear kept")
	return n * up, nil
}

// oldestUnclearedLocked is the free slot freed longest ago (the lowest
// of those) that keeps units ClearKept has not walked, or nil.
func (c *Cache) oldestUnclearedLocked() *slot {
	var sl *slot
	for _, x := range c.slotList {
		if x.seq == nil && x.kept > 0 && !x.cleared && (sl == nil || x.freedAt < sl.freedAt) {
			sl = x
		}
	}
	return sl
}

// clearKeptOfLocked unmaps, from sl's last kept unit down to the last
// one a match borrowed, the kept units no match has borrowed, at most
// most of them, in one arena call a run. A slot that keeps no unit a
// match borrowed keeps what it has: no admission would reuse its prefix,
// and the one that takes it unmaps them (clearSpareSlotLocked, ahead, for
// the spare). It returns how many it unmapped and whether it got there
// (sl is cleared then), not stopped by most.
func (c *Cache) clearKeptOfLocked(sl *slot, most int) (n int, whole bool, err error) {
	shared := sl.hi - 1 // the last kept unit a match borrowed
	for shared >= 0 && (sl.units[shared].state != unitKept || sl.units[shared].su.hits == 0) {
		shared--
	}
	kept := func(u int) bool { return sl.units[u].state == unitKept }
	for u := sl.hi - 1; u > shared && shared >= 0; u-- {
		if !kept(u) {
			continue
		}
		if n == most {
			return n, false, nil
		}
		lo := u
		for lo-1 > shared && n+u+1-lo < most && kept(lo-1) {
			lo--
		}
		if err := c.decommitUnitsLocked(sl, lo, u+1); err != nil {
			return n, false, err
		}
		n += u + 1 - lo
		u = lo
	}
	sl.cleared = true
	return n, true, nil
}

// dropKeptLocked unmaps every unit sl keeps (a fork's child slot).
func (c *Cache) dropKeptLocked(sl *slot) error {
	_, err := c.takeKeptLocked(sl, nil)
	return err
}

// unmapKeptOfLocked unmaps every kept mapping of su, which is being
// evicted.
func (c *Cache) unmapKeptOfLocked(su *storeUnit) error {
	for len(su.keptIn) > 0 {
		sl := su.keptIn[len(su.keptIn)-1]
		if err := c.decommitUnitsLocked(sl, su.u, su.u+1); err != nil {
			return err
		}
	}
	return nil
}

// keptSlotLocked is the idle slot that keeps the deepest unit of sus a
// few probes find (see the top of this file), or nil.
func (c *Cache) keptSlotLocked(sus []*storeUnit) *slot {
	for i := len(sus) - 1; i >= 0; i /= 2 {
		var best *slot
		if sus[i] == nil {
			return nil // behind a window (findFromLocked), and all below it
		}
		for _, sl := range sus[i].keptIn {
			if sl.seq == nil && (best == nil || sl.idx < best.idx) {
				best = sl
			}
		}
		if best != nil || i == 0 {
			return best
		}
	}
	return nil
}

// checkKeptLocked checks every kept unit of the slots against its store
// unit's list, and each list against the slots.
func (c *Cache) checkKeptLocked(fail func(string, ...any)) {
	for _, sl := range c.slotList {
		for u, ui := range sl.units {
			if ui.state != unitKept {
				continue
			}
			su := ui.su
			switch {
			case su == nil:
				fail("slot %d keeps unit %d of no store unit", sl.idx, u)
				continue
			case su.u != u:
				fail("slot %d keeps store unit %d at unit %d, which belongs at unit %d", sl.idx, su.idx, u, su.u)
			case !c.sharing() || c.ps.units[su.idx] != su || !su.listed:
				fail("slot %d keeps store unit %d, which is not a listed unit of the store", sl.idx, su.idx)
			case sl.seq != nil && sl.seq.state == seqRunning && u >= sl.lo:
				fail("slot %d keeps unit %d under a running sequence, at or past its window's first unit %d", sl.idx, u, sl.lo)
			}
			if int(ui.ki) >= len(su.keptIn) || su.keptIn[ui.ki] != sl {
				fail("slot %d's kept unit %d is not in its store unit's list at %d", sl.idx, u, ui.ki)
			}
		}
	}
	for _, su := range c.ps.units {
		if su == nil {
			continue
		}
		for i, sl := range su.keptIn {
			if ui := sl.units[su.u]; ui.state != unitKept || ui.su != su || int(ui.ki) != i {
				fail("store unit %d lists slot %d as keeping it at unit %d, which is not", su.idx, sl.idx, su.u)
			}
		}
	}
}

// unmapKeptAheadLocked unmaps the kept mappings of the cached store units
// that committing pages more pages would evict: past the free budget and
// the idle slots' pages, as many units from the LRU list's front. The
// units at the front known to keep nothing (clearN) are skipped, not
// walked: its cost is the units it clears and their mappings.
func (c *Cache) unmapKeptAheadLocked(pages int) error {
	if c.keptUnits == 0 {
		return nil
	}
	up := c.g.unitPages()
	short := pages - max(c.freePagesLocked(), 0) - c.idleUnits*up - c.ps.clearN*up
	for el := c.ps.clearEnd; el != nil && short > 0; el = c.ps.clearEnd {
		su := el.Value.(*storeUnit)
		if err := c.unmapKeptOfLocked(su); err != nil {
			return err
		}
		// It keeps nothing now, and is the front's next: the clear
		// prefix grows by one.
		su.clear = true
		c.ps.clearN++
		c.ps.clearEnd = el.Next()
		short -= up
	}
	return nil
}

// checkClearLocked checks the LRU list's clear prefix (clearN, clearEnd).
func (c *Cache) checkClearLocked(fail func(string, ...any)) {
	i := 0
	for el := c.ps.lru.Front(); el != nil; el = el.Next() {
		su := el.Value.(*storeUnit)
		switch {
		case i == c.ps.clearN && el != c.ps.clearEnd:
			fail("the LRU list's clear prefix of %d units does not end at store unit %d, its next", c.ps.clearN, su.idx)
		case i < c.ps.clearN && (!su.clear || len(su.keptIn) > 0):
			fail("store unit %d, at %d in the LRU list's clear prefix of %d, is flagged %t and kept in %d slots", su.idx, i, c.ps.clearN, su.clear, len(su.keptIn))
		case i >= c.ps.clearN && su.clear:
			fail("store unit %d, at %d in the LRU list past its clear prefix of %d, is flagged clear", su.idx, i, c.ps.clearN)
		}
		i++
	}
	if c.ps.clearN > i || (c.ps.clearN == i && c.ps.clearEnd != nil) {
		fail("the LRU list's clear prefix is %d units of %d, ending at %v", c.ps.clearN, i, c.ps.clearEnd != nil)
	}
}
