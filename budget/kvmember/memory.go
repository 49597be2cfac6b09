package kvmember

import "github.com/vmarena/vmarena/kvcache"

// memory is what a member needs of its cache: a kvcache.Cache (cacheMem)
// or a kvcache.Hybrid (hybridMem), each of which gives back what is
// spare without preempting (Spare, GiveBack).
type memory interface {
	Closed() bool
	Spare() uint64
	GiveBack(want uint64) (uint64, error)
	Check() error
	String() string
	// budget is the cache's budget, committed what it keeps committed
	// (pooled pages included).
	budget() uint64
	committed() uint64
	// setBudget sets the budget to n (SetBudget with kvcache.Drop) and
	// says how many sequences that preempted.
	setBudget(n uint64) (preempted int, err error)
	pageSize() uint64
	maxContext() int
	// slotFree says a sequence could start (a slot is free).
	slotFree() bool
	// seqBytes is the memory a sequence of n tokens takes, nothing shared.
	seqBytes(n int) uint64
}

// cacheMem is a kvcache.Cache as a member's memory.
type cacheMem struct{ *kvcache.Cache }

func (c cacheMem) budget() uint64 { return c.Stats().Budget }

func (c cacheMem) committed() uint64 {
	st := c.Stats()
	return st.Committed + uint64(st.PooledPages)*c.pageSize()
}

func (c cacheMem) setBudget(n uint64) (int, error) {
	pre, err := c.SetBudget(n, kvcache.Drop)
	return len(pre), err
}

func (c cacheMem) pageSize() uint64 { return c.Config().PageSize }
func (c cacheMem) maxContext() int  { return c.Config().MaxContext }

func (c cacheMem) slotFree() bool {
	st := c.Stats()
	return st.Sequences < st.Slots
}

// seqBytes is the whole pages of every region a sequence of n tokens'
// units take (the last one whole).
func (c cacheMem) seqBytes(n int) uint64 {
	cfg := c.Config()
	per := c.SlotBytes() / uint64(max(c.UnitsFor(cfg.MaxContext), 1))
	return uint64(c.UnitsFor(min(n, cfg.MaxContext))) * per
}

// hybridMem is a kvcache.Hybrid as a member's memory.
type hybridMem struct{ *kvcache.Hybrid }

func (h hybridMem) String() string { return "a hybrid KV cache" }

func (h hybridMem) budget() uint64    { return h.Stats().Budget }
func (h hybridMem) committed() uint64 { return h.Stats().Committed }

func (h hybridMem) setBudget(n uint64) (int, error) {
	pre, err := h.SetBudget(n, kvcache.Drop)
	return len(pre), err
}

func (h hybridMem) pageSize() uint64      { return h.Config().PageSize }
func (h hybridMem) maxContext() int       { return h.Config().MaxContext }
func (h hybridMem) slotFree() bool        { return h.Stats().Sequences < h.Config().MaxSeqs }
func (h hybridMem) seqBytes(n int) uint64 { return h.SeqBytes(n) }
