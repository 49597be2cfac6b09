package vaspace

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/sim"
)

// bigRange is r as a set of integers [lo, hi), with no 64-bit wrap.
func bigRange(r Range) (lo, hi *big.Int) {
	lo = new(big.Int).SetUint64(uint64(r.Base))
	hi = new(big.Int).Add(lo, new(big.Int).SetUint64(r.Size))
	return lo, hi
}

// TestRangeNearTheTop compares every Range predicate with arithmetic on
// unbounded integers, for ranges at and across the top of the address
// space: Base+Size computed in 64 bits wraps (a range running past 2^64
// would then contain nothing and overlap nothing).
func TestRangeNearTheTop(t *testing.T) {
	const top = math.MaxUint64
	edges := []uint64{0, 1, gran - 1, gran, 1 << 47, 1 << 63, top - 2*gran, top - gran, top - gran + 1, top - 1, top}
	rng := rand.New(rand.NewPCG(1, 2))
	pick := func() uint64 {
		if rng.IntN(4) == 0 {
			return rng.Uint64()
		}
		return edges[rng.IntN(len(edges))]
	}
	maxAddr := new(big.Int).SetUint64(top)
	for range 20000 {
		r := Range{driver.Addr(pick()), pick()}
		o := Range{driver.Addr(pick()), pick()}
		a := driver.Addr(pick())
		rlo, rhi := bigRange(r)
		olo, ohi := bigRange(o)
		ab := new(big.Int).SetUint64(uint64(a))

		valid := rhi.Cmp(maxAddr) <= 0
		require.Equal(t, valid, r.Valid(), "%#x+%#x valid", r.Base, r.Size)
		if valid {
			require.Equal(t, rhi.Uint64(), uint64(r.End()))
		} else {
			require.Equal(t, driver.Addr(top), r.End(), "End saturates")
			require.Contains(t, r.String(), "past the end of the address space")
		}
		require.Equal(t, ab.Cmp(rlo) >= 0 && ab.Cmp(rhi) < 0, r.Contains(a), "%s contains %s", r, a)
		contains := olo.Cmp(rlo) >= 0 && ohi.Cmp(rhi) <= 0
		require.Equal(t, contains, r.ContainsRange(o), "%s contains %s", r, o)
		overlaps := r.Size > 0 && o.Size > 0 && rlo.Cmp(ohi) < 0 && olo.Cmp(rhi) < 0
		require.Equal(t, overlaps, r.Overlaps(o), "%s overlaps %s", r, o)
		require.Equal(t, overlaps, o.Overlaps(r), "%s overlaps %s", o, r)
	}
	// The cases where Base+Size wraps.
	r := Range{top - gran + 1, gran}
	require.False(t, r.Valid())
	require.True(t, r.Contains(top))
	require.True(t, r.Overlaps(Range{top - 1, 1}))
	require.False(t, Range{0, top}.ContainsRange(r))
	require.True(t, r.ContainsRange(Range{top, 1}))
}

// TestRangesPastTheTopRefused: every call that takes a Range refuses one
// that runs past the end of the address space, and changes nothing.
func TestRangesPastTheTopRefused(t *testing.T) {
	s, _ := newSpace(t)
	r, err := s.Reserve(4*gran, 0)
	require.NoError(t, err)
	c, err := r.Carve(gran, 0)
	require.NoError(t, err)
	before := snap(s)
	requireIs(t, r.Uncarve(Range{c.Base, math.MaxUint64}), driver.ErrInvalid, "past the end of the address space")
	requireIs(t, carveErr(r.CarveAt(r.Base()+gran, math.MaxUint64-gran+1)), driver.ErrNotReserved, "past the end of the address space")
	requireIs(t, carveErr(r.CarveAt(r.Base()+gran, 1<<63)), driver.ErrNotReserved)
	require.Equal(t, before, snap(s))
	require.NoError(t, s.Check())
}

// TestNilArguments: a nil driver, a nil or typed-nil argument, and objects
// not made by this package's constructors answer driver.ErrInvalid and
// change nothing; none panics.
func TestNilArguments(t *testing.T) {
	for name, sp := range map[string]*Space{
		"New(nil)":       New(nil),
		"typed nil":      New((*sim.Driver)(nil)),
		"zero Space":     {},
		"New(nil) again": New(driver.Driver(nil)),
	} {
		t.Run(name, func(t *testing.T) {
			require.Nil(t, sp.Driver())
			_, err := sp.Reserve(gran, 0)
			requireIs(t, err, driver.ErrInvalid, "vaspace: reserve", "the space has no driver")
			requireIs(t, sp.Close(), driver.ErrInvalid, "no driver")
			requireIs(t, sp.Check(), driver.ErrInvalid, "no driver")
			require.Empty(t, sp.Reservations())
		})
	}
	require.Nil(t, (*Space)(nil).Driver())

	zero := &Reservation{}
	require.Nil(t, zero.Space().Driver())
	requireIs(t, carveErr(zero.Carve(gran, 0)), driver.ErrInvalid, "not made by Space.Reserve")
	requireIs(t, carveErr(zero.CarveAt(0, gran)), driver.ErrInvalid, "not made by Space.Reserve")
	requireIs(t, zero.Uncarve(Range{0, gran}), driver.ErrInvalid, "not made by Space.Reserve")
	requireIs(t, zero.Hold(func() error { return nil }), driver.ErrInvalid, "not made by Space.Reserve")
	requireIs(t, zero.Free(), driver.ErrInvalid, "not made by Space.Reserve")
	requireIs(t, zero.Attach(&occupant{}), driver.ErrInvalid, "not made by Space.Reserve")
	requireIs(t, zero.Check(), driver.ErrInvalid, "not made by Space.Reserve")
	zero.Detach(&occupant{})

	s, _ := newSpace(t)
	r, err := s.Reserve(4*gran, 0)
	require.NoError(t, err)
	o := &occupant{}
	require.NoError(t, r.Attach(o))
	before := snap(s)
	requireIs(t, r.Hold(nil), driver.ErrInvalid, "vaspace: hold", "the function is nil")
	requireIs(t, r.Attach(nil), driver.ErrInvalid, "the occupant is nil")
	requireIs(t, r.Attach((*occupant)(nil)), driver.ErrInvalid, "the occupant is nil")
	requireIs(t, r.Attach(sliceOccupant{}), driver.ErrInvalid, "cannot be compared")
	r.Detach(nil)
	r.Detach((*occupant)(nil))
	r.Detach(sliceOccupant{})
	require.Equal(t, before, snap(s))
	r.mu.Lock()
	require.Equal(t, []Occupant{o}, r.occupants, "the occupants are as they were")
	r.mu.Unlock()
	require.NoError(t, s.Check())
	r.Detach(o)
	require.NoError(t, r.Free())
}

// sliceOccupant is an Occupant whose values == panics on.
type sliceOccupant []Use

func (s sliceOccupant) Occupied() []Use { return s }

// TestCheckComparesWithDriver: a range unreserved through the driver
// behind the space's back fails Check (were it to pass, the reservation
// could never be freed nor the space closed); Free then
// lets it go with driver.ErrNotReserved, after which the books agree with
// the driver again.
func TestCheckComparesWithDriver(t *testing.T) {
	s, d := newSpace(t)
	a, err := s.Reserve(4*gran, 0)
	require.NoError(t, err)
	b, err := s.Reserve(2*gran, 0)
	require.NoError(t, err)
	require.NoError(t, s.Check())

	require.NoError(t, d.Unreserve(b.Base(), b.Size())) // behind the space's back
	for _, err := range []error{s.Check(), b.Check()} {
		require.True(t, errors.HasAssertionFailure(err), "%v", err)
		require.ErrorContains(t, err, b.String())
		require.ErrorContains(t, err, "behind the space's back")
	}
	require.NoError(t, a.Check())

	requireIs(t, b.Free(), driver.ErrNotReserved, "the driver no longer holds the range")
	require.True(t, b.Freed())
	require.Equal(t, []*Reservation{a}, s.Reservations())
	require.NoError(t, s.Check())

	// A driver closed under the space: every reservation is gone with it.
	require.NoError(t, d.Close())
	require.True(t, errors.HasAssertionFailure(s.Check()))
	requireIs(t, s.Close(), driver.ErrClosed, "the space is closed")
	require.True(t, a.Freed())
	require.Empty(t, s.Reservations())
	requireIs(t, s.Close(), driver.ErrClosed, "already closed")
}

// TestHoldPanicPropagates: Hold runs its function on the caller's
// goroutine and changes no books of its own, so a panic in it reaches the
// caller; the hold is let go on the way, and the reservation can be held
// again and freed.
func TestHoldPanicPropagates(t *testing.T) {
	s, _ := newSpace(t)
	r, err := s.Reserve(gran, 0)
	require.NoError(t, err)
	require.PanicsWithValue(t, "kaboom", func() {
		_ = r.Hold(func() error { panic("kaboom") })
	})
	require.NoError(t, r.Hold(func() error { return nil }))
	require.NoError(t, r.Free(), "the panic left no hold behind")
	require.NoError(t, s.Check())
}
