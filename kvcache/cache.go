package kvcache

import (
	"fmt"
	"slices"
	"sync"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/invariants"
	"github.com/vmarena/vmarena/internal/isnil"
	"github.com/vmarena/vmarena/internal/lockrank"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/stream"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/vaspace"
)

// unitState is where a unit of a slot stands (see the package doc).
type unitState uint8

const (
	unitEmpty      unitState = iota // reserved address space only
	unitOwned                       // the slot's own pages, committed in the slot range
	unitBorrowed                    // a prefix store unit's pages, mapped here
	unitCommitting                  // being committed by the mapper, pages counted in flight
	// unitKept is a store unit's pages left mapped where a sequence that
	// ended or was preempted borrowed them (kept.go): no page of the
	// slot's, reused by the slot's next sequence if its match holds the
	// same unit there, unmapped otherwise.
	unitKept
)

// unitInfo is one unit of a slot: all its regions' pages together.
type unitInfo struct {
	state unitState
	su    *storeUnit // the store unit mapped here, when borrowed or kept
	// ro says a kept unit is mapped read-only; ki is its place in
	// su.keptIn (kept.go).
	ro bool
	ki int32
}

// slot is one of MaxSeqs stretches of the slot range, each g.slotBytes
// long, at idx*g.slotBytes.
//
// Invariants: owned, borrowed, surplus and hi are as books.go says; a
// slot holds at most one sequence (seq), and a running sequence's units
// below unitsFor(Len) are all owned or borrowed; an idle slot (seq nil)
// or a preempted sequence's slot borrows nothing; covers are live
// read-only views (arena.Sparse.ViewReadOnly) of units [coverLo,
// coverUnits) of every region, and coverUnits never exceeds the units its
// sequence's tokens fill. In a window cache (Config.Window) the units
// below lo lie wholly behind its running sequence's window and are empty
// or kept (window.go, kept.go); lo is 0 in every other slot.
type slot struct {
	idx                      int
	units                    []unitInfo
	owned, borrowed, surplus int
	kept                     int // units in state kept (kept.go)
	hi                       int
	seq                      *Seq
	freedAt                  uint64 // tick of the last Free, for reclaiming idle slots oldest first
	// cleared says ClearKept has unmapped the units the slot's last
	// sequence left kept above the last one a match borrowed (kept.go);
	// false again when a sequence leaves the slot, or a match first
	// borrows a unit the slot keeps.
	cleared bool
	// idleListed says the slot is in the cache's idle list, between
	// idlePrev and idleNext; admitting keeps it out while Admit matches a
	// prompt into it.
	idleListed, admitting bool
	idlePrev, idleNext    *slot
	// aheadListed says the slot is in the mapper's list (mapper.go).
	aheadListed bool
	// shared is the units [0, shared) its sequence maps from the prefix
	// store because a match found them (Admit, Resume): other sequences
	// read the same pages, so they are read-only to this one — refused to
	// the writes of its tensors (tensor.NewLeasedReadOnly), and mapped
	// read-only when the cache protects them (Cache.protects). Units a
	// sequence put in the store itself stay writable to it.
	shared     int
	covers     []*arena.View
	coverUnits int
	coverLo    int
	// lo is the first unit a window sequence holds: those below were
	// released behind its window (window.go).
	lo int
	// ring says the slot's rings are committed and mapped (ring.go).
	ring bool
	// lease ends every tensor handed out over the slot's memory (Append's
	// rows, K, V) when that memory is about to go: revoked before the
	// covers are released for a decommit, at the end of the sequence and
	// at a preemption, so a caller's stale tensor answers ErrClosed rather
	// than faulting. nil until the next tensor is made.
	lease *tensor.Lease
}

// leaseLocked is the lease the slot's next tensor is made under: a new
// one in place of a lease a drain stopped (drainLocked) once no access
// under it is in flight — none can start, so no revoke needs to wait for
// it — as when the call that drained it then refused or gave up (a
// Preempt whose swap found no host memory, a SetBudget that planned
// again). A stopped lease with accesses in flight stays, and tensors asked
// for meanwhile are refused (ErrClosed): the revoke that follows must
// wait for them.
func (sl *slot) leaseLocked() *tensor.Lease {
	if sl.lease == nil || (sl.lease.Revoked() && sl.lease.Idle()) {
		sl.lease = tensor.NewLease()
	}
	return sl.lease
}

// revokeLocked ends every tensor handed out over sl's memory so far. It
// waits for the accesses in flight under c.mu: the calls that revoke a
// live sequence's lease (Free, Preempt, SetBudget, Close) drain it first
// (drainLocked), so that it waits for nothing longer than an access
// backing out at the check.
func (sl *slot) revokeLocked() {
	sl.lease.Revoke()
	sl.lease = nil
}

// Cache is a KV cache: MaxSeqs sequence slots in one reserved range, pages
// committed as tokens arrive. Safe for concurrent use.
type Cache struct {
	cfg   Config
	g     *geometry
	space *vaspace.Space
	mem   *physical.Memory
	// slots is the slot range: slot i is [i*slotBytes, (i+1)*slotBytes).
	// Only the cache commits, borrows or decommits in it.
	slots *arena.Sparse
	// addressable says the process addresses the memory; bytes says there
	// are bytes at all (not the sim driver); views says tensors are handed
	// out: host tensors where the memory is addressable, device tensors
	// (an address and a length, bytes moved by the driver's copies) where
	// it is not (CUDA, AscendCL), none on the sim driver (bytes false:
	// the cache keeps the books only).
	addressable, bytes, views bool
	// protects says a slot's shared units are mapped read-only (Grant of
	// AccessRead): on every driver until one answers ErrUnsupported. The
	// slot's covers are read-only views (arena.Sparse.ViewReadOnly), which
	// keep their memory readable but let it be read-only: on the host
	// driver the shared units' pages are mapped read-only under the
	// tensors, whose refusal (tensor.NewLeasedReadOnly) guards the writes
	// a caller makes through them.
	protects bool

	// mu guards every field below and every slot and sequence. Arena
	// calls are made under it, but for the mapper's commits (in flight,
	// counted in inflight, their units marked unitCommitting). cond
	// (on mu) is broadcast when a commit in flight ends.
	mu       lockrank.Mutex[lockrank.KVCache]
	cond     *sync.Cond
	budget   uint64
	pages    int // pages committed: units owned by slots, plus store pages
	inflight int // pages the mapper is committing
	slotList []*slot
	seqs     map[*Seq]struct{} // live sequences: running or preempted
	tick     uint64
	counts   counters
	// The counters of books.go, kept as units, lengths and states change.
	ownedUnits, idleUnits, surplusUnits int
	// behindUnits is the units released behind running sequences'
	// windows: the sum of their slots' lo (window.go).
	behindUnits int
	// ringPages are the pages of the slots' rings (ring.go), counted in
	// pages; ringExcess the tokens of running ring sequences past their
	// last Window (what the rings hold no more).
	ringPages, ringExcess  int
	running, runningTokens int
	keptUnits              int // the slots' kept units (kept.go)
	// idleHead and idleTail are the idle list (books.go): the slots
	// holding no sequence that own units, longest idle first.
	idleHead, idleTail *slot
	// ahead lists the slots whose sequence may want a unit mapped ahead,
	// in the order they asked; mapping is the unit the mapper is
	// committing (its sl nil when none) — see mapper.go.
	ahead   []*slot
	mapping mapJob
	closed  bool
	// lostErr records what went wrong where no caller could be told (the
	// mapper, a store unit's release on give-back): a bug, for Check.
	lostErr error

	mapper   mapper
	stopOnce sync.Once
	// str copies bytes (swap, partly shared pages); nil on a driver
	// without streams or without bytes.
	str *stream.Stream
	// ps is the prefix store (see store.go).
	ps prefixStore
	// ring owns the pages of the slots' rings (ring.go); nil without
	// Config.Ring.
	ring *arena.Sparse
	// ev is the KV events queued for Config.Events (events.go).
	ev eventQueue
	// asked is the prompt CanAdmit was last asked about (plan.go).
	asked asked
	// stepPlan is Step's working memory, kept between steps (step.go).
	stepPlan []stepPlan
	// pool keeps the pages both ranges decommit for their next commits
	// (pool.go): committed memory outside pages, within the budget.
	// warmPages is the pool's size the last fill asked for (Warm), which a
	// window cache's bound on its pool keeps (windowPoolPages), and
	// budgetWarmPages the size a Hybrid's WarmBudget filled it to, which the
	// bound keeps too.
	pool                       *arena.Pool
	warmPages, budgetWarmPages int
	// share is the Hybrid whose group the cache is (nil: none): the
	// mapper plans under its lock, granted its free memory.
	share *Hybrid
}

// counters are the cumulative figures of Stats.
type counters struct {
	admits, frees, steps, waits        int
	commits, borrows, decommits        int
	queries, hits, copies              int
	evictions, evictedPages            int
	reclaims, reclaimedPages           int
	preemptions, swaps, drops, resumes int
	mapperCommits                      int
	copiedBytes, swappedBytes          uint64
	failedAdmits, failedResumes        uint64
	forks, cowCopies                   int
	failedForks, cowBytes              uint64
	windowReleases, windowUnits        int
	keptReused, keptDropped            int
}

// New makes a cache of cfg's shape on space and mem: it reserves the
// address space of every slot (nothing is committed) and checks cfg,
// refusing anything it cannot hold (ErrInvalid, naming the field).
func New(space *vaspace.Space, mem *physical.Memory, cfg Config) (*Cache, error) {
	return newCache(space, mem, cfg, nil)
}

// newCache is New of a cache that is share's group (nil: a cache of its
// own).
func newCache(space *vaspace.Space, mem *physical.Memory, cfg Config, share *Hybrid) (*Cache, error) {
	if isnil.Is(space) || isnil.Is(mem) {
		return nil, errors.Wrap(driver.ErrInvalid, "kvcache: new cache: the address space or the physical memory is nil")
	}
	drv := space.Driver()
	if isnil.Is(drv) || isnil.Is(mem.Driver()) {
		return nil, errors.Wrap(driver.ErrInvalid, "kvcache: new cache: the address space or the physical memory has no driver (made with vaspace.New and physical.New of an open driver?)")
	}
	if err := driver.CheckComparable(func() string { return "kvcache: new cache" }, drv); err != nil {
		return nil, err
	}
	if !driver.Same(mem.Driver(), drv) {
		return nil, errors.Wrap(driver.ErrInvalid, "kvcache: new cache: the address space and the physical memory are on different drivers")
	}
	g, err := cfg.check(drv.Devices(), drv.Granularity())
	if err != nil {
		return nil, err
	}
	if cfg.Ring && cfg.Layout != PerLayer {
		return nil, errors.WithHint(errors.Wrapf(driver.ErrUnsupported, "kvcache: new cache: a Ring in the %s layout: only PerLayer gives each layer's K and V a region of its own to make a ring of", cfg.Layout),
			"Layout: kvcache.PerLayer (or AutoLayout)")
	}
	if cfg.Ring && !cfg.NoPrefixSharing {
		return nil, errors.WithHint(errors.Wrap(driver.ErrUnsupported, "kvcache: new cache: a Ring with prefix sharing on: a ring's pages are written over as it wraps, so no page stays one prompt's to share (set NoPrefixSharing)"),
			"set NoPrefixSharing with Ring")
	}
	u, err := mem.Usage(cfg.Device)
	if err != nil {
		return nil, errors.Wrapf(err, "kvcache: new cache")
	}
	if cfg.Budget == 0 {
		cfg.Budget = u.Capacity
	}
	pool, err := arena.NewPool(mem, cfg.Budget)
	if err != nil {
		return nil, errors.Wrapf(err, "kvcache: new cache")
	}
	slots, err := arena.NewSparse(space, mem, arena.SparseOptions{
		Max: g.slotBytes * uint64(cfg.MaxSeqs), ChunkSize: g.page, MaxChunk: g.unitBytes, Device: cfg.Device, Pool: pool,
	})
	if err != nil {
		return nil, errors.CombineErrors(errors.Wrapf(err, "kvcache: new cache of %d slots of %s (%s)", cfg.MaxSeqs, units.Bytes(g.slotBytes), g), pool.Close())
	}
	c := &Cache{cfg: cfg, g: g, space: space, mem: mem, slots: slots, pool: pool,
		addressable: slots.HostAddressable(), bytes: drv.Devices()[cfg.Device].Kind != driver.KindSim,
		budget: cfg.Budget, seqs: map[*Seq]struct{}{}, protects: true, ev: eventQueue{max: maxQueuedEvents}, share: share}
	c.views = c.bytes
	c.cond = sync.NewCond(&c.mu)
	if err := c.openStore(u.Capacity); err != nil {
		return nil, errors.CombineErrors(err, errors.CombineErrors(slots.Close(), pool.Close()))
	}
	if err := c.openRing(); err != nil {
		return nil, errors.CombineErrors(err, errors.CombineErrors(slots.Close(), pool.Close()))
	}
	c.slotList = make([]*slot, cfg.MaxSeqs)
	for i := range c.slotList {
		c.slotList[i] = &slot{idx: i, units: make([]unitInfo, g.units)}
	}
	if c.bytes && drv.Supports(driver.FeatureStreams) {
		if c.str, err = stream.New(drv, cfg.Device); err != nil {
			err = errors.CombineErrors(errors.Wrap(err, "kvcache: new cache: a stream for copies"), slots.Close())
			if c.ps.s != nil {
				err = errors.CombineErrors(err, c.ps.s.Close())
			}
			if c.ring != nil {
				err = errors.CombineErrors(err, c.ring.Close())
			}
			return nil, errors.CombineErrors(err, pool.Close())
		}
	}
	c.startMapper()
	return c, nil
}

// usable refuses a nil or zero cache (ErrInvalid) and a closed one
// (ErrClosed). mu must be held unless the cache is nil or zero.
func (c *Cache) usableLocked(what func() string) error {
	if c.closed {
		return driver.Closed(what() + ": the cache is closed")
	}
	return nil
}

// made refuses a nil cache or one not made by New.
func (c *Cache) made(what func() string) error {
	if c == nil || c.slots == nil {
		return errors.Wrapf(driver.ErrInvalid, "%s: not a cache made by kvcache.New", what())
	}
	return nil
}

// Config is the cache's configuration, defaults filled in.
func (c *Cache) Config() Config {
	if c == nil {
		return Config{}
	}
	return c.cfg
}

// Base is the address of slot 0; slot i starts SlotBytes()*i further. It
// never changes.
func (c *Cache) Base() driver.Addr {
	if c == nil || c.slots == nil {
		return 0
	}
	return c.slots.Base()
}

// Driver is the driver the cache's memory is on, whose streams copy the
// bytes of its device tensors (nil for a nil or zero cache).
func (c *Cache) Driver() driver.Driver {
	if c == nil || c.slots == nil {
		return nil
	}
	return c.slots.Driver()
}

// SlotBytes is the address space of one slot.
func (c *Cache) SlotBytes() uint64 {
	if c == nil || c.g == nil {
		return 0
	}
	return c.g.slotBytes
}

// TokensPerGroup is, in the TokenMajor layout, the tokens one page group
// holds (the second dim of K and V); 0 in the PerLayer layout.
func (c *Cache) TokensPerGroup() int {
	if c == nil || c.g == nil || c.g.layout != TokenMajor {
		return 0
	}
	return c.g.tpg
}

// slotOff is the offset of slot sl's unit u in region r.
func (c *Cache) slotOff(sl *slot, r, u int) uint64 {
	return uint64(sl.idx)*c.g.slotBytes + c.g.unitOff(r, u)
}

// budgetPages is the budget in whole pages.
func (c *Cache) budgetPages() int { return int(min(c.budget/c.g.page, uint64(1)<<40)) }

// freePagesLocked is what the budget still allows without reclaiming:
// below zero when a lowered budget is not met yet.
func (c *Cache) freePagesLocked() int { return c.budgetPages() - c.pages - c.inflight }

// commitUnitsLocked commits units [u0, u1) of sl — all empty — as the
// slot's own pages: one arena commit per region. On failure nothing is
// left committed.
func (c *Cache) commitUnitsLocked(sl *slot, u0, u1 int) error {
	g := c.g
	if err := c.commitRegions(sl, u0, u1); err != nil {
		return err
	}
	c.counts.commits += g.regions
	for u := u0; u < u1; u++ {
		c.setUnitLocked(sl, u, unitOwned, nil)
	}
	c.pages += (u1 - u0) * g.unitPages()
	return nil
}

// decommitUnitsLocked gives back every unit of [u0, u1) of sl that is
// owned (decommitted) or borrowed (given back to the store, last first),
// one arena call per region. The slot's covers go first: they pin the
// memory. Only the units below sl.hi are looked at.
func (c *Cache) decommitUnitsLocked(sl *slot, u0, u1 int) error {
	u1 = min(u1, sl.hi)
	any := false
	for u := u0; u < u1; u++ {
		switch sl.units[u].state {
		case unitOwned, unitBorrowed, unitKept:
			any = true
		case unitCommitting:
			return errors.AssertionFailedf("kvcache: decommit of slot %d's unit %d while it is being committed", sl.idx, u)
		}
	}
	if !any {
		return nil
	}
	if u0 >= sl.lo {
		// Borrowed units go last first: what stays below u0 stays
		// shared. Below lo (a kept unit behind a running window, evicted)
		// nothing the slot shares or covers changes.
		sl.shared = min(sl.shared, u0)
	}
	if u0 < sl.coverUnits && u1 > sl.coverLo {
		sl.revokeLocked()
		if err := c.releaseCoversLocked(sl); err != nil {
			return err
		}
	}
	g := c.g
	n := uint64(u1-u0) * g.unitBytes
	for r := 0; r < g.regions; r++ {
		if err := c.slots.Decommit(c.slotOff(sl, r, u0), n); err != nil {
			return errors.WithAssertionFailure(errors.Wrapf(err, "kvcache: decommit units [%d, %d) of slot %d", u0, u1, sl.idx))
		}
		c.counts.decommits++
	}
	// Last to first: borrowed units go back to the store's LRU list tail
	// first, so that eviction takes a prefix chain from its end — a unit
	// is found only through every unit before it.
	for u := u1 - 1; u >= u0; u-- {
		ui := sl.units[u]
		if ui.state == unitKept {
			c.unkeepLocked(sl, u)
			c.counts.keptDropped++
		}
		c.setUnitLocked(sl, u, unitEmpty, nil)
		switch ui.state {
		case unitOwned:
			c.pages -= g.unitPages()
		case unitBorrowed:
			c.giveBackLocked(ui.su)
		}
	}
	sl.trimLocked()
	return nil
}

// releaseCoversLocked ends sl's views.
func (c *Cache) releaseCoversLocked(sl *slot) error {
	var errs error
	for _, v := range sl.covers {
		errs = errors.CombineErrors(errs, v.Release())
	}
	sl.covers, sl.coverUnits, sl.coverLo = sl.covers[:0], 0, 0
	if errs != nil {
		return errors.WithAssertionFailure(errors.Wrapf(errs, "kvcache: release the views of slot %d", sl.idx))
	}
	return nil
}

// coverLocked makes sl's covers reach at least k units of every region,
// from its first held unit (sl.lo): read-only views, since the shared
// units below sl.shared are mapped read-only (protectSharedLocked grants
// that before the covers exist).
func (c *Cache) coverLocked(sl *slot, k int) error {
	if !c.views || k <= sl.coverUnits || k <= sl.lo {
		return nil
	}
	if err := c.releaseCoversLocked(sl); err != nil {
		return err
	}
	sl.coverLo = sl.lo
	for r := 0; r < c.g.regions; r++ {
		v, err := c.slots.ViewReadOnly(c.slotOff(sl, r, sl.lo), uint64(k-sl.lo)*c.g.unitBytes)
		if err != nil {
			return errors.CombineErrors(errors.WithAssertionFailure(errors.Wrapf(err, "kvcache: view of slot %d's region %d", sl.idx, r)),
				c.releaseCoversLocked(sl))
		}
		sl.covers = append(sl.covers, v)
	}
	sl.coverUnits = k
	return nil
}

// settleLocked waits until no unit of s's slot below k() is being
// committed by the mapper. The lock is let go while it waits, so anything
// may change meanwhile: check() runs before the first wait and after
// every one, and its error ends the wait. It reports whether it waited.
func (c *Cache) settleLocked(s *Seq, k func() int, check func() error) (bool, error) {
	waited := false
	for {
		if err := check(); err != nil {
			return waited, err
		}
		if c.mapping.sl != s.sl || c.mapping.u >= k() {
			return waited, nil
		}
		waited = true
		c.cond.Wait()
	}
}

// drainLocked ends the accesses through sl's tensors ahead of a revoke
// without holding c.mu while it waits for them: an access lasts as long as
// its caller makes it (a transfer target's reads a peer's socket, up to the
// engine's LeaseTimeout; a callback may call back into the cache), and no
// other call on the cache waits for it. Under the lock it stops the lease
// (tensor.Lease.Stop: every later access, and every tensor asked for
// meanwhile, answers ErrClosed); while accesses are in flight it lets the
// lock go until they end. Anything else may change meanwhile, as in
// settleLocked: check runs after every wait and its error ends the drain.
// The lease stays sl's while accesses are in flight (leaseLocked replaces
// it only once idle), and revokeLocked waits for every one: memory is
// never let go under an access, whoever revokes. A tensor the drain
// stopped stays ended even if the call that drained then refuses or gives
// up: the caller asks for it again (K, V), as after any revoke.
// It reports whether it waited; on nil, sl's lease is stopped and idle,
// and the revoke that follows under the lock waits for nothing.
func (c *Cache) drainLocked(sl *slot, check func() error) (bool, error) {
	waited := false
	for {
		l := sl.lease
		if l == nil {
			return waited, nil
		}
		l.Stop()
		if l.Idle() {
			return waited, nil
		}
		waited = true
		c.mu.Unlock()
		l.Revoke()
		c.mu.Lock()
		if err := check(); err != nil {
			return waited, err
		}
	}
}

// quiesceLocked waits, letting c.mu go meanwhile, until no unit of s's
// slot is being committed (settleLocked) and no access through its
// tensors is in flight (drainLocked), both at once: after a drain that
// waited the mapper may have started a commit. check runs after every
// wait, as there. On nil the caller may take s's units and revoke its
// lease without waiting.
func (c *Cache) quiesceLocked(s *Seq, check func() error) error {
	for {
		if _, err := c.settleLocked(s, func() int { return len(s.sl.units) }, check); err != nil {
			return err
		}
		if waited, err := c.drainLocked(s.sl, check); err != nil || !waited {
			return err
		}
	}
}

// makeRoomLocked makes the budget hold need more pages: it gives back, in
// order, the pages of idle slots (the longest idle first), cached prefix
// store units no sequence maps (least recently used first), and the pages
// running sequences hold beyond their tokens — never units of keep below
// keepUnits. If all of that is not enough it changes nothing and returns
// ErrOutOfMemory.
func (c *Cache) makeRoomLocked(what func() string, need int, keep *slot, keepUnits int) error {
	free := c.freePagesLocked()
	if need <= free {
		return nil
	}
	idle, surplus := c.reclaimableLocked(keep, keepUnits)
	evictable := c.evictablePagesLocked()
	if free+idle+evictable+surplus < need {
		return errors.WithHint(
			errors.Wrapf(driver.ErrOutOfMemory, "%s: needs %d pages of %s; the budget of %s has %d free, and %d idle, %d cached and %d surplus pages can be given back",
				what(), need, units.Bytes(c.g.page), units.Bytes(c.budget), free, idle, evictable, surplus),
			"free or preempt sequences, or raise the budget (SetBudget)")
	}
	if err := c.reclaimIdleLocked(need, keep); err != nil {
		return err
	}
	if err := c.evictLocked(need); err != nil {
		return err
	}
	return c.reclaimSurplusLocked(need, keep, keepUnits)
}

// reclaimableLocked counts the pages of idle slots and the pages running
// or preempted sequences' slots hold beyond their tokens, keep's units
// below keepUnits aside: the counters, less what keep holds between its
// tokens and keepUnits.
func (c *Cache) reclaimableLocked(keep *slot, keepUnits int) (idle, surplus int) {
	up := c.g.unitPages()
	idle, surplus = c.idleUnits, c.surplusUnits
	if keep != nil {
		if keep.seq == nil {
			idle -= keep.owned
		} else {
			surplus -= keep.ownedIn(c.g.unitsFor(keep.seq.n), keepUnits)
		}
	}
	return idle * up, surplus * up
}

// ownedIn counts sl's owned units in [u0, u1): a walk of that stretch
// alone (below hi).
func (sl *slot) ownedIn(u0, u1 int) int {
	n := 0
	for u := u0; u < min(u1, sl.hi); u++ {
		n += b2i(sl.units[u].state == unitOwned)
	}
	return n
}

// ownedFromLocked counts sl's owned units at or past from: its owned
// units when idle and from is 0, its surplus less those below from when
// from is past its sequence's tokens (Append's keep: a walk of the units
// it appends), a walk otherwise.
func (c *Cache) ownedFromLocked(sl *slot, from int) int {
	switch {
	case sl.seq == nil && from == 0:
		return sl.owned
	case sl.seq != nil && from >= c.g.unitsFor(sl.seq.n):
		return sl.surplus - sl.ownedIn(c.g.unitsFor(sl.seq.n), from)
	}
	return sl.ownedIn(from, sl.hi)
}

// reclaimIdleLocked decommits the units of idle slots, longest idle first
// and from their last unit down, until need pages are free.
func (c *Cache) reclaimIdleLocked(need int, keep *slot) error {
	for sl := c.idleHead; sl != nil && c.freePagesLocked() < need; {
		next := sl.idleNext // sl leaves the list once it owns nothing
		if sl != keep {
			if err := c.reclaimFromLocked(sl, 0, need); err != nil {
				return err
			}
		}
		sl = next
	}
	return nil
}

// reclaimFromLocked decommits sl's owned units at or above from, last
// first, until need pages are free: whole units, so whole pages. A slot
// given back whole takes one arena call per region. A running
// sequence's slot is listed for mapping ahead again.
func (c *Cache) reclaimFromLocked(sl *slot, from, need int) error {
	up := c.g.unitPages()
	owned := c.ownedFromLocked(sl, from)
	if owned == 0 {
		return nil
	}
	before := c.pages
	committing := c.mapping.sl == sl && c.mapping.u >= from
	// Kept units hold no page: a slot given back whole keeps them.
	if c.freePagesLocked()+owned*up <= need && !committing && sl.kept == 0 {
		if err := c.decommitUnitsLocked(sl, from, len(sl.units)); err != nil {
			return err
		}
	} else {
		for u := sl.hi - 1; u >= from && c.freePagesLocked() < need; u-- {
			if sl.units[u].state != unitOwned {
				continue
			}
			if err := c.decommitUnitsLocked(sl, u, u+1); err != nil {
				return err
			}
		}
	}
	c.counts.reclaims++
	c.counts.reclaimedPages += before - c.pages
	if sl.seq != nil {
		c.wantAheadLocked(sl)
	}
	return nil
}

// reclaimSurplusLocked decommits the units running sequences hold beyond
// their tokens (keep's below keepUnits aside) until need pages are free,
// slot by slot in order, passing over the slots that hold none.
func (c *Cache) reclaimSurplusLocked(need int, keep *slot, keepUnits int) error {
	if c.surplusUnits == 0 {
		return nil
	}
	for _, sl := range c.slotList {
		if c.freePagesLocked() >= need {
			return nil
		}
		if sl.seq == nil || sl.surplus == 0 {
			continue
		}
		from := c.g.unitsFor(sl.seq.n)
		if sl == keep {
			from = max(from, keepUnits)
		}
		if err := c.reclaimFromLocked(sl, from, need); err != nil {
			return err
		}
	}
	return nil
}

// Close ends every sequence, gives back all memory and the address space.
// It waits for the accesses in flight through the sequences' tensors (one
// At, Set or Copy each) and ends the tensors: later accesses answer
// ErrClosed. Closing twice is ErrClosed.
func (c *Cache) Close() error {
	what := func() string { return "kvcache: close" }
	if err := c.made(what); err != nil {
		return err
	}
	c.stopMapper()
	c.mu.Lock()
	defer c.unlock()
	if err := c.usableLocked(what); err != nil {
		return err
	}
	// The accesses through every sequence's tensors end with the lock
	// let go (drainLocked); after a wait, every slot is looked at again.
	for waited := true; waited; {
		waited = false
		for _, sl := range c.slotList {
			w, err := c.drainLocked(sl, func() error { return c.usableLocked(what) })
			if err != nil {
				return err
			}
			waited = waited || w
		}
	}
	var errs error
	for s := range c.seqs {
		errs = errors.CombineErrors(errs, c.endLocked(s))
	}
	for _, sl := range c.slotList {
		errs = errors.CombineErrors(errs, c.decommitUnitsLocked(sl, 0, len(sl.units)))
	}
	for _, sl := range c.ahead {
		sl.aheadListed = false
	}
	c.ahead = nil
	c.forgetAskedLocked()
	// Every unit leaves the index: one event says so.
	c.ev.clearing = true
	errs = errors.CombineErrors(errs, c.closeStoreLocked())
	c.ev.clearing = false
	if c.sharing() {
		c.clearedLocked()
	}
	errs = errors.CombineErrors(errs, c.slots.Close())
	if c.ring != nil {
		errs = errors.CombineErrors(errs, c.ring.Close())
	}
	errs = errors.CombineErrors(errs, c.pool.Close())
	if c.str != nil {
		errs = errors.CombineErrors(errs, c.str.Destroy())
	}
	c.closed = true
	if errs != nil {
		return errors.Wrapf(errs, "%s", what())
	}
	return nil
}

// Closed reports whether the cache is closed (a nil or zero cache is).
func (c *Cache) Closed() bool {
	if c == nil || c.slots == nil {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// checkAfter runs Check's walk after a change under the invariants tag.
func (c *Cache) checkAfter(op string) {
	if invariants.Enabled {
		invariants.Fail("kvcache: "+op, c.checkLocked())
	}
}

// Check verifies the cache's books against each other and against its
// ranges, and reports every violation.
func (c *Cache) Check() error {
	if err := c.made(func() string { return "kvcache: check" }); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	errs := errors.CombineErrors(c.checkLocked(), c.lostErr)
	if !c.closed {
		errs = errors.CombineErrors(errs, c.slots.Check())
		errs = errors.CombineErrors(errs, c.checkStoreRangeLocked())
	}
	return errs
}

func (c *Cache) checkLocked() error {
	var errs error
	fail := func(format string, args ...any) {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf("kvcache: "+format, args...))
	}
	if n := c.ev.queued; n != 0 && (c.cfg.Events == nil || c.ev.resync) || n != countEvents(c.ev.queue) {
		fail("%d KV events counted queued, %d in the queue (listening %t, resync %t)", n, countEvents(c.ev.queue), c.cfg.Events != nil, c.ev.resync)
	}
	if c.closed {
		if len(c.seqs) > 0 || c.pages != 0 {
			fail("a closed cache keeps %d sequences, %d pages", len(c.seqs), c.pages)
		}
		return errs
	}
	g := c.g
	up := g.unitPages()
	ownedPages, committing := 0, 0
	type ext struct {
		off, size uint64
		borrowed  bool
	}
	var want []ext
	add := func(off uint64, borrowed bool) {
		if n := len(want); n > 0 && want[n-1].borrowed == borrowed && want[n-1].off+want[n-1].size == off {
			want[n-1].size += g.unitBytes
			return
		}
		want = append(want, ext{off, g.unitBytes, borrowed})
	}
	for i, sl := range c.slotList {
		if sl.idx != i {
			fail("slot %d says it is %d", i, sl.idx)
		}
		owned := 0
		for u, ui := range sl.units {
			switch ui.state {
			case unitOwned:
				owned++
			case unitBorrowed:
				if ui.su == nil {
					fail("slot %d's unit %d is borrowed from no store unit", i, u)
				} else if ui.su.u != u {
					fail("slot %d's unit %d maps store unit %d, which belongs at unit %d", i, u, ui.su.idx, ui.su.u)
				}
				if sl.seq == nil || sl.seq.state != seqRunning {
					fail("slot %d borrows unit %d without a running sequence", i, u)
				}
			case unitCommitting:
				committing++
			}
		}
		if owned != sl.owned {
			fail("slot %d counts %d owned units, holds %d", i, sl.owned, owned)
		}
		ownedPages += owned * up
		for r := 0; sl.ring && r < g.regions; r++ {
			want = append(want, ext{c.slotOff(sl, r, 0), 2 * uint64(g.ring) * g.page, true})
		}
		for r := 0; r < g.regions; r++ {
			for u, ui := range sl.units {
				if ui.state == unitOwned || ui.state == unitBorrowed || ui.state == unitKept {
					add(c.slotOff(sl, r, u), ui.state != unitOwned)
				}
			}
		}
		if s := sl.seq; s != nil {
			if s.sl != sl {
				fail("slot %d holds a sequence of slot %d", i, s.sl.idx)
			}
			if _, live := c.seqs[s]; !live {
				fail("slot %d holds a sequence that is not live", i)
			}
			switch s.state {
			case seqRunning:
				for u := 0; g.ring == 0 && u < g.unitsFor(s.n); u++ {
					if st := sl.units[u].state; u >= sl.lo && st != unitOwned && st != unitBorrowed {
						fail("running sequence in slot %d has %d tokens, but unit %d is not committed", i, s.n, u)
					} else if u < sl.lo && st != unitEmpty && st != unitKept {
						fail("running sequence in slot %d holds unit %d, behind its window's first unit %d", i, u, sl.lo)
					}
				}
				c.checkWindowLocked(fail, sl)
				if g.ring == 0 && sl.coverUnits > g.unitsFor(s.n) {
					fail("slot %d's views cover %d units, its %d tokens fill %d", i, sl.coverUnits, s.n, g.unitsFor(s.n))
				}
			case seqSwapped, seqDropped:
				if slices.ContainsFunc(sl.units, func(u unitInfo) bool { return u.state != unitEmpty && u.state != unitKept }) || len(sl.covers) > 0 {
					fail("preempted sequence's slot %d keeps pages", i)
				}
			default:
				fail("slot %d holds a sequence in state %d", i, s.state)
			}
			switch {
			case s.state == seqDropped && s.written != 0:
				fail("dropped sequence in slot %d counts %d tokens written", i, s.written)
			case s.state != seqDropped && (s.written < s.matched || s.written > s.n):
				fail("sequence in slot %d counts %d tokens written, %d matched of %d", i, s.written, s.matched, s.n)
			}
			if s.generated.n != max(s.n-len(s.prompt), 0) || !s.generated.check() {
				fail("sequence in slot %d keeps %d generated tokens, counts %d of a prompt of %d", i, s.generated.n, s.n, len(s.prompt))
			}
		} else if len(sl.covers) > 0 {
			fail("idle slot %d keeps views", i)
		}
		if sl.lo != 0 && (sl.seq == nil || sl.seq.state != seqRunning) {
			fail("slot %d starts at unit %d without a running sequence", i, sl.lo)
		}
		if len(sl.covers) != 0 && len(sl.covers) != g.regions {
			fail("slot %d has %d views, not one per region", i, len(sl.covers))
		}
		c.checkSharedLocked(fail, sl)
	}
	for s := range c.seqs {
		if s.sl == nil || s.sl.seq != s {
			fail("a live sequence is not its slot's")
		}
	}
	if committing*up != c.inflight {
		fail("%d units are being committed, %d pages counted in flight", committing, c.inflight)
	}
	if m := c.mapping; (committing == 1) != (m.sl != nil) || committing > 1 ||
		(m.sl != nil && m.sl.units[m.u].state != unitCommitting) {
		fail("%d units are being committed; the mapper's unit in flight is %v", committing, m)
	}
	c.checkBooksLocked(fail)
	c.checkKeptLocked(fail)
	if c.sharing() {
		c.checkClearLocked(fail)
	}
	c.checkAheadLocked(fail)
	c.checkPoolLocked(fail)
	storePages := c.checkStoreLocked(fail)
	ringPages := c.checkRingLocked(fail)
	if ownedPages+storePages+ringPages != c.pages {
		fail("%d slot pages, %d store pages and %d ring pages are committed, %d counted", ownedPages, storePages, ringPages, c.pages)
	}
	if c.inflight == 0 {
		if got := c.slots.Committed(); got != uint64(ownedPages)*g.page {
			fail("the slot range holds %s, the slots own %d pages", units.Bytes(got), ownedPages)
		}
		var got []ext
		for _, e := range c.slots.Layout() {
			got = append(got, ext{e.Offset, e.Size, e.Borrowed})
		}
		slices.SortFunc(want, func(a, b ext) int {
			if a.off < b.off {
				return -1
			}
			return 1
		})
		// Merge what sorting brought together.
		var merged []ext
		for _, e := range want {
			if n := len(merged); n > 0 && merged[n-1].borrowed == e.borrowed && merged[n-1].off+merged[n-1].size == e.off {
				merged[n-1].size += e.size
				continue
			}
			merged = append(merged, e)
		}
		if !slices.Equal(merged, got) {
			fail("the slot range maps %v, the slots say %v", got, merged)
		}
	}
	counted, walked := c.statsLocked(), c.walkStatsLocked()
	// PooledPages is no counter of the cache but a read of the page pool,
	// which the mapping-ahead goroutine draws from without c.mu: two reads
	// differ by its commits in between (trimPoolLocked's check bounds it).
	walked.PooledPages = counted.PooledPages
	if counted != walked {
		fail("the counters say %+v, a walk %+v", counted, walked)
	}
	return errs
}

// String describes the cache: "kvcache: 8 slots, per-layer, ...".
func (c *Cache) String() string {
	if c == nil || c.g == nil {
		return "kvcache: not a cache"
	}
	return fmt.Sprintf("kvcache: %d slots of %s, %s", c.cfg.MaxSeqs, units.Bytes(c.g.slotBytes), c.g)
}

// protectSharedLocked makes units [sl.lo, k) of sl — just borrowed from the
// prefix store for a match, before any view covers them — its shared
// units: mapped read-only in every region when the cache protects them
// (c.protects). On failure nothing changed. Nothing grants them back:
// sharing ends only when the units are given back (decommitUnitsLocked,
// which releases the covers first), and that unmaps them.
func (c *Cache) protectSharedLocked(what func() string, sl *slot, k int) error {
	if k == 0 {
		return nil
	}
	if sl.coverUnits > 0 {
		return errors.AssertionFailedf("%s: slot %d's views cover %d units while shared units are mapped", what(), sl.idx, sl.coverUnits)
	}
	lo := sl.lo // 0 but in a window's fork: the units below are behind it
	n := uint64(k-lo) * c.g.unitBytes
	for r := 0; c.protects && r < c.g.regions; r++ {
		err := c.slots.Grant(c.cfg.Device, c.slotOff(sl, r, lo), n, driver.AccessRead)
		if err == nil {
			continue
		}
		if r == 0 && errors.Is(err, driver.ErrUnsupported) {
			c.protects = false // the tensors' refusal is the only guard
			break
		}
		var undo error
		for q := 0; q < r; q++ {
			undo = errors.CombineErrors(undo, c.slots.Grant(c.cfg.Device, c.slotOff(sl, q, lo), n, driver.AccessReadWrite))
		}
		if undo != nil {
			err = errors.CombineErrors(err, errors.WithAssertionFailure(undo))
		}
		return errors.Wrapf(err, "%s: map the %d shared units of slot %d read-only", what(), k, sl.idx)
	}
	sl.shared = k
	return nil
}

// checkSharedLocked checks sl's shared units: borrowed, below a running
// sequence's tokens, read-only where the cache protects them; and its
// other borrowed units (those its sequence put in the store) writable.
func (c *Cache) checkSharedLocked(fail func(string, ...any), sl *slot) {
	running := sl.seq != nil && sl.seq.state == seqRunning
	switch {
	case sl.shared < 0 || sl.shared > len(sl.units):
		fail("slot %d has %d shared units of %d", sl.idx, sl.shared, len(sl.units))
		return
	case !running && sl.shared != 0:
		fail("slot %d shares %d units without a running sequence", sl.idx, sl.shared)
		return
	case running && sl.shared > c.g.unitsFor(sl.seq.n):
		fail("slot %d shares %d units, its %d tokens fill %d", sl.idx, sl.shared, sl.seq.n, c.g.unitsFor(sl.seq.n))
		return
	}
	for u := sl.lo; u < sl.hi; u++ {
		if u < sl.shared && sl.units[u].state != unitBorrowed {
			fail("slot %d's shared unit %d is not borrowed", sl.idx, u)
			continue
		}
		st := sl.units[u].state
		if st != unitBorrowed && st != unitKept {
			continue
		}
		want := driver.AccessReadWrite
		if (st == unitBorrowed && u < sl.shared && c.protects) || (st == unitKept && sl.units[u].ro) {
			want = driver.AccessRead
		}
		for r := 0; r < c.g.regions; r++ {
			if got, err := c.slots.AccessAt(c.cfg.Device, c.slotOff(sl, r, u)); err != nil || got != want {
				fail("slot %d's unit %d (region %d, %d shared) grants %s, want %s (%v)", sl.idx, u, r, sl.shared, got, want, err)
			}
		}
	}
}
