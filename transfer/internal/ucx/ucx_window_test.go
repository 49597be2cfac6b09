//go:build ucx && linux && cgo

package ucx

import (
	"bytes"
	"context"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
)

// waitWithin and flushWithin wait with a deadline that is the behaviour
// under test: a window nothing fills, a flush to a stopped peer, each
// ending in context.DeadlineExceeded.
func waitWithin(x *Window, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return x.Wait(ctx)
}

func flushWithin(t *testing.T, e *Endpoint, d time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return e.Flush(ctx)
}

// open opens a window over n bytes at off of the peer's memory and
// returns its token.
func (p *peer) open(off, n int, writable bool) uint64 {
	p.t.Helper()
	w := map[bool]int{true: 1, false: 0}[writable]
	p.send("open %d %d %d", off, n, w)
	token, err := strconv.ParseUint(p.line(), 16, 64)
	require.NoError(p.t, err)
	return token
}

// wait answers the peer's Wait of the window: "ok" or "err ...".
func (p *peer) wait(token uint64) string {
	p.t.Helper()
	p.send("wait %x", token)
	return p.line()
}

func (p *peer) shut(token uint64) {
	p.t.Helper()
	p.send("shut %x", token)
	require.Equal(p.t, "ok", p.line())
}

func (p *peer) dropped() uint64 {
	p.t.Helper()
	p.send("dropped")
	n, err := strconv.ParseUint(p.line(), 10, 64)
	require.NoError(p.t, err)
	return n
}

// droppedAfter waits (a bounded count of rounds) for the peer's count of
// dropped messages to pass n, and returns it.
func (p *peer) droppedAfter(n uint64) uint64 {
	p.t.Helper()
	for range 500 {
		if d := p.dropped(); d > n {
			return d
		}
		time.Sleep(10 * time.Millisecond)
	}
	p.t.Fatalf("the peer dropped no message after %d", n)
	return 0
}

// TestWindowsByteExact writes and fetches 20 random spans of random bytes
// through windows between this process and a peer, each transport, in
// one Send or Fetch (split by the binding in messages of amChunk bytes),
// and compares every byte on the other side; the bytes around each span
// never change.
func TestWindowsByteExact(t *testing.T) {
	for _, tc := range transports {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			w := newWorker(t)
			p := startPeer(t)
			local := newMappedT(t)
			e, err := w.Connect(p.addr)
			skipUnsupported(t, err, "Connect")
			seed := uint64(time.Now().UnixNano())
			t.Logf("seed %d", seed)
			rng := rand.New(rand.NewPCG(seed, 23))
			for i := range 20 {
				loff, n := span(rng)
				roff := rng.IntN(memSize - n + 1)
				// The window's bytes and a page on either side of them.
				lo, hi := max(roff-4096, 0), min(roff+n+4096, memSize)
				before := p.read(lo, hi-lo)
				for j := range n {
					local.b[loff+j] = byte(rng.Uint32())
				}
				token := p.open(roff, n, true)
				require.NoError(t, e.Send(token, 0, local.addr()+uintptr(loff), uint64(n)))
				require.NoError(t, flushed(t, e))
				require.Equal(t, "ok", p.wait(token), "round %d: a write of %d bytes", i, n)
				p.shut(token)
				after := p.read(lo, hi-lo)
				in := roff - lo
				require.True(t, bytes.Equal(local.b[loff:loff+n], after[in:in+n]), "round %d: wrote %d bytes", i, n)
				require.True(t, bytes.Equal(before[:in], after[:in]) && bytes.Equal(before[in+n:], after[in+n:]), "round %d: bytes outside the window changed", i)

				roff, n = span(rng)
				loff = rng.IntN(memSize - n + 1)
				want := make([]byte, n)
				for j := range want {
					want[j] = byte(rng.Uint32())
				}
				p.write(roff, want)
				around := append([]byte(nil), local.b...)
				token = p.open(roff, n, false)
				into, intoToken, err := w.Open(local.addr()+uintptr(loff), uint64(n), true)
				require.NoError(t, err)
				require.NoError(t, e.Fetch(token, 0, uint64(n), intoToken, 0))
				require.NoError(t, into.Wait(context.Background()), "round %d: a fetch of %d bytes", i, n)
				require.NoError(t, into.Close())
				p.shut(token)
				require.True(t, bytes.Equal(want, local.b[loff:loff+n]), "round %d: fetched %d bytes", i, n)
				require.True(t, bytes.Equal(around[:loff], local.b[:loff]) && bytes.Equal(around[loff+n:], local.b[loff+n:]), "round %d: local bytes outside the window changed", i)
			}
			d, err := w.Dropped()
			require.NoError(t, err)
			require.Zero(t, d, "nothing dropped here")
			require.Zero(t, p.dropped(), "nothing dropped by the peer")
			require.NoError(t, e.Close())
			p.quit()
		})
	}
}

// TestWindowChecks: what a peer sends for a window it may not reach is
// dropped by the receiving worker, which changes no byte: a write to a
// closed window (a put that comes late), to a window of the other
// direction, or past a window's end (which also fails that window); a
// fetch of a writable window, or past a window's end. The endpoint stays
// good, and a good write follows.
func TestWindowChecks(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	t.Setenv("UCX_NET_DEVICES", "lo")
	w := newWorker(t)
	p := startPeer(t)
	local := newMappedT(t)
	for i := range local.b {
		local.b[i] = byte(i*7 + 1)
	}
	e, err := w.Connect(p.addr)
	skipUnsupported(t, err, "Connect")
	whole := p.read(0, memSize)
	dropped := p.dropped()
	same := func(what string) {
		t.Helper()
		dropped = p.droppedAfter(dropped)
		require.True(t, bytes.Equal(whole, p.read(0, memSize)), "%s: the peer's bytes changed", what)
	}

	closed := p.open(4096, 4096, true)
	p.shut(closed)
	require.NoError(t, e.Send(closed, 0, local.addr(), 4096))
	require.NoError(t, flushed(t, e))
	same("a write to a closed window")

	readOnly := p.open(4096, 4096, false)
	require.NoError(t, e.Send(readOnly, 0, local.addr(), 4096))
	require.NoError(t, flushed(t, e))
	same("a write to a window for fetches")

	small := p.open(4096, 64, true)
	require.NoError(t, e.Send(small, 0, local.addr(), 65))
	require.NoError(t, flushed(t, e))
	same("a write past the window's end")
	require.True(t, strings.HasPrefix(p.wait(small), "err "), "the window failed")
	require.NoError(t, e.Send(small, 60, local.addr(), 8))
	require.NoError(t, flushed(t, e))
	same("a write that straddles the window's end")

	into, intoToken, err := w.Open(local.addr(), 4096, true)
	require.NoError(t, err)
	writable := p.open(8192, 4096, true)
	require.NoError(t, e.Fetch(writable, 0, 4096, intoToken, 0))
	require.NoError(t, flushed(t, e))
	same("a fetch of a writable window")
	require.NoError(t, e.Fetch(readOnly, 1, 4096, intoToken, 0))
	require.NoError(t, flushed(t, e))
	same("a fetch past the window's end")
	require.ErrorIs(t, waitWithin(into, 100*time.Millisecond), context.DeadlineExceeded, "nothing came for the local window")
	require.NoError(t, into.Close())
	for _, x := range []uint64{readOnly, small, writable} {
		p.shut(x)
	}

	good := p.open(0, 4096, true)
	require.NoError(t, e.Send(good, 0, local.addr(), 4096))
	require.NoError(t, flushed(t, e))
	require.Equal(t, "ok", p.wait(good))
	require.True(t, bytes.Equal(local.b[:4096], p.read(0, 4096)), "a good write lands")
	p.shut(good)
	require.NoError(t, e.Close())
	p.quit()
}

// TestWindowRefusals: bad arguments are ErrInvalid and open nothing;
// Wait answers the context's end, and a closed window's Wait answers
// ErrClosed; after the worker's Close, Open is ErrClosed and a window's
// Close is nil.
func TestWindowRefusals(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	t.Setenv("UCX_NET_DEVICES", "lo")
	w, err := NewWorker(false)
	skipUnsupported(t, err, "NewWorker")
	mem := newMappedT(t)
	for _, c := range []struct {
		addr uintptr
		n    uint64
	}{{0, 8}, {mem.addr(), 0}, {^uintptr(7), 16}} {
		_, _, err := w.Open(c.addr, c.n, true)
		require.ErrorIs(t, err, driver.ErrInvalid)
	}
	x, token, err := w.Open(mem.addr(), 8, true)
	require.NoError(t, err)
	require.NotZero(t, token)
	require.ErrorIs(t, x.Wait(nil), driver.ErrInvalid) //nolint:staticcheck // a nil context is what is refused
	require.ErrorIs(t, waitWithin(x, time.Millisecond), context.DeadlineExceeded)
	addr, err := w.Address()
	require.NoError(t, err)
	e, err := w.Connect(addr)
	skipUnsupported(t, err, "Connect")
	require.ErrorIs(t, e.Send(0, 0, mem.addr(), 8), driver.ErrInvalid)
	require.ErrorIs(t, e.Send(token, ^uint64(3), mem.addr(), 8), driver.ErrInvalid)
	require.ErrorIs(t, e.Fetch(token, 0, 0, token, 0), driver.ErrInvalid)
	require.ErrorIs(t, e.Fetch(token, 0, 8, 0, 0), driver.ErrInvalid)
	require.NoError(t, x.Close())
	require.NoError(t, x.Close(), "closing twice")
	require.ErrorIs(t, x.Wait(context.Background()), driver.ErrClosed)
	y, _, err := w.Open(mem.addr(), 8, false)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	require.ErrorIs(t, y.Wait(context.Background()), driver.ErrClosed, "the worker's Close ends its windows")
	require.NoError(t, y.Close(), "a window's Close after the worker's")
	_, _, err = w.Open(mem.addr(), 8, true)
	require.ErrorIs(t, err, driver.ErrClosed)
	require.ErrorIs(t, e.Send(token, 0, mem.addr(), 8), driver.ErrClosed)
	require.NoError(t, e.Close())
}

// TestNoRMATarget: a worker made without RMA (as package transfer's
// engine makes its worker) refuses Put and Get (ErrUnsupported), and
// serves none: a peer's one-sided put into its registered memory, with
// the right remote key, is dropped by its UCX (which has no handler of
// the messages that emulate it over tcp, and warns), so the put never
// completes and no byte changes; the target lives and a write through a
// window lands afterwards.
func TestNoRMATarget(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	t.Setenv("UCX_NET_DEVICES", "lo")
	target, err := NewWorker(false)
	skipUnsupported(t, err, "NewWorker")
	defer func() { require.NoError(t, target.Close()) }()
	w := newWorker(t)
	mem, local := newMappedT(t), newMappedT(t)
	for i := range local.b {
		local.b[i] = 0xa5
	}
	reg, err := target.Register(mem.addr(), memSize)
	require.NoError(t, err)
	rkey, err := reg.RKey()
	require.NoError(t, err)
	addr, err := target.Address()
	require.NoError(t, err)
	self, err := target.Connect(addr)
	skipUnsupported(t, err, "Connect")
	require.ErrorIs(t, self.Put(local.addr(), 8, uint64(mem.addr()), rkey), driver.ErrUnsupported)
	require.ErrorIs(t, self.Get(local.addr(), 8, uint64(mem.addr()), rkey), driver.ErrUnsupported)
	require.NoError(t, self.Close())

	e, err := w.Connect(addr)
	skipUnsupported(t, err, "Connect")
	require.NoError(t, e.Put(local.addr(), 4096, uint64(mem.addr()), rkey))
	// The put's completion never comes: the flush waits until its
	// context ends (a bound of the wait, not of how fast anything is).
	require.ErrorIs(t, flushWithin(t, e, 300*time.Millisecond), context.DeadlineExceeded)
	require.Equal(t, make([]byte, memSize), mem.b, "no byte of the target changed")

	x, token, err := target.Open(mem.addr(), 4096, true)
	require.NoError(t, err)
	// No flush: the put before never completes on this endpoint.
	require.NoError(t, e.Send(token, 0, local.addr(), 4096))
	require.NoError(t, x.Wait(context.Background()))
	require.Equal(t, local.b[:4096], mem.b[:4096], "a write through a window lands")
	require.NoError(t, x.Close())
	require.NoError(t, e.Close())
	require.NoError(t, reg.Close())
}
