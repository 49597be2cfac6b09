package kvcache

import (
	"fmt"
	"slices"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/stream"
)

// PreemptMode says what a preempted sequence keeps.
type PreemptMode uint8

const (
	// Swap copies the sequence's keys and values to pinned host memory
	// (stream.HostBuffer) before its pages go: Resume puts them back,
	// byte for byte.
	Swap PreemptMode = iota + 1
	// Drop lets its pages go and keeps only its tokens: Resume hands back
	// views of the positions the caller must recompute.
	Drop
)

func (m PreemptMode) String() string {
	switch m {
	case Swap:
		return "swap"
	case Drop:
		return "drop"
	}
	return fmt.Sprintf("PreemptMode(%d)", uint8(m))
}

func checkMode(what func() string, m PreemptMode) error {
	if m != Swap && m != Drop {
		return errors.Wrapf(driver.ErrInvalid, "%s: preempt mode %d is neither Swap (1) nor Drop (2)", what(), uint8(m))
	}
	return nil
}

// Preempt takes a running sequence's memory away, keeping its slot, its
// addresses and its tokens: with Swap its bytes go to pinned host memory
// first, with Drop they are lost (Resume then asks for recomputation).
// What it borrowed from the prefix store is given back (the store keeps
// it cached) but stays mapped in its slot, kept for its Resume (no
// unmap); the prompt units it made that MarkWritten did not cover are
// given back unpublished. The tensors handed out for it answer ErrClosed
// from then on; Resume hands out new ones.
//
// It refuses a sequence already preempted or a bad mode (ErrInvalid), and
// Swap on a driver with bytes but no streams (ErrUnsupported); a failure
// to get host memory or to copy changes nothing.
func (s *Seq) Preempt(mode PreemptMode) error {
	what := func() string { return fmt.Sprintf("kvcache: preempt (%s) a sequence", mode) }
	c, err := s.lock(what)
	if err != nil {
		return err
	}
	defer c.unlock()
	if err := checkMode(what, mode); err != nil {
		return err
	}
	if err := c.ringUnsupported(what); err != nil {
		return err
	}
	check := func() error {
		if err := s.liveLocked(what); err != nil {
			return err
		}
		return s.runningLocked(what)
	}
	if err := c.quiesceLocked(s, check); err != nil {
		return err
	}
	err = c.preemptLocked(what, s, mode)
	c.checkAfter("preempt")
	return err
}

// preemptLocked preempts s, a running sequence none of whose units is
// being committed (the caller waited for the mapper).
func (c *Cache) preemptLocked(what func() string, s *Seq, mode PreemptMode) error {
	sl := s.sl
	if c.mapping.sl == sl {
		return errors.AssertionFailedf("%s: %s is being committed", what(), c.mapping)
	}
	if err := c.ringUnsupported(what); err != nil {
		return err // SetBudget's preemption
	}
	if mode == Swap {
		if err := c.swapOutLocked(what, s); err != nil {
			return err
		}
	}
	// Its views go first (they pin the memory); its own pages go, the
	// listed store units it borrowed stay mapped for its resume (kept.go).
	if sl.coverUnits > 0 {
		sl.revokeLocked()
		if err := c.releaseCoversLocked(sl); err != nil {
			return errors.CombineErrors(err, c.dropSwapLocked(s))
		}
	}
	if err := c.leaveLocked(sl, len(sl.units), false); err != nil {
		return errors.CombineErrors(err, c.dropSwapLocked(s))
	}
	c.setLoLocked(sl, 0)
	s.unpublished = s.unpublished[:0] // each given back, unwritten
	if mode == Swap {
		c.setStateLocked(s, seqSwapped)
		c.counts.swaps++
	} else {
		c.setStateLocked(s, seqDropped)
		s.written = 0 // its rows are gone
		c.counts.drops++
	}
	c.counts.preemptions++
	return nil
}

// swapRegionBytes is the bytes of each region a swap keeps for n tokens.
func (g *geometry) swapRegionBytes(n int) uint64 {
	if g.layout != TokenMajor {
		return uint64(n) * g.stride
	}
	return uint64(g.unitsFor(n)) * g.unitBytes
}

// swapOutLocked copies s's regions to a new host buffer (none on a driver
// without bytes: the bytes are counted only). On failure nothing changed.
func (c *Cache) swapOutLocked(what func() string, s *Seq) error {
	ru := c.g.swapRegionBytes(s.n)
	lo := uint64(s.sl.lo) * c.g.unitBytes // what is behind a window stays behind
	size := (ru - lo) * uint64(c.g.regions)
	s.swapRegion, s.swapLo = ru, s.sl.lo
	if !c.bytes || size == 0 {
		c.counts.swappedBytes += size
		return nil
	}
	if c.str == nil {
		return errors.Wrapf(driver.ErrUnsupported, "%s: the %s driver has no streams to copy with", what(), c.slots.Driver().Name())
	}
	hb, err := stream.NewHostBuffer(c.slots.Driver(), size)
	if err != nil {
		return errors.Wrapf(err, "%s: %s of host memory", what(), units.Bytes(size))
	}
	b := hb.Bytes()
	for r := 0; r < c.g.regions; r++ {
		src := c.slots.Base() + driver.Addr(c.slotOff(s.sl, r, 0)+lo)
		if err := c.str.CopyDtoHSync(b[uint64(r)*(ru-lo):uint64(r+1)*(ru-lo)], src); err != nil {
			return errors.CombineErrors(errors.Wrapf(err, "%s: copy to host", what()), hb.Free())
		}
	}
	s.swap = hb
	c.counts.swappedBytes += size
	return nil
}

// dropSwapLocked frees s's host buffer, if any.
func (c *Cache) dropSwapLocked(s *Seq) error {
	if s.swap == nil {
		return nil
	}
	err := s.swap.Free()
	s.swap = nil
	return err
}

// Resume brings a preempted sequence back into its slot, at the same
// addresses: pages are committed (or borrowed again from the prefix store
// where its prompt's pages are still cached) for all its tokens. After
// Swap the content is what it was and the Step is empty; after Drop the
// Step covers the positions whose keys and values the caller must
// recompute and write (from Matched() on: the prefix store may hold the
// start of the prompt still).
//
// It plans first (the package doc's planner): the units the prefix store
// lends again, the pages to commit for the rest, the room giving back
// idle, cached and surplus pages makes. A plan the budget cannot hold is
// refused (ErrOutOfMemory, counted in Stats.FailedResumes) before any
// driver call: the sequence stays preempted, and every book is as it was.
// CanResume answers from the same plan.
//
// It refuses a running sequence (ErrInvalid), and pages the budget cannot
// hold (ErrOutOfMemory): the sequence then stays preempted, unchanged.
func (s *Seq) Resume() (Step, error) {
	what := func() string { return "kvcache: resume a sequence" }
	c, err := s.lock(what)
	if err != nil {
		return Step{}, err
	}
	defer c.unlock()
	if s.state == seqRunning {
		return Step{}, errors.Wrapf(driver.ErrInvalid, "%s: it is running, not preempted", what())
	}
	what = func() string {
		return fmt.Sprintf("kvcache: resume a sequence of %d tokens in slot %d", s.n, s.sl.idx)
	}
	step, err := c.resumeLocked(what, s)
	c.checkAfter("resume")
	return step, err
}

func (c *Cache) resumeLocked(what func() string, s *Seq) (Step, error) {
	sl := s.sl
	need := c.g.unitsFor(s.n)
	swapped := s.state == seqSwapped
	p := c.planResumeLocked(s, s.n)
	if !p.fits() {
		c.counts.failedResumes++
		return Step{}, errors.WithHint(
			errors.Wrapf(driver.ErrOutOfMemory, "%s: its pages need %d of %s beyond the %d units the prefix store lends; the budget of %s has %d free or to give back",
				what(), p.need, units.Bytes(c.g.page), len(p.m.units), units.Bytes(c.budget), p.room),
			"ask CanResume first; free or preempt sequences, or raise the budget (SetBudget)")
	}
	// Back in the running state for the books (matching, backing); put
	// back on failure (an arena's: the plan fits).
	prev, prevMatched := s.state, s.matched
	c.setStateLocked(s, seqRunning)
	// A swap of a window sequence brings back the units from its window's
	// first on (swapLo); the store lends none below.
	from := 0
	if swapped {
		from = s.swapLo
	}
	c.setLoLocked(sl, from)
	fail := func(err error, backed []int) (Step, error) {
		err = errors.CombineErrors(err, c.unbackLocked(sl, backed))
		c.setLoLocked(sl, 0)
		c.setStateLocked(s, prev)
		s.matched = prevMatched
		return Step{}, err
	}
	matchedUnits, err := c.rematchLocked(what, s, p.m, !swapped)
	if err != nil {
		return fail(err, nil)
	}
	from = max(from, sl.lo) // a window's match starts past the units behind it
	backed, err := c.backLocked(what, s, from, need)
	if err != nil {
		return fail(err, matchedUnits)
	}
	backed = append(matchedUnits, backed...)
	from = s.matched
	if swapped {
		if err := c.swapInLocked(what, s, len(matchedUnits)); err != nil {
			return fail(err, backed)
		}
		from = s.n
	}
	step, err := c.stepLocked(s, from, s.n-from)
	if err != nil {
		return fail(err, backed)
	}
	if err := c.dropSwapLocked(s); err != nil {
		return Step{}, errors.WithAssertionFailure(err)
	}
	if swapped {
		s.written = max(s.written, s.matched) // the bytes it had, and the units matched again
	} else {
		s.written = from // the matched rows; the caller recomputes the rest
	}
	s.swapLo = 0
	c.countMatchLocked(s)
	c.counts.resumes++
	c.wantAheadLocked(sl)
	return step, nil
}

// swapInLocked copies s's host buffer back into its units from unit skip
// on (the units below were borrowed again from the store: they hold the
// same bytes already).
func (c *Cache) swapInLocked(what func() string, s *Seq, skip int) error {
	if s.swap == nil {
		return nil
	}
	g, sl := c.g, s.sl
	b, ru := s.swap.Bytes(), s.swapRegion
	base := uint64(s.swapLo) * g.unitBytes // the buffer starts there in each region
	for r := 0; r < g.regions; r++ {
		for u := max(skip, s.swapLo); u < g.unitsFor(s.n); {
			v := u + 1
			for v < g.unitsFor(s.n) && sl.units[v].state == sl.units[u].state {
				v++
			}
			lo, hi := uint64(u)*g.unitBytes, min(uint64(v)*g.unitBytes, ru)
			dst := c.slots.Base() + driver.Addr(c.slotOff(sl, r, 0)+lo)
			off := uint64(r) * (ru - base)
			if err := c.str.CopyHtoDSync(dst, b[off+lo-base:off+hi-base]); err != nil {
				return errors.Wrapf(err, "%s: copy from host", what())
			}
			u = v
		}
	}
	return nil
}

// SetBudget changes the most memory the cache keeps committed. Raising it
// is immediate. Lowering it below what is committed gives memory back
// until the cache fits: the pages of idle slots (longest idle first),
// cached prefix store units (least recently used first), the pages
// running sequences hold beyond their tokens, and then — if it must —
// whole running sequences, preempted with mode, the latest admitted first.
// It returns the sequences it preempted, which the caller resumes when
// memory allows.
//
// A zero budget or a bad mode is refused (ErrInvalid) with nothing
// changed. If a preemption fails (host memory for a swap), the budget is
// set, what was given back stays given back, and the error says so.
func (c *Cache) SetBudget(budget uint64, mode PreemptMode) ([]*Seq, error) {
	what := func() string { return fmt.Sprintf("kvcache: set the budget to %s", units.Bytes(budget)) }
	if err := c.made(what); err != nil {
		return nil, err
	}
	if budget == 0 {
		return nil, errors.WithHint(errors.Wrapf(driver.ErrInvalid, "%s: a budget of zero holds nothing", what()),
			"preempt or free the sequences instead")
	}
	if err := checkMode(what, mode); err != nil {
		return nil, err
	}
	var preempted []*Seq // by every round
	c.mu.Lock()
	defer c.unlock()
	if err := c.usableLocked(what); err != nil {
		return nil, err
	}
	c.budget = budget
	defer c.checkAfter("set budget")
	defer c.trimPoolLocked()
	// The mapper plans within the budget: once the commits in flight
	// land, nothing more comes until there is room.
again: // planned again from here after every wait that let the lock go
	for c.inflight > 0 {
		c.cond.Wait()
		if err := c.usableLocked(what); err != nil {
			return preempted, err
		}
	}
	if c.freePagesLocked() >= 0 {
		// Room for the mapper, maybe: every running sequence that wants a
		// unit ahead is listed already.
		c.wakeMapper()
		return preempted, nil
	}
	// Give back what holds no running sequence's tokens, in order, until
	// the cache fits (no page wanted beyond that: need 0).
	for _, step := range []func() error{
		func() error { return c.reclaimIdleLocked(0, nil) },
		func() error { return c.evictLocked(0) },
		func() error { return c.reclaimSurplusLocked(0, nil, 0) },
	} {
		if c.freePagesLocked() >= 0 {
			return preempted, nil
		}
		if err := step(); err != nil {
			return preempted, errors.Wrapf(err, "%s", what())
		}
	}
	var running []*Seq
	for s := range c.seqs {
		if s.state == seqRunning {
			running = append(running, s)
		}
	}
	slices.SortFunc(running, func(a, b *Seq) int { return int(b.admitted) - int(a.admitted) })
	for _, s := range running {
		if c.freePagesLocked() >= 0 {
			break
		}
		// The accesses through its tensors end with the lock let go
		// (drainLocked); after a wait, everything is planned again.
		if waited, err := c.drainLocked(s.sl, func() error { return c.usableLocked(what) }); err != nil {
			return preempted, err
		} else if waited {
			goto again
		}
		if err := c.preemptLocked(what, s, mode); err != nil {
			return preempted, errors.Wrapf(err, "%s: preempting the sequence in slot %d (after %d others)", what(), s.sl.idx, len(preempted))
		}
		preempted = append(preempted, s)
		// What it borrowed may now be evictable.
		if err := c.evictLocked(0); err != nil {
			return preempted, errors.Wrapf(err, "%s", what())
		}
	}
	if c.freePagesLocked() < 0 {
		return preempted, errors.AssertionFailedf("%s: %d pages stay committed with every sequence preempted", what(), c.pages)
	}
	return preempted, nil
}

// CanAdmit says whether a sequence with prompt (under extra) that will
// generate expectedOutput more tokens would fit now: whether Admit would
// succeed and the Append that takes it to len(prompt)+expectedOutput
// tokens (MaxContext at most) after it, with no other call between. It
// answers from Admit's plan (see Admit): a slot is free, and the pages
// its tokens need — less those its prompt would borrow from the prefix
// store and those the slot keeps — fit in the budget once idle, cached
// (but those it borrows) and surplus pages are given back, as are the
// slot's own pages where the borrowed ones will be mapped. It reserves
// nothing: other sequences' growth takes from the same budget, and the
// mapping-ahead goroutine may commit meanwhile.
//
// Asked again about the same slice (its first token's address and its
// length) and extra key, and nothing asked about between, it looks at no
// token again but past the prefix the store held at the last call: the
// cost of a request asked about every step is the prefix's units, not its
// tokens. A caller that changes a slice's tokens in place between two
// calls must pass another slice, or CanAdmit answers for the tokens it
// saw; Admit checks and matches what the slice holds whatever CanAdmit
// remembered.
func (c *Cache) CanAdmit(prompt []int, extra uint64, expectedOutput int) (bool, error) {
	what := func() string {
		return fmt.Sprintf("kvcache: can a prompt of %d tokens and %d more be admitted", len(prompt), expectedOutput)
	}
	if err := c.made(what); err != nil {
		return false, err
	}
	if len(prompt) == 0 || expectedOutput < 0 {
		return false, errors.Wrapf(driver.ErrInvalid, "%s: a prompt has at least one token, and the output is not negative", what())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usableLocked(what); err != nil {
		return false, err
	}
	m, err := c.askLocked(what, prompt, extra)
	if err != nil {
		return false, err
	}
	if len(prompt) > c.cfg.MaxContext {
		return false, nil
	}
	total := upTo(len(prompt), expectedOutput, c.cfg.MaxContext)
	return c.planAdmitLocked(m, total).fits(), nil
}

// CanResume says whether Resume would bring the preempted sequence back
// now and the Append of more tokens after it (up to MaxContext in all)
// would fit, with no other call between: it answers from Resume's plan,
// changing nothing, in a look at each unit the prefix store lends it (its
// prompt is hashed once). It refuses a running sequence or a negative
// more (ErrInvalid), a freed one or a closed cache (ErrClosed).
func (s *Seq) CanResume(more int) (bool, error) {
	what := func() string { return fmt.Sprintf("kvcache: can a sequence resume and take %d more tokens", more) }
	c, err := s.lock(what)
	if err != nil {
		return false, err
	}
	defer c.mu.Unlock()
	switch {
	case s.state == seqRunning:
		return false, errors.Wrapf(driver.ErrInvalid, "%s: it is running, not preempted", what())
	case more < 0:
		return false, errors.Wrapf(driver.ErrInvalid, "%s: a negative count", what())
	}
	return c.planResumeLocked(s, upTo(s.n, more, c.cfg.MaxContext)).fits(), nil
}

// upTo is n tokens and more after them, at most limit (a MaxContext), for
// the admission and resume questions: more, a caller's figure of any size,
// is capped before the sum, which cannot overflow (n and limit are counts
// of tokens held or allowed; more is not negative).
func upTo(n, more, limit int) int { return min(n+min(more, limit), limit) }
