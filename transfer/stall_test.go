package transfer_test

import (
	"context"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/transfer"
)

// TestStalledPeerDoesNotFreezeTheCache: a peer's put into a KV cache
// sequence's keys stalls after its header and half its payload (a proxy
// holds the rest back), holding
// the target inside the tensor's access. The sequence is freed meanwhile:
// its Free waits for the put (the memory must not go under it) but the
// cache does not — goroutines admitting, appending and freeing other
// sequences on the same cache complete their rounds while the put and
// the Free are both still pending. Then the peer sends the rest: the put
// lands, the Free returns, and the registration is stale. Nothing waits
// on the clock (the engine's LeaseTimeout is an hour): the test counts
// the rounds done, and polls only for where the other goroutines are.
func TestStalledPeerDoesNotFreezeTheCache(t *testing.T) {
	h := mustHostMem(t, 16<<20)
	c, err := kvcache.New(h.space, h.mem, kvcache.Config{Layers: 1, KVHeads: 2, HeadDim: 64, DType: tensor.Float16,
		BlockTokens: 16, MaxContext: 2 * kvTokens, MaxSeqs: 4, PageSize: gran, MapAhead: -1, NoPrefixSharing: true})
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Close()) }()
	prompt := func(from int) []int {
		p := make([]int, kvTokens)
		for i := range p {
			p[i] = from + i
		}
		return p
	}
	stalled, err := c.Admit(prompt(1), 0)
	require.NoError(t, err)
	_, err = stalled.Append(prompt(1))
	require.NoError(t, err)
	k, err := stalled.K(0)
	require.NoError(t, err)

	e, err := transfer.New(transfer.Config{LeaseTimeout: time.Hour})
	require.NoError(t, err)
	defer func() { require.NoError(t, e.Close()) }()
	reg, err := e.Register(k)
	require.NoError(t, err)
	d, err := reg.Descriptor()
	require.NoError(t, err)
	// The initiator is a real engine whose connection goes through a
	// proxy that lets the hello and its answer through, then the put's
	// header and half its payload, and holds the rest until release.
	from, err := transfer.New(transfer.Config{LeaseTimeout: time.Hour})
	require.NoError(t, err)
	defer func() { require.NoError(t, from.Close()) }()
	src, err := newRegion(h.a, d.Len, 7)
	require.NoError(t, err)
	defer func() { require.NoError(t, src.end()) }()
	local, err := from.Register(src.t)
	require.NoError(t, err)
	defer func() { require.NoError(t, local.Close()) }()
	px, release := stallingProxy(t, e.Addr(), reqHeader+int(d.Len)/2)
	peer := connect(t, from, px)
	defer func() { require.NoError(t, peer.Close()) }()
	put := make(chan error, 1)
	go func() { put <- peer.Put(context.Background(), transfer.Op{Local: local, Remote: d, Len: d.Len}) }()
	// The target is inside the access once its put reads the payload.
	waitForStack(t, "transfer.(*Engine).servePut.func1", "io.ReadFull")

	freed := make(chan error, 1)
	go func() { freed <- stalled.Free() }()
	// The Free has begun once the lease refuses a new access.
	for {
		if _, err := k.At(0, 0, 0); err != nil {
			drivertest.RequireIs(t, err, driver.ErrClosed)
			break
		}
		runtime.Gosched()
	}

	const workers, rounds = 3, 20
	var done atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := prompt(1000 * (w + 2))
			for range rounds {
				s, err := c.Admit(p[:16], 0)
				if err == nil {
					_, err = s.Append(p[:16])
				}
				if err == nil {
					_, err = s.Append(p[16:20])
				}
				if err == nil {
					err = s.Free()
				}
				if err != nil {
					errs <- err
					return
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, int64(workers*rounds), done.Load(), "every round completed with the put stalled")
	select {
	case err := <-freed:
		t.Fatalf("Free returned (%v) while the put into its memory was in flight", err)
	default:
	}
	require.Zero(t, e.Stats().Puts, "the put is still pending")
	select {
	case err := <-put:
		t.Fatalf("the stalled put returned (%v)", err)
	default:
	}
	require.NoError(t, c.Check())

	release()
	require.NoError(t, <-put, "the put that was in flight lands")
	require.NoError(t, <-freed)
	require.Equal(t, uint64(1), e.Stats().Puts)
	require.True(t, k.Released(), "the keys tensor was revoked by the Free")
	_, err = reg.Descriptor()
	drivertest.RequireIs(t, err, driver.ErrClosed, "stale")
	require.NoError(t, reg.Close())
	require.NoError(t, c.Check())
}

// waitForStack polls the goroutines' stacks until one holds every one of
// frames (the order of the goroutines' steps is what the test needs to
// know, not a time).
func waitForStack(t *testing.T, frames ...string) {
	t.Helper()
	buf := make([]byte, 1<<20)
	for {
		for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			all := true
			for _, f := range frames {
				all = all && strings.Contains(g, f)
			}
			if all {
				return
			}
		}
		runtime.Gosched()
	}
}

// reqHeader is the size of a request's header (frame.go's reqSize).
const reqHeader = 40

// stallingProxy listens on the loopback device and relays one connection
// to target: everything until the target's first answer (the hello's),
// then budget bytes more from the initiator, then nothing from it until
// release is called. It returns its address and release (called at the
// test's end too).
func stallingProxy(t *testing.T, target string, budget int) (string, func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gate := make(chan struct{})
	release := sync.OnceFunc(func() { close(gate) })
	var wg sync.WaitGroup
	t.Cleanup(func() { release(); _ = ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		in, err := ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", target)
		if err != nil {
			_ = in.Close()
			return
		}
		var answered atomic.Bool
		wg.Add(1)
		go func() { // target to initiator
			defer wg.Done()
			buf := make([]byte, 64<<10)
			for {
				n, err := out.Read(buf)
				if n > 0 {
					answered.Store(true) // before the initiator sees it, so before it sends the put
					if _, werr := in.Write(buf[:n]); werr != nil {
						break
					}
				}
				if err != nil {
					break
				}
			}
			_ = in.Close()
		}()
		// initiator to target
		buf := make([]byte, 64<<10)
		left := budget
		for {
			n, err := in.Read(buf)
			b := buf[:n]
			if answered.Load() && left >= 0 {
				if len(b) >= left && left >= 0 {
					if _, werr := out.Write(b[:left]); werr != nil {
						break
					}
					b = b[left:]
					left = -1
					<-gate
				} else {
					left -= len(b)
				}
			}
			if len(b) > 0 {
				if _, werr := out.Write(b); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		_ = out.Close()
	}()
	return ln.Addr().String(), release
}
