package transfer_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/sleep"
	"github.com/vmarena/vmarena/transfer"
)

// sleepMem is a sleep.Manager over a host driver with one allocation in
// tag "weights", filled from seed.
type sleepMem struct {
	drv *host.Driver
	m   *sleep.Manager
	p   driver.Addr
	n   uint64
}

func newSleepMem(t *testing.T, n, seed uint64) *sleepMem {
	t.Helper()
	drv, err := host.New(host.Options{Devices: 1, Capacity: 64 << 20, Granularity: gran})
	require.NoError(t, err)
	m, err := sleep.New(drv, sleep.Options{TagMax: 16 << 20, ChunkSize: gran, BackupDir: t.TempDir()})
	require.NoError(t, err)
	s := &sleepMem{drv: drv, m: m, n: n}
	s.p, err = m.Alloc("weights", n)
	require.NoError(t, err)
	require.NoError(t, drv.Write(s.p, seeded(int(n), seed)))
	t.Cleanup(func() {
		require.NoError(t, m.Free(s.p))
		require.NoError(t, m.Close())
		require.NoError(t, drv.Close())
	})
	return s
}

func (s *sleepMem) bytes(t *testing.T) []byte {
	t.Helper()
	b := make([]byte, s.n)
	require.NoError(t, s.drv.Read(s.p, b))
	return b
}

// register registers a new tensor over the allocation with e.
func (s *sleepMem) register(t *testing.T, e *transfer.Engine) (*transfer.Registration, transfer.Descriptor) {
	t.Helper()
	tt, err := s.m.Tensor(s.p)
	require.NoError(t, err)
	reg, err := e.Register(tt)
	require.NoError(t, err)
	d, err := reg.Descriptor()
	require.NoError(t, err)
	return reg, d
}

// TestTransferRefusedAfterSleep (a transfer into memory that slept is an
// error): a peer engine puts into and gets from a
// registration over a sleep.Manager's tensor; once the tag sleeps, and
// still after it wakes, every op through that registration is refused
// (ErrClosed) and the woken bytes are what the sleep kept, untouched; a
// new tensor's registration after the wake works.
func TestTransferRefusedAfterSleep(t *testing.T) {
	kinds(t, func(t *testing.T, kind string) {
		const size = 256 << 10
		s := newSleepMem(t, size, 1)
		h := mustHostMem(t, 16<<20)
		src, err := newRegion(h.a, size, 2)
		require.NoError(t, err)
		defer func() { require.NoError(t, src.end()) }()
		owner, err := transfer.New(transfer.Config{Kind: kind})
		require.NoError(t, err)
		defer func() { require.NoError(t, owner.Close()) }()
		init, err := transfer.New(transfer.Config{Kind: kind})
		require.NoError(t, err)
		defer func() { require.NoError(t, init.Close()) }()
		local, err := init.Register(src.t)
		require.NoError(t, err)
		reg, d := s.register(t, owner)
		peer := connect(t, init, owner.Addr())
		defer peer.Close()
		ctx := context.Background()

		want := seeded(size, 1)
		put := transfer.Op{Local: local, LocalOff: 4096, Remote: d, RemoteOff: 4096, Len: 16 << 10}
		require.NoError(t, peer.Put(ctx, put))
		copy(want[4096:], seeded(size, 2)[4096:4096+16<<10])
		require.Equal(t, sha(want), sha(s.bytes(t)))
		get := transfer.Op{Local: local, LocalOff: 128 << 10, Remote: d, RemoteOff: 0, Len: 8 << 10}
		require.NoError(t, peer.Get(ctx, get))
		got, err := src.bytes()
		require.NoError(t, err)
		require.Equal(t, sha(want[:8<<10]), sha(got[128<<10:136<<10]))

		require.NoError(t, s.m.Sleep(sleep.Host, "weights"))
		require.ErrorIs(t, peer.Put(ctx, put), driver.ErrClosed)
		require.ErrorIs(t, peer.Get(ctx, get), driver.ErrClosed)
		_, err = reg.Descriptor()
		require.ErrorIs(t, err, driver.ErrClosed, "stale")
		require.NoError(t, s.m.Wake("weights"))
		other := transfer.Op{Local: local, Remote: d, RemoteOff: 64 << 10, Len: 32 << 10}
		require.ErrorIs(t, peer.Put(ctx, other), driver.ErrClosed, "stale after the wake too")
		require.Equal(t, sha(want), sha(s.bytes(t)), "the woken bytes are untouched")
		require.NoError(t, reg.Close())

		reg2, d2 := s.register(t, owner)
		defer func() { require.NoError(t, reg2.Close()) }()
		require.NotEqual(t, d, d2)
		other.Remote = d2
		require.NoError(t, peer.Put(ctx, other))
		copy(want[64<<10:], seeded(size, 2)[:32<<10])
		require.Equal(t, sha(want), sha(s.bytes(t)))
	})
}

// TestSleepUnderTransfers: peers put into disjoint chunks of a
// registration over a sleep.Manager's tensor, round after round, each
// round from the other half of their source (so every put changes the
// chunk), while the tag goes to sleep: its revoke waits for the puts in
// flight, before the backup. Every put succeeds or answers ErrClosed, and
// after the wake each chunk holds what the last put into it that
// succeeded wrote: no put that succeeded was lost to the backup, and no
// refused one landed.
func TestSleepUnderTransfers(t *testing.T) {
	const (
		peers = 4
		chunk = 4 << 10
		per   = 8 // chunks per peer
		size  = peers * per * chunk
	)
	s := newSleepMem(t, size, 1)
	h := mustHostMem(t, 16<<20)
	src, err := newRegion(h.a, 2*size, 2) // two halves: even rounds put from the first
	require.NoError(t, err)
	defer func() { require.NoError(t, src.end()) }()
	owner, err := transfer.New(transfer.Config{})
	require.NoError(t, err)
	defer func() { require.NoError(t, owner.Close()) }()
	init, err := transfer.New(transfer.Config{})
	require.NoError(t, err)
	defer func() { require.NoError(t, init.Close()) }()
	local, err := init.Register(src.t)
	require.NoError(t, err)
	_, d := s.register(t, owner)

	type result struct {
		g, done int // the peer, and how many puts it made that succeeded
		err     error
	}
	results := make(chan result, peers)
	started := make(chan struct{}, peers)
	for g := range peers {
		p := connect(t, init, owner.Addr())
		go func() {
			defer p.Close()
			for i := 0; ; i++ {
				off := uint64((g*per + i%per) * chunk)
				half := uint64(i/per%2) * size
				err := p.Put(context.Background(), transfer.Op{Local: local, LocalOff: half + off, Remote: d, RemoteOff: off, Len: chunk})
				if err != nil {
					if !errorsIs(err, driver.ErrClosed) {
						results <- result{g: g, err: err}
					} else {
						results <- result{g: g, done: i}
					}
					return
				}
				if i == per { // a whole round in: the puts flow
					started <- struct{}{}
				}
			}
		}()
	}
	for range peers {
		<-started
	}
	require.NoError(t, s.m.Sleep(sleep.Host, "weights"))
	done := make([]int, peers)
	for range peers {
		r := <-results
		require.NoError(t, r.err)
		done[r.g] = r.done
	}
	require.NoError(t, s.m.Wake("weights"))
	from, got := seeded(2*size, 2), s.bytes(t)
	for g := range peers {
		for c := range per {
			lo := (g*per + c) * chunk
			last := (done[g]-1-c)/per*per + c // the last put into chunk c that succeeded (done[g] > per)
			half := last / per % 2 * size
			require.Equal(t, sha(from[half+lo:half+lo+chunk]), sha(got[lo:lo+chunk]),
				"chunk %d of peer %d (%d puts succeeded, the last into it from half %d)", c, g, done[g], half/size)
		}
	}
	t.Logf("puts that succeeded per peer before the sleep: %v", done)
}
