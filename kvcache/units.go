package kvcache

import (
	"fmt"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/tensor"
)

// A sequence's memory seen unit by unit, for moving it whole to another
// cache (disaggregated prefill and decode: a transfer engine reads the
// prefill side's units and writes the decode side's). Unit u is the same
// tokens in every cache of the same Layers, KVHeads, HeadDim, DType,
// PageSize and Layout, so its bytes copied extent by extent are that
// other cache's unit u.

// UnitsFor is how many units, from unit 0, the first n tokens of a
// sequence reach (0 for a nil or zero cache, or n <= 0).
func (c *Cache) UnitsFor(n int) int {
	if c == nil || c.g == nil || n <= 0 {
		return 0
	}
	return c.g.unitsFor(min(n, c.g.maxCtx))
}

// UnitTokens is [start, end): the positions with bytes in unit u. In the
// TokenMajor layout a unit holds TokensPerGroup positions; in PerLayer a
// page of every region, so a position whose row crosses a page lies in two
// units; in Contiguous one page, a position whose bytes cross its
// boundary lying in two. It is (0, 0) for a unit no slot has, and for a nil or zero cache.
func (c *Cache) UnitTokens(u int) (start, end int) {
	if c == nil || c.g == nil || u < 0 || u >= c.g.units {
		return 0, 0
	}
	start, end = c.g.unitTokens(u)
	return start, min(end, c.g.maxCtx)
}

// SharedUnits is how many of the sequence's first units it maps from the
// prefix store because Admit (or the last Resume) matched them, or a fork
// shares them (Fork): other sequences read them too, so they are
// read-only here (K, V, Append's rows and UnitBytes refuse writes to
// them). A match's tokens are below Matched; the unit after them may hold
// matched tokens copied into the sequence's own page. A fork's are every
// unit the tokens reach at the fork, until an Append copies (or, the last
// sharer, takes back) the partly written last one. 0 for a nil, zero,
// freed or preempted sequence.
func (s *Seq) SharedUnits() int {
	if s == nil || s.c == nil {
		return 0
	}
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	if s.state != seqRunning || s.sl == nil || s.sl.seq != s {
		return 0
	}
	return s.sl.shared
}

// UnitBytes returns unit u's memory as uint8 tensors over the cache's
// memory (no copy), one per contiguous extent, in slot order: in the
// TokenMajor layout one, the unit's page group ([layer][K, V][tokens]
// rows); in Contiguous one, the unit's page (the bytes of the tokens it
// holds, [token][layer][K, V], the first and last possibly in part); in
// PerLayer 2*Layers, the unit's page of layer 0's K, layer 0's
// V, layer 1's K, and so on. What a transfer engine registers to move a
// sequence's keys and values to another cache of the same shape, unit by
// unit.
//
// u must be a unit the sequence holds: 0 <= u < UnitsFor(Len()). The bytes
// past the sequence's tokens, in its last unit, are unspecified. The
// tensors of a shared unit (u < SharedUnits()) are read-only: Set, or
// Copy into them, is ErrAccessDenied. Like K and V, the tensors are valid
// while the sequence runs: once it is preempted or freed, the cache
// closed, or the unit's pages taken back, they answer ErrClosed.
//
// On the CUDA and AscendCL drivers, whose memory this process does not
// address, the tensors are device tensors: a transfer engine with
// staging (transfer.Config.Staging) registers them and moves their bytes
// with the driver's copies.
//
// It refuses a unit the sequence does not hold and a preempted sequence
// (ErrInvalid), a freed sequence or closed cache (ErrClosed), and the sim
// driver, which has no memory (ErrUnsupported); a refusal changes
// nothing.
func (s *Seq) UnitBytes(u int) ([]*tensor.Tensor, error) {
	what := func() string { return fmt.Sprintf("kvcache: bytes of unit %d", u) }
	c, err := s.lock(what)
	if err != nil {
		return nil, err
	}
	defer c.mu.Unlock()
	if err := s.runningLocked(what); err != nil {
		return nil, err
	}
	if err := c.ringUnsupported(what); err != nil {
		return nil, err
	}
	g := c.g
	k := g.unitsFor(s.n)
	if u < s.sl.lo || u >= k {
		return nil, errors.WithHint(errors.Wrapf(driver.ErrInvalid, "%s: the sequence of %d tokens in slot %d holds units %d to %d",
			what(), s.n, s.sl.idx, s.sl.lo, k-1), "UnitsFor(Len()) is the number of units a sequence holds; a window's start at WindowStart()")
	}
	if !c.views {
		return nil, c.noViews(what)
	}
	if err := c.coverLocked(s.sl, k); err != nil {
		return nil, err
	}
	off, size := uint64(u-s.sl.coverLo)*g.unitBytes, g.unitBytes
	out := make([]*tensor.Tensor, g.regions)
	for r := range out {
		m, err := c.viewMem(s.sl.covers[r], off, size)
		if err != nil {
			return nil, err
		}
		t, err := tensor.NewLeasedReadOnly(s.sl.leaseLocked(), m, c.sharedBytes(s.sl, off, size), tensor.Uint8, int(size))
		if err != nil {
			return nil, errors.WithAssertionFailure(err)
		}
		out[r] = t
	}
	return out, nil
}
