package mapping_test

import (
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
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
