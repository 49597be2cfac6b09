package multidev

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/lockrank"
)

// TestLockOrder: under the invariants tag (internal/lockrank), an Arena's
// grants taken while the lock of the arena.Arena under it is held
// is reported before it can deadlock.
func TestLockOrder(t *testing.T) {
	if !lockrank.Enabled {
		t.Skip("the lock order is checked in builds with -tags invariants")
	}
	var a Arena
	var under lockrank.Mutex[lockrank.Arena] // the rank of the arena.Arena a places
	require.Regexp(t, `MultidevGrants .* while holding Arena `, lockrank.Violation(&under, &a.grants))
}
