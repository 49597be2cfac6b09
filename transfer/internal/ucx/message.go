package ucx

import "encoding/binary"

// The active messages of windows (Endpoint.Send and Fetch): their ids
// (the C side's VMX_AM_*), and the header each carries, amHeaderSize
// bytes little-endian whatever the hosts: a window's token, an offset in
// it, and for a fetch the length asked and the window (and offset) its
// answer goes to.
const (
	amWrite = 1 // bytes for a window: token, off; the data
	amFetch = 2 // a request for n bytes of a window at off, answered with amData for into at intoOff; no data
	amData  = 3 // fetched bytes for a window: token, off; the data

	amHeaderSize = 40
)

type amHeader struct {
	token, off, n, into, intoOff uint64
}

func (h amHeader) encode() [amHeaderSize]byte {
	var b [amHeaderSize]byte
	for i, v := range []uint64{h.token, h.off, h.n, h.into, h.intoOff} {
		binary.LittleEndian.PutUint64(b[8*i:], v)
	}
	return b
}

// windowView is what a message is checked against: an open window's
// length and direction.
type windowView struct {
	n        uint64
	writable bool
}

// verdict is what becomes of a message.
type verdict int

const (
	dropped  verdict = iota // for no open window, of the wrong kind or direction, or malformed: nothing happens
	outside                 // for an open window, but not inside its bytes: dropped, and the window fails
	admitted                // k bytes at off of the window: copied in (write, data) or fetched
)

// admit checks a message as it came (its id, header bytes, data length
// and whether UCX gave a reply endpoint) against the open windows (look
// finds one by token): the verdict, the header, and the window's bytes
// [off, off+k) it moves when admitted. It trusts nothing of the message.
func admit(id int, hdr []byte, n uint64, reply bool, look func(token uint64) (windowView, bool)) (verdict, amHeader, uint64) {
	var h amHeader
	if len(hdr) != amHeaderSize {
		return dropped, h, 0
	}
	h = amHeader{
		token: binary.LittleEndian.Uint64(hdr), off: binary.LittleEndian.Uint64(hdr[8:]),
		n: binary.LittleEndian.Uint64(hdr[16:]), into: binary.LittleEndian.Uint64(hdr[24:]),
		intoOff: binary.LittleEndian.Uint64(hdr[32:]),
	}
	k := n
	switch id {
	case amWrite, amData:
	case amFetch:
		if n != 0 || !reply {
			return dropped, h, 0
		}
		k = h.n
	default:
		return dropped, h, 0
	}
	x, ok := look(h.token)
	switch {
	case !ok || x.writable != (id != amFetch):
		return dropped, h, 0
	case k == 0 || h.off > x.n || k > x.n-h.off:
		return outside, h, 0
	}
	return admitted, h, k
}
