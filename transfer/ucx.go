package transfer

import (
	"context"
	"net"
	"unsafe"

	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/transfer/internal/ucx"
)

// The ucx kind moves the bytes with UCX one-sided operations between
// registered memory (ucp_mem_map at Register, its packed remote key in
// the Descriptor), and keeps the control connection for the check and
// the hold: begin (the target checks the op against its registrations
// and holds the tensor's access, answering OK or the refusal), then the
// initiator's put or get and an endpoint flush, then end (the target
// lets the access go). A target whose end does not come within
// LeaseTimeout, or whose peer's connection drops, closes its endpoint to
// the peer before it lets go.
//
// Trust limit: a remote key lets the peer's UCX write the registered
// memory without the target's CPU; the begin/end protocol is kept by the
// peer's engine, not enforced by the target's hardware, as with any RDMA
// remote key. Use the ucx kind between engines that trust each other;
// the tcp kind checks every byte on the receiving side. For the same
// reason, close a registration once it is stale (its Descriptor answers
// ErrClosed): begin refuses it, but its UCX memory registration stays
// until Close.
//
// In a build without UCX (no -tags ucx, no cgo or no libucx-dev) the
// binding answers ErrUnsupported everywhere and New of the ucx kind fails.

// ucxOp moves one checked op with UCX between a begin and an end.
func (p *Peer) ucxOp(ctx context.Context, op *Op, put bool) error {
	q := request{kind: kindBegin, write: put, id: op.Remote.ID, gen: op.Remote.Gen, off: op.RemoteOff, n: op.Len}
	return op.Local.access(!put, op.LocalOff, op.Len, func(b []byte) error {
		if err := p.ask(q, nil); err != nil {
			return err
		}
		var err error
		local, remote := uintptr(unsafe.Pointer(unsafe.SliceData(b))), op.Remote.Addr+op.RemoteOff
		if put {
			err = p.ep.Put(local, op.Len, remote, op.Remote.Key)
		} else {
			err = p.ep.Get(local, op.Len, remote, op.Remote.Key)
		}
		if err == nil {
			err = p.ep.Flush(ctx)
		}
		if err != nil {
			// The op's state at the target is unknown: drop the
			// connection, which makes the target close its endpoint
			// and let go.
			return connError{errors.Wrapf(err, "ucx")}
		}
		return p.ask(request{kind: kindEnd}, nil)
	})
}

// serveBegin holds the access a begin asks for, answers OK (or the
// refusal), and waits within LeaseTimeout (the connection's deadline)
// for the end. Its error is the connection's; the endpoint to the peer
// is closed (and *ep set nil) before the access is let go when the end
// does not come.
func (e *Engine) serveBegin(c net.Conn, q request, ep **ucx.Endpoint) error {
	err := e.servedOp(q, q.write, func([]byte) error {
		if err := respond(c, nil); err != nil {
			return connError{err}
		}
		end, _, err := readRequest(c)
		if err == nil && end.kind != kindEnd {
			err = malformed("a request of kind %d inside a begin", end.kind)
		}
		if err != nil {
			if *ep != nil {
				_ = (*ep).Close() // cut the peer off before letting go
				*ep = nil
			}
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
