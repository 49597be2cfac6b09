package transfer

import (
	"encoding/binary"
	"io"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// The control protocol: a peer's TCP connection carries requests from the
// initiator (the side that called Connect) and one response to each, in
// order. Every integer is big-endian.
//
// A request is a fixed header of reqSize bytes:
//
//	magic u16 ("vT") | kind u8 | flags u8 | reserved u32 (zero) |
//	id u64 | gen u64 | addr u64 | len u64
//
// where, in an op (put, get, begin), addr is the address in the target's
// process of the first byte the op moves (the descriptor's Addr plus the
// op's offset) and len its length: the target checks both against the
// registration (id, gen) it has, and refuses an op whose bytes are not
// all inside it. Its kind says what follows:
//
//   - hello: id is the protocol version, len the length of a blob that
//     follows (at most maxBlob): the initiator's kind (helloBlob, with no
//     worker address: a target refuses a hello that carries one). The
//     response's body is the target's blob: its Addr, kind and, for ucx,
//     its worker address, to which the initiator makes its endpoint.
//   - put (tcp): len bytes of payload follow the header, to be written at
//     addr in registration (id, gen). The target reads them straight from
//     the socket into the memory, holding the tensor's access; refused,
//     it still reads (drains) them, then answers the error.
//   - get (tcp): the response, when OK, is followed by len bytes from
//     addr in the registration, written under the tensor's access.
//   - begin (ucx): flags bit 0 is write. The target checks the op (addr
//     and len inside the live registration, its generation, writability
//     for a write), holds the access and answers OK, then waits (at most
//     LeaseTimeout) for end; the initiator moves the bytes with UCX in
//     between, at exactly addr and len, and only after the OK.
//   - end (ucx): every field zero. Answered OK.
//
// A response is status u8 | reserved [3]u8 (zero) | n u32, then n bytes
// (at most maxBlob): the error's message when status is not statusOK.
//
// A frame that breaks these rules (a bad magic, kind, flag, reserved
// byte, or length) is malformed: the target drops the connection without
// answering, having written nothing to any registration.
const (
	frameMagic = 0x7654
	reqSize    = 2 + 1 + 1 + 4 + 4*8
	respSize   = 1 + 3 + 4
	// maxBlob bounds a hello's blob and a response's body.
	maxBlob = 64 << 10
	// maxOp bounds one request's len: 1 TiB, past any registration
	// (larger is malformed rather than drained for hours).
	maxOp = 1 << 40
	// protocolVersion is a hello's id. Version 2: ops name the target's
	// address, not an offset; the initiator's hello has no worker address.
	// Version 3: the ucx kind's begin is answered with the token of the
	// window the op's bytes move through (active messages, not RMA).
	protocolVersion = 3
)

// Request kinds.
const (
	kindHello byte = 1 + iota
	kindPut
	kindGet
	kindBegin
	kindEnd
)

// request is a decoded request header.
type request struct {
	kind    byte
	write   bool // begin only
	id, gen uint64
	addr    uint64 // an op's first byte in the target's process (0 in a hello and an end)
	n       uint64
}

// encode returns the request's header.
func (q request) encode() [reqSize]byte {
	var h [reqSize]byte
	binary.BigEndian.PutUint16(h[0:], frameMagic)
	h[2] = q.kind
	if q.write {
		h[3] = 1
	}
	binary.BigEndian.PutUint64(h[8:], q.id)
	binary.BigEndian.PutUint64(h[16:], q.gen)
	binary.BigEndian.PutUint64(h[24:], q.addr)
	binary.BigEndian.PutUint64(h[32:], q.n)
	return h
}

// malformed is the error of a frame that breaks the protocol.
func malformed(format string, args ...any) error {
	return errors.Wrapf(driver.ErrInvalid, "transfer: malformed frame: "+format, args...)
}

// decodeRequest checks and decodes a request header; the error of a
// malformed one is ErrInvalid.
func decodeRequest(h [reqSize]byte) (request, error) {
	if m := binary.BigEndian.Uint16(h[0:]); m != frameMagic {
		return request{}, malformed("magic %#x", m)
	}
	q := request{kind: h[2], write: h[3]&1 != 0,
		id: binary.BigEndian.Uint64(h[8:]), gen: binary.BigEndian.Uint64(h[16:]),
		addr: binary.BigEndian.Uint64(h[24:]), n: binary.BigEndian.Uint64(h[32:])}
	if h[3]&^1 != 0 || (h[3] != 0 && q.kind != kindBegin) {
		return request{}, malformed("flags %#x on a request of kind %d", h[3], q.kind)
	}
	if binary.BigEndian.Uint32(h[4:]) != 0 {
		return request{}, malformed("reserved bytes not zero")
	}
	switch q.kind {
	case kindHello:
		if q.n > maxBlob || q.gen != 0 || q.addr != 0 {
			return request{}, malformed("a hello of %d bytes (at most %d) or with fields set", q.n, maxBlob)
		}
	case kindPut, kindGet, kindBegin:
		if q.n > maxOp {
			return request{}, malformed("%d bytes in one request (at most %d)", q.n, uint64(maxOp))
		}
	case kindEnd:
		if q.id != 0 || q.gen != 0 || q.addr != 0 || q.n != 0 {
			return request{}, malformed("an end with fields set")
		}
	default:
		return request{}, malformed("kind %d", q.kind)
	}
	return q, nil
}

// readRequest reads and decodes one request header and, for a hello, its
// blob.
func readRequest(r io.Reader) (request, []byte, error) {
	var h [reqSize]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return request{}, nil, err
	}
	q, err := decodeRequest(h)
	if err != nil || q.kind != kindHello {
		return q, nil, err
	}
	blob := make([]byte, q.n)
	if _, err := io.ReadFull(r, blob); err != nil {
		return request{}, nil, err
	}
	return q, blob, nil
}

// Response statuses: OK, or the sentinel the target's error was marked
// with, which the initiator marks its error with in turn.
const (
	statusOK byte = iota
	statusInvalid
	statusClosed
	statusAccessDenied
	statusUnsupported
	statusBusy
)

// statusSentinels lists the sentinel of each error status.
var statusSentinels = map[byte]error{
	statusInvalid:      driver.ErrInvalid,
	statusClosed:       driver.ErrClosed,
	statusAccessDenied: driver.ErrAccessDenied,
	statusUnsupported:  driver.ErrUnsupported,
	statusBusy:         driver.ErrBusy,
}

// statusOf is the status that tells err (nil: statusOK); an error marked
// with none of the listed sentinels goes as statusInvalid.
func statusOf(err error) byte {
	if err == nil {
		return statusOK
	}
	for s := statusInvalid; s <= statusBusy; s++ {
		if errors.Is(err, statusSentinels[s]) {
			return s
		}
	}
	return statusInvalid
}

// appendResponse appends a response of status and body (a message, or a
// hello's blob) to b.
func appendResponse(b []byte, status byte, body []byte) []byte {
	if len(body) > maxBlob {
		body = body[:maxBlob]
	}
	b = append(b, status, 0, 0, 0)
	b = binary.BigEndian.AppendUint32(b, uint32(len(body)))
	return append(b, body...)
}

// readResponse reads one response; a malformed one is ErrInvalid.
func readResponse(r io.Reader) (status byte, body []byte, err error) {
	var h [respSize]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	status, n := h[0], binary.BigEndian.Uint32(h[4:])
	if _, known := statusSentinels[status]; status != statusOK && !known {
		return 0, nil, malformed("response status %d", status)
	}
	if h[1]|h[2]|h[3] != 0 || n > maxBlob {
		return 0, nil, malformed("response of %d bytes (at most %d) or reserved bytes set", n, maxBlob)
	}
	body = make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, nil, err
	}
	return status, body, nil
}

// helloBlob is what each side of a hello tells the other: its engine's
// Addr (the target's; empty from the initiator), kind, and UCX worker
// address (the ucx target's; empty for tcp and from the initiator).
type helloBlob struct {
	addr, kind string
	worker     []byte
}

func (h helloBlob) encode() []byte {
	var b []byte
	for _, s := range []string{h.addr, h.kind} {
		b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
		b = append(b, s...)
	}
	return append(b, h.worker...)
}

func decodeHello(b []byte) (helloBlob, error) {
	var h helloBlob
	var ss [2]string
	for i := range ss {
		if len(b) < 2 || len(b) < 2+int(binary.BigEndian.Uint16(b)) {
			return helloBlob{}, malformed("a hello blob cut short")
		}
		n := int(binary.BigEndian.Uint16(b))
		ss[i], b = string(b[2:2+n]), b[2+n:]
	}
	h.addr, h.kind = ss[0], ss[1]
	if len(b) > 0 {
		h.worker = append([]byte(nil), b...)
	}
	return h, nil
}
