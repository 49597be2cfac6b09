package kvcache

import "slices"

// The planner. An Admit or a Resume works out first, under the cache's
// lock and without any driver call, what its pages will be — the units
// the prefix store lends, the units to commit, the room that free pages,
// idle slots, cached store units and surplus pages give — and goes on
// only when the plan fits: a refused one maps, unmaps and commits nothing
// and leaves every book as it was. CanAdmit and Seq.CanResume answer from
// the same plans.

// plan is what an admission or a resume would take: need pages to commit
// in slot sl, room the pages the budget has or can be given back for
// them, and m the prefix the store lends.
type plan struct {
	sl         *slot
	m          match
	need, room int
}

func (p plan) fits() bool { return p.sl != nil && p.need <= p.room }

// cachedIn is the pages of m's units no sequence maps: cached now, and
// no room for anything else once borrowed.
func (c *Cache) cachedIn(m match) int {
	n := 0
	for _, su := range m.units {
		n += b2i(su != nil && su.refs == 0) // nil: behind a window (findFromLocked)
	}
	return n * c.g.unitPages()
}

// planAdmitLocked is the plan of Admit for a prompt of which the store
// holds m, followed by the Append that takes the sequence to total tokens
// (at least the prompt's), in the slot Admit would take; its slot is nil
// when every slot holds a sequence.
//
// The pages: every unit past the borrowed ones up to total's needs one
// but those the slot kept (a kept page where a whole prompt unit goes
// pays for the store unit that replaces it, and a partly shared unit is
// copied into a page counted here). The room: the free pages; the slot's
// own pages under the borrowed units (Admit gives them back); the other
// idle slots' pages; the running sequences' surplus; the slot's kept
// pages past total's units (surplus once its sequence is in); and the
// cached store units but those it borrows.
func (c *Cache) planAdmitLocked(m match, total int) plan {
	sl := c.pickSlotLocked(m.units)
	if sl == nil {
		return plan{}
	}
	up := c.g.unitPages()
	k := len(m.units)
	last := max(c.g.unitsFor(total), k)
	need := (last - k - sl.ownedIn(k, last)) * up
	if c.g.ring > 0 {
		need = c.g.ringPages() // its rings, whatever the prompt's length
	}
	idle, surplus := c.reclaimableLocked(sl, len(sl.units))
	room := c.freePagesLocked() + sl.ownedIn(0, k)*up + idle + surplus + sl.ownedIn(last, sl.hi)*up +
		c.evictablePagesLocked() - c.cachedIn(m)
	return plan{sl: sl, m: m, need: need, room: room}
}

// planAdmitChunkedLocked is planAdmitLocked for a prompt the caller
// appends in chunks of at most chunk tokens (HybridConfig.PrefillChunk;
// 0: in one Append). A sliding-window cache (not a ring) releases the
// units behind the next token's window before each Append commits, so
// its prefill holds at most, at any chunk, the units from the first its
// window reaches to the chunk's end: the plan needs the most new pages
// any chunk holds, not the whole prompt's (the slot's own pages in a
// chunk's units count against it, as planAdmitLocked counts them). The
// room is planAdmitLocked's. It costs a step for each of the prompt's
// chunks.
func (c *Cache) planAdmitChunkedLocked(m match, total, chunk int) plan {
	p := c.planAdmitLocked(m, total)
	if p.sl == nil || chunk <= 0 || c.cfg.Window == 0 || c.g.ring > 0 {
		return p
	}
	sl, up, k := p.sl, c.g.unitPages(), len(m.units)
	peak := 0
	for at := max(m.tokens, 0); at < total; at += chunk {
		lo := max(c.g.unitsBehind(at+1-c.cfg.Window), k)
		hi := c.g.unitsFor(min(at+chunk, total))
		if hi > lo {
			peak = max(peak, hi-lo-sl.ownedIn(lo, hi))
		}
	}
	p.need = min(p.need, peak*up)
	return p
}

// resumeLimitLocked is how many of s's first tokens a Resume may find in
// the store, and whether a partly shared unit is copied: all of them
// after a swap (its bytes come back from host memory: no copy), all but
// the last after a drop (the caller recomputes at least that one).
func (s *Seq) resumeLimitLocked() (limit int, copy bool) {
	if s.state == seqSwapped {
		return s.n, false
	}
	return s.n - 1, true
}

// planResumeLocked is the plan of Resume for s, preempted, followed by
// the Append that takes it to total tokens (at least its own): its slot
// holds no page, so every unit below total's that the store does not lend
// needs one (a partly shared unit's copy among them); the room is the
// free pages and all makeRoomLocked can give back, less the cached store
// units the resume borrows.
func (c *Cache) planResumeLocked(s *Seq, total int) plan {
	limit, copy := s.resumeLimitLocked()
	m := c.findSeqLocked(s, limit)
	if !copy {
		m.partial = nil
	}
	sl := s.sl
	lo := len(m.units)
	if s.state == seqSwapped && (s.swapLo > 0 || len(m.units) > 0 && m.units[0] == nil) {
		// A window's swap: its units from swapLo on come back, none
		// below; a match of a window's units alone lends none.
		m, lo = match{}, s.swapLo
	}
	need := (c.g.unitsFor(max(total, s.n)) - lo) * c.g.unitPages()
	idle, surplus := c.reclaimableLocked(sl, len(sl.units))
	room := c.freePagesLocked() + idle + surplus + c.evictablePagesLocked() - c.cachedIn(m)
	return plan{sl: sl, m: m, need: need, room: room}
}

// findSeqLocked is findFromLocked for s's prompt up to limit, walking again
// from the units its last find gave (s.found) and its prompt's chain: a
// preempted sequence asked about every step costs a look at each unit it
// matched, not its tokens' hashing or comparing.
func (c *Cache) findSeqLocked(s *Seq, limit int) match {
	if !c.sharing() || limit <= 0 {
		return match{}
	}
	if s.chain == nil {
		s.chain = chain(s.prompt, s.extra, c.g.block)
	}
	var m match
	m, s.chain = c.findFromLocked(s.prompt, s.extra, limit, s.found, s.chain)
	s.found = m.units
	return m
}

// asked is the prompt CanAdmit was last asked about, by its slice (its
// first token's address and its length) and extra key: its tokens were
// checked, and units and ch are what its last find gave and the chain
// hashed so far, for the next find to start from.
type asked struct {
	first *int
	n     int
	extra uint64
	units []*storeUnit
	ch    []uint64
}

// askLocked is what the store holds of prompt (at least one token) under
// extra, for CanAdmit and Admit: from the last find of the same slice and
// extra key if it was the one asked about last (no token looked at again
// but those past the units it found), else checked (checkTokens) and
// found afresh, and remembered.
func (c *Cache) askLocked(what func() string, prompt []int, extra uint64) (match, error) {
	a := &c.asked
	if a.first != &prompt[0] || a.n != len(prompt) || a.extra != extra {
		if err := checkTokens(what, prompt, 0); err != nil {
			return match{}, err
		}
		*a = asked{first: &prompt[0], n: len(prompt), extra: extra, ch: a.ch[:0]}
	}
	if !c.sharing() {
		return match{}, nil
	}
	var m match
	m, a.ch = c.findFromLocked(prompt, extra, len(prompt)-1, a.units, a.ch)
	a.units = m.units
	return m, nil
}

// forgetAskedLocked drops what askLocked remembers (Admit, which checks
// afresh; Close).
func (c *Cache) forgetAskedLocked() { c.asked = asked{} }

// findFromLocked finds the longest prefix of prompt[:limit] the store
// holds, unit by unit (each unit's tokens compared), then the whole
// blocks of the next unit a listed unit continuing the same prefix
// shares. It starts from prev, the units an earlier find of the same
// prompt and extra key gave (nil: none), and ch, the prompt's chain hashed
// so far (extended as far as the walk needs, and returned: a prompt the
// store does not hold costs one unit's hashing): a unit of prev still
// listed under its key at its place is taken without hashing or comparing
// its tokens again. The match's units reuse prev's memory.
func (c *Cache) findFromLocked(prompt []int, extra uint64, limit int, prev []*storeUnit, ch []uint64) (match, []uint64) {
	var m match
	if !c.sharing() || limit <= 0 {
		return m, ch
	}
	g := c.g
	m.units = prev[:0]
	window := c.cfg.Window > 0 && g.ring == 0
	// In a window cache a unit missing from the store ends a run, not
	// the walk (windowHitLocked); best is the longest match so far.
	run, best := 0, 0
	u := 0
	for ; u < g.units; u++ {
		start, end := g.keyTokens(u)
		if end > limit || end > len(prompt) {
			break
		}
		if u < len(prev) {
			// A listed unit is its key's (checkStoreLocked): no lookup.
			if su := prev[u]; su != nil && su.listed && su.u == u {
				m.units = append(m.units, su)
				if window && c.windowHit(u+1, run) {
					best = u + 1
				}
				continue
			}
			prev = prev[:u] // the rest is looked up afresh
		}
		ch = chainTo(ch, prompt, extra, g.block, end/g.block)
		su := c.ps.byKey[g.unitKey(ch, prompt, extra, end, u)]
		if su == nil || su.u != u || !slices.Equal(su.tokens, prompt[start:end]) {
			if !window {
				break
			}
			m.units = append(m.units, nil)
			run = u + 1
			continue
		}
		m.units = append(m.units, su)
		if window && c.windowHit(u+1, run) {
			best = u + 1
		}
	}
	if window {
		// The longest hit, its units behind the first token's window
		// not borrowed (nil).
		m.units, u = m.units[:best], best
		clear(m.units[:c.windowLo(best)])
	}
	clear(m.units[len(m.units):cap(m.units)]) // no stale unit kept alive
	if b, copyNext, tokens := g.cut(u); b != u || copyNext {
		// Contiguous: the first token past the match starts in unit b,
		// which is copied when the token starts inside it (cut) — unless
		// a listed unit continues the prefix at u. The token straddling
		// into unit u is the last of unit u-1's key, so the borrowed unit
		// u-1 holds its first bytes as this prompt's; the rest, and the
		// whole blocks that unit shares past it, come with its copy.
		if copyNext && !window && b+1 == u {
			var p *storeUnit
			var n int
			if p, n, ch = c.partialLocked(prompt, extra, limit, ch, u); p != nil {
				m.partial, m.tokens = p, n
				return m, ch
			}
		}
		if copyNext {
			m.partial = m.units[b] // nil when behind a window of 1
		}
		m.units, m.tokens = m.units[:b], tokens
		return m, ch
	}
	m.partial, m.tokens, ch = c.partialLocked(prompt, extra, limit, ch, u)
	return m, ch
}

// partialLocked finds, past the whole units [0, u) of prompt matched, the
// listed unit continuing the same prefix that shares the most whole blocks
// of unit u (nil if none), and the tokens matched in all; it returns ch,
// prompt's chain, extended as far as the search hashed.
func (c *Cache) partialLocked(prompt []int, extra uint64, limit int, ch []uint64, u int) (*storeUnit, int, []uint64) {
	g := c.g
	start, _ := g.keyTokens(u)
	if u == g.units || start >= len(prompt) {
		return nil, start, ch
	}
	ch = chainTo(ch, prompt, extra, g.block, start/g.block)
	// The tokens unit u holds whole (in the Contiguous layout its last
	// may straddle into the unit after).
	whole := g.roomIn(u + 1)
	best := 0
	var partial *storeUnit
	for su := c.ps.children[g.parentKey(ch, prompt, extra, start, u)].first; su != nil; su = su.nextKid {
		if su.u != u {
			continue
		}
		n := 0
		for n < len(su.tokens) && start+n < whole && start+n < limit && start+n < len(prompt) && su.tokens[n] == prompt[start+n] {
			n++
		}
		if (start+n)/g.block*g.block > start+best {
			best, partial = (start+n)/g.block*g.block-start, su
		}
	}
	return partial, start + best, ch
}
