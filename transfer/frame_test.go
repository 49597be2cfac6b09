package transfer

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzFrame: the control frame decoders never panic on any bytes, and
// what they accept encodes back to the bytes they read.
func FuzzFrame(f *testing.F) {
	blob := helloBlob{addr: "127.0.0.1:1", kind: "tcp", worker: []byte{1, 2}}.encode()
	hello := request{kind: kindHello, id: protocolVersion, n: uint64(len(blob))}.encode()
	f.Add(append(hello[:], blob...))
	put := request{kind: kindPut, id: 1, gen: 2, addr: 3, n: 4}.encode()
	f.Add(put[:])
	begin := request{kind: kindBegin, write: true, id: 1, gen: 2, addr: 3, n: 4}.encode()
	f.Add(begin[:])
	f.Add(appendResponse(nil, statusClosed, []byte("transfer: stale")))
	f.Add(appendResponse(nil, statusOK, blob))
	f.Fuzz(func(t *testing.T, b []byte) {
		if q, blob, err := readRequest(bytes.NewReader(b)); err == nil {
			h := q.encode()
			require.Equal(t, b[:reqSize], h[:])
			require.Equal(t, string(b[reqSize:reqSize+len(blob)]), string(blob))
			if hb, err := decodeHello(blob); err == nil {
				require.Equal(t, blob, hb.encode())
			}
		}
		if status, body, err := readResponse(bytes.NewReader(b)); err == nil {
			require.Equal(t, b[:respSize+len(body)], appendResponse(nil, status, body))
		}
		_, _ = decodeHello(b)
	})
}

// TestStatusRoundTrip: every sentinel a target answers comes back as
// itself.
func TestStatusRoundTrip(t *testing.T) {
	for s, sentinel := range statusSentinels {
		require.Equal(t, s, statusOf(sentinel))
	}
	require.Equal(t, statusOK, statusOf(nil))
}
