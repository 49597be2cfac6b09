package transfer

import (
	"fmt"
	"io"
	"net"
	"time"

	"github.com/vmarena/vmarena/internal/backoff"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// The target side: one goroutine accepts control connections, and one
// per connection serves its requests in order until the connection ends
// (the peer closes it, a frame is malformed, the hello, or a request's
// header and payload from its first byte on, does not come within
// LeaseTimeout, or the engine closes). A peer may stay idle between
// requests for as long as it likes. Nothing a peer sends is
// trusted: each op is checked against the live registrations (servedOp)
// and moves bytes only inside the registration's range, under its
// tensor's access.

// maxServed bounds the connections an engine serves at once: a
// connection past it is closed as it is accepted, so that peers that
// connect and hold on cannot take every file descriptor of the process.
// A variable only for the tests.
var maxServed = 1024

// accept runs the accept loop until the listener closes. An accept the
// kernel refuses for a while (out of file descriptors, a connection
// aborted in the backlog) is tried again after a pause (backoff.Pause:
// 5 ms doubling to 1 s): the engine serves again once descriptors are
// back, rather than never.
func (e *Engine) accept() {
	defer e.wg.Done()
	var pause backoff.Pause
	for {
		c, err := e.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || e.closing.Err() != nil || !pause.Wait(e.closing.Done()) {
				return // Close
			}
			continue
		}
		pause.Reset()
		e.mu.Lock()
		if e.closed {
			e.mu.Unlock()
			_ = c.Close()
			return
		}
		if len(e.conns) >= maxServed {
			e.mu.Unlock()
			_ = c.Close()
			continue
		}
		e.conns[c] = struct{}{}
		e.wg.Add(1)
		e.mu.Unlock()
		go e.serve(c)
	}
}

// serve serves one connection: a hello, then ops.
//
// Nothing of the peer's goes to UCX: the initiator's hello carries no
// worker address (one that does is refused), and the target makes no
// endpoint. The initiator makes its endpoint to the target's worker,
// whose address the target sends; the target answers a fetch on the
// endpoint UCX made for the initiator's (its message's reply endpoint).
func (e *Engine) serve(c net.Conn) {
	defer func() {
		_ = c.Close()
		e.mu.Lock()
		delete(e.conns, c)
		e.mu.Unlock()
		e.wg.Done()
	}()
	_ = c.SetDeadline(time.Now().Add(e.cfg.LeaseTimeout))
	q, blob, err := readRequest(c)
	if err != nil || q.kind != kindHello {
		return
	}
	theirs, err := decodeHello(blob)
	if err != nil {
		return
	}
	refuse := func(msg string) {
		_, _ = c.Write(appendResponse(nil, statusInvalid, []byte("transfer: hello refused: "+msg)))
	}
	switch {
	case q.id != protocolVersion || theirs.kind != e.cfg.Kind:
		refuse(fmt.Sprintf("protocol version %d and kind %q, this engine speaks %d and %q", q.id, theirs.kind, protocolVersion, e.cfg.Kind))
		return
	case len(theirs.worker) != 0 || theirs.addr != "":
		refuse(fmt.Sprintf("an initiator's hello names no address or worker (this one has a %d-byte address and a %d-byte worker address)", len(theirs.addr), len(theirs.worker)))
		return
	}
	mine := helloBlob{addr: e.addr, kind: e.cfg.Kind}
	if e.worker != nil {
		if mine.worker, err = e.worker.Address(); err != nil {
			_, _ = c.Write(appendResponse(nil, statusOf(err), []byte(err.Error())))
			return
		}
	}
	if _, err := c.Write(appendResponse(nil, statusOK, mine.encode())); err != nil {
		return
	}
	for {
		// Idle between ops: no deadline until a request's first byte is
		// in; from then on its header, and the op, have LeaseTimeout.
		_ = c.SetDeadline(time.Time{})
		var h [reqSize]byte
		if _, err := io.ReadFull(c, h[:1]); err != nil {
			return
		}
		deadline := time.Now().Add(e.cfg.LeaseTimeout)
		_ = c.SetDeadline(deadline)
		if _, err := io.ReadFull(c, h[1:]); err != nil {
			return
		}
		q, err := decodeRequest(h)
		if err != nil {
			return
		}
		switch {
		case q.kind == kindPut && e.worker == nil:
			err = e.servePut(c, q)
		case q.kind == kindGet && e.worker == nil:
			err = e.serveGet(c, q)
		case q.kind == kindBegin && e.worker != nil:
			err = e.serveBegin(c, q, deadline)
		default:
			return // a hello again, an end outside a begin, or another kind's op
		}
		if err != nil {
			return
		}
	}
}

// servedReg checks q against the live registrations: its id and
// generation, its bytes [addr, addr+n) all inside the registration's,
// and writability (write). The error of a refusal is marked with its
// sentinel.
func (e *Engine) servedReg(q request, write bool) (*Registration, error) {
	what := func() string {
		return fmt.Sprintf("transfer: %d bytes at %#x of registration %d gen %#x (write %t)", q.n, q.addr, q.id, q.gen, write)
	}
	e.mu.Lock()
	r, last := e.regs[q.id], e.lastID
	e.mu.Unlock()
	switch {
	case r == nil && (q.id == 0 || q.id > last):
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: no registration of that id was made here", what())
	case r == nil:
		return nil, driver.Closed(what() + ": that registration is closed")
	case q.gen != r.gen:
		return nil, driver.Closed(what() + ": stale: the generation is not the registration's")
	case q.n == 0 || q.addr < r.addr || q.addr-r.addr > r.n || q.n > r.n-(q.addr-r.addr):
		return nil, errors.Wrapf(driver.ErrInvalid, "%s: outside the registration, which has %d bytes at %#x", what(), r.n, r.addr)
	case write && !r.writable:
		return nil, errors.Wrapf(driver.ErrAccessDenied, "%s: the registration is read-only", what())
	}
	return r, nil
}

// servedOp runs fn with the bytes op q names, under the registration's
// and its tensor's access (write: for writing), after checking q
// (servedReg); fn's own error is returned as it is.
func (e *Engine) servedOp(q request, write bool, fn func(b []byte) error) error {
	r, err := e.servedReg(q, write)
	if err != nil {
		return err
	}
	return r.access(write, q.addr-r.addr, q.n, fn)
}

// respond answers q's status.
func respond(c net.Conn, err error) error {
	var body []byte
	if err != nil {
		body = []byte(err.Error())
	}
	_, werr := c.Write(appendResponse(nil, statusOf(err), body))
	return werr
}

// servePut reads a put's payload straight into the registered memory
// (a device registration's a piece at a time through the staging half,
// each copied to the device before the next is read), or, refused,
// drains what is left of it, and answers. Its error is the connection's.
func (e *Engine) servePut(c net.Conn, q request) error {
	r, err := e.servedReg(q, true)
	read := uint64(0)
	if err == nil {
		err = r.move(true, q.addr-r.addr, q.n, e.stage(true), nop, func(b []byte) error {
			if _, err := io.ReadFull(c, b); err != nil {
				return connError{err}
			}
			read += uint64(len(b))
			return nil
		}, nop)
	}
	if err != nil {
		return e.refuse(c, err, q.n-read)
	}
	e.puts.Add(1)
	e.bytesIn.Add(q.n)
	return respond(c, nil)
}

// serveGet answers a get: OK and the bytes, written from the registered
// memory under its access (a device registration's a piece at a time
// through the staging half), or the refusal. Its error is the
// connection's: a failure once the first bytes went drops it.
func (e *Engine) serveGet(c net.Conn, q request) error {
	r, err := e.servedReg(q, false)
	sent := false
	if err == nil {
		err = r.move(false, q.addr-r.addr, q.n, e.stage(true), nop, func(b []byte) error {
			var ok []byte
			if !sent {
				// Counted before the bytes go: the initiator may see
				// them, and return, before this goroutine runs again. A
				// failure afterwards takes the count back (and drops the
				// connection).
				sent = true
				e.gets.Add(1)
				e.bytesOut.Add(q.n)
				ok = appendResponse(nil, statusOK, nil)
			}
			if _, err := (&net.Buffers{ok, b}).WriteTo(c); err != nil {
				return connError{err}
			}
			return nil
		}, nop)
	}
	switch {
	case err == nil:
		return nil
	case sent:
		e.gets.Add(^uint64(0))
		e.bytesOut.Add(-q.n)
		var ce connError
		if errors.As(err, &ce) {
			return ce.err
		}
		return err
	}
	return e.refuse(c, err, 0)
}

// refuse ends a served op that servedOp failed with err, and returns the
// connection's error: a connection error is that; a refusal is counted,
// the drain bytes of payload that follow the request are read away, and
// it is answered.
func (e *Engine) refuse(c net.Conn, err error, drain uint64) error {
	var ce connError
	if errors.As(err, &ce) {
		return ce.err
	}
	e.refused.Add(1)
	if drain > 0 {
		if _, derr := io.CopyN(io.Discard, c, int64(drain)); derr != nil {
			return derr
		}
	}
	return respond(c, err)
}
