package transfer

import (
	"bytes"
	"encoding/binary"
	stderrors "errors"
	"io"
	"net"
	"testing"
	"time"
	"unsafe"

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
// The fuzzer cannot know where the registration is mapped, so an op
// frame's addr is taken as relative to the tensor's first byte (the
// canary's) and rebased before it is sent (rebase): the fuzzer reaches
// the registration, its edges and the canary around it.
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
	f.Add(frame(request{kind: kindPut, id: 1, gen: 7, addr: third + 100, n: 50}, 50))
	f.Add(frame(request{kind: kindGet, id: 1, gen: 7, addr: 2*third - 8, n: 8}, 0))
	f.Add(frame(request{kind: kindPut, id: 1, gen: 7, addr: 2*third - 8, n: 16}, 16))
	f.Add(frame(request{kind: kindPut, id: 1, gen: 7, addr: 1<<64 - 8, n: 16}, 16))
	f.Add(append(frame(request{kind: kindPut, id: 1, gen: 7, addr: third, n: 8}, 8), frame(request{kind: kindPut, id: 1, gen: 6, addr: third, n: 8}, 8)...))

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
	var base uint64
	require.NoError(f, whole.Access(false, func(b []byte) error { base = uint64(uintptr(unsafe.Pointer(&b[0]))); return nil }))

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
		_, _ = client.Write(append(hello[:len(hello):len(hello)], rebase(data, base)...))
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

// rebase returns data with base added to the addr field of each op
// frame's header, walking the frames as a target reads them (a put's
// payload is skipped); the bytes after the first header that does not
// decode are left as they are.
func rebase(data []byte, base uint64) []byte {
	out := append([]byte(nil), data...)
	for b := out; len(b) >= reqSize; {
		q, err := decodeRequest([reqSize]byte(b[:reqSize]))
		if err != nil {
			break
		}
		if q.kind == kindPut || q.kind == kindGet || q.kind == kindBegin {
			binary.BigEndian.PutUint64(b[24:], q.addr+base)
		}
		b = b[reqSize:]
		if q.kind == kindPut {
			b = b[min(uint64(len(b)), q.n):]
		}
	}
	return out
}

// TestServedConnectionsBounded: an engine serves at most maxServed
// connections at once; one past it is closed as it is accepted, the
// others go on, and once one of them ends a new one is served again.
func TestServedConnectionsBounded(t *testing.T) {
	old := maxServed
	maxServed = 4
	t.Cleanup(func() { maxServed = old })
	e, err := New(Config{})
	require.NoError(t, err)
	defer func() { require.NoError(t, e.Close()) }()
	hello := func() []byte {
		blob := helloBlob{kind: "tcp"}.encode()
		h := request{kind: kindHello, id: protocolVersion, n: uint64(len(blob))}.encode()
		return append(h[:], blob...)
	}()
	// greet dials and says hello: true when the engine answers, false
	// when it closes the connection instead.
	greet := func() (net.Conn, bool) {
		c, err := net.Dial("tcp", e.Addr())
		require.NoError(t, err)
		_, _ = c.Write(hello)
		var h [8]byte
		if _, err := io.ReadFull(c, h[:]); err != nil {
			var ne net.Error
			require.False(t, stderrors.As(err, &ne) && ne.Timeout())
			_ = c.Close()
			return nil, false
		}
		_, err = io.ReadFull(c, make([]byte, binary.BigEndian.Uint32(h[4:])))
		require.NoError(t, err)
		require.Zero(t, h[0])
		return c, true
	}
	var held []net.Conn
	for range maxServed {
		c, ok := greet()
		require.True(t, ok)
		held = append(held, c)
	}
	_, ok := greet()
	require.False(t, ok, "one past the bound is closed")
	require.NoError(t, held[0].Close())
	// The engine forgets the ended connection when its goroutine sees
	// the close: until then a new one may still be turned away.
	for {
		if c, ok := greet(); ok {
			require.NoError(t, c.Close())
			break
		}
		time.Sleep(time.Millisecond)
	}
	for _, c := range held[1:] {
		require.NoError(t, c.Close())
	}
}
