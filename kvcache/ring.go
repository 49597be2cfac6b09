package kvcache

import (
	"fmt"
	"math/bits"
	"slices"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/tensor"
)

// The double-mapped ring (Config.Ring, with a Window W, in the PerLayer
// layout only): each region of a slot — one layer's K, or its V — is a
// ring of R pages whose physical pages are mapped twice back to back, at
// [0, R) and again at [R, 2R) of the region. The token at position p
// lives at ring offset (p*row) mod (R*page); since the mirror follows the
// ring, any run of up to R*page/row consecutive tokens is one contiguous
// slice of the region with one row stride — the last W tokens above all,
// which an unmodified attention kernel then reads with no copy and no
// block table. R is the fewest pages that hold W + BlockTokens rows: an
// Append of up to ringCap-W+1 tokens (at least BlockTokens+1) writes
// where no token its first token attends to lies.
//
// The ring's pages belong to a range of their own (Cache.ring: R pages a
// region, MaxSeqs*2*Layers regions), committed whole at a sequence's
// first Append and borrowed twice into its slot: one handle mapped at two
// addresses (the host driver maps a memfd's pages twice; CUDA's
// cuMemMap maps one allocation handle at several virtual addresses, and
// AscendCL's aclrtMapMem a handle likewise: each driver's Map takes a
// handle and an address, as the prefix store's borrowing already uses).
// A slot's units stay empty: a ring holds no unit of the slot range's
// own, shares nothing through the prefix store (NoPrefixSharing is
// needed), and is given back whole when its sequence ends. Reserve
// commits the rings ahead of the first Append (ringReserveLocked);
// Preempt, Fork and UnitBytes refuse a ring cache (ErrUnsupported, with
// ringHint's reason).

// ringGeometry sets g's ring for a window of w tokens: R the fewest
// pages that hold w + BlockTokens rows, each region two rings long.
func (g *geometry) ringGeometry(w int) error {
	// Every step is checked: BlockTokens is the caller's, of any size.
	rows := uint64(w) + uint64(g.block)
	hi, need := bits.Mul64(rows, g.row)
	r := need/g.page + uint64(b2i(need%g.page != 0))
	if hi != 0 || r > 1<<30 {
		return fmt.Errorf("a ring of %d rows of %s overflows", rows, units.Bytes(g.row))
	}
	g.ring = int(r)
	g.ringCap = int(r * g.page / g.row)
	g.regionBytes = 2 * r * g.page
	g.units = 2 * g.ring
	return nil
}

// ringPages is the pages one slot's rings take: R in every region.
func (g *geometry) ringPages() int { return g.regions * g.ring }

// ringOff is the offset in the ring range of slot sl's region r's ring.
func (c *Cache) ringOff(sl *slot, r int) uint64 {
	return uint64(sl.idx*c.g.regions+r) * uint64(c.g.ring) * c.g.page
}

// openRing makes the ring range (none without Config.Ring).
func (c *Cache) openRing() error {
	g := c.g
	if g.ring == 0 {
		return nil
	}
	size := uint64(c.cfg.MaxSeqs) * uint64(g.ringPages()) * g.page
	r, err := arena.NewSparse(c.space, c.mem, arena.SparseOptions{
		Max: size, ChunkSize: g.page, MaxChunk: g.page, Device: c.cfg.Device, Pool: c.pool,
	})
	if err != nil {
		return errors.Wrapf(err, "kvcache: new cache: the rings' range of %s", units.Bytes(size))
	}
	c.ring = r
	return nil
}

// ringAppendableLocked refuses an Append of n tokens to a ring that
// would write over a token the first of them attends to.
func (c *Cache) ringAppendableLocked(what func() string, n int) error {
	if most := c.g.ringCap - c.cfg.Window + 1; n > most {
		return errors.WithHint(errors.Wrapf(driver.ErrInvalid, "%s: a ring holds %d rows and a window of %d tokens: at most %d tokens an Append",
			what(), c.g.ringCap, c.cfg.Window, most), "append a prompt in chunks")
	}
	return nil
}

// ensureRingLocked commits sl's rings and maps each twice, back to back,
// in its regions, once the budget has room (ErrOutOfMemory otherwise);
// on failure nothing changed.
func (c *Cache) ensureRingLocked(what func() string, sl *slot) error {
	if sl.ring {
		return nil
	}
	g := c.g
	need := g.ringPages()
	if err := c.makeRoomLocked(what, need, sl, 0); err != nil {
		return err
	}
	n := uint64(g.ring) * g.page
	done := 0 // regions committed and mapped twice
	undo := func(err error) error {
		for r := done - 1; r >= 0; r-- {
			err = errors.CombineErrors(err, c.dropRingRegion(sl, r))
		}
		return err
	}
	for r := 0; r < g.regions; r++ {
		off := c.ringOff(sl, r)
		if err := c.ring.Commit(off, n); err != nil {
			return undo(errors.Wrapf(err, "%s: commit the ring of region %d of slot %d", what(), r, sl.idx))
		}
		if err := c.slots.Borrow(c.slotOff(sl, r, 0), c.ring, off, n); err != nil {
			return undo(errors.CombineErrors(errors.Wrapf(err, "%s: map the ring of region %d of slot %d", what(), r, sl.idx), c.ring.Decommit(off, n)))
		}
		if err := c.slots.Borrow(c.slotOff(sl, r, g.ring), c.ring, off, n); err != nil {
			err = errors.Wrapf(err, "%s: map the ring of region %d of slot %d a second time", what(), r, sl.idx)
			err = errors.CombineErrors(err, c.slots.Decommit(c.slotOff(sl, r, 0), n))
			return undo(errors.CombineErrors(err, c.ring.Decommit(off, n)))
		}
		done++
		c.counts.commits++
		c.counts.borrows += 2
	}
	sl.ring = true
	c.pages += need
	c.ringPages += need
	return nil
}

// dropRingRegion unmaps both mappings of sl's region r's ring and gives
// its pages back.
func (c *Cache) dropRingRegion(sl *slot, r int) error {
	n := uint64(c.g.ring) * c.g.page
	err := c.slots.Decommit(c.slotOff(sl, r, 0), 2*n)
	return errors.CombineErrors(err, c.ring.Decommit(c.ringOff(sl, r), n))
}

// releaseRingLocked gives back sl's rings, when it has them: its
// tensors end first.
func (c *Cache) releaseRingLocked(sl *slot) error {
	if !sl.ring {
		return nil
	}
	sl.revokeLocked()
	errs := c.releaseCoversLocked(sl)
	for r := 0; r < c.g.regions; r++ {
		errs = errors.CombineErrors(errs, c.dropRingRegion(sl, r))
		c.counts.decommits++
	}
	sl.ring = false
	c.pages -= c.g.ringPages()
	c.ringPages -= c.g.ringPages()
	if errs != nil {
		return errors.WithAssertionFailure(errors.Wrapf(errs, "kvcache: give back the rings of slot %d", sl.idx))
	}
	return nil
}

// ringStartLocked is the first position s's ring still holds for its
// window: the first its last Append's first token attends to.
func (c *Cache) ringStartLocked(s *Seq) int { return min(max(s.ringFrom, 0), s.n) }

// ringAppendLocked is Append on a ring cache: the rings committed at the
// first, then the tokens' rows handed out at their ring offsets.
func (c *Cache) ringAppendLocked(what func() string, s *Seq, tokens []int) (Step, error) {
	if err := c.ringAppendableLocked(what, len(tokens)); err != nil {
		return Step{}, err
	}
	waited := !s.sl.ring
	if err := c.ensureRingLocked(what, s.sl); err != nil {
		return Step{}, err
	}
	pos, cnt := s.n, len(tokens)
	s.generated.append(tokens[min(max(len(s.prompt)-pos, 0), cnt):])
	c.setLenLocked(s, pos+cnt)
	prevFrom := s.ringFrom
	s.ringFrom = max(pos+1-c.cfg.Window, 0)
	step := Step{Pos: pos, N: cnt}
	if c.views {
		var err error
		if step, err = c.ringStepLocked(s, pos, cnt); err != nil {
			s.ringFrom = prevFrom
			s.generated.truncate(max(pos-len(s.prompt), 0))
			c.setLenLocked(s, pos)
			return Step{}, err
		}
	}
	c.appendedLocked(s, waited)
	return step, nil
}

// ringStepLocked makes the views of positions [pos, pos+cnt) of s: one
// run a layer, each of K and V one slice of its ring.
func (c *Cache) ringStepLocked(s *Seq, pos, cnt int) (Step, error) {
	step := Step{Pos: pos, N: cnt, Layers: make([][]Rows, c.g.layers)}
	for l := range step.Layers {
		var kv [2]*tensor.Tensor
		for k := range kv {
			t, err := c.ringRowsLocked(s.sl, l, k, pos, cnt)
			if err != nil {
				return Step{}, err
			}
			kv[k] = t
		}
		step.Layers[l] = []Rows{{Pos: pos, K: kv[0], V: kv[1]}}
	}
	return step, nil
}

// ringRowsLocked is a tensor [n, KVHeads, HeadDim] over positions [p,
// p+n) of layer l's K (kv 0) or V (kv 1) in sl's ring: one slice from
// (p*row) mod (R*page), into the mirror where it wraps. n is at most the
// ring's rows.
func (c *Cache) ringRowsLocked(sl *slot, l, kv, p, n int) (*tensor.Tensor, error) {
	g := c.g
	if err := c.coverLocked(sl, g.units); err != nil {
		return nil, err
	}
	off := uint64(p) * g.row % (uint64(g.ring) * g.page)
	size := uint64(n) * g.row
	m, err := c.viewMem(sl.covers[2*l+kv], off, size)
	if err != nil {
		return nil, err
	}
	return tensor.NewLeasedReadOnly(sl.leaseLocked(), m, 0, g.dt, n, g.heads, g.dim)
}

// ringStoredLocked is K or V of layer in a ring cache: positions
// [WindowStart, Len) as one slice of the ring.
func (c *Cache) ringStoredLocked(s *Seq, layer, kv int) (*tensor.Tensor, error) {
	start := c.ringStartLocked(s)
	if !s.sl.ring {
		return tensor.NewLeasedReadOnly(s.sl.leaseLocked(), c.emptyMem(c.slots.Base()+driver.Addr(c.slotOff(s.sl, 2*layer+kv, 0))), 0, c.g.dt, 0, c.g.heads, c.g.dim)
	}
	return c.ringRowsLocked(s.sl, layer, kv, start, s.n-start)
}

// ringReserveLocked is Reserve on a ring cache: a sequence's rings hold
// the rows of every token it will append (they wrap), so once they are
// committed every token has its pages; before its first Append they are
// committed here if the budget's free pages hold them (no room is made:
// 0 tokens reserved otherwise, nothing changed).
func (c *Cache) ringReserveLocked(what func() string, s *Seq, n int) (int, error) {
	if !s.sl.ring {
		if n == 0 || c.freePagesLocked() < c.g.ringPages() {
			return 0, nil
		}
		if err := c.ensureRingLocked(what, s.sl); err != nil {
			return 0, err
		}
		c.checkAfter("reserve")
	}
	return n, nil
}

// ringUnsupported refuses, for a ring cache, a call rings do not have.
func (c *Cache) ringUnsupported(what func() string) error {
	if c.g.ring == 0 {
		return nil
	}
	return errors.WithHint(errors.Wrapf(driver.ErrUnsupported, "%s: a ring cache (Config.Ring) keeps each sequence's window in its rings only", what()), ringHint)
}

// ringHint says why a ring refuses what needs units, and what to do: a
// swap copies units out and back; a recompute keeps them in the prefix
// store for Resume; a fork shares whole pages with its parent. A ring has
// no unit and no store, and its pages are written over as it wraps, so a
// page shared with a fork would change under the other side.
const ringHint = "a ring holds no units: swap preemption copies units, recompute keeps them in the prefix store, " +
	"a fork shares pages the ring writes over as it wraps; free the sequence and admit its tokens again " +
	"(what a recompute costs), or use Config.Window without Ring"

// checkRingLocked checks the rings: a slot has them only while it holds a
// running sequence that appended, and the pages counted are theirs; it
// returns the pages the ring range must hold.
func (c *Cache) checkRingLocked(fail func(string, ...any)) int {
	if c.g.ring == 0 {
		return 0
	}
	n := 0
	for _, sl := range c.slotList {
		if !sl.ring {
			continue
		}
		n += c.g.ringPages()
		if sl.seq == nil || sl.seq.state != seqRunning {
			fail("slot %d keeps its rings without a running sequence", sl.idx)
		}
		if sl.owned != 0 || sl.borrowed != 0 {
			fail("slot %d of a ring cache holds %d owned and %d borrowed units", sl.idx, sl.owned, sl.borrowed)
		}
	}
	if n != c.ringPages {
		fail("the slots' rings take %d pages, %d counted", n, c.ringPages)
	}
	if !c.closed {
		if got := c.ring.Committed(); got != uint64(n)*c.g.page {
			fail("the ring range holds %s, the rings %d pages", units.Bytes(got), n)
		}
	}
	return n
}

// ringStepBatchLocked is Step on a ring cache: every request checked as
// Append checks it, the rings of the sequences that have none yet
// committed (the budget is asked for all of them first: a refusal
// changes nothing), then each request's rows handed out at their ring
// offsets.
func (c *Cache) ringStepBatchLocked(what func() string, batch []StepRequest, plan []stepPlan, into []SeqStep) ([]SeqStep, error) {
	fresh := 0
	for k := range plan {
		p := &plan[k]
		s := p.s
		pwhat := func() string {
			return fmt.Sprintf("%s: request %d, %d tokens to the sequence of %d in slot %d", what(), p.i, len(p.tokens), s.n, s.sl.idx)
		}
		if err := c.appendableLocked(pwhat, s, p.tokens); err != nil {
			return nil, err
		}
		if err := c.ringAppendableLocked(pwhat, len(p.tokens)); err != nil {
			return nil, err
		}
		fresh += b2i(!s.sl.ring)
	}
	need := fresh * c.g.ringPages()
	idle, surplus := c.reclaimableLocked(nil, 0)
	if can := c.freePagesLocked() + idle + surplus + c.evictablePagesLocked(); need > can {
		return nil, errors.WithHint(
			errors.Wrapf(driver.ErrOutOfMemory, "%s: the rings of its %d sequences without one need %d pages of %s; the budget of %s can give %d",
				what(), fresh, need, units.Bytes(c.g.page), units.Bytes(c.budget), can),
			"step fewer sequences, free some, or raise the budget (SetBudget)")
	}
	for k := range plan {
		p := &plan[k]
		if p.done = !p.s.sl.ring; !p.done {
			continue
		}
		if err := c.ensureRingLocked(what, p.s.sl); err != nil {
			for q := k - 1; q >= 0; q-- {
				if plan[q].done {
					err = errors.CombineErrors(err, c.releaseRingLocked(plan[q].s.sl))
					plan[q].done = false
				}
			}
			return nil, err
		}
	}
	out := slices.Grow(into[:0], len(batch))[:len(batch)]
	for k := range plan {
		p := &plan[k]
		s := p.s
		p.pos = s.n
		s.generated.append(p.tokens[min(max(len(s.prompt)-p.pos, 0), len(p.tokens)):])
		c.setLenLocked(s, p.pos+len(p.tokens))
		s.ringFrom = max(p.pos+1-c.cfg.Window, 0)
		st := Step{Pos: p.pos, N: len(p.tokens)}
		if batch[p.i].Views && c.views {
			var err error
			if st, err = c.ringStepLocked(s, p.pos, len(p.tokens)); err != nil {
				return nil, errors.WithAssertionFailure(errors.Wrapf(err, "%s: request %d", what(), p.i))
			}
		}
		out[p.i] = SeqStep{Seq: s, Base: c.slots.Base() + driver.Addr(c.slotOff(s.sl, 0, 0)), Len: s.n, Step: st}
		c.counts.steps++
		if p.done {
			c.counts.waits++ // its rings were committed by the step
		}
	}
	c.checkAfter("step")
	return out, nil
}
