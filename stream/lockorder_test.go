package stream

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/lockrank"
)

// TestLockOrder: under the invariants tag (internal/lockrank), a stream's lock
// taken while the hooks' (a leaf) is held, or an event's under a stream's,
// is reported before it can deadlock.
func TestLockOrder(t *testing.T) {
	if !lockrank.Enabled {
		t.Skip("the lock order is checked in builds with -tags invariants")
	}
	var s Stream
	var e Event
	require.Regexp(t, `Stream .* while holding StreamHooks`, lockrank.Violation(&hooks.mu, &s.mu))
	require.Regexp(t, `StreamEvent .* while holding Stream `, lockrank.Violation(&s.mu, &e.mu))
}
