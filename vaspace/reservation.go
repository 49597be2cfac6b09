package vaspace

import (
	"fmt"
	"reflect"
	"slices"
	"sync"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/extent"
	"github.com/vmarena/vmarena/internal/invariants"
	"github.com/vmarena/vmarena/internal/isnil"
	"github.com/vmarena/vmarena/internal/lockrank"
	"github.com/vmarena/vmarena/internal/ranges"
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

// Owner is a layer above that keeps reservations for itself (an arena
// range, an imported pool: Space.ReserveFor). Only the owner frees what it
// keeps (FreeFor): a caller who reaches the reservation through the Space
// (Reservations) cannot free it, nor close the Space, under the owner,
// which would leave the owner with a range it can never free and memory
// mapped, later, into a range that is someone else's. An owner is a
// pointer the owner keeps to itself; its name says who it is in messages.
type Owner struct {
	name string
}

// NewOwner returns an owner named name in messages ("an arena range").
func NewOwner(name string) *Owner { return &Owner{name: name} }

// String is the owner's name.
func (o *Owner) String() string {
	if o == nil {
		return "nobody"
	}
	return o.name
}

// Reservation is one range of address space reserved from the driver, and
// the sub-ranges carved out of it.
type Reservation struct {
	space *Space
	base  driver.Addr
	size  uint64
	gran  uint64
	// owner keeps the reservation (ReserveFor), fixed at Reserve; nil
	// when nobody does.
	owner *Owner

	// hold is held for reading while a Hold callback runs and for writing
	// while Free or Close unreserves the range: the range cannot be freed
	// under a callback.
	hold sync.RWMutex

	mu lockrank.Mutex[lockrank.VaspaceReservation]
	// freed is set, with hold, space.mu and mu all held, once the driver
	// has unreserved the range; free and carved are then empty.
	freed bool
	// free holds the free extents of [base, base+size). carved holds the
	// carved ranges sorted by base: disjoint, granule-aligned, and exactly
	// the complement of free.
	// free is made by extents on first use (a reservation nothing is
	// carved from, an arena's, never needs it): until then freeMade is
	// false and the whole range is free.
	free     extent.Set
	freeMade bool
	carved   ranges.List[driver.Addr, struct{}]
	// occupants are the attached occupants, each once. gen counts
	// Attach calls, so that Free and Close notice an occupant attached
	// after they asked the others.
	occupants []Occupant
	gen       uint64
}

func newReservation(s *Space, base driver.Addr, size uint64) *Reservation {
	return &Reservation{space: s, base: base, size: size, gran: s.gran}
}

// extents is r.free, made whole-free on first use; r.mu is held and r is
// not freed.
func (r *Reservation) extents() *extent.Set {
	if !r.freeMade {
		r.free, r.freeMade = extent.Make(uint64(r.base), r.size), true
	}
	return &r.free
}

// Base is the first address of the reservation. It answers after Free too.
func (r *Reservation) Base() driver.Addr {
	if r == nil {
		return 0
	}
	return r.base
}

// Size is the size of the reservation. It answers after Free too.
func (r *Reservation) Size() uint64 {
	if r == nil {
		return 0
	}
	return r.size
}

// Range is [Base, Base+Size). It answers after Free too.
func (r *Reservation) Range() Range {
	if r == nil {
		return Range{}
	}
	return Range{r.base, r.size}
}

// Space is the space r was reserved from.
func (r *Reservation) Space() *Space {
	if r == nil {
		return nil
	}
	return r.space
}

// KeptBy is the name of the owner that keeps r (Space.ReserveFor), "" when
// nobody does.
func (r *Reservation) KeptBy() string {
	if r == nil || r.owner == nil {
		return ""
	}
	return r.owner.String()
}

// KeptFor reports whether o may act as r's owner: o is the owner that
// keeps r (Space.ReserveFor), or o is nil and nobody keeps r.
func (r *Reservation) KeptFor(o *Owner) bool {
	if r == nil {
		return false
	}
	return r.owner == o
}

// String formats r as "reservation [0x..., 0x...)".
func (r *Reservation) String() string {
	if r == nil {
		return "reservation (nil)"
	}
	return "reservation " + r.Range().String()
}

// made returns ErrInvalid for a Reservation that Space.Reserve did not
// make (a zero Reservation).
func (r *Reservation) made(what func() string) error {
	if r == nil || r.space == nil || r.space.d == nil {
		return errors.WithHint(errors.Wrapf(driver.ErrInvalid, "%s: the reservation was not made by Space.Reserve", what()),
			"reserve ranges with Space.Reserve")
	}
	return nil
}

func (r *Reservation) errFreed(what func() string) error {
	return errors.WithHint(driver.Closed(what()+": the reservation is freed"), "reserve a new range")
}

// Carve takes a free sub-range of size bytes (a multiple of the driver's
// granularity) starting at a multiple of max(align, granularity), from the
// lowest address that has room. align is 0 or a power of two.
func (r *Reservation) Carve(size, align uint64) (Range, error) {
	what := func() string { return fmt.Sprintf("vaspace: carve %s from %s", units.Bytes(size), r) }
	if err := r.made(what); err != nil {
		return Range{}, err
	}
	if err := driver.CheckSize(what, size, r.gran); err != nil {
		return Range{}, err
	}
	if err := driver.CheckAlign(what, align); err != nil {
		return Range{}, err
	}
	align = max(align, r.gran)
	r.mu.Lock()
	defer r.mu.Unlock()
	defer r.checkAfter("carve")
	if r.freed {
		return Range{}, r.errFreed(what)
	}
	at, ok := r.extents().Alloc(size, align)
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
	if err := r.made(what); err != nil {
		return Range{}, err
	}
	if err := driver.CheckSize(what, size, r.gran); err != nil {
		return Range{}, err
	}
	if err := driver.CheckAddr(what, base, r.gran); err != nil {
		return Range{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	defer r.checkAfter("carveAt")
	if r.freed {
		return Range{}, r.errFreed(what)
	}
	if !r.Range().ContainsRange(c) {
		return Range{}, errors.Wrapf(driver.ErrNotReserved, "%s: the range is not inside the reservation", what())
	}
	if !r.extents().AllocAt(uint64(base), size) {
		lo, hi := r.carved.Overlapping(c.Base, c.End())
		if lo == hi {
			return Range{}, errors.AssertionFailedf("%s: the range is not free, but no carved range overlaps it", what())
		}
		return Range{}, errors.WithHint(
			errors.Wrapf(driver.ErrOverlap, "%s: it overlaps the carved range %s", what(), carvedRange(r.carved.At(lo))),
			"uncarve that range first, or let Carve find a free one")
	}
	r.insertCarved(c)
	return c, nil
}

func (r *Reservation) insertCarved(c Range) {
	if _, ok := r.carved.Insert(c.Base, c.End(), struct{}{}); !ok {
		panic("vaspace: the free extents handed out a carved range") // extent.Set and the list disagree: a bug here
	}
}

func carvedRange(it *ranges.Item[driver.Addr, struct{}]) Range {
	return Range{it.Start, it.Size()}
}

// Uncarve gives back a range that Carve or CarveAt returned, exactly as it
// was returned; anything else is driver.ErrNotReserved.
func (r *Reservation) Uncarve(c Range) error {
	what := func() string { return fmt.Sprintf("vaspace: uncarve %s from %s", c, r) }
	if err := r.made(what); err != nil {
		return err
	}
	if !c.Valid() {
		return errors.Wrapf(driver.ErrInvalid, "%s: the range runs past the end of the address space", what())
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	defer r.checkAfter("uncarve")
	if r.freed {
		return r.errFreed(what)
	}
	i, found := r.carved.Find(c.Base)
	if found && r.carved.At(i).Start != c.Base {
		return errors.WithHint(
			errors.Wrapf(driver.ErrNotReserved, "%s: no carved range starts there (it overlaps the carved range %s)", what(), carvedRange(r.carved.At(i))),
			"uncarve takes exactly a range Carve or CarveAt returned")
	}
	if !found {
		// Name a carved range it overlaps, if any, to show what was meant.
		if lo, hi := r.carved.Overlapping(c.Base, c.End()); c.Size > 0 && c.End() > c.Base && lo < hi {
			return errors.WithHint(
				errors.Wrapf(driver.ErrNotReserved, "%s: no carved range starts there (it overlaps the carved range %s)", what(), carvedRange(r.carved.At(lo))),
				"uncarve takes exactly a range Carve or CarveAt returned")
		}
		return errors.Wrapf(driver.ErrNotReserved, "%s: nothing carved starts there", what())
	}
	if got := carvedRange(r.carved.At(i)); got != c {
		return errors.WithHint(
			errors.Wrapf(driver.ErrNotReserved, "%s: the carved range there is %s", what(), got),
			"uncarve takes exactly a range Carve or CarveAt returned")
	}
	if err := r.extents().Free(uint64(c.Base), c.Size); err != nil {
		return errors.Wrapf(err, "%s", what())
	}
	r.carved.Delete(i, i+1)
	return nil
}

// Carved returns the carved ranges, by base address; nil when there are
// none, and once freed.
func (r *Reservation) Carved() []Range {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.carved.Len() == 0 {
		return nil
	}
	out := make([]Range, 0, r.carved.Len())
	for _, it := range r.carved.All() {
		out = append(out, carvedRange(it))
	}
	return out
}

// Attach registers o as an occupant of r: Free refuses while o reports
// uses. Attaching an occupant twice keeps one. A nil o, or one whose
// dynamic type is not comparable (Detach finds occupants with ==), is
// driver.ErrInvalid; a freed reservation is driver.ErrClosed.
func (r *Reservation) Attach(o Occupant) error {
	what := func() string { return fmt.Sprintf("vaspace: attach an occupant to %s", r) }
	if err := r.made(what); err != nil {
		return err
	}
	if err := checkOccupant(what, o); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	defer r.checkAfter("attach")
	if r.freed {
		return r.errFreed(what)
	}
	if !slices.Contains(r.occupants, o) {
		r.occupants = append(r.occupants, o)
		r.gen++
	}
	return nil
}

// checkOccupant refuses a nil occupant and one that == would panic on.
func checkOccupant(what func() string, o Occupant) error {
	if isnil.Is(o) {
		return errors.Wrapf(driver.ErrInvalid, "%s: the occupant is nil", what())
	}
	if !reflect.TypeOf(o).Comparable() {
		return errors.WithHint(errors.Wrapf(driver.ErrInvalid, "%s: an occupant of type %T cannot be compared with ==", what(), o),
			"make the occupant a pointer")
	}
	return nil
}

// Detach unregisters o; an occupant not attached (nil included) is
// ignored.
func (r *Reservation) Detach(o Occupant) {
	if r == nil {
		return
	}
	if r.space == nil || checkOccupant(func() string { return "" }, o) != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	defer r.checkAfter("detach")
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
	what := func() string { return fmt.Sprintf("vaspace: hold %s", r) }
	if err := r.made(what); err != nil {
		return err
	}
	if fn == nil {
		return errors.Wrapf(driver.ErrInvalid, "%s: the function is nil", what())
	}
	r.hold.RLock()
	defer r.hold.RUnlock()
	if r.Freed() {
		return r.errFreed(what)
	}
	return fn()
}

// Free gives the range back to the driver (driver.Unreserve). It refuses
// with driver.ErrBusy while any attached occupant reports uses, naming them,
// and the driver refuses too while anything is mapped inside. A reservation
// an owner keeps (Space.ReserveFor) is the owner's to free (FreeFor): Free
// refuses it with driver.ErrBusy naming the owner. After Free, every method
// but Base, Size, Range, Space, String, KeptBy and Freed returns
// driver.ErrClosed (or nothing). Carved ranges need not be uncarved first:
// carving is bookkeeping, and goes with the range.
func (r *Reservation) Free() error {
	return r.freeAs(nil)
}

// FreeFor is Free by the owner that keeps r: o must be the owner given to
// Space.ReserveFor (driver.ErrBusy for another owner, driver.ErrInvalid for
// a nil one or a reservation nobody keeps).
func (r *Reservation) FreeFor(o *Owner) error {
	if o == nil {
		return errors.Wrapf(driver.ErrInvalid, "vaspace: free %s for an owner: the owner is nil", r)
	}
	return r.freeAs(o)
}

// freeAs frees r for o, which is r's owner or, for a reservation nobody
// keeps, nil.
func (r *Reservation) freeAs(o *Owner) error {
	what := func() string { return fmt.Sprintf("vaspace: free %s", r) }
	if err := r.made(what); err != nil {
		return err
	}
	for {
		uses, gen, freed := r.uses()
		if freed {
			return r.errFreed(what)
		}
		switch {
		case o == r.owner:
		case o == nil:
			return errors.WithHintf(
				errors.Wrapf(driver.ErrBusy, "%s: it is kept by %s, which frees it itself", what(), r.owner),
				"close its owner (%s) instead", r.owner)
		case r.owner == nil:
			return errors.WithHint(errors.Wrapf(driver.ErrInvalid, "%s for %s: nobody keeps it", what(), o),
				"free it with Free")
		default:
			return errors.Wrapf(driver.ErrBusy, "%s for %s: it is kept by %s", what(), o, r.owner)
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
			if r.freed {
				s.removeLocked(r)
			}
		}
		r.mu.Unlock()
		if !retry {
			s.checkAfter("free") // s.mu is held, r.mu not: the check takes it
		}
		s.mu.Unlock()
		r.hold.Unlock()
		if !retry {
			return err
		}
	}
}

// unreserveLocked asks the driver to unreserve r and marks it freed. The
// caller holds r.hold, r.space.mu and r.mu, and removes r from the space
// once it is freed.
//
// A driver that answers ErrNotReserved or ErrClosed no longer holds the
// range: someone unreserved it, or closed the driver, behind the space's
// back. r is then marked freed all the same (the books follow the
// driver; keeping it would leave the space unable ever to close) and the
// error says what happened.
func (r *Reservation) unreserveLocked() error {
	err := r.space.d.Unreserve(r.base, r.size)
	if err != nil && !errors.Is(err, driver.ErrNotReserved) && !errors.Is(err, driver.ErrClosed) {
		return errors.Wrapf(err, "vaspace: free %s", r)
	}
	r.freed = true
	r.free, r.freeMade, r.carved, r.occupants = extent.Set{}, false, ranges.List[driver.Addr, struct{}]{}, nil
	if err != nil {
		return errors.Wrapf(err, "vaspace: free %s: the driver no longer holds the range (unreserved behind the space's back?); the space has let it go", r)
	}
	return nil
}

// Freed reports whether r has been freed.
func (r *Reservation) Freed() bool {
	if r == nil {
		return true // never reserved
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.freed
}

// Check walks r's carved ranges and free extents and returns every broken
// invariant as an errors.AssertionFailedf, combined. For a live
// reservation it also asks the driver: its own record, where it keeps one
// (driver.Books: one reservation of r's base and size), else about r's
// first and last granules (Driver.Access): if the range is not reserved
// there, it was unreserved behind the space's back, and Check says so.
func (r *Reservation) Check() error {
	if r == nil {
		return errors.Wrap(driver.ErrInvalid, "vaspace: Reservation.Check on a nil reservation")
	}
	if r.space == nil {
		return errors.Wrap(driver.ErrInvalid, "vaspace: check of a reservation not made by Space.Reserve")
	}
	return errors.CombineErrors(r.checkBooks(), r.checkDriver())
}

// checkBooks is Check without the driver.
func (r *Reservation) checkBooks() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.checkLocked()
}

// checkDriver reports r's range as broken if the driver no longer
// reserves its first or last granule. A freed r has nothing to compare.
func (r *Reservation) checkDriver() error {
	if r.Freed() {
		return nil
	}
	if r.space == nil || r.space.d == nil {
		return errors.AssertionFailedf("vaspace: %s belongs to no space with a driver", r)
	}
	if b, ok := r.space.d.(driver.Books); ok {
		// The driver's own record: one reservation starting at r's base,
		// of r's size.
		size, err := b.ReservationAt(r.base)
		switch {
		case err != nil:
			return errors.AssertionFailedf("vaspace: %s is live here but the %s driver reserves nothing at %s: it was unreserved, or the driver closed, behind the space's back (%s)", r, r.space.d.Name(), r.base, err.Error())
		case size != r.size:
			return errors.AssertionFailedf("vaspace: %s is live here but the %s driver's reservation at %s is %s: it was unreserved and reserved again behind the space's back", r, r.space.d.Name(), r.base, units.Bytes(size))
		}
		return nil
	}
	for _, at := range []driver.Addr{r.base, r.base + driver.Addr(r.size-r.gran)} {
		_, err := r.space.d.Access(at, 0)
		if errors.Is(err, driver.ErrNotReserved) || errors.Is(err, driver.ErrClosed) {
			return errors.AssertionFailedf("vaspace: %s is live here but the driver does not reserve %s: it was unreserved, or the driver closed, behind the space's back (%v)", r, at, err)
		}
	}
	return nil
}

// checkAfter runs checkLocked after a change, in builds with the
// invariants tag; the lock is held.
func (r *Reservation) checkAfter(op string) {
	if invariants.Enabled {
		invariants.Fail("vaspace: "+op, r.checkLocked())
	}
}

// checkLocked is Check with the lock held: what every change runs in
// builds with the invariants tag.
func (r *Reservation) checkLocked() error {
	var errs error
	fail := func(format string, args ...any) {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf(format, args...))
	}
	if r.freed {
		if r.freeMade || r.carved.Len() != 0 || r.occupants != nil {
			fail("vaspace: %s is freed but keeps carving or occupant state", r)
		}
		return errs
	}
	if r.size == 0 || uint64(r.base)%r.gran != 0 || r.size%r.gran != 0 {
		fail("vaspace: %s is not aligned to the granularity %s", r, units.Bytes(r.gran))
	}
	free := r.extents()
	if err := free.Check(); err != nil {
		errs = errors.CombineErrors(errs, errors.Wrapf(err, "vaspace: %s", r))
	}
	var carved uint64
	gapStart := r.base
	if err := r.carved.Check(); err != nil {
		errs = errors.CombineErrors(errs, errors.Wrapf(err, "vaspace: %s", r))
	}
	for _, it := range r.carved.All() {
		c := carvedRange(it)
		if !r.Range().ContainsRange(c) {
			fail("vaspace: carved range %s is not inside %s", c, r)
		}
		if uint64(c.Base)%r.gran != 0 || c.Size%r.gran != 0 {
			fail("vaspace: carved range %s is not aligned to the granularity %s", c, units.Bytes(r.gran))
		}
		if c.Base > gapStart && !free.IsFree(uint64(gapStart), uint64(c.Base-gapStart)) {
			fail("vaspace: %s is neither carved nor free in %s", Range{gapStart, uint64(c.Base - gapStart)}, r)
		}
		gapStart = max(gapStart, c.End())
		carved += c.Size
	}
	if end := r.Range().End(); end > gapStart && !free.IsFree(uint64(gapStart), uint64(end-gapStart)) {
		fail("vaspace: %s is neither carved nor free in %s", Range{gapStart, uint64(end - gapStart)}, r)
	}
	if carved != free.InUse() {
		fail("vaspace: %s has %d bytes carved but its free extents count %d in use", r, carved, free.InUse())
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
