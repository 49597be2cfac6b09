package queue

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

func newEngine(t *testing.T, ndev int) *Engine {
	t.Helper()
	e := New("test", ndev, func(_, _ driver.DeviceID) bool { return true })
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// within returns call's error; what names the wait for a reader. It sets
// no clock: a call that never returns is bounded by go test's -timeout,
// which prints every goroutine's stack.
func within(t *testing.T, what string, call func() error) error {
	t.Helper()
	_ = what
	return call()
}

// until polls cond until it holds: a wait that ends on a condition, never
// on the clock (go test's -timeout bounds one that never holds).
func until(cond func() bool) {
	for !cond() {
		time.Sleep(time.Millisecond)
	}
}

// check verifies the engine's invariants: done <= enq and the queue holds
// the difference less the operation running; an event's done generation
// never passes its recorded one.
func check(e *Engine) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	var errs error
	for id, st := range e.streams {
		if st.id != id {
			errs = errors.CombineErrors(errs, errors.AssertionFailedf("stream %d recorded under %d", st.id, id))
		}
		if st.done > st.enq {
			errs = errors.CombineErrors(errs, errors.AssertionFailedf("stream %d: done %d > enq %d", id, st.done, st.enq))
		}
		if n := st.enq - st.done; uint64(len(st.queue)) > n || uint64(len(st.queue))+1 < n {
			errs = errors.CombineErrors(errs, errors.AssertionFailedf("stream %d: %d queued, %d unfinished", id, len(st.queue), n))
		}
		if st.err == nil && st.skipped != 0 {
			errs = errors.CombineErrors(errs, errors.AssertionFailedf("stream %d: %d skipped with no failure", id, st.skipped))
		}
	}
	for id, x := range e.events {
		if x.id != id {
			errs = errors.CombineErrors(errs, errors.AssertionFailedf("event %d recorded under %d", x.id, id))
		}
	}
	// Every worker's stream, destroyed ones draining included: only a
	// running operation has cur and blocked; hostRunning counts the
	// running host functions.
	host := 0
	for gid, st := range e.workers {
		if gid == 0 {
			errs = errors.CombineErrors(errs, errors.AssertionFailedf("stream %d: a worker without a goroutine id", st.id))
		}
		if st.running && !st.cur.control {
			host++
		}
		if !st.running && (st.cur.run != nil || st.blocked != nil) {
			errs = errors.CombineErrors(errs, errors.AssertionFailedf("stream %d: not running, but with a current operation or a wait", st.id))
		}
	}
	if host != e.hostRunning {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf("%d host functions running, hostRunning says %d", host, e.hostRunning))
	}
	return errs
}

// gate is a channel that an operation waits on.
func gate() (wait func() error, open func()) {
	ch := make(chan struct{})
	var once sync.Once
	return func() error {
			<-ch
			return nil
		}, func() {
			once.Do(func() { close(ch) })
		}
}

// TestManyStreamsInOrder enqueues from one goroutine per stream, with
// records and cross-stream waits mixed in, and checks every stream ran its
// own operations in enqueue order.
func TestManyStreamsInOrder(t *testing.T) {
	const streams, ops = 16, 300
	e := newEngine(t, 2)
	ids := make([]driver.Stream, streams)
	evs := make([]driver.Event, streams)
	for i := range ids {
		var err error
		ids[i], err = e.CreateStream(driver.DeviceID(i % 2))
		require.NoError(t, err)
		evs[i], err = e.CreateEvent(driver.DeviceID(i % 2))
		require.NoError(t, err)
	}
	seqs := make([][]int, streams)
	var wg sync.WaitGroup
	errs := make([]error, streams)
	for i := range streams {
		wg.Go(func() {
			for k := range ops {
				if err := e.Enqueue(ids[i], fmt.Sprintf("op %d", k), func() error {
					seqs[i] = append(seqs[i], k)
					return nil
				}); err != nil {
					errs[i] = err
					return
				}
				if k%50 == 0 {
					errs[i] = errors.CombineErrors(e.RecordEvent(evs[i], ids[i]),
						e.StreamWaitEvent(ids[i], evs[(i+1)%streams]))
					if errs[i] != nil {
						return
					}
				}
			}
			errs[i] = e.SyncStream(ids[i])
		})
	}
	require.NoError(t, within(t, "the streams", func() error { wg.Wait(); return nil }))
	want := make([]int, ops)
	for k := range want {
		want[k] = k
	}
	for i := range streams {
		require.NoError(t, errs[i], "stream %d", i)
		require.Equal(t, want, seqs[i], "stream %d ran out of order", i)
	}
	require.NoError(t, check(e))
}

// TestStreamsOverlap checks that the streams run at the same time: every
// stream's operation waits until all of them have started.
func TestStreamsOverlap(t *testing.T) {
	const streams = 8
	e := newEngine(t, 1)
	var started sync.WaitGroup
	started.Add(streams)
	all := make(chan struct{})
	go func() { started.Wait(); close(all) }()
	ids := make([]driver.Stream, streams)
	for i := range ids {
		var err error
		ids[i], err = e.CreateStream(0)
		require.NoError(t, err)
		require.NoError(t, e.Enqueue(ids[i], "meet", func() error {
			started.Done()
			<-all
			return nil
		}))
	}
	for _, id := range ids {
		require.NoError(t, within(t, "sync", func() error { return e.SyncStream(id) }))
	}
}

// TestFailureSkipsAndReports checks the accounting of a failure: later
// operations are skipped and counted, records and waits still run, the
// error names the operation by its place in the stream and is cleared
// once reported.
func TestFailureSkipsAndReports(t *testing.T) {
	e := newEngine(t, 1)
	s, err := e.CreateStream(0)
	require.NoError(t, err)
	ev, err := e.CreateEvent(0)
	require.NoError(t, err)
	boom := errors.New("boom")
	var ran []string
	run := func(name string) func() error { return func() error { ran = append(ran, name); return nil } }
	require.NoError(t, e.Enqueue(s, "a", run("a")))
	require.NoError(t, e.Enqueue(s, "fails", func() error { return boom }))
	require.NoError(t, e.Enqueue(s, "b", run("b")))
	require.NoError(t, e.RecordEvent(ev, s))
	require.NoError(t, e.StreamWaitEvent(s, ev))
	require.NoError(t, e.Enqueue(s, "c", run("c")))
	err = within(t, "sync", func() error { return e.SyncStream(s) })
	require.ErrorIs(t, err, boom)
	require.Contains(t, err.Error(), "operation 2 (fails) failed")
	require.Contains(t, err.Error(), "2 later operation(s) skipped")
	require.Equal(t, []string{"a"}, ran)
	done, err := e.QueryEvent(ev)
	require.NoError(t, err)
	require.True(t, done, "a record after a failure still runs")
	require.NoError(t, check(e))
	require.NoError(t, e.SyncStream(s), "reported once")
	// Numbering goes on counting every operation of the stream.
	require.NoError(t, e.Enqueue(s, "fails again", func() error { return boom }))
	err = within(t, "sync", func() error { return e.SyncStream(s) })
	require.Contains(t, err.Error(), "operation 7 (fails again) failed")
	require.NotContains(t, err.Error(), "skipped")
}

// TestWaitUsesRecordAtCallTime checks that a wait holds for the recording
// the event had when StreamWaitEvent was called, not for a later one.
func TestWaitUsesRecordAtCallTime(t *testing.T) {
	e := newEngine(t, 1)
	a, err := e.CreateStream(0)
	require.NoError(t, err)
	b, err := e.CreateStream(0)
	require.NoError(t, err)
	ev, err := e.CreateEvent(0)
	require.NoError(t, err)
	waitA, openA := gate()
	defer openA()
	waitB, openB := gate()
	defer openB()
	require.NoError(t, e.RecordEvent(ev, a))
	require.NoError(t, within(t, "sync event", func() error { return e.SyncEvent(ev) }))
	require.NoError(t, e.Enqueue(b, "gate", waitB))
	require.NoError(t, e.StreamWaitEvent(b, ev)) // for the first recording, done
	require.NoError(t, e.Enqueue(a, "gate", waitA))
	require.NoError(t, e.RecordEvent(ev, a)) // a second, behind a's gate
	openB()
	require.NoError(t, within(t, "sync b", func() error { return e.SyncStream(b) }))
	done, err := e.QueryEvent(ev)
	require.NoError(t, err)
	require.False(t, done)
	openA()
	require.NoError(t, within(t, "sync a", func() error { return e.SyncStream(a) }))
	require.NoError(t, check(e))
}

// TestCloseWaitsForQueuedWork checks that Close runs everything queued,
// behind a gate that opens only after Close has begun, and returns any
// failure no synchronize reported; later calls are ErrClosed.
func TestCloseWaitsForQueuedWork(t *testing.T) {
	const streams, ops = 4, 10
	e := New("test", 2, func(_, _ driver.DeviceID) bool { return true })
	wait, open := gate()
	defer open()
	var count atomic.Int32
	boom := errors.New("boom")
	var ids []driver.Stream
	for i := range streams {
		s, err := e.CreateStream(driver.DeviceID(i % 2))
		require.NoError(t, err)
		ids = append(ids, s)
		if i == 0 {
			require.NoError(t, e.Enqueue(s, "gate", wait))
		}
		for range ops {
			require.NoError(t, e.Enqueue(s, "count", func() error {
				time.Sleep(100 * time.Microsecond)
				count.Add(1)
				return nil
			}))
		}
	}
	require.NoError(t, e.Enqueue(ids[1], "fails", func() error { return boom }))
	time.AfterFunc(10*time.Millisecond, open)
	err := within(t, "close", e.Close)
	require.ErrorIs(t, err, boom, "Close returns the failure nobody reported")
	require.EqualValues(t, streams*ops, count.Load(), "Close returned before the queued work ran")
	for _, call := range []func() error{
		e.Close,
		func() error { _, err := e.CreateStream(0); return err },
		func() error { _, err := e.CreateEvent(0); return err },
		func() error { return e.Enqueue(ids[0], "late", func() error { return nil }) },
		func() error { return e.SyncStream(ids[0]) },
		func() error { return e.DestroyStream(ids[0]) },
		func() error { return e.EnablePeerAccess(0, 1) },
		func() error { _, err := e.StreamDevice(ids[0]); return err },
	} {
		err := call()
		require.Truef(t, errors.Is(err, driver.ErrClosed), "want ErrClosed, got %v", err)
	}
}

// TestWaitOnEventOfDestroyedStream checks that a wait completes when the
// stream the event was recorded on is destroyed once it has passed the
// event, and when the event itself is destroyed meanwhile.
func TestWaitOnEventOfDestroyedStream(t *testing.T) {
	e := newEngine(t, 2)
	a, err := e.CreateStream(0)
	require.NoError(t, err)
	b, err := e.CreateStream(1)
	require.NoError(t, err)
	ev, err := e.CreateEvent(0)
	require.NoError(t, err)
	wait, open := gate()
	defer open()
	require.NoError(t, e.Enqueue(a, "gate", wait))
	require.NoError(t, e.RecordEvent(ev, a))
	require.NoError(t, e.StreamWaitEvent(b, ev))
	var ran atomic.Bool
	require.NoError(t, e.Enqueue(b, "after wait", func() error { ran.Store(true); return nil }))
	destroyed := make(chan error, 1)
	go func() { destroyed <- e.DestroyStream(a) }()
	require.NoError(t, e.DestroyEvent(ev))
	time.Sleep(10 * time.Millisecond)
	require.False(t, ran.Load(), "b ran past its wait before a reached the event")
	select {
	case err := <-destroyed:
		t.Fatalf("DestroyStream returned (%v) before the stream's work ran", err)
	default:
	}
	open()
	err = <-destroyed
	require.NoError(t, err)
	require.NoError(t, within(t, "sync b", func() error { return e.SyncStream(b) }))
	require.True(t, ran.Load())
	require.NoError(t, check(e))
}

// TestSyncEventReturnsOnClose checks that a SyncEvent waiting on work that
// Close finishes returns.
func TestSyncEventReturnsOnClose(t *testing.T) {
	e := New("test", 1, func(_, _ driver.DeviceID) bool { return true })
	s, err := e.CreateStream(0)
	require.NoError(t, err)
	ev, err := e.CreateEvent(0)
	require.NoError(t, err)
	wait, open := gate()
	defer open()
	require.NoError(t, e.Enqueue(s, "gate", wait))
	require.NoError(t, e.RecordEvent(ev, s))
	synced := make(chan error, 1)
	go func() { synced <- e.SyncEvent(ev) }()
	time.AfterFunc(10*time.Millisecond, open)
	require.NoError(t, within(t, "close", e.Close))
	err = <-synced
	// It returns either way; a SyncEvent that only started once Close
	// had begun is refused, as every call after Close is.
	if err != nil {
		require.True(t, errors.Is(err, driver.ErrClosed), "%v", err)
	}
}

// goroutines waits for the goroutine count to fall to at most want and
// returns it: goroutines that are ending take their time on a loaded
// machine, and one that never ends (a leak) hangs the test until go
// test's -timeout, which lists every goroutine's stack.
func goroutines(want int) int {
	for {
		if n := runtime.NumGoroutine(); n <= want {
			return n
		}
		time.Sleep(time.Millisecond)
	}
}

// TestNoGoroutineLeak checks that DestroyStream and Close end the streams'
// goroutines.
func TestNoGoroutineLeak(t *testing.T) {
	before := goroutines(runtime.NumGoroutine())
	for round := range 3 {
		e := New("test", 2, func(_, _ driver.DeviceID) bool { return true })
		ev, err := e.CreateEvent(0)
		require.NoError(t, err)
		var ids []driver.Stream
		for i := range 32 {
			s, err := e.CreateStream(driver.DeviceID(i % 2))
			require.NoError(t, err)
			ids = append(ids, s)
			require.NoError(t, e.Enqueue(s, "work", func() error { return nil }))
			if i == 0 {
				require.NoError(t, e.RecordEvent(ev, s))
			} else {
				require.NoError(t, e.StreamWaitEvent(s, ev))
			}
		}
		// Half go with DestroyStream, the rest with Close.
		for _, s := range ids[:16] {
			require.NoError(t, within(t, "destroy", func() error { return e.DestroyStream(s) }))
		}
		require.LessOrEqual(t, goroutines(before+16), before+16, "round %d: DestroyStream left goroutines", round)
		require.NoError(t, within(t, "close", e.Close))
		require.LessOrEqual(t, goroutines(before), before, "round %d: Close left goroutines", round)
	}
}

// TestCreateStreamDuringClose checks a stream created while Close waits for
// the others: it must be refused with ErrClosed, or be stopped by Close like
// the rest. Close ranges over e.streams while syncLocked releases e.mu,
// so a CreateStream that did not see Close had begun would add a stream
// the range might not visit, whose goroutine would wait for ever; Close
// sets closing first.
func TestCreateStreamDuringClose(t *testing.T) {
	for round := range 50 {
		e := New("test", 1, func(_, _ driver.DeviceID) bool { return true })
		s, err := e.CreateStream(0)
		require.NoError(t, err)
		wait, open := gate()
		require.NoError(t, e.Enqueue(s, "gate", wait))
		closed := make(chan error, 1)
		go func() { closed <- e.Close() }()
		time.Sleep(2 * time.Millisecond) // Close is now waiting for s
		late, err := e.CreateStream(0)
		var st *stream
		if err == nil {
			e.mu.Lock()
			st = e.streams[late]
			e.mu.Unlock()
		} else {
			require.Truef(t, errors.Is(err, driver.ErrClosed), "round %d: want ErrClosed, got %v", round, err)
		}
		open()
		require.NoError(t, within(t, "close", func() error { return <-closed }))
		if st != nil {
			<-st.finished
		}
	}
}

// TestPanicAndGoexitAreFailures checks that an operation that panics, or
// calls runtime.Goexit, is reported as that operation's failure (marked
// ErrInvalid) at the next synchronize, that the stream goes on running
// later work with its books intact, and that no goroutine is left over:
// Goexit ends the goroutine that runs it, so the engine starts another
// for the stream, and Close ends that one.
func TestPanicAndGoexitAreFailures(t *testing.T) {
	before := goroutines(runtime.NumGoroutine())
	e := New("test", 1, func(_, _ driver.DeviceID) bool { return true })
	s, err := e.CreateStream(0)
	require.NoError(t, err)
	ev, err := e.CreateEvent(0)
	require.NoError(t, err)
	var ran []string
	run := func(name string) func() error { return func() error { ran = append(ran, name); return nil } }
	for round, bad := range []func() error{
		func() error { panic("kaboom") },
		func() error { runtime.Goexit(); return nil },
		func() error { panic("again") },
		func() error { runtime.Goexit(); return nil },
	} {
		ran = nil
		require.NoError(t, e.Enqueue(s, "before", run("before")))
		require.NoError(t, e.Enqueue(s, "bad", bad))
		require.NoError(t, e.Enqueue(s, "after", run("after")))
		require.NoError(t, e.RecordEvent(ev, s))
		err := within(t, "sync", func() error { return e.SyncStream(s) })
		require.Truef(t, errors.Is(err, driver.ErrInvalid), "round %d: %v", round, err)
		require.Contains(t, err.Error(), fmt.Sprintf("operation %d (bad) failed", 4*round+2))
		require.Contains(t, err.Error(), "1 later operation(s) skipped")
		require.Equal(t, []string{"before"}, ran, "round %d", round)
		done, err := e.QueryEvent(ev)
		require.NoError(t, err)
		require.True(t, done, "round %d: the record after the failure ran", round)
		require.NoError(t, check(e))
	}
	ran = nil
	require.NoError(t, e.Enqueue(s, "last", run("last")))
	require.NoError(t, within(t, "sync", func() error { return e.SyncStream(s) }))
	require.Equal(t, []string{"last"}, ran)
	require.NoError(t, check(e))
	require.LessOrEqual(t, goroutines(before+1), before+1, "one goroutine for the one stream")
	require.NoError(t, within(t, "close", e.Close))
	require.LessOrEqual(t, goroutines(before), before, "Close left goroutines")
}

// TestGoid: every goroutine has its own id, the same on every call.
func TestGoid(t *testing.T) {
	const n = 16
	ids := make([]uint64, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			ids[i] = goid()
			if goid() != ids[i] {
				ids[i] = 0
			}
		})
	}
	wg.Wait()
	seen := map[uint64]bool{goid(): true}
	for i, id := range ids {
		require.NotZero(t, id, "goroutine %d: no id, or one that changed", i)
		require.False(t, seen[id], "goroutine %d: id %d taken twice", i, id)
		seen[id] = true
	}
}

// TestDestroyFromHostFuncDoesNotDrainIntoItself: a host function on a
// destroys b, which has nothing it waits for; but while it waits, b is
// made to wait for an event recorded on a behind that host function.
// DestroyStream returns once b has finished what it had when called,
// without waiting for b's goroutine to run the rest (it would wait for
// its own caller); b still drains afterwards, and every goroutine ends.
func TestDestroyFromHostFuncDoesNotDrainIntoItself(t *testing.T) {
	before := goroutines(runtime.NumGoroutine())
	e := New("test", 1, func(_, _ driver.DeviceID) bool { return true })
	a, err := e.CreateStream(0)
	require.NoError(t, err)
	b, err := e.CreateStream(0)
	require.NoError(t, err)
	ev, err := e.CreateEvent(0)
	require.NoError(t, err)
	wait, open := gate()
	defer open()
	require.NoError(t, e.Enqueue(b, "gate", wait))
	destroyed := make(chan error, 1)
	require.NoError(t, e.Enqueue(a, "destroys b", func() error { destroyed <- e.DestroyStream(b); return nil }))
	require.NoError(t, e.RecordEvent(ev, a)) // behind the host function
	// Once the host function waits for b, b gets a wait for that record.
	until(func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.streams[a].blocked != nil
	})
	require.NoError(t, e.StreamWaitEvent(b, ev))
	var ran atomic.Bool
	require.NoError(t, e.Enqueue(b, "after wait", func() error { ran.Store(true); return nil }))
	open()
	require.NoError(t, within(t, "the host function's destroy", func() error { return <-destroyed }))
	require.NoError(t, within(t, "sync a", func() error { return e.SyncStream(a) }))
	until(ran.Load) // b drains after it is destroyed
	require.NoError(t, check(e))
	require.NoError(t, within(t, "close", e.Close))
	require.LessOrEqual(t, goroutines(before), before, "goroutines left")
	require.Empty(t, e.workers)
}
