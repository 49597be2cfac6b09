package disagg

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/lockrank"
)

// TestLockOrder: under the invariants tag (internal/lockrank), a Prefill's lock
// taken while a Local's (which Units reaches through Export) is held, or a
// Decode's while a Local's (both leaves, ranked apart),
// is reported before it can deadlock.
func TestLockOrder(t *testing.T) {
	if !lockrank.Enabled {
		t.Skip("the lock order is checked in builds with -tags invariants")
	}
	var p Prefill
	var l Local
	var d Decode
	require.Regexp(t, `DisaggPrefill .* while holding DisaggLocal`, lockrank.Violation(&l.mu, &p.mu))
	require.Regexp(t, `DisaggDecode .* while holding DisaggLocal`, lockrank.Violation(&l.mu, &d.mu))
}
