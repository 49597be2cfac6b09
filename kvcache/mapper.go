package kvcache

import (
	"runtime/debug"

	"github.com/cockroachdb/errors"
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

// nextJobLocked finds a running sequence short of room and marks its next
// unit committing; ok is false when there is none (or no budget for it).
func (c *Cache) nextJobLocked() (mapJob, bool) {
	job, ok := c.findJobLocked()
	if ok {
		job.sl.units[job.u].state = unitCommitting
		c.inflight += c.g.unitPages()
	}
	return job, ok
}

// findJobLocked finds the next unit to commit ahead, if any.
func (c *Cache) findJobLocked() (mapJob, bool) {
	if c.closed || c.cfg.MapAhead <= 0 {
		return mapJob{}, false
	}
	g := c.g
	for _, sl := range c.slotList {
		s := sl.seq
		if s == nil || s.state != seqRunning {
			continue
		}
		k := 0
		for k < len(sl.units) && (sl.units[k].state == unitOwned || sl.units[k].state == unitBorrowed) {
			k++
		}
		if k == len(sl.units) || sl.units[k].state != unitEmpty || c.storeBoundLocked(s, k) {
			continue
		}
		if g.roomIn(k)-s.n >= c.cfg.MapAhead || c.freePagesLocked() < g.unitPages() {
			continue
		}
		return mapJob{sl, k}, true
	}
	return mapJob{}, false
}

// mapOne commits one unit ahead; it reports whether it committed one (a
// failure, such as the device out of memory, ends the round: the unit is
// tried again at the next wake). A panic (a bug: no caller code runs here) is recorded for Check
// and the unit put back.
func (c *Cache) mapOne() (found bool) {
	c.mu.Lock()
	job, ok := c.nextJobLocked()
	c.mu.Unlock()
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
	if err != nil {
		job.sl.units[job.u].state = unitEmpty
		if errors.HasAssertionFailure(err) {
			c.lostErr = errors.CombineErrors(c.lostErr, err)
		}
		return false
	}
	job.sl.units[job.u].state = unitOwned
	job.sl.owned++
	c.pages += c.g.unitPages()
	c.counts.commits += c.g.regions
	c.counts.mapperCommits += c.g.regions
	c.checkAfter("map ahead")
	return true
}

// roomIn is the tokens units [0, k) hold whole.
func (g *geometry) roomIn(k int) int {
	if g.layout == PerLayer {
		return int(uint64(k) * g.page / g.row)
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
