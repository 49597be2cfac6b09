package stream_test

import (
	"bytes"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/stream"
)

func newHost(t *testing.T) *host.Driver {
	t.Helper()
	d, err := host.New(host.Options{Devices: 2, Capacity: 4 * units.MiB, Granularity: 64 * units.KiB})
	require.NoError(t, err)
	drivertest.CloseAtEnd(t, d)
	return d
}

func newStreams(t *testing.T, d driver.Driver, n int) []*stream.Stream {
	t.Helper()
	var ss []*stream.Stream
	for i := 0; i < n; i++ {
		s, err := stream.New(d, 0)
		require.NoError(t, err)
		ss = append(ss, s)
		t.Cleanup(func() { _ = s.Destroy() })
	}
	return ss
}

// TestOrderedAfter: the vector clocks learn order from waits on events,
// also through a third stream, and never from anything else.
func TestOrderedAfter(t *testing.T) {
	d := newHost(t)
	ss := newStreams(t, d, 3)
	a, b, c := ss[0], ss[1], ss[2]
	ev1, err := stream.NewEvent(d, 0)
	require.NoError(t, err)
	ev2, err := stream.NewEvent(d, 0)
	require.NoError(t, err)

	require.NoError(t, a.Launch("work", func() error { return nil }))
	require.Equal(t, uint64(1), a.Position())
	require.True(t, a.OrderedAfter(a, 1), "a stream is ordered after itself")
	require.False(t, b.OrderedAfter(a, 1))

	require.NoError(t, a.Record(ev1)) // position 2
	require.NoError(t, b.Wait(ev1))
	require.True(t, b.OrderedAfter(a, 1))
	require.True(t, b.OrderedAfter(a, 2), "the record itself is covered")
	require.NoError(t, a.Launch("later", func() error { return nil }))
	require.False(t, b.OrderedAfter(a, 3), "work on a after the record is not")

	require.NoError(t, b.Record(ev2))
	require.NoError(t, c.Wait(ev2))
	require.True(t, c.OrderedAfter(a, 2), "c learned a's order through b")
	require.True(t, c.OrderedAfter(b, b.Position()))
	require.False(t, c.OrderedAfter(a, 3))

	require.NoError(t, a.Synchronize())
	require.False(t, c.OrderedAfter(a, 3), "a host synchronize is not a stream dependency")
	require.NoError(t, ev1.Destroy())
	require.NoError(t, ev2.Destroy())
}

func TestSynchronizeHooks(t *testing.T) {
	d := newHost(t)
	s := newStreams(t, d, 1)[0]
	var n atomic.Int32
	cancel, err := stream.OnSynchronize(d, func() { n.Add(1) })
	require.NoError(t, err)
	require.NoError(t, s.Synchronize())
	ev, err := stream.NewEvent(d, 0)
	require.NoError(t, err)
	require.NoError(t, s.Record(ev))
	require.NoError(t, ev.Synchronize())
	require.Equal(t, int32(2), n.Load(), "stream and event synchronizes run the hooks")
	require.NoError(t, ev.WaitDone())
	require.Equal(t, int32(2), n.Load(), "WaitDone does not")
	cancel()
	require.NoError(t, s.Synchronize())
	require.Equal(t, int32(2), n.Load(), "cancelled")
	require.NoError(t, ev.Destroy())
}

// sliceDriver is a host driver whose dynamic type is not comparable: a
// struct value holding a slice. Keying a map with it, or comparing two of
// them with ==, panics.
type sliceDriver struct {
	*host.Driver
	tags []string
}

// TestNonComparableDriver: a driver that cannot key a map is refused with
// ErrInvalid, naming why, by every entry point that would key or compare
// it — never a panic — and nothing is registered or created.
func TestNonComparableDriver(t *testing.T) {
	d := sliceDriver{Driver: newHost(t), tags: []string{"a"}}
	require.NotPanics(t, func() {
		cancel, err := stream.OnSynchronize(d, func() {})
		drivertest.RequireIs(t, err, driver.ErrInvalid, "not comparable")
		require.Nil(t, cancel)
		_, err = stream.New(d, 0)
		drivertest.RequireIs(t, err, driver.ErrInvalid, "not comparable")
		_, err = stream.NewEvent(d, 0)
		drivertest.RequireIs(t, err, driver.ErrInvalid, "not comparable")
		_, err = stream.NewHostBuffer(d, 64)
		drivertest.RequireIs(t, err, driver.ErrInvalid, "not comparable")
		_, err = stream.OnSynchronize(nil, func() {})
		drivertest.RequireIs(t, err, driver.ErrInvalid, "nil")
	})
	// Nothing was created: the host driver behind it has no streams left
	// over, and a pointer to the same driver is accepted.
	s, err := stream.New(&d, 0)
	require.NoError(t, err)
	require.Equal(t, driver.Stream(1), s.ID(), "the refused calls created no stream")
	require.NoError(t, s.Destroy())
	_, err = stream.OnSynchronize(d.Driver, nil)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "nil")
}

func TestCopiesAndHostBuffers(t *testing.T) {
	d := newHost(t)
	s := newStreams(t, d, 1)[0]
	g := d.Granularity()
	base, err := d.Reserve(4*g, 0, 0)
	require.NoError(t, err)
	h, err := d.Create(0, 2*g, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, d.Map(base, h))
	t.Cleanup(func() {
		require.NoError(t, d.Unmap(base, 2*g))
		require.NoError(t, d.Release(h))
		require.NoError(t, d.Unreserve(base, 4*g))
	})
	require.NoError(t, d.SetAccess(base, 2*g, 0, driver.AccessReadWrite))

	hb, err := stream.NewHostBuffer(d, 4096)
	require.NoError(t, err)
	buf := hb.Bytes()
	require.Len(t, buf, 4096)
	copy(buf, "pinned")
	require.NoError(t, s.CopyHtoD(base, buf[:6]))
	require.NoError(t, s.CopyDtoD(base+driver.Addr(g), base, 6))
	require.NoError(t, s.Memset(base, 'x', 3))
	out := make([]byte, 6)
	require.NoError(t, s.CopyDtoH(out, base+driver.Addr(g)))
	back := make([]byte, 6)
	require.NoError(t, s.CopyDtoH(back, base))
	hh := make([]byte, 6)
	require.NoError(t, s.CopyHtoH(hh, back))
	start, err := stream.NewEvent(d, 0)
	require.NoError(t, err)
	end, err := stream.NewEvent(d, 0)
	require.NoError(t, err)
	require.NoError(t, s.Record(start))
	require.NoError(t, s.Launch("sleep", func() error { time.Sleep(5 * time.Millisecond); return nil }))
	require.NoError(t, s.Record(end))
	require.NoError(t, s.Synchronize())
	require.Equal(t, "pinned", string(out))
	require.Equal(t, "xxxned", string(back))
	require.Equal(t, "xxxned", string(hh))
	el, err := stream.Elapsed(start, end)
	require.NoError(t, err)
	require.GreaterOrEqual(t, el, 5*time.Millisecond)

	drivertest.RequireIs(t, s.CopyHtoH(make([]byte, 2), make([]byte, 3)), driver.ErrInvalid)

	// The synchronous forms return with the bytes moved.
	require.NoError(t, s.CopyHtoDSync(base, []byte("sync")))
	require.NoError(t, s.MemsetSync(base+4, '!', 1))
	require.NoError(t, s.CopyDtoDSync(base+driver.Addr(g), base, 5))
	got := make([]byte, 5)
	require.NoError(t, s.CopyDtoHSync(got, base+driver.Addr(g)))
	require.Equal(t, "sync!", string(got))
	hh2 := make([]byte, 5)
	require.NoError(t, s.CopyHtoHSync(hh2, got))
	require.Equal(t, "sync!", string(hh2))
	require.NoError(t, s.CopyDtoD(base, base+driver.Addr(4*g), 1)) // outside the reservation: fails when it runs
	drivertest.RequireIs(t, s.CopyDtoHSync(got, base), driver.ErrNotReserved, "operation")
	require.NoError(t, hb.Free())
	drivertest.RequireIs(t, hb.Free(), driver.ErrClosed)
	require.Nil(t, hb.Bytes())
	for _, e := range []*stream.Event{start, end} {
		require.NoError(t, e.Destroy())
	}
}

// TestErrorsSurfaceAtSynchronize: a failing host function is reported by
// the next synchronize, naming it; the stream then works again.
func TestErrorsSurfaceAtSynchronize(t *testing.T) {
	d := newHost(t)
	s := newStreams(t, d, 1)[0]
	require.NoError(t, s.Launch("kernel A", func() error { return driver.ErrInvalid }))
	ran := false
	require.NoError(t, s.Launch("kernel B", func() error { ran = true; return nil }))
	err := s.Synchronize()
	drivertest.RequireIs(t, err, driver.ErrInvalid, "kernel A", "1 later operation(s) skipped")
	require.False(t, ran)
	require.NoError(t, s.Launch("kernel C", func() error { ran = true; return nil }))
	require.NoError(t, s.Synchronize())
	require.True(t, ran)
}

// TestLaunchPanicReportedAtSynchronize: a host function launched with
// Stream.Launch that panics fails its operation (ErrInvalid, naming it and
// the panic value) at the next synchronize, instead of killing the
// process; events recorded after it complete, and the stream runs later
// work.
func TestLaunchPanicReportedAtSynchronize(t *testing.T) {
	d := newHost(t)
	s := newStreams(t, d, 1)[0]
	ev, err := stream.NewEvent(d, 0)
	require.NoError(t, err)
	require.NoError(t, s.Launch("kernel A", func() error { panic("out of bounds") }))
	var ran atomic.Bool
	require.NoError(t, s.Launch("kernel B", func() error { ran.Store(true); return nil }))
	require.NoError(t, s.Record(ev))
	require.NoError(t, bounded(t, "event synchronize", ev.Synchronize))
	done, err := ev.Query()
	require.NoError(t, err)
	require.True(t, done, "an event recorded after the panic completes")
	err = bounded(t, "synchronize", s.Synchronize)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "operation 1 (kernel A) failed: panic: out of bounds", "1 later operation(s) skipped")
	require.False(t, ran.Load(), "work after the failure is skipped")
	require.NoError(t, s.Launch("kernel C", func() error { ran.Store(true); return nil }))
	require.NoError(t, bounded(t, "synchronize", s.Synchronize))
	require.True(t, ran.Load(), "the stream runs work after the reported panic")
	require.NoError(t, ev.Destroy())
}

// TestHostFuncCallsOnItsOwnStream: a host function that synchronizes or
// destroys its own stream, or synchronizes an event recorded behind it,
// gets ErrBusy at once, with the hint, instead of deadlocking; the refused
// calls change nothing (the stream is not marked destroyed, the
// synchronize hooks do not run), and the stream works afterwards.
func TestHostFuncCallsOnItsOwnStream(t *testing.T) {
	d := newHost(t)
	s := newStreams(t, d, 1)[0]
	ev, err := stream.NewEvent(d, 0)
	require.NoError(t, err)
	var hooks atomic.Int32
	cancel, err := stream.OnSynchronize(d, func() { hooks.Add(1) })
	require.NoError(t, err)
	defer cancel()
	gate := make(chan struct{})
	var errs []error
	require.NoError(t, s.Launch("calls its stream", func() error {
		<-gate
		errs = append(errs, s.Synchronize(), s.Destroy(), ev.Synchronize())
		return nil
	}))
	require.NoError(t, s.Record(ev)) // behind the host function
	pos := s.Position()
	close(gate)
	require.NoError(t, bounded(t, "synchronize", s.Synchronize))
	require.Len(t, errs, 3)
	for i, what := range []string{"synchronize stream", "destroy stream", "synchronize event"} {
		drivertest.RequireIs(t, errs[i], driver.ErrBusy, what, "host function")
		require.Contains(t, errors.FlattenHints(errs[i]), "CUDA forbids API calls from host functions")
	}
	require.Equal(t, int32(1), hooks.Load(), "only the synchronize that waited ran the hooks")
	require.Equal(t, pos, s.Position())
	var ran atomic.Bool
	require.NoError(t, s.Launch("after", func() error { ran.Store(true); return nil }), "the refused destroy left the stream alive")
	require.NoError(t, bounded(t, "synchronize", s.Synchronize))
	require.True(t, ran.Load())
	require.NoError(t, ev.Destroy())
}

// TestDestroyWhileHostFuncEnqueues: a stream destroyed while one of its
// host functions enqueues more work on it: the enqueue is refused
// (ErrClosed) and the destroy finishes, rather than each waiting for the
// other.
func TestDestroyWhileHostFuncEnqueues(t *testing.T) {
	d := newHost(t)
	s, err := stream.New(d, 0)
	require.NoError(t, err)
	gate := make(chan struct{})
	var launchErr error
	require.NoError(t, s.Launch("enqueues", func() error {
		<-gate
		launchErr = s.Launch("more", func() error { return nil })
		return nil
	}))
	time.AfterFunc(20*time.Millisecond, func() { close(gate) }) // once Destroy waits
	require.NoError(t, bounded(t, "destroy", s.Destroy))
	drivertest.RequireIs(t, launchErr, driver.ErrClosed, "destroyed")
}

// bounded returns what call, a wait that must end (what names it for a
// reader), returns. It sets no clock of its own: a loaded machine is slow,
// not broken, and a deadlock is bounded by go test's -timeout, which ends
// the binary with every goroutine's stack.
func bounded(t *testing.T, what string, call func() error) error {
	t.Helper()
	_ = what
	return call()
}

func TestBadInput(t *testing.T) {
	d := newHost(t)
	other := newHost(t)
	s := newStreams(t, d, 1)[0]
	foreign, err := stream.NewEvent(other, 0)
	require.NoError(t, err)
	_, err = stream.New(d, 5)
	drivertest.RequireIs(t, err, driver.ErrNoDevice)
	drivertest.RequireIs(t, s.Record(foreign), driver.ErrInvalid, "another driver")
	drivertest.RequireIs(t, s.Wait(foreign), driver.ErrInvalid, "another driver")
	ev, err := stream.NewEvent(d, 1)
	require.NoError(t, err)
	drivertest.RequireIs(t, s.Record(ev), driver.ErrInvalid, "device 1")
	_, err = stream.Elapsed(foreign, ev) // ev's id means nothing to foreign's driver
	drivertest.RequireIs(t, err, driver.ErrInvalid, "two drivers")
	require.Zero(t, s.Position(), "refused calls enqueue nothing")
	require.NoError(t, ev.Destroy())
	drivertest.RequireIs(t, s.Record(ev), driver.ErrClosed)
	drivertest.RequireIs(t, ev.Destroy(), driver.ErrClosed)

	sd, err := sim.New(sim.Options{})
	require.NoError(t, err)
	defer sd.Close()
	ss, err := stream.New(sd, 0)
	require.NoError(t, err)
	drivertest.RequireIs(t, ss.CopyHtoD(1<<40, []byte{1}), driver.ErrUnsupported)
	require.Zero(t, ss.Position())
	require.NoError(t, ss.Destroy())
	drivertest.RequireIs(t, ss.Destroy(), driver.ErrClosed)
	drivertest.RequireIs(t, ss.Launch("x", func() error { return nil }), driver.ErrClosed)
	drivertest.RequireIs(t, ss.Synchronize(), driver.ErrClosed)
	require.NoError(t, foreign.Destroy())
}

// noPanic returns what call returns, or an error if it panicked.
func noPanic(call func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panicked: %v", r)
		}
	}()
	return call()
}

// TestDestroyedStreamRefused: every call on a destroyed stream, or with a
// destroyed event, is ErrClosed and changes nothing — no position counted,
// no event recorded or moved, no vector clock learned — while an event
// recorded on a stream before it was destroyed keeps working.
func TestDestroyedStreamRefused(t *testing.T) {
	d := newHost(t)
	ss := newStreams(t, d, 2)
	live, other := ss[0], ss[1]
	dead, err := stream.New(d, 0)
	require.NoError(t, err)
	kept, err := stream.NewEvent(d, 0) // recorded on dead before it went
	require.NoError(t, err)
	ev, err := stream.NewEvent(d, 0) // recorded on live
	require.NoError(t, err)
	gone, err := stream.NewEvent(d, 0)
	require.NoError(t, err)
	require.NoError(t, dead.Record(kept))
	require.NoError(t, bounded(t, "destroy", dead.Destroy))
	require.NoError(t, live.Record(ev))
	evPos := live.Position()
	require.NoError(t, gone.Destroy())

	g := d.Granularity()
	base, err := d.Reserve(g, 0, 0)
	require.NoError(t, err)
	h, err := d.Create(0, g, driver.ChunkOptions{})
	require.NoError(t, err)
	require.NoError(t, d.Map(base, h))
	t.Cleanup(func() {
		// Registered after the driver's close, so it runs before it.
		require.NoError(t, d.Unmap(base, g))
		require.NoError(t, d.Release(h))
		require.NoError(t, d.Unreserve(base, g))
	})
	require.NoError(t, d.SetAccess(base, g, 0, driver.AccessReadWrite))
	require.NoError(t, live.MemsetSync(base, 7, 64))
	hb, err := stream.NewHostBuffer(d, 64)
	require.NoError(t, err)
	defer hb.Free()
	buf := hb.Bytes()
	copy(buf, "host bytes")
	want := append([]byte(nil), buf...)

	var ran atomic.Bool
	for _, c := range []struct {
		name string
		call func() error
	}{
		{"Launch", func() error { return dead.Launch("never", func() error { ran.Store(true); return nil }) }},
		{"Record", func() error { return dead.Record(ev) }},
		{"Wait", func() error { return dead.Wait(ev) }},
		{"CopyHtoD", func() error { return dead.CopyHtoD(base, buf) }},
		{"CopyDtoH", func() error { return dead.CopyDtoH(buf, base) }},
		{"CopyDtoD", func() error { return dead.CopyDtoD(base+64, base, 64) }},
		{"Memset", func() error { return dead.Memset(base, 1, 64) }},
		{"CopyHtoH", func() error { return dead.CopyHtoH(buf, make([]byte, len(buf))) }},
		{"CopyHtoDSync", func() error { return dead.CopyHtoDSync(base, buf) }},
		{"MemsetSync", func() error { return dead.MemsetSync(base, 1, 64) }},
		{"Synchronize", dead.Synchronize},
		{"Query", func() error { _, err := dead.Query(); return err }},
		{"Destroy", dead.Destroy},
		{"Record of a destroyed event", func() error { return live.Record(gone) }},
		{"Wait on a destroyed event", func() error { return live.Wait(gone) }},
		{"Synchronize of a destroyed event", gone.Synchronize},
		{"WaitDone of a destroyed event", gone.WaitDone},
		{"Query of a destroyed event", func() error { _, err := gone.Query(); return err }},
		{"Elapsed from a destroyed event", func() error { _, err := stream.Elapsed(gone, ev); return err }},
		{"Elapsed to a destroyed event", func() error { _, err := stream.Elapsed(ev, gone); return err }},
		{"Destroy of a destroyed event", gone.Destroy},
	} {
		t.Run(c.name, func(t *testing.T) {
			livePos := live.Position()
			drivertest.RequireIs(t, noPanic(c.call), driver.ErrClosed, "destroyed")
			require.Equal(t, uint64(1), dead.Position(), "the dead stream counted nothing more than its record")
			require.Equal(t, livePos, live.Position())
			require.False(t, ran.Load())
			require.Equal(t, want, buf, "the host buffer is unchanged")
		})
	}
	got := make([]byte, 64)
	require.NoError(t, live.CopyDtoHSync(got, base))
	require.Equal(t, bytes.Repeat([]byte{7}, 64), got, "device memory is unchanged")
	// ev still answers for its recording on live: other learns live's
	// order from it, and nothing of dead's.
	require.NoError(t, other.Wait(ev))
	require.True(t, other.OrderedAfter(live, evPos))
	require.False(t, other.OrderedAfter(live, evPos+1))
	require.False(t, other.OrderedAfter(dead, 1))
	// kept, recorded on dead before the destroy, still works.
	require.NoError(t, bounded(t, "synchronize", kept.Synchronize))
	done, err := kept.Query()
	require.NoError(t, err)
	require.True(t, done)
	_, err = stream.Elapsed(kept, kept)
	require.NoError(t, err)
	require.NoError(t, other.Wait(kept))
	require.True(t, other.OrderedAfter(dead, 1), "a wait on kept orders other after dead's record")
	require.NoError(t, bounded(t, "synchronize", other.Synchronize))
	for _, e := range []*stream.Event{kept, ev} {
		require.NoError(t, e.Destroy())
	}
}

// TestNilStreamsAndEvents: a nil event or stream handed to a stream
// call is ErrInvalid, not a panic, and changes nothing.
func TestNilStreamsAndEvents(t *testing.T) {
	d := newHost(t)
	s := newStreams(t, d, 1)[0]
	ev, err := stream.NewEvent(d, 0)
	require.NoError(t, err)
	for _, c := range []struct {
		name string
		call func() error
	}{
		{"Record", func() error { return s.Record(nil) }},
		{"Wait", func() error { return s.Wait(nil) }},
		{"Elapsed from", func() error { _, err := stream.Elapsed(nil, ev); return err }},
		{"Elapsed to", func() error { _, err := stream.Elapsed(ev, nil); return err }},
		{"Launch of nil", func() error { return s.Launch("nil", nil) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			drivertest.RequireIs(t, noPanic(c.call), driver.ErrInvalid)
			require.Zero(t, s.Position())
		})
	}
	require.NoError(t, ev.Destroy())
}

// TestSynchronizeHookPanics: a synchronize hook that panics does not take
// the caller down: the synchronize (of a stream or an event) returns the
// panic as an error (ErrInvalid), every other hook still runs, no lock is
// left held — hooks register and cancel as before — and once the hook is
// cancelled synchronizes succeed again.
func TestSynchronizeHookPanics(t *testing.T) {
	d := newHost(t)
	s := newStreams(t, d, 1)[0]
	ev, err := stream.NewEvent(d, 0)
	require.NoError(t, err)
	var others atomic.Int32
	cancelBad, err := stream.OnSynchronize(d, func() { panic("hook boom") })
	require.NoError(t, err)
	cancelGood, err := stream.OnSynchronize(d, func() { others.Add(1) })
	require.NoError(t, err)
	defer cancelGood()
	require.NoError(t, s.Record(ev))
	for i, sync := range []func() error{s.Synchronize, ev.Synchronize, s.Synchronize} {
		err := noPanic(func() error { return bounded(t, "synchronize", sync) })
		drivertest.RequireIs(t, err, driver.ErrInvalid, "synchronize hook panicked: hook boom")
		require.Equal(t, int32(i+1), others.Load(), "the other hook ran")
	}
	// The work's own failure comes first; the hook's panic rides along.
	require.NoError(t, s.Launch("fails", func() error { return driver.ErrAccessDenied }))
	err = noPanic(func() error { return bounded(t, "synchronize", s.Synchronize) })
	drivertest.RequireIs(t, err, driver.ErrAccessDenied, "fails")
	require.Contains(t, fmt.Sprintf("%+v", err), "hook boom")
	// The hook lock is free: registering and cancelling work.
	cancelExtra, err := stream.OnSynchronize(d, func() {})
	require.NoError(t, err)
	cancelExtra()
	cancelBad()
	require.NoError(t, bounded(t, "synchronize", s.Synchronize))
	require.NoError(t, bounded(t, "synchronize", ev.Synchronize))
	require.NoError(t, ev.Destroy())
}
