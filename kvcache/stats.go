package kvcache

// Stats are a cache's figures. Pages are PageSize bytes.
type Stats struct {
	// Budget is the most the cache keeps committed; Committed what it
	// does: PagesCommitted pages, SlotPages of them the slots' own and
	// StorePages in the prefix store (mapped into slots, or cached).
	Budget, Committed                     uint64
	PagesCommitted, SlotPages, StorePages int
	// IdlePages are kept by free slots for their next sequence (deferred
	// reclaim), SurplusPages by running sequences' slots beyond their
	// tokens (a slot a longer sequence left them); CachedPages are store
	// pages no sequence maps (evictable); SharedPages are store pages two
	// or more running sequences map, and SavedBytes the memory that
	// sharing spares (each extra mapping of a store page counts a page).
	IdlePages, SurplusPages, CachedPages, SharedPages int
	SavedBytes                                        uint64
	// PooledPages are pages decommitted and kept, unreleased and
	// unmapped, for the next commit (the page pool): committed memory
	// beside Committed, within the budget with it.
	PooledPages int
	// Sequences are live (Running or Preempted); Slots is MaxSeqs.
	Sequences, Running, Preempted, Slots int
	// TokensStored is the tokens of running sequences (a shared token
	// counts in each); UsedBytes the committed bytes holding a token of a
	// running sequence, each byte once however many sequences map it; and
	// Waste the committed bytes that hold none, cached prefix pages aside:
	// Committed = UsedBytes + Waste + CachedPages*PageSize. Idle and
	// surplus pages are in Waste, whole.
	TokensStored     int
	UsedBytes, Waste uint64

	// Cumulative counts. Admits, Frees; Steps are Appends, and Waits the
	// Appends that committed a page themselves or waited for one the
	// mapper was committing (mapping ahead would have spared them).
	Admits, Frees, Steps, Waits int
	// Commits, Borrows and Decommits are calls to the arena (one per
	// region of a run of units in the PerLayer layout; one for a run of
	// prefix store units side by side, none for a store unit that reuses
	// an evicted one's memory); MapperCommits those the mapping-ahead
	// goroutine made.
	Commits, Borrows, Decommits, MapperCommits int
	// PrefixQueries and PrefixHits are in blocks (BlockTokens): the
	// prompts' whole blocks looked up, and those found, by every Admit and
	// Resume that succeeds (a Resume looks its prompt up again). Copies count pages
	// partly covered by a matched prefix, copied once (CopiedBytes).
	PrefixQueries, PrefixHits, Copies int
	CopiedBytes                       uint64
	// Evictions are store units given back (EvictedPages pages), whether
	// decommitted or their memory reused in place by a new store unit;
	// Reclaims are idle slots and surplus pages given back (ReclaimedPages).
	Evictions, EvictedPages, Reclaims, ReclaimedPages int
	// Preemptions = Swaps + Drops; SwappedBytes went to host memory;
	// Resumes brought sequences back.
	Preemptions, Swaps, Drops, Resumes int
	SwappedBytes                       uint64
	// FailedAdmits and FailedResumes are the Admits and Resumes refused
	// for lack of memory (ErrOutOfMemory): their plans did not fit, and
	// they changed nothing. A caller that asks CanAdmit (CanResume)
	// first, with no other call and no commit of the mapping-ahead
	// goroutine between, sees none.
	FailedAdmits, FailedResumes uint64
	// EventPanics are batches whose Config.Events callback panicked
	// (recovered); EventsDropped are events queued and dropped, the
	// queue full (a slow callback) or after a panic: a resync replaced
	// them (events.go).
	EventPanics, EventsDropped int
	// Forks are the sequences Seq.Fork made, FailedForks those it refused
	// for lack of memory; CowCopies are the pages copied on write: a
	// fork's partly written last unit, copied by the first of its sharers
	// to write there (CowBytes).
	Forks, CowCopies int
	FailedForks      uint64
	CowBytes         uint64
	// WindowReleases are the Appends (and a Step's requests) that gave
	// back units behind a sliding window (Config.Window), WindowUnits the
	// units they gave back: the slot's own decommitted, the prefix
	// store's unborrowed (cached there).
	WindowReleases, WindowUnits int
	// RingPages are the pages of the running sequences' rings
	// (Config.Ring), each mapped twice: beside SlotPages and StorePages
	// in PagesCommitted.
	RingPages int
	// KeptUnits are the prefix store units left mapped in slots whose
	// sequence ended or was preempted, for the slot's next sequence, and
	// behind running sequences' windows (mappings, not pages: the store's
	// pages count once, in StorePages). KeptReused are those an admission or a resume found
	// holding the unit its match wanted there (no map, no unmap);
	// KeptDropped those unmapped since: unlike what a new sequence
	// matched, or their store unit evicted.
	KeptUnits, KeptReused, KeptDropped int
}

// Stats returns the cache's figures (zero for a nil or zero cache).
func (c *Cache) Stats() Stats {
	if c == nil || c.slots == nil {
		return Stats{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.statsLocked()
}

// statsLocked reads the counters (books.go, and the prefix store's): no
// walk, whatever the number of slots, units or sequences.
func (c *Cache) statsLocked() Stats {
	g := c.g
	up := g.unitPages()
	st := c.cumulativeLocked()
	st.SlotPages = c.ownedUnits * up
	st.RingPages = c.ringPages
	st.StorePages = c.pages - st.SlotPages - st.RingPages
	st.IdlePages = c.idleUnits * up
	st.SurplusPages = c.surplusUnits * up
	st.KeptUnits = c.keptUnits
	st.Sequences = len(c.seqs)
	st.Running = c.running
	st.Preempted = st.Sequences - st.Running
	st.TokensStored = c.runningTokens
	// Each running sequence's tokens lie in its units below
	// unitsFor(Len), its own or borrowed; a store unit mapped by k
	// sequences counts once, not k times, and every one of them holds the
	// same tokens in it (a unit is shared whole once its owner has written
	// it all, or, a fork's last unit, at the one length they share).
	// Units behind a window hold none of them any more.
	// A ring holds its sequence's last Window tokens.
	st.UsedBytes = uint64(c.runningTokens-c.ringExcess)*g.tokenBytes() - c.ps.extraBytes - uint64(c.behindUnits)*g.fullUnitBytes()
	st.SharedPages = c.ps.sharedUnits * up
	st.SavedBytes = uint64(c.ps.extraRefs*up) * g.page
	st.CachedPages = c.evictablePagesLocked()
	st.Waste = st.Committed - min(st.Committed, st.UsedBytes+uint64(st.CachedPages)*g.page)
	st.PooledPages = c.pooledPages()
	return st
}

// cumulativeLocked is Stats with the budget, the pages committed and the
// cumulative counts filled in.
func (c *Cache) cumulativeLocked() Stats {
	k := c.counts
	return Stats{Budget: c.budget, Committed: uint64(c.pages) * c.g.page, PagesCommitted: c.pages, Slots: c.cfg.MaxSeqs,
		Admits: k.admits, Frees: k.frees, Steps: k.steps, Waits: k.waits,
		Commits: k.commits, Borrows: k.borrows, Decommits: k.decommits, MapperCommits: k.mapperCommits,
		PrefixQueries: k.queries, PrefixHits: k.hits, Copies: k.copies, CopiedBytes: k.copiedBytes,
		Evictions: k.evictions, EvictedPages: k.evictedPages, Reclaims: k.reclaims, ReclaimedPages: k.reclaimedPages,
		Preemptions: k.preemptions, Swaps: k.swaps, Drops: k.drops, Resumes: k.resumes, SwappedBytes: k.swappedBytes,
		FailedAdmits: k.failedAdmits, FailedResumes: k.failedResumes,
		EventPanics: c.ev.panics, EventsDropped: c.ev.dropped,
		Forks: k.forks, CowCopies: k.cowCopies, FailedForks: k.failedForks, CowBytes: k.cowBytes,
		WindowReleases: k.windowReleases, WindowUnits: k.windowUnits,
		KeptReused: k.keptReused, KeptDropped: k.keptDropped}
}

// fullUnitBytes is the bytes of one unit (all regions) that hold tokens
// when every token of it is there.
func (g *geometry) fullUnitBytes() uint64 {
	_, end := g.unitTokens(0)
	return g.usedBytes(0, end)
}

// walkStatsLocked works Stats out by walking every slot and unit: what
// the counters must say, for Check.
func (c *Cache) walkStatsLocked() Stats {
	g := c.g
	up := g.unitPages()
	st := c.cumulativeLocked()
	// shared[su] is the most tokens any running sequence mapping su holds.
	shared := map[*storeUnit]int{}
	for _, sl := range c.slotList {
		st.SlotPages += sl.owned * up
		for _, ui := range sl.units {
			st.KeptUnits += b2i(ui.state == unitKept)
		}
		s := sl.seq
		if s == nil {
			st.IdlePages += sl.owned * up
			continue
		}
		st.Sequences++
		if s.state != seqRunning {
			st.Preempted++
			continue
		}
		st.Running++
		st.TokensStored += s.n
		if sl.ring {
			st.RingPages += g.ringPages()
		}
		if g.ring > 0 {
			st.UsedBytes += uint64(min(s.n, c.cfg.Window)) * g.tokenBytes()
		}
		filled := g.unitsFor(s.n)
		for u, ui := range sl.units {
			switch ui.state {
			case unitOwned:
				if u >= filled {
					st.SurplusPages += up
					continue
				}
				st.UsedBytes += g.usedBytes(u, s.n)
			case unitBorrowed:
				shared[ui.su] = max(shared[ui.su], s.n)
			}
		}
	}
	st.StorePages = c.pages - st.SlotPages - st.RingPages
	for su, n := range shared {
		st.UsedBytes += g.usedBytes(su.u, n)
		if su.refs > 1 {
			st.SharedPages += up
			st.SavedBytes += uint64((su.refs-1)*up) * g.page
		}
	}
	st.CachedPages = c.evictablePagesLocked()
	st.Waste = st.Committed - min(st.Committed, st.UsedBytes+uint64(st.CachedPages)*g.page)
	st.PooledPages = c.pooledPages()
	return st
}
