package vaspace

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/lockrank"
)

// TestLockOrder: under the invariants tag (internal/lockrank), a space's lock
// taken while one of its reservations' is held
// is reported before it can deadlock.
func TestLockOrder(t *testing.T) {
	if !lockrank.Enabled {
		t.Skip("the lock order is checked in builds with -tags invariants")
	}
	var s Space
	var r Reservation
	require.Regexp(t, `VaspaceSpace .* while holding VaspaceReservation`, lockrank.Violation(&r.mu, &s.mu))
}
