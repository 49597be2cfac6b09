package kvcache

import (
	"fmt"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// Spare is what GiveBack could give back now, in bytes: the budget no
// group holds, and what every group gives back before it preempts
// (pooled pages, cached prefix units, idle slots' pages, pages running
// sequences hold past their tokens) with the recurrent store's
// checkpoints — everything but what the running sequences' tokens and
// states hold, and never the budget's last page. It is 0 for a nil, zero
// or closed cache.
func (h *Hybrid) Spare() uint64 {
	if h == nil || h.groups == nil {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return 0
	}
	return h.spareLocked()
}

// spareLocked is Spare.
func (h *Hybrid) spareLocked() uint64 {
	n := h.freeLocked()
	for _, g := range h.groups {
		if g.c != nil {
			n += g.c.shareSpare()
		}
	}
	if h.rec != nil {
		n += h.rec.evictable(nil)
	}
	page := h.cfg.PageSize
	return min(n, h.budget-min(page, h.budget)) / page * page
}

// GiveBack lowers the budget by up to want bytes (rounded up to whole
// pages), giving back only what Spare counts, in SetBudget's order:
// pooled pages, then cached prefix units and checkpoints, then idle
// slots' pages, then surplus. It never preempts a sequence, and the
// budget keeps at least one page. It returns the bytes the budget went
// down by (0 when nothing is spare). A zero want is refused (ErrInvalid)
// with nothing changed; a closed cache is ErrClosed.
//
// Under a shared budget this is a member's answer to a request to give
// memory back (Cache.GiveBack's, for a model of several layer groups):
// after it the groups' memory fits in the budget, lowered, so the caller
// may release what it returns.
func (h *Hybrid) GiveBack(want uint64) (uint64, error) {
	what := func() string { return fmt.Sprintf("kvcache: hybrid: give back %s of the budget", units.Bytes(want)) }
	if err := h.lock(what); err != nil {
		return 0, err
	}
	defer h.unlock()
	if want == 0 {
		return 0, errors.Wrapf(driver.ErrInvalid, "%s: nothing asked", what())
	}
	page := h.cfg.PageSize
	ask := min(want, ^uint64(0)-page) + page - 1
	give := min(ask/page*page, h.spareLocked())
	if give == 0 {
		return 0, nil
	}
	h.budget -= give
	if err := h.makeFreeLocked(0, -1, nil, nil); err != nil {
		return give, errors.WithAssertionFailure(errors.Wrapf(err, "%s: Spare counted %s", what(), units.Bytes(give)))
	}
	return give, nil
}

// SeqBytes is the memory an admission of a prompt of n tokens (at most
// MaxContext), appended in one call, commits, nothing shared: in each
// attention group the whole units its tokens reach — a sliding-window
// group's too, which holds every token of an Append until the next one
// releases those behind its window; a ring group's rings — and a
// recurrent state slot. It is what a shared budget's member grows by to
// admit such a sequence (budget/kvmember). 0 for a nil, zero or closed
// cache, or n below 1.
func (h *Hybrid) SeqBytes(n int) uint64 {
	if h == nil || h.groups == nil || n <= 0 {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return 0
	}
	n = min(n, h.cfg.MaxContext)
	var bytes uint64
	for _, g := range h.groups {
		c := g.c
		if c == nil {
			continue
		}
		if c.g.ring > 0 {
			bytes += uint64(c.g.ringPages()) * c.g.page
			continue
		}
		bytes += uint64(c.g.unitsFor(n)) * uint64(c.g.unitPages()) * c.g.page
	}
	if h.rec != nil {
		bytes += h.rec.slotBytes
	}
	return bytes
}

// Closed reports whether the cache was closed (true for a nil or zero
// cache).
func (h *Hybrid) Closed() bool {
	if h == nil || h.groups == nil {
		return true
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.closed
}

// Reserve commits, ahead of the Append that will hold them, the pages of
// the sequence's next n tokens past Len in every attention group, as
// many as fit in the free budget and the group's own idle and cached
// pages (Seq.Reserve in each: its cached units evicted as that group's
// Append would; nothing preempted, no running sequence's pages taken;
// Len unchanged; a group's pages reserved are its surplus until its
// tokens reach them), and returns how many of the n tokens have their
// pages in every group, from the first — fewer when those run out,
// which the Append then commits itself, making room as it does. It is
// what an engine that schedules a step ahead calls for the next step's
// prompt chunk, so that the driver's latency hides behind the step
// before. It refuses a preempted sequence, a negative n or one past
// MaxContext (ErrInvalid), a freed sequence or closed cache (ErrClosed);
// a refusal changes nothing.
func (s *HybridSeq) Reserve(n int) (int, error) {
	what := func() string { return fmt.Sprintf("kvcache: hybrid: reserve %d tokens ahead", n) }
	h, err := s.lock(what)
	if err != nil {
		return 0, err
	}
	defer h.unlock()
	switch {
	case !s.running:
		return 0, errors.Wrapf(driver.ErrInvalid, "%s: the sequence is preempted; Resume it first", what())
	case n < 0 || n > h.cfg.MaxContext-s.n:
		return 0, errors.Wrapf(driver.ErrInvalid, "%s: a sequence of %d tokens takes 0 to %d more (MaxContext %d)",
			what(), s.n, h.cfg.MaxContext-s.n, h.cfg.MaxContext)
	}
	got := n
	for i, gs := range s.seqs {
		if gs == nil || n == 0 {
			continue
		}
		ahead := gs.Len() - s.n // tokens the group holds past Len (a recompute resume's)
		if ahead >= n {
			continue
		}
		var k int
		if err := h.runLocked(i, need{}, nil, func(*Cache) error {
			var err error
			k, err = gs.Reserve(n - ahead)
			return err
		}); err != nil {
			return 0, errors.Wrapf(err, "%s: group %d (%s)", what(), i, h.groups[i].Kind)
		}
		got = min(got, ahead+k)
	}
	return got, nil
}

// Warm creates pages for the attention groups' page pools until each
// keeps what a new sequence's first tokens tokens need there (the whole
// units they reach, and one a prompt chunk may straddle), within the free
// budget: it gives nothing back, and where the free budget holds less
// than every group wants it shares it in proportion to what each lacks.
// It is the creates the next admissions' commits would make, made ahead
// — while a step computes, or the engine idles — so that those commits
// only map (Cache.Warm, for every group at once). Warmed pages are
// committed memory, the first any group gives back (GiveBack, SetBudget,
// another group's growth). Ring groups, whose pages are committed whole
// at a sequence's first Append, are left out. It returns the bytes the
// pools keep; a create the driver refuses ends it with the error, the
// pages created before it kept. It refuses a negative count or one past
// MaxContext (ErrInvalid) and a closed cache (ErrClosed).
func (h *Hybrid) Warm(tokens int) (uint64, error) { return h.WarmAtMost(tokens, -1) }

// WarmAtMost is Warm creating at most pages pages in all (negative: no
// bound), shared among the groups as the free budget is: a filler that
// runs while a step computes asks for what the step's time pays for,
// and the next call goes on from there.
func (h *Hybrid) WarmAtMost(tokens, pages int) (uint64, error) {
	what := func() string { return fmt.Sprintf("kvcache: hybrid: warm the page pools for %d tokens", tokens) }
	if err := h.lock(what); err != nil {
		return 0, err
	}
	defer h.unlock()
	if tokens < 0 || tokens > h.cfg.MaxContext {
		return 0, errors.Wrapf(driver.ErrInvalid, "%s: want 0 to MaxContext (%d)", what(), h.cfg.MaxContext)
	}
	page := h.cfg.PageSize
	// want[i] is group i's pool target in pages, have[i] what it keeps.
	want, have := make([]int, len(h.groups)), make([]int, len(h.groups))
	var lack uint64
	for i, g := range h.groups {
		c := g.c
		if c == nil || c.g.ring > 0 {
			continue
		}
		if tokens > 0 {
			want[i] = min(c.g.unitsFor(tokens)+1, c.g.units) * c.g.unitPages()
		}
		have[i] = int(c.pool.Bytes() / page)
		lack += uint64(max(want[i]-have[i], 0))
	}
	free := h.freeLocked() / page
	if pages >= 0 {
		free = min(free, uint64(pages))
	}
	if lack > free {
		// Shares in proportion to what each lacks, rounded down, and the
		// pages that rounding leaves to the first groups still short.
		short := make([]int, len(want))
		left := free
		for i := range want {
			if short[i] = max(want[i]-have[i], 0); short[i] > 0 {
				share := uint64(short[i]) * free / lack
				want[i] = have[i] + int(share)
				short[i] -= int(share)
				left -= share
			}
		}
		for i := range want {
			if left == 0 {
				break
			}
			if short[i] > 0 {
				want[i]++
				left--
			}
		}
	}
	return h.fillPoolsLocked(what, want, false)
}

// WarmBudget creates pages for the attention groups' page pools with the
// free budget, at most pages pages in all (negative: no bound), as an
// engine that owns its device fills its KV memory at start-up: shared
// among the groups in proportion to the bytes a token keeps in each, a
// window group's share at most what its slots' windows can hold
// (MaxSeqs windows and a unit each), the rest to the other groups. A
// share the mix of sequences proves wrong costs a release and a create a
// page: from then on a group that needs more than the free budget and
// its own pool takes the others' pooled pages before it evicts its own
// cached units. A window group's pool keeps its share across the pages
// its windows give back. Ring groups are left out. It returns the bytes
// the pools keep; a create the driver refuses ends it with the error,
// the pages created before it kept. A closed cache is ErrClosed.
func (h *Hybrid) WarmBudget(pages int) (uint64, error) {
	what := func() string { return "kvcache: hybrid: warm the page pools with the budget" }
	if err := h.lock(what); err != nil {
		return 0, err
	}
	defer h.unlock()
	h.budgetWarmed = true
	page := h.cfg.PageSize
	free := h.freeLocked() / page
	if pages >= 0 {
		free = min(free, uint64(pages))
	}
	// weight[i] is group i's bytes a token; most[i] the pages its pool
	// can use (no bound: 1<<62).
	n := len(h.groups)
	weight, most, want := make([]uint64, n), make([]uint64, n), make([]int, n)
	for i, g := range h.groups {
		c := g.c
		if c == nil || c.g.ring > 0 {
			continue
		}
		weight[i] = uint64(2*c.cfg.Layers) * c.g.row
		most[i] = 1 << 62
		if g.windowHeld {
			most[i] = uint64(c.cfg.MaxSeqs) * uint64(c.g.unitsFor(c.cfg.Window)+1) * uint64(c.g.unitPages())
		}
		want[i] = int(c.pool.Bytes() / page)
	}
	// Shares by weight, capped; what a cap leaves goes round again to
	// the groups below theirs (a pass per capped group at most).
	for left := free; left > 0; {
		var sum uint64
		for i := range weight {
			if uint64(want[i]) < most[i] {
				sum += weight[i]
			}
		}
		if sum == 0 {
			break
		}
		given := uint64(0)
		for i := range weight {
			if uint64(want[i]) >= most[i] || weight[i] == 0 {
				continue
			}
			share := min(left*weight[i]/sum, most[i]-uint64(want[i]))
			if share == 0 && given == 0 {
				share = min(left, most[i]-uint64(want[i])) // the rounding's pages, to the first
			}
			want[i] += int(share)
			given += share
		}
		if given == 0 {
			break
		}
		left -= given
	}
	return h.fillPoolsLocked(what, want, true)
}

// fillPoolsLocked fills each attention group's pool (ring groups left
// out) to want[i] pages, budget marking the fill as WarmBudget's (the
// window groups keep it: budgetWarmPages), and returns the bytes the
// pools keep; a create the driver refuses ends it with the error.
func (h *Hybrid) fillPoolsLocked(what func() string, want []int, budget bool) (uint64, error) {
	var errs error
	for i, g := range h.groups {
		if g.c == nil || g.c.g.ring > 0 {
			continue
		}
		gw := h.groupWhat(what, i)
		if errs = h.runLocked(i, need{}, nil, func(c *Cache) error {
			c.mu.Lock()
			defer c.unlock()
			if budget {
				c.budgetWarmPages = want[i]
			}
			_, err := c.fillPoolLocked(gw, want[i])
			return err
		}); errs != nil {
			break
		}
	}
	var pooled uint64
	for _, g := range h.groups {
		if g.c != nil {
			pooled += g.c.pool.Bytes()
		}
	}
	return pooled, errs
}
