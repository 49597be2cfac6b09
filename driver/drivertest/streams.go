package drivertest

import (
	"bytes"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// Streams checks the asynchronous part of the contract (driver.Streams) on
// drivers with FeatureStreams: handles, ordering, events, the reporting of
// failed (and panicking) work, the calls host functions make to their own
// driver, copies and fills, peer access, pinned host buffers, and all of it
// from several goroutines at once.
//
// Nothing here may hang: every wait for something that must happen is
// bounded by patience; every gate a host function blocks on opens when the
// test ends, before the driver closes, so a broken driver fails the test
// and still lets Close finish; and should Close hang all the same, a
// watchdog ends the run.

const (
	// patience bounds every wait for something that must happen.
	patience = 5 * time.Second
	// gateLimit is how long a host function waits for its gate before it
	// gives up and fails: a backstop only, since gates open when the test
	// ends.
	gateLimit = 4 * patience
	// settle is how long the suite watches for something that must not
	// have happened yet, and how long its slow host functions sleep.
	settle = 20 * time.Millisecond
)

// streamFixture is a fixture whose driver implements driver.Streams.
type streamFixture struct {
	*fixture
	s driver.Streams
	// watchdog, once a wait has timed out, ends the test binary if the
	// driver's Close (run by newDriver's cleanup) hangs on the same wedged
	// work: a broken driver must fail the run, not hang it.
	watchdog atomic.Pointer[time.Timer]
}

// wedged arms the watchdog: unless the test's cleanups, Close included,
// finish within patience, the binary panics naming what hung.
func (f *streamFixture) wedged(what string) {
	f.watchdog.CompareAndSwap(nil, time.AfterFunc(patience, func() {
		panic(fmt.Sprintf("drivertest: %s: %s did not return, and the cleanups (Close of %s) have not finished within %s",
			f.t.Name(), what, f.d.Name(), patience))
	}))
}

// streams runs the Streams rules.
func (s suite) streams(t *testing.T) {
	t.Run("Handles", s.streamHandles)
	t.Run("Ordering", s.streamOrdering)
	t.Run("Events", s.events)
	t.Run("Failures", s.streamFailures)
	t.Run("HostFuncCalls", s.hostFuncCalls)
	t.Run("Peers", s.peers)
	t.Run("Copies", s.copies)
	t.Run("HostAlloc", s.hostAlloc)
	t.Run("Concurrency", s.streamConcurrency)
}

// runStreams runs fn as a subtest on drivers with FeatureStreams.
func (s suite) runStreams(t *testing.T, name string, fn func(f *streamFixture)) {
	t.Helper()
	t.Run(name, func(t *testing.T) {
		sf := &streamFixture{}
		// Registered before newDriver's cleanup, so it runs after Close.
		t.Cleanup(func() {
			if w := sf.watchdog.Load(); w != nil {
				w.Stop()
			}
		})
		f := s.start(t)
		if !f.d.Supports(driver.FeatureStreams) {
			f.t.Skipf("%s lacks %s", f.d.Name(), driver.FeatureStreams)
		}
		sd, ok := f.d.(driver.Streams)
		require.Truef(f.t, ok, "%s supports %s but does not implement driver.Streams", f.d.Name(), driver.FeatureStreams)
		sf.fixture, sf.s = f, sd
		fn(sf)
	})
}

// runCopies runs fn as a subtest on drivers with FeatureStreams and
// FeatureHostAccess: those whose copies move bytes.
func (s suite) runCopies(t *testing.T, name string, fn func(f *streamFixture)) {
	t.Helper()
	s.runStreams(t, name, func(f *streamFixture) {
		if !f.hostAccess() {
			f.t.Skipf("%s lacks %s (checked by Copies/Unsupported)", f.d.Name(), driver.FeatureHostAccess)
		}
		fn(f)
	})
}

// stream creates a stream on dev.
func (f *streamFixture) stream(dev driver.DeviceID) driver.Stream {
	f.t.Helper()
	f.has(dev)
	st, err := f.s.CreateStream(dev)
	require.NoError(f.t, err, "create a stream on device %d", dev)
	require.NotZero(f.t, st, "create stream returned the zero stream")
	return st
}

// event creates an event on dev.
func (f *streamFixture) event(dev driver.DeviceID) driver.Event {
	f.t.Helper()
	f.has(dev)
	ev, err := f.s.CreateEvent(dev)
	require.NoError(f.t, err, "create an event on device %d", dev)
	require.NotZero(f.t, ev, "create event returned the zero event")
	return ev
}

// launch enqueues fn on st.
func (f *streamFixture) launch(st driver.Stream, name string, fn func() error) {
	f.t.Helper()
	require.NoError(f.t, f.s.LaunchHostFunc(st, name, fn), "launch %q on stream %d", name, st)
}

// record records ev on st.
func (f *streamFixture) record(ev driver.Event, st driver.Stream) {
	f.t.Helper()
	require.NoError(f.t, f.s.RecordEvent(ev, st), "record event %d on stream %d", ev, st)
}

// waitFor makes st wait for ev.
func (f *streamFixture) waitFor(st driver.Stream, ev driver.Event) {
	f.t.Helper()
	require.NoError(f.t, f.s.StreamWaitEvent(st, ev), "stream %d waits for event %d", st, ev)
}

// within returns what call returns, failing the test if it has not
// returned within patience.
func (f *streamFixture) within(what string, call func() error) error {
	f.t.Helper()
	done := make(chan error, 1)
	go func() { done <- call() }()
	select {
	case err := <-done:
		return err
	case <-time.After(patience):
		f.wedged(what)
		f.t.Fatalf("%s did not return within %s", what, patience)
		return nil
	}
}

// syncErr synchronizes st and returns its error.
func (f *streamFixture) syncErr(st driver.Stream) error {
	f.t.Helper()
	return f.within(fmt.Sprintf("synchronize stream %d", st), func() error { return f.s.SyncStream(st) })
}

// sync synchronizes st, which must have no failure to report.
func (f *streamFixture) sync(st driver.Stream) {
	f.t.Helper()
	require.NoError(f.t, f.syncErr(st), "synchronize stream %d", st)
}

// syncEvent waits for ev.
func (f *streamFixture) syncEvent(ev driver.Event) {
	f.t.Helper()
	require.NoError(f.t, f.within(fmt.Sprintf("synchronize event %d", ev), func() error { return f.s.SyncEvent(ev) }))
}

// destroy destroys st, which must have no failure to report.
func (f *streamFixture) destroy(st driver.Stream) {
	f.t.Helper()
	require.NoError(f.t, f.within(fmt.Sprintf("destroy stream %d", st), func() error { return f.s.DestroyStream(st) }))
}

// eventDone reports whether ev has completed.
func (f *streamFixture) eventDone(ev driver.Event) bool {
	f.t.Helper()
	done, err := f.s.QueryEvent(ev)
	require.NoError(f.t, err, "query event %d", ev)
	return done
}

// streamDone reports whether st has finished its work; st must have no
// failure to report.
func (f *streamFixture) streamDone(st driver.Stream) bool {
	f.t.Helper()
	done, err := f.s.QueryStream(st)
	require.NoError(f.t, err, "query stream %d", st)
	return done
}

// eventually fails the test unless cond becomes true within patience.
func (f *streamFixture) eventually(what string, cond func() bool) {
	f.t.Helper()
	deadline := time.Now().Add(patience)
	for !cond() {
		if time.Now().After(deadline) {
			f.wedged(what)
			f.t.Fatalf("%s did not happen within %s", what, patience)
		}
		time.Sleep(time.Millisecond)
	}
}

// gate holds back a stream: a host function made by wait blocks until the
// gate opens. It opens when the test ends, before the driver closes.
type gate struct {
	ch   chan struct{}
	once sync.Once
}

func (f *streamFixture) gate() *gate {
	g := &gate{ch: make(chan struct{})}
	f.t.Cleanup(g.open)
	return g
}

func (g *gate) open() { g.once.Do(func() { close(g.ch) }) }

// wait is a host function that returns once the gate opens, or fails after
// gateLimit.
func (g *gate) wait() error {
	select {
	case <-g.ch:
		return nil
	case <-time.After(gateLimit):
		return errors.Newf("drivertest: the gate did not open within %s", gateLimit)
	}
}

// mark is a host function that records that it ran.
func mark(ran *atomic.Bool) func() error {
	return func() error { ran.Store(true); return nil }
}

// errBoom is what failing host functions return.
var errBoom = errors.New("drivertest: boom")

func boom() error { return errBoom }

// copyAlign is the largest alignment any device needs for async copies.
func (f *fixture) copyAlign() uint64 {
	a := uint64(1)
	for _, d := range f.devs {
		a = max(a, d.CopyAlign)
	}
	return a
}

// hostBuf returns n bytes of pinned host memory from HostAlloc, returned
// when the test ends.
func (f *streamFixture) hostBuf(n int) []byte {
	f.t.Helper()
	b, err := f.s.HostAlloc(uint64(n))
	require.NoError(f.t, err, "host alloc of %d bytes", n)
	require.Len(f.t, b, n)
	// A driver closed by the test has freed it already: ignore the answer.
	f.t.Cleanup(func() { _ = f.s.HostFree(b) })
	return b
}

// alignedGo returns n bytes of Go memory starting at a multiple of align.
func alignedGo(n int, align uint64) []byte {
	raw := make([]byte, n+int(align))
	off := (align - uint64(uintptr(unsafe.Pointer(&raw[0])))%align) % align
	return raw[off : off+uint64(n) : off+uint64(n)]
}

// region reserves one driver granule, maps a chunk of dev there and grants
// dev access a over it.
func (f *streamFixture) region(dev driver.DeviceID, a driver.Access) driver.Addr {
	f.t.Helper()
	f.has(dev)
	base := f.reserve(f.gran)
	f.mapNew(base, dev, f.gran)
	if a != driver.AccessNone {
		f.setAccess(base, f.gran, dev, a)
	}
	return base
}

// streamHandles checks creating and destroying streams and events, and the
// refusal of unknown, destroyed and closed ones.
func (s suite) streamHandles(t *testing.T) {
	s.runStreams(t, "CopyAlignPowerOfTwo", func(f *streamFixture) {
		for _, d := range f.devs {
			a := d.CopyAlign
			require.Truef(f.t, a != 0 && a&(a-1) == 0, "device %d: CopyAlign %d is not a power of two", d.ID, a)
		}
	})
	s.runStreams(t, "EachDevice", func(f *streamFixture) {
		streams := map[driver.Stream]bool{}
		events := map[driver.Event]bool{}
		for i := range f.devs {
			dev := driver.DeviceID(i)
			st, ev := f.stream(dev), f.event(dev)
			require.False(f.t, streams[st], "stream %d handed out twice", st)
			require.False(f.t, events[ev], "event %d handed out twice", ev)
			streams[st], events[ev] = true, true
			var ran atomic.Bool
			f.launch(st, "mark", mark(&ran))
			f.record(ev, st)
			f.sync(st)
			require.True(f.t, ran.Load(), "the host function on device %d ran by the time its stream synchronized", dev)
			require.True(f.t, f.eventDone(ev))
			require.NoError(f.t, f.s.DestroyEvent(ev))
		}
		for st := range streams {
			f.destroy(st)
		}
	})
	s.runStreams(t, "UnknownDevice", func(f *streamFixture) {
		for _, dev := range []driver.DeviceID{-1, driver.DeviceID(len(f.devs)), driver.MaxDevices} {
			_, err := f.s.CreateStream(dev)
			f.requireIs(err, driver.ErrNoDevice)
			_, err = f.s.CreateEvent(dev)
			f.requireIs(err, driver.ErrNoDevice)
			_, err = f.s.CanAccessPeer(0, dev)
			f.requireIs(err, driver.ErrNoDevice)
			_, err = f.s.CanAccessPeer(dev, 0)
			f.requireIs(err, driver.ErrNoDevice)
			f.requireIs(f.s.EnablePeerAccess(0, dev), driver.ErrNoDevice)
			f.requireIs(f.s.EnablePeerAccess(dev, 0), driver.ErrNoDevice)
		}
		// Nothing was made or broken: the known devices still work.
		st := f.stream(driver.DeviceID(len(f.devs) - 1))
		f.sync(st)
	})
	s.runStreams(t, "BadStream", func(f *streamFixture) {
		live, ev := f.stream(0), f.event(0)
		dead := f.stream(0)
		f.destroy(dead)
		var base driver.Addr
		var buf []byte
		before := pattern(probe, 1)
		if f.hostAccess() {
			base = f.region(0, driver.AccessReadWrite)
			f.write(base, before)
			buf = f.hostBuf(probe)
			copy(buf, pattern(probe, 2))
		}
		for _, st := range []driver.Stream{0, dead, ^driver.Stream(0)} {
			var ran atomic.Bool
			f.requireIs(f.s.LaunchHostFunc(st, "never", mark(&ran)), driver.ErrBadHandle)
			f.requireIs(f.s.SyncStream(st), driver.ErrBadHandle)
			_, err := f.s.QueryStream(st)
			f.requireIs(err, driver.ErrBadHandle)
			f.requireIs(f.s.DestroyStream(st), driver.ErrBadHandle)
			f.requireIs(f.s.RecordEvent(ev, st), driver.ErrBadHandle)
			f.requireIs(f.s.StreamWaitEvent(st, ev), driver.ErrBadHandle)
			if f.hostAccess() {
				f.requireIs(f.s.CopyHtoD(base, buf, st), driver.ErrBadHandle)
				f.requireIs(f.s.CopyDtoH(buf, base, st), driver.ErrBadHandle)
				f.requireIs(f.s.CopyDtoD(base, at(base, probe), probe, st), driver.ErrBadHandle)
				f.requireIs(f.s.Memset(base, 0xff, probe, st), driver.ErrBadHandle)
			}
			time.Sleep(settle / 4)
			require.False(f.t, ran.Load(), "a host function refused on stream %d ran", st)
		}
		// The refused record left the event never recorded, and the live
		// stream has nothing queued.
		require.True(f.t, f.eventDone(ev))
		_, err := f.s.ElapsedTime(ev, ev)
		f.requireIs(err, driver.ErrInvalid)
		require.True(f.t, f.streamDone(live))
		if f.hostAccess() {
			f.requireBytes(base, before)
			require.Equal(f.t, pattern(probe, 2), buf, "a refused copy to the host changed the buffer")
		}
		f.sync(live)
	})
	s.runStreams(t, "BadEvent", func(f *streamFixture) {
		st, good := f.stream(0), f.event(0)
		f.record(good, st)
		f.sync(st)
		dead := f.event(0)
		require.NoError(f.t, f.s.DestroyEvent(dead))
		for _, ev := range []driver.Event{0, dead, ^driver.Event(0)} {
			f.requireIs(f.s.DestroyEvent(ev), driver.ErrBadHandle)
			f.requireIs(f.s.RecordEvent(ev, st), driver.ErrBadHandle)
			f.requireIs(f.s.StreamWaitEvent(st, ev), driver.ErrBadHandle)
			f.requireIs(f.s.SyncEvent(ev), driver.ErrBadHandle)
			_, err := f.s.QueryEvent(ev)
			f.requireIs(err, driver.ErrBadHandle)
			_, err = f.s.ElapsedTime(ev, good)
			f.requireIs(err, driver.ErrBadHandle)
			_, err = f.s.ElapsedTime(good, ev)
			f.requireIs(err, driver.ErrBadHandle)
		}
		require.True(f.t, f.streamDone(st), "a refused record or wait was enqueued")
		f.sync(st)
	})
	s.runStreams(t, "NilHostFunc", func(f *streamFixture) {
		st := f.stream(0)
		f.requireIs(f.s.LaunchHostFunc(st, "nil", nil), driver.ErrInvalid)
		f.sync(st)
	})
	s.runStreams(t, "DestroyWaitsForWork", func(f *streamFixture) {
		st := f.stream(0)
		var ran atomic.Bool
		f.launch(st, "slow", func() error { time.Sleep(settle); ran.Store(true); return nil })
		f.destroy(st)
		require.True(f.t, ran.Load(), "DestroyStream returned before the stream's work ran")
		f.requireIs(f.s.SyncStream(st), driver.ErrBadHandle)
	})
	s.runStreams(t, "AfterClose", func(f *streamFixture) {
		st, ev := f.stream(0), f.event(0)
		f.record(ev, st)
		var ran atomic.Bool
		f.launch(st, "slow", func() error { time.Sleep(settle); ran.Store(true); return nil })
		require.NoError(f.t, f.within("close", f.d.Close))
		require.True(f.t, ran.Load(), "Close returned before the stream's work ran")
		base := driver.Addr(f.gran) // no driver call reaches the address
		buf := alignedGo(probe, f.copyAlign())
		calls := []struct {
			name string
			call func() error
		}{
			{"CreateStream", func() error { _, err := f.s.CreateStream(0); return err }},
			{"DestroyStream", func() error { return f.s.DestroyStream(st) }},
			{"CreateEvent", func() error { _, err := f.s.CreateEvent(0); return err }},
			{"DestroyEvent", func() error { return f.s.DestroyEvent(ev) }},
			{"RecordEvent", func() error { return f.s.RecordEvent(ev, st) }},
			{"StreamWaitEvent", func() error { return f.s.StreamWaitEvent(st, ev) }},
			{"SyncStream", func() error { return f.s.SyncStream(st) }},
			{"QueryStream", func() error { _, err := f.s.QueryStream(st); return err }},
			{"SyncEvent", func() error { return f.s.SyncEvent(ev) }},
			{"QueryEvent", func() error { _, err := f.s.QueryEvent(ev); return err }},
			{"ElapsedTime", func() error { _, err := f.s.ElapsedTime(ev, ev); return err }},
			{"LaunchHostFunc", func() error { return f.s.LaunchHostFunc(st, "never", mark(&ran)) }},
		}
		if f.hostAccess() {
			calls = append(calls, []struct {
				name string
				call func() error
			}{
				{"CopyHtoD", func() error { return f.s.CopyHtoD(base, buf, st) }},
				{"CopyDtoH", func() error { return f.s.CopyDtoH(buf, base, st) }},
				{"CopyDtoD", func() error { return f.s.CopyDtoD(base, base, probe, st) }},
				{"Memset", func() error { return f.s.Memset(base, 1, probe, st) }},
			}...)
		}
		for _, c := range calls {
			f.t.Run(c.name, func(t *testing.T) { RequireIs(t, c.call(), driver.ErrClosed) })
		}
	})
	s.runStreams(t, "AfterCloseNoStream", func(f *streamFixture) {
		// Close refuses while a host buffer is live (its bytes would fault
		// at the next touch), changing nothing; the calls that name no
		// stream or event are closed after it too.
		b, err := f.s.HostAlloc(probe)
		require.NoError(f.t, err)
		f.requireIs(f.within("close", f.d.Close), driver.ErrBusy)
		b[0], b[len(b)-1] = 1, 2 // still ours
		require.NoError(f.t, f.s.HostFree(b))
		require.NoError(f.t, f.within("close", f.d.Close))
		calls := []struct {
			name string
			call func() error
		}{
			{"CanAccessPeer", func() error { _, err := f.s.CanAccessPeer(0, 1); return err }},
			{"EnablePeerAccess", func() error { return f.s.EnablePeerAccess(0, 1) }},
			{"HostAlloc", func() error { _, err := f.s.HostAlloc(probe); return err }},
			{"HostFree", func() error { return f.s.HostFree(b) }},
		}
		for _, c := range calls {
			f.t.Run(c.name, func(t *testing.T) { RequireIs(t, c.call(), driver.ErrClosed) })
		}
	})
}

// streamOrdering checks that one stream runs its work in order and that
// different streams do not wait for each other.
func (s suite) streamOrdering(t *testing.T) {
	s.runStreams(t, "InOrder", func(f *streamFixture) {
		const n = 100
		for i := range f.devs {
			st := f.stream(driver.DeviceID(i))
			var seq []int // appended to by the stream's work alone
			for k := range n {
				f.launch(st, fmt.Sprintf("step %d", k), func() error { seq = append(seq, k); return nil })
			}
			f.sync(st)
			want := make([]int, n)
			for k := range want {
				want[k] = k
			}
			require.Equal(f.t, want, seq, "host functions on a stream of device %d ran out of order", i)
		}
	})
	s.runStreams(t, "StreamsRunConcurrently", func(f *streamFixture) {
		for _, devB := range []driver.DeviceID{0, 1} {
			a, b := f.stream(0), f.stream(devB)
			released := make(chan struct{})
			f.launch(a, "wait for b", func() error {
				select {
				case <-released:
					return nil
				case <-time.After(patience):
					return errors.Newf("drivertest: stream b's host function did not run while stream a was blocked")
				}
			})
			f.launch(b, "release a", func() error { close(released); return nil })
			f.sync(b)
			f.sync(a)
		}
	})
}

// events checks recording, querying, waiting on and timing events.
func (s suite) events(t *testing.T) {
	s.runStreams(t, "NeverRecordedIsComplete", func(f *streamFixture) {
		ev := f.event(0)
		require.True(f.t, f.eventDone(ev))
		f.syncEvent(ev)
		// A wait on it holds nothing back.
		st := f.stream(1)
		f.waitFor(st, ev)
		var ran atomic.Bool
		f.launch(st, "after wait", mark(&ran))
		f.sync(st)
		require.True(f.t, ran.Load())
	})
	s.runStreams(t, "QueryBeforeAndAfter", func(f *streamFixture) {
		st, ev, g := f.stream(0), f.event(0), f.gate()
		f.launch(st, "blocked", g.wait)
		f.record(ev, st)
		require.False(f.t, f.eventDone(ev), "the event completed before the work before it ran")
		require.False(f.t, f.streamDone(st), "the stream finished while its work was blocked")
		g.open()
		f.syncEvent(ev)
		require.True(f.t, f.eventDone(ev))
		f.sync(st)
		require.True(f.t, f.streamDone(st))
	})
	s.runStreams(t, "SyncEventWaits", func(f *streamFixture) {
		st, ev := f.stream(0), f.event(0)
		var ran atomic.Bool
		f.launch(st, "slow", func() error { time.Sleep(settle); ran.Store(true); return nil })
		f.record(ev, st)
		f.syncEvent(ev)
		require.True(f.t, ran.Load(), "SyncEvent returned before the work before the event ran")
		f.sync(st)
	})
	s.runStreams(t, "ReRecordMoves", func(f *streamFixture) {
		st, ev, g := f.stream(0), f.event(0), f.gate()
		f.record(ev, st)
		f.syncEvent(ev)
		require.True(f.t, f.eventDone(ev))
		f.launch(st, "blocked", g.wait)
		f.record(ev, st)
		require.False(f.t, f.eventDone(ev), "the event still answers for its first recording")
		_, err := f.s.ElapsedTime(ev, ev)
		f.requireIs(err, driver.ErrBusy)
		g.open()
		f.syncEvent(ev)
		require.True(f.t, f.eventDone(ev))
		f.sync(st)
	})
	s.runStreams(t, "AnswersForLastRecord", func(f *streamFixture) {
		// Recorded on a, then on b: the first recording completing does
		// not complete the event.
		a, b, ev := f.stream(0), f.stream(0), f.event(0)
		ga, gb := f.gate(), f.gate()
		f.launch(a, "blocked", ga.wait)
		f.record(ev, a)
		f.launch(b, "blocked", gb.wait)
		f.record(ev, b)
		ga.open()
		f.sync(a)
		require.False(f.t, f.eventDone(ev), "the event completed with its earlier recording")
		_, err := f.s.ElapsedTime(ev, ev)
		f.requireIs(err, driver.ErrBusy)
		gb.open()
		f.syncEvent(ev)
		require.True(f.t, f.eventDone(ev))
		f.sync(b)
	})
	s.runStreams(t, "WaitUsesRecordAtCallTime", func(f *streamFixture) {
		// b waits for ev as it was when StreamWaitEvent was called: its
		// first, completed recording, not the one a makes later.
		a, b, ev := f.stream(0), f.stream(0), f.event(0)
		ga, gb := f.gate(), f.gate()
		f.record(ev, a)
		f.syncEvent(ev)
		f.launch(b, "blocked", gb.wait)
		f.waitFor(b, ev)
		var ran atomic.Bool
		f.launch(b, "after wait", mark(&ran))
		f.launch(a, "blocked", ga.wait)
		f.record(ev, a)
		gb.open()
		f.sync(b)
		require.True(f.t, ran.Load())
		require.False(f.t, f.eventDone(ev))
		ga.open()
		f.sync(a)
	})
	s.runStreams(t, "StreamWaitEvent", func(f *streamFixture) {
		for _, devB := range []driver.DeviceID{0, 1} {
			a, b, ev, g := f.stream(0), f.stream(devB), f.event(0), f.gate()
			f.launch(a, "blocked", g.wait)
			f.record(ev, a)
			var before, after atomic.Bool
			f.launch(b, "before wait", mark(&before))
			f.waitFor(b, ev)
			f.launch(b, "after wait", mark(&after))
			// Work enqueued before the wait is not held back.
			f.eventually("b's work before its wait", before.Load)
			time.Sleep(settle)
			require.False(f.t, after.Load(), "b ran past its wait before a reached the event (b on device %d)", devB)
			require.False(f.t, f.streamDone(b))
			g.open()
			f.sync(b)
			require.True(f.t, after.Load())
			f.sync(a)
		}
	})
	s.runStreams(t, "DestroyWhileWaitedOn", func(f *streamFixture) {
		a, b, ev, g := f.stream(0), f.stream(1), f.event(0), f.gate()
		f.launch(a, "blocked", g.wait)
		f.record(ev, a)
		f.waitFor(b, ev)
		var ran atomic.Bool
		f.launch(b, "after wait", mark(&ran))
		require.NoError(f.t, f.s.DestroyEvent(ev))
		time.Sleep(settle)
		require.False(f.t, ran.Load(), "destroying the event released the wait before a reached it")
		g.open()
		f.sync(b)
		require.True(f.t, ran.Load())
		f.sync(a)
	})
	s.runStreams(t, "ElapsedTime", func(f *streamFixture) {
		st, start, end := f.stream(0), f.event(0), f.event(0)
		f.record(start, st)
		f.launch(st, "sleep", func() error { time.Sleep(settle); return nil })
		f.record(end, st)
		f.syncEvent(end)
		d, err := f.s.ElapsedTime(start, end)
		require.NoError(f.t, err)
		require.GreaterOrEqual(f.t, d, settle, "elapsed time across a sleep of %s", settle)
		never := f.event(0)
		_, err = f.s.ElapsedTime(never, end)
		f.requireIs(err, driver.ErrInvalid)
		_, err = f.s.ElapsedTime(start, never)
		f.requireIs(err, driver.ErrInvalid)
		// end re-recorded behind blocked work is incomplete.
		g := f.gate()
		f.launch(st, "blocked", g.wait)
		f.record(end, st)
		_, err = f.s.ElapsedTime(start, end)
		f.requireIs(err, driver.ErrBusy)
		g.open()
		f.syncEvent(end)
		d, err = f.s.ElapsedTime(start, end)
		require.NoError(f.t, err)
		require.GreaterOrEqual(f.t, d, settle)
		f.sync(st)
	})
	s.runStreams(t, "RecordOnOtherDevice", func(f *streamFixture) {
		st, ev := f.stream(0), f.event(1)
		f.requireIs(f.s.RecordEvent(ev, st), driver.ErrInvalid, "device")
		// Nothing was recorded or enqueued.
		require.True(f.t, f.eventDone(ev))
		_, err := f.s.ElapsedTime(ev, ev)
		f.requireIs(err, driver.ErrInvalid)
		require.True(f.t, f.streamDone(st))
		// A stream of the event's own device records it.
		own := f.stream(1)
		f.record(ev, own)
		f.syncEvent(ev)
		_, err = f.s.ElapsedTime(ev, ev)
		require.NoError(f.t, err)
	})
}

// streamFailures checks how a failure of enqueued work is reported: once,
// at the next synchronize or query of its stream, naming the operation,
// with the work after it skipped.
func (s suite) streamFailures(t *testing.T) {
	s.runStreams(t, "HostFuncFails", func(f *streamFixture) {
		st, ev := f.stream(0), f.event(0)
		var first, later, afterRecord atomic.Bool
		f.launch(st, "first", mark(&first))
		f.launch(st, "boom", boom)
		f.launch(st, "later", mark(&later))
		f.record(ev, st)
		f.launch(st, "after record", mark(&afterRecord))
		err := f.syncErr(st)
		require.Error(f.t, err, "a failed host function must be reported")
		require.Truef(f.t, errors.Is(err, errBoom), "the error wraps the host function's: %v", err)
		require.Contains(f.t, err.Error(), "operation 2 (boom) failed")
		require.Contains(f.t, err.Error(), "2 later operation")
		require.Contains(f.t, err.Error(), "skipped")
		require.True(f.t, first.Load())
		require.False(f.t, later.Load(), "work after a failure ran")
		require.False(f.t, afterRecord.Load(), "work after a failure ran")
		// The record still ran: an event is never left incomplete.
		require.True(f.t, f.eventDone(ev))
		// Reported once; then the stream works again.
		f.sync(st)
		var again atomic.Bool
		f.launch(st, "again", mark(&again))
		f.sync(st)
		require.True(f.t, again.Load())
		f.destroy(st)
	})
	s.runStreams(t, "HostFuncPanics", func(f *streamFixture) {
		// A panic in a host function is that operation's failure, marked
		// ErrInvalid (the function handed in was not one a stream can run:
		// it must return its failure), reported like any other; the stream,
		// its events and its goroutine go on working. Several kinds of
		// panic value, one after another on the same stream.
		st, ev := f.stream(0), f.event(0)
		var nilMap map[int]int
		for i, c := range []struct {
			name string
			fn   func() error
			says string
		}{
			{"string", func() error { panic("kaboom") }, "panic: kaboom"},
			{"error", func() error { panic(errBoom) }, "panic: " + errBoom.Error()},
			{"runtime error", func() error { nilMap[1] = 1; return nil }, "panic: assignment to entry in nil map"},
			{"nil", func() error { panic(nil) }, "panic: panic called with nil argument"},
		} {
			var first, later, afterRecord atomic.Bool
			f.launch(st, "first", mark(&first))
			f.launch(st, "panicker", c.fn)
			f.launch(st, "later", mark(&later))
			f.record(ev, st)
			f.launch(st, "after record", mark(&afterRecord))
			n := 5*i + 2 // the panicking operation's number in the stream
			f.requireIs(f.syncErr(st), driver.ErrInvalid,
				fmt.Sprintf("operation %d (panicker) failed: %s", n, c.says), "2 later operation(s) skipped")
			require.True(f.t, first.Load(), "%s: work before the panic ran", c.name)
			require.False(f.t, later.Load(), "%s: work after the failure ran", c.name)
			require.False(f.t, afterRecord.Load(), "%s: work after the failure ran", c.name)
			require.True(f.t, f.eventDone(ev), "%s: the record after the panic completed", c.name)
		}
		// Reported once; the stream runs later work, and events recorded
		// after the panics complete.
		f.sync(st)
		var again atomic.Bool
		f.launch(st, "again", mark(&again))
		f.record(ev, st)
		f.syncEvent(ev)
		require.True(f.t, again.Load(), "work after the reported panics ran")
		f.sync(st)
		// The engine's lock is free: other streams and the driver answer.
		other := f.stream(1)
		f.launch(other, "mark", mark(&again))
		f.sync(other)
		f.destroy(st)
		f.destroy(other)
	})
	s.runStreams(t, "HostFuncGoexit", func(f *streamFixture) {
		// runtime.Goexit in a host function (t.FailNow, t.Fatal and
		// t.SkipNow call it) ends the goroutine that runs it whatever the
		// driver does: the operation fails, and the stream goes on.
		st, ev := f.stream(0), f.event(0)
		var later, afterRecord atomic.Bool
		f.launch(st, "exits", func() error { runtime.Goexit(); return nil })
		f.launch(st, "later", mark(&later))
		f.record(ev, st)
		f.launch(st, "after record", mark(&afterRecord))
		f.requireIs(f.syncErr(st), driver.ErrInvalid, "operation 1 (exits) failed", "runtime.Goexit", "2 later operation(s) skipped")
		require.False(f.t, later.Load(), "work after the failure ran")
		require.True(f.t, f.eventDone(ev), "the record after the failure completed")
		var again atomic.Bool
		f.launch(st, "again", mark(&again))
		f.record(ev, st)
		f.syncEvent(ev)
		f.sync(st)
		require.True(f.t, again.Load(), "work after the reported failure ran")
		f.destroy(st)
	})
	s.runStreams(t, "HostFuncFaults", func(f *streamFixture) {
		// A host function that touches device memory the host may no
		// longer touch (a slice kept past a change of access, or past an
		// unmap) faults; the fault is its operation's failure, marked
		// ErrAccessDenied as a faulting copy's is, and the process and the
		// stream live on.
		hm, ok := f.d.(driver.HostMapper)
		if !ok {
			f.t.Skipf("%s does not map device memory into the process (driver.HostMapper)", f.d.Name())
		}
		base := f.region(0, driver.AccessReadWrite)
		b, err := hm.HostBytes(base, probe)
		require.NoError(f.t, err)
		f.setAccess(base, f.gran, 0, driver.AccessNone)
		st := f.stream(0)
		var later atomic.Bool
		f.launch(st, "touches", func() error { b[0] = 1; return nil })
		f.launch(st, "later", mark(&later))
		f.requireIs(f.syncErr(st), driver.ErrAccessDenied, "operation 1 (touches) failed", "memory fault at")
		require.False(f.t, later.Load())
		var again atomic.Bool
		f.launch(st, "again", mark(&again))
		f.sync(st)
		require.True(f.t, again.Load(), "the stream runs work after the fault")
		f.setAccess(base, f.gran, 0, driver.AccessReadWrite)
		f.requireBytes(base, make([]byte, probe))
	})
	s.runStreams(t, "OtherStreamsUnaffected", func(f *streamFixture) {
		a, b := f.stream(0), f.stream(0)
		f.launch(a, "boom", boom)
		var ran atomic.Bool
		f.launch(b, "mark", mark(&ran))
		f.sync(b)
		require.True(f.t, ran.Load())
		require.ErrorIs(f.t, f.syncErr(a), errBoom)
	})
	s.runStreams(t, "QueryStreamReports", func(f *streamFixture) {
		st := f.stream(0)
		f.launch(st, "boom", boom)
		var err error
		f.eventually("the stream finishes", func() bool {
			var done bool
			done, err = f.s.QueryStream(st)
			return done
		})
		require.Truef(f.t, errors.Is(err, errBoom), "QueryStream reports the failure: %v", err)
		require.Contains(f.t, err.Error(), "operation 1 (boom) failed")
		require.True(f.t, f.streamDone(st), "the failure is reported once")
		f.sync(st)
	})
	s.runStreams(t, "CloseWithUnreported", func(f *streamFixture) {
		// Close still closes everything; if it reports the failure, it
		// reports that one.
		st := f.stream(0)
		f.launch(st, "boom", boom)
		if err := f.within("close", f.d.Close); err != nil {
			require.Truef(f.t, errors.Is(err, errBoom), "Close reports an unrelated failure: %v", err)
		}
		_, err := f.d.Reserve(f.gran, 0, 0)
		f.requireIs(err, driver.ErrClosed)
		f.requireIs(f.s.SyncStream(st), driver.ErrClosed)
	})
	s.runStreams(t, "DestroyReturnsUnreported", func(f *streamFixture) {
		st := f.stream(0)
		f.launch(st, "boom", boom)
		err := f.within("destroy stream", func() error { return f.s.DestroyStream(st) })
		require.Truef(f.t, errors.Is(err, errBoom), "DestroyStream reports the failure: %v", err)
		require.Contains(f.t, err.Error(), "(boom)")
		// The stream is gone all the same.
		f.requireIs(f.s.SyncStream(st), driver.ErrBadHandle)
	})
}

// fromHostFunc runs call in a host function on st, once the gate opens
// (nil: at once), and returns what call returned; the host function itself
// succeeds. A call that hangs fails the test (and arms the watchdog).
func (f *streamFixture) fromHostFunc(st driver.Stream, g *gate, call func() error) error {
	f.t.Helper()
	var got error
	f.launch(st, "calls the driver", func() error {
		if g != nil {
			if err := g.wait(); err != nil {
				return err
			}
		}
		got = call()
		return nil
	})
	if g != nil {
		g.open()
	}
	f.sync(st)
	return got
}

// requireSelfWait fails the test unless err is the refusal of a call from
// a host function that would wait for that host function: ErrBusy, naming
// what was asked, with the hint.
func (f *streamFixture) requireSelfWait(err error, what string) {
	f.t.Helper()
	f.requireIs(err, driver.ErrBusy, what, "host function")
	require.Contains(f.t, errors.FlattenHints(err), "host functions must not call the stream API on their own stream",
		"the refusal says what to do: %v", err)
}

// hostFuncCalls checks calls a host function makes to its own driver:
// one that would wait for the host function itself (its own stream, or
// work ordered after it through events, or another host function waiting
// for it) is refused at once with ErrBusy instead of deadlocking; one
// that waits for work independent of it waits.
func (s suite) hostFuncCalls(t *testing.T) {
	s.runStreams(t, "SyncOwnStream", func(f *streamFixture) {
		st := f.stream(0)
		var later atomic.Bool
		g := f.gate()
		f.launch(st, "blocked", g.wait)
		err := f.fromHostFunc(st, g, func() error {
			f.launch(st, "later", mark(&later)) // enqueued behind the host function: the wait would be for itself
			return f.s.SyncStream(st)
		})
		f.requireSelfWait(err, "synchronize stream")
		// fromHostFunc's sync began before the host function enqueued
		// "later" (or after: it is a race), and a sync waits only for what
		// was enqueued before it; once the host function has returned,
		// "later" is enqueued, so this sync covers it.
		f.sync(st)
		require.True(f.t, later.Load(), "work enqueued by the host function ran after it")
		// Queries never wait: they answer.
		var done bool
		var qerr error
		require.NoError(f.t, f.fromHostFunc(st, nil, func() error {
			done, qerr = f.s.QueryStream(st)
			return nil
		}))
		require.NoError(f.t, qerr)
		require.False(f.t, done, "a stream running a host function has not finished")
		// Nothing was broken: the stream works.
		var again atomic.Bool
		f.launch(st, "again", mark(&again))
		f.sync(st)
		require.True(f.t, again.Load())
		f.destroy(st)
	})
	s.runStreams(t, "DestroyOwnStream", func(f *streamFixture) {
		st := f.stream(0)
		err := f.fromHostFunc(st, nil, func() error { return f.s.DestroyStream(st) })
		f.requireSelfWait(err, "destroy stream")
		// The refused destroy changed nothing.
		var ran atomic.Bool
		f.launch(st, "after", mark(&ran))
		f.sync(st)
		require.True(f.t, ran.Load(), "the stream lives on")
		f.destroy(st)
	})
	s.runStreams(t, "SyncEventRecordedLater", func(f *streamFixture) {
		st, ev, g := f.stream(0), f.event(0), f.gate()
		var queried bool
		var qerr error
		// The host function waits for its gate until ev is recorded
		// behind it.
		f.launch(st, "calls the driver", func() error {
			if err := g.wait(); err != nil {
				return err
			}
			queried, qerr = f.s.QueryEvent(ev)
			return f.s.SyncEvent(ev)
		})
		f.record(ev, st)
		g.open()
		f.requireSelfWait(f.syncErr(st), "synchronize event")
		require.NoError(f.t, qerr)
		require.False(f.t, queried, "an event recorded behind a running host function is not complete")
		require.True(f.t, f.eventDone(ev), "the record ran: the refusal failed the host function, not the record")
		// An event recorded before the host function has completed: no
		// refusal, no wait.
		f.record(ev, st)
		require.NoError(f.t, f.fromHostFunc(st, nil, func() error { return f.s.SyncEvent(ev) }))
	})
	s.runStreams(t, "SyncIndependentStream", func(f *streamFixture) {
		// Waiting for a stream that does not wait for the host function is
		// allowed: it waits.
		a, b := f.stream(0), f.stream(1)
		var slow atomic.Bool
		f.launch(b, "slow", func() error { time.Sleep(settle); slow.Store(true); return nil })
		require.NoError(f.t, f.fromHostFunc(a, nil, func() error { return f.s.SyncStream(b) }))
		require.True(f.t, slow.Load(), "the host function's synchronize returned before b's work ran")
	})
	s.runStreams(t, "CycleThroughEvents", func(f *streamFixture) {
		// b waits for an event recorded on a after a's host function, and
		// c for one recorded on b after that wait: both are ordered after
		// the host function, so its waits for them are refused.
		a, b, c := f.stream(0), f.stream(0), f.stream(1)
		evA, evB := f.event(0), f.event(0)
		g := f.gate()
		var errs []error
		f.launch(a, "calls the driver", func() error {
			if err := g.wait(); err != nil {
				return err
			}
			errs = append(errs, f.s.SyncStream(b), f.s.SyncEvent(evB), f.s.SyncStream(c), f.s.DestroyStream(b))
			return nil
		})
		f.record(evA, a)
		var ranB, ranC atomic.Bool
		f.waitFor(b, evA)
		f.launch(b, "after wait", mark(&ranB))
		f.record(evB, b)
		f.waitFor(c, evB)
		f.launch(c, "after wait", mark(&ranC))
		g.open()
		f.sync(a)
		require.Len(f.t, errs, 4)
		for i, what := range []string{"synchronize stream", "synchronize event", "synchronize stream", "destroy stream"} {
			f.requireSelfWait(errs[i], what)
		}
		// Nothing was broken: b and c ran once a passed its event, and b
		// was not destroyed.
		f.sync(b)
		f.sync(c)
		require.True(f.t, ranB.Load())
		require.True(f.t, ranC.Load())
		f.destroy(b)
	})
	s.runStreams(t, "HostFuncsWaitForEachOther", func(f *streamFixture) {
		// Host functions on a and b each synchronize the other's stream:
		// whichever asks second would close the cycle and is refused; the
		// first waits, and returns once the second has.
		a, b := f.stream(0), f.stream(1)
		var started sync.WaitGroup
		started.Add(2)
		both := make(chan struct{})
		go func() { started.Wait(); close(both) }()
		errs := make([]error, 2)
		for i, pair := range [][2]driver.Stream{{a, b}, {b, a}} {
			f.launch(pair[0], "waits for the other", func() error {
				started.Done()
				select {
				case <-both:
				case <-time.After(gateLimit):
					return errors.New("drivertest: the other host function never started")
				}
				errs[i] = f.s.SyncStream(pair[1])
				return nil
			})
		}
		f.sync(a)
		f.sync(b)
		refused := 0
		for _, err := range errs {
			if err != nil {
				f.requireSelfWait(err, "synchronize stream")
				refused++
			}
		}
		require.Equal(f.t, 1, refused, "exactly one of the two waits is refused: %v", errs)
	})
	s.runStreams(t, "CloseFromHostFunc", func(f *streamFixture) {
		// Close from a host function cannot wait for that host function:
		// it closes the driver without waiting for the work ordered after
		// the caller (skipped), waits for the rest, and says so with
		// ErrBusy, at once.
		a, b := f.stream(0), f.stream(1)
		var independent, behind atomic.Bool
		f.launch(b, "slow", func() error { time.Sleep(settle); independent.Store(true); return nil })
		var closeErr error
		returned := make(chan struct{})
		// The host function waits at its gate until "behind" is
		// enqueued: on a loaded machine it could otherwise close the
		// driver before that launch, which then fails with ErrClosed.
		g := f.gate()
		f.launch(a, "closes the driver", func() error {
			defer close(returned)
			if err := g.wait(); err != nil {
				return err
			}
			closeErr = f.d.Close()
			return nil
		})
		f.launch(a, "behind", mark(&behind))
		g.open()
		select {
		case <-returned:
		case <-time.After(patience):
			f.wedged("Close from a host function")
			f.t.Fatalf("Close from a host function did not return within %s", patience)
		}
		f.requireSelfWait(closeErr, "close")
		require.True(f.t, independent.Load(), "Close returned before the work it could wait for ran")
		_, err := f.d.Reserve(f.gran, 0, 0)
		f.requireIs(err, driver.ErrClosed)
		f.requireIs(f.s.SyncStream(a), driver.ErrClosed)
		time.Sleep(settle)
		require.False(f.t, behind.Load(), "work behind the host function that closed the driver ran")
	})
}

// peers checks CanAccessPeer and EnablePeerAccess for every pair.
func (s suite) peers(t *testing.T) {
	s.runStreams(t, "Self", func(f *streamFixture) {
		for i := range f.devs {
			dev := driver.DeviceID(i)
			ok, err := f.s.CanAccessPeer(dev, dev)
			require.NoError(f.t, err)
			require.False(f.t, ok, "CanAccessPeer(%d, %d) must be false", dev, dev)
			f.requireIs(f.s.EnablePeerAccess(dev, dev), driver.ErrInvalid)
		}
	})
	s.runStreams(t, "EnableWhereCan", func(f *streamFixture) {
		for i := range f.devs {
			for j := range f.devs {
				dev, peer := driver.DeviceID(i), driver.DeviceID(j)
				if dev == peer {
					continue
				}
				ok, err := f.s.CanAccessPeer(dev, peer)
				require.NoError(f.t, err)
				if !ok {
					f.requireIs(f.s.EnablePeerAccess(dev, peer), driver.ErrUnsupported)
					continue
				}
				require.NoError(f.t, f.s.EnablePeerAccess(dev, peer))
				require.NoError(f.t, f.s.EnablePeerAccess(dev, peer), "enabling peer access again is harmless")
			}
		}
	})
}

// copies checks CopyHtoD, CopyDtoH, CopyDtoD and Memset: they move bytes
// in stream order as the stream's device, and a copy the device may not
// make fails at the next synchronize, changing nothing.
func (s suite) copies(t *testing.T) {
	s.runStreams(t, "Unsupported", func(f *streamFixture) {
		if f.hostAccess() {
			f.t.Skipf("%s supports %s", f.d.Name(), driver.FeatureHostAccess)
		}
		base := f.region(0, driver.AccessReadWrite)
		st := f.stream(0)
		buf := f.hostBuf(probe)
		f.requireIs(f.s.CopyHtoD(base, buf, st), driver.ErrUnsupported)
		f.requireIs(f.s.CopyDtoH(buf, base, st), driver.ErrUnsupported)
		f.requireIs(f.s.CopyDtoD(at(base, probe), base, probe, st), driver.ErrUnsupported)
		f.requireIs(f.s.Memset(base, 1, probe, st), driver.ErrUnsupported)
		require.True(f.t, f.streamDone(st), "a refused copy was enqueued")
		f.sync(st)
	})
	s.runCopies(t, "RoundTrip", func(f *streamFixture) {
		for i := range f.devs {
			dev := driver.DeviceID(i)
			base, st := f.region(dev, driver.AccessReadWrite), f.stream(dev)
			src, dst := f.hostBuf(probe), f.hostBuf(probe)
			copy(src, pattern(probe, byte(20+i)))
			for _, off := range []uint64{0, f.gran - probe} {
				clear(dst)
				require.NoError(f.t, f.s.CopyHtoD(at(base, off), src, st))
				require.NoError(f.t, f.s.CopyDtoH(dst, at(base, off), st))
				f.sync(st)
				require.Equal(f.t, src, dst, "device %d, offset %d: read back what was copied", dev, off)
				f.requireBytes(at(base, off), src)
			}
		}
	})
	s.runCopies(t, "InStreamOrder", func(f *streamFixture) {
		// Each copy reads its source when it runs, after the work enqueued
		// before it: a host function between two copies of one buffer
		// changes what the second copies.
		base, st := f.region(0, driver.AccessReadWrite), f.stream(0)
		one, two := pattern(probe, 30), pattern(probe, 31)
		src, out := f.hostBuf(probe), f.hostBuf(probe)
		copy(src, one)
		require.NoError(f.t, f.s.CopyHtoD(base, src, st))
		var seen []byte
		f.launch(st, "read device", func() error {
			seen = make([]byte, probe)
			return f.d.Read(base, seen)
		})
		require.NoError(f.t, f.s.CopyDtoH(out, base, st))
		f.launch(st, "change source", func() error { copy(src, two); return nil })
		require.NoError(f.t, f.s.CopyHtoD(at(base, probe), src, st))
		f.sync(st)
		require.Equal(f.t, one, seen, "the host function ran before the copy before it")
		require.Equal(f.t, one, out)
		f.requireBytes(base, one)
		f.requireBytes(at(base, probe), two)
	})
	s.runCopies(t, "DtoDSameDevice", func(f *streamFixture) {
		for i := range f.devs {
			dev := driver.DeviceID(i)
			a, b := f.region(dev, driver.AccessReadWrite), f.region(dev, driver.AccessReadWrite)
			st := f.stream(dev)
			data := pattern(probe, byte(40+i))
			f.write(a, data)
			require.NoError(f.t, f.s.CopyDtoD(at(b, f.gran-probe), a, probe, st))
			require.NoError(f.t, f.s.CopyDtoD(at(a, probe), a, probe, st))
			f.sync(st)
			f.requireBytes(at(b, f.gran-probe), data)
			f.requireBytes(at(a, probe), data)
		}
	})
	s.runCopies(t, "DtoDAcrossDevices", func(f *streamFixture) {
		f.has(1)
		ok, err := f.s.CanAccessPeer(0, 1)
		require.NoError(f.t, err)
		if !ok {
			f.t.Skipf("%s: CanAccessPeer(0, 1) is false (checked by PeerAccessRequired)", f.d.Name())
		}
		require.NoError(f.t, f.s.EnablePeerAccess(0, 1))
		mine, theirs := f.region(0, driver.AccessReadWrite), f.region(1, driver.AccessReadWrite)
		f.setAccess(theirs, f.gran, 0, driver.AccessReadWrite)
		st := f.stream(0)
		in, out := pattern(probe, 50), pattern(probe, 51)
		f.write(theirs, in)
		f.write(mine, out)
		require.NoError(f.t, f.s.CopyDtoD(at(mine, probe), theirs, probe, st))
		require.NoError(f.t, f.s.CopyDtoD(at(theirs, probe), mine, probe, st))
		f.sync(st)
		f.requireBytes(at(mine, probe), in)
		f.requireBytes(at(theirs, probe), out)
	})
	s.runCopies(t, "Memset", func(f *streamFixture) {
		base, st := f.region(0, driver.AccessReadWrite), f.stream(0)
		before := pattern(3*probe, 60)
		f.write(base, before)
		const n = probe - 1 // the length needs no alignment
		require.NoError(f.t, f.s.Memset(at(base, probe), 0xab, n, st))
		f.sync(st)
		want := bytes.Clone(before)
		for i := probe; i < probe+n; i++ {
			want[i] = 0xab
		}
		f.requireBytes(base, want)
	})
	s.runCopies(t, "ZeroLength", func(f *streamFixture) {
		// Zero-length copies and fills are no-ops: even at an address no
		// reservation holds, and they fail nothing later.
		st, g := f.stream(0), f.gate()
		gone := f.unreserved(f.gran)
		f.launch(st, "blocked", g.wait)
		require.NoError(f.t, f.s.CopyHtoD(gone, nil, st))
		require.NoError(f.t, f.s.CopyDtoH(nil, gone, st))
		require.NoError(f.t, f.s.CopyDtoD(gone, gone, 0, st))
		require.NoError(f.t, f.s.Memset(gone, 1, 0, st))
		g.open()
		f.sync(st)
	})
	s.runCopies(t, "DeviceWithoutAccessDenied", func(f *streamFixture) {
		// Device 1 may read and write the memory; device 0, whose stream
		// copies, may not: the copy runs as the stream's device.
		base := f.region(0, driver.AccessNone)
		f.setAccess(base, f.gran, 1, driver.AccessReadWrite)
		before := pattern(2*probe, 70)
		f.write(base, before)
		st := f.stream(0)
		src, dst := f.hostBuf(probe), f.hostBuf(probe)
		copy(src, pattern(probe, 71))
		copy(dst, pattern(probe, 72))
		for _, c := range []struct {
			name string
			call func() error
		}{
			{"CopyHtoD", func() error { return f.s.CopyHtoD(base, src, st) }},
			{"CopyDtoH", func() error { return f.s.CopyDtoH(dst, base, st) }},
			{"CopyDtoD", func() error { return f.s.CopyDtoD(base, at(base, probe), probe, st) }},
			{"Memset", func() error { return f.s.Memset(base, 0xff, probe, st) }},
		} {
			require.NoError(f.t, c.call(), "%s is enqueued; it fails when it runs", c.name)
			f.requireIs(f.syncErr(st), driver.ErrAccessDenied)
			f.requireBytes(base, before)
			require.Equal(f.t, pattern(probe, 72), dst, "%s changed the host buffer", c.name)
		}
		require.True(f.t, f.streamDone(st), "each failure is reported once")
		f.requireOnly(base, 1, driver.AccessReadWrite)
	})
	s.runCopies(t, "ReadOnlyDestinationDenied", func(f *streamFixture) {
		// Device 0, whose stream copies, may only read; device 1 may also
		// write, which must not help device 0.
		base := f.region(0, driver.AccessRead)
		f.setAccess(base, f.gran, 1, driver.AccessReadWrite)
		before := pattern(2*probe, 80)
		f.write(base, before)
		st := f.stream(0)
		src := f.hostBuf(probe)
		copy(src, pattern(probe, 81))
		for _, c := range []struct {
			name string
			call func() error
		}{
			{"CopyHtoD", func() error { return f.s.CopyHtoD(base, src, st) }},
			{"CopyDtoD", func() error { return f.s.CopyDtoD(base, at(base, probe), probe, st) }},
			{"Memset", func() error { return f.s.Memset(base, 0xff, probe, st) }},
		} {
			require.NoError(f.t, c.call(), "%s is enqueued; it fails when it runs", c.name)
			f.requireIs(f.syncErr(st), driver.ErrAccessDenied)
			f.requireBytes(base, before)
		}
		// Reading it is allowed.
		dst := f.hostBuf(probe)
		require.NoError(f.t, f.s.CopyDtoH(dst, base, st))
		f.sync(st)
		require.Equal(f.t, before[:probe], dst)
	})
	s.runCopies(t, "ReservedOnlyDenied", func(f *streamFixture) {
		base, st := f.reserve(f.gran), f.stream(0)
		src := f.hostBuf(probe)
		require.NoError(f.t, f.s.CopyHtoD(base, src, st))
		f.requireIs(f.syncErr(st), driver.ErrAccessDenied)
		require.NoError(f.t, f.s.Memset(base, 1, probe, st))
		f.requireIs(f.syncErr(st), driver.ErrAccessDenied)
		f.requireNotMapped(base)
	})
	s.runCopies(t, "PeerAccessRequired", func(f *streamFixture) {
		// Memory of device 1, which grants device 0 read-write access; a
		// stream of device 0 still needs peer access from 0 to 1.
		theirs := f.region(1, driver.AccessReadWrite)
		f.setAccess(theirs, f.gran, 0, driver.AccessReadWrite)
		before := pattern(probe, 90)
		f.write(theirs, before)
		st := f.stream(0)
		src := f.hostBuf(probe)
		copy(src, pattern(probe, 91))
		denied := func() {
			f.t.Helper()
			require.NoError(f.t, f.s.CopyHtoD(theirs, src, st))
			f.requireIs(f.syncErr(st), driver.ErrAccessDenied, "peer access")
			f.requireBytes(theirs, before)
		}
		denied()
		ok, err := f.s.CanAccessPeer(0, 1)
		require.NoError(f.t, err)
		if !ok {
			f.requireIs(f.s.EnablePeerAccess(0, 1), driver.ErrUnsupported)
			denied()
			return
		}
		// Peer access goes one way: from 1 to 0 does not let 0 reach 1.
		if back, err := f.s.CanAccessPeer(1, 0); err == nil && back {
			require.NoError(f.t, f.s.EnablePeerAccess(1, 0))
			denied()
		}
		require.NoError(f.t, f.s.EnablePeerAccess(0, 1))
		require.NoError(f.t, f.s.CopyHtoD(theirs, src, st))
		f.sync(st)
		f.requireBytes(theirs, pattern(probe, 91))
		// Peer access does not stand in for the access granted.
		f.setAccess(theirs, f.gran, 0, driver.AccessNone)
		require.NoError(f.t, f.s.Memset(theirs, 0, probe, st))
		f.requireIs(f.syncErr(st), driver.ErrAccessDenied)
		f.requireBytes(theirs, pattern(probe, 91))
	})
	s.runCopies(t, "Misaligned", func(f *streamFixture) {
		align := f.devs[0].CopyAlign
		if align <= 1 {
			f.t.Skipf("device 0 of %s needs no alignment for async copies", f.d.Name())
		}
		base, st := f.region(0, driver.AccessReadWrite), f.stream(0)
		before := pattern(4*probe, 100)
		f.write(base, before)
		src := f.hostBuf(2 * probe)
		copy(src, pattern(2*probe, 101))
		odd := at(base, align/2)
		frag := fmt.Sprintf("%d-byte aligned", align)
		f.requireIs(f.s.CopyHtoD(odd, src[:probe], st), driver.ErrMisaligned, frag)
		f.requireIs(f.s.CopyHtoD(base, src[1:probe+1], st), driver.ErrMisaligned, frag)
		f.requireIs(f.s.CopyDtoH(src[1:probe+1], base, st), driver.ErrMisaligned, frag)
		f.requireIs(f.s.CopyDtoH(src[:probe], odd, st), driver.ErrMisaligned, frag)
		f.requireIs(f.s.CopyDtoD(odd, at(base, 2*probe), probe, st), driver.ErrMisaligned, frag)
		f.requireIs(f.s.CopyDtoD(at(base, 2*probe), odd, probe, st), driver.ErrMisaligned, frag)
		f.requireIs(f.s.Memset(odd, 0xff, probe, st), driver.ErrMisaligned, frag)
		require.True(f.t, f.streamDone(st), "a refused copy was enqueued")
		f.sync(st)
		f.requireBytes(base, before)
		require.Equal(f.t, pattern(2*probe, 101), src)
	})
}

// hostAlloc checks HostAlloc and HostFree.
func (s suite) hostAlloc(t *testing.T) {
	s.runStreams(t, "Aligned", func(f *streamFixture) {
		align := max(64, f.copyAlign())
		for _, size := range []int{1, 63, 64, 65, 4095, 4097, 1 << 20} {
			b, err := f.s.HostAlloc(uint64(size))
			require.NoError(f.t, err, "host alloc of %d bytes", size)
			require.Len(f.t, b, size)
			require.Zerof(f.t, uint64(uintptr(unsafe.Pointer(&b[0])))%align,
				"host alloc of %d bytes starts at %p, not a multiple of %d", size, &b[0], align)
			for i := range b {
				b[i] = byte(i)
			}
			require.Equal(f.t, byte(size-1), b[size-1])
			require.NoError(f.t, f.s.HostFree(b))
		}
	})
	s.runStreams(t, "ZeroSize", func(f *streamFixture) {
		_, err := f.s.HostAlloc(0)
		f.requireIs(err, driver.ErrInvalid)
	})
	s.runStreams(t, "FreeRefused", func(f *streamFixture) {
		b, err := f.s.HostAlloc(4096)
		require.NoError(f.t, err)
		copy(b, pattern(probe, 110))
		for _, c := range []struct {
			name string
			b    []byte
		}{
			{"nil", nil},
			{"Go memory", make([]byte, 4096)},
			{"its tail", b[64:]},
			{"its head", b[:4000]},
		} {
			f.requireIs(f.s.HostFree(c.b), driver.ErrInvalid)
		}
		// The refusals freed nothing.
		require.Equal(f.t, pattern(probe, 110), b[:probe])
		require.NoError(f.t, f.s.HostFree(b))
		f.requireIs(f.s.HostFree(b), driver.ErrInvalid, "freed already")
	})
}

// streamConcurrency runs whole stream lifetimes from 8 goroutines at once,
// each with streams, an event and (with host access) memory of its own;
// run it with -race.
func (s suite) streamConcurrency(t *testing.T) {
	const workers, rounds = 8, 20
	s.runStreams(t, "Workers", func(f *streamFixture) {
		var wg sync.WaitGroup
		errs := make([]error, workers)
		for w := range workers {
			wg.Go(func() { errs[w] = f.streamWork(w, rounds) })
		}
		require.NoError(f.t, f.within("the workers", func() error { wg.Wait(); return nil }))
		for w, err := range errs {
			require.NoError(f.t, err, "worker %d", w)
		}
	})
}

// streamWork is one worker of the streams concurrency test: rounds of
// creating a stream, running host functions (and copies) on it, waiting
// on the event of the round before, synchronizing and destroying it. It
// returns the first error rather than failing the test, since it runs off
// the test's goroutine.
func (f *streamFixture) streamWork(w, rounds int) error {
	d, s := f.d, f.s
	dev := driver.DeviceID(w % len(f.devs))
	ev, err := s.CreateEvent(dev)
	if err != nil {
		return err
	}
	var base driver.Addr
	var src, dst []byte
	if f.hostAccess() {
		if base, err = d.Reserve(f.gran, 0, 0); err != nil {
			return err
		}
		h, err := d.Create(dev, f.gran, driver.ChunkOptions{})
		if err != nil {
			return err
		}
		if err := d.Map(base, h); err != nil {
			return err
		}
		if err := d.Release(h); err != nil { // the memory goes with the unmap
			return err
		}
		if err := d.SetAccess(base, f.gran, dev, driver.AccessReadWrite); err != nil {
			return err
		}
		if src, err = s.HostAlloc(probe); err != nil {
			return err
		}
		if dst, err = s.HostAlloc(probe); err != nil {
			return err
		}
		copy(src, pattern(probe, byte(w)))
	}
	for r := range rounds {
		st, err := s.CreateStream(dev)
		if err != nil {
			return errors.Wrapf(err, "round %d", r)
		}
		var seq []int
		for k := range 4 {
			if err := s.LaunchHostFunc(st, "step", func() error { seq = append(seq, k); return nil }); err != nil {
				return errors.Wrapf(err, "round %d", r)
			}
		}
		if err := s.StreamWaitEvent(st, ev); err != nil {
			return errors.Wrapf(err, "round %d", r)
		}
		if f.hostAccess() {
			src[1] = byte(r)
			off := uint64(r%4) * probe
			if err := s.CopyHtoD(at(base, off), src, st); err != nil {
				return errors.Wrapf(err, "round %d", r)
			}
			if err := s.Memset(at(base, off+probe), byte(r), probe, st); err != nil {
				return errors.Wrapf(err, "round %d", r)
			}
			if err := s.CopyDtoH(dst, at(base, off), st); err != nil {
				return errors.Wrapf(err, "round %d", r)
			}
		}
		if err := s.RecordEvent(ev, st); err != nil {
			return errors.Wrapf(err, "round %d", r)
		}
		if err := s.SyncEvent(ev); err != nil {
			return errors.Wrapf(err, "round %d", r)
		}
		if err := s.SyncStream(st); err != nil {
			return errors.Wrapf(err, "round %d", r)
		}
		if len(seq) != 4 || seq[0] != 0 || seq[3] != 3 {
			return errors.Newf("round %d: host functions ran as %v", r, seq)
		}
		if f.hostAccess() && !bytes.Equal(src, dst) {
			return errors.Newf("round %d: copied back % x, copied in % x", r, head(dst), head(src))
		}
		if err := s.DestroyStream(st); err != nil {
			return errors.Wrapf(err, "round %d", r)
		}
	}
	if err := s.DestroyEvent(ev); err != nil {
		return err
	}
	if f.hostAccess() {
		if err := errors.CombineErrors(s.HostFree(src), s.HostFree(dst)); err != nil {
			return err
		}
		if err := d.Unmap(base, f.gran); err != nil {
			return err
		}
		return d.Unreserve(base, f.gran)
	}
	return nil
}
