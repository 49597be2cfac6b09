package vaspace

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// TestOwnedReservation: a reservation an owner keeps (ReserveFor) is freed
// only by that owner. Free through what the Space hands out, FreeFor of
// another owner and Close of the space are refused (ErrBusy, naming the
// owner) and change nothing: the reservation stays live, in the books and
// in the driver. (Before, a caller could free an arena's range through the
// Space it passed in; the arena's Check still passed and its Close failed
// for ever.)
func TestOwnedReservation(t *testing.T) {
	s, d := newSpace(t)
	o := NewOwner("an arena range")
	require.Equal(t, "an arena range", o.String())
	require.Equal(t, "nobody", (*Owner)(nil).String())
	kept, err := s.ReserveFor(o, 4*gran, 0)
	require.NoError(t, err)
	require.Equal(t, "an arena range", kept.KeptBy())
	plain, err := s.Reserve(2*gran, 0)
	require.NoError(t, err)
	require.Empty(t, plain.KeptBy())
	_, err = kept.Carve(gran, 0)
	require.NoError(t, err)
	before := snap(s)
	used := d.Tally()

	requireIs(t, kept.Free(), driver.ErrBusy, "vaspace: free", kept.String(), "kept by an arena range", "frees it itself")
	require.Contains(t, errors.FlattenHints(kept.Free()), "close its owner (an arena range)")
	requireIs(t, kept.FreeFor(NewOwner("another arena range")), driver.ErrBusy, "for another arena range", "kept by an arena range")
	requireIs(t, kept.FreeFor(nil), driver.ErrInvalid, "the owner is nil")
	requireIs(t, plain.FreeFor(o), driver.ErrInvalid, "for an arena range", "nobody keeps it")
	requireIs(t, s.Close(), driver.ErrBusy, "vaspace: close", "1 reservation(s) still in use", kept.Range().String(), "kept by an arena range")
	requireIs(t, reserveErr(s.ReserveFor(nil, gran, 0)), driver.ErrInvalid, "the owner is nil")
	require.Equal(t, before, snap(s), "refusals change nothing")
	require.Equal(t, used, d.Tally())
	require.False(t, kept.Freed())
	require.False(t, plain.Freed())
	require.NoError(t, s.Check())

	require.NoError(t, kept.FreeFor(o))
	require.True(t, kept.Freed())
	require.Equal(t, "an arena range", kept.KeptBy(), "it answers after Free too")
	requireIs(t, kept.FreeFor(o), driver.ErrClosed, "freed")
	requireIs(t, kept.Free(), driver.ErrClosed, "freed")
	require.NoError(t, s.Check())
	require.NoError(t, s.Close(), "nobody keeps the rest")
	require.True(t, plain.Freed())
	require.NoError(t, d.Check())
}

// TestOwnedReservationUnreservedBehind: an owned reservation unreserved
// through the driver is reported by Check, and the owner's FreeFor lets it
// go (saying why) so that the owner can close.
func TestOwnedReservationUnreservedBehind(t *testing.T) {
	s, d := newSpace(t)
	o := NewOwner("an imported pool")
	r, err := s.ReserveFor(o, 2*gran, 0)
	require.NoError(t, err)
	require.NoError(t, d.Unreserve(r.Base(), r.Size()))
	for _, err := range []error{s.Check(), r.Check()} {
		require.True(t, errors.HasAssertionFailure(err), "%v", err)
		require.ErrorContains(t, err, "behind the space's back")
	}
	requireIs(t, r.FreeFor(o), driver.ErrNotReserved, "the driver no longer holds the range")
	require.True(t, r.Freed())
	require.NoError(t, s.Check())
	require.NoError(t, s.Close())
}

// TestOwnerZeroValues: the owner calls of a zero Space and a zero
// Reservation answer with errors, as the others do.
func TestOwnerZeroValues(t *testing.T) {
	o := NewOwner("an arena range")
	requireIs(t, reserveErr((&Space{}).ReserveFor(o, gran, 0)), driver.ErrInvalid, "the space has no driver")
	zero := &Reservation{}
	require.Empty(t, zero.KeptBy())
	requireIs(t, zero.FreeFor(o), driver.ErrInvalid, "not made by Space.Reserve")
	requireIs(t, zero.FreeFor(nil), driver.ErrInvalid, "the owner is nil")
}
