package kvcache

import (
	"fmt"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// CanResume says whether Resume would bring the preempted sequence back
// now in every group, and the Append of more tokens after it (up to
// MaxContext in all) would fit, with no other call between: it answers
// from Resume's plan (every group's pages, its recurrent state), changing
// nothing. It refuses a running sequence or a negative more (ErrInvalid),
// a freed one or a closed cache (ErrClosed).
func (s *HybridSeq) CanResume(more int) (bool, error) {
	what := func() string {
		return fmt.Sprintf("kvcache: hybrid: can a sequence resume and take %d more tokens", more)
	}
	h, err := s.lock(what)
	if err != nil {
		return false, err
	}
	defer h.unlock()
	switch {
	case s.running:
		return false, errors.Wrapf(driver.ErrInvalid, "%s: it is running, not preempted", what())
	case more < 0:
		return false, errors.Wrapf(driver.ErrInvalid, "%s: a negative count", what())
	}
	needs := make([]need, len(h.groups))
	for i, gs := range s.seqs {
		if gs == nil {
			continue
		}
		c := gs.c
		c.mu.Lock()
		p := c.planResumeLocked(gs, upTo(gs.n, more, c.cfg.MaxContext))
		c.mu.Unlock()
		needs[i] = need{uint64(p.need) * c.g.page, uint64(max(p.room, 0)) * c.g.page}
	}
	var rn, rr uint64
	if h.rec != nil && s.state == nil {
		rn, rr = h.recNeedLocked(nil)
	}
	return h.fits(needs, rn, rr), nil
}
