package transfer_test

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/transfer"
)

// helloWith is a hello of the current version whose blob names addr,
// kind and worker bytes (an initiator's names only its kind).
func helloWith(addr, kind string, worker []byte) []byte {
	var blob []byte
	for _, s := range []string{addr, kind} {
		blob = binary.BigEndian.AppendUint16(blob, uint16(len(s)))
		blob = append(blob, s...)
	}
	blob = append(blob, worker...)
	return append(header(1, 0, wireVersion, 0, 0, uint64(len(blob))), blob...)
}

// initiatorTo makes an engine of kind in this process, a region of n
// bytes filled from seed 9 registered on it, and a peer of addr, all
// closed at the end of the test.
func initiatorTo(t *testing.T, kind, addr string, n uint64) (*region, *transfer.Registration, *transfer.Peer) {
	t.Helper()
	h := mustHostMem(t, 16<<20)
	local, err := newRegion(h.a, n, 9)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, local.end()) })
	e, err := transfer.New(transfer.Config{Kind: kind, LeaseTimeout: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Close()) })
	lr, err := e.Register(local.t)
	require.NoError(t, err)
	return local, lr, connect(t, e, addr)
}

// TestGarbageHello: a hello whose worker address is garbage (one 0xff
// byte, or a page of them), or that names an engine address, is refused
// with a clear error and the connection dropped; for ucx, a page of 0xff
// and one of random bytes sent to each of UCX's own listening sockets
// (its tcp transport's) are dropped by UCX; the target process lives (it
// runs in a child process: UCX's address unpacking aborts a process it
// is handed garbage), its memory is unchanged, and it serves a good peer
// afterwards.
func TestGarbageHello(t *testing.T) {
	kinds(t, func(t *testing.T, kind string) {
		const size = 64 << 10
		peer := startPeer(t, kind)
		d := peer.desc(peer.do("canary A %d 3", size))
		whole := peer.do("whole A")
		page := make([]byte, 4096)
		for i := range page {
			page[i] = 0xff
		}
		for _, h := range [][]byte{
			helloWith("", kind, []byte{0xff}),
			helloWith("", kind, page),
			helloWith("10.0.0.1:1", kind, nil),
		} {
			c, err := net.Dial("tcp", peer.addr)
			require.NoError(t, err)
			_, err = c.Write(h)
			require.NoError(t, err)
			status, body := readResp(t, c)
			require.Equal(t, byte(1), status, body)
			require.Contains(t, body, "transfer: hello refused: an initiator's hello names no address or worker")
			status, _ = readResp(t, c)
			require.Equal(t, byte(255), status, "dropped after the refusal")
			require.NoError(t, c.Close())
			require.Equal(t, "0 0 0 0 0", peer.do("stats"), "the target lives and counts nothing")
		}
		if kind == "ucx" {
			garbageUCX(t, peer)
		}
		require.Equal(t, whole, peer.do("whole A"))

		_, lr, p := initiatorTo(t, kind, peer.addr, size)
		require.NoError(t, p.Put(context.Background(), transfer.Op{Local: lr, Remote: d, Len: size}))
		require.Equal(t, sha(seeded(size, 9)), peer.hash("A"), "a good peer is served afterwards")
	})
}

// TestForgedDescriptors: a Put or Get through a descriptor whose address
// was moved by a byte or a page either way, or set to an unmapped page,
// or whose length grew by a byte, is refused (ErrInvalid, naming the
// registration's bounds) by the target, which runs in a child process
// (an unmapped address handed to UCX would crash it); the canary pages
// around the registration and the registration itself are unchanged, the
// peer stays good, and the target serves a good op afterwards.
func TestForgedDescriptors(t *testing.T) {
	kinds(t, func(t *testing.T, kind string) {
		const size = 64 << 10
		peer := startPeer(t, kind)
		d := peer.desc(peer.do("canary A %d 3", size))
		whole, mid := peer.do("whole A"), peer.hash("A")
		local, lr, p := initiatorTo(t, kind, peer.addr, 2*size)
		ctx := context.Background()
		mine, err := local.bytes()
		require.NoError(t, err)

		forge := func(f func(d *transfer.Descriptor)) transfer.Descriptor {
			g := d
			f(&g)
			return g
		}
		for _, c := range []struct {
			name string
			d    transfer.Descriptor
			off  uint64
			n    uint64
		}{
			{"a byte on", forge(func(d *transfer.Descriptor) { d.Addr++ }), 0, size},
			{"a byte back", forge(func(d *transfer.Descriptor) { d.Addr-- }), 0, size},
			{"a byte back, 8 bytes", forge(func(d *transfer.Descriptor) { d.Addr-- }), 0, 8},
			{"a page on", forge(func(d *transfer.Descriptor) { d.Addr += 4096 }), 0, size},
			{"a page on, at the end", forge(func(d *transfer.Descriptor) { d.Addr += 4096 }), size - 8, 8},
			{"a page back", forge(func(d *transfer.Descriptor) { d.Addr -= 4096 }), 0, 8},
			{"unmapped 0x1000", forge(func(d *transfer.Descriptor) { d.Addr = 0x1000 }), 0, size},
			{"unmapped 0x1000, 8 bytes", forge(func(d *transfer.Descriptor) { d.Addr = 0x1000 }), 0, 8},
			{"a byte longer", forge(func(d *transfer.Descriptor) { d.Len++ }), 0, size + 1},
			{"a byte longer, at the end", forge(func(d *transfer.Descriptor) { d.Len++ }), size, 1},
		} {
			for _, put := range []bool{true, false} {
				name := map[bool]string{true: "put ", false: "get "}[put] + c.name
				t.Run(name, func(t *testing.T) {
					op := transfer.Op{Local: lr, Remote: c.d, RemoteOff: c.off, Len: c.n}
					if put {
						err = p.Put(ctx, op)
					} else {
						err = p.Get(ctx, op)
					}
					drivertest.RequireIs(t, err, driver.ErrInvalid, "outside the registration, which has 65536 bytes at")
					require.NotErrorIs(t, err, driver.ErrClosed, "the peer stays good")
					require.Equal(t, whole, peer.do("whole A"), "no byte of the canaries or the registration changed")
					got, err := local.bytes()
					require.NoError(t, err)
					require.Equal(t, sha(mine), sha(got), "a refused get wrote nothing locally")
				})
			}
		}
		require.Equal(t, mid, peer.hash("A"))
		require.Equal(t, "0 0 0 0 20", peer.do("stats"), "20 refusals, nothing moved")
		require.NoError(t, p.Put(ctx, transfer.Op{Local: lr, Remote: d, Len: size}))
		require.Equal(t, sha(mine[:size]), peer.hash("A"), "a good put through the same peer afterwards")
		want := seeded(size+4*4096, 3)
		copy(want[2*4096:], mine[:size])
		require.Equal(t, sha(want), peer.do("whole A"), "the canaries are unchanged")
	})
}

// TestUCXRegisterExact: the ucx kind refuses (ErrInvalid) a tensor whose
// bytes UCX would register wider (its remote key would name a
// neighbour's bytes: an address or length not a multiple of 16 with UCX
// 1.13), and the engine is as it was: its first registration after gets
// id 1 and works.
func TestUCXRegisterExact(t *testing.T) {
	kinds(t, func(t *testing.T, kind string) {
		if kind != "ucx" {
			t.Skip("the tcp kind registers nothing with UCX")
		}
		h := mustHostMem(t, 16<<20)
		r, err := newRegion(h.a, 64<<10, 1)
		require.NoError(t, err)
		defer func() { require.NoError(t, r.end()) }()
		e, err := transfer.New(transfer.Config{Kind: kind})
		require.NoError(t, err)
		defer func() { require.NoError(t, e.Close()) }()
		for _, c := range []struct{ start, n int }{{1, 4096}, {0, 4095}, {8, 64}, {4096 - 1, 2}} {
			v, err := r.t.Narrow(0, c.start, c.n)
			require.NoError(t, err)
			_, err = e.Register(v)
			drivertest.RequireIs(t, err, driver.ErrInvalid, "its remote key would reach memory outside the tensor")
			require.NoError(t, e.Check())
		}
		v, err := r.t.Narrow(0, 16, 4096)
		require.NoError(t, err)
		reg, err := e.Register(v)
		require.NoError(t, err)
		d, err := reg.Descriptor()
		require.NoError(t, err)
		require.Equal(t, uint64(1), d.ID, "the refusals took no id")
		p := connect(t, e, e.Addr())
		defer func() { require.NoError(t, p.Close()) }()
		require.NoError(t, p.Get(context.Background(), transfer.Op{Local: reg, Remote: d, Len: 8, LocalOff: 8}))
	})
}

// garbageUCX sends a page of 0xff bytes and a page of random ones to
// each TCP socket the ucx target's UCX listens on (its tcp transport's:
// what UCX's own wire protocol parses), and checks that the target lives.
func garbageUCX(t *testing.T, peer *peerProc) {
	t.Helper()
	ports := strings.Fields(peer.do("ucxports"))
	require.NotEmpty(t, ports, "UCX listens on no TCP socket: UCX_TLS has no tcp?")
	host, _, err := net.SplitHostPort(peer.addr)
	require.NoError(t, err)
	ff := make([]byte, 4096)
	for i := range ff {
		ff[i] = 0xff
	}
	for _, port := range ports {
		for _, page := range [][]byte{ff, seeded(4096, 77)} {
			u, err := net.Dial("tcp", net.JoinHostPort(host, port))
			if err != nil {
				continue // a socket UCX listens on elsewhere (another device's address)
			}
			_, _ = u.Write(page) // UCX may reset the connection before it read all of it
			require.NoError(t, u.SetReadDeadline(time.Now().Add(10*time.Second)))
			_, _ = io.Copy(io.Discard, u)
			require.NoError(t, u.Close())
			require.Equal(t, "0 0 0 0 0", peer.do("stats"), "the target lives after garbage on UCX's port %s", port)
		}
	}
}
