package transfer

import (
	"io"
	"net"

	"github.com/vmarena/vmarena/internal/errors"
)

// The tcp kind moves every byte over the control connection: a put's
// payload follows its header, a get's follows the target's OK. The
// target reads a put straight from the socket into the registered
// memory and writes a get straight from it, under the tensor's access
// (serve.go), so every byte is checked on the receiving side: a peer can
// write only inside the range of a live, writable registration.

// tcpOp moves one checked op over the connection. A connError says the
// connection is broken. A device registration's bytes go through the
// engine's staging half for issued ops, a piece at a time (move): a put
// sends its header with the first piece and the rest after it, a get
// reads the payload a piece at a time, all under one hold of the local
// tensor; once part of a payload has moved, any failure breaks the
// connection (the other side's count of bytes is unknown).
func (p *Peer) tcpOp(op *Op, put bool) error {
	q := request{id: op.Remote.ID, gen: op.Remote.Gen, addr: op.Remote.Addr + op.RemoteOff, n: op.Len}
	st := p.e.stage(false)
	moved := false
	var err error
	if put {
		q.kind = kindPut
		h := q.encode()
		err = op.Local.move(false, op.LocalOff, op.Len, st, nop, func(b []byte) error {
			var hb []byte
			if !moved {
				hb, moved = h[:], true
			}
			if _, err := (&net.Buffers{hb, b}).WriteTo(p.conn); err != nil {
				return connError{err}
			}
			return nil
		}, p.answer)
	} else {
		q.kind = kindGet
		err = op.Local.move(true, op.LocalOff, op.Len, st, func() error {
			if err := p.ask(q, nil); err != nil {
				return err
			}
			moved = true
			return nil
		}, func(b []byte) error {
			if _, err := io.ReadFull(p.conn, b); err != nil {
				return connError{err}
			}
			return nil
		}, nop)
	}
	var ce connError
	var rf refusal
	if err != nil && moved && !errors.As(err, &ce) && !errors.As(err, &rf) {
		// A staging copy failed mid-payload: the connection is what
		// failed for the caller (ErrClosed); the driver's error is kept
		// for the message, not its sentinel.
		return connError{errors.Handled(err)}
	}
	return err
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
	return p.answerBody()
}

// answer reads the target's answer to the op sent: nil for OK, the
// target's refusal, or a connError when the connection broke.
func (p *Peer) answer() error {
	_, err := p.answerBody()
	return err
}

// answerBody is answer, answering the body of the target's OK too.
func (p *Peer) answerBody() ([]byte, error) {
	status, body, err := readResponse(p.conn)
	if err != nil {
		return nil, connError{err}
	}
	if status != statusOK {
		return nil, p.remoteError(status, body)
	}
	return body, nil
}
