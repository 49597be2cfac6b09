package sim

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/lockrank"
)

// TestLockOrder: under the invariants tag (internal/lockrank), the call counts'
// lock, which comes before the ledger's, taken while a ledger's is held,
// is reported before it can deadlock.
func TestLockOrder(t *testing.T) {
	if !lockrank.Enabled {
		t.Skip("the lock order is checked in builds with -tags invariants")
	}
	var d Driver
	var books lockrank.RWMutex[lockrank.Ledger]
	require.Regexp(t, `SimCalls .* while holding Ledger`, lockrank.Violation(&books, &d.calls))
}
