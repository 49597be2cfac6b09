// Package queue runs the streams and events of a driver that executes its
// asynchronous work on the host: each stream is a goroutine draining an
// ordered queue of operations; an event is a generation counter that an
// operation in a stream's queue completes. The host and sim drivers share
// it and add their own operations (copies, fills) through Enqueue.
//
// Invariants: a stream runs its operations one at a time in enqueue order;
// done <= enq. Each recording of an event is its own point, completed by
// its own operation: a wait holds the point current when it was enqueued,
// so re-recording an event elsewhere never releases earlier waiters early.
// Record and wait operations always run, even after a failure in their
// stream, so that no event is left for ever incomplete; other operations
// after a failure are skipped until the failure is reported.
//
// The engine never touches device memory itself; operations do.
package queue

import (
	"sync"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/driver"
)

type op struct {
	name    string
	run     func() error
	control bool // record/wait: runs even after a failure
}

type stream struct {
	id       driver.Stream
	dev      driver.DeviceID
	queue    []op
	enq      uint64 // operations enqueued
	done     uint64 // operations finished (run or skipped)
	err      error  // first failure not yet reported
	skipped  int    // operations skipped since err
	quit     bool
	finished chan struct{}
}

type event struct {
	id     driver.Event
	dev    driver.DeviceID
	latest *point // the last recording; nil if never recorded
}

// point is one recording of an event: done when the stream reached it.
type point struct {
	done bool
	at   time.Time
}

// doneLocked reports whether a (possibly nil: never recorded) point is done.
func (p *point) doneLocked() bool { return p == nil || p.done }

// Engine is the streams and events of one driver.
type Engine struct {
	name    string
	ndev    int
	canPeer func(dev, peer driver.DeviceID) bool

	mu      sync.Mutex
	cond    *sync.Cond // broadcast whenever an operation finishes
	streams map[driver.Stream]*stream
	events  map[driver.Event]*event
	next    uint64
	peers   map[[2]driver.DeviceID]bool
	closing bool // Close has begun: nothing new is created or enqueued
	closed  bool // Close has finished
}

// New returns an engine for ndev devices; canPeer says which pairs of
// devices could have peer access.
func New(name string, ndev int, canPeer func(dev, peer driver.DeviceID) bool) *Engine {
	e := &Engine{name: name, ndev: ndev, canPeer: canPeer, streams: map[driver.Stream]*stream{},
		events: map[driver.Event]*event{}, peers: map[[2]driver.DeviceID]bool{}}
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
func (e *Engine) work(st *stream) {
	defer close(st.finished)
	e.mu.Lock()
	defer e.mu.Unlock()
	for {
		for len(st.queue) == 0 && !st.quit {
			e.cond.Wait()
		}
		if len(st.queue) == 0 {
			return
		}
		o := st.queue[0]
		st.queue = st.queue[1:]
		failed := st.err != nil
		if failed && !o.control {
			st.skipped++
		} else {
			e.mu.Unlock()
			err := o.run()
			e.mu.Lock()
			if err != nil && st.err == nil {
				st.err = errors.Wrapf(err, "%s: stream %d: operation %d (%s) failed", e.name, st.id, st.done+1, o.name)
			}
		}
		st.done++
		e.cond.Broadcast()
	}
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
// returns (and clears) its unreported failure.
func (e *Engine) syncLocked(st *stream) error {
	target := st.enq
	for st.done < target {
		e.cond.Wait()
	}
	return e.reportLocked(st)
}

func (e *Engine) reportLocked(st *stream) error {
	err := st.err
	if err != nil && st.skipped > 0 {
		err = errors.Wrapf(err, "%d later operation(s) skipped", st.skipped)
	}
	st.err, st.skipped = nil, 0
	return err
}

// SyncStream implements driver.Streams.
func (e *Engine) SyncStream(s driver.Stream) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	st, err := e.stream("synchronize stream", s)
	if err != nil {
		return err
	}
	return e.syncLocked(st)
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
	err = e.syncLocked(st)
	delete(e.streams, s)
	st.quit = true
	e.cond.Broadcast()
	e.mu.Unlock()
	<-st.finished
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
	pt := &point{}
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
	return e.enqueueLocked(s, op{name: "wait for event", control: true, run: func() error {
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
	for !pt.doneLocked() && !e.closed {
		e.cond.Wait()
	}
	return nil
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
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.closing {
		e.mu.Unlock()
		return e.errClosed("close")
	}
	e.closing = true // from here CreateStream and every enqueue refuse
	var errs error
	var wait []chan struct{}
	for _, st := range e.streams {
		errs = errors.CombineErrors(errs, e.syncLocked(st))
		st.quit = true
		wait = append(wait, st.finished)
	}
	e.closed = true
	e.streams, e.events = nil, nil
	e.cond.Broadcast()
	e.mu.Unlock()
	for _, w := range wait {
		<-w
	}
	return errs
}
