package transfer_test

import (
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

// TestStalledPeerDoesNotFreezeTheCache: a peer sends a put's header and
// half its payload into a KV cache sequence's keys, then stalls, holding
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
	conn := rawConn(t, e)
	payload := seeded(int(d.Len), 7)
	half := len(payload) / 2
	_, err = conn.Write(append(header(2, 0, d.ID, d.Gen, 0, d.Len), payload[:half]...))
	require.NoError(t, err)
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
	require.NoError(t, c.Check())

	_, err = conn.Write(payload[half:])
	require.NoError(t, err)
	status, msg := readResp(t, conn)
	require.Zero(t, status, "the put that was in flight lands: %s", msg)
	require.NoError(t, <-freed)
	require.Equal(t, uint64(1), e.Stats().Puts)
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
