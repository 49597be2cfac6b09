package ucx

import (
	"encoding/binary"
	"testing"
)

// FuzzAdmit: whatever a peer sends (id, header bytes, data length, reply
// endpoint or not), admit never panics, and admits a message only for an
// open window of its direction, non-empty and inside the window's bytes;
// a message for no window is dropped, one outside an open window fails
// it. The seeds are one of each case.
func FuzzAdmit(f *testing.F) {
	good := amHeader{token: 7, off: 16, n: 32, into: 9, intoOff: 4}.encode()
	for _, c := range []struct {
		id    int
		hdr   []byte
		n     uint64
		reply bool
	}{
		{amWrite, good[:], 8, false}, {amData, good[:], 48, false}, {amFetch, good[:], 0, true},
		{amFetch, good[:], 1, true}, {amFetch, good[:], 0, false}, {amWrite, good[:39], 8, false},
		{9, good[:], 8, false}, {amWrite, make([]byte, amHeaderSize), 8, false},
	} {
		f.Add(c.id, c.hdr, c.n, c.reply)
	}
	windows := map[uint64]windowView{7: {n: 64, writable: true}, 8: {n: 64}, 9: {n: 1 << 20, writable: true}}
	look := func(token uint64) (windowView, bool) { x, ok := windows[token]; return x, ok }
	f.Fuzz(func(t *testing.T, id int, hdr []byte, n uint64, reply bool) {
		v, h, k := admit(id, hdr, n, reply, look)
		if len(hdr) != amHeaderSize {
			if v != dropped {
				t.Fatalf("a header of %d bytes was not dropped: %v", len(hdr), v)
			}
			return
		}
		if h.token != binary.LittleEndian.Uint64(hdr) {
			t.Fatalf("token %#x decoded from %x", h.token, hdr[:8])
		}
		x, open := windows[h.token]
		want := n
		if id == amFetch {
			want = h.n
		}
		switch v {
		case admitted:
			switch {
			case !open || x.writable != (id != amFetch):
				t.Fatalf("admitted for window %#x (open %t, %+v), message %d", h.token, open, x, id)
			case id != amWrite && id != amData && id != amFetch:
				t.Fatalf("admitted a message of id %d", id)
			case id == amFetch && (n != 0 || !reply):
				t.Fatalf("admitted a fetch with %d bytes of data, reply %t", n, reply)
			case k != want || k == 0 || h.off > x.n || k > x.n-h.off:
				t.Fatalf("admitted %d bytes at %d of a window of %d", k, h.off, x.n)
			}
		case outside:
			if !open || x.writable != (id != amFetch) {
				t.Fatalf("window %#x failed, but the message was not its (open %t)", h.token, open)
			}
			if want != 0 && h.off <= x.n && want <= x.n-h.off {
				t.Fatalf("%d bytes at %d of %d called outside", want, h.off, x.n)
			}
		case dropped:
			if open && x.writable == (id != amFetch) && (id == amWrite || id == amData || (id == amFetch && n == 0 && reply)) {
				t.Fatalf("a message for open window %#x of its direction dropped, not judged", h.token)
			}
		}
	})
}
