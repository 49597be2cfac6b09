package vaspace

import (
	"fmt"
	"slices"
	"strings"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/invariants"
	"github.com/vmarena/vmarena/internal/isnil"
	"github.com/vmarena/vmarena/internal/lockrank"
	"github.com/vmarena/vmarena/internal/ranges"
	"github.com/vmarena/vmarena/internal/units"
)

// Space hands out reservations of one driver's address space. It does not
// own the driver: closing the Space frees its reservations and leaves the
// driver open.
type Space struct {
	d    driver.Driver
	gran uint64 // d.Granularity(), fixed for the driver's life

	mu     lockrank.Mutex[lockrank.VaspaceSpace]
	closed bool
	// rs holds the live reservations by their ranges. A reservation leaves
	// rs in the same critical section that marks it freed.
	rs ranges.List[driver.Addr, *Reservation]
}

// New returns a Space over d's address space. A Space made with a nil
// driver (or a zero Space) refuses every call with driver.ErrInvalid.
func New(d driver.Driver) *Space {
	if isnil.Is(d) {
		return &Space{}
	}
	return &Space{d: d, gran: d.Granularity()}
}

// usable returns ErrInvalid for a Space that has no driver.
func (s *Space) usable(what func() string) error {
	if s == nil || s.d == nil {
		return errors.WithHint(errors.Wrapf(driver.ErrInvalid, "%s: the space has no driver", what()),
			"make a space with vaspace.New(d) of an open driver")
	}
	return nil
}

// Driver returns the driver whose address space s hands out; nil for a
// Space without one (and for a nil Space, so that a reservation not made
// by Reserve answers nil through Space().Driver()).
func (s *Space) Driver() driver.Driver {
	if s == nil {
		return nil
	}
	return s.d
}

// Reserve holds size bytes of address space, a multiple of the driver's
// granularity, aligned to align (a power of two; 0 means the granularity,
// and a smaller one is raised to it).
func (s *Space) Reserve(size, align uint64) (*Reservation, error) {
	return s.reserve(nil, size, align)
}

// ReserveFor is Reserve for an owner: a layer above (an arena range, an
// imported pool) that keeps the reservation for itself. Only FreeFor with
// the same owner frees it; Free refuses (ErrBusy, naming the owner), and
// Close of the space refuses while it is live. A nil owner is ErrInvalid.
func (s *Space) ReserveFor(o *Owner, size, align uint64) (*Reservation, error) {
	if o == nil {
		return nil, errors.Wrapf(driver.ErrInvalid, "vaspace: reserve %s for an owner: the owner is nil", units.Bytes(size))
	}
	return s.reserve(o, size, align)
}

// reserve is Reserve, the reservation kept by o when o is not nil.
func (s *Space) reserve(o *Owner, size, align uint64) (*Reservation, error) {
	what := func() string {
		if align != 0 {
			return fmt.Sprintf("vaspace: reserve %s aligned to %d", units.Bytes(size), align)
		}
		return fmt.Sprintf("vaspace: reserve %s", units.Bytes(size))
	}
	if err := s.usable(what); err != nil {
		return nil, err
	}
	if err := driver.CheckSize(what, size, s.gran); err != nil {
		return nil, err
	}
	if err := driver.CheckAlign(what, align); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.checkAfter("reserve")
	if s.closed {
		return nil, driver.Closed(what() + ": the space is closed")
	}
	base, err := s.d.Reserve(size, align, 0)
	if err != nil {
		return nil, errors.Wrapf(err, "%s", what())
	}
	r := newReservation(s, base, size)
	r.owner = o
	if _, ok := s.rs.Insert(base, r.Range().End(), r); !ok {
		_ = s.d.Unreserve(base, size)
		return nil, errors.AssertionFailedf("%s: the driver returned %s, which overlaps a live reservation", what(), r.Range())
	}
	return r, nil
}

// Reservations returns the live reservations, by base address.
func (s *Space) Reservations() []*Reservation {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.listLocked()
}

func (s *Space) listLocked() []*Reservation {
	rs := make([]*Reservation, 0, s.rs.Len())
	for _, it := range s.rs.All() {
		rs = append(rs, it.Val)
	}
	return rs
}

// Close frees every live reservation and closes s; later calls of s and of
// its reservations return driver.ErrClosed. While any reservation has an
// occupant that reports uses, or is kept by an owner (ReserveFor), Close
// refuses with driver.ErrBusy listing them and frees nothing: an owner
// frees its reservations itself when it closes.
//
// Should the driver refuse to unreserve a reservation all the same (because
// something was mapped into it behind its occupants' backs, or the driver is
// closed), Close frees the others, reports the refusals, and leaves s open
// so that it can be called again.
func (s *Space) Close() error {
	if err := s.usable(func() string { return "vaspace: close" }); err != nil {
		return err
	}
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return driver.Closed("vaspace: close: the space is already closed")
		}
		rs := s.listLocked()
		s.mu.Unlock()

		// Ask the occupants with no lock held: they may call back.
		var busy []string
		gens := make([]uint64, len(rs))
		for i, r := range rs {
			uses, gen, freed := r.uses()
			gens[i] = gen
			switch {
			case freed:
			case r.owner != nil:
				busy = append(busy, fmt.Sprintf("%s (kept by %s)", r.Range(), r.owner))
			case len(uses) > 0:
				busy = append(busy, fmt.Sprintf("%s (%s)", r.Range(), describeUses(uses)))
			}
		}
		if len(busy) > 0 {
			return errors.WithHint(
				errors.Wrapf(driver.ErrBusy, "vaspace: close: %d reservation(s) still in use: %s",
					len(busy), strings.Join(busy, "; ")),
				"close the owners of the reservations they keep (they free them), unmap what is mapped in the others, or detach their occupants, before closing")
		}

		for _, r := range rs {
			r.hold.Lock()
		}
		s.mu.Lock()
		same := slices.Equal(s.listLocked(), rs)
		for i, r := range rs {
			r.mu.Lock()
			same = same && r.gen == gens[i]
			r.mu.Unlock()
		}
		if !same {
			// A reservation came or went, or an occupant was attached,
			// since the occupants were asked: ask again.
			s.mu.Unlock()
			for _, r := range rs {
				r.hold.Unlock()
			}
			continue
		}
		var errs error
		kept := 0
		for _, r := range rs {
			r.mu.Lock()
			if err := r.unreserveLocked(); err != nil {
				errs = errors.CombineErrors(errs, err)
			}
			if r.freed {
				s.removeLocked(r)
			} else {
				kept++
			}
			r.mu.Unlock()
		}
		if kept == 0 {
			s.closed = true
		}
		s.mu.Unlock()
		for _, r := range rs {
			r.hold.Unlock()
		}
		switch {
		case kept > 0:
			return errors.Wrapf(errs, "vaspace: close: the driver refused to unreserve %d of %d reservation(s); the others are freed, the space stays open",
				kept, len(rs))
		case errs != nil:
			return errors.Wrapf(errs, "vaspace: close: the space is closed, but the driver no longer held some of its reservations")
		}
		return nil
	}
}

// Check walks every structure of s and its reservations and returns every
// broken invariant as an errors.AssertionFailedf, combined. It also asks
// the driver whether each live reservation is still reserved there (see
// Reservation.Check): a range unreserved through the driver behind the
// space's back is reported.
func (s *Space) Check() error {
	if err := s.usable(func() string { return "vaspace: check" }); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	errs := s.checkLocked()
	for _, it := range s.rs.All() {
		errs = errors.CombineErrors(errs, it.Val.checkDriver())
	}
	return errs
}

// checkAfter runs checkLocked after a change, in builds with the
// invariants tag; s.mu is held.
func (s *Space) checkAfter(op string) {
	if invariants.Enabled {
		invariants.Fail("vaspace: "+op, s.checkLocked())
	}
}

// checkLocked is Check with s.mu held.
func (s *Space) checkLocked() error {
	var errs error
	fail := func(format string, args ...any) {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf(format, args...))
	}
	if s.closed && s.rs.Len() > 0 {
		fail("vaspace: the space is closed but holds %d reservation(s)", s.rs.Len())
	}
	if err := s.rs.Check(); err != nil {
		errs = errors.CombineErrors(errs, errors.Wrap(err, "vaspace: reservations"))
	}
	for _, it := range s.rs.All() {
		r := it.Val
		if it.Start != r.base || it.End != r.Range().End() {
			fail("vaspace: reservation %s is listed as [%s, %s)", r.Range(), it.Start, it.End)
		}
		if r.space != s {
			fail("vaspace: reservation %s belongs to another space", r.Range())
		}
		if r.Freed() {
			fail("vaspace: reservation %s is freed but still listed", r.Range())
		}
		errs = errors.CombineErrors(errs, r.checkBooks())
	}
	return errs
}

// removeLocked takes r off the list; s.mu is held.
func (s *Space) removeLocked(r *Reservation) {
	if i, ok := s.rs.Find(r.base); ok && s.rs.At(i).Val == r {
		s.rs.Delete(i, i+1)
	}
}

// describeUses lists the first few uses and counts the rest.
func describeUses(uses []Use) string {
	const shown = 4
	var b strings.Builder
	for i, u := range uses {
		if i == shown {
			fmt.Fprintf(&b, ", and %d more", len(uses)-shown)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(u.String())
	}
	return b.String()
}
