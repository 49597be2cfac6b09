// Package kvmember makes a kvcache.Cache (Join) or a kvcache.Hybrid, a
// model of several layer groups (JoinHybrid), a member of a shared device
// budget (package budget): the cache's budget is the member's hold, raised
// by acquiring from the book before an admission needs more, and lowered
// when another member asks for memory back — by what the cache can give
// without touching a running sequence's tokens (kvcache.Cache.GiveBack and
// kvcache.Hybrid.GiveBack: the budget not committed and the pooled pages,
// idle slots' pages, cached prefix store units and recurrent checkpoints,
// surplus pages; never a preemption).
//
// The invariant: the cache's budget is at most the member's hold, always,
// so the cache never commits more than the book gave it. Between the
// calls of this package it is exactly the hold, but for bytes whose
// release the book refused (its lock held by something that is not a
// member), which the next call that reaches the book releases; inside
// one, the hold rises before the budget (Grow acquires, then raises the
// budget) and the budget falls before the hold (a give-back lowers the
// budget, then releases). Every change of the cache's budget goes through a Member; a
// caller that calls the cache's SetBudget itself breaks the invariant
// (Check reports it).
//
// Lock order: Member.mu → the cache's locks → the book's. Member.mu is
// never held across an Acquire, which may wait for another member to
// give back: two members of one process asking each other cannot wait on
// each other's lock.
package kvmember

import (
	"fmt"
	"sync"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/budget"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/kvcache"
)

// Member is a kvcache.Cache's or kvcache.Hybrid's share of a budget.
type Member struct {
	c    memory
	m    *budget.Member
	page uint64

	mu      sync.Mutex // see the package doc
	pending uint64     // bytes acquired whose budget is not raised yet
	// admitting is the bytes admissions in flight take (their sequences'
	// pages, grown or spare already): spare in the cache until the
	// admission takes them, and kept from give-backs.
	admitting uint64
	given     uint64 // bytes given back when asked, in all
	asked     int    // requests to give back answered
	// owed is bytes the cache gave up whose release the book refused
	// (its lock held by something that is not a member, a corrupt
	// book): released at the next call that reaches the book.
	owed uint64
}

// Stats are a member's figures.
type Stats struct {
	// Hold is what the member holds of the book; Budget the cache's
	// budget (equal between calls); Committed the cache's committed
	// memory, pooled pages included.
	Hold, Budget, Committed uint64
	// Asked counts the requests to give back it answered, GivenBack the
	// bytes it gave back for them.
	Asked     int
	GivenBack uint64
}

// Join adds the cache c to the book b as the member name, with a floor and
// a ceiling in bytes. Its hold starts at the floor, or at what the cache
// has committed if more (pooled pages included), in whole pages of the
// cache, at least one page; the cache's budget is set to that hold,
// lowered without preempting (the cache's spare given back first). A nil
// book or cache, a ceiling below one page, or anything the book refuses
// (budget.Book.Join, Acquire) is refused, with the cache's budget and the
// book as they were.
func Join(b *budget.Book, name string, floor, ceiling uint64, c *kvcache.Cache) (*Member, error) {
	if c == nil {
		return join(b, name, floor, ceiling, nil)
	}
	return join(b, name, floor, ceiling, cacheMem{c})
}

// JoinHybrid is Join for a hybrid cache (kvcache.Hybrid): its one budget
// is the member's hold, and a request to give back takes what
// kvcache.Hybrid.GiveBack gives across its groups and recurrent store.
func JoinHybrid(b *budget.Book, name string, floor, ceiling uint64, h *kvcache.Hybrid) (*Member, error) {
	if h == nil {
		return join(b, name, floor, ceiling, nil)
	}
	return join(b, name, floor, ceiling, hybridMem{h})
}

func join(b *budget.Book, name string, floor, ceiling uint64, c memory) (*Member, error) {
	what := func() string {
		return fmt.Sprintf("kvmember: join %q with floor %s and ceiling %s", name, units.Bytes(floor), units.Bytes(ceiling))
	}
	if b == nil || c == nil || c.Closed() || c.pageSize() == 0 {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: the book or the cache is nil, or the cache is closed", what())
	}
	page := c.pageSize()
	if ceiling < page {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: the ceiling is under one page of the cache (%s)", what(), units.Bytes(page))
	}
	k := &Member{c: c, page: page}
	m, err := b.Join(name, floor, ceiling, k.giveBack)
	if err != nil {
		return nil, errors.Wrapf(err, "kvmember")
	}
	k.m = m
	fail := func(err error) (*Member, error) {
		return nil, errors.CombineErrors(errors.Wrapf(err, "%s", what()), m.Close())
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	orig, committed := c.budget(), c.committed()
	hold := k.pages(max(floor, committed, page))
	if hold > ceiling {
		hold -= page // the floor rounded up past the ceiling
	}
	if hold < committed {
		return fail(errors.Wrapf(driver.ErrOutOfMemory, "the cache has %s committed, over the ceiling", units.Bytes(committed)))
	}
	if err := m.Acquire(hold); err != nil {
		return fail(err)
	}
	if orig > hold {
		if _, err := c.GiveBack(orig - hold); err != nil {
			return fail(errors.CombineErrors(err, k.restore(orig)))
		}
		if now := c.budget(); now > hold {
			// Less was spare than the floor leaves room for: hold the rest.
			if err := m.Acquire(now - hold); err != nil {
				return fail(errors.CombineErrors(err, k.restore(orig)))
			}
			hold = now
		}
	}
	if err := k.setBudget(hold); err != nil {
		return fail(errors.CombineErrors(err, k.restore(orig)))
	}
	if err := k.syncLocked(); err != nil {
		return fail(errors.CombineErrors(err, k.restore(orig)))
	}
	return k, nil
}

// restore puts the cache's budget back after a failed Join.
func (k *Member) restore(budget uint64) error {
	if budget == 0 {
		return nil
	}
	_, err := k.c.setBudget(budget)
	return err
}

// setBudget raises the cache's budget (or keeps it): never a lowering,
// which could preempt.
func (k *Member) setBudget(n uint64) error {
	if cur := k.c.budget(); n < cur {
		return errors.AssertionFailedf("kvmember: the budget would fall from %s to %s outside a give-back", units.Bytes(cur), units.Bytes(n))
	} else if n == cur {
		return nil
	}
	pre, err := k.c.setBudget(n)
	if err == nil && pre > 0 {
		err = errors.AssertionFailedf("kvmember: raising the budget preempted %d sequences", pre)
	}
	return err
}

// pages rounds n up to whole pages.
func (k *Member) pages(n uint64) uint64 { return (n + k.page - 1) / k.page * k.page }

func (k *Member) usable(what func() string) error {
	if k == nil || k.m == nil {
		return errors.Wrapf(driver.ErrInvalid, "%s: the member is nil or was not made by kvmember.Join", what())
	}
	return nil
}

// Name is the member's name in the book.
func (k *Member) Name() string {
	if k == nil || k.m == nil {
		return ""
	}
	return k.m.Name()
}

// Cache is the member's cache (nil for a hybrid cache's member).
func (k *Member) Cache() *kvcache.Cache {
	if k == nil {
		return nil
	}
	c, _ := k.c.(cacheMem)
	return c.Cache
}

// Hybrid is the member's hybrid cache (nil for a Cache's member).
func (k *Member) Hybrid() *kvcache.Hybrid {
	if k == nil {
		return nil
	}
	h, _ := k.c.(hybridMem)
	return h.Hybrid
}

// Grow raises the member's hold and the cache's budget by n bytes (whole
// pages), asking the other members to give back when the book has not
// that much free (budget.Member.Acquire). A zero n is refused
// (ErrInvalid); one the book cannot give is its ErrOutOfMemory, naming
// who holds what; either way nothing changed.
func (k *Member) Grow(n uint64) error { return k.grow(n, 0) }

// grow is Grow; admitting (0 for Grow) is the bytes an admission that
// grows takes, kept from give-backs from the budget's raise on (see
// admitted).
func (k *Member) grow(n, admitting uint64) error {
	what := func() string { return fmt.Sprintf("kvmember: %s grows by %s", k.Name(), units.Bytes(n)) }
	if err := k.usable(what); err != nil {
		return err
	}
	if n == 0 || n > budget.MaxCapacity {
		return errors.Wrapf(driver.ErrInvalid, "%s: the size is zero or over %s", what(), units.Bytes(budget.MaxCapacity))
	}
	n = k.pages(n)
	if err := k.m.Acquire(n); err != nil {
		return errors.Wrapf(err, "kvmember")
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.pending += n
	defer func() { k.pending -= n }()
	if err := k.setBudget(k.c.budget() + n); err != nil {
		return errors.CombineErrors(errors.Wrapf(err, "%s", what()), k.releaseLocked(n))
	}
	k.admitting += admitting
	return k.syncLocked()
}

// Admit admits prompt (under extra) into the cache with room for
// expectedOutput more tokens, growing the member first when the cache
// cannot (kvcache.Cache.CanAdmit): by the pages the whole sequence takes,
// less what the cache has spare. As kvcache.Cache.Admit, the sequence
// starts with the prefix the store held (Len); the caller appends the
// rest of the prompt, with no other call between, in the room planned.
// The growth is kept for the admission until it returns: a give-back
// another member asks for in between takes nothing of it, and Sync does
// not report it idle. If the cache still cannot admit it, what
// was grown is given back and the answer is ErrOutOfMemory; a growth the
// book refuses is its error. Nothing changes on an error. A hybrid
// cache's member admits with AdmitHybrid (ErrInvalid here).
func (k *Member) Admit(prompt []int, extra uint64, expectedOutput int) (*kvcache.Seq, error) {
	what := func() string {
		return fmt.Sprintf("kvmember: %s admits a prompt of %d tokens and %d more", k.Name(), len(prompt), expectedOutput)
	}
	if err := k.usable(what); err != nil {
		return nil, err
	}
	c := k.Cache()
	if c == nil {
		return nil, errors.WithHint(errors.Wrapf(driver.ErrInvalid, "%s: the member's cache is a hybrid one", what()), "use AdmitHybrid")
	}
	canAdmit := func() (bool, error) { return c.CanAdmit(prompt, extra, expectedOutput) }
	kept, err := k.growToAdmit(what, canAdmit, len(prompt)+expectedOutput)
	if err != nil {
		return nil, err
	}
	defer k.admitted(kept)
	beforeAdmit()
	s, err := c.Admit(prompt, extra)
	if err != nil {
		return nil, errors.Wrapf(err, "kvmember")
	}
	return s, nil
}

// AdmitHybrid is Admit for a hybrid cache's member
// (kvcache.Hybrid.CanAdmit and Admit): ErrInvalid for a Cache's member.
func (k *Member) AdmitHybrid(prompt []int, expectedOutput int) (*kvcache.HybridSeq, error) {
	what := func() string {
		return fmt.Sprintf("kvmember: %s admits a prompt of %d tokens and %d more", k.Name(), len(prompt), expectedOutput)
	}
	if err := k.usable(what); err != nil {
		return nil, err
	}
	h := k.Hybrid()
	if h == nil {
		return nil, errors.WithHint(errors.Wrapf(driver.ErrInvalid, "%s: the member's cache is not a hybrid one", what()), "use Admit")
	}
	canAdmit := func() (bool, error) { return h.CanAdmit(prompt, expectedOutput) }
	kept, err := k.growToAdmit(what, canAdmit, len(prompt)+expectedOutput)
	if err != nil {
		return nil, err
	}
	defer k.admitted(kept)
	beforeAdmit()
	s, err := h.Admit(prompt)
	if err != nil {
		return nil, errors.Wrapf(err, "kvmember")
	}
	return s, nil
}

// beforeAdmit runs between an admission's growth and the cache's Admit:
// a test's hook (another member asking for memory back there).
var beforeAdmit = func() {}

// growToAdmit grows the member when canAdmit says no and a slot is free:
// by the pages a sequence of total tokens takes, less what the cache has
// spare; if the cache still cannot admit, what was grown goes back and
// the answer is ErrOutOfMemory. It returns the bytes the admission takes
// (kept from give-backs, admitting, until the caller's admitted): the
// sequence's pages, grown or spare already.
func (k *Member) growToAdmit(what func() string, canAdmit func() (bool, error), total int) (uint64, error) {
	need := k.SeqBytes(min(total, k.c.maxContext()))
	k.mu.Lock()
	ok, err := canAdmit()
	if err == nil && ok {
		k.admitting += need
		err = k.syncLocked()
	}
	k.mu.Unlock()
	switch {
	case err != nil:
		return 0, errors.Wrapf(err, "kvmember")
	case ok:
		return need, nil
	case !k.c.slotFree():
		return 0, nil // refused as the cache refuses it
	}
	spare := k.c.Spare()
	grow := k.pages(max(need-min(need, spare), k.page))
	if err := k.grow(grow, need); err != nil {
		return 0, err
	}
	if ok, err = canAdmit(); err == nil && ok {
		return need, nil
	}
	k.mu.Lock()
	k.admitting -= need
	back, gerr := k.c.GiveBack(grow)
	if back > 0 {
		gerr = errors.CombineErrors(gerr, k.releaseLocked(back))
	}
	gerr = errors.CombineErrors(gerr, k.syncLocked())
	k.mu.Unlock()
	if err == nil {
		err = errors.Wrapf(driver.ErrOutOfMemory, "%s: grown by %s, the cache still cannot admit it (%v)", what(), units.Bytes(grow), k.c)
	}
	return 0, errors.CombineErrors(err, gerr)
}

// admitted ends an admission that kept kept bytes from give-backs: what
// it did not take is spare again.
func (k *Member) admitted(kept uint64) {
	if kept == 0 {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.admitting -= kept
	_ = k.syncLocked()
}

// SeqBytes is the memory a sequence of n tokens takes in the cache, in
// whole pages: every region's pages of its units, the last one whole (a
// hybrid cache: kvcache.Hybrid.SeqBytes, every group's and its state).
func (k *Member) SeqBytes(n int) uint64 {
	if k == nil || k.c == nil || n <= 0 {
		return 0
	}
	return k.pages(k.c.seqBytes(n))
}

// Sync tells the book how much of the hold the cache could give back
// now (kvcache.Cache.Spare): the engine calls it after each step, so that
// an asker counts on what is there.
func (k *Member) Sync() error {
	what := func() string { return fmt.Sprintf("kvmember: %s says what is idle", k.Name()) }
	if err := k.usable(what); err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.syncLocked()
}

func (k *Member) syncLocked() error {
	_ = k.releaseLocked(0) // refused, it stays owed: Info says why
	in, err := k.m.Info()
	if err != nil {
		return errors.Wrapf(err, "kvmember")
	}
	spare := k.c.Spare() + k.pending
	spare = min(spare-min(spare, k.admitting), in.Committed)
	return errors.Wrapf(k.m.SetIdle(spare), "kvmember")
}

// giveBack answers a request to give back want bytes: the cache gives
// what it can spare above the floor, and the member releases it.
func (k *Member) giveBack(want uint64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.asked++
	in, err := k.m.Info()
	if err != nil || in.Committed <= in.Floor {
		return
	}
	// Whole pages, above the floor, and none an admission in flight grew
	// by.
	spare := k.c.Spare()
	want = min(k.pages(want), (in.Committed-in.Floor)/k.page*k.page, (spare-min(spare, k.admitting))/k.page*k.page)
	if want == 0 {
		return
	}
	got, err := k.c.GiveBack(want)
	if got > 0 {
		if err := k.releaseLocked(got); err == nil {
			k.given += got
		}
	}
	_ = k.syncLocked()
}

// releaseLocked releases n bytes the cache gave up, and what is owed;
// refused, they stay owed (released by the next call that reaches the
// book: syncLocked) and the book's error is returned.
func (k *Member) releaseLocked(n uint64) error {
	k.owed += n
	if k.owed == 0 {
		return nil
	}
	if err := k.m.Release(k.owed); err != nil {
		return err
	}
	k.owed = 0
	return nil
}

// Stats returns the member's figures (zero for a nil or zero member).
func (k *Member) Stats() Stats {
	if k == nil || k.m == nil {
		return Stats{}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	out := Stats{Budget: k.c.budget(), Committed: k.c.committed(), Asked: k.asked, GivenBack: k.given}
	if in, err := k.m.Info(); err == nil {
		out.Hold = in.Committed
	}
	return out
}

// Check reports a broken invariant: the cache's budget above the hold, or
// its committed memory above its budget; and the cache's own Check.
func (k *Member) Check() error {
	what := func() string { return fmt.Sprintf("kvmember: check %s", k.Name()) }
	if err := k.usable(what); err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	in, err := k.m.Info()
	if err != nil {
		return errors.Wrapf(err, "kvmember")
	}
	budget, committed := k.c.budget(), k.c.committed()
	switch {
	case budget > in.Committed:
		return errors.AssertionFailedf("%s: the cache's budget %s is over the hold %s", what(), units.Bytes(budget), units.Bytes(in.Committed))
	case committed > budget:
		return errors.AssertionFailedf("%s: the cache commits %s over its budget %s", what(), units.Bytes(committed), units.Bytes(budget))
	}
	return k.c.Check()
}

// Close leaves the book: the hold returns to it. The cache must be closed
// first (ErrBusy otherwise: its memory is the hold's); a second Close is
// the book's ErrClosed.
func (k *Member) Close() error {
	what := func() string { return fmt.Sprintf("kvmember: %s leaves", k.Name()) }
	if err := k.usable(what); err != nil {
		return err
	}
	if !k.c.Closed() {
		return errors.WithHint(errors.Wrapf(driver.ErrBusy, "%s: its cache is open, holding memory the book gave", what()), "close the cache first")
	}
	return errors.Wrapf(k.m.Close(), "kvmember")
}
