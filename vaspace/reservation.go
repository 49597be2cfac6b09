package vaspace

import (
	"fmt"
	"slices"
	"sort"
	"sync"

	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/extent"
	"github.com/vmarena/vmarena/internal/units"
)

// Occupant is something that keeps part of a reservation in use — the
// mapping layer's page table attaches itself and reports each mapping. It
// must be comparable (a pointer, as a rule): Detach finds it with ==.
//
// Occupied is called with no lock of this package held, so it may call
// back into the reservation, but not into Hold, Free or Close.
type Occupant interface {
	Occupied() []Use
}

// Use is one part of a reservation in use, for messages.
type Use struct {
	Range Range
	What  string // e.g. "chunk 7 of device 1"
}

// String formats u as "chunk 7 of device 1 at [0x..., 0x...)".
func (u Use) String() string { return fmt.Sprintf("%s at %s", u.What, u.Range) }

// Reservation is one range of address space reserved from the driver, and
// the sub-ranges carved out of it.
type Reservation struct {
	space *Space
	base  driver.Addr
	size  uint64
	gran  uint64

	// hold is held for reading while a Hold callback runs and for writing
	// while Free or Close unreserves the range: the range cannot be freed
	// under a callback.
	hold sync.RWMutex

	mu sync.Mutex
	// freed is set, with hold, space.mu and mu all held, once the driver
	// has unreserved the range; free and carved are then nil.
	freed bool
	// free holds the free extents of [base, base+size). carved holds the
	// carved ranges sorted by base: disjoint, granule-aligned, and exactly
	// the complement of free.
	free   *extent.Set
	carved []Range
	// occupants are the attached occupants, each once. gen counts
	// Attach calls, so that Free and Close notice an occupant attached
	// after they asked the others.
	occupants []Occupant
	gen       uint64
}

func newReservation(s *Space, base driver.Addr, size uint64) *Reservation {
	return &Reservation{space: s, base: base, size: size, gran: s.gran, free: extent.New(uint64(base), size)}
}

// Base is the first address of the reservation. It answers after Free too.
func (r *Reservation) Base() driver.Addr { return r.base }

// Size is the size of the reservation. It answers after Free too.
func (r *Reservation) Size() uint64 { return r.size }

// Range is [Base, Base+Size). It answers after Free too.
func (r *Reservation) Range() Range { return Range{r.base, r.size} }

// Space is the space r was reserved from.
func (r *Reservation) Space() *Space { return r.space }

// String formats r as "reservation [0x..., 0x...)".
func (r *Reservation) String() string { return "reservation " + r.Range().String() }

func (r *Reservation) errFreed(what func() string) error {
	return errors.WithHint(driver.Closed(what()+": the reservation is freed"), "reserve a new range")
}

// Carve takes a free sub-range of size bytes (a multiple of the driver's
// granularity) starting at a multiple of max(align, granularity), from the
// lowest address that has room. align is 0 or a power of two.
func (r *Reservation) Carve(size, align uint64) (Range, error) {
	what := func() string { return fmt.Sprintf("vaspace: carve %s from %s", units.Bytes(size), r) }
	if err := driver.CheckSize(what, size, r.gran); err != nil {
		return Range{}, err
	}
	if err := driver.CheckAlign(what, align); err != nil {
		return Range{}, err
	}
	align = max(align, r.gran)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.freed {
		return Range{}, r.errFreed(what)
	}
	at, ok := r.free.Alloc(size, align)
	if !ok {
		return Range{}, errors.WithHint(
			errors.Wrapf(driver.ErrOutOfMemory,
				"%s: the reservation has no free range of %s aligned to %s (the largest free range is %s; %s of %s carved)",
				what(), units.Bytes(size), units.Bytes(align), units.Bytes(r.free.Largest()),
				units.Bytes(r.free.InUse()), units.Bytes(r.size)),
			"uncarve ranges you no longer need, or reserve a larger range")
	}
	c := Range{driver.Addr(at), size}
	r.insertCarved(c)
	return c, nil
}

// CarveAt takes exactly [base, base+size), which must lie inside the
// reservation, start on the driver's granularity and be free throughout.
func (r *Reservation) CarveAt(base driver.Addr, size uint64) (Range, error) {
	c := Range{base, size}
	what := func() string { return fmt.Sprintf("vaspace: carve %s from %s", c, r) }
	if err := driver.CheckSize(what, size, r.gran); err != nil {
		return Range{}, err
	}
	if err := driver.CheckAddr(what, base, r.gran); err != nil {
		return Range{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.freed {
		return Range{}, r.errFreed(what)
	}
	if c.End() < c.Base || !r.Range().ContainsRange(c) {
		return Range{}, errors.Wrapf(driver.ErrNotReserved, "%s: the range is not inside the reservation", what())
	}
	if !r.free.AllocAt(uint64(base), size) {
		i := sort.Search(len(r.carved), func(i int) bool { return r.carved[i].End() > base })
		if i == len(r.carved) || !r.carved[i].Overlaps(c) {
			return Range{}, errors.AssertionFailedf("%s: the range is not free, but no carved range overlaps it", what())
		}
		return Range{}, errors.WithHint(
			errors.Wrapf(driver.ErrOverlap, "%s: it overlaps the carved range %s", what(), r.carved[i]),
			"uncarve that range first, or let Carve find a free one")
	}
	r.insertCarved(c)
	return c, nil
}

func (r *Reservation) insertCarved(c Range) {
	i := sort.Search(len(r.carved), func(i int) bool { return r.carved[i].Base > c.Base })
	r.carved = slices.Insert(r.carved, i, c)
}

// Uncarve gives back a range that Carve or CarveAt returned, exactly as it
// was returned; anything else is driver.ErrNotReserved.
func (r *Reservation) Uncarve(c Range) error {
	what := func() string { return fmt.Sprintf("vaspace: uncarve %s from %s", c, r) }
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.freed {
		return r.errFreed(what)
	}
	i, found := slices.BinarySearchFunc(r.carved, c.Base, func(x Range, b driver.Addr) int {
		switch {
		case x.Base < b:
			return -1
		case x.Base > b:
			return 1
		}
		return 0
	})
	if !found {
		// Name a carved range it overlaps, if any, to show what() was meant.
		j := sort.Search(len(r.carved), func(j int) bool { return r.carved[j].End() > c.Base })
		if j < len(r.carved) && r.carved[j].Overlaps(c) {
			return errors.WithHint(
				errors.Wrapf(driver.ErrNotReserved, "%s: no carved range starts there (it overlaps the carved range %s)", what(), r.carved[j]),
				"uncarve takes exactly a range Carve or CarveAt returned")
		}
		return errors.Wrapf(driver.ErrNotReserved, "%s: nothing carved starts there", what())
	}
	if r.carved[i] != c {
		return errors.WithHint(
			errors.Wrapf(driver.ErrNotReserved, "%s: the carved range there is %s", what(), r.carved[i]),
			"uncarve takes exactly a range Carve or CarveAt returned")
	}
	if err := r.free.Free(uint64(c.Base), c.Size); err != nil {
		return errors.Wrapf(err, "%s", what())
	}
	r.carved = slices.Delete(r.carved, i, i+1)
	return nil
}

// Carved returns the carved ranges, by base address; nil when there are
// none, and once freed.
func (r *Reservation) Carved() []Range {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.carved) == 0 {
		return nil
	}
	return slices.Clone(r.carved)
}

// Attach registers o as an occupant of r: Free refuses while o reports
// uses. Attaching an occupant twice keeps one; attaching to a freed
// reservation does nothing (check Freed, or Hold, when that matters).
func (r *Reservation) Attach(o Occupant) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.freed || slices.Contains(r.occupants, o) {
		return
	}
	r.occupants = append(r.occupants, o)
	r.gen++
}

// Detach unregisters o; an occupant not attached is ignored.
func (r *Reservation) Detach(o Occupant) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if i := slices.Index(r.occupants, o); i >= 0 {
		r.occupants = slices.Delete(r.occupants, i, i+1)
	}
}

// uses asks every occupant for its uses, with no lock held. gen is the
// Attach count when the occupants were taken.
func (r *Reservation) uses() (uses []Use, gen uint64, freed bool) {
	r.mu.Lock()
	occs := slices.Clone(r.occupants)
	gen, freed = r.gen, r.freed
	r.mu.Unlock()
	for _, o := range occs {
		uses = append(uses, o.Occupied()...)
	}
	return uses, gen, freed
}

// Hold runs fn while r cannot be freed, and returns its error; on a freed
// reservation it returns driver.ErrClosed without running fn. The mapping
// layer maps under Hold, so that a range it found live is still the same
// reservation (and not a newer one at the same address) when the driver
// maps into it. Many Holds may run at once; Free and Close wait for them.
// fn must not call Hold, Free or Close of r or its Space. A caller that
// also takes a lock of its own must take it always on the same side of
// Hold (the mapping layer: its table lock first, then Hold), since a
// waiting Free makes new Holds wait too.
func (r *Reservation) Hold(fn func() error) error {
	r.hold.RLock()
	defer r.hold.RUnlock()
	if r.Freed() {
		return r.errFreed(func() string { return fmt.Sprintf("vaspace: hold %s", r) })
	}
	return fn()
}

// Free gives the range back to the driver (driver.Unreserve). It refuses
// with driver.ErrBusy while any attached occupant reports uses, naming them,
// and the driver refuses too while anything is mapped inside. After Free,
// every method but Base, Size, Range, Space, String and Freed returns
// driver.ErrClosed (or nothing). Carved ranges need not be uncarved first:
// carving is bookkeeping, and goes with the range.
func (r *Reservation) Free() error {
	what := func() string { return fmt.Sprintf("vaspace: free %s", r) }
	for {
		uses, gen, freed := r.uses()
		if freed {
			return r.errFreed(what)
		}
		if len(uses) > 0 {
			return errors.WithHint(
				errors.Wrapf(driver.ErrBusy, "%s: %d use(s) still inside: %s", what(), len(uses), describeUses(uses)),
				"unmap everything inside the reservation, or detach its occupants, before freeing it")
		}
		r.hold.Lock()
		s := r.space
		s.mu.Lock()
		r.mu.Lock()
		var err error
		retry := false
		switch {
		case r.freed:
			err = r.errFreed(what)
		case r.gen != gen:
			retry = true // an occupant was attached since they were asked
		default:
			err = r.unreserveLocked()
			if err == nil {
				if i := slices.Index(s.rs, r); i >= 0 {
					s.rs = slices.Delete(s.rs, i, i+1)
				}
			}
		}
		r.mu.Unlock()
		s.mu.Unlock()
		r.hold.Unlock()
		if !retry {
			return err
		}
	}
}

// unreserveLocked asks the driver to unreserve r and marks it freed. The
// caller holds r.hold, r.space.mu and r.mu, and removes r from the space.
func (r *Reservation) unreserveLocked() error {
	if err := r.space.d.Unreserve(r.base, r.size); err != nil {
		return errors.Wrapf(err, "vaspace: free %s", r)
	}
	r.freed = true
	r.free, r.carved, r.occupants = nil, nil, nil
	return nil
}

// Freed reports whether r has been freed.
func (r *Reservation) Freed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.freed
}

// Check walks r's carved ranges and free extents and returns every broken
// invariant as an errors.AssertionFailedf, combined.
func (r *Reservation) Check() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var errs error
	fail := func(format string, args ...any) {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf(format, args...))
	}
	if r.freed {
		if r.free != nil || r.carved != nil || r.occupants != nil {
			fail("vaspace: %s is freed but keeps carving or occupant state", r)
		}
		return errs
	}
	if r.size == 0 || uint64(r.base)%r.gran != 0 || r.size%r.gran != 0 {
		fail("vaspace: %s is not aligned to the granularity %s", r, units.Bytes(r.gran))
	}
	if err := r.free.Check(); err != nil {
		errs = errors.CombineErrors(errs, errors.Wrapf(err, "vaspace: %s", r))
	}
	var carved uint64
	gapStart := r.base
	for i, c := range r.carved {
		if !r.Range().ContainsRange(c) || c.Size == 0 {
			fail("vaspace: carved range %s is not inside %s", c, r)
		}
		if uint64(c.Base)%r.gran != 0 || c.Size%r.gran != 0 {
			fail("vaspace: carved range %s is not aligned to the granularity %s", c, units.Bytes(r.gran))
		}
		if i > 0 && r.carved[i-1].End() > c.Base {
			fail("vaspace: carved ranges %s and %s overlap or are out of order", r.carved[i-1], c)
		}
		if c.Base > gapStart && !r.free.IsFree(uint64(gapStart), uint64(c.Base-gapStart)) {
			fail("vaspace: %s is neither carved nor free in %s", Range{gapStart, uint64(c.Base - gapStart)}, r)
		}
		gapStart = max(gapStart, c.End())
		carved += c.Size
	}
	if end := r.Range().End(); end > gapStart && !r.free.IsFree(uint64(gapStart), uint64(end-gapStart)) {
		fail("vaspace: %s is neither carved nor free in %s", Range{gapStart, uint64(end - gapStart)}, r)
	}
	if carved != r.free.InUse() {
		fail("vaspace: %s has %d bytes carved but its free extents count %d in use", r, carved, r.free.InUse())
	}
	if len(r.occupants) > 0 {
		for i, o := range r.occupants {
			if slices.Index(r.occupants, o) != i {
				fail("vaspace: an occupant of %s is attached twice", r)
			}
		}
	}
	return errs
}
