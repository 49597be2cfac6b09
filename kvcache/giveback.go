package kvcache

import (
	"fmt"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// Spare is what GiveBack could give back now, in bytes (whole pages): the
// budget not committed (pooled pages included, which a lowered budget
// releases), the pages of idle slots, cached prefix store units and the
// pages running sequences hold beyond their tokens — everything but the
// pages that hold a running sequence's tokens, and never the budget's
// last page. It is 0 for a nil, zero or closed cache.
func (c *Cache) Spare() uint64 {
	if c == nil || c.slots == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0
	}
	return uint64(c.sparePagesLocked()) * c.g.page
}

// sparePagesLocked is Spare in pages, the commits in flight counted as
// committed.
func (c *Cache) sparePagesLocked() int {
	idle, surplus := c.reclaimableLocked(nil, 0)
	spare := max(c.freePagesLocked(), 0) + idle + c.evictablePagesLocked() + surplus
	return max(min(spare, c.budgetPages()-1), 0)
}

// GiveBack lowers the budget by up to want bytes (rounded up to whole
// pages), giving back only what Spare counts, in SetBudget's order: the
// budget not committed and the pooled pages, then idle slots' pages,
// cached prefix store units and surplus pages. It never preempts a
// sequence, and the budget keeps at least one page. It returns the bytes
// the budget went down by (0 when nothing is spare). A zero want is
// refused (ErrInvalid) with nothing changed; a closed cache is
// ErrClosed.
//
// Under a shared budget this is a member's answer to a request to give
// memory back: after it the cache's committed memory fits in the budget,
// lowered, so the caller may release what it returns.
func (c *Cache) GiveBack(want uint64) (uint64, error) {
	what := func() string { return fmt.Sprintf("kvcache: give back %s of the budget", units.Bytes(want)) }
	if err := c.made(what); err != nil {
		return 0, err
	}
	if want == 0 {
		return 0, errors.Wrapf(driver.ErrInvalid, "%s: nothing asked", what())
	}
	c.mu.Lock()
	defer c.unlock()
	if err := c.usableLocked(what); err != nil {
		return 0, err
	}
	// The commits in flight land first: what is spare is then exact.
	for c.inflight > 0 {
		c.cond.Wait()
		if err := c.usableLocked(what); err != nil {
			return 0, err
		}
	}
	// Rounded up without the sum want+page-1, which wraps near the top
	// of uint64 (a caller asking for everything).
	pages := int(min(want/c.g.page+uint64(b2i(want%c.g.page != 0)), uint64(1)<<40))
	give := min(pages, c.sparePagesLocked())
	if give == 0 {
		return 0, nil
	}
	before := c.budget
	// Less give pages exactly: a budget past the pages the books count
	// (budgetPages caps them) goes down by give pages, not to the cap.
	c.budget -= uint64(give) * c.g.page
	defer c.checkAfter("give back")
	defer c.trimPoolLocked()
	for _, step := range []func() error{
		func() error { return c.reclaimIdleLocked(0, nil) },
		func() error { return c.evictLocked(0) },
		func() error { return c.reclaimSurplusLocked(0, nil, 0) },
	} {
		if c.freePagesLocked() >= 0 {
			break
		}
		if err := step(); err != nil {
			// What was given back stays given back; the budget stays
			// where the cache's pages allow.
			c.budget = max(c.budget, uint64(c.pages)*c.g.page)
			return before - min(before, c.budget), errors.Wrapf(err, "%s", what())
		}
	}
	if c.freePagesLocked() < 0 {
		return 0, errors.AssertionFailedf("%s: %d pages stay committed over a budget of %d with %d counted spare", what(), c.pages, c.budgetPages(), give)
	}
	c.wakeMapper()
	return before - c.budget, nil
}
