package kvcache

import (
	"fmt"
	"runtime/debug"

	"github.com/vmarena/vmarena/internal/errors"
)

// Mapping ahead: a goroutine of the cache's own commits, for every running
// sequence, the unit after its last committed one whenever fewer than
// MapAhead tokens of room remain, so that the next decode step finds its
// page mapped. It plans under the cache's lock (the unit is marked
// committing and its pages counted in flight, within the budget: it never
// reclaims, evicts or preempts), commits without it, and records the
// result under it again, broadcasting to whoever waits for the unit. An
// Append that finds its unit empty commits it itself, and one that finds it
// in flight waits: both count in Stats.Waits. Units that belong in the
// prefix store are left to Append.
//
// The goroutine never walks the slots: a slot whose sequence wants a unit
// ahead is listed (Cache.ahead) by the call that made it want one — an
// Admit, Append or Resume, a reclaim of its surplus (a raised budget only
// wakes the goroutine: its slots are listed already) — and the goroutine
// takes the list in order, a slot leaving it once it
// wants nothing. Whether a slot wants a unit is a look at the few units
// past its tokens that MapAhead reaches, not at the whole slot. Only
// those calls wake the goroutine, so a decode step whose pages are there
// costs it nothing.
//
// Invariants: c.ahead holds each slot whose aheadListed is set, once; a
// running sequence's slot that wants a unit ahead is listed (when mapping
// ahead is on); at most one unit is in flight, c.mapping's.

// mapper is the goroutine's handles; nil fields when MapAhead is off.
type mapper struct {
	wake chan struct{} // a buffered signal: something may need mapping
	stop chan struct{} // closed by Close
	done chan struct{} // closed by the goroutine when it returns
}

// startMapper starts the goroutine when mapping ahead is on.
func (c *Cache) startMapper() {
	if c.cfg.MapAhead <= 0 {
		return
	}
	c.mapper = mapper{wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go c.mapLoop()
}

func (c *Cache) mapLoop() {
	defer close(c.mapper.done)
	for {
		select {
		case <-c.mapper.stop:
			return
		case <-c.mapper.wake:
			for c.mapOne() {
				select {
				case <-c.mapper.stop:
					return
				default:
				}
			}
		}
	}
}

// wakeMapper tells the goroutine to look; it never blocks.
func (c *Cache) wakeMapper() {
	if c.mapper.wake == nil {
		return
	}
	select {
	case c.mapper.wake <- struct{}{}:
	default:
	}
}

// stopMapper stops the goroutine and waits for it (once; later calls
// return at once).
func (c *Cache) stopMapper() {
	c.stopOnce.Do(func() {
		if c.mapper.stop != nil {
			close(c.mapper.stop)
			<-c.mapper.done
		}
	})
}

// mapJob is one unit to commit ahead.
type mapJob struct {
	sl *slot
	u  int
}

func (j mapJob) String() string {
	if j.sl == nil {
		return "none"
	}
	return fmt.Sprintf("unit %d of slot %d", j.u, j.sl.idx)
}

// nextJobLocked finds a running sequence short of room and marks its next
// unit committing; ok is false when there is none (or no budget for it).
func (c *Cache) nextJobLocked() (mapJob, bool) {
	job, ok := c.findJobLocked()
	if ok {
		c.setUnitLocked(job.sl, job.u, unitCommitting, nil)
		c.inflight += c.g.unitPages()
		c.mapping = job
	}
	return job, ok
}

// findJobLocked finds the next unit to commit ahead, if any: the first
// listed slot's, once the slots before it that want none have left the
// list. With a unit in flight, or no budget for one, there is none now
// (the list waits for the next wake).
func (c *Cache) findJobLocked() (mapJob, bool) {
	if c.closed || c.cfg.MapAhead <= 0 || c.mapping.sl != nil {
		return mapJob{}, false
	}
	for len(c.ahead) > 0 {
		sl := c.ahead[0]
		if u, ok := c.aheadUnitLocked(sl); ok {
			if c.freePagesLocked() < c.g.unitPages() {
				return mapJob{}, false
			}
			return mapJob{sl, u}, true
		}
		c.ahead[0] = nil
		c.ahead = c.ahead[1:]
		sl.aheadListed = false
	}
	return mapJob{}, false
}

// aheadUnitLocked is the unit sl's sequence wants mapped ahead, if any:
// the first unit past its tokens that is not committed, when it is empty,
// not the prefix store's, and fewer than MapAhead tokens of room lie
// before it. Only the units that room reaches are looked at.
func (c *Cache) aheadUnitLocked(sl *slot) (int, bool) {
	s := sl.seq
	if s == nil || s.state != seqRunning {
		return 0, false
	}
	g := c.g
	for k := g.unitsFor(s.n); k < len(sl.units) && g.roomIn(k)-s.n < c.cfg.MapAhead; k++ {
		switch sl.units[k].state {
		case unitOwned, unitBorrowed:
			continue
		case unitEmpty:
			return k, !c.storeBoundLocked(s, k)
		}
		return 0, false // being committed
	}
	return 0, false
}

// wantAheadLocked lists sl for the mapper, and wakes it, when its
// sequence wants a unit mapped ahead.
func (c *Cache) wantAheadLocked(sl *slot) {
	if c.cfg.MapAhead <= 0 {
		return
	}
	if _, ok := c.aheadUnitLocked(sl); !ok {
		return
	}
	if !sl.aheadListed {
		sl.aheadListed = true
		c.ahead = append(c.ahead, sl)
	}
	c.wakeMapper()
}

// checkAheadLocked checks the mapper's list against the slots.
func (c *Cache) checkAheadLocked(fail func(string, ...any)) {
	in := map[*slot]int{}
	for _, sl := range c.ahead {
		in[sl]++
	}
	listed := 0
	for i, sl := range c.slotList {
		listed += in[sl]
		switch {
		case in[sl] > 1 || (in[sl] == 1) != sl.aheadListed:
			fail("slot %d is in the mapping-ahead list %d times, listed %t", i, in[sl], sl.aheadListed)
		case c.cfg.MapAhead <= 0 && sl.aheadListed:
			fail("slot %d is listed for mapping ahead, which is off", i)
		}
		if u, want := c.aheadUnitLocked(sl); want && !sl.aheadListed {
			fail("slot %d wants unit %d mapped ahead but is not listed", i, u)
		}
	}
	if listed != len(c.ahead) {
		fail("the mapping-ahead list holds %d entries, %d of them slots of the cache", len(c.ahead), listed)
	}
}

// mapOne commits one unit ahead; it reports whether it committed one (a
// failure, such as the device out of memory, ends the round: the unit is
// tried again at the next wake). A panic (a bug: no caller code runs here) is recorded for Check
// and the unit put back.
func (c *Cache) mapOne() (found bool) {
	job, ok := c.planAhead()
	if !ok {
		return false
	}
	var err error
	func() {
		defer func() {
			if r := recover(); r != nil {
				err = errors.AssertionFailedf("kvcache: mapping ahead panicked: %v\n%s", r, debug.Stack())
			}
		}()
		err = c.commitRegions(job.sl, job.u, job.u+1)
	}()
	c.mu.Lock()
	defer c.mu.Unlock()
	defer c.cond.Broadcast()
	c.inflight -= c.g.unitPages()
	c.mapping = mapJob{}
	if err != nil {
		c.setUnitLocked(job.sl, job.u, unitEmpty, nil)
		job.sl.trimLocked()
		if errors.HasAssertionFailure(err) {
			c.lostErr = errors.CombineErrors(c.lostErr, err)
		}
		return false
	}
	c.setUnitLocked(job.sl, job.u, unitOwned, nil)
	c.pages += c.g.unitPages()
	c.counts.commits += c.g.regions
	c.counts.mapperCommits += c.g.regions
	c.checkAfter("map ahead")
	return true
}

// planAhead finds and marks the next unit to commit ahead. A Hybrid's
// group plans under the Hybrid's lock (lockrank KVHybrid before
// KVCache), granted the one budget's free memory and tightened after, as
// any call into a group is (hybrid_share.go): the unit's pages, counted
// in flight, are the group's from then on, so the groups never hold more
// than the one budget; a closed Hybrid plans nothing.
func (c *Cache) planAhead() (mapJob, bool) {
	if h := c.share; h != nil {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.closed {
			return mapJob{}, false
		}
		c.shareGrant(h.freeLocked())
		defer c.shareGrant(0)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nextJobLocked()
}

// roomIn is the tokens units [0, k) hold whole.
func (g *geometry) roomIn(k int) int {
	if g.layout != TokenMajor {
		return int(uint64(k) * g.page / g.stride)
	}
	return k * g.tpg
}

// commitRegions commits units [u0, u1) of sl in every region, touching no
// book (the caller records them): on failure nothing stays committed.
func (c *Cache) commitRegions(sl *slot, u0, u1 int) error {
	n := uint64(u1-u0) * c.g.unitBytes
	for r := 0; r < c.g.regions; r++ {
		if err := c.slots.Commit(c.slotOff(sl, r, u0), n); err != nil {
			var undo error
			for q := 0; q < r; q++ {
				undo = errors.CombineErrors(undo, c.slots.Decommit(c.slotOff(sl, q, u0), n))
			}
			if undo != nil {
				err = errors.CombineErrors(err, errors.WithAssertionFailure(undo))
			}
			return errors.Wrapf(err, "kvcache: commit units [%d, %d) of slot %d", u0, u1, sl.idx)
		}
	}
	return nil
}
