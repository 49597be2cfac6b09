package queue

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/lockrank"
)

// TestLockOrder: under the invariants tag (internal/lockrank), the engine's lock
// taken while the host buffers' (a leaf) is held
// is reported before it can deadlock.
func TestLockOrder(t *testing.T) {
	if !lockrank.Enabled {
		t.Skip("the lock order is checked in builds with -tags invariants")
	}
	e := New("test", 1, nil)
	var hb HostBuffers
	require.Regexp(t, `QueueEngine .* while holding HostBuffers`, lockrank.Violation(&hb.mu, &e.mu))
}
