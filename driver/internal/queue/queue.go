// Package queue runs the streams and events of a driver that executes its
// asynchronous work on the host: each stream is a goroutine draining an
// ordered queue of operations; an event is a generation counter that an
// operation in a stream's queue completes. The host and sim drivers share
// it and add their own operations (copies, fills) through Enqueue. Each
// keeps its Engine in an unexported field and declares the Streams methods
// itself: Enqueue, StreamDevice, PeerEnabled and Closed are for the
// drivers, never for their callers.
//
// Invariants: a stream runs its operations one at a time in enqueue order;
// done <= enq. Each recording of an event is its own point, completed by
// its own operation: a wait holds the point current when it was enqueued,
// so re-recording an event elsewhere never releases earlier waiters early.
// Record and wait operations always run, even after a failure in their
// stream, so that no event is left for ever incomplete; other operations
// after a failure are skipped until the failure is reported. Operations
// run caller code: a panic in one is its failure, and a runtime.Goexit in
// one fails it and hands the stream to a new goroutine; neither leaves the
// lock held nor the stream without a goroutine. A memory fault in one is
// a panic too (the streams' goroutines run with SetPanicOnFault), and its
// failure is ErrAccessDenied. A call that would wait for the host function
// making it (selfwait.go) is refused instead.
//
// The engine never touches device memory itself; operations do.
package queue

import (
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/lockrank"
)

type op struct {
	name    string
	run     func() error
	control bool   // record/wait: runs even after a failure
	wait    *point // a wait's point (nil for other operations, and for a wait on an event never recorded)
}

// stream is one queue and the goroutine that runs it. Operations are
// numbered from 1 in enqueue order: the first done have finished; while
// running is set, operation done+1 is cur and runs without the lock, and
// queue holds done+2 to enq; otherwise queue holds done+1 to enq.
type stream struct {
	id       driver.Stream
	dev      driver.DeviceID
	queue    []op
	enq      uint64 // operations enqueued
	done     uint64 // operations finished (run or skipped)
	running  bool   // operation done+1 is running, outside the lock
	cur      op     // while running: that operation
	blocked  *need  // while cur, a host function, waits in a call to the engine: what it waits for
	err      error  // first failure not yet reported
	skipped  int    // operations skipped since err
	quit     bool
	finished chan struct{}
}

// need is what a wait waits for: st has finished its first pos operations.
type need struct {
	st  *stream
	pos uint64
}

type event struct {
	id     driver.Event
	dev    driver.DeviceID
	latest *point // the last recording; nil if never recorded
}

// point is one recording of an event: done when the stream reached it,
// the record operation numbered pos in st.
type point struct {
	done bool
	at   time.Time
	st   *stream
	pos  uint64
}

// doneLocked reports whether a (possibly nil: never recorded) point is done.
func (p *point) doneLocked() bool { return p == nil || p.done }

// Engine is the streams and events of one driver.
type Engine struct {
	name    string
	ndev    int
	canPeer func(dev, peer driver.DeviceID) bool

	mu      lockrank.Mutex[lockrank.QueueEngine]
	cond    *sync.Cond // broadcast whenever an operation finishes
	streams map[driver.Stream]*stream
	events  map[driver.Event]*event
	next    uint64
	peers   map[[2]driver.DeviceID]bool
	closing bool // Close has begun: nothing new is created or enqueued
	closed  bool // Close has finished
	// workers are the streams' goroutines, by goroutine id (goid), each
	// until it ends: destroyed streams' too, while they drain.
	workers map[uint64]*stream
	// hostRunning counts the streams running an operation other than a
	// record or wait: while it is zero no call can come from one.
	hostRunning int
}

// New returns an engine for ndev devices; canPeer says which pairs of
// devices could have peer access.
func New(name string, ndev int, canPeer func(dev, peer driver.DeviceID) bool) *Engine {
	e := &Engine{name: name, ndev: ndev, canPeer: canPeer, streams: map[driver.Stream]*stream{},
		events: map[driver.Event]*event{}, peers: map[[2]driver.DeviceID]bool{}, workers: map[uint64]*stream{}}
	e.cond = sync.NewCond(&e.mu)
	return e
}

func (e *Engine) errClosed(op string) error { return driver.Closed(e.name + ": " + op) }

// Closed reports whether Close has begun.
func (e *Engine) Closed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.closing
}

func (e *Engine) stream(what string, s driver.Stream) (*stream, error) {
	if e.closing {
		return nil, e.errClosed(what)
	}
	st := e.streams[s]
	if st == nil {
		return nil, errors.Wrapf(driver.ErrBadHandle, "%s: %s: stream %d is unknown or destroyed", e.name, what, s)
	}
	return st, nil
}

func (e *Engine) event(what string, ev driver.Event) (*event, error) {
	if e.closing {
		return nil, e.errClosed(what)
	}
	x := e.events[ev]
	if x == nil {
		return nil, errors.Wrapf(driver.ErrBadHandle, "%s: %s: event %d is unknown or destroyed", e.name, what, ev)
	}
	return x, nil
}

// CreateStream implements driver.Streams.
func (e *Engine) CreateStream(dev driver.DeviceID) (driver.Stream, error) {
	if err := driver.CheckDevice(func() string { return e.name + ": create stream" }, dev, e.ndev); err != nil {
		return 0, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closing {
		return 0, e.errClosed("create stream")
	}
	e.next++
	st := &stream{id: driver.Stream(e.next), dev: dev, finished: make(chan struct{})}
	e.streams[st.id] = st
	go e.work(st)
	return st.id, nil
}

// work runs st's operations in order until st quits with nothing queued.
// It holds e.mu except while an operation runs.
func (e *Engine) work(st *stream) {
	// A host function may touch device memory the host may not (anymore):
	// on this goroutine the fault is a panic, which run makes the
	// operation's failure, instead of the end of the process.
	debug.SetPanicOnFault(true)
	gid := goid()
	e.mu.Lock()
	if gid != 0 {
		e.workers[gid] = st
	}
	for {
		for len(st.queue) == 0 && !st.quit {
			e.cond.Wait()
		}
		if len(st.queue) == 0 {
			delete(e.workers, gid)
			e.mu.Unlock()
			close(st.finished)
			return
		}
		o := st.queue[0]
		st.queue[0] = op{} // the queue's array must not keep the function alive
		st.queue = st.queue[1:]
		if st.err != nil && !o.control {
			st.skipped++
			st.done++
			e.cond.Broadcast()
			continue
		}
		st.running, st.cur = true, o
		if !o.control {
			e.hostRunning++
		}
		e.mu.Unlock()
		handedOff, err := e.run(st, o, gid)
		if handedOff {
			return // the operation ended this goroutine's turn: another runs st now
		}
		e.mu.Lock()
		e.finishLocked(st, err)
	}
}

// finishLocked counts st's running operation as finished with err.
func (e *Engine) finishLocked(st *stream, err error) {
	o := st.cur
	if err != nil && st.err == nil {
		st.err = errors.Wrapf(err, "%s: stream %d: operation %d (%s) failed", e.name, st.id, st.done+1, o.name)
	}
	if !o.control {
		e.hostRunning--
	}
	st.running, st.cur, st.blocked = false, op{}, nil
	st.done++
	e.cond.Broadcast()
}

// run runs o without the lock and returns its error. Operations run
// caller code (host functions), so run survives whatever that code does:
// a panic is recovered and becomes the operation's failure; a
// runtime.Goexit (which t.FailNow, t.Fatal and t.SkipNow call) cannot be
// stopped and ends this goroutine, so run finishes the operation itself,
// with a failure, and starts another goroutine for st: handedOff tells
// the caller, should it return at all, that st is no longer its own.
func (e *Engine) run(st *stream, o op, gid uint64) (handedOff bool, err error) {
	returned := false
	defer func() {
		if returned {
			return
		}
		if r := recover(); r != nil {
			err = panicked(r)
			return
		}
		// runtime.Goexit, or a panic(nil) recovered above as nil (only
		// under GODEBUG=panicnil=1): either way this goroutine lets st go.
		e.mu.Lock()
		e.finishLocked(st, errors.WithHint(
			errors.Wrap(driver.ErrInvalid, "called runtime.Goexit (or panicked with nil)"),
			"t.FailNow, t.Fatal and t.SkipNow call runtime.Goexit: in a host function, return an error instead"))
		delete(e.workers, gid)
		go e.work(st)
		e.mu.Unlock()
		handedOff, err = true, nil
	}()
	err = o.run()
	returned = true
	return false, err
}

// panicked is the failure of an operation that panicked with r: marked
// ErrInvalid, since work handed to a stream reports failure by returning
// an error, and a function that panics is not one a stream can run — or,
// for a memory fault, ErrAccessDenied, as for a copy that faults. When r
// is an error it is kept as the secondary error, shown by %+v, so the
// failure still has exactly one sentinel; the stack of the wrap is the
// panic's, as recover runs on top of the panicking frames.
func panicked(r any) error {
	if f, ok := r.(interface{ Addr() uintptr }); ok {
		return errors.Wrapf(driver.ErrAccessDenied, "memory fault at %#x", f.Addr())
	}
	err := errors.Wrapf(driver.ErrInvalid, "panic: %v", r)
	if re, ok := r.(error); ok {
		err = errors.WithSecondaryError(err, re)
	}
	return errors.WithHint(err, "a host function reports failure by returning an error, not by panicking")
}

// Enqueue adds an operation to s; it runs after everything enqueued on s
// before it. name identifies it in errors.
func (e *Engine) Enqueue(s driver.Stream, name string, run func() error) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.enqueueLocked(s, op{name: name, run: run})
}

func (e *Engine) enqueueLocked(s driver.Stream, o op) error {
	st, err := e.stream("enqueue "+o.name, s)
	if err != nil {
		return err
	}
	st.queue = append(st.queue, o)
	st.enq++
	e.cond.Broadcast()
	return nil
}

// StreamDevice is the device s runs on.
func (e *Engine) StreamDevice(s driver.Stream) (driver.DeviceID, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	st, err := e.stream("device of stream", s)
	if err != nil {
		return 0, err
	}
	return st.dev, nil
}

// syncLocked waits until st has finished everything enqueued so far and
// returns (and clears) its unreported failure. Close uses it.
func (e *Engine) syncLocked(st *stream) error {
	target := st.enq
	for st.done < target {
		e.cond.Wait()
	}
	return e.reportLocked(st)
}

// waitStreamLocked waits until st has finished everything enqueued so far,
// unless the caller is a host function that this would wait for: then it
// returns the refusal at once, having waited for nothing.
func (e *Engine) waitStreamLocked(what string, st *stream) error {
	target := st.enq
	if st.done >= target {
		return nil
	}
	return e.waitLocked(what, need{st, target}, func() bool { return st.done >= target })
}

func (e *Engine) reportLocked(st *stream) error {
	err := st.err
	if err != nil && st.skipped > 0 {
		err = errors.Wrapf(err, "%d later operation(s) skipped", st.skipped)
	}
	st.err, st.skipped = nil, 0
	return err
}

// Drain waits until every stream — destroyed ones still running their
// last work included — has finished the work enqueued on it before the
// call, and reports no failure of that work: what a pinned host buffer's
// free needs before giving the memory back (cuMemFreeHost synchronizes
// the same way), so that no copy queued on the buffer lands in memory
// handed out again. After Close it is ErrClosed.
//
// From a host function the work before it on its own stream has run, and
// it does not wait for itself; but work queued behind it, or on another
// stream ordered after it, cannot run until it returns: then Drain is
// refused at once with ErrBusy, having waited for nothing.
func (e *Engine) Drain(what string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closing {
		return e.errClosed(what)
	}
	// The live streams, and the destroyed ones whose goroutines still run
	// their last work.
	sts := make([]*stream, 0, len(e.streams)+len(e.workers))
	for _, st := range e.streams {
		sts = append(sts, st)
	}
	for _, st := range e.workers {
		if e.streams[st.id] != st {
			sts = append(sts, st)
		}
	}
	caller := e.callerLocked()
	var needs []need
	for _, st := range sts {
		n := need{st, st.enq}
		switch {
		case st.done >= st.enq:
		case st == caller && st.enq == st.done+1: // the caller itself, and nothing behind it
		case caller != nil && e.waitsForLocked(caller, n):
			return e.selfWaitErr(what, caller, n)
		default:
			needs = append(needs, n)
		}
	}
	for _, n := range needs {
		if err := e.waitLocked(what, n, func() bool { return n.st.done >= n.pos }); err != nil {
			return err
		}
	}
	return nil
}

// SyncStream implements driver.Streams.
func (e *Engine) SyncStream(s driver.Stream) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	st, err := e.stream("synchronize stream", s)
	if err != nil {
		return err
	}
	if err := e.waitStreamLocked("synchronize stream", st); err != nil {
		return err
	}
	return e.reportLocked(st)
}

// QueryStream implements driver.Streams.
func (e *Engine) QueryStream(s driver.Stream) (bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	st, err := e.stream("query stream", s)
	if err != nil {
		return false, err
	}
	if st.done < st.enq {
		return false, nil
	}
	return true, e.reportLocked(st)
}

// DestroyStream implements driver.Streams.
func (e *Engine) DestroyStream(s driver.Stream) error {
	e.mu.Lock()
	st, err := e.stream("destroy stream", s)
	if err != nil {
		e.mu.Unlock()
		return err
	}
	if err := e.waitStreamLocked("destroy stream", st); err != nil {
		e.mu.Unlock()
		return err // refused: nothing changed
	}
	err = e.reportLocked(st)
	delete(e.streams, s)
	st.quit = true
	e.cond.Broadcast()
	// The goroutine ends once it has run what was enqueued while this
	// call waited; a host function does not wait for that if it is work
	// that would wait for the host function itself.
	caller := e.callerLocked()
	drain := caller == nil || !e.waitsForLocked(caller, need{st, st.enq})
	e.mu.Unlock()
	if drain {
		<-st.finished
	}
	return err
}

// CreateEvent implements driver.Streams.
func (e *Engine) CreateEvent(dev driver.DeviceID) (driver.Event, error) {
	if err := driver.CheckDevice(func() string { return e.name + ": create event" }, dev, e.ndev); err != nil {
		return 0, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closing {
		return 0, e.errClosed("create event")
	}
	e.next++
	x := &event{id: driver.Event(e.next), dev: dev}
	e.events[x.id] = x
	return x.id, nil
}

// DestroyEvent implements driver.Streams. Work already waiting on the
// event still completes as if it were live.
func (e *Engine) DestroyEvent(ev driver.Event) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, err := e.event("destroy event", ev); err != nil {
		return err
	}
	delete(e.events, ev)
	return nil
}

// RecordEvent implements driver.Streams.
func (e *Engine) RecordEvent(ev driver.Event, s driver.Stream) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	x, err := e.event("record event", ev)
	if err != nil {
		return err
	}
	st, err := e.stream("record event", s)
	if err != nil {
		return err
	}
	if x.dev != st.dev {
		return errors.Wrapf(driver.ErrInvalid, "%s: record event %d of device %d on stream %d of device %d", e.name, ev, x.dev, s, st.dev)
	}
	pt := &point{st: st, pos: st.enq + 1} // the record is st's next operation
	// Constant names: records and waits never fail, and formatting one per
	// call showed in the pool's profile.
	if err := e.enqueueLocked(s, op{name: "record event", control: true, run: func() error {
		e.mu.Lock()
		pt.done, pt.at = true, time.Now()
		e.mu.Unlock()
		return nil
	}}); err != nil {
		return err
	}
	x.latest = pt
	return nil
}

// StreamWaitEvent implements driver.Streams. Streams of any device may
// wait on any event.
func (e *Engine) StreamWaitEvent(s driver.Stream, ev driver.Event) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	x, err := e.event("stream wait event", ev)
	if err != nil {
		return err
	}
	pt := x.latest
	return e.enqueueLocked(s, op{name: "wait for event", control: true, wait: pt, run: func() error {
		e.mu.Lock()
		for !pt.doneLocked() && !e.closed {
			e.cond.Wait()
		}
		e.mu.Unlock()
		return nil
	}})
}

// SyncEvent implements driver.Streams.
func (e *Engine) SyncEvent(ev driver.Event) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	x, err := e.event("synchronize event", ev)
	if err != nil {
		return err
	}
	pt := x.latest
	if pt.doneLocked() {
		return nil
	}
	return e.waitLocked("synchronize event", need{pt.st, pt.pos}, func() bool { return pt.doneLocked() || e.closed })
}

// QueryEvent implements driver.Streams.
func (e *Engine) QueryEvent(ev driver.Event) (bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	x, err := e.event("query event", ev)
	if err != nil {
		return false, err
	}
	return x.latest.doneLocked(), nil
}

// ElapsedTime implements driver.Streams.
func (e *Engine) ElapsedTime(start, end driver.Event) (time.Duration, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	a, err := e.event("elapsed time", start)
	if err != nil {
		return 0, err
	}
	b, err := e.event("elapsed time", end)
	if err != nil {
		return 0, err
	}
	for _, x := range []*event{a, b} {
		if x.latest == nil {
			return 0, errors.Wrapf(driver.ErrInvalid, "%s: elapsed time: event %d was never recorded", e.name, x.id)
		}
		if !x.latest.done {
			return 0, errors.Wrapf(driver.ErrBusy, "%s: elapsed time: event %d has not completed", e.name, x.id)
		}
	}
	return b.latest.at.Sub(a.latest.at), nil
}

// LaunchHostFunc implements driver.Streams.
func (e *Engine) LaunchHostFunc(s driver.Stream, name string, fn func() error) error {
	if fn == nil {
		return errors.Wrapf(driver.ErrInvalid, "%s: launch of %q: no function", e.name, name)
	}
	return e.Enqueue(s, name, fn)
}

// CanAccessPeer implements driver.Streams.
func (e *Engine) CanAccessPeer(dev, peer driver.DeviceID) (bool, error) {
	if e.Closed() {
		return false, e.errClosed("can access peer")
	}
	for _, d := range []driver.DeviceID{dev, peer} {
		if err := driver.CheckDevice(func() string { return e.name + ": can access peer" }, d, e.ndev); err != nil {
			return false, err
		}
	}
	return dev != peer && e.canPeer(dev, peer), nil
}

// EnablePeerAccess implements driver.Streams: from now on work on dev may
// reach memory of peer (where its mappings grant dev access). Enabling it
// again is harmless.
func (e *Engine) EnablePeerAccess(dev, peer driver.DeviceID) error {
	ok, err := e.CanAccessPeer(dev, peer)
	if err != nil {
		return err
	}
	if dev == peer {
		return errors.Wrapf(driver.ErrInvalid, "%s: enable peer access from device %d to itself", e.name, dev)
	}
	if !ok {
		return errors.Wrapf(driver.ErrUnsupported, "%s: device %d cannot access device %d (CanAccessPeer is false)", e.name, dev, peer)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closing {
		return e.errClosed("enable peer access")
	}
	e.peers[[2]driver.DeviceID{dev, peer}] = true
	return nil
}

// PeerEnabled reports whether work on dev may reach memory of owner.
func (e *Engine) PeerEnabled(dev, owner driver.DeviceID) bool {
	if dev == owner {
		return true
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.peers[[2]driver.DeviceID{dev, owner}]
}

// Close waits for every stream to finish its work, stops them and forgets
// every event. Later calls are ErrClosed.
//
// From a host function, Close cannot wait for the streams ordered after
// that host function (its own, and those waiting on it through events or
// host functions): it closes all the same, waits for the others, skips
// the work of those not yet run, and returns ErrBusy naming them.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.closing {
		e.mu.Unlock()
		return e.errClosed("close")
	}
	caller := e.callerLocked()
	e.closing = true // from here CreateStream, every enqueue and every new wait refuse
	var errs error
	var wait []chan struct{}
	var behind []driver.Stream
	for _, st := range e.streams {
		st.quit = true
		if caller != nil && e.waitsForLocked(caller, need{st, st.enq}) {
			if st.err == nil {
				st.err = e.errClosed("close") // skips what has not run
			}
			behind = append(behind, st.id)
			continue
		}
		if caller != nil {
			caller.blocked = &need{st, st.enq}
		}
		errs = errors.CombineErrors(errs, e.syncLocked(st))
		wait = append(wait, st.finished)
	}
	if caller != nil {
		caller.blocked = nil
	}
	e.closed = true
	e.streams, e.events = nil, nil
	e.cond.Broadcast()
	e.mu.Unlock()
	for _, w := range wait {
		<-w
	}
	if len(behind) > 0 {
		slices.Sort(behind)
		return errors.CombineErrors(errors.WithHint(
			errors.Wrapf(driver.ErrBusy, "%s: close from a host function running on stream %d: closed without waiting for stream(s) %v, ordered after that host function; their work not yet run is skipped",
				e.name, caller.id, behind),
			selfWaitHint), errs)
	}
	return errs
}
