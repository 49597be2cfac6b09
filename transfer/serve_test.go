package transfer

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/vaspace"
)

// FuzzServe feeds the fuzzer's bytes, after a good hello, to a target's
// serving goroutine. The registration (id 1, its generation set to 7 so
// that the fuzzer can name it) is the middle third of a tensor whose
// other two thirds are a canary: whatever the bytes, the target never
// panics, never hangs, and never writes outside the registered bytes.
func FuzzServe(f *testing.F) {
	const third = 4096
	hello := func() []byte {
		blob := helloBlob{kind: "tcp"}.encode()
		h := request{kind: kindHello, id: protocolVersion, n: uint64(len(blob))}.encode()
		return append(h[:], blob...)
	}()
	frame := func(q request, payload int) []byte {
		h := q.encode()
		return append(h[:], bytes.Repeat([]byte{0x55}, payload)...)
	}
	f.Add(frame(request{kind: kindPut, id: 1, gen: 7, off: 100, n: 50}, 50))
	f.Add(frame(request{kind: kindGet, id: 1, gen: 7, off: third - 8, n: 8}, 0))
	f.Add(frame(request{kind: kindPut, id: 1, gen: 7, off: third - 8, n: 16}, 16))
	f.Add(frame(request{kind: kindPut, id: 1, gen: 7, off: 1<<64 - 8, n: 16}, 16))
	f.Add(append(frame(request{kind: kindPut, id: 1, gen: 7, off: 0, n: 8}, 8), frame(request{kind: kindPut, id: 1, gen: 6, off: 0, n: 8}, 8)...))

	drv, err := host.New(host.Options{Devices: 1, Capacity: 16 << 20, Granularity: 64 << 10})
	require.NoError(f, err)
	defer func() { require.NoError(f, drv.Close()) }()
	a, err := arena.New(vaspace.New(drv), physical.New(drv), arena.Options{Max: 1 << 20, ChunkSize: 64 << 10})
	require.NoError(f, err)
	defer func() { require.NoError(f, a.Close()) }()
	whole, err := tensor.OnArena(a, tensor.Uint8, 3*third)
	require.NoError(f, err)
	defer func() { require.NoError(f, whole.Release()) }()
	mid, err := whole.Narrow(0, third, third)
	require.NoError(f, err)

	f.Fuzz(func(t *testing.T, data []byte) {
		require.NoError(t, whole.Access(true, func(b []byte) error {
			for i := range b {
				b[i] = 0xaa
			}
			return nil
		}))
		e, err := New(Config{LeaseTimeout: 200 * time.Millisecond})
		require.NoError(t, err)
		r, err := e.Register(mid)
		require.NoError(t, err)
		r.gen = 7
		server, client := net.Pipe()
		e.mu.Lock()
		e.conns[server] = struct{}{}
		e.wg.Add(1)
		e.mu.Unlock()
		go e.serve(server)
		drained := make(chan struct{})
		go func() { _, _ = io.Copy(io.Discard, client); close(drained) }()
		_, _ = client.Write(append(hello[:len(hello):len(hello)], data...))
		_ = client.Close()
		<-drained
		require.NoError(t, e.Close())
		require.NoError(t, whole.Access(false, func(b []byte) error {
			for i, v := range b {
				if (i < third || i >= 2*third) && v != 0xaa {
					t.Fatalf("byte %d, outside the registered bytes [%d, %d), was written", i, third, 2*third)
				}
			}
			return nil
		}))
	})
}
