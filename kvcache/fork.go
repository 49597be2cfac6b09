package kvcache

import (
	"fmt"
	"slices"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// Forks. A fork is a second sequence that starts as a copy of a running
// one (parallel sampling, beam search, speculative branches) and shares
// its pages rather than copying them: the child maps, at its own slot's
// addresses, the same physical pages as the parent for every unit the
// parent's tokens reach, all through the prefix store. A unit the parent
// borrows from the store already (a prompt's whole unit) is borrowed once
// more; a unit it owns in its slot is handed over to the store first
// (arena.Sparse.HandOver: the store owns the pages from then on, the
// parent keeps them mapped, nothing is copied) as a private store unit —
// in no index, told by no event, freed when its last mapper gives it
// back. While shared, the units are read-only in both: mapped read-only
// where the driver grants it, refused to the tensors' writes everywhere
// (the slot's shared units, [0, sl.shared)).
//
// Every unit but the last holds whole written tokens, final. The last,
// when partly written (the next token's bytes go there), is copied on
// write: the first sharer to append there gets its own copy of that one
// unit (Stats.CowCopies), and the sharers left read on; the last one left
// — the unit mapped by its slot alone — is granted write access again
// and writes in place, no copy. So a fork costs a map per shared page
// (and one more per page handed over) and at most one unit copied, never
// a copy of the context; freeing, preempting or evicting either side
// never changes the other's bytes, since no page anyone maps is written
// or given back.
//
// The prefix index gains nothing of the fork's and loses nothing: the
// prompt units both map are listed once and removed (BlockRemoved) only
// once no one maps them and they are evicted; private units are never
// listed. (A fork publishes, as MarkWritten would, the written prompt
// units a swapped-in sequence has not published yet: a unit the child
// maps has no owner writing it.)

// forkPlan is what a fork takes: the child's slot, the units the
// parent's tokens reach (shared, the last partly written when partial),
// and how many of them the parent owns (handed over to the store).
type forkPlan struct {
	sl      *slot
	lo      int // the parent's first unit: those below are behind its window
	shared  int
	partial bool
	own     int
}

// wholeUnits is how many of the first units hold only tokens below n:
// unitsFor(n), less the last when the token at n has bytes in it.
func (g *geometry) wholeUnits(n int) int {
	k := g.unitsFor(n)
	if k > 0 {
		if _, end := g.unitTokens(k - 1); end > n {
			k--
		}
	}
	return k
}

// Fork starts a new sequence that holds the same tokens, keys and values
// as s, a running sequence whose whole prompt is appended and whose every
// row is written (MarkWritten(Len())), and shares them instead of copying
// them: it maps the same physical pages at its own slot, read-only in
// both while shared (see the package doc's Forks). The child has its own
// slot, addresses, extra key and prompt (s's) and goes on on its own: each
// side's Append, Preempt and Free leave the other's bytes alone. The
// tensors handed out for s before the fork answer ErrClosed (its pages
// become read-only): ask K, V or Append for new ones.
//
// A fork commits nothing; the first Append of either side into the last,
// partly written unit copies it (one unit, counted in Stats.CowCopies).
// It plans first, under the lock and without a driver call, for itself
// and that copy: a refusal changes nothing. It refuses a preempted
// sequence, a prompt not all appended, rows not all marked written
// (ErrInvalid); a cache without a prefix store — NoPrefixSharing, or a
// PerLayer page that is not whole rows (ErrUnsupported); a cache whose
// slots all hold sequences (ErrBusy); and a budget that cannot hold the
// copy, or a store with no room for the pages handed over (ErrOutOfMemory,
// counted in Stats.FailedForks); a freed sequence or closed cache
// (ErrClosed).
func (s *Seq) Fork() (*Seq, error) {
	what := func() string { return "kvcache: fork a sequence" }
	c, err := s.lock(what)
	if err != nil {
		return nil, err
	}
	defer c.unlock()
	what = func() string { return fmt.Sprintf("kvcache: fork the sequence of %d tokens in slot %d", s.n, s.sl.idx) }
	check := func() error {
		if err := s.liveLocked(what); err != nil {
			return err
		}
		return c.forkableLocked(what, s)
	}
	if err := check(); err != nil {
		return nil, err
	}
	if _, err := c.planForkLocked(what, s); err != nil {
		return nil, err
	}
	// The parent's tensors end (its pages become read-only): the accesses
	// in flight through them end first, with the lock let go, and nothing
	// of its slot may be being committed. Then everything is planned again.
	if err := c.quiesceLocked(s, check); err != nil {
		return nil, err
	}
	p, err := c.planForkLocked(what, s)
	if err != nil {
		return nil, err
	}
	child, err := c.forkLocked(what, s, p)
	c.checkAfter("fork")
	return child, err
}

// forkableLocked refuses what Fork refuses of s itself.
func (c *Cache) forkableLocked(what func() string, s *Seq) error {
	if err := s.runningLocked(what); err != nil {
		return err
	}
	if err := c.ringUnsupported(what); err != nil {
		return err
	}
	if !c.sharing() {
		return errors.WithHint(errors.Wrapf(driver.ErrUnsupported, "%s: forks share pages through the prefix store, which this cache has not (NoPrefixSharing, or a PerLayer page that is not whole rows)", what()),
			"turn prefix sharing on; in the PerLayer layout, a PageSize that is a multiple of KVHeads*HeadDim*dtype size")
	}
	if s.n < len(s.prompt) {
		return errors.WithHint(errors.Wrapf(driver.ErrInvalid, "%s: %d of its prompt's %d tokens are appended", what(), s.n, len(s.prompt)),
			"append the rest of the prompt (the prefill) and write it first")
	}
	if s.written != s.n {
		return errors.WithHint(errors.Wrapf(driver.ErrInvalid, "%s: %d of its rows are marked written", what(), s.written),
			"a fork shares written rows only: MarkWritten(Len()) first")
	}
	return nil
}

// planForkLocked is the plan of a fork of s, or why it cannot be: no
// free slot (ErrBusy), no store room for the units s owns or no budget
// for the copy of a partly written last unit (ErrOutOfMemory, counted).
// The room for the copy is what makeRoomLocked could give: free, idle,
// cached and surplus pages. It looks at s's units the fork shares and at
// every slot (to choose one), nothing else.
func (c *Cache) planForkLocked(what func() string, s *Seq) (forkPlan, error) {
	g := c.g
	sl := c.pickSlotLocked(nil)
	if sl == nil {
		return forkPlan{}, errors.WithHint(errors.Wrapf(driver.ErrBusy, "%s: all %d slots hold sequences", what(), c.cfg.MaxSeqs),
			"free or finish a sequence first (MaxSeqs sets the slots)")
	}
	p := forkPlan{sl: sl, lo: s.sl.lo, shared: g.unitsFor(s.n)}
	p.partial = g.wholeUnits(s.n) < p.shared
	p.own = s.sl.ownedIn(p.lo, p.shared)
	if p.own > len(c.ps.free) {
		c.counts.failedForks++
		return forkPlan{}, errors.Wrapf(driver.ErrOutOfMemory, "%s: %d of its units are its slot's own, and the prefix store has room for %d",
			what(), p.own, len(c.ps.free))
	}
	if p.partial {
		idle, surplus := c.reclaimableLocked(nil, 0)
		room := c.freePagesLocked() + idle + surplus + c.evictablePagesLocked()
		if need := g.unitPages(); need > room {
			c.counts.failedForks++
			return forkPlan{}, errors.WithHint(
				errors.Wrapf(driver.ErrOutOfMemory, "%s: the copy of its partly written last unit needs %d pages of %s; the budget of %s has %d free or to give back",
					what(), need, units.Bytes(g.page), units.Bytes(c.budget), room),
				"free or preempt sequences, or raise the budget (SetBudget)")
		}
	}
	return p, nil
}

// forkLocked carries out p for s (quiesced): s's own units become store
// units, its shared units read-only, and the child maps them all.
func (c *Cache) forkLocked(what func() string, s *Seq, p forkPlan) (*Seq, error) {
	g, psl, csl := c.g, s.sl, p.sl
	if err := c.dropKeptLocked(csl); err != nil {
		return nil, err
	}
	psl.revokeLocked()
	if err := c.releaseCoversLocked(psl); err != nil {
		return nil, err
	}
	// Rows written are published as MarkWritten would (a swapped-in
	// sequence's units wait for the next one): a unit the child maps has
	// no owner writing it.
	c.publishLocked(s, s.written)
	// A window's fork shares the units from the window's first (p.lo) on.
	sus := make([]*storeUnit, p.shared-p.lo)
	for i := range sus {
		u := p.lo + i
		switch ui := psl.units[u]; ui.state {
		case unitBorrowed:
			sus[i] = ui.su
		case unitOwned:
			su, err := c.handOverLocked(what, psl, u)
			if err != nil {
				return nil, err
			}
			sus[i] = su
		default:
			return nil, errors.AssertionFailedf("%s: unit %d of its %d is not committed", what(), u, p.shared)
		}
		// Mapped by the parent alone, a unit holds the tokens it holds now;
		// its sharers all hold the same ones in it.
		if su := sus[i]; su.refs == 1 {
			su.used = 0
			if used := g.usedBytes(u, s.n); used != g.fullUnitBytes() {
				su.used = used
			}
		}
	}
	if err := c.protectSharedLocked(what, psl, p.shared); err != nil {
		return nil, err
	}
	// The child's slot: out of the idle list while its kept pages where
	// the shared units go are given back.
	csl.admitting = true
	c.refileIdleLocked(csl)
	fail := func(err error) (*Seq, error) {
		c.setLoLocked(csl, 0)
		csl.admitting = false
		c.refileIdleLocked(csl)
		return nil, err
	}
	if kept := csl.ownedIn(0, p.shared); kept > 0 {
		if err := c.decommitUnitsLocked(csl, 0, p.shared); err != nil {
			return fail(err)
		}
		c.counts.reclaimedPages += kept * g.unitPages()
	}
	c.setLoLocked(csl, p.lo)
	n, readOnly, err := c.borrowSharedLocked(csl, p.lo, sus)
	if err != nil {
		return fail(errors.CombineErrors(errors.Wrapf(err, "%s", what()), c.decommitUnitsLocked(csl, p.lo, p.lo+n)))
	}
	if readOnly {
		csl.shared = p.shared
	} else if err := c.protectSharedLocked(what, csl, p.shared); err != nil {
		return fail(errors.CombineErrors(err, c.decommitUnitsLocked(csl, p.lo, p.shared)))
	}
	c.tick++
	child := &Seq{c: c, sl: csl, prompt: s.prompt, extra: s.extra, admitted: c.tick,
		n: s.n, written: s.n, matched: s.matched, chain: slices.Clip(s.chain), generated: s.generated.fork(),
		forked: p.shared}
	s.forked = max(s.forked, p.shared)
	c.attachLocked(csl, child)
	c.seqs[child] = struct{}{}
	c.counts.forks++
	c.wantAheadLocked(csl)
	c.wantAheadLocked(psl)
	return child, nil
}

// handOverLocked makes unit u of sl, owned, a private store unit that sl
// borrows: its pages handed over to the store in one arena call (the
// regions lie apart in the slot, side by side in the store unit), mapped
// where they were. On failure nothing changed.
func (c *Cache) handOverLocked(what func() string, sl *slot, u int) (*storeUnit, error) {
	g := c.g
	idx := c.ps.free[len(c.ps.free)-1]
	offs := make([]uint64, g.regions)
	for r := range offs {
		offs[r] = c.slotOff(sl, r, u)
	}
	if err := c.slots.HandOverEach(offs, g.unitBytes, c.ps.s, c.storeOff(idx, 0)); err != nil {
		return nil, errors.Wrapf(err, "%s: hand unit %d of slot %d over to the prefix store", what(), u, sl.idx)
	}
	c.ps.free = c.ps.free[:len(c.ps.free)-1]
	su := &storeUnit{idx: idx, u: u, lastUse: c.tick}
	c.ps.units[idx] = su
	c.ps.pages += g.unitPages()
	c.setUnitLocked(sl, u, unitBorrowed, su)
	c.refLocked(su, 1)
	return su, nil
}

// cowUnitLocked is the unit s's next token is written into when it is a
// fork's partly written last unit still shared read-only (a borrowed
// unit below sl.shared that the token has bytes in), and the store unit
// mapped there; -1 and nil otherwise.
func (c *Cache) cowUnitLocked(s *Seq) (int, *storeUnit) {
	sl := s.sl
	u := c.g.unitsFor(s.n) - 1
	if u < 0 || u >= sl.shared || sl.units[u].state != unitBorrowed {
		return -1, nil
	}
	if _, end := c.g.unitTokens(u); end <= s.n {
		return -1, nil
	}
	return u, sl.units[u].su
}

// cowCopyPendingLocked reports whether s's next Append copies a unit on
// write: another slot maps it too.
func (c *Cache) cowCopyPendingLocked(s *Seq) bool {
	_, su := c.cowUnitLocked(s)
	return su != nil && su.refs > 1
}

// cowPagesLocked is the pages s's next Append copies on write.
func (c *Cache) cowPagesLocked(s *Seq) int {
	return b2i(c.cowCopyPendingLocked(s)) * c.g.unitPages()
}

// cowLocked makes s's partly written last unit its own before an Append
// that reaches need units writes there: granted write access in place
// when s's slot alone maps it, else copied into a new unit of the slot —
// if the budget can hold that and the Append's empty units (pages) too
// (else ErrOutOfMemory, nothing changed, in place or not). A copy gives
// the shared unit back, which revokes s's tensors: the caller has
// quiesced s (no access in flight, no commit of its slot).
func (c *Cache) cowLocked(what func() string, s *Seq, need, pages int) error {
	u, su := c.cowUnitLocked(s)
	if su == nil {
		return nil
	}
	sl, g := s.sl, c.g
	if su.refs == 1 {
		// In place only once the Append's own pages fit: a refused
		// Append leaves the unit shared, read-only.
		idle, surplus := c.reclaimableLocked(sl, need)
		if room := c.freePagesLocked() + idle + surplus + c.evictablePagesLocked(); pages > room {
			return errors.WithHint(
				errors.Wrapf(driver.ErrOutOfMemory, "%s: its new units need %d pages of %s; the budget of %s has %d free or to give back",
					what(), pages, units.Bytes(g.page), units.Bytes(c.budget), room),
				"free or preempt sequences, or raise the budget (SetBudget)")
		}
		for r := 0; c.protects && r < g.regions; r++ {
			if err := c.slots.Grant(c.cfg.Device, c.slotOff(sl, r, u), g.unitBytes, driver.AccessReadWrite); err != nil {
				var undo error
				for q := 0; q < r; q++ {
					undo = errors.CombineErrors(undo, c.slots.Grant(c.cfg.Device, c.slotOff(sl, q, u), g.unitBytes, driver.AccessRead))
				}
				if undo != nil {
					err = errors.CombineErrors(err, errors.WithAssertionFailure(undo))
				}
				return errors.Wrapf(err, "%s: grant write access to its unit %d again", what(), u)
			}
		}
		sl.shared = u
		su.used = 0 // written on in place: holds what the slot's tokens hold
		return nil
	}
	up := g.unitPages()
	idle, surplus := c.reclaimableLocked(sl, need)
	if room := c.freePagesLocked() + idle + surplus + c.evictablePagesLocked(); up+pages > room {
		return errors.WithHint(
			errors.Wrapf(driver.ErrOutOfMemory, "%s: its shared last unit's copy and its new units need %d pages of %s; the budget of %s has %d free or to give back",
				what(), up+pages, units.Bytes(g.page), units.Bytes(c.budget), room),
			"free or preempt sequences, or raise the budget (SetBudget)")
	}
	if err := c.makeRoomLocked(what, up, sl, need); err != nil {
		return err
	}
	c.refLocked(su, 1) // held while the slot lets it go
	defer c.giveBackLocked(su)
	if err := c.decommitUnitsLocked(sl, u, u+1); err != nil {
		return err
	}
	if err := c.commitUnitsLocked(sl, u, u+1); err != nil {
		// The tokens in the unit are the sequence's: it maps the shared
		// unit again, read-only.
		return errors.CombineErrors(err, c.reborrowLocked(what, sl, u, su))
	}
	if err := c.copyStoreUnitLocked(what, su, sl, u); err != nil {
		return errors.CombineErrors(err, errors.CombineErrors(c.decommitUnitsLocked(sl, u, u+1), c.reborrowLocked(what, sl, u, su)))
	}
	c.counts.cowCopies++
	c.counts.cowBytes += g.storeUnitBytes()
	return nil
}

// reborrowLocked maps su back at unit u of sl, read-only, after a copy on
// write failed part-way.
func (c *Cache) reborrowLocked(what func() string, sl *slot, u int, su *storeUnit) error {
	if err := c.borrowLocked(sl, u, su); err != nil {
		return errors.WithAssertionFailure(err)
	}
	for r := 0; c.protects && r < c.g.regions; r++ {
		if err := c.slots.Grant(c.cfg.Device, c.slotOff(sl, r, u), c.g.unitBytes, driver.AccessRead); err != nil {
			return errors.WithAssertionFailure(errors.Wrapf(err, "%s: map unit %d read-only again", what(), u))
		}
	}
	sl.shared = u + 1
	return nil
}

// fork is a copy of the log that shares its full blocks (never written
// again: an append past them starts a new block) and copies the last one
// when it has room: at most logBlock tokens copied, whatever the length.
func (l *tokenLog) fork() tokenLog {
	out := tokenLog{blocks: make([][]int, len(l.blocks)), n: l.n}
	for i, b := range l.blocks {
		if len(b) == logBlock {
			out.blocks[i] = b[:logBlock:logBlock]
		} else {
			out.blocks[i] = slices.Clone(b)
		}
	}
	return out
}

// emptyPagesLocked is the pages the empty units of sl in [from, to) take.
func (c *Cache) emptyPagesLocked(sl *slot, from, to int) int {
	n := 0
	for u := from; u < to; u++ {
		n += b2i(sl.units[u].state == unitEmpty)
	}
	return n * c.g.unitPages()
}

// quiesceCowLocked quiesces (quiesceLocked) every sequence of a step's
// plan whose Append copies on write, until all of them are quiet at once
// — no access through their tensors in flight, no commit of their slots:
// each wait lets the lock go, so the others are looked at again after.
func (c *Cache) quiesceCowLocked(what func() string, plan []stepPlan) error {
	check := func() error {
		if c.closed {
			return errCacheClosed(what)
		}
		return nil
	}
	for {
		quiet := true
		for k := range plan {
			s := plan[k].s
			if s.state != seqRunning || !c.revokePendingLocked(s) {
				continue
			}
			if l := s.sl.lease; (l == nil || (l.Revoked() && l.Idle())) && c.mapping.sl != s.sl {
				continue
			}
			quiet = false
			if err := c.quiesceLocked(s, check); err != nil {
				return err
			}
		}
		if quiet {
			return nil
		}
	}
}
