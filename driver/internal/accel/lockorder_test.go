package accel

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/lockrank"
)

// TestLockOrder: under the invariants tag (internal/lockrank), a Core's lock (a
// leaf, in order under the engine's) taken while the host buffers' is held
// is reported before it can deadlock.
func TestLockOrder(t *testing.T) {
	if !lockrank.Enabled {
		t.Skip("the lock order is checked in builds with -tags invariants")
	}
	var c Core
	var hb lockrank.Mutex[lockrank.HostBuffers]
	var engine lockrank.Mutex[lockrank.QueueEngine]
	require.Regexp(t, `AccelStreams .* while holding HostBuffers`, lockrank.Violation(&hb, &c.mu))
	require.Empty(t, lockrank.Violation(&engine, &c.mu))
}
