package queue

import (
	"sync"
	"unsafe"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/lockrank"
)

// HostBuffers are the host buffers a driver's HostAlloc handed out and
// HostFree has not taken back, by first byte: the half of HostAlloc and
// HostFree every driver shares (how the memory is got and given back is
// each driver's). A driver's Close refuses while any is live (Busy), and
// its tear-down takes them all back (Close). The zero value is ready; a
// closed one takes no more buffers.
type HostBuffers struct {
	mu     lockrank.Mutex[lockrank.HostBuffers]
	bufs   map[*byte]uint64
	closed bool
	// closing is held by CloseWith: one driver Close at a time.
	closing sync.Mutex
}

// Books is the record a driver's Close closes after its host buffers
// (driver/internal/ledger's Ledger).
type Books interface {
	// Busy says why the record cannot close now (ErrBusy), or nil.
	Busy() error
	// Close closes it, or refuses (ErrBusy) where something was mapped
	// since Busy.
	Close() error
}

// CloseWith is a driver Close's first half: h and then books, each
// checked and closed in one step, so memory mapped or pinned while Close
// runs makes it refuse or is refused itself; a refusal of the books
// reopens h, so a refused Close changes nothing. A driver closed already
// (e closed) is ErrClosed. Closes run it one at a time; it never waits
// for the streams, so a host function that the Close's second half (e's
// Close) waits for may call Close itself. failed runs where the books
// fail to close for another reason than ErrBusy, its error joined to
// theirs (the rest of the driver's Close). name prefixes the messages.
func (h *HostBuffers) CloseWith(name string, e *Engine, books Books, failed func() error) error {
	h.closing.Lock()
	defer h.closing.Unlock()
	if e.Closed() {
		return driver.Closed(name + ": close: closed already")
	}
	if err := errors.CombineErrors(books.Busy(), h.Busy(name)); err != nil {
		return err
	}
	if err := h.CloseIdle(name); err != nil {
		return err // a buffer pinned since the check, or a Close that got here first
	}
	if err := books.Close(); errors.Is(err, driver.ErrBusy) {
		h.Reopen() // a chunk mapped since the check: nothing is closed
		return err
	} else if err != nil {
		return errors.CombineErrors(err, failed())
	}
	return nil
}

// Add records b. It is false once Close has run: the caller gives b back
// itself and answers ErrClosed.
func (h *HostBuffers) Add(b []byte) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return false
	}
	if h.bufs == nil {
		h.bufs = map[*byte]uint64{}
	}
	h.bufs[&b[0]] = uint64(len(b))
	return true
}

// Remove forgets b, which the caller then gives back, once the work
// enqueued on e's streams before the call has finished (e.Drain): a copy
// queued on b must not land in memory that a later HostAlloc hands to
// someone else. Anything but a whole live buffer is ErrInvalid, at once,
// and after Close ErrClosed (Close gave every buffer back); from a host
// function the wait would be for, it is ErrBusy and b stays live. name
// prefixes the message.
func (h *HostBuffers) Remove(name string, e *Engine, b []byte) error {
	if err := h.live(name, b); err != nil {
		return err
	}
	if err := e.Drain(name + ": host free"); err != nil {
		if errors.Is(err, driver.ErrBusy) {
			err = errors.WithHint(err, "a pinned buffer is freed once the work queued before its free has run: free it outside the stream's host functions")
		}
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.liveLocked(name, b); err != nil {
		return err // closed, or freed by another call, while this one waited
	}
	delete(h.bufs, &b[0])
	return nil
}

// live returns nil when b is a whole live buffer, and the error Remove
// answers otherwise.
func (h *HostBuffers) live(name string, b []byte) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.liveLocked(name, b)
}

func (h *HostBuffers) liveLocked(name string, b []byte) error {
	if h.closed {
		return driver.Closed(name + ": host free (Close returned every host buffer)")
	}
	if len(b) == 0 || h.bufs[&b[0]] != uint64(len(b)) {
		return errors.Wrapf(driver.ErrInvalid, "%s: host free of a buffer HostAlloc did not give (or not whole, or freed already)", name)
	}
	return nil
}

// Busy returns ErrBusy while buffers are live: the driver's Close must
// not give back memory a slice still reaches.
func (h *HostBuffers) Busy(name string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if n := len(h.bufs); n > 0 {
		return errors.WithHint(errors.Wrapf(driver.ErrBusy, "%s: close: %d host buffer(s) still live", name, n),
			"free them (HostFree) first: their bytes would fault at the next touch")
	}
	return nil
}

// CloseIdle closes h, as Close does, only when no buffer is live: with
// buffers live it is ErrBusy and changes nothing, and once closed
// ErrClosed. Reopen undoes it, for a driver's Close that finds, after
// this, something else it must refuse for. name prefixes the message.
func (h *HostBuffers) CloseIdle(name string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return driver.Closed(name + ": close: closed already")
	}
	if n := len(h.bufs); n > 0 {
		return errors.WithHint(errors.Wrapf(driver.ErrBusy, "%s: close: %d host buffer(s) still live", name, n),
			"free them (HostFree) first: their bytes would fault at the next touch")
	}
	h.closed = true
	return nil
}

// Reopen takes buffers again after CloseIdle.
func (h *HostBuffers) Reopen() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = false
}

// Close takes no more buffers and returns the live ones, for the caller
// to give back.
func (h *HostBuffers) Close() [][]byte {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	var out [][]byte
	for p, n := range h.bufs {
		out = append(out, unsafe.Slice(p, n))
	}
	h.bufs = nil
	return out
}
