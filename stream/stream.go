// Package stream is the library's side of a driver's streams and events:
// ordered queues of asynchronous work on a device, points in them, copies
// and fills between host and device memory, pinned host buffers.
//
// Above what the driver does it keeps one thing: which stream is ordered
// after which point of which other stream. Each Stream counts the
// operations enqueued through it (its position) and keeps a vector clock —
// for every other stream, the position it is known to run after, learned by
// waiting on events. Recording an event snapshots the clock; waiting on one
// merges the snapshot. A stream-ordered allocator asks OrderedAfter to know
// whether memory freed on one stream may be reused on another without a
// new dependency (CUDA's reuse-follow-event-dependencies).
//
// It also runs synchronize hooks: after a stream or event synchronize
// returns, the functions registered with OnSynchronize for that driver run
// (CUDA releases pool memory above the release threshold at that moment).
// A synchronize from inside a hook is refused, as it would run the hooks
// again without end; a hook waits for an event with Event.WaitDone.
//
// Invariants: positions only grow; a stream's clock entry for another
// stream never exceeds that stream's position; an event's clock is the
// recording stream's clock at the moment of recording. A clock forgets
// the streams destroyed, at its stream's next record or wait, so it holds
// no more than the streams alive and those destroyed since. The package never
// touches memory itself; the driver does.
package stream

import (
	"bytes"
	"fmt"
	"maps"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/lockrank"
)

// Stream is an ordered queue of work on one device. Safe for concurrent
// use; work enqueued from several goroutines runs in the order the calls
// took effect.
type Stream struct {
	d   driver.Driver
	st  driver.Streams
	id  driver.Stream
	dev driver.DeviceID

	mu     lockrank.Mutex[lockrank.Stream]
	pos    uint64
	clock  map[*Stream]uint64
	closed bool
	// gone says a Destroy of the stream went through: other streams'
	// clocks forget it when they next record or wait (forgetGoneLocked),
	// read without its lock, as they hold their own.
	gone atomic.Bool
}

// forgetGoneLocked drops the streams destroyed since from s's clock, so
// that it holds the streams alive (and those destroyed since s last
// recorded or waited, or named by the event it waits on), not every
// stream s ever followed: a long-lived
// stream that waits on many short-lived ones keeps its books, and each
// Record's copy of them, the size of what is alive. A destroyed stream's
// entry only ever made OrderedAfter answer true; without it the answer
// is false, the cautious one (a pool then reuses memory freed on it
// through its event, not through the order).
func (s *Stream) forgetGoneLocked() {
	for t := range s.clock {
		if t.gone.Load() {
			delete(s.clock, t)
		}
	}
}

// streamsOf returns d's streams. d must be comparable: streams and events
// compare their drivers (Record, Wait) and the synchronize hooks are keyed
// by driver, and a driver of a type == cannot compare would make those
// panic; it is refused here, at creation.
func streamsOf(d driver.Driver, what string) (driver.Streams, error) {
	if err := driver.CheckComparable(func() string { return "stream: " + what }, d); err != nil {
		return nil, err
	}
	st, ok := d.(driver.Streams)
	if !ok || !d.Supports(driver.FeatureStreams) {
		return nil, errors.Wrapf(driver.ErrUnsupported, "stream: %s: the %s driver has no streams", what, d.Name())
	}
	return st, nil
}

// New creates a stream on dev.
func New(d driver.Driver, dev driver.DeviceID) (*Stream, error) {
	st, err := streamsOf(d, "new stream")
	if err != nil {
		return nil, err
	}
	id, err := st.CreateStream(dev)
	if err != nil {
		return nil, errors.Wrap(err, "stream: new stream")
	}
	return &Stream{d: d, st: st, id: id, dev: dev, clock: map[*Stream]uint64{}}, nil
}

// Driver is the stream's driver.
func (s *Stream) Driver() driver.Driver {
	if s.unmade() {
		return nil
	}
	return s.d
}

// Device is the device the stream runs on.
func (s *Stream) Device() driver.DeviceID {
	if s.unmade() {
		return 0
	}
	return s.dev
}

// ID is the driver's handle of the stream.
func (s *Stream) ID() driver.Stream {
	if s.unmade() {
		return 0
	}
	return s.id
}

func (s *Stream) String() string {
	if s.unmade() {
		return "stream (not made by stream.New)"
	}
	return fmt.Sprintf("stream %d (device %d)", s.id, s.dev)
}

// Destroyed reports whether Destroy has been called on s: from then on
// every call on s is ErrClosed, and code that takes a stream (a pool's
// MallocAsync) refuses it the same way.
func (s *Stream) Destroyed() bool {
	if s.unmade() {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Position is the number of operations enqueued through s so far.
func (s *Stream) Position() uint64 {
	if s.unmade() {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pos
}

// OrderedAfter reports whether work enqueued on s from now on runs after
// the first pos operations of t: t is s itself, or s has waited on an event
// recorded on t at or after pos (directly or through other streams). For
// a destroyed t it may answer false where s did wait: s forgets the
// streams destroyed (see the package doc), and false is the cautious
// answer.
func (s *Stream) OrderedAfter(t *Stream, pos uint64) bool {
	if s == t {
		return true
	}
	if s.unmade() {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.clock[t] >= pos
}

// enqueue runs do (which enqueues one driver operation) and counts it.
func (s *Stream) enqueue(what string, do func() error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return driver.Closed(fmt.Sprintf("stream: %s on destroyed %s", what, s))
	}
	if err := do(); err != nil {
		return errors.Wrapf(err, "stream: %s on %s", what, s)
	}
	s.pos++
	return nil
}

// Record marks the current end of s in e.
func (s *Stream) Record(e *Event) error {
	if s.unmade() {
		return unmade("Stream.Record", "New")
	}
	if e == nil {
		return errors.Wrapf(driver.ErrInvalid, "stream: record on %s: no event (nil)", s)
	}
	if e.unmade() {
		return unmade("Stream.Record of an Event", "NewEvent")
	}
	if e.d != s.d {
		return errors.Wrap(driver.ErrInvalid, "stream: record of an event of another driver")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return driver.Closed("stream: record of a destroyed event")
	}
	var clock map[*Stream]uint64
	err := s.enqueue("record event", func() error {
		if err := s.st.RecordEvent(e.id, s.id); err != nil {
			return err
		}
		s.forgetGoneLocked()
		clock = maps.Clone(s.clock)
		clock[s] = s.pos + 1 // this record is the (pos+1)-th operation
		return nil
	})
	if err != nil {
		return err
	}
	e.clock, e.src = clock, s
	return nil
}

// Wait makes work enqueued on s from now on wait for e as last recorded.
func (s *Stream) Wait(e *Event) error {
	if s.unmade() {
		return unmade("Stream.Wait", "New")
	}
	if e == nil {
		return errors.Wrapf(driver.ErrInvalid, "stream: wait on %s: no event (nil)", s)
	}
	if e.unmade() {
		return unmade("Stream.Wait on an Event", "NewEvent")
	}
	if e.d != s.d {
		return errors.Wrap(driver.ErrInvalid, "stream: wait on an event of another driver")
	}
	// e stays locked until the driver has the wait: a Record of e on
	// another stream in between would make the driver wait for that record
	// while s learned the clock of the one before.
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return driver.Closed("stream: wait on a destroyed event")
	}
	clock := e.clock
	return s.enqueue("wait on event", func() error {
		if err := s.st.StreamWaitEvent(s.id, e.id); err != nil {
			return err
		}
		s.forgetGoneLocked()
		for t, p := range clock {
			if t != s && p > s.clock[t] {
				s.clock[t] = p
			}
		}
		return nil
	})
}

// Launch enqueues fn, a host function named name in errors: the host
// driver's kind of kernel.
func (s *Stream) Launch(name string, fn func() error) error {
	if s.unmade() {
		return unmade("Stream.Launch", "New")
	}
	return s.enqueue("launch "+name, func() error { return s.st.LaunchHostFunc(s.id, name, fn) })
}

// Synchronize waits for everything enqueued on s, returns the first
// failure of that work (naming the operation), then runs the driver's
// synchronize hooks. Called from inside a synchronize hook it is refused
// (ErrInvalid): it would run the hooks again, without end.
func (s *Stream) Synchronize() error {
	if s.unmade() {
		return unmade("Stream.Synchronize", "New")
	}
	if err := inHook(func() string { return fmt.Sprintf("stream: synchronize %s", s) }); err != nil {
		return err
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return driver.Closed(fmt.Sprintf("stream: synchronize of destroyed %s", s))
	}
	err := s.raced(s.st.SyncStream(s.id), "synchronize")
	if waited(err) {
		err = errors.CombineErrors(err, runHooks(s.d))
	}
	if err != nil {
		return errors.Wrapf(err, "stream: synchronize %s", s)
	}
	return nil
}

// raced is err, the driver's answer to op on s, or ErrClosed where the
// driver no longer knew s (ErrBadHandle) because a Destroy ran meanwhile:
// the caller's race with the destroy reads as the destroyed stream it is.
func (s *Stream) raced(err error, op string) error {
	if errors.Is(err, driver.ErrBadHandle) && s.Destroyed() {
		return driver.Closed(fmt.Sprintf("stream: %s of %s: destroyed meanwhile", op, s))
	}
	return err
}

// waited reports whether a synchronize that returned err waited: it
// succeeded, or reported a failure of the work it waited for. A refusal
// — the stream or event is gone (ErrBadHandle, ErrClosed), or the caller
// is a host function the wait would be for (ErrBusy) — waited for nothing,
// so the synchronize hooks do not run: a refused call changes nothing,
// and hooks (which take pools' locks) must not run inside a host function
// that is refused for waiting on itself. Work that failed with one of
// these sentinels skips the hooks too; they run at the next synchronize.
func waited(err error) bool {
	return err == nil || !errors.IsAny(err, driver.ErrBusy, driver.ErrBadHandle, driver.ErrClosed)
}

// Query reports whether everything enqueued on s has run, and the first
// failure if so.
func (s *Stream) Query() (bool, error) {
	if s.unmade() {
		return false, unmade("Stream.Query", "New")
	}
	if s.Destroyed() {
		return false, driver.Closed(fmt.Sprintf("stream: query of destroyed %s", s))
	}
	done, err := s.st.QueryStream(s.id)
	if err != nil {
		return false, errors.Wrapf(s.raced(err, "query"), "stream: query %s", s)
	}
	return done, nil
}

// Destroy waits for the stream's work, reports any failure not yet
// reported, and destroys it. From the moment it is called nothing more is
// enqueued through s (ErrClosed); it waits without s's lock, so a host
// function of s that enqueues on s meanwhile is refused rather than
// deadlocked. Called from a host function of s (or of work s waits for)
// it is refused with ErrBusy, and s lives on.
func (s *Stream) Destroy() error {
	if s.unmade() {
		return unmade("Stream.Destroy", "New")
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return driver.Closed(fmt.Sprintf("stream: destroy of destroyed %s", s))
	}
	s.closed = true
	s.mu.Unlock()
	err := s.st.DestroyStream(s.id)
	if errors.Is(err, driver.ErrBusy) && s.alive() {
		// Refused: the caller is a host function the destroy would wait
		// for. Nothing changed, s included.
		s.mu.Lock()
		s.closed = false
		s.mu.Unlock()
		return errors.Wrapf(err, "stream: destroy %s", s)
	}
	s.gone.Store(true)
	return errors.Wrapf(err, "stream: destroy %s", s)
}

// alive reports whether the driver still has s, after a DestroyStream that
// failed with ErrBusy: refused (alive), or a destroy that reported a
// failure of s's work marked ErrBusy (gone). A refused destroy leaves s
// unfinished — it runs or waits for its caller — so the query reports no
// failure that a later synchronize should have.
func (s *Stream) alive() bool {
	_, err := s.st.QueryStream(s.id)
	return !errors.IsAny(err, driver.ErrBadHandle, driver.ErrClosed)
}

// CopyHtoD enqueues a copy of src to dst; src must be left alone until
// the stream has passed the copy.
func (s *Stream) CopyHtoD(dst driver.Addr, src []byte) error {
	if s.unmade() {
		return unmade("Stream.CopyHtoD", "New")
	}
	return s.enqueue("copy to device", func() error { return s.st.CopyHtoD(dst, src, s.id) })
}

// CopyDtoH enqueues a copy of device memory at src into dst.
func (s *Stream) CopyDtoH(dst []byte, src driver.Addr) error {
	if s.unmade() {
		return unmade("Stream.CopyDtoH", "New")
	}
	return s.enqueue("copy from device", func() error { return s.st.CopyDtoH(dst, src, s.id) })
}

// CopyDtoD enqueues a copy of n bytes between device addresses (of one
// device, or of two with peer access enabled).
func (s *Stream) CopyDtoD(dst, src driver.Addr, n uint64) error {
	if s.unmade() {
		return unmade("Stream.CopyDtoD", "New")
	}
	return s.enqueue("copy device to device", func() error { return s.st.CopyDtoD(dst, src, n, s.id) })
}

// Memset enqueues a fill of n bytes at dst with value.
func (s *Stream) Memset(dst driver.Addr, value byte, n uint64) error {
	if s.unmade() {
		return unmade("Stream.Memset", "New")
	}
	return s.enqueue("fill", func() error { return s.st.Memset(dst, value, n, s.id) })
}

// CopyHtoH enqueues a copy between two host buffers, in stream order.
func (s *Stream) CopyHtoH(dst, src []byte) error {
	if s.unmade() {
		return unmade("Stream.CopyHtoH", "New")
	}
	if len(dst) != len(src) {
		return errors.Wrapf(driver.ErrInvalid, "stream: copy host to host: %d bytes into %d", len(src), len(dst))
	}
	return s.Launch("copy host to host", func() error { copy(dst, src); return nil })
}

// The synchronous copies enqueue and then synchronize the stream: they
// return once the bytes have moved, with any failure of the stream's work.

// CopyHtoDSync copies src to dst and waits.
func (s *Stream) CopyHtoDSync(dst driver.Addr, src []byte) error {
	if s.unmade() {
		return unmade("Stream.CopyHtoDSync", "New")
	}
	return s.andSync(s.CopyHtoD(dst, src))
}

// CopyDtoHSync copies device memory at src into dst and waits.
func (s *Stream) CopyDtoHSync(dst []byte, src driver.Addr) error {
	if s.unmade() {
		return unmade("Stream.CopyDtoHSync", "New")
	}
	return s.andSync(s.CopyDtoH(dst, src))
}

// CopyDtoDSync copies n bytes between device addresses and waits.
func (s *Stream) CopyDtoDSync(dst, src driver.Addr, n uint64) error {
	if s.unmade() {
		return unmade("Stream.CopyDtoDSync", "New")
	}
	return s.andSync(s.CopyDtoD(dst, src, n))
}

// MemsetSync fills n bytes at dst with value and waits.
func (s *Stream) MemsetSync(dst driver.Addr, value byte, n uint64) error {
	if s.unmade() {
		return unmade("Stream.MemsetSync", "New")
	}
	return s.andSync(s.Memset(dst, value, n))
}

// CopyHtoHSync copies between host buffers after the stream's earlier
// work, and waits.
func (s *Stream) CopyHtoHSync(dst, src []byte) error {
	if s.unmade() {
		return unmade("Stream.CopyHtoHSync", "New")
	}
	return s.andSync(s.CopyHtoH(dst, src))
}

func (s *Stream) andSync(err error) error {
	if err != nil {
		return err
	}
	return s.Synchronize()
}

// Event is a point in a stream.
type Event struct {
	d   driver.Driver
	st  driver.Streams
	id  driver.Event
	dev driver.DeviceID

	mu     lockrank.Mutex[lockrank.StreamEvent]
	src    *Stream
	clock  map[*Stream]uint64
	closed bool
}

// NewEvent creates an event of dev.
func NewEvent(d driver.Driver, dev driver.DeviceID) (*Event, error) {
	st, err := streamsOf(d, "new event")
	if err != nil {
		return nil, err
	}
	id, err := st.CreateEvent(dev)
	if err != nil {
		return nil, errors.Wrap(err, "stream: new event")
	}
	return &Event{d: d, st: st, id: id, dev: dev}, nil
}

// ID is the driver's handle of the event.
func (e *Event) ID() driver.Event {
	if e.unmade() {
		return 0
	}
	return e.id
}

// destroyed returns ErrClosed, naming what was asked, once Destroy has
// been called on e. The driver would answer ErrBadHandle; a destroyed
// event is closed like a destroyed stream.
func (e *Event) destroyed(what string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return driver.Closed("stream: " + what + " of a destroyed event")
	}
	return nil
}

// Synchronize waits for the event as last recorded, then runs the
// driver's synchronize hooks. Called from inside a synchronize hook it is
// refused (ErrInvalid): a hook waits with WaitDone.
func (e *Event) Synchronize() error {
	if e.unmade() {
		return unmade("Event.Synchronize", "NewEvent")
	}
	if err := inHook(func() string { return "stream: synchronize event" }); err != nil {
		return err
	}
	if err := e.destroyed("synchronize"); err != nil {
		return err
	}
	err := e.raced(e.st.SyncEvent(e.id), "synchronize")
	if waited(err) {
		err = errors.CombineErrors(err, runHooks(e.d))
	}
	return errors.Wrap(err, "stream: synchronize event")
}

// raced is err, the driver's answer to op on e, or ErrClosed where the
// driver no longer knew e (ErrBadHandle) because a Destroy ran meanwhile.
func (e *Event) raced(err error, op string) error {
	if errors.Is(err, driver.ErrBadHandle) && e.destroyed(op) != nil {
		return driver.Closed("stream: " + op + " of an event destroyed meanwhile")
	}
	return err
}

// WaitDone waits for the event as last recorded without running the
// synchronize hooks: for code that runs under its own lock and is itself
// a hook (a pool waiting for its frees).
func (e *Event) WaitDone() error {
	if e.unmade() {
		return unmade("Event.WaitDone", "NewEvent")
	}
	if err := e.destroyed("wait"); err != nil {
		return err
	}
	return errors.Wrap(e.raced(e.st.SyncEvent(e.id), "wait"), "stream: wait for event")
}

// Query reports whether the event as last recorded has completed.
func (e *Event) Query() (bool, error) {
	if e.unmade() {
		return false, unmade("Event.Query", "NewEvent")
	}
	if err := e.destroyed("query"); err != nil {
		return false, err
	}
	done, err := e.st.QueryEvent(e.id)
	if err != nil {
		return false, errors.Wrap(e.raced(err, "query"), "stream: query event")
	}
	return done, nil
}

// Destroy destroys the event; work already waiting on it completes.
func (e *Event) Destroy() error {
	if e.unmade() {
		return unmade("Event.Destroy", "NewEvent")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return driver.Closed("stream: destroy of a destroyed event")
	}
	e.closed = true
	return errors.Wrap(e.st.DestroyEvent(e.id), "stream: destroy event")
}

// Elapsed is the time between two completed events.
func Elapsed(start, end *Event) (time.Duration, error) {
	if start == nil || end == nil {
		return 0, errors.Wrap(driver.ErrInvalid, "stream: elapsed time: no event (nil)")
	}
	if start.unmade() || end.unmade() {
		return 0, unmade("Elapsed of an Event", "NewEvent")
	}
	if start.d != end.d {
		return 0, errors.Wrap(driver.ErrInvalid, "stream: elapsed time between events of two drivers")
	}
	for _, e := range []*Event{start, end} {
		if err := e.destroyed("elapsed time"); err != nil {
			return 0, err
		}
	}
	d, err := start.st.ElapsedTime(start.id, end.id)
	return d, errors.Wrap(err, "stream: elapsed time")
}

// Hooks.

// hooks are the synchronize hooks, by driver. Every key is comparable
// (OnSynchronize checks), so map access cannot panic. mu is a leaf lock:
// runHooks copies the functions and calls them after unlocking, so a hook
// may take its own locks, and a caller holding its own lock may cancel.
//
// running counts, by goroutine, the runHooks calls in progress on it, and
// nrunning their total (read without mu, so that a synchronize with no
// hook running anywhere costs one atomic load). A hook runs on the
// goroutine that synchronized, so a synchronize on a goroutine with hooks
// running is one called from inside a hook: it would run the hooks again,
// and a hook that always synchronizes would recurse until the stack
// overflowed, a fatal error. It is refused instead (inHook).
var hooks struct {
	mu       lockrank.Mutex[lockrank.StreamHooks]
	next     int
	fns      map[driver.Driver]map[int]func()
	running  map[uint64]int
	nrunning atomic.Int32
}

// inHook returns ErrInvalid when the calling goroutine is running
// synchronize hooks.
func inHook(what func() string) error {
	if hooks.nrunning.Load() == 0 {
		return nil
	}
	g := goroutineID()
	hooks.mu.Lock()
	n := hooks.running[g]
	hooks.mu.Unlock()
	if n == 0 {
		return nil
	}
	return errors.WithHint(
		errors.Wrapf(driver.ErrInvalid, "%s: called inside a synchronize hook, where it would run the hooks again, without end", what()),
		"a hook waits for an event with Event.WaitDone, which runs no hooks")
}

// goroutineID is the calling goroutine's number, read from the first line
// of its stack trace ("goroutine 18 [running]:"): Go gives goroutines no
// other identity, and a synchronize from inside a hook is told apart from
// one on another goroutine (which must run) by it alone. It is read only
// while hooks run somewhere.
func goroutineID() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	var id uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			break
		}
		id = id*10 + uint64(c-'0')
	}
	return id
}

// OnSynchronize registers fn to run after every stream or event
// synchronize on d returns; the returned function unregisters it. A
// driver that cannot key a map (driver.CheckComparable) is ErrInvalid.
// A hook that panics makes the synchronize return the panic as an error
// (ErrInvalid, after the work's own failure if any); the other hooks run
// all the same. A stream or event synchronize that a hook calls is
// refused (ErrInvalid) rather than run the hooks again.
func OnSynchronize(d driver.Driver, fn func()) (cancel func(), err error) {
	if err := driver.CheckComparable(func() string { return "stream: on synchronize" }, d); err != nil {
		return nil, err
	}
	if fn == nil {
		return nil, errors.Wrap(driver.ErrInvalid, "stream: on synchronize: the hook is nil")
	}
	hooks.mu.Lock()
	defer hooks.mu.Unlock()
	if hooks.fns == nil {
		hooks.fns = map[driver.Driver]map[int]func(){}
	}
	if hooks.fns[d] == nil {
		hooks.fns[d] = map[int]func(){}
	}
	hooks.next++
	k := hooks.next
	hooks.fns[d][k] = fn
	return func() {
		hooks.mu.Lock()
		defer hooks.mu.Unlock()
		delete(hooks.fns[d], k)
		if len(hooks.fns[d]) == 0 {
			delete(hooks.fns, d)
		}
	}, nil
}

// runHooks runs d's synchronize hooks, every one of them even if some
// panic: a panic is recovered and returned as an error (ErrInvalid: a hook
// has no way to fail but to panic, and must not), so a bad hook neither
// takes down the goroutine that synchronized nor keeps the others from
// running. No lock is held while hooks run.
func runHooks(d driver.Driver) error {
	hooks.mu.Lock()
	fns := make([]func(), 0, len(hooks.fns[d]))
	for _, fn := range hooks.fns[d] {
		fns = append(fns, fn)
	}
	hooks.mu.Unlock()
	if len(fns) == 0 {
		return nil
	}
	g := goroutineID()
	hooks.mu.Lock()
	if hooks.running == nil {
		hooks.running = map[uint64]int{}
	}
	hooks.running[g]++
	hooks.nrunning.Add(1)
	hooks.mu.Unlock()
	defer func() {
		hooks.mu.Lock()
		if hooks.running[g]--; hooks.running[g] == 0 {
			delete(hooks.running, g)
		}
		hooks.nrunning.Add(-1)
		hooks.mu.Unlock()
	}()
	var errs error
	for _, fn := range fns {
		errs = errors.CombineErrors(errs, runHook(fn))
	}
	return errs
}

func runHook(fn func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = errors.WithHint(errors.Wrapf(driver.ErrInvalid, "stream: synchronize hook panicked: %v", r),
				"a hook registered with OnSynchronize must not panic")
		}
	}()
	fn()
	return nil
}

// HostBuffer is pinned host memory from the driver, with starts aligned
// for async copies (64 bytes at least). Safe for concurrent use. A nil or
// zero HostBuffer has no bytes, and Free refuses it with ErrInvalid.
type HostBuffer struct {
	st driver.Streams

	// mu guards bytes and freeing. It is not held while Free waits for
	// the driver: a host function queued before the Free may call Bytes.
	mu      lockrank.Mutex[lockrank.StreamHostBuffer]
	bytes   []byte // nil once freed
	freeing bool   // a Free is under way: Bytes answers nil
}

// NewHostBuffer allocates size bytes of pinned host memory.
func NewHostBuffer(d driver.Driver, size uint64) (*HostBuffer, error) {
	st, err := streamsOf(d, "new host buffer")
	if err != nil {
		return nil, err
	}
	b, err := st.HostAlloc(size)
	if err != nil {
		return nil, errors.Wrap(err, "stream: new host buffer")
	}
	return &HostBuffer{st: st, bytes: b}, nil
}

// Bytes is the buffer's memory; nil from the moment Free is called, so
// that no caller gets memory about to go back to the driver (a refused
// Free gives it back). A slice taken before Free must be left alone from
// then on.
func (h *HostBuffer) Bytes() []byte {
	if h.unmade() {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.freeing {
		return nil
	}
	return h.bytes
}

// Free returns the buffer to the driver. Like cudaFreeHost, it first
// waits for the work enqueued on the driver's streams so far, so that a
// copy still queued on the buffer lands before the memory goes (and never
// in a buffer the driver hands out next). From a host function that work
// waits for — the caller's own stream, say — it cannot wait: it is refused
// with ErrBusy and the buffer stays as it was. Freeing twice is ErrClosed,
// a Free while another is under way ErrBusy.
func (h *HostBuffer) Free() error {
	if h.unmade() {
		return errors.Wrap(driver.ErrInvalid, "stream: free of a host buffer not made by NewHostBuffer (nil or zero)")
	}
	h.mu.Lock()
	b := h.bytes
	switch {
	case b == nil:
		h.mu.Unlock()
		return driver.Closed("stream: free of a freed host buffer")
	case h.freeing:
		h.mu.Unlock()
		return errors.Wrap(driver.ErrBusy, "stream: free of a host buffer another Free is freeing")
	}
	h.freeing = true
	h.mu.Unlock()
	err := h.st.HostFree(b)
	h.mu.Lock()
	h.freeing = false
	if !errors.Is(err, driver.ErrBusy) {
		// Given back, or gone already: a driver that refuses (ErrClosed,
		// ErrInvalid) has taken its buffers back at Close.
		h.bytes = nil
	}
	h.mu.Unlock()
	return errors.Wrap(err, "stream: free host buffer")
}
