package transfer

import (
	"io"
	"net"
)

// The tcp kind moves every byte over the control connection: a put's
// payload follows its header, a get's follows the target's OK. The
// target reads a put straight from the socket into the registered
// memory and writes a get straight from it, under the tensor's access
// (serve.go), so every byte is checked on the receiving side: a peer can
// write only inside the range of a live, writable registration.

// tcpOp moves one checked op over the connection. A connError says the
// connection is broken.
func (p *Peer) tcpOp(op *Op, put bool) error {
	q := request{id: op.Remote.ID, gen: op.Remote.Gen, addr: op.Remote.Addr + op.RemoteOff, n: op.Len}
	if put {
		q.kind = kindPut
		return op.Local.access(false, op.LocalOff, op.Len, func(b []byte) error { return p.ask(q, b) })
	}
	q.kind = kindGet
	return op.Local.access(true, op.LocalOff, op.Len, func(b []byte) error {
		if err := p.ask(q, nil); err != nil {
			return err
		}
		if _, err := io.ReadFull(p.conn, b); err != nil {
			return connError{err}
		}
		return nil
	})
}

// ask sends q's header and payload and reads the target's answer: nil for
// OK, the target's refusal, or a connError when the connection broke.
func (p *Peer) ask(q request, payload []byte) error {
	_, err := p.askBody(q, payload)
	return err
}

// askBody is ask, answering the body of the target's OK too.
func (p *Peer) askBody(q request, payload []byte) ([]byte, error) {
	h := q.encode()
	if _, err := (&net.Buffers{h[:], payload}).WriteTo(p.conn); err != nil {
		return nil, connError{err}
	}
	status, body, err := readResponse(p.conn)
	if err != nil {
		return nil, connError{err}
	}
	if status != statusOK {
		return nil, p.remoteError(status, body)
	}
	return body, nil
}
