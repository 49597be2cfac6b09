package mapping_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/mapping"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/vaspace"
)

// TestCheckSeesReservationUnreservedBehind: a table's reservation
// unreserved through the driver (nothing mapped, so the driver lets it)
// fails the table's Check, which the arena ranges and imported pools that
// own tables report through theirs; a map into it is refused with a clean
// error and changes nothing. (Before, the table's Check passed.)
func TestCheckSeesReservationUnreservedBehind(t *testing.T) {
	s := newStack(t)
	require.NoError(t, s.tab.Check())
	require.NoError(t, s.drv.Unreserve(s.res.Base(), s.res.Size()))
	err := s.tab.Check()
	require.True(t, errors.HasAssertionFailure(err), "%v", err)
	require.ErrorContains(t, err, "the table's reservation")
	require.ErrorContains(t, err, "behind the space's back")

	c, err := s.mem.Create(0, gran, driver.ChunkOptions{})
	require.NoError(t, err)
	drivertest.RequireIs(t, s.tab.Map(s.at(0), c), driver.ErrNotReserved)
	require.Zero(t, c.Mappings())
	for m := range s.tab.Mappings() {
		t.Fatalf("the refused map left %v", m)
	}
	require.NoError(t, c.Release())
	require.NoError(t, s.mem.Check())
	require.NoError(t, s.tab.Close())
	require.NoError(t, s.tab.Check(), "a closed table has no reservation to check")
}

// TestCheckSeesMappingsBehind: the table's Check compares it with the
// driver's own record (driver.Books). A chunk mapped into the table's
// reservation through the driver, one mapped there through a second
// table over the same reservation, and a mapping of the table's unmapped
// and replaced through the driver each fail Check with a message naming
// what happened; once undone, Check passes again.
func TestCheckSeesMappingsBehind(t *testing.T) {
	s := newStack(t)
	mine, err := s.mem.Create(0, gran, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, s.tab.Map(s.at(0), mine))
	require.NoError(t, s.tab.Check())

	// Mapped through the driver.
	raw, err := s.drv.Create(0, gran, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, s.drv.Map(s.at(4), raw))
	err = s.tab.Check()
	require.True(t, errors.HasAssertionFailure(err), "%v", err)
	require.ErrorContains(t, err, "the host driver has 2 mapping(s)")
	require.ErrorContains(t, err, "behind this table's back")
	require.NoError(t, s.drv.Unmap(s.at(4), gran))
	require.NoError(t, s.drv.Release(raw))
	require.NoError(t, s.tab.Check())

	// Mapped through a second table over the same reservation.
	other, err := mapping.New(s.res, s.mem)
	require.NoError(t, err)
	foreign, err := s.mem.Create(0, gran, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, other.Map(s.at(8), foreign))
	err = s.tab.Check()
	require.True(t, errors.HasAssertionFailure(err), "%v", err)
	require.ErrorContains(t, err, "another table over the same reservation")
	require.NoError(t, other.Unmap(s.at(8)))
	require.NoError(t, other.Close())
	require.NoError(t, foreign.Release())
	require.NoError(t, s.tab.Check())

	// The table's own mapping unmapped and replaced through the driver.
	require.NoError(t, s.drv.Unmap(s.at(0), gran))
	swapped, err := s.drv.Create(0, gran, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, s.drv.Map(s.at(0), swapped))
	err = s.tab.Check()
	require.True(t, errors.HasAssertionFailure(err), "%v", err)
	require.ErrorContains(t, err, "remapped through the driver behind the table's back")
	require.NoError(t, s.drv.Unmap(s.at(0), gran))
	require.NoError(t, s.drv.Release(swapped))
	require.NoError(t, s.drv.Map(s.at(0), mine.Handle()))
	require.NoError(t, s.tab.Check())
	require.NoError(t, s.tab.Unmap(s.at(0)))
	require.NoError(t, mine.Release())
}

// TestNewRefusesAnOwnersReservation: a table over a reservation an owner
// keeps is refused (ErrBusy naming the owner) unless the owner makes it,
// and the refusal leaves the reservation as it was.
func TestNewRefusesAnOwnersReservation(t *testing.T) {
	s := newStack(t)
	own := vaspace.NewOwner("a test's range")
	res, err := s.space.ReserveFor(own, 4*gran, 0)
	require.NoError(t, err)
	_, err = mapping.New(res, s.mem)
	drivertest.RequireIs(t, err, driver.ErrBusy, "kept by a test's range")
	_, err = mapping.NewFor(vaspace.NewOwner("someone else"), res, s.mem)
	drivertest.RequireIs(t, err, driver.ErrBusy, "kept by a test's range")
	_, err = mapping.NewFor(own, s.res, s.mem)
	drivertest.RequireIs(t, err, driver.ErrBusy, "kept by nobody")
	require.NoError(t, res.Check())
	tab, err := mapping.NewFor(own, res, s.mem)
	require.NoError(t, err)
	require.NoError(t, tab.Check())
	require.NoError(t, tab.Close())
	require.NoError(t, res.FreeFor(own))
}

// TestCheckSeesReleaseBehind: a mapped chunk released through the driver
// (the driver keeps its memory for the mapping, so the device's usage does
// not move) fails both the table's Check and the physical memory's.
func TestCheckSeesReleaseBehind(t *testing.T) {
	s := newStack(t)
	c, err := s.mem.Create(0, gran, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, s.tab.Map(s.at(0), c))
	require.NoError(t, s.drv.Release(c.Handle()))
	err = s.tab.Check()
	require.True(t, errors.HasAssertionFailure(err), "%v", err)
	require.ErrorContains(t, err, "released through the driver behind the physical memory's back")
	err = s.mem.Check()
	require.True(t, errors.HasAssertionFailure(err), "%v", err)
	require.ErrorContains(t, err, "does not hold handle")
	require.NoError(t, s.tab.Unmap(s.at(0)))
	drivertest.RequireIs(t, c.Release(), driver.ErrBadHandle, "no longer holds the handle")
	require.NoError(t, s.tab.Check())
	require.NoError(t, s.mem.Check())
}

// TestUnmapOfMappingUnmappedBehind: a mapping of the table's unmapped
// through the driver behind the table's back is let go by the table's
// Unmap (and Close): the driver no longer maps it, so the books follow
// the driver, and the error, which wraps driver.ErrNotMapped, says what
// happened. The chunk's reference goes with it, so its memory returns on
// Release, and the reservation can be freed. (Before, Unmap and Close
// failed for good, holding the chunk's memory and the reservation.)
func TestUnmapOfMappingUnmappedBehind(t *testing.T) {
	s := newStack(t)
	a, err := s.mem.Create(0, gran, driver.ChunkOptions{})
	require.NoError(t, err)
	b, err := s.mem.Create(1, 2*gran, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, s.tab.Map(s.at(0), a))
	require.NoError(t, s.tab.Map(s.at(4), b))

	require.NoError(t, s.drv.Unmap(s.at(0), gran)) // behind the table's back
	drivertest.RequireIs(t, s.tab.Unmap(s.at(0)), driver.ErrNotMapped,
		"mapping: unmap at", "the driver no longer maps", "has let it go")
	_, err = s.tab.Lookup(s.at(0))
	drivertest.RequireIs(t, err, driver.ErrNotMapped)
	require.Zero(t, a.Mappings())
	require.NoError(t, s.tab.Check())
	require.NoError(t, a.Release())
	require.Equal(t, uint64(0), usageOf(t, s, 0).Used, "a's memory returned")

	require.NoError(t, s.drv.Unmap(s.at(4), 2*gran)) // and b's, before Close
	drivertest.RequireIs(t, s.tab.Close(), driver.ErrNotMapped, "mapping: close", "has let it go")
	require.Zero(t, b.Mappings())
	require.NoError(t, b.Release())
	require.NoError(t, s.mem.Check())
	require.NoError(t, s.res.Free(), "nothing holds the reservation")
}

func usageOf(t *testing.T, s *stack, dev driver.DeviceID) physical.Usage {
	t.Helper()
	u, err := s.mem.Usage(dev)
	require.NoError(t, err)
	return u
}
