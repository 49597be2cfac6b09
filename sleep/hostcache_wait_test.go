package sleep

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/lockrank"
)

// TestHostCacheCloseWaitsUnlocked: the cache's close gives its kept
// buffers back with HostFree, which waits for the work on the driver's
// streams; it does so without the cache's lock, so the cache answers
// (held) while a stream's host function keeps that HostFree waiting
// (before, held waited for the host function's gate, which the test opens
// only after held returned: a deadlock go test -timeout caught). Under
// the invariants tag the lock is a leaf of the order.
func TestHostCacheCloseWaitsUnlocked(t *testing.T) {
	d := openHost(t, testCap)
	c := newHostCache(d, 4*pinnedMin)
	b, pinned, err := c.alloc(pinnedMin)
	require.NoError(t, err)
	require.True(t, pinned)
	require.NoError(t, c.release(b, pinned))
	require.Equal(t, uint64(pinnedMin), c.held())

	st := driver.Streams(d)
	s, err := st.CreateStream(0)
	require.NoError(t, err)
	gate := make(chan struct{})
	require.NoError(t, st.LaunchHostFunc(s, "gate", func() error { <-gate; return nil }))
	closed := make(chan error, 1)
	go func() { closed <- c.close() }()
	for c.held() != 0 { // close took the buffers; its HostFree waits for the gate
		runtime.Gosched()
	}
	close(gate)
	require.NoError(t, <-closed)
	require.NoError(t, st.SyncStream(s))
	require.NoError(t, st.DestroyStream(s))

	if lockrank.Enabled {
		var m Manager
		require.Regexp(t, `SleepManager .* while holding SleepHostCache`, lockrank.Violation(&c.mu, &m.mu))
	}
}
