package kvcache

import (
	"fmt"
	"slices"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// The step API: one call for the batch of a serving step. An engine
// schedules a batch — every running sequence's next token, a chunk of a
// prompt for some — and Cache.Step makes room for all of it under one
// lock, in slot order (address order: the slots lie side by side in the
// slot range), and hands back per sequence what the step's kernels need.
// A sequence whose next rows are committed already (mapping ahead put its
// page there) costs the step a look at the units its tokens reach and
// nothing more; only those that reach an uncommitted unit commit, each
// run of its units in one arena call per region, as Append does.
//
// Atomic: before anything is committed, the pages the whole batch needs
// are counted against what the budget can give (free pages, idle slots'
// pages, cached prefix store units, running sequences' surplus beyond the
// batch's own); a batch that does not fit is refused with ErrOutOfMemory
// naming the first sequence, in slot order, past what fits, and nothing
// changes. Should a commit still fail part-way (a device taken by others
// meanwhile), the sequences stepped so far are put back — lengths, tokens
// and the units they backed — so that no sequence of a failed step holds
// a row of it.

// StepRequest is one sequence's share of a step: the tokens it appends.
type StepRequest struct {
	Seq    *Seq
	Tokens []int
	// Views asks for the rows' tensors (Step.Layers), as Append makes
	// them. An engine whose kernels take addresses leaves it off: the
	// step then makes no tensor.
	Views bool
}

// SeqStep is what a step made room for in one sequence.
type SeqStep struct {
	Seq *Seq
	// Base is the address of the sequence's slot: token p of layer l's K
	// (kv 0) or V (kv 1) lies at Base + Cache.RowOffset(l, kv, p). It
	// never changes while the sequence lives.
	Base driver.Addr
	// Len is the sequence's length after the step.
	Len int
	// Step is the positions the step writes, [Pos, Pos+N): the rows of
	// its tokens; Layers only when the request asked for Views.
	Step
}

// RowOffset is where token pos of layer's K (kv 0) or V (kv 1) lies in a
// slot, in bytes from the slot's base (SeqStep.Base): the row of
// KVHeads*HeadDim elements a kernel writes. Out-of-range arguments give 0.
func (c *Cache) RowOffset(layer, kv, pos int) uint64 {
	if c == nil || c.g == nil || layer < 0 || layer >= c.g.layers || kv < 0 || kv > 1 || pos < 0 || pos >= c.cfg.MaxContext {
		return 0
	}
	return c.g.tokenOff(layer, kv, pos)
}

// stepPlan is one request's part of a step, in slot order.
type stepPlan struct {
	i        int // the request's index in the batch
	slot     int // its slot's index: the key of the order
	s        *Seq
	tokens   []int
	pos      int   // its length before the step
	from     int   // unitsFor(pos): the units below are committed
	need     int   // unitsFor(pos+len(tokens))
	pages    int   // pages its empty units in [from, need) take, and its copy on write
	cow      int   // pages of its copy on write (fork.go)
	reserved int   // its owned units in [from, need): surplus the step keeps
	backed   []int // the units the step backed for it
	done     bool  // its length and tokens are the step's
}

// Step appends, for every request of batch, its tokens to its sequence —
// at most one request a sequence, each running and of this cache — and
// returns, in the batch's order, what each sequence's kernels need: its
// slot's address, its length after the step, and the positions (and with
// Views, the rows' tensors) the step writes. The bytes and books are what
// one Seq.Append per request, in slot order, would leave. An empty batch
// is a step of nothing. The results go into into's memory when it is
// large enough (an engine passes the last step's back: a step then
// allocates nothing).
//
// It refuses what Append refuses of any request (ErrInvalid, ErrClosed),
// a sequence of another cache or twice in the batch (ErrInvalid), and a
// batch whose pages the budget cannot hold once idle, cached and surplus
// pages are given back (ErrOutOfMemory, naming the sequence): a refusal
// changes nothing.
func (c *Cache) Step(batch []StepRequest, into []SeqStep) ([]SeqStep, error) {
	what := func() string { return fmt.Sprintf("kvcache: step of %d sequences", len(batch)) }
	if err := c.made(what); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.unlock()
	if c.closed {
		return nil, errCacheClosed(what)
	}
	plan := slices.Grow(c.stepPlan[:0], len(batch))[:len(batch)]
	defer func() {
		clear(plan) // no sequence or token kept alive by the scratch
		c.stepPlan = plan[:0]
	}()
	sorted := true
	for i, r := range batch {
		if r.Seq == nil || r.Seq.c != c {
			return nil, errors.Wrapf(driver.ErrInvalid, "%s: request %d: not a sequence of this cache", what(), i)
		}
		plan[i] = stepPlan{i: i, slot: r.Seq.sl.idx, s: r.Seq, tokens: r.Tokens}
		sorted = sorted && (i == 0 || plan[i-1].slot <= plan[i].slot)
	}
	if !sorted { // an engine that keeps its batch in slot order skips this
		slices.SortFunc(plan, func(a, b stepPlan) int { return a.slot - b.slot })
	}
	for k := 1; k < len(plan); k++ {
		if plan[k].s == plan[k-1].s {
			return nil, errors.Wrapf(driver.ErrInvalid, "%s: requests %d and %d are of the same sequence (slot %d): one request a sequence",
				what(), min(plan[k].i, plan[k-1].i), max(plan[k].i, plan[k-1].i), plan[k].s.sl.idx)
		}
	}
	if c.g.ring > 0 {
		return c.ringStepBatchLocked(what, batch, plan, into)
	}
	// Every request is checked before any is waited for or drained (a
	// drain ends its sequence's tensors), as Append checks its tokens
	// first: a bad request refuses the step with nothing touched.
	if err := c.checkStepLocked(what, plan); err != nil {
		return nil, err
	}
	if err := c.quiesceCowLocked(what, plan); err != nil {
		return nil, err
	}
	waited, err := c.settleStepLocked(what, plan)
	if err != nil {
		return nil, err
	}
	// Each sequence's units behind its next token's window go first, as
	// in Append (window.go), the pool bounded before.
	c.boundWindowPoolLocked()
	for k := range plan {
		if err := c.releaseBehindLocked(what, plan[k].s); err != nil {
			return nil, err
		}
	}
	if err := c.planStepLocked(what, plan); err != nil {
		return nil, err
	}
	for k := range plan {
		p := &plan[k]
		s := p.s
		pwhat := func() string {
			return fmt.Sprintf("%s: request %d, %d tokens to the sequence of %d in slot %d", what(), p.i, len(p.tokens), p.pos, s.sl.idx)
		}
		if err := c.cowLocked(pwhat, s, p.need, p.pages-p.cow); err != nil {
			return nil, errors.CombineErrors(err, c.undoStepLocked(plan[:k]))
		}
		if p.from < p.need {
			p.backed, err = c.backIntoLocked(pwhat, s, p.from, p.need, nil)
			if err != nil {
				return nil, errors.CombineErrors(err, c.undoStepLocked(plan[:k]))
			}
		}
		s.generated.append(p.tokens[min(max(len(s.prompt)-p.pos, 0), len(p.tokens)):])
		c.setLenLocked(s, p.pos+len(p.tokens))
		p.done = true
		// Listed as an Append lists it, in the same order; a slot listed by
		// a step that fails later wants nothing and leaves the list.
		if c.cfg.MapAhead > 0 {
			c.wantAheadLocked(s.sl)
		}
	}
	out := slices.Grow(into[:0], len(batch))[:len(batch)]
	for k := range plan {
		p := &plan[k]
		st := Step{Pos: p.pos, N: len(p.tokens)}
		if batch[p.i].Views && c.views {
			st, err = c.stepLocked(p.s, p.pos, len(p.tokens))
			if err != nil {
				return nil, errors.CombineErrors(errors.Wrapf(err, "%s: request %d", what(), p.i), c.undoStepLocked(plan))
			}
		}
		out[p.i] = SeqStep{Seq: p.s, Base: c.slots.Base() + driver.Addr(c.slotOff(p.s.sl, 0, 0)), Len: p.s.n, Step: st}
	}
	for k := range plan {
		p := &plan[k]
		c.counts.steps++
		if (waited != nil && waited[k]) || len(p.backed) > 0 {
			c.counts.waits++
		}
	}
	c.checkAfter("step")
	return out, nil
}

// settleStepLocked checks every request as Append does and waits until
// the mapper commits no unit a request's tokens reach; everything is
// checked again after each wait (the lock goes meanwhile). It reports,
// per request, whether it waited for its unit.
func (c *Cache) settleStepLocked(what func() string, plan []stepPlan) ([]bool, error) {
	var waited []bool
	for {
		if err := c.checkStepLocked(what, plan); err != nil {
			return nil, err
		}
		busy := -1
		for k := range plan {
			s := plan[k].s
			if c.mapping.sl == s.sl && c.mapping.u < c.g.unitsFor(s.n+len(plan[k].tokens)) {
				busy = k
			}
		}
		if busy < 0 {
			return waited, nil
		}
		if waited == nil {
			waited = make([]bool, len(plan))
		}
		waited[busy] = true
		c.cond.Wait()
	}
}

// checkStepLocked refuses, as Append does, a closed cache and any request
// Append would refuse of its sequence (appendableLocked).
func (c *Cache) checkStepLocked(what func() string, plan []stepPlan) error {
	if c.closed {
		return errCacheClosed(what)
	}
	for k := range plan {
		p := &plan[k]
		s := p.s
		pwhat := func() string {
			return fmt.Sprintf("%s: request %d, %d tokens to the sequence of %d in slot %d", what(), p.i, len(p.tokens), s.n, s.sl.idx)
		}
		if err := c.appendableLocked(pwhat, s, p.tokens); err != nil {
			return err
		}
	}
	return nil
}

// planStepLocked fills in each request's units and pages and refuses,
// changing nothing, a batch the budget cannot hold: the pages of the
// batch's empty units against the free pages and what can be given back
// (idle slots' pages, cached store units, running sequences' surplus
// less the batch's own units past its sequences' tokens, which the step
// keeps).
func (c *Cache) planStepLocked(what func() string, plan []stepPlan) error {
	up := c.g.unitPages()
	total, reserved := 0, 0
	for k := range plan {
		p := &plan[k]
		sl := p.s.sl
		p.pos = p.s.n
		p.from, p.need = c.g.unitsFor(p.pos), c.g.unitsFor(p.pos+len(p.tokens))
		for u := p.from; u < p.need; u++ {
			switch sl.units[u].state {
			case unitEmpty:
				p.pages += up
			case unitOwned:
				p.reserved++
			}
		}
		p.cow = c.cowPagesLocked(p.s)
		p.pages += p.cow
		total += p.pages
		reserved += p.reserved
	}
	free := c.freePagesLocked()
	if total <= free {
		return nil
	}
	idle, surplus := c.reclaimableLocked(nil, 0)
	can := free + idle + c.evictablePagesLocked() + max(surplus-reserved*up, 0)
	if total <= can {
		return nil
	}
	sum := 0
	for _, p := range plan {
		if sum += p.pages; sum > can {
			return errors.WithHint(
				errors.Wrapf(driver.ErrOutOfMemory, "%s: needs %d pages of %s; the budget of %s can give %d; the sequence in slot %d (request %d, %d tokens at %d) is the first past them",
					what(), total, units.Bytes(c.g.page), units.Bytes(c.budget), can, p.s.sl.idx, p.i, len(p.tokens), p.pos),
				"step fewer sequences, free or preempt some, or raise the budget (SetBudget)")
		}
	}
	return errors.AssertionFailedf("%s: %d pages do not fit in %d, yet every prefix does", what(), total, can)
}

// undoStepLocked puts back the requests of plan the step has done, last
// first: their tokens, lengths and the units backed for them.
func (c *Cache) undoStepLocked(plan []stepPlan) error {
	var errs error
	for k := len(plan) - 1; k >= 0; k-- {
		p := &plan[k]
		if !p.done {
			continue
		}
		s := p.s
		s.generated.truncate(max(p.pos-len(s.prompt), 0))
		c.setLenLocked(s, p.pos)
		errs = errors.CombineErrors(errs, c.unbackLocked(s.sl, p.backed))
		p.done, p.backed = false, nil
	}
	return errs
}
