package main

import (
	"fmt"
	"strings"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/memsvg"
	"github.com/vmarena/vmarena/internal/units"
)

// The memory map as pictures (-svg DIR): the first step, the first step
// at which running sequences share prefix pages (the same chunk mapped in
// several slots), and each change of the budget. Without -svg s.pics is
// nil and none is drawn.

// stepPictures draws the pictures of a step that is not a budget change:
// the first, and the first with shared pages.
func (s *server) stepPictures() error {
	if s.pics == nil {
		return nil
	}
	if s.step == 1 {
		return s.picture("first-step", "the first requests admitted, their prompts committed")
	}
	if st := s.c.Stats(); !s.drewSharing && st.SavedBytes > 0 {
		s.drewSharing = true
		return s.picture("sharing", fmt.Sprintf("%d running sequences map %d prefix pages that two or more of them share: one chunk in several slots",
			st.Running, st.SharedPages))
	}
	return nil
}

// picture draws the memory map now: the slots, each marked, and the
// prefix store.
func (s *server) picture(slug, what string) error {
	st := s.c.Stats()
	p := s.pics.Picture(fmt.Sprintf("Step %d: %s", s.step, what))
	p.Notes = []string{fmt.Sprintf("%d served, %d running, %d swapped out, %d waiting; %s committed, %s spared by sharing prefix pages.",
		s.served, len(s.running), len(s.swapped), len(s.reqs)-s.queued, units.Bytes(st.Committed), units.Bytes(st.SavedBytes))}
	base, slot := s.c.Base(), s.c.SlotBytes()
	for i := range p.Ranges {
		r := &p.Ranges[i]
		if driver.Addr(r.Base) != base {
			r.Name = "the prefix store's range"
			continue
		}
		r.Name = "the slots"
		for sl := range maxSeqs {
			r.Marks = append(r.Marks, memsvg.Mark{Offset: uint64(sl) * slot, Text: fmt.Sprintf("slot %d", sl)})
		}
	}
	return s.pics.Write(slug, p)
}

// budgetPicture draws the memory map after the budget changed to b.
func (s *server) budgetPicture(b uint64, why string, swapped int) error {
	if s.pics == nil {
		return nil
	}
	return s.picture("budget-"+strings.ReplaceAll(strings.ToLower(units.Bytes(b)), " ", "-"),
		fmt.Sprintf("budget %s (%s), %s swapped out", units.Bytes(b), why, plural(swapped, "sequence", "sequences")))
}
