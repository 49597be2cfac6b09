package queue

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// TestHostBuffers: whole live buffers only come back once; Busy while any
// is live; Close hands back the live ones and takes no more.
func TestHostBuffers(t *testing.T) {
	e := newEngine(t, 1)
	var h HostBuffers
	a, b := make([]byte, 64), make([]byte, 128)
	require.True(t, h.Add(a))
	require.True(t, h.Add(b))
	require.True(t, errors.Is(h.Busy("test"), driver.ErrBusy))
	require.True(t, errors.Is(h.Remove("test", e, a[:32]), driver.ErrInvalid), "part of a buffer")
	require.True(t, errors.Is(h.Remove("test", e, make([]byte, 64)), driver.ErrInvalid), "a buffer never added")
	require.NoError(t, h.Remove("test", e, a))
	require.True(t, errors.Is(h.Remove("test", e, a), driver.ErrInvalid), "freed twice")
	live := h.Close()
	require.Len(t, live, 1)
	require.Equal(t, &b[0], &live[0][0])
	require.Len(t, live[0], 128)
	require.NoError(t, h.Busy("test"))
	require.False(t, h.Add(a), "closed")
	require.True(t, errors.Is(h.Remove("test", e, b), driver.ErrClosed))
}

// TestHostBuffersRemoveWaits: Remove gives a buffer up only
// once the work queued before it has run, on every stream, so a copy
// queued on the buffer lands before the memory goes; a Remove from a host
// function that work waits for is refused (ErrBusy) and the buffer stays
// live.
func TestHostBuffersRemoveWaits(t *testing.T) {
	e := newEngine(t, 1)
	a, err := e.CreateStream(0)
	require.NoError(t, err)
	b, err := e.CreateStream(0)
	require.NoError(t, err)
	var h HostBuffers
	buf := make([]byte, 64)
	require.True(t, h.Add(buf))

	wait, open := gate()
	defer open()
	require.NoError(t, e.Enqueue(a, "gate", wait))
	var copied atomic.Bool
	require.NoError(t, e.Enqueue(a, "copy into the buffer", func() error { copy(buf, "copied"); copied.Store(true); return nil }))
	require.NoError(t, e.Enqueue(b, "fails", func() error { return errors.New("boom") }))
	removed := make(chan bool, 1)
	go func() {
		err := h.Remove("test", e, buf)
		removed <- err == nil && copied.Load()
	}()
	open()
	ok := false
	require.NoError(t, within(t, "remove", func() error { ok = <-removed; return nil }))
	require.True(t, ok, "Remove returned before the queued copy ran")
	require.NoError(t, h.Busy("test"))
	require.ErrorContains(t, e.SyncStream(b), "boom", "the wait reported no failure: the stream still has it")

	// From a host function of a (the copy is behind it): refused, live.
	require.True(t, h.Add(buf))
	var inside error
	wait2, open2 := gate()
	defer open2()
	require.NoError(t, e.Enqueue(a, "gate", wait2))
	require.NoError(t, e.Enqueue(a, "frees", func() error { inside = h.Remove("test", e, buf); return nil }))
	require.NoError(t, e.Enqueue(a, "copy into the buffer", func() error { copy(buf, "again"); return nil }))
	open2()
	require.NoError(t, within(t, "sync", func() error { return e.SyncStream(a) }))
	require.True(t, errors.Is(inside, driver.ErrBusy), "%v", inside)
	require.True(t, errors.Is(h.Busy("test"), driver.ErrBusy), "still live")
	require.NoError(t, h.Remove("test", e, buf))
	require.NoError(t, check(e))
}

// TestDrain: Drain waits for what every stream had when it was called
// and takes no failure away from the stream's next synchronize. From a
// host function it waits for streams independent of the caller and
// refuses (ErrBusy) at once when the caller's own stream, or one ordered
// after it, has work; after Close it is ErrClosed.
func TestDrain(t *testing.T) {
	e := newEngine(t, 1)
	a, err := e.CreateStream(0)
	require.NoError(t, err)
	b, err := e.CreateStream(0)
	require.NoError(t, err)
	require.NoError(t, within(t, "drain of idle streams", func() error { return e.Drain("drain") }))

	waitA, openA := gate()
	defer openA()
	waitB, openB := gate()
	defer openB()
	var ranA, ranB atomic.Bool
	require.NoError(t, e.Enqueue(a, "gate a", waitA))
	require.NoError(t, e.Enqueue(a, "after a", func() error { ranA.Store(true); return nil }))
	require.NoError(t, e.Enqueue(b, "gate b", waitB))
	require.NoError(t, e.Enqueue(b, "after b", func() error { ranB.Store(true); return errors.New("b failed") }))
	drained := make(chan bool, 1)
	go func() {
		err := e.Drain("drain")
		drained <- err == nil && ranA.Load() && ranB.Load()
	}()
	openA()
	openB()
	ok := false
	require.NoError(t, within(t, "drain", func() error { ok = <-drained; return nil }))
	require.True(t, ok, "Drain returned before the work queued at the call ran")
	require.ErrorContains(t, within(t, "sync b", func() error { return e.SyncStream(b) }), "b failed")

	// From a host function: work independent of the caller is waited
	// for; work queued behind it on its own stream, or on a stream that
	// waits for it, is refused at once.
	waitB2, openB2 := gate()
	defer openB2()
	require.NoError(t, e.Enqueue(b, "gate b", waitB2))
	ranB.Store(false)
	require.NoError(t, e.Enqueue(b, "after b", func() error { ranB.Store(true); return nil }))
	var fromA error
	require.NoError(t, e.Enqueue(a, "drains", func() error {
		openB2()
		fromA = e.Drain("drain")
		if fromA == nil && !ranB.Load() {
			fromA = errors.New("Drain returned before b's work ran")
		}
		return nil
	}))
	require.NoError(t, within(t, "sync a", func() error { return e.SyncStream(a) }))
	require.NoError(t, fromA, "nothing queued behind the host function, b independent of it")

	var behind, waiting error
	waitA2, openA2 := gate()
	defer openA2()
	require.NoError(t, e.Enqueue(a, "gate", waitA2))
	require.NoError(t, e.Enqueue(a, "drains", func() error { behind = e.Drain("drain"); return nil }))
	require.NoError(t, e.Enqueue(a, "behind the host function", func() error { return nil }))
	openA2()
	require.NoError(t, within(t, "sync a", func() error { return e.SyncStream(a) }))
	require.True(t, errors.Is(behind, driver.ErrBusy), "%v", behind)
	require.ErrorContains(t, behind, fmt.Sprintf("running on stream %d: it would wait for that stream", a))

	// b's host function waits for a, whose host function drains.
	waitA3, openA3 := gate()
	defer openA3()
	require.NoError(t, e.Enqueue(a, "gate", waitA3))
	require.NoError(t, e.Enqueue(a, "drains", func() error { waiting = e.Drain("drain"); return nil }))
	require.NoError(t, e.Enqueue(b, "syncs a", func() error { return e.SyncStream(a) }))
	until(func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.streams[b].blocked != nil
	})
	openA3()
	require.NoError(t, within(t, "sync b", func() error { return e.SyncStream(b) }))
	require.True(t, errors.Is(waiting, driver.ErrBusy), "%v", waiting)
	require.ErrorContains(t, waiting, fmt.Sprintf("it would wait for stream %d", b))
	require.NoError(t, check(e))
	require.NoError(t, within(t, "close", e.Close))
	require.True(t, errors.Is(e.Drain("drain"), driver.ErrClosed))
}

// TestDrainWaitsForDestroyedStream: a stream destroyed from a host
// function keeps running its last work after DestroyStream returned (the
// work waits for the caller); Drain waits for that work too.
func TestDrainWaitsForDestroyedStream(t *testing.T) {
	e := newEngine(t, 1)
	a, err := e.CreateStream(0)
	require.NoError(t, err)
	gone, err := e.CreateStream(0)
	require.NoError(t, err)
	ev, err := e.CreateEvent(0)
	require.NoError(t, err)
	waitGone, openGone := gate()
	defer openGone()
	waitA, openA := gate()
	defer openA()
	require.NoError(t, e.Enqueue(gone, "gate", waitGone))
	destroyed := make(chan error, 1)
	require.NoError(t, e.Enqueue(a, "destroys gone", func() error { destroyed <- e.DestroyStream(gone); return nil }))
	require.NoError(t, e.Enqueue(a, "gate", waitA))
	require.NoError(t, e.RecordEvent(ev, a)) // behind the host function
	until(func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.streams[a].blocked != nil
	})
	require.NoError(t, e.StreamWaitEvent(gone, ev))
	var ran atomic.Bool
	require.NoError(t, e.Enqueue(gone, "after the wait", func() error { ran.Store(true); return nil }))
	openGone()
	require.NoError(t, within(t, "destroy", func() error { return <-destroyed }))
	drained := make(chan bool, 1)
	go func() { err := e.Drain("drain"); drained <- err == nil && ran.Load() }()
	openA()
	ok := false
	require.NoError(t, within(t, "drain", func() error { ok = <-drained; return nil }))
	require.True(t, ok, "Drain returned before the destroyed stream's last work ran")
	require.NoError(t, check(e))
}
