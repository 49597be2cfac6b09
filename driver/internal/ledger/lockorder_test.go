package ledger

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/lockrank"
)

// TestLockOrder: under the invariants tag (internal/lockrank), the ledger's lock
// taken while a stream engine's (operations run without it) is held
// is reported before it can deadlock.
func TestLockOrder(t *testing.T) {
	if !lockrank.Enabled {
		t.Skip("the lock order is checked in builds with -tags invariants")
	}
	var l Ledger
	var engine lockrank.Mutex[lockrank.QueueEngine]
	require.Regexp(t, `Ledger .* while holding QueueEngine`, lockrank.Violation(&engine, &l.mu))
}
