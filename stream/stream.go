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
//
// Invariants: positions only grow; a stream's clock entry for another
// stream never exceeds that stream's position; an event's clock is the
// recording stream's clock at the moment of recording. The package never
// touches memory itself; the driver does.
package stream

import (
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/driver"
)

// Stream is an ordered queue of work on one device. Safe for concurrent
// use; work enqueued from several goroutines runs in the order the calls
// took effect.
type Stream struct {
	d   driver.Driver
	st  driver.Streams
	id  driver.Stream
	dev driver.DeviceID

	mu     sync.Mutex
	pos    uint64
	clock  map[*Stream]uint64
	closed bool
}

func streamsOf(d driver.Driver, what string) (driver.Streams, error) {
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
func (s *Stream) Driver() driver.Driver { return s.d }

// Device is the device the stream runs on.
func (s *Stream) Device() driver.DeviceID { return s.dev }

// ID is the driver's handle of the stream.
func (s *Stream) ID() driver.Stream { return s.id }

func (s *Stream) String() string { return fmt.Sprintf("stream %d (device %d)", s.id, s.dev) }

// Position is the number of operations enqueued through s so far.
func (s *Stream) Position() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pos
}

// OrderedAfter reports whether work enqueued on s from now on runs after
// the first pos operations of t: t is s itself, or s has waited on an event
// recorded on t at or after pos (directly or through other streams).
func (s *Stream) OrderedAfter(t *Stream, pos uint64) bool {
	if s == t {
		return true
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
	if e.d != s.d {
		return errors.Wrap(driver.ErrInvalid, "stream: wait on an event of another driver")
	}
	e.mu.Lock()
	clock := maps.Clone(e.clock)
	closed := e.closed
	e.mu.Unlock()
	if closed {
		return driver.Closed("stream: wait on a destroyed event")
	}
	return s.enqueue("wait on event", func() error {
		if err := s.st.StreamWaitEvent(s.id, e.id); err != nil {
			return err
		}
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
	return s.enqueue("launch "+name, func() error { return s.st.LaunchHostFunc(s.id, name, fn) })
}

// Synchronize waits for everything enqueued on s, returns the first
// failure of that work (naming the operation), then runs the driver's
// synchronize hooks.
func (s *Stream) Synchronize() error {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return driver.Closed(fmt.Sprintf("stream: synchronize of destroyed %s", s))
	}
	err := s.st.SyncStream(s.id)
	runHooks(s.d)
	if err != nil {
		return errors.Wrapf(err, "stream: synchronize %s", s)
	}
	return nil
}

// Query reports whether everything enqueued on s has run, and the first
// failure if so.
func (s *Stream) Query() (bool, error) { return s.st.QueryStream(s.id) }

// Destroy waits for the stream's work, reports any failure not yet
// reported, and destroys it.
func (s *Stream) Destroy() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return driver.Closed(fmt.Sprintf("stream: destroy of destroyed %s", s))
	}
	s.closed = true
	return errors.Wrapf(s.st.DestroyStream(s.id), "stream: destroy %s", s)
}

// CopyHtoD enqueues a copy of src to dst; src must be left alone until
// the stream has passed the copy.
func (s *Stream) CopyHtoD(dst driver.Addr, src []byte) error {
	return s.enqueue("copy to device", func() error { return s.st.CopyHtoD(dst, src, s.id) })
}

// CopyDtoH enqueues a copy of device memory at src into dst.
func (s *Stream) CopyDtoH(dst []byte, src driver.Addr) error {
	return s.enqueue("copy from device", func() error { return s.st.CopyDtoH(dst, src, s.id) })
}

// CopyDtoD enqueues a copy of n bytes between device addresses (of one
// device, or of two with peer access enabled).
func (s *Stream) CopyDtoD(dst, src driver.Addr, n uint64) error {
	return s.enqueue("copy device to device", func() error { return s.st.CopyDtoD(dst, src, n, s.id) })
}

// Memset enqueues a fill of n bytes at dst with value.
func (s *Stream) Memset(dst driver.Addr, value byte, n uint64) error {
	return s.enqueue("fill", func() error { return s.st.Memset(dst, value, n, s.id) })
}

// CopyHtoH enqueues a copy between two host buffers, in stream order.
func (s *Stream) CopyHtoH(dst, src []byte) error {
	if len(dst) != len(src) {
		return errors.Wrapf(driver.ErrInvalid, "stream: copy host to host: %d bytes into %d", len(src), len(dst))
	}
	return s.Launch("copy host to host", func() error { copy(dst, src); return nil })
}

// The synchronous copies enqueue and then synchronize the stream: they
// return once the bytes have moved, with any failure of the stream's work.

// CopyHtoDSync copies src to dst and waits.
func (s *Stream) CopyHtoDSync(dst driver.Addr, src []byte) error {
	return s.andSync(s.CopyHtoD(dst, src))
}

// CopyDtoHSync copies device memory at src into dst and waits.
func (s *Stream) CopyDtoHSync(dst []byte, src driver.Addr) error {
	return s.andSync(s.CopyDtoH(dst, src))
}

// CopyDtoDSync copies n bytes between device addresses and waits.
func (s *Stream) CopyDtoDSync(dst, src driver.Addr, n uint64) error {
	return s.andSync(s.CopyDtoD(dst, src, n))
}

// MemsetSync fills n bytes at dst with value and waits.
func (s *Stream) MemsetSync(dst driver.Addr, value byte, n uint64) error {
	return s.andSync(s.Memset(dst, value, n))
}

// CopyHtoHSync copies between host buffers after the stream's earlier
// work, and waits.
func (s *Stream) CopyHtoHSync(dst, src []byte) error {
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

	mu     sync.Mutex
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
func (e *Event) ID() driver.Event { return e.id }

// Synchronize waits for the event as last recorded, then runs the
// driver's synchronize hooks.
func (e *Event) Synchronize() error {
	err := e.st.SyncEvent(e.id)
	runHooks(e.d)
	return errors.Wrap(err, "stream: synchronize event")
}

// WaitDone waits for the event as last recorded without running the
// synchronize hooks: for code that runs under its own lock and is itself
// a hook (a pool waiting for its frees).
func (e *Event) WaitDone() error { return errors.Wrap(e.st.SyncEvent(e.id), "stream: wait for event") }

// Query reports whether the event as last recorded has completed.
func (e *Event) Query() (bool, error) { return e.st.QueryEvent(e.id) }

// Destroy destroys the event; work already waiting on it completes.
func (e *Event) Destroy() error {
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
	d, err := start.st.ElapsedTime(start.id, end.id)
	return d, errors.Wrap(err, "stream: elapsed time")
}

// Hooks.

var hooks struct {
	mu   sync.Mutex
	next int
	fns  map[driver.Driver]map[int]func()
}

// OnSynchronize registers fn to run after every stream or event
// synchronize on d returns; the returned function unregisters it.
func OnSynchronize(d driver.Driver, fn func()) (cancel func()) {
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
	}
}

func runHooks(d driver.Driver) {
	hooks.mu.Lock()
	fns := make([]func(), 0, len(hooks.fns[d]))
	for _, fn := range hooks.fns[d] {
		fns = append(fns, fn)
	}
	hooks.mu.Unlock()
	for _, fn := range fns {
		fn()
	}
}

// HostBuffer is pinned host memory from the driver, with starts aligned
// for async copies (64 bytes at least).
type HostBuffer struct {
	st    driver.Streams
	bytes []byte
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

// Bytes is the buffer's memory; nil after Free.
func (h *HostBuffer) Bytes() []byte { return h.bytes }

// Free returns the buffer. Freeing twice is ErrClosed.
func (h *HostBuffer) Free() error {
	if h.bytes == nil {
		return driver.Closed("stream: free of a freed host buffer")
	}
	err := h.st.HostFree(h.bytes)
	h.bytes = nil
	return errors.Wrap(err, "stream: free host buffer")
}
