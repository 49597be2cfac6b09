package kvcache

import (
	"fmt"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// The page pool: the slot range and the prefix store share an
// arena.Pool, so a page either decommits — an idle slot's reclaimed, a
// cached store unit evicted, a finished or preempted sequence's — is
// kept, unreleased, and the next commit of either maps it instead of
// creating one: under pressure a page costs an unmap and a map, not also
// a release and a create (the dearest driver calls on a GPU).
//
// The pool's pages are committed memory the books count apart from
// c.pages (Stats.PooledPages): c.pages plus the pool never exceed the
// budget. A decommit moves pages from c.pages to the pool and a commit
// back (creating only what the pool lacks, within the budget as always),
// so the sum only rises by what a commit creates, which the budget
// allows; a lowered budget trims the pool to what the budget leaves
// beside c.pages (SetBudget), and Close releases it.

// trimPoolLocked releases pooled pages until the pool fits in the budget
// beside the pages in use, and keeps its limit at the budget. A release
// the driver refuses is recorded for Check.
func (c *Cache) trimPoolLocked() {
	used := uint64(c.pages) * c.g.page
	err := c.pool.SetLimit(c.budget)
	err = errors.CombineErrors(err, c.pool.Trim(c.budget-min(used, c.budget)))
	if err != nil {
		c.lostErr = errors.CombineErrors(c.lostErr, errors.WithAssertionFailure(errors.Wrap(err, "kvcache: trim the page pool")))
	}
}

// pooledPages is the pages the pool keeps.
func (c *Cache) pooledPages() int { return int(c.pool.Bytes() / c.g.page) }

// checkPoolLocked checks the pool's books and that the pool fits in the
// budget beside the pages in use (once a lowered budget is met).
func (c *Cache) checkPoolLocked(fail func(string, ...any)) {
	if err := c.pool.Check(); err != nil {
		fail("the page pool: %v", err)
	}
	if c.pages <= c.budgetPages() && uint64(c.pages)*c.g.page+c.pool.Bytes() > c.budget {
		fail("%d pages in use and %d pooled exceed the budget of %d pages", c.pages, c.pooledPages(), c.budgetPages())
	}
}

// Warm readies pages pages for the next commits, ahead — while a step
// computes, or the engine idles — so that those commits only map: it
// creates pages for the page pool until it keeps pages of them, within
// the budget beside the pages in use; where the budget is spent, it takes
// idle slots' pages into the pool (longest idle first, as a commit
// would) and unmaps the kept mappings of the cached units that
// committing the rest would evict (least recently used first), the
// unmaps those commits would make. Where every free slot keeps units
// mapped, it unmaps those of the one an admission that no kept units
// match would take (the fewest kept): that admission's unmaps. It evicts
// no cached unit and takes nothing from a running sequence. The pool's
// chunks are the cache's units (a page, or a token-major group of
// several: the chunk a commit maps),
// so pages rounds up to whole units where the budget has room for them
// and down where it has not. A warmed page is committed memory
// (Stats.PooledPages), given back like any pooled page when the budget
// is lowered, at Close, or taken by the next commit. It returns the pages
// the pool keeps; a create the driver refuses ends it with the error, the
// pages created before it kept. It refuses a negative count (ErrInvalid)
// and a closed cache (ErrClosed).
func (c *Cache) Warm(pages int) (int, error) {
	what := func() string { return fmt.Sprintf("kvcache: warm the page pool to %d pages", pages) }
	if err := c.lockCount(what, pages); err != nil {
		return 0, err
	}
	defer c.unlock()
	// The pages the free budget cannot give will come from idle slots'
	// pages and then from evicting cached store units: the idle pages and
	// the kept mappings of those units go now, ahead, not under the
	// commit that takes them.
	if err := c.reclaimIdleLocked(pages, nil); err != nil {
		return c.pooledPages(), errors.Wrapf(err, "%s", what())
	}
	if err := c.unmapKeptAheadLocked(pages); err != nil {
		return c.pooledPages(), errors.Wrapf(err, "%s", what())
	}
	if err := c.clearSpareSlotLocked(); err != nil {
		return c.pooledPages(), errors.Wrapf(err, "%s", what())
	}
	return c.fillPoolLocked(what, pages)
}

// lockCount locks c for a call taking a count of pages (Warm,
// ClearKept): a cache made by New and not closed, and a count not
// negative (ErrInvalid). On success the caller holds c.mu and lets it go
// with c.unlock.
func (c *Cache) lockCount(what func() string, n int) error {
	if err := c.made(what); err != nil {
		return err
	}
	if n < 0 {
		return errors.Wrapf(driver.ErrInvalid, "%s: a negative count", what())
	}
	c.mu.Lock()
	if err := c.usableLocked(what); err != nil {
		c.unlock()
		return err
	}
	return nil
}

// fillPoolLocked creates pages for the pool until it keeps pages of them,
// in whole units, within the free budget, and returns the pages it keeps
// (Warm's fill). Every chunk of the pool is a unit: the slots and the
// store both commit unit by unit, in chunks of a unit each.
func (c *Cache) fillPoolLocked(what func() string, pages int) (int, error) {
	c.warmPages = pages
	upp := int(c.g.unitBytes / c.g.page)
	// Units, rounded up without the sum pages+upp-1, which wraps for a
	// count near math.MaxInt.
	want := min(pages/upp+b2i(pages%upp != 0), c.freePagesLocked()/upp)
	if want <= c.pooledPages()/upp {
		return c.pooledPages(), nil
	}
	_, err := c.pool.Fill(c.cfg.Device, c.g.unitBytes, want)
	c.checkAfter("warm")
	if err != nil {
		return c.pooledPages(), errors.Wrapf(err, "%s", what())
	}
	return c.pooledPages(), nil
}

// clearSpareSlotLocked unmaps, ahead, the kept units of the free slot an
// admission that no slot's kept units match would take (pickSlotLocked's
// fewest kept), where no free slot keeps nothing: the unmaps that
// admission would make on its path.
func (c *Cache) clearSpareSlotLocked() error {
	sl := c.fewestKeptFreeLocked()
	if sl == nil || sl.kept == 0 {
		return nil
	}
	return c.dropKeptLocked(sl)
}
