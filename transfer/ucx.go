package transfer

import (
	"context"
	"net"
	"time"
	"unsafe"

	"github.com/cockroachdb/errors"
)

// The ucx kind moves the bytes with UCX one-sided operations between
// registered memory (ucp_mem_map of exactly the registration's bytes at
// Register, its packed remote key in the Descriptor), and keeps the
// control connection for the check and the hold: begin (naming the
// target address and length the op will move; the target checks them
// against its live registration and holds the tensor's access, answering
// OK or the refusal), then, only after the OK, the initiator's put or get
// at exactly that address and length and an endpoint flush, then end (the
// target lets the access go). A target whose end does not come within
// LeaseTimeout, or whose peer's connection drops, drops the control
// connection and lets go.
//
// Endpoints go one way: the initiator makes one to the target's worker
// (whose address the target's hello answer carries); the target makes
// none and never hands UCX bytes a peer sent. What a target does not
// enforce is in the package doc (Trust).
//
// In a build without UCX (no -tags ucx, no cgo or no libucx-dev) the
// binding answers ErrUnsupported everywhere and New of the ucx kind fails.

// ucxOp moves one checked op with UCX between a begin and an end; the
// flush, like the control connection, gives up at deadline (the op's
// LeaseTimeout, or ctx's deadline when sooner).
func (p *Peer) ucxOp(ctx context.Context, deadline time.Time, op *Op, put bool) error {
	remote := op.Remote.Addr + op.RemoteOff // no wrap: Peer.check
	q := request{kind: kindBegin, write: put, id: op.Remote.ID, gen: op.Remote.Gen, addr: remote, n: op.Len}
	return op.Local.access(!put, op.LocalOff, op.Len, func(b []byte) error {
		if err := p.ask(q, nil); err != nil {
			return err
		}
		var err error
		local := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
		if put {
			err = p.ep.Put(local, op.Len, remote, op.Remote.Key)
		} else {
			err = p.ep.Get(local, op.Len, remote, op.Remote.Key)
		}
		if err == nil {
			fctx, cancel := context.WithDeadline(ctx, deadline)
			err = p.ep.Flush(fctx)
			cancel()
		}
		if err != nil {
			// The op's state at the target is unknown: drop the
			// connection, which makes the target let go.
			return connError{errors.Wrapf(err, "ucx")}
		}
		return p.ask(request{kind: kindEnd}, nil)
	})
}

// serveBegin holds the access a begin asks for (servedOp checks it),
// answers OK (or the refusal), and waits within LeaseTimeout (the
// connection's deadline) for the end. Its error is the connection's.
func (e *Engine) serveBegin(c net.Conn, q request) error {
	err := e.servedOp(q, q.write, func([]byte) error {
		if err := respond(c, nil); err != nil {
			return connError{err}
		}
		end, _, err := readRequest(c)
		if err == nil && end.kind != kindEnd {
			err = malformed("a request of kind %d inside a begin", end.kind)
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
