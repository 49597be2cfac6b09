package kvevents

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// scanAll runs a fresh guard over data, in pieces of at most chunk bytes,
// and reports whether it refused it and whether the handshake got done.
func scanAll(data []byte, chunk int) (refused, handshook bool) {
	g := &guardConn{greet: greetingLen, timer: time.NewTimer(time.Hour)}
	defer g.timer.Stop()
	for len(data) > 0 {
		n := min(chunk, len(data))
		if g.scan(data[:n]) != nil {
			return true, g.handshook
		}
		data = data[n:]
	}
	return false, g.handshook
}

// cat is the parts one after another, in a slice of its own.
func cat(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// TestGuardFrames: what a subscriber and a replay client send passes;
// each bound refuses, and so does a first command that is no READY of
// whole properties.
func TestGuardFrames(t *testing.T) {
	hello := cat(greeting(), readyAs("DEALER"))
	request := cat([]byte{0x01, 0, 0x00, 8}, seq8(3))
	long := func(n uint64) []byte { return binary.BigEndian.AppendUint64([]byte{0x02}, n) }
	type guardCase struct {
		name    string
		data    []byte
		refused bool
	}
	cases := []guardCase{
		{"a replay request", cat(hello, request), false},
		{"a subscription", cat(greeting(), readyAs("SUB"), []byte{0x00, 3, 1, 'k', 'v'}), false},
		{"a READY of no property", cat(greeting(), command("\x05READY"), request), false},
		{"a long frame of 64 KiB", cat(hello, long(maxFrame), make([]byte, maxFrame)), false},
		{"a frame over 64 KiB", cat(hello, long(maxFrame+1)), true},
		{"a frame of 2^63 bytes", cat(hello, long(1<<63)), true},
		{"nine frames", cat(hello, []byte{1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 0, 0}), true},
		{"eight frames", cat(hello, []byte{1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 0, 0}), false},
		{"unknown flags", cat(hello, []byte{0x08, 0}), true},
		{"a command with MORE", cat(hello, []byte{0x05, 0, 0x04, 0}), true},
		{"a long command with MORE", cat(hello, []byte{0x07, 0, 0, 0, 0, 0, 0, 0, 0}), true},
		{"a READY with MORE", cat(greeting(), []byte{0x05}, readyAs("DEALER")[1:]), true},
		{"a frame with MORE, then a command", cat(hello, []byte{0x01, 0, 0x04, 0}), false},
		{"a ping", cat(hello, command("\x04PING\x00\x00")), false},
		{"a message before READY", append(greeting(), 0x00, 0), true},
		{"no signature", append([]byte("GET / HTTP/1.1\r\n"), make([]byte, 64)...), true},
		{"ZMTP 2", func() []byte { g := greeting(); g[10] = 1; return g }(), true},
	}
	for _, b := range badReadies {
		cases = append(cases, guardCase{"READY: " + b.name, cat(greeting(), command(b.body)), true})
	}
	for _, tc := range cases {
		for _, chunk := range []int{1, 3, 64, 1 << 20} {
			refused, _ := scanAll(tc.data, chunk)
			require.Equal(t, tc.refused, refused, "%s in pieces of %d", tc.name, chunk)
		}
	}
	_, handshook := scanAll(hello, 5)
	require.True(t, handshook, "READY ends the handshake")
}

// FuzzGuard: any bytes, in any pieces, are scanned without a panic, and
// the verdict does not depend on how the reads cut them.
func FuzzGuard(f *testing.F) {
	hello := cat(greeting(), readyAs("DEALER"))
	f.Add(cat(hello, []byte{0x01, 0, 0x00, 8, 0, 0, 0, 0, 0, 0, 0, 1}), uint8(1))
	f.Add(cat(hello, []byte{0x02, 0xff, 0, 0, 0, 0, 0, 0, 0}), uint8(7))
	f.Add([]byte("garbage"), uint8(3))
	f.Fuzz(func(t *testing.T, data []byte, chunk uint8) {
		r1, h1 := scanAll(data, 1<<30)
		r2, h2 := scanAll(data, int(chunk)%17+1)
		require.Equal(t, r1, r2)
		require.Equal(t, h1, h2)
	})
}
