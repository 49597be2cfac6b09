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
	q := request{id: op.Remote.ID, gen: op.Remote.Gen, off: op.RemoteOff, n: op.Len}
	if put {
		q.kind = kindPut
		var status byte
		var body []byte
		err := op.Local.access(false, op.LocalOff, op.Len, func(b []byte) error {
			h := q.encode()
			if _, err := (&net.Buffers{h[:], b}).WriteTo(p.conn); err != nil {
				return connError{err}
			}
			var err error
			if status, body, err = readResponse(p.conn); err != nil {
				return connError{err}
			}
			return nil
		})
		if err != nil {
			return err
		}
		if status != statusOK {
			return p.remoteError(status, body)
		}
		return nil
	}
	q.kind = kindGet
	return op.Local.access(true, op.LocalOff, op.Len, func(b []byte) error {
		h := q.encode()
		if _, err := p.conn.Write(h[:]); err != nil {
			return connError{err}
		}
		status, body, err := readResponse(p.conn)
		if err != nil {
			return connError{err}
		}
		if status != statusOK {
			return p.remoteError(status, body)
		}
		if _, err := io.ReadFull(p.conn, b); err != nil {
			return connError{err}
		}
		return nil
	})
}
