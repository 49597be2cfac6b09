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
