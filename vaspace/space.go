package vaspace

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// Space hands out reservations of one driver's address space. It does not
// own the driver: closing the Space frees its reservations and leaves the
// driver open.
type Space struct {
	d    driver.Driver
	gran uint64 // d.Granularity(), fixed for the driver's life

	mu     sync.Mutex
	closed bool
	// rs holds the live reservations, sorted by base; they do not overlap.
	// A reservation leaves rs in the same critical section that marks it
	// freed.
	rs []*Reservation
}

// New returns a Space over d's address space.
func New(d driver.Driver) *Space { return &Space{d: d, gran: d.Granularity()} }

// Driver returns the driver whose address space s hands out.
func (s *Space) Driver() driver.Driver { return s.d }

// Reserve holds size bytes of address space, a multiple of the driver's
// granularity, aligned to align (a power of two; 0 means the granularity,
// and a smaller one is raised to it).
func (s *Space) Reserve(size, align uint64) (*Reservation, error) {
	what := func() string {
		if align != 0 {
			return fmt.Sprintf("vaspace: reserve %s aligned to %d", units.Bytes(size), align)
		}
		return fmt.Sprintf("vaspace: reserve %s", units.Bytes(size))
	}
	if err := driver.CheckSize(what, size, s.gran); err != nil {
		return nil, err
	}
	if err := driver.CheckAlign(what, align); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, driver.Closed(what() + ": the space is closed")
	}
	base, err := s.d.Reserve(size, align, 0)
	if err != nil {
		return nil, errors.Wrapf(err, "%s", what())
	}
	r := newReservation(s, base, size)
	i := sort.Search(len(s.rs), func(i int) bool { return s.rs[i].base >= base })
	if (i > 0 && s.rs[i-1].Range().Overlaps(r.Range())) || (i < len(s.rs) && s.rs[i].Range().Overlaps(r.Range())) {
		_ = s.d.Unreserve(base, size)
		return nil, errors.AssertionFailedf("%s: the driver returned %s, which overlaps a live reservation", what(), r.Range())
	}
	s.rs = slices.Insert(s.rs, i, r)
	return r, nil
}

// Reservations returns the live reservations, by base address.
func (s *Space) Reservations() []*Reservation {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.rs)
}

// Close frees every live reservation and closes s; later calls of s and of
// its reservations return driver.ErrClosed. While any reservation has an
// occupant that reports uses, Close refuses with driver.ErrBusy listing
// them and frees nothing.
//
// Should the driver refuse to unreserve a reservation all the same (because
// something was mapped into it behind its occupants' backs, or the driver is
// closed), Close frees the others, reports the refusals, and leaves s open
// so that it can be called again.
func (s *Space) Close() error {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return driver.Closed("vaspace: close: the space is already closed")
		}
		rs := slices.Clone(s.rs)
		s.mu.Unlock()

		// Ask the occupants with no lock held: they may call back.
		var busy []string
		gens := make([]uint64, len(rs))
		for i, r := range rs {
			uses, gen, freed := r.uses()
			gens[i] = gen
			if !freed && len(uses) > 0 {
				busy = append(busy, fmt.Sprintf("%s (%s)", r.Range(), describeUses(uses)))
			}
		}
		if len(busy) > 0 {
			return errors.WithHint(
				errors.Wrapf(driver.ErrBusy, "vaspace: close: %d reservation(s) still in use: %s",
					len(busy), strings.Join(busy, "; ")),
				"unmap what() is mapped in them, or detach their occupants, before closing")
		}

		for _, r := range rs {
			r.hold.Lock()
		}
		s.mu.Lock()
		same := slices.Equal(s.rs, rs)
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
		kept := s.rs[:0]
		for _, r := range rs {
			r.mu.Lock()
			if err := r.unreserveLocked(); err != nil {
				errs = errors.CombineErrors(errs, err)
				kept = append(kept, r)
			}
			r.mu.Unlock()
		}
		clear(s.rs[len(kept):])
		s.rs = kept
		if errs == nil {
			s.closed = true
		}
		s.mu.Unlock()
		for _, r := range rs {
			r.hold.Unlock()
		}
		if errs != nil {
			return errors.Wrapf(errs, "vaspace: close: the driver refused to unreserve %d of %d reservation(s); the others are freed",
				len(kept), len(rs))
		}
		return nil
	}
}

// Check walks every structure of s and its reservations and returns every
// broken invariant as an errors.AssertionFailedf, combined.
func (s *Space) Check() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs error
	fail := func(format string, args ...any) {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf(format, args...))
	}
	if s.closed && len(s.rs) > 0 {
		fail("vaspace: the space is closed but holds %d reservation(s)", len(s.rs))
	}
	for i, r := range s.rs {
		if i > 0 && s.rs[i-1].base >= r.base {
			fail("vaspace: reservations %s and %s are out of order", s.rs[i-1].Range(), r.Range())
		}
		if i > 0 && s.rs[i-1].Range().Overlaps(r.Range()) {
			fail("vaspace: reservations %s and %s overlap", s.rs[i-1].Range(), r.Range())
		}
		if r.space != s {
			fail("vaspace: reservation %s belongs to another space", r.Range())
		}
		if r.Freed() {
			fail("vaspace: reservation %s is freed but still listed", r.Range())
		}
		errs = errors.CombineErrors(errs, r.Check())
	}
	return errs
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
