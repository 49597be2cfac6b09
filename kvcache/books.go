package kvcache

// The cache's counters: every figure Stats reports and every total the
// budget's give-back reads is kept as things change, so that no call on
// the hot path (Append, a decode step's bookkeeping, Stats) walks the
// slots or a slot's units. Each change of a unit's state goes through
// setUnitLocked, each change of an attached sequence's length or state
// through setLenLocked and setStateLocked (a sequence's length before it
// is attached counts at attach), and a sequence enters and leaves its
// slot through attachLocked and detachLocked; Check recomputes every
// counter by walking and compares.
//
// Invariants (per slot, with f = unitsFor(seq.n) while it holds a
// sequence):
//
//	owned     the units in state owned
//	borrowed  the units in state borrowed
//	surplus   the owned units at or past f while it holds a sequence; 0 idle
//	hi        every unit at or past hi is empty (hi may be larger than the
//	          highest unit in use until the next give-back lowers it)
//
// and for the cache: ownedUnits, idleUnits and surplusUnits are the sums
// of owned (all slots), owned (slots holding no sequence) and surplus;
// running and runningTokens count the running sequences and their tokens.

// b2i is 1 for true, 0 for false.
func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// setUnitLocked moves unit u of sl to state st (su is the store unit it
// maps when borrowed), keeping the counters. It touches no memory: the
// caller has committed, borrowed or decommitted the unit's pages.
func (c *Cache) setUnitLocked(sl *slot, u int, st unitState, su *storeUnit) {
	old := sl.units[u].state
	sl.units[u] = unitInfo{state: st, su: su}
	if st != unitEmpty && u >= sl.hi {
		sl.hi = u + 1
	}
	sl.borrowed += b2i(st == unitBorrowed) - b2i(old == unitBorrowed)
	dk := b2i(st == unitKept) - b2i(old == unitKept)
	sl.kept += dk
	c.keptUnits += dk
	d := b2i(st == unitOwned) - b2i(old == unitOwned)
	if d == 0 {
		return
	}
	sl.owned += d
	c.ownedUnits += d
	switch {
	case sl.seq == nil:
		c.idleUnits += d
		c.refileIdleLocked(sl)
	case u >= c.g.unitsFor(sl.seq.n):
		sl.surplus += d
		c.surplusUnits += d
	}
}

// trimLocked lowers sl.hi past the empty units at its top, after a
// give-back. Each unit it passes was emptied since the last trim or lay
// in a gap a give-back made, so its cost is paid for by the changes.
func (sl *slot) trimLocked() {
	for sl.hi > 0 && sl.units[sl.hi-1].state == unitEmpty {
		sl.hi--
	}
}

// setLenLocked sets s's length to n: the owned units its tokens now fill
// or leave move out of or into the slot's surplus (only the units
// between the two lengths are looked at), and a running sequence's tokens
// count in runningTokens.
func (c *Cache) setLenLocked(s *Seq, n int) {
	sl := s.sl
	if sl != nil && sl.seq == s {
		f0, f1 := c.g.unitsFor(s.n), c.g.unitsFor(n)
		d := (b2i(f1 < f0) - b2i(f1 > f0)) * sl.ownedIn(min(f0, f1), max(f0, f1))
		sl.surplus += d
		c.surplusUnits += d
		if s.state == seqRunning {
			c.runningTokens += n - s.n
			if c.g.ring > 0 {
				c.ringExcess += max(n-c.cfg.Window, 0) - max(s.n-c.cfg.Window, 0)
			}
		}
	}
	s.n = n
}

// setStateLocked sets s's state, counting it among the running sequences
// or not.
func (c *Cache) setStateLocked(s *Seq, st seqState) {
	if s.sl != nil && s.sl.seq == s {
		d := b2i(st == seqRunning) - b2i(s.state == seqRunning)
		c.running += d
		c.runningTokens += d * s.n
		if c.g.ring > 0 {
			c.ringExcess += d * max(s.n-c.cfg.Window, 0)
		}
	}
	s.state = st
}

// attachLocked puts s in sl (counting it among the running sequences when
// it runs), which leaves the idle slots: its
// owned units below s's tokens are looked at (they are what a match just
// gave it), those past them are its surplus.
func (c *Cache) attachLocked(sl *slot, s *Seq) {
	sl.admitting = false
	c.idleUnits -= sl.owned
	sl.seq = s
	c.refileIdleLocked(sl)
	sl.surplus = sl.owned - sl.ownedIn(0, c.g.unitsFor(s.n))
	c.surplusUnits += sl.surplus
	if s.state == seqRunning {
		c.running++
		c.runningTokens += s.n
		if c.g.ring > 0 {
			c.ringExcess += max(s.n-c.cfg.Window, 0)
		}
	}
}

// detachLocked takes sl's sequence out: the slot is idle, its owned units
// kept for the next sequence (listed for reclaim by freedAt, which the
// caller has set).
func (c *Cache) detachLocked(sl *slot) {
	s := sl.seq
	if s.state == seqRunning {
		c.running--
		c.runningTokens -= s.n
		if c.g.ring > 0 {
			c.ringExcess -= max(s.n-c.cfg.Window, 0)
		}
	}
	c.surplusUnits -= sl.surplus
	sl.surplus = 0
	sl.seq = nil
	c.idleUnits += sl.owned
	c.refileIdleLocked(sl)
}

// The idle list: the slots that hold no sequence and own units, longest
// idle (lowest freedAt) first — what reclaimIdleLocked gives back, in
// order. A slot being admitted into is out of it (admitting) while its
// match runs.

// idleWanted says whether sl belongs in the idle list.
func (sl *slot) idleWanted() bool { return sl.seq == nil && sl.owned > 0 && !sl.admitting }

// refileIdleLocked puts sl in the idle list or takes it out, as
// idleWanted says. A slot comes in at its freedAt's place, found from
// the list's end: at once for a slot just freed (the latest), a walk only
// for a slot whose admission failed.
func (c *Cache) refileIdleLocked(sl *slot) {
	want := sl.idleWanted()
	if want == sl.idleListed {
		return
	}
	sl.idleListed = want
	if !want {
		if sl.idlePrev != nil {
			sl.idlePrev.idleNext = sl.idleNext
		} else {
			c.idleHead = sl.idleNext
		}
		if sl.idleNext != nil {
			sl.idleNext.idlePrev = sl.idlePrev
		} else {
			c.idleTail = sl.idlePrev
		}
		sl.idlePrev, sl.idleNext = nil, nil
		return
	}
	after := c.idleTail
	for after != nil && after.freedAt > sl.freedAt {
		after = after.idlePrev
	}
	sl.idlePrev = after
	if after != nil {
		sl.idleNext = after.idleNext
		after.idleNext = sl
	} else {
		sl.idleNext = c.idleHead
		c.idleHead = sl
	}
	if sl.idleNext != nil {
		sl.idleNext.idlePrev = sl
	} else {
		c.idleTail = sl
	}
}

// checkBooksLocked recomputes every counter of this file, and the idle
// list, by walking, and reports each that differs.
func (c *Cache) checkBooksLocked(fail func(string, ...any)) {
	owned, idle, surplus, running, tokens, kept := 0, 0, 0, 0, 0, 0
	for i, sl := range c.slotList {
		o, b, s, top, k := 0, 0, 0, 0, 0
		for u, ui := range sl.units {
			switch ui.state {
			case unitOwned:
				o++
				if sl.seq != nil && u >= c.g.unitsFor(sl.seq.n) {
					s++
				}
			case unitBorrowed:
				b++
			case unitKept:
				k++
			}
			if ui.state != unitEmpty {
				top = u + 1
			}
		}
		if b != sl.borrowed || s != sl.surplus {
			fail("slot %d counts %d borrowed and %d surplus units, holds %d and %d", i, sl.borrowed, sl.surplus, b, s)
		}
		if k != sl.kept {
			fail("slot %d counts %d kept units, holds %d", i, sl.kept, k)
		}
		kept += k
		if top > sl.hi {
			fail("slot %d uses units up to %d, its bound says %d", i, top, sl.hi)
		}
		owned += o
		surplus += s
		if sl.seq == nil {
			idle += o
		} else if sl.seq.state == seqRunning {
			running++
			tokens += sl.seq.n
		}
		if sl.idleListed != sl.idleWanted() {
			fail("slot %d is listed idle %t: %d owned units, a sequence %t, being admitted into %t", i, sl.idleListed, sl.owned, sl.seq != nil, sl.admitting)
		}
		if sl.admitting {
			fail("slot %d is being admitted into outside Admit", i)
		}
	}
	if owned != c.ownedUnits || idle != c.idleUnits || surplus != c.surplusUnits {
		fail("the slots own %d units (%d idle, %d surplus), counted %d (%d, %d)", owned, idle, surplus, c.ownedUnits, c.idleUnits, c.surplusUnits)
	}
	if kept != c.keptUnits {
		fail("the slots keep %d units, counted %d", kept, c.keptUnits)
	}
	if running != c.running || tokens != c.runningTokens {
		fail("%d sequences run with %d tokens, counted %d with %d", running, tokens, c.running, c.runningTokens)
	}
	listed := 0
	var prev *slot
	for sl := c.idleHead; sl != nil; sl = sl.idleNext {
		listed++
		if listed > len(c.slotList) {
			fail("the idle list loops")
			break
		}
		if !sl.idleListed || sl.idlePrev != prev || (prev != nil && prev.freedAt > sl.freedAt) {
			fail("the idle list is out of order or unlinked at slot %d", sl.idx)
		}
		prev = sl
	}
	if prev != c.idleTail {
		fail("the idle list's tail is not its last slot")
	}
	want := 0
	for _, sl := range c.slotList {
		want += b2i(sl.idleListed)
	}
	if listed != want {
		fail("%d slots say they are listed idle, the list holds %d", want, listed)
	}
}
