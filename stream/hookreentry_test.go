package stream_test

import (
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/stream"
)

// TestSynchronizeInHookRefused: a synchronize hook that synchronizes a
// stream or an event ran the hooks again from inside itself, and so on
// until the stack overflowed (a fatal error no recover catches). The
// synchronize inside the hook is refused (ErrInvalid, pointing at
// Event.WaitDone) and the hooks run once; the outer synchronize succeeds.
// The hook here recurses at most once, so a synchronize that ran the hooks
// again would fail the test rather than crash it.
func TestSynchronizeInHookRefused(t *testing.T) {
	d := newHost(t)
	ss := newStreams(t, d, 2)
	ev, err := stream.NewEvent(d, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ev.Destroy() })
	require.NoError(t, ss[1].Record(ev))

	var depth, deepest atomic.Int32
	var inner []error
	cancel, err := stream.OnSynchronize(d, func() {
		n := depth.Add(1)
		defer depth.Add(-1)
		if n > deepest.Load() {
			deepest.Store(n)
		}
		if n > 1 {
			return // a synchronize that runs the hooks again recurses: stop at one level
		}
		inner = append(inner, ss[0].Synchronize(), ss[1].Synchronize(), ev.Synchronize())
	})
	require.NoError(t, err)
	defer cancel()

	for _, sync := range []func() error{ss[0].Synchronize, ev.Synchronize} {
		inner = nil
		require.NoError(t, bounded(t, "synchronize", sync))
		require.Equal(t, int32(1), deepest.Load(), "the hooks ran from inside a hook")
		require.Len(t, inner, 3)
		for _, err := range inner {
			drivertest.RequireIs(t, err, driver.ErrInvalid, "inside a synchronize hook")
		}
	}
	// A hook may still wait for an event without running the hooks.
	cancel()
	var waited error
	cancel2, err := stream.OnSynchronize(d, func() { waited = ev.WaitDone() })
	require.NoError(t, err)
	defer cancel2()
	require.NoError(t, bounded(t, "synchronize", ss[0].Synchronize))
	require.NoError(t, waited)
}

// TestSynchronizeBesideHookAllowed: another goroutine's synchronize while
// a hook runs is not a re-entry: it runs, hooks and all.
func TestSynchronizeBesideHookAllowed(t *testing.T) {
	d := newHost(t)
	ss := newStreams(t, d, 2)
	inHook, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	cancel, err := stream.OnSynchronize(d, func() {
		if calls.Add(1) == 1 {
			close(inHook)
			<-release
		}
	})
	require.NoError(t, err)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- ss[0].Synchronize() }()
	<-inHook
	require.NoError(t, bounded(t, "synchronize beside a hook", ss[1].Synchronize))
	close(release)
	require.NoError(t, bounded(t, "synchronize", func() error { return <-done }))
	require.Equal(t, int32(2), calls.Load())
}
