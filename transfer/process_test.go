package transfer_test

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/transfer"
	"github.com/vmarena/vmarena/transfer/internal/ucx"
)

// kinds runs body for each engine kind this build has: tcp always, ucx
// when UCX is available (else a skip that says so).
func kinds(t *testing.T, body func(t *testing.T, kind string)) {
	for _, kind := range []string{"tcp", "ucx"} {
		t.Run(kind, func(t *testing.T) {
			if kind == "ucx" && !ucx.Available {
				t.Skip("this build has no UCX (build with -tags ucx, cgo and libucx-dev)")
			}
			body(t, kind)
		})
	}
}

func TestTwoProcesses(t *testing.T) { kinds(t, twoProcesses) }

// twoProcesses: this process and a peer process, both with host-driver
// (memfd) memory, put and get byte-exact at random places; then the peer
// remaps its memory (a leased tensor's new commit, a KV cache sequence
// preempted and resumed): the old descriptor fails with ErrClosed and the
// new memory is untouched, and a new registration's descriptor works.
func twoProcesses(t *testing.T, kind string) {
	const size = 256 << 10
	peer := startPeer(t, kind)
	h := mustHostMem(t, 64<<20)
	e, err := transfer.New(transfer.Config{Kind: kind})
	require.NoError(t, err)
	defer func() { require.NoError(t, e.Close()) }()
	local, err := newRegion(h.a, size, 1)
	require.NoError(t, err)
	defer func() { require.NoError(t, local.end()) }()
	lr, err := e.Register(local.t)
	require.NoError(t, err)
	p := connect(t, e, peer.addr)
	defer func() { require.NoError(t, p.Close()) }()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	remote := peer.desc(peer.do("lease A %d 7", size))
	require.Equal(t, peer.addr, remote.Engine)
	require.True(t, remote.Writable)
	model, mine := seeded(size, 7), seeded(size, 1)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 20 {
		n := 1 + rng.Uint64N(size/2)
		lo, ro := rng.Uint64N(size-n+1), rng.Uint64N(size-n+1)
		op := transfer.Op{Local: lr, LocalOff: lo, Remote: remote, RemoteOff: ro, Len: n}
		if i%2 == 0 {
			require.NoError(t, p.Put(ctx, op))
			copy(model[ro:ro+n], mine[lo:lo+n])
		} else {
			require.NoError(t, p.Get(ctx, op))
			copy(mine[lo:lo+n], model[ro:ro+n])
		}
		got, err := local.bytes()
		require.NoError(t, err)
		require.Equal(t, sha(mine), sha(got), "local bytes after op %d", i)
		require.Equal(t, sha(model), peer.hash("A"), "peer bytes after op %d", i)
	}
	require.Equal(t, "10 10", peer.do("stats")[:5], "the peer served 10 puts and 10 gets")

	// Remap the leased tensor: the old descriptor is stale.
	peer.do("remap A 11")
	fresh := sha(seeded(size, 11))
	op := transfer.Op{Local: lr, Remote: remote, Len: 4096}
	drivertest.RequireIs(t, p.Put(ctx, op), driver.ErrClosed, "stale")
	drivertest.RequireIs(t, p.Get(ctx, op), driver.ErrClosed)
	require.Equal(t, fresh, peer.hash("A"), "the new memory is untouched")
	before, err := local.bytes()
	require.NoError(t, err)
	require.Equal(t, sha(mine), sha(before), "a refused get wrote nothing locally")
	remote2 := peer.desc(peer.do("reg A"))
	require.NotEqual(t, remote.ID, remote2.ID)
	op.Remote = remote2
	require.NoError(t, p.Put(ctx, op))
	want := seeded(size, 11)
	copy(want[:4096], mine[:4096])
	require.Equal(t, sha(want), peer.hash("A"))

	// A KV cache sequence's keys, preempted (Drop) and resumed.
	kv := peer.desc(peer.do("kv K 5"))
	kvModel := seeded(int(kv.Len), 5)
	op = transfer.Op{Local: lr, LocalOff: 100, Remote: kv, RemoteOff: 1000, Len: 3000}
	require.NoError(t, p.Put(ctx, op))
	copy(kvModel[1000:4000], mine[100:3100])
	require.Equal(t, sha(kvModel), peer.hash("K"))
	peer.do("remap K 9")
	drivertest.RequireIs(t, p.Put(ctx, op), driver.ErrClosed)
	drivertest.RequireIs(t, p.Get(ctx, op), driver.ErrClosed)
	require.Equal(t, sha(seeded(int(kv.Len), 9)), peer.hash("K"), "the resumed sequence's memory is untouched")
	kv2 := peer.desc(peer.do("reg K"))
	op.Remote = kv2
	require.NoError(t, p.Get(ctx, op))
	copy(mine[100:3100], seeded(int(kv.Len), 9)[1000:4000])
	got, err := local.bytes()
	require.NoError(t, err)
	require.Equal(t, sha(mine), sha(got))

	s := e.Stats()
	require.Equal(t, transfer.Stats{Puts: 12, Gets: 11, BytesOut: s.BytesOut, BytesIn: s.BytesIn}, s)
}

// TestKVTensorMapped: a KV cache's tensors are a driver's mapping
// (tensor.Mapped), which Register requires.
func TestKVTensorMapped(t *testing.T) {
	h := mustHostMem(t, 16<<20)
	k, err := newKVSeq(h, 1)
	require.NoError(t, err)
	defer func() { require.NoError(t, k.close()) }()
	require.True(t, k.t.Mapped())
	require.True(t, k.t.IsContiguous())
}
