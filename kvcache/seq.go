package kvcache

import (
	"fmt"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/stream"
	"github.com/vmarena/vmarena/tensor"
)

// seqState is where a sequence stands.
type seqState uint8

const (
	seqRunning seqState = iota // its tokens' pages are committed in its slot
	seqSwapped                 // preempted, its bytes in pinned host memory
	seqDropped                 // preempted, its bytes gone: Resume says what to recompute
	seqFreed                   // ended: its slot is another's
)

// Seq is one sequence (a request) of a cache: its tokens and, while it
// runs, the pages that hold their keys and values, at addresses that
// never move from Admit to Free. Its methods are safe for concurrent use
// (they take the cache's lock).
//
// Invariant: its tokens are prompt[:min(n, len(prompt))] followed by the
// generated ones: generated.n == max(n-len(prompt), 0).
type Seq struct {
	c         *Cache
	sl        *slot
	prompt    []int
	extra     uint64
	generated tokenLog
	n         int
	state     seqState
	admitted  uint64 // tick of Admit: preemption takes the latest first
	// written is how many of its first tokens hold keys and values: what
	// the caller said it wrote (MarkWritten), what Admit or Resume found
	// in the prefix store, what a swap brought back. A prefix store unit
	// the sequence made is published (matchable) once written covers it,
	// never before.
	written int
	// swap holds the bytes of a swapped sequence (regions one after the
	// other, each swapRegion bytes); nil on a driver with no bytes.
	swap       *stream.HostBuffer
	swapRegion uint64
	// swapLo is the first unit a swap kept, in a window cache: the units
	// below were behind its window (window.go); Resume brings back the
	// rest.
	swapLo int
	// matched is how many of its first tokens Admit (or the last Resume)
	// found in the prefix store.
	matched int
	// chain is the prompt's block hashes, worked out once when a store
	// unit is first made for it.
	chain []uint64
	// unpublished are the store units the sequence made and has not
	// published yet, in unit order: publishing takes them from the front,
	// so an Append looks at no other unit of its slot.
	unpublished []*storeUnit
	// found is the store units the last find of its prompt matched
	// (findSeqLocked), where the next one starts.
	found []*storeUnit
	// forked bounds the units a fork made it share (fork.go): borrowed
	// units lie below it or below its prompt's end.
	forked int
	// ringFrom is, in a ring cache, the first position its last Append's
	// first token attends to (ring.go).
	ringFrom int
}

// Rows are the keys and values of one layer at the consecutive positions
// [Pos, Pos+n): K and V are tensors [n, KVHeads, HeadDim], row-major but
// in the Contiguous layout, where one row follows the last a token's
// bytes (all layers) further.
type Rows struct {
	Pos  int
	K, V *tensor.Tensor
}

// Step is what an Append (or a Resume that asks for recomputation) made
// room for: positions [Pos, Pos+N) of the sequence, for the caller to
// write.
type Step struct {
	Pos, N int
	// Layers[l] are layer l's rows at those positions, in position order:
	// one run in the PerLayer and Contiguous layouts (Contiguous: strided,
	// a token's bytes from one row to the next); in TokenMajor one per page group
	// the positions reach. On the CUDA and AscendCL drivers, whose memory
	// this process does not address, they are device tensors (an address
	// for kernels, bytes moved by the driver's copies under
	// tensor.AccessDevice). Nil on the sim driver, which has no memory,
	// and when N is 0.
	Layers [][]Rows
}

// memory is a Buffer over bytes the cache keeps mapped, at device address
// addr: the tensors over it report it (Tensor.Addr), for kernels.
type memory struct {
	b    []byte
	addr driver.Addr
	// n is the length; dev marks device memory, which this process does
	// not address: b is nil, Bytes is ErrUnsupported, and the tensor over
	// it is a device tensor (address and length, bytes moved by the
	// driver's copies under AccessDevice).
	n   uint64
	dev bool
}

func (m *memory) Bytes() ([]byte, error) {
	if m.dev {
		return nil, errors.Wrap(driver.ErrUnsupported, "kvcache: device memory has no bytes in this process")
	}
	return m.b, nil
}
func (m *memory) Addr() driver.Addr { return m.addr }
func (m *memory) Len() uint64       { return m.n }

// viewMem is [off, off+size) of cover v as a tensor's memory: its bytes
// where the process addresses the cache's memory, device memory where it
// does not (CUDA, AscendCL).
func (c *Cache) viewMem(v *arena.View, off, size uint64) (*memory, error) {
	addr := v.Addr() + driver.Addr(off)
	if !c.addressable {
		return &memory{addr: addr, n: size, dev: true}, nil
	}
	b, err := v.Bytes()
	if err != nil {
		return nil, errors.WithAssertionFailure(err)
	}
	return &memory{b: b[off : off+size], addr: addr, n: size}, nil
}

// noViews is the refusal of a tensor on a driver with no memory to
// view (the sim driver).
func (c *Cache) noViews(what func() string) error {
	return errors.WithHint(errors.Wrapf(driver.ErrUnsupported, "%s: the %s driver has no memory to hand out (the cache keeps the books only)",
		what(), c.slots.Driver().Name()), "a simulation marks rows written with MarkWritten; tensors need the host, CUDA or AscendCL driver")
}

// emptyMem is no bytes at addr, for an empty tensor: device memory where
// the process does not address the cache's.
func (c *Cache) emptyMem(addr driver.Addr) *memory {
	return &memory{addr: addr, dev: !c.addressable}
}

// checkTokens refuses negative tokens.
func checkTokens(what func() string, tokens []int, from int) error {
	for i, t := range tokens {
		if t < 0 {
			return errors.Wrapf(driver.ErrInvalid, "%s: token %d at position %d is negative", what(), t, from+i)
		}
	}
	return nil
}

// Admit starts a sequence whose prompt is prompt (at least one token, at
// most MaxContext) with the extra key extra (adapters, salts: sequences
// share prefixes only under the same extra key). It takes a free slot,
// preferring one whose pages a freed sequence left committed, and finds
// the longest prefix of the prompt the prefix store holds: the sequence
// starts with those tokens (Len), their keys and values already there.
// The caller then appends the rest of the prompt (Append(prompt[Len():]))
// and writes it.
//
// Whole prompt units the store holds are borrowed (mapped at the
// sequence's own addresses, no copy); the next unit, when a cached unit
// continuing the same prefix shares some of its first whole blocks, is
// copied once into the sequence's own unit — if the budget has room for
// it, else the match stops at the whole units. At least the prompt's last
// token is left to compute.
//
// Admission never over-promises: Admit first plans the pages of the
// whole prompt — borrowed, kept, to commit, and the room giving back idle,
// cached and surplus pages makes — without a driver call, and refuses
// (ErrOutOfMemory, counted in Stats.FailedAdmits) a prompt the budget
// cannot hold now, having mapped, unmapped and committed nothing. It
// commits none of the prompt's own pages: the Append that follows,
// with no other call between, finds the room the plan counted.
// CanAdmit answers from the same plan.
//
// It refuses a prompt it cannot hold (ErrInvalid), and, with nothing
// changed, a cache whose slots all hold sequences (ErrBusy) or whose
// budget cannot hold the prompt (ErrOutOfMemory).
func (c *Cache) Admit(prompt []int, extra uint64) (*Seq, error) {
	what := func() string { return fmt.Sprintf("kvcache: admit a prompt of %d tokens", len(prompt)) }
	if err := c.made(what); err != nil {
		return nil, err
	}
	if len(prompt) == 0 {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: a prompt has at least one token", what())
	}
	if len(prompt) > c.cfg.MaxContext {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: MaxContext is %d tokens", what(), c.cfg.MaxContext)
	}
	c.mu.Lock()
	defer c.unlock()
	if err := c.usableLocked(what); err != nil {
		return nil, err
	}
	// Admit trusts nothing CanAdmit remembered of this slice: a caller
	// that rewrote it in place since would otherwise be served the old
	// prompt's prefix pages, and its tokens go unchecked. Admission copies
	// the prompt anyway, so checking and finding afresh costs it no more
	// in order.
	c.forgetAskedLocked()
	m, err := c.askLocked(what, prompt, extra)
	if err != nil {
		return nil, err
	}
	p := c.planAdmitLocked(m, len(prompt))
	sl := p.sl
	if sl == nil {
		return nil, errors.WithHint(errors.Wrapf(driver.ErrBusy, "%s: all %d slots hold sequences", what(), c.cfg.MaxSeqs),
			"free or finish a sequence first (MaxSeqs sets the slots)")
	}
	if !p.fits() {
		c.counts.failedAdmits++
		return nil, errors.WithHint(
			errors.Wrapf(driver.ErrOutOfMemory, "%s: its pages need %d of %s beyond those the prefix store lends and the slot keeps; the budget of %s has %d free or to give back",
				what(), p.need, units.Bytes(c.g.page), units.Bytes(c.budget), p.room),
			"ask CanAdmit first; free or preempt sequences, or raise the budget (SetBudget)")
	}
	return c.admitIntoLocked(what, sl, prompt, extra, m)
}

// admitIntoLocked makes the sequence of prompt (and extra) in slot sl,
// its admission planned and found to fit: it applies match m and files
// the sequence in.
func (c *Cache) admitIntoLocked(what func() string, sl *slot, prompt []int, extra uint64, m match) (*Seq, error) {
	c.tick++
	s := &Seq{c: c, sl: sl, prompt: append([]int(nil), prompt...), extra: extra, admitted: c.tick}
	// Out of the idle list while the match gives back the slot's pages
	// where the shared ones go (it is the one slot they are not taken
	// from), idle for the counters until the sequence is in.
	sl.admitting = true
	c.refileIdleLocked(sl)
	if err := c.matchLocked(what, s, m); err != nil {
		sl.admitting = false
		c.refileIdleLocked(sl)
		return nil, err
	}
	c.attachLocked(sl, s)
	c.seqs[s] = struct{}{}
	c.counts.admits++
	c.wantAheadLocked(sl)
	c.checkAfter("admit")
	return s, nil
}

// pickSlotLocked is the free slot a new sequence whose match is sus
// takes, or nil: the cheaper in driver calls of two. One is the slot that
// keeps the deepest of sus mapped (kept.go), which reuses the kept units
// that hold sus at their place and unmaps its other kept units; the other
// the slot with the fewest units kept mapped, then the most pages kept
// (the lowest of those), which unmaps every unit it keeps and maps the
// match afresh. Their costs are counted in maps, an unmap as unmapMaps:
// once the page pool is warm an unmap is the dearest call a commit makes
// (a kept slot whose last sequence's own prompt units follow the shared
// ones would unmap them all for a few reused units).
func (c *Cache) pickSlotLocked(sus []*storeUnit) *slot {
	kept, sl := c.keptSlotLocked(sus), c.fewestKeptFreeLocked()
	if kept == nil || kept == sl {
		return sl
	}
	reused := 0
	for u, su := range sus {
		if ui := kept.units[u]; ui.state == unitKept && ui.su == su {
			reused++
		}
	}
	if (kept.kept-reused)*unmapMaps <= sl.kept*unmapMaps+reused {
		return kept
	}
	return sl
}

// fewestKeptFreeLocked is the free slot keeping the fewest units mapped,
// then the one with the most pages of its own, the lowest of those; nil
// when every slot holds a sequence.
func (c *Cache) fewestKeptFreeLocked() *slot {
	var sl *slot
	for _, x := range c.slotList {
		if x.seq == nil && (sl == nil || x.kept < sl.kept || (x.kept == sl.kept && x.owned > sl.owned)) {
			sl = x
		}
	}
	return sl
}

// unmapMaps is what an unmap costs in maps, for pickSlotLocked: about
// the geometric mean of the two tables this project prices calls by
// (sim.A100: 25.6 µs an unmap, 1.45 µs a map, 17.7 maps; sim.H100: 22.25
// and 4.02 µs, 5.5 maps).
const unmapMaps = 10

// lock returns s's cache, locked, or why s cannot be used: a nil or zero
// sequence (ErrInvalid), a closed cache or a freed sequence (ErrClosed).
func (s *Seq) lock(what func() string) (*Cache, error) {
	if s == nil || s.c == nil {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: not a sequence made by Admit", what())
	}
	c := s.c
	c.mu.Lock()
	switch {
	case c.closed:
		c.mu.Unlock()
		return nil, errCacheClosed(what)
	case s.state == seqFreed:
		c.mu.Unlock()
		return nil, errSeqFreed(what)
	}
	return c, nil
}

// errCacheClosed and errSeqFreed are the errors of a call on a sequence
// whose cache is closed, or that was freed.
func errCacheClosed(what func() string) error {
	return errors.WithHint(driver.Closed(what()+": the cache is closed"),
		"the cache's Close ended every sequence: make a new cache with kvcache.New")
}

func errSeqFreed(what func() string) error {
	return errors.WithHint(driver.Closed(what()+": the sequence was freed"),
		"a sequence is done with after its Free: drop it (a second Free has nothing to do), or Admit a new one")
}

// liveLocked is lock's check again, for after a wait.
func (s *Seq) liveLocked(what func() string) error {
	switch {
	case s.c.closed:
		return errCacheClosed(what)
	case s.state == seqFreed:
		return errSeqFreed(what)
	}
	return nil
}

// runningLocked refuses a preempted sequence.
func (s *Seq) runningLocked(what func() string) error {
	if s.state != seqRunning {
		return errors.Wrapf(driver.ErrInvalid, "%s: the sequence is preempted; Resume it first", what())
	}
	return nil
}

// Append makes room for len(tokens) more tokens (at least one; up to
// MaxContext in all) and returns views of just their rows, for the
// caller to write the new keys and values into (and then say so:
// MarkWritten). Tokens inside the prompt must be the prompt's. Pages are
// committed as needed, in the slot or (for whole pages of the prompt) in
// the prefix store; an Append that had to commit or wait for a page
// itself counts in Stats.Waits.
//
// It refuses bad tokens (ErrInvalid), a preempted sequence (ErrInvalid),
// and pages the budget cannot hold once idle and cached pages are given
// back (ErrOutOfMemory); a refusal changes nothing.
func (s *Seq) Append(tokens []int) (Step, error) {
	what := func() string { return fmt.Sprintf("kvcache: append %d tokens", len(tokens)) }
	c, err := s.lock(what)
	if err != nil {
		return Step{}, err
	}
	defer c.unlock()
	what = func() string {
		return fmt.Sprintf("kvcache: append %d tokens to a sequence of %d in slot %d", len(tokens), s.n, s.sl.idx)
	}
	check := func() error { return c.appendableLocked(what, s, tokens) }
	if c.g.ring > 0 {
		if err := check(); err != nil {
			return Step{}, err
		}
		return c.ringAppendLocked(what, s, tokens)
	}
	// A unit the mapper is committing is waited for; the lock goes
	// meanwhile, so everything is checked again after. A fork's shared
	// last unit copied on write revokes the tensors: no access through
	// them may be in flight then either (fork.go).
	waited := false
	for {
		if c.revokePendingLocked(s) {
			if err := c.quiesceLocked(s, check); err != nil {
				return Step{}, err
			}
		}
		w, err := c.settleLocked(s, func() int { return c.g.unitsFor(s.n + len(tokens)) }, check)
		if err != nil {
			return Step{}, err
		}
		waited = waited || w
		if !w || !c.revokePendingLocked(s) {
			break
		}
	}
	// The units behind the window of the first token appended go first
	// (window.go): no token from here on attends to them. What earlier
	// releases left pooled past the window pool's bound goes before.
	c.boundWindowPoolLocked()
	if err := c.releaseBehindLocked(what, s); err != nil {
		return Step{}, err
	}
	pos, cnt := s.n, len(tokens)
	need := c.g.unitsFor(pos + cnt)
	if err := c.cowLocked(what, s, need, c.emptyPagesLocked(s.sl, c.g.unitsFor(pos), need)); err != nil {
		return Step{}, err
	}
	// The units below the sequence's tokens are committed (a running
	// sequence's invariant): only those the new tokens reach are looked at.
	var room [2]int // a decode step's Append backs one unit at most
	backed, err := c.backIntoLocked(what, s, c.g.unitsFor(pos), need, room[:0])
	if err != nil {
		return Step{}, err
	}
	s.generated.append(tokens[min(max(len(s.prompt)-pos, 0), cnt):])
	c.setLenLocked(s, pos+cnt)
	if c.views {
		step, err := c.stepLocked(s, pos, cnt)
		if err != nil {
			s.generated.truncate(max(pos-len(s.prompt), 0))
			c.setLenLocked(s, pos)
			return Step{}, errors.CombineErrors(err, c.unbackLocked(s.sl, backed))
		}
		c.appendedLocked(s, waited || len(backed) > 0)
		return step, nil
	}
	// No memory to view (the sim driver): the step is its positions.
	c.appendedLocked(s, waited || len(backed) > 0)
	return Step{Pos: pos, N: cnt}, nil
}

// appendableLocked refuses what Append (and Step) refuse of tokens for
// s: a freed or preempted sequence, no tokens, more than MaxContext in
// all, bad tokens, tokens inside the prompt that are not the prompt's.
func (c *Cache) appendableLocked(what func() string, s *Seq, tokens []int) error {
	if err := s.liveLocked(what); err != nil {
		return err
	}
	if err := s.runningLocked(what); err != nil {
		return err
	}
	if len(tokens) == 0 {
		return errors.Wrapf(driver.ErrInvalid, "%s: nothing to append", what())
	}
	if len(tokens) > c.cfg.MaxContext-s.n {
		return errors.WithHint(errors.Wrapf(driver.ErrInvalid, "%s: MaxContext is %d tokens", what(), c.cfg.MaxContext),
			"a longer context needs a cache with a larger MaxContext")
	}
	if err := checkTokens(what, tokens, s.n); err != nil {
		return err
	}
	for i, t := range tokens {
		if p := s.n + i; p < len(s.prompt) && s.prompt[p] != t {
			return errors.Wrapf(driver.ErrInvalid, "%s: token %d at position %d is not the prompt's %d", what(), t, p, s.prompt[p])
		}
	}
	return nil
}

// appendedLocked counts an Append of s that succeeded (waited: it
// committed or waited for a page) and lists s's slot for mapping ahead.
func (c *Cache) appendedLocked(s *Seq, waited bool) {
	c.counts.steps++
	if waited {
		c.counts.waits++
	}
	if c.cfg.MapAhead > 0 {
		c.wantAheadLocked(s.sl)
	}
	c.checkAfter("append")
}

// backLocked makes units [from, need) of s's slot committed (the caller
// knows those below from are): borrowed units stay; each empty one
// becomes a prefix store unit (a whole unit of the prompt, when sharing)
// or the slot's own. An owned unit stays the slot's own unless it is a
// page the slot kept from its last sequence (past s's tokens) under a
// whole unit of the prompt: that page is given back and the unit backed
// from the store like an empty one, so that every whole prompt unit is a
// store unit (the page's memory pays for the store unit's: no room is
// made for it). It returns the units it backed; a refusal (the budget)
// changes nothing, and an arena failure after the room is made leaves
// only what a reclaim would: pages given back.
//
// A store unit evicted to make room for the prompt's units keeps its
// memory for one of them (recycling): the new unit is written where the
// evicted one was, which saves a decommit and a commit — a chunk's
// release and create, unmap and map — per prompt page when the cache is
// full. What the room is made for, and which units are evicted, are as
// they would be without it; the memory not reused is decommitted before
// any of the slot's own pages are committed, so committed memory never
// exceeds the budget.
func (c *Cache) backLocked(what func() string, s *Seq, from, need int) (backed []int, err error) {
	return c.backIntoLocked(what, s, from, need, nil)
}

// backIntoLocked is backLocked appending the units it backed to backed
// (empty), whose memory it uses when there is room: Append's, on its
// stack, so that a unit committed allocates nothing here.
func (c *Cache) backIntoLocked(what func() string, s *Seq, from, need int, backed []int) ([]int, error) {
	sl := s.sl
	// todo is the units to back: the empty ones, and the kept pages to
	// re-back from the store (owned, past the tokens: what the last
	// sequence left, never what the mapper commits, which is never
	// store-bound).
	var room [2]int
	todo := room[:0]
	pages, bound := 0, 0
	past := c.g.unitsFor(s.n)
	for u := from; u < need; u++ {
		switch st := sl.units[u].state; {
		case st == unitEmpty:
			todo = append(todo, u)
			pages += c.g.unitPages()
			bound += b2i(c.storeBoundLocked(s, u))
		case st == unitOwned && u >= past && c.storeBoundLocked(s, u):
			todo = append(todo, u)
			bound++
		}
	}
	if len(todo) == 0 {
		return nil, nil
	}
	defer func() {
		if derr := c.dropSpareLocked(); derr != nil {
			c.lostErr = errors.CombineErrors(c.lostErr, derr) // reported by Check
		}
	}()
	c.ps.recycle = bound
	// Room for the empty units only; keep's units below need are not
	// given back for it, so the kept pages are still there after.
	if err := c.makeRoomLocked(what, pages, sl, need); err != nil {
		return nil, err
	}
	for i := 0; i < len(todo); {
		// A run of consecutive units, all store-bound or all not.
		u := todo[i]
		bound := c.storeBoundLocked(s, u)
		j := i + 1
		for j < len(todo) && todo[j] == todo[j-1]+1 && c.storeBoundLocked(s, todo[j]) == bound {
			j++
		}
		if bound {
			// The kept pages of the units the store can take go first:
			// their memory is the room for the store units' commits.
			k := min(j-i, c.storeRoomLocked())
			if err := c.giveBackKeptLocked(sl, todo[i:i+k]); err != nil {
				return nil, errors.CombineErrors(errors.Wrapf(err, "%s", what()), c.unbackLocked(sl, backed))
			}
			n := 0
			if k > 0 {
				var err error
				n, err = c.backFromStoreLocked(s, u, todo[i+k-1]+1)
				backed = append(backed, todo[i:i+n]...)
				if err != nil {
					return nil, errors.CombineErrors(errors.Wrapf(err, "%s", what()), c.unbackLocked(sl, backed))
				}
			}
			if i += n; i == j {
				continue
			}
			// The store is full of mapped units: the rest are the slot's
			// own (a kept page stays).
		}
		// Own units: one commit per region and run of empty units, once
		// the spare store units are given back.
		if err := c.dropSpareLocked(); err != nil {
			return nil, errors.CombineErrors(errors.Wrapf(err, "%s", what()), c.unbackLocked(sl, backed))
		}
		for i < j {
			if sl.units[todo[i]].state != unitEmpty {
				i++ // kept
				continue
			}
			k := i + 1
			for k < j && sl.units[todo[k]].state == unitEmpty {
				k++
			}
			if err := c.commitUnitsLocked(sl, todo[i], todo[k-1]+1); err != nil {
				return nil, errors.CombineErrors(errors.Wrapf(err, "%s", what()), c.unbackLocked(sl, backed))
			}
			backed = append(backed, todo[i:k]...)
			i = k
		}
	}
	return backed, nil
}

// giveBackKeptLocked decommits the kept pages among units us of sl
// (consecutive; the others are empty), one arena call per region and
// run, for the store units that take their place.
func (c *Cache) giveBackKeptLocked(sl *slot, us []int) error {
	for i := 0; i < len(us); {
		if sl.units[us[i]].state != unitOwned {
			i++
			continue
		}
		j := i + 1
		for j < len(us) && sl.units[us[j]].state == unitOwned {
			j++
		}
		if err := c.decommitUnitsLocked(sl, us[i], us[j-1]+1); err != nil {
			return err
		}
		c.counts.reclaimedPages += (j - i) * c.g.unitPages()
		i = j
	}
	return nil
}

// unbackLocked gives back the units backLocked backed.
func (c *Cache) unbackLocked(sl *slot, backed []int) error {
	var errs error
	for i := len(backed) - 1; i >= 0; i-- {
		errs = errors.CombineErrors(errs, c.decommitUnitsLocked(sl, backed[i], backed[i]+1))
	}
	return errs
}

// stepLocked makes the views of positions [pos, pos+cnt) of s.
func (c *Cache) stepLocked(s *Seq, pos, cnt int) (Step, error) {
	step := Step{Pos: pos, N: cnt}
	if !c.views || cnt == 0 {
		return step, nil
	}
	if err := c.coverLocked(s.sl, c.g.unitsFor(pos+cnt)); err != nil {
		return Step{}, err
	}
	g := c.g
	step.Layers = make([][]Rows, g.layers)
	for l := range step.Layers {
		for p := pos; p < pos+cnt; {
			end := pos + cnt
			if g.layout == TokenMajor {
				end = min(end, (p/g.tpg+1)*g.tpg) // the rest of p's group
			}
			var kv [2]*tensor.Tensor
			for k := range kv {
				t, err := c.rowsLocked(s.sl, l, k, p, end-p)
				if err != nil {
					return Step{}, err
				}
				kv[k] = t
			}
			step.Layers[l] = append(step.Layers[l], Rows{Pos: p, K: kv[0], V: kv[1]})
			p = end
		}
	}
	return step, nil
}

// rowsLocked is a tensor [n, KVHeads, HeadDim] over positions [p, p+n)
// of layer l's K (kv 0) or V (kv 1), which lie back to back (one group in
// TokenMajor).
func (c *Cache) rowsLocked(sl *slot, l, kv, p, n int) (*tensor.Tensor, error) {
	g := c.g
	r, off := 0, g.tokenOff(l, kv, p)
	switch g.layout {
	case PerLayer:
		r = 2*l + kv
		off -= g.unitOff(r, 0)
	case Contiguous:
		return c.strideRowsLocked(sl, l, kv, p, n)
	}
	off -= uint64(sl.coverLo) * g.unitBytes
	size := uint64(n) * g.row
	m, err := c.viewMem(sl.covers[r], off, size)
	if err != nil {
		return nil, err
	}
	return tensor.NewLeasedReadOnly(sl.leaseLocked(), m, c.sharedBytes(sl, off, size), g.dt, n, g.heads, g.dim)
}

// strideRowsLocked is, in the Contiguous layout, a tensor [n, KVHeads,
// HeadDim] over positions [p, p+n) of layer l's K (kv 0) or V (kv 1):
// strides [tokenBytes/elt, HeadDim, 1] over the bytes of tokens [p, p+n)
// of the slot.
func (c *Cache) strideRowsLocked(sl *slot, l, kv, p, n int) (*tensor.Tensor, error) {
	g := c.g
	off, size := uint64(p)*g.stride-uint64(sl.coverLo)*g.unitBytes, uint64(n)*g.stride
	m, err := c.viewMem(sl.covers[0], off, size)
	if err != nil {
		return nil, err
	}
	elt := uint64(g.elt)
	t, err := tensor.NewLeasedReadOnly(sl.leaseLocked(), m, c.sharedBytes(sl, off, size), g.dt, n, int(g.stride/elt))
	if err != nil {
		return nil, err
	}
	rowElts := int(g.row / elt)
	if t, err = t.Narrow(1, (2*l+kv)*rowElts, rowElts); err != nil {
		return nil, err
	}
	return t.Reshape(n, g.heads, g.dim)
}

// sharedBytes is how many bytes, from its start, of a tensor's memory at
// offset off (in its region's covered part, from unit coverLo) and size
// long lie in sl's shared units: read only (a prefix, since the shared
// units are the first held).
func (c *Cache) sharedBytes(sl *slot, off, size uint64) int {
	if sl.shared <= sl.coverLo {
		return 0
	}
	end := uint64(sl.shared-sl.coverLo) * c.g.unitBytes
	if end <= off {
		return 0
	}
	return int(min(end-off, size))
}

// Len is the number of tokens the sequence holds (0 for a nil or zero
// sequence).
func (s *Seq) Len() int {
	if s == nil || s.c == nil {
		return 0
	}
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	return s.n
}

// Tokens returns a copy of the sequence's tokens.
func (s *Seq) Tokens() []int {
	if s == nil || s.c == nil {
		return nil
	}
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	out := append([]int(nil), s.prompt[:min(s.n, len(s.prompt))]...)
	return s.generated.appendTo(out)
}

// Slot is the index of the sequence's slot: its memory lies at
// Cache.Base() + Slot()*Cache.SlotBytes() for its whole life.
func (s *Seq) Slot() int {
	if s == nil || s.c == nil {
		return -1
	}
	return s.sl.idx
}

// Matched is how many of the sequence's first tokens Admit (or the last
// Resume) found in the prefix store rather than leave to the caller.
func (s *Seq) Matched() int {
	if s == nil || s.c == nil {
		return 0
	}
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	return s.matched
}

// MarkWritten says the keys and values of the sequence's first n tokens
// are written, in every layer: what the caller computed into the rows
// Append (or Resume) handed out. The whole prompt units below n that the
// sequence put in the prefix store become matchable now: the next Admit
// of a prompt that starts the same way maps them. Nothing is matchable
// before it is marked, so a sequence cancelled or preempted before its
// rows were computed never serves zeros to another. Rows once marked are
// final: writing them again changes what the sequences sharing them read.
// Written means written before any reader's kernels run: an engine whose
// steps run in order on one stream may mark a step's rows once it has
// enqueued the step (a sequence that matches them is computed by a later
// step, which the stream runs after it), as vLLM's block table caches a
// block when it schedules it — so that a request admitted a step ahead,
// while that step computes, shares what it computes. An engine whose step
// writes every sequence's keys and values of a layer before that layer's
// attention reads any (vLLM's forward: the cache write, then attention)
// may mark them as soon as it has scheduled them into a step, so that a
// sequence scheduled into the same step reads them there; it must not
// then take them out of the step (cancel or preempt the sequence before
// the step is enqueued).
//
// n only grows, from Written() to Len(). It refuses n outside that range
// and a preempted sequence (ErrInvalid: Resume it first; after Drop its
// rows are gone), a freed sequence or closed cache (ErrClosed), and
// changes nothing then.
func (s *Seq) MarkWritten(n int) error {
	what := func() string { return fmt.Sprintf("kvcache: mark %d tokens written", n) }
	c, err := s.lock(what)
	if err != nil {
		return err
	}
	defer c.unlock()
	if err := s.runningLocked(what); err != nil {
		return err
	}
	if n < s.written || n > s.n {
		return errors.WithHint(errors.Wrapf(driver.ErrInvalid, "%s: the sequence holds %d tokens, %d of them marked written already (the count only grows)",
			what(), s.n, s.written), "mark a count from Written() to Len()")
	}
	s.written = n
	c.publishLocked(s, n)
	c.checkAfter("mark written")
	return nil
}

// Written is how many of the sequence's first tokens hold their keys and
// values: those marked (MarkWritten), matched from the prefix store, or
// brought back by a swap; 0 for a nil, zero or dropped sequence.
func (s *Seq) Written() int {
	if s == nil || s.c == nil {
		return 0
	}
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	return s.written
}

// K returns the keys of layer stored so far, over the cache's memory (no
// copy). PerLayer: a row-major tensor [Len, KVHeads, HeadDim].
// Contiguous: a strided tensor [Len, KVHeads, HeadDim] whose first
// stride is a token's bytes over all layers (2*Layers*KVHeads*HeadDim
// elements).
// TokenMajor: a strided tensor [groups, TokensPerGroup, KVHeads, HeadDim]
// whose strides step over whole page groups; position p is [p/tpg, p%tpg],
// and the rows of the last group at and past Len hold no token (their
// bytes are unspecified).
//
// The rows of the units the sequence shares with others — the whole units
// below Matched that Admit or Resume mapped from the prefix store — are
// read-only: Set there, or Copy into them, is refused (ErrAccessDenied),
// and where the driver can (host, CUDA, AscendCL) the pages are mapped
// read-only too: a store through a slice Data handed out faults there
// rather than change what the other sequences read. Do not write there.
//
// The tensor, like Append's views, is valid while the sequence runs: once
// it is preempted or freed, or the cache closed, it and its views answer
// ErrClosed (the memory may be given back; see Lifetimes in the package
// doc). On the CUDA and AscendCL drivers it is a device tensor, as
// Append's rows are. It refuses a bad layer (ErrInvalid), a preempted
// sequence (ErrInvalid) and the sim driver, which has no memory
// (ErrUnsupported).
func (s *Seq) K(layer int) (*tensor.Tensor, error) { return s.stored(layer, 0) }

// V returns the values of layer, as K returns the keys.
func (s *Seq) V(layer int) (*tensor.Tensor, error) { return s.stored(layer, 1) }

func (s *Seq) stored(layer, kv int) (*tensor.Tensor, error) {
	what := func() string { return fmt.Sprintf("kvcache: %s of layer %d", [2]string{"K", "V"}[kv], layer) }
	c, err := s.lock(what)
	if err != nil {
		return nil, err
	}
	defer c.mu.Unlock()
	if err := s.runningLocked(what); err != nil {
		return nil, err
	}
	g := c.g
	if layer < 0 || layer >= g.layers {
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: the model has layers 0 to %d", what(), g.layers-1)
	}
	if !c.views {
		return nil, c.noViews(what)
	}
	if g.ring > 0 {
		return c.ringStoredLocked(s, layer, kv)
	}
	k := g.unitsFor(s.n)
	if err := c.coverLocked(s.sl, k); err != nil {
		return nil, err
	}
	r := 0
	if g.layout == PerLayer {
		r = 2*layer + kv
	}
	lo := s.sl.lo // the first unit held: 0 but behind a window
	addr := c.slots.Base() + driver.Addr(c.slotOff(s.sl, r, lo))
	// mem is [off, off+size) of region r from unit lo: none when the
	// sequence holds no unit (its covers are not made).
	mem := func(off, size uint64) (*memory, error) {
		if size == 0 {
			return c.emptyMem(addr + driver.Addr(off)), nil
		}
		return c.viewMem(s.sl.covers[r], off, size)
	}
	start := c.windowStartLocked(s) // 0 but behind a window
	switch g.layout {
	case PerLayer:
		off := uint64(start)*g.row - uint64(lo)*g.unitBytes
		size := uint64(s.n-start) * g.row
		m, err := mem(off, size)
		if err != nil {
			return nil, err
		}
		return tensor.NewLeasedReadOnly(s.sl.leaseLocked(), m, c.sharedBytes(s.sl, off, size), g.dt, s.n-start, g.heads, g.dim)
	case Contiguous:
		if s.n == start {
			return tensor.NewLeasedReadOnly(s.sl.leaseLocked(), c.emptyMem(addr), 0, g.dt, 0, g.heads, g.dim)
		}
		return c.strideRowsLocked(s.sl, layer, kv, start, s.n-start)
	}
	elt := uint64(g.elt)
	size := uint64(k-lo) * g.unitBytes
	m, err := mem(0, size)
	if err != nil {
		return nil, err
	}
	t, err := tensor.NewLeasedReadOnly(s.sl.leaseLocked(), m, c.sharedBytes(s.sl, 0, size), g.dt, k-lo, int(g.unitBytes/elt))
	if err != nil {
		return nil, err
	}
	rowElts := int(g.row / elt)
	if t, err = t.Narrow(1, (2*layer+kv)*g.tpg*rowElts, g.tpg*rowElts); err != nil {
		return nil, err
	}
	return t.Reshape(k-lo, g.tpg, g.heads, g.dim)
}

// Free ends the sequence: what it borrowed from the prefix store is given
// back (the store keeps it cached) but stays mapped in its slot, kept for
// the slot's next sequence (no unmap; see Stats.KeptUnits), its slot's
// own pages stay committed
// for the next sequence put in the slot until memory is needed elsewhere
// (deferred reclaim). It publishes nothing: the whole prompt units that
// MarkWritten covered are matchable already, and the ones it did not
// cover — a sequence cancelled before its keys and values were computed —
// are given back unpublished, never served to another sequence. A
// preempted sequence may be freed. Freeing twice is ErrClosed.
func (s *Seq) Free() error {
	what := func() string { return "kvcache: free a sequence" }
	c, err := s.lock(what)
	if err != nil {
		return err
	}
	defer c.unlock()
	if err := c.quiesceLocked(s, func() error { return s.liveLocked(what) }); err != nil {
		return err
	}
	c.tick++
	s.sl.freedAt = c.tick // before the slot goes idle: the idle list is in this order
	err = c.endLocked(s)
	c.counts.frees++
	c.checkAfter("free")
	return err
}

// endLocked ends s: its views and borrowed units go, its swap buffer too,
// its slot is free (keeping its own pages).
func (c *Cache) endLocked(s *Seq) error {
	sl := s.sl
	sl.revokeLocked()
	errs := c.releaseCoversLocked(sl)
	// Its borrowed units of listed store units stay mapped, kept for the
	// slot's next sequence (kept.go); the others go, last to first, as
	// decommitUnitsLocked gives them back: the chain's end is evicted
	// first. Borrowed units are whole units of the prompt, or units a fork
	// shares: the walk starts at the end of both.
	errs = errors.CombineErrors(errs, c.leaveLocked(sl, max(c.g.unitsFor(len(s.prompt)), s.forked), true))
	if sl.borrowed > 0 {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf("kvcache: slot %d borrows %d units past its prompt and its forks' units", sl.idx, sl.borrowed))
	}
	errs = errors.CombineErrors(errs, c.dropSwapLocked(s))
	c.setLoLocked(sl, 0) // the units behind its window are empty
	errs = errors.CombineErrors(errs, c.releaseRingLocked(sl))
	if sl.borrowed == 0 {
		sl.shared = 0 // the last decommit kept those below it: behind a window, none
	}
	c.setStateLocked(s, seqFreed)
	s.unpublished = nil
	c.detachLocked(sl)
	delete(c.seqs, s)
	return errs
}
