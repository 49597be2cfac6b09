package kvcache

import "fmt"

// UnitState is where one unit of a slot stands, as Occupancy reports it:
// the states of the package doc. A unit is one page of every region
// (PerLayer) or one page group (TokenMajor).
type UnitState uint8

const (
	// UnitEmpty is reserved address space only.
	UnitEmpty UnitState = iota
	// UnitOwned is the slot's own pages, committed in the slot range:
	// a running sequence's, or kept by an idle slot for the next one.
	UnitOwned
	// UnitBorrowed is a prefix store unit's pages mapped at the slot's
	// addresses (shared with every other slot that maps it).
	UnitBorrowed
	// UnitCommitting is being committed by the mapping-ahead goroutine.
	UnitCommitting
	// UnitKept is a prefix store unit's pages left mapped by the slot's
	// last sequence (ended or preempted), for the next one to reuse if
	// its prompt shares them: no page of the slot's.
	UnitKept
)

func (u UnitState) String() string {
	switch u {
	case UnitEmpty:
		return "empty"
	case UnitOwned:
		return "owned"
	case UnitBorrowed:
		return "borrowed"
	case UnitCommitting:
		return "committing"
	case UnitKept:
		return "kept"
	}
	return fmt.Sprintf("UnitState(%d)", uint8(u))
}

// SlotState says what a slot holds.
type SlotState uint8

const (
	// SlotIdle holds no sequence (it may keep pages for the next one).
	SlotIdle SlotState = iota
	// SlotRunning holds a running sequence.
	SlotRunning
	// SlotPreempted holds a preempted sequence: its tokens, no pages.
	SlotPreempted
)

func (s SlotState) String() string {
	switch s {
	case SlotIdle:
		return "idle"
	case SlotRunning:
		return "running"
	case SlotPreempted:
		return "preempted"
	}
	return fmt.Sprintf("SlotState(%d)", uint8(s))
}

// SlotOccupancy is one slot's memory as it stood when Occupancy was
// called: plain values copied out of the cache's books, which nothing in
// it reaches back into.
//
// Invariant: OwnedPages and BorrowedPages are the pages of the units in
// Units that are owned and borrowed.
type SlotOccupancy struct {
	Slot  int
	State SlotState
	// Tokens is the sequence's length (kept while preempted); 0 when idle.
	Tokens int
	// Units is the state of every unit of the slot, from its start.
	Units []UnitState
	// OwnedPages are the slot's own pages (an idle slot's are kept for its
	// next sequence); BorrowedPages the prefix store pages it maps.
	OwnedPages, BorrowedPages int
}

// Occupancy returns every slot's memory, slot 0 first: what a memory map
// of the cache shows. It is a snapshot (the mapping-ahead goroutine and
// other callers go on changing the cache). A nil, zero or closed cache
// has none.
func (c *Cache) Occupancy() []SlotOccupancy {
	if c == nil || c.slots == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	up := c.g.unitPages()
	out := make([]SlotOccupancy, len(c.slotList))
	for i, sl := range c.slotList {
		o := SlotOccupancy{Slot: sl.idx, Units: make([]UnitState, len(sl.units))}
		if s := sl.seq; s != nil {
			o.State, o.Tokens = SlotRunning, s.n
			if s.state != seqRunning {
				o.State = SlotPreempted
			}
		}
		for u, ui := range sl.units {
			switch ui.state {
			case unitEmpty:
				o.Units[u] = UnitEmpty
			case unitOwned:
				o.Units[u] = UnitOwned
				o.OwnedPages += up
			case unitBorrowed:
				o.Units[u] = UnitBorrowed
				o.BorrowedPages += up
			case unitCommitting:
				o.Units[u] = UnitCommitting
			case unitKept:
				o.Units[u] = UnitKept
			}
		}
		out[i] = o
	}
	return out
}
