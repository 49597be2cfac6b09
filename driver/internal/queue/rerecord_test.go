package queue

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
)

// TestReRecordDoesNotReleaseEarlierWaiters: a stream waiting on an event
// waits for the recording current when it started waiting, even if the
// event is recorded again on another stream and that recording completes
// first. (The pool recycles its events; an engine that kept one "done
// generation" per event released such waiters early, and the pool's model
// test saw another stream's writes land in memory still in use.)
func TestReRecordDoesNotReleaseEarlierWaiters(t *testing.T) {
	e := New("test", 1, func(_, _ driver.DeviceID) bool { return false })
	defer e.Close()
	a, err := e.CreateStream(0)
	require.NoError(t, err)
	b, err := e.CreateStream(0)
	require.NoError(t, err)
	c, err := e.CreateStream(0)
	require.NoError(t, err)
	ev, err := e.CreateEvent(0)
	require.NoError(t, err)

	gate := make(chan struct{})
	open := sync.OnceFunc(func() { close(gate) })
	defer open() // before Close, which waits for the blocked work, even when the test fails first
	require.NoError(t, e.LaunchHostFunc(a, "blocked", func() error { <-gate; return nil }))
	require.NoError(t, e.RecordEvent(ev, a)) // recording 1: behind the blocked work
	require.NoError(t, e.StreamWaitEvent(c, ev))
	ran := make(chan struct{})
	require.NoError(t, e.LaunchHostFunc(c, "after the wait", func() error { close(ran); return nil }))
	require.NoError(t, e.RecordEvent(ev, b)) // recording 2: completes at once
	require.NoError(t, e.SyncStream(b))
	select {
	case <-ran:
		t.Fatal("the wait on recording 1 was released by recording 2")
	case <-time.After(30 * time.Millisecond): // a wait released wrongly is most likely seen by then; a late one passes, never fails
	}
	open()
	<-ran // the wait that never ends hangs here until go test's -timeout
}
