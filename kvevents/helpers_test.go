package kvevents

import (
	"encoding/binary"
	"testing"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/require"
)

// replayFrom asks p's replay socket through d for the batches from the
// 8-byte frames req, and returns the sequence numbers sent before the
// end marker.
func replayFrom(t *testing.T, d zmq4.Socket, frames ...[]byte) []int64 {
	t.Helper()
	require.NoError(t, d.SendMulti(zmq4.NewMsgFrom(frames...)))
	var seqs []int64
	for {
		r, err := d.Recv()
		require.NoError(t, err)
		require.Len(t, r.Frames, 3)
		s := int64(binary.BigEndian.Uint64(r.Frames[1]))
		if s == EndSeq {
			require.Empty(t, r.Frames[2])
			return seqs
		}
		seqs = append(seqs, s)
	}
}

func seq8(v int64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(v))
	return b[:]
}

// greeting is a ZMTP 3.0 greeting, NULL mechanism, as a client.
func greeting() []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10] = 0xff, 0x7f, 3
	copy(g[12:], "NULL")
	return g
}

// readyAs is a READY command for a socket of type typ.
func readyAs(typ string) []byte {
	body := []byte{5}
	body = append(body, "READY"...)
	body = append(body, byte(len("Socket-Type")))
	body = append(body, "Socket-Type"...)
	body = binary.BigEndian.AppendUint32(body, uint32(len(typ)))
	body = append(body, typ...)
	return append([]byte{0x04, byte(len(body))}, body...)
}

// command is a short command frame of body.
func command(body string) []byte { return append([]byte{0x04, byte(len(body))}, body...) }

// badReadies are first commands the guard refuses: READYs whose
// properties are cut short (zmq4's parser panics on the first three),
// and commands that are no READY.
var badReadies = []struct{ name, body string }{
	{"a property name and no value length", "\x05READY\x0bSocket-Type"},
	{"a property of a zero-length name", "\x05READY\x00"},
	{"a property name past the body", "\x05READY\x04abcd"},
	{"a value past the body", "\x05READY\x01k\x00\x00\x00\x09abc"},
	{"a value length of 2^32-1", "\x05READY\x01k\xff\xff\xff\xff"},
	{"a command name past the body", "\x09READY"},
	{"another command", "\x04PING"},
	{"an empty command", ""},
}

func newPublisher(t *testing.T, o Options) *Publisher {
	t.Helper()
	o.Endpoint, o.ReplayEndpoint = "tcp://127.0.0.1:0", "tcp://127.0.0.1:0"
	p, err := New(o)
	require.NoError(t, err)
	return p
}
