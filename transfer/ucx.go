package transfer

import (
	"context"
	"encoding/binary"
	"net"
	"time"
	"unsafe"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/transfer/internal/ucx"
)

// The ucx kind moves the bytes with UCX active messages, and keeps the
// control connection for the check and the hold: begin (naming the
// target address and length the op will move; the target checks them
// against its live registration, holds the tensor's access and opens a
// UCX window over exactly those bytes, answering OK with the window's
// token, or the refusal), then, only after the OK, the initiator's bytes
// (a put: Endpoint.Send into the window, and a flush) or its fetch (a
// get: Endpoint.Fetch, answered into a window of its own over the local
// bytes), then end (for a put, the target waits within LeaseTimeout
// until every byte landed in its window; then it closes the window and
// lets the access go). A target whose end or bytes do not come within
// LeaseTimeout, or whose peer's connection drops, closes the window,
// drops the control connection and lets go: what comes for the window
// after that is dropped by the target's worker.
//
// Why not UCX's one-sided put and get (ucp_put_nbx, ucp_get_nbx, which
// the binding has): over a transport without RDMA (tcp between two
// hosts) UCX 1.13 emulates them with active messages that the target's
// UCX answers itself, and an answer it cannot send (the initiator's
// connection was reset meanwhile, as after a link down and up) aborts
// the target process (ucp_put_handler: "ucp_request.inl:346 Fatal:
// unexpected error: Endpoint timeout"). An active message is answered by
// no one but this code, and a send that fails completes with an error.
//
// Endpoints go one way: the initiator makes one to the target's worker
// (whose address the target's hello answer carries); the target makes
// none, answers a fetch on the endpoint UCX made for the initiator's
// (the reply endpoint of its message), and never hands UCX bytes a peer
// sent. What a target does not enforce is in the package doc (Trust).
//
// In a build without UCX (no -tags ucx, no cgo or no libucx-dev) the
// binding answers ErrUnsupported everywhere and New of the ucx kind fails.

// ucxOp moves one checked op with UCX between a begin and an end; the
// flush or the wait for a get's bytes, like the control connection,
// gives up at deadline (the op's LeaseTimeout, or ctx's deadline when
// sooner).
func (p *Peer) ucxOp(ctx context.Context, deadline time.Time, op *Op, put bool) error {
	remote := op.Remote.Addr + op.RemoteOff // no wrap: Peer.check
	q := request{kind: kindBegin, write: put, id: op.Remote.ID, gen: op.Remote.Gen, addr: remote, n: op.Len}
	return op.Local.access(!put, op.LocalOff, op.Len, func(b []byte) error {
		local := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
		var into *ucx.Window
		var intoToken uint64
		if !put {
			// The get's bytes land only here, and only until it closes.
			x, tok, err := p.e.worker.Open(local, op.Len, true)
			if err != nil {
				return err
			}
			defer func() { _ = x.Close() }()
			into, intoToken = x, tok
		}
		body, err := p.askBody(q, nil)
		if err != nil {
			return err
		}
		if len(body) != 8 || binary.BigEndian.Uint64(body) == 0 {
			return connError{malformed("a begin answered with %d bytes, not a window's token", len(body))}
		}
		window := binary.BigEndian.Uint64(body)
		fctx, cancel := context.WithDeadline(ctx, deadline)
		defer cancel()
		if put {
			err = p.ep.Send(window, 0, local, op.Len)
			if err == nil {
				err = p.ep.Flush(fctx)
			}
		} else {
			err = p.ep.Fetch(window, 0, op.Len, intoToken, 0)
			if err == nil {
				err = into.Wait(fctx)
			}
		}
		if err != nil {
			// The op's state at the target is unknown: drop the
			// connection, which makes the target close its window and
			// let go.
			return connError{errors.Wrapf(err, "ucx")}
		}
		return p.ask(request{kind: kindEnd}, nil)
	})
}

// serveBegin holds the access a begin asks for (servedOp checks it),
// opens a window over exactly its bytes and answers OK with the window's
// token (or the refusal), waits by deadline (the op's LeaseTimeout, the
// connection's deadline) for the end and, for a put, for every byte in
// the window, then closes the window. Its error is the connection's.
func (e *Engine) serveBegin(c net.Conn, q request, deadline time.Time) error {
	err := e.servedOp(q, q.write, func(b []byte) error {
		x, token, err := e.worker.Open(uintptr(unsafe.Pointer(unsafe.SliceData(b))), uint64(len(b)), q.write)
		if err != nil {
			return err
		}
		// Closed before the access is let go: nothing UCX brings for it
		// after that is written.
		defer func() { _ = x.Close() }()
		if _, err := c.Write(appendResponse(nil, statusOK, binary.BigEndian.AppendUint64(nil, token))); err != nil {
			return connError{err}
		}
		end, _, err := readRequest(c)
		if err == nil && end.kind != kindEnd {
			err = malformed("a request of kind %d inside a begin", end.kind)
		}
		if err == nil && q.write {
			// The end comes on the control connection, the bytes on UCX's.
			ctx, cancel := context.WithDeadline(e.closing, deadline)
			err = x.Wait(ctx)
			cancel()
		}
		if err != nil {
			return connError{err}
		}
		return nil
	})
	if err != nil {
		return e.refuse(c, err, 0)
	}
	if q.write {
		e.puts.Add(1)
		e.bytesIn.Add(q.n)
	} else {
		e.gets.Add(1)
		e.bytesOut.Add(q.n)
	}
	return respond(c, nil)
}
