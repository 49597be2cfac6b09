package transfer_test

import (
	"context"
	"encoding/binary"
	"io"
	"math"
	"net"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/transfer"
	"github.com/vmarena/vmarena/transfer/internal/ucx"
)

// loop is one engine with a peer to itself, a writable registration
// (w over region rw) and a read-only one (ro: its first half is a
// read-only prefix, as a KV cache's shared units are).
type loop struct {
	h      *hostMem
	e      *transfer.Engine
	p      *transfer.Peer
	rw     *region
	w, ro  *transfer.Registration
	dw, dr transfer.Descriptor
	roT    *tensor.Tensor
}

const loopSize = 64 << 10

func newLoop(t *testing.T) *loop {
	t.Helper()
	l := &loop{h: mustHostMem(t, 16<<20)}
	var err error
	l.e, err = transfer.New(transfer.Config{LeaseTimeout: 2 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.e.Close() })
	l.rw, err = newRegion(l.h.a, loopSize, 1)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, l.rw.end()) })
	v, err := l.h.a.Append(loopSize, 64)
	require.NoError(t, err)
	lease := tensor.NewLease()
	t.Cleanup(func() { lease.Revoke(); require.NoError(t, v.Release()) })
	l.roT, err = tensor.NewLeasedReadOnly(lease, v, loopSize/2, tensor.Uint8, loopSize)
	require.NoError(t, err)
	require.NoError(t, l.roT.Access(false, func([]byte) error { return nil }))
	l.w, err = l.e.Register(l.rw.t)
	require.NoError(t, err)
	l.ro, err = l.e.Register(l.roT)
	require.NoError(t, err)
	l.dw, err = l.w.Descriptor()
	require.NoError(t, err)
	l.dr, err = l.ro.Descriptor()
	require.NoError(t, err)
	require.True(t, l.dw.Writable)
	require.False(t, l.dr.Writable)
	l.p = connect(t, l.e, l.e.Addr())
	return l
}

// state is what a refused op must leave as it was.
type state struct {
	rw, ro string
	stats  transfer.Stats
}

func (l *loop) state(t *testing.T) state {
	t.Helper()
	rw, err := l.rw.bytes()
	require.NoError(t, err)
	var ro string
	require.NoError(t, l.roT.Access(false, func(b []byte) error { ro = sha(b); return nil }))
	return state{sha(rw), ro, l.e.Stats()}
}

// requireRefused checks that a refusal changed nothing but Refused, by
// want.
func (l *loop) requireRefused(t *testing.T, before state, refused uint64) {
	t.Helper()
	require.NoError(t, l.e.Check())
	after := l.state(t)
	before.stats.Refused += refused
	require.Equal(t, before, after)
}

// TestHostileDescriptors: a descriptor for an unknown id, a closed
// registration, a stale generation, a range past Len or one that
// overflows, a write to read-only memory, a descriptor of another engine:
// each is refused with its sentinel, by the initiator's checks or the
// target's (a forged descriptor gets past the former), and nothing
// changes but the count of refusals; a good op works afterwards.
func TestHostileDescriptors(t *testing.T) {
	l := newLoop(t)
	ctx := context.Background()
	closed, err := l.e.Register(l.rw.t)
	require.NoError(t, err)
	dc, err := closed.Descriptor()
	require.NoError(t, err)
	require.NoError(t, closed.Close())

	forged := func(f func(d *transfer.Descriptor)) transfer.Descriptor {
		d := l.dw
		f(&d)
		return d
	}
	for _, c := range []struct {
		name      string
		put       bool
		op        transfer.Op
		want      error
		fragments []string
	}{
		{"unknown id", true, transfer.Op{Local: l.w, Remote: forged(func(d *transfer.Descriptor) { d.ID = 1000 }), Len: 8},
			driver.ErrInvalid, []string{"no registration of that id"}},
		{"closed registration", true, transfer.Op{Local: l.w, Remote: dc, Len: 8}, driver.ErrClosed, []string{"closed"}},
		{"stale gen", false, transfer.Op{Local: l.w, Remote: forged(func(d *transfer.Descriptor) { d.Gen++ }), Len: 8},
			driver.ErrClosed, []string{"generation"}},
		{"past Len", true, transfer.Op{Local: l.w, Remote: l.dw, RemoteOff: loopSize - 4, Len: 8}, driver.ErrInvalid, nil},
		{"overflow", true, transfer.Op{Local: l.w, Remote: l.dw, RemoteOff: math.MaxUint64 - 3, Len: 8}, driver.ErrInvalid, nil},
		{"local overflow", false, transfer.Op{Local: l.w, LocalOff: math.MaxUint64 - 3, Remote: l.dw, Len: 8}, driver.ErrInvalid, nil},
		{"forged Len", true, transfer.Op{Local: l.w, Remote: forged(func(d *transfer.Descriptor) { d.Len = 1 << 30 }), RemoteOff: loopSize, Len: 8},
			driver.ErrInvalid, []string{"which has 65536 bytes"}},
		{"read-only remote", true, transfer.Op{Local: l.w, Remote: l.dr, Len: 8}, driver.ErrAccessDenied, []string{"read-only"}},
		{"forged writable", true, transfer.Op{Local: l.w, Remote: func() transfer.Descriptor { d := l.dr; d.Writable = true; return d }(), Len: 8},
			driver.ErrAccessDenied, []string{"read-only"}},
		{"read-only local", false, transfer.Op{Local: l.ro, Remote: l.dw, Len: 8}, driver.ErrAccessDenied, []string{"read-only"}},
		{"other engine", true, transfer.Op{Local: l.w, Remote: forged(func(d *transfer.Descriptor) { d.Engine = "10.0.0.1:1" }), Len: 8},
			driver.ErrInvalid, []string{"engine"}},
		{"no bytes", true, transfer.Op{Local: l.w, Remote: l.dw, Len: 0}, driver.ErrInvalid, nil},
		{"zero descriptor", true, transfer.Op{Local: l.w, Len: 8}, driver.ErrInvalid, nil},
		{"nil local", true, transfer.Op{Remote: l.dw, Len: 8}, driver.ErrInvalid, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := l.state(t)
			var err error
			if c.put {
				err = l.p.Put(ctx, transfer.Op{Local: l.w, Remote: l.dw, RemoteOff: 8, Len: 8}, c.op) // the good first op is not moved either: all are checked first, or it is done
			} else {
				err = l.p.Get(ctx, c.op)
			}
			drivertest.RequireIs(t, err, c.want, c.fragments...)
			after := l.state(t)
			if after.stats.Puts > before.stats.Puts {
				// A target's refusal comes after the ops before it are
				// done: the good first op moved 8 bytes within rw
				// (from offset 0 to offset 8).
				require.Equal(t, before.stats.Puts+2, after.stats.Puts, "issued and served")
				before = after
				before.stats.Refused--
			}
			l.requireRefused(t, before, 1)
		})
	}
	// A good op works afterwards.
	require.NoError(t, l.p.Get(ctx, transfer.Op{Local: l.w, LocalOff: 16, Remote: l.dr, Len: 8}))
}

// rawConn is a control connection to e on which the test writes frames
// by hand (the wire format of frame.go), after a good hello.
func rawConn(t *testing.T, e *transfer.Engine) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", e.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	_, err = c.Write(helloFrame(wireVersion, "tcp"))
	require.NoError(t, err)
	status, _ := readResp(t, c)
	require.Zero(t, status)
	return c
}

// wireVersion is the protocol version of frame.go (protocolVersion).
const wireVersion = 3

func helloFrame(version uint64, kind string) []byte {
	blob := binary.BigEndian.AppendUint16(nil, 0)
	blob = binary.BigEndian.AppendUint16(blob, uint16(len(kind)))
	blob = append(blob, kind...)
	return append(header(1, 0, version, 0, 0, uint64(len(blob))), blob...)
}

// header is a request header: magic, kind, flags, reserved, id, gen, off, len.
func header(kind, flags byte, id, gen, off, n uint64) []byte {
	h := binary.BigEndian.AppendUint16(nil, 0x7654)
	h = append(h, kind, flags, 0, 0, 0, 0)
	for _, v := range []uint64{id, gen, off, n} {
		h = binary.BigEndian.AppendUint64(h, v)
	}
	return h
}

// readResp reads a response: its status and body; status 255 when the
// connection ended instead (it was dropped).
func readResp(t *testing.T, c net.Conn) (byte, string) {
	t.Helper()
	var h [8]byte // a target that neither answers nor drops is go test -timeout's
	if _, err := io.ReadFull(c, h[:]); err != nil {
		var ne net.Error
		require.False(t, errorsAs(err, &ne) && ne.Timeout(), "the target neither answered nor dropped the connection")
		return 255, ""
	}
	body := make([]byte, binary.BigEndian.Uint32(h[4:]))
	_, err := io.ReadFull(c, body)
	require.NoError(t, err)
	return h[0], string(body)
}

// TestMalformedFrames: a frame that breaks the protocol gets the
// connection dropped, no answer, no byte written; a well-formed op the
// target must refuse is answered with its status after the payload is
// drained, and the connection goes on. The engine serves others
// throughout.
func TestMalformedFrames(t *testing.T) {
	l := newLoop(t)
	id, gen, a := l.dw.ID, l.dw.Gen, l.dw.Addr // a: the registration's first byte, which op frames name
	payload := make([]byte, 100)
	for i := range payload {
		payload[i] = 0xee
	}
	dropped := []struct {
		name  string
		frame []byte
	}{
		{"bad magic", append([]byte{0, 0}, header(2, 0, id, gen, a, 8)[2:]...)},
		{"unknown kind", header(9, 0, id, gen, a, 8)},
		{"flags on a put", append(header(2, 1, id, gen, a, 8), payload[:8]...)},
		{"reserved set", func() []byte { h := header(2, 0, id, gen, a, 8); h[5] = 1; return append(h, payload[:8]...) }()},
		{"past the largest op", header(2, 0, id, gen, a, 1<<41)},
		{"a second hello", helloFrame(wireVersion, "tcp")},
		{"end outside a begin", header(5, 0, 0, 0, 0, 0)},
		{"begin on tcp", header(4, 1, id, gen, a, 8)},
		{"cut short", header(2, 0, id, gen, a, 8)[:20]},
		{"payload cut short", append(header(2, 0, id, gen, a, 100), payload[:50]...)},
	}
	for _, c := range dropped {
		t.Run(c.name, func(t *testing.T) {
			before := l.state(t)
			conn := rawConn(t, l.e)
			_, err := conn.Write(c.frame)
			require.NoError(t, err)
			if c.name == "cut short" || c.name == "payload cut short" {
				require.NoError(t, conn.(*net.TCPConn).CloseWrite())
			}
			status, body := readResp(t, conn)
			require.Equal(t, byte(255), status, "dropped, not answered (%q)", body)
			after := l.state(t)
			if c.name == "payload cut short" {
				// The put was accepted and its bytes began to land inside the
				// registration when the connection failed: the target counts
				// nothing, and the registration is still good.
				after.rw = before.rw
			}
			require.Equal(t, before, after)
		})
	}
	answered := []struct {
		name   string
		frame  []byte
		status byte
	}{
		{"overflow", append(header(2, 0, id, gen, math.MaxUint64-50, 100), payload...), 1},
		{"past Len", append(header(2, 0, id, gen, a+loopSize-50, 100), payload...), 1},
		{"unknown id", append(header(2, 0, 999, gen, a, 100), payload...), 1},
		{"stale gen", append(header(2, 0, id, gen+1, a, 100), payload...), 2},
		{"read-only", append(header(2, 0, l.dr.ID, l.dr.Gen, l.dr.Addr, 100), payload...), 3},
		{"get past Len", header(3, 0, id, gen, a+loopSize, 1), 1},
		{"a byte before", append(header(2, 0, id, gen, a-1, 100), payload...), 1},
		{"a page before", header(3, 0, id, gen, a-4096, 100), 1},
		{"unmapped 0x1000", append(header(2, 0, id, gen, 0x1000, 100), payload...), 1},
		{"addr 0", header(3, 0, id, gen, 0, 1), 1},
	}
	conn := rawConn(t, l.e)
	for _, c := range answered {
		t.Run(c.name, func(t *testing.T) {
			before := l.state(t)
			_, err := conn.Write(c.frame)
			require.NoError(t, err)
			status, body := readResp(t, conn)
			require.Equal(t, c.status, status, body)
			require.Contains(t, body, "transfer: ")
			l.requireRefused(t, before, 1)
		})
	}
	// The connection goes on: a good get answers the bytes.
	_, err := conn.Write(header(3, 0, id, gen, a, 16))
	require.NoError(t, err)
	status, _ := readResp(t, conn)
	require.Zero(t, status)
	got := make([]byte, 16)
	_, err = io.ReadFull(conn, got)
	require.NoError(t, err)
	want, err := l.rw.bytes()
	require.NoError(t, err)
	require.Equal(t, want[:16], got)

	// Hellos the target refuses are answered, then dropped.
	for _, h := range [][]byte{helloFrame(1, "tcp"), helloFrame(wireVersion, "ucx")} {
		c, err := net.Dial("tcp", l.e.Addr())
		require.NoError(t, err)
		_, err = c.Write(h)
		require.NoError(t, err)
		status, body := readResp(t, c)
		require.Equal(t, byte(1), status, body)
		status, _ = readResp(t, c)
		require.Equal(t, byte(255), status)
		require.NoError(t, c.Close())
	}
}

// TestClosed: a closed registration, peer or engine refuses (ErrClosed)
// and changes nothing; closing twice is ErrClosed.
func TestClosed(t *testing.T) {
	l := newLoop(t)
	ctx := context.Background()
	r, err := l.e.Register(l.rw.t)
	require.NoError(t, err)
	require.NoError(t, r.Close())
	drivertest.RequireIs(t, r.Close(), driver.ErrClosed)
	_, err = r.Descriptor()
	drivertest.RequireIs(t, err, driver.ErrClosed)
	before := l.state(t)
	drivertest.RequireIs(t, l.p.Put(ctx, transfer.Op{Local: r, Remote: l.dw, Len: 8}), driver.ErrClosed)
	l.requireRefused(t, before, 1) // refused by the initiator, before anything was sent

	// A stale registration: the tensor's memory was taken back.
	require.NoError(t, l.rw.remap(2))
	_, err = l.w.Descriptor()
	drivertest.RequireIs(t, err, driver.ErrClosed, "stale")
	w2, err := l.e.Register(l.rw.t)
	require.NoError(t, err)
	d2, err := w2.Descriptor()
	require.NoError(t, err)
	require.Greater(t, d2.ID, l.dw.ID, "ids are never reused")

	p2 := connect(t, l.e, l.e.Addr())
	require.NoError(t, p2.Close())
	drivertest.RequireIs(t, p2.Close(), driver.ErrClosed)
	drivertest.RequireIs(t, p2.Get(ctx, transfer.Op{Local: w2, Remote: d2, Len: 8}), driver.ErrClosed)

	require.NoError(t, l.e.Close())
	drivertest.RequireIs(t, l.e.Close(), driver.ErrClosed)
	drivertest.RequireIs(t, l.p.Put(ctx, transfer.Op{Local: w2, Remote: d2, Len: 8}), driver.ErrClosed)
	_, err = l.e.Register(l.rw.t)
	drivertest.RequireIs(t, err, driver.ErrClosed)
	_, err = l.e.Connect(ctx, l.e.Addr())
	drivertest.RequireIs(t, err, driver.ErrClosed)
	_, err = w2.Descriptor()
	drivertest.RequireIs(t, err, driver.ErrClosed)
}

// TestNew: the config's refusals, and the ucx kind without UCX.
func TestNew(t *testing.T) {
	for _, c := range []transfer.Config{{Kind: "rdma"}, {LeaseTimeout: -1}, {DialRetries: -1}, {Listen: "no such address"}} {
		e, err := transfer.New(c)
		drivertest.RequireIs(t, err, driver.ErrInvalid)
		require.Nil(t, e)
	}
	e, err := transfer.New(transfer.Config{Kind: "ucx"})
	if ucx.Available {
		require.NoError(t, err)
		require.NoError(t, e.Close())
	} else {
		drivertest.RequireIs(t, err, driver.ErrUnsupported, "no UCX")
	}
	e, err = transfer.New(transfer.Config{})
	require.NoError(t, err)
	require.Equal(t, "tcp", e.Kind())
	require.NoError(t, e.Close())
}

// TestRegisterRefusals: Go memory, a strided tensor, a released one, an
// empty one and nil are refused, and no registration is made.
func TestRegisterRefusals(t *testing.T) {
	l := newLoop(t)
	goMem, err := tensor.New(goBuffer(make([]byte, 64)), tensor.Uint8, 64)
	require.NoError(t, err)
	_, err = l.e.Register(goMem)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "Go memory")
	x, err := tensor.OnArena(l.h.a, tensor.Uint8, 8, 8)
	require.NoError(t, err)
	tr, err := x.Transpose(0, 1)
	require.NoError(t, err)
	_, err = l.e.Register(tr)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "not contiguous")
	require.NoError(t, x.Release())
	_, err = l.e.Register(x)
	drivertest.RequireIs(t, err, driver.ErrClosed)
	empty, err := tensor.OnArena(l.h.a, tensor.Uint8, 0)
	require.NoError(t, err)
	_, err = l.e.Register(empty)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "no bytes")
	require.NoError(t, empty.Release())
	_, err = l.e.Register(nil)
	drivertest.RequireIs(t, err, driver.ErrInvalid)
	// No id was spent on a refusal.
	r, err := l.e.Register(l.rw.t)
	require.NoError(t, err)
	d, err := r.Descriptor()
	require.NoError(t, err)
	require.Equal(t, l.dr.ID+1, d.ID)
}

// TestConnectRetries: an address nobody listens at is tried DialRetries
// more times, then refused (ErrClosed); the retries are counted.
func TestConnectRetries(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	e, err := transfer.New(transfer.Config{DialRetries: 2})
	require.NoError(t, err)
	defer func() { require.NoError(t, e.Close()) }()
	_, err = e.Connect(context.Background(), addr)
	drivertest.RequireIs(t, err, driver.ErrClosed, "3 tries")
	require.Equal(t, uint64(2), e.Stats().Retries)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = e.Connect(ctx, addr)
	drivertest.RequireIs(t, err, driver.ErrClosed)
	require.ErrorIs(t, err, context.Canceled)
}

type goBuffer []byte

func (g goBuffer) Bytes() ([]byte, error) { return g, nil }

// TestStalledPut: a peer that sends a put's header and part of its
// payload, then nothing, holds the target's memory for LeaseTimeout at
// most: the owner's Revoke then returns, the connection is dropped, and
// the engine closes.
func TestStalledPut(t *testing.T) {
	h := mustHostMem(t, 16<<20)
	r, err := newRegion(h.a, 64<<10, 1)
	require.NoError(t, err)
	defer func() { require.NoError(t, r.end()) }()
	e, err := transfer.New(transfer.Config{LeaseTimeout: 200 * time.Millisecond})
	require.NoError(t, err)
	reg, err := e.Register(r.t)
	require.NoError(t, err)
	d, err := reg.Descriptor()
	require.NoError(t, err)
	c := rawConn(t, e)
	_, err = c.Write(append(header(2, 0, d.ID, d.Gen, d.Addr, 100), make([]byte, 50)...))
	require.NoError(t, err)
	time.Sleep(20 * time.Millisecond) // most likely inside the access now; either way the test holds
	revoked := make(chan struct{})
	go func() { r.lease.Revoke(); close(revoked) }()
	<-revoked
	status, _ := readResp(t, c)
	require.Equal(t, byte(255), status, "the connection is dropped")
	require.Equal(t, transfer.Stats{}, e.Stats())
	require.NoError(t, e.Close())
}

// TestRemapUnderLoad: peers put into and get from a registration while
// its owner remaps the memory (the Revoke waits for the transfers in
// flight) and then the registration closes (waiting likewise). Every op
// succeeds or answers ErrClosed, and the new memory is untouched: no
// transfer through the old registration lands in it.
func TestRemapUnderLoad(t *testing.T) {
	h := mustHostMem(t, 32<<20)
	const size = 64 << 10
	target, err := newRegion(h.a, size, 1)
	require.NoError(t, err)
	defer func() { require.NoError(t, target.end()) }()
	source, err := newRegion(h.a, size, 2)
	require.NoError(t, err)
	defer func() { require.NoError(t, source.end()) }()
	e, err := transfer.New(transfer.Config{})
	require.NoError(t, err)
	defer func() { require.NoError(t, e.Close()) }()
	tr, err := e.Register(target.t)
	require.NoError(t, err)
	sr, err := e.Register(source.t)
	require.NoError(t, err)
	d, err := tr.Descriptor()
	require.NoError(t, err)
	done := make(chan error, 4)
	var moved [4]int
	for g := range 4 {
		p := connect(t, e, e.Addr())
		go func() {
			defer p.Close()
			for i := 0; ; i++ {
				off := uint64(i*4096+g*1024) % (size - 16<<10)
				op := transfer.Op{Local: sr, LocalOff: off, Remote: d, RemoteOff: off, Len: 16 << 10}
				var err error
				if i%2 == 0 {
					err = p.Put(context.Background(), op)
				} else {
					err = p.Get(context.Background(), op)
				}
				if err != nil {
					if !errorsIs(err, driver.ErrClosed) {
						done <- err
						return
					}
					done <- nil
					return
				}
				moved[g]++
			}
		}()
	}
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, target.remap(3))
	require.NoError(t, tr.Close())
	for range 4 {
		err := <-done
		require.NoError(t, err)
	}
	got, err := target.bytes()
	require.NoError(t, err)
	require.Equal(t, sha(seeded(size, 3)), sha(got), "the new memory is untouched")
	t.Logf("ops done per peer before the remap: %v", moved)
}

// TestContext: a context that ended before an op starts returns its
// error and leaves the peer good; one that ends while an op waits on a
// stalled target cuts it short and closes the peer (ErrClosed).
func TestContext(t *testing.T) {
	l := newLoop(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	before := l.state(t)
	err := l.p.Put(ctx, transfer.Op{Local: l.w, Remote: l.dw, RemoteOff: 8, Len: 8})
	require.ErrorIs(t, err, context.Canceled)
	require.NoError(t, l.p.Get(context.Background(), transfer.Op{Local: l.w, LocalOff: 8, Remote: l.dr, Len: 8}), "the peer is still good")
	after := l.state(t)
	require.Equal(t, before.stats.Gets+2, after.stats.Gets)

	// A target that accepts the connection and never answers.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var q [40]byte
		if _, err := io.ReadFull(c, q[:]); err != nil {
			return
		}
		blob := make([]byte, binary.BigEndian.Uint64(q[32:]))
		_, _ = io.ReadFull(c, blob)
		addr := ln.Addr().String()
		body := binary.BigEndian.AppendUint16(nil, uint16(len(addr)))
		body = append(body, addr...)
		body = binary.BigEndian.AppendUint16(body, 3)
		body = append(body, "tcp"...)
		resp := binary.BigEndian.AppendUint32([]byte{0, 0, 0, 0}, uint32(len(body)))
		_, _ = c.Write(append(resp, body...))
		_, _ = io.Copy(io.Discard, c) // swallows everything, answers nothing
	}()
	p := connect(t, l.e, ln.Addr().String())
	d := l.dw
	d.Engine = ln.Addr().String()
	ctx, cancel = context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err = p.Put(ctx, transfer.Op{Local: l.w, Remote: d, Len: 8})
	drivertest.RequireIs(t, err, driver.ErrClosed, "the peer is closed")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	drivertest.RequireIs(t, p.Put(context.Background(), transfer.Op{Local: l.w, Remote: d, Len: 8}), driver.ErrClosed)
	require.NoError(t, p.Close(), "a broken peer closes once without an error")
	drivertest.RequireIs(t, p.Close(), driver.ErrClosed)
}

// TestKinds: Kinds names exactly the kinds New makes in this build: tcp
// always, ucx only where New of it succeeds.
func TestKinds(t *testing.T) {
	for _, kind := range []string{"tcp", "ucx"} {
		e, err := transfer.New(transfer.Config{Kind: kind})
		listed := slices.Contains(transfer.Kinds(), kind)
		if err != nil {
			drivertest.RequireIs(t, err, driver.ErrUnsupported)
			require.False(t, listed, "%s is listed, but New refuses it", kind)
			continue
		}
		require.True(t, listed, "New makes %s, but Kinds does not list it", kind)
		require.NoError(t, e.Close())
	}
	require.Contains(t, transfer.Kinds(), "tcp")
}

// TestStalledHeader: a peer that sends part of a request's header and
// then nothing, before its hello or after it, is dropped once
// LeaseTimeout has passed since the header's first byte, rather than
// holding its connection (one of the engine's maxServed) for good; a
// peer idle between requests is kept. Nothing changes, and the engine
// serves others afterwards.
func TestStalledHeader(t *testing.T) {
	l := newLoop(t)
	before := l.state(t)
	goroutines := runtime.NumGoroutine()
	put := header(2, 0, l.dw.ID, l.dw.Gen, l.dw.Addr, 8)
	for _, c := range []struct {
		name  string
		hello bool
		send  []byte
	}{
		{"part of a hello", false, helloFrame(wireVersion, "tcp")[:20]},
		{"one byte of a put", true, put[:1]},
		{"all but a byte of a put", true, put[:len(put)-1]},
		{"a get's magic", true, header(3, 0, l.dw.ID, l.dw.Gen, l.dw.Addr, 8)[:2]},
	} {
		t.Run(c.name, func(t *testing.T) {
			var conn net.Conn
			if c.hello {
				conn = rawConn(t, l.e)
			} else {
				var err error
				conn, err = net.Dial("tcp", l.e.Addr())
				require.NoError(t, err)
				defer conn.Close()
			}
			_, err := conn.Write(c.send)
			require.NoError(t, err)
			// The deadline tells a connection held for good from one
			// dropped, generously: the engine's LeaseTimeout is 2 s.
			require.NoError(t, conn.SetReadDeadline(time.Now().Add(60*time.Second)))
			status, body := readResp(t, conn)
			require.Equal(t, byte(255), status, "dropped, not answered (%q)", body)
		})
	}
	idle := rawConn(t, l.e) // said hello, and nothing since: kept
	require.NoError(t, l.p.Get(context.Background(), transfer.Op{Local: l.w, LocalOff: 16, Remote: l.dr, Len: 8}))
	_, err := idle.Write(header(3, 0, l.dw.ID, l.dw.Gen, l.dw.Addr, 16))
	require.NoError(t, err)
	status, _ := readResp(t, idle)
	require.Zero(t, status)
	_, err = io.ReadFull(idle, make([]byte, 16))
	require.NoError(t, err)
	require.NoError(t, idle.Close())
	require.NoError(t, l.e.Check())
	after := l.state(t)
	require.Equal(t, before.ro, after.ro)
	require.Equal(t, before.stats.Refused, after.stats.Refused)
	for runtime.NumGoroutine() > goroutines { // each dropped connection's goroutine ends; a leak hangs to -timeout
		time.Sleep(5 * time.Millisecond)
	}
}
