package transfer_test

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/vaspace"
)

const gran = 64 * units.KiB

// hostMem is a host driver (memfd-backed memory) with an arena over it,
// and what a KV cache needs.
type hostMem struct {
	drv   *host.Driver
	space *vaspace.Space
	mem   *physical.Memory
	a     *arena.Arena
}

func newHostMem(max uint64) (*hostMem, error) {
	drv, err := host.New(host.Options{Devices: 1, Capacity: 2 * max, Granularity: gran})
	if err != nil {
		return nil, err
	}
	h := &hostMem{drv: drv, space: vaspace.New(drv), mem: physical.New(drv)}
	if h.a, err = arena.New(h.space, h.mem, arena.Options{Max: max, ChunkSize: gran}); err != nil {
		return nil, errors.CombineErrors(err, drv.Close())
	}
	return h, nil
}

func (h *hostMem) close() error {
	return errors.CombineErrors(h.a.Close(), h.drv.Close())
}

// mustHostMem is newHostMem for a test, closed at its end.
func mustHostMem(t testing.TB, max uint64) *hostMem {
	t.Helper()
	h, err := newHostMem(max)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, h.close()) })
	return h
}

// region is memory its owner may take back: a leased uint8 tensor over an
// arena view. remap takes it back (Revoke, then the view ends) and lays a
// new lease and tensor over a new commit, as a KV cache does with a
// sequence's pages.
type region struct {
	a     *arena.Arena
	n     uint64
	lease *tensor.Lease
	view  *arena.View
	t     *tensor.Tensor
}

func newRegion(a *arena.Arena, n uint64, seed uint64) (*region, error) {
	r := &region{a: a, n: n}
	return r, r.make(seed)
}

// make lays the region over new memory filled from seed.
func (r *region) make(seed uint64) error {
	v, err := r.a.Append(r.n, 64)
	if err != nil {
		return err
	}
	l := tensor.NewLease()
	t, err := tensor.NewLeased(l, v, tensor.Uint8, int(r.n))
	if err != nil {
		return errors.CombineErrors(err, v.Release())
	}
	r.lease, r.view, r.t = l, v, t
	return r.t.Access(true, func(b []byte) error { fillSeed(b, seed); return nil })
}

// remap takes the memory back and makes new memory filled from seed.
func (r *region) remap(seed uint64) error {
	if err := r.end(); err != nil {
		return err
	}
	return r.make(seed)
}

// end revokes the lease and ends the view.
func (r *region) end() error {
	if r.view == nil {
		return nil
	}
	r.lease.Revoke()
	err := r.view.Release()
	r.view = nil
	return err
}

// bytes copies the region's current bytes.
func (r *region) bytes() ([]byte, error) {
	var out []byte
	err := r.t.Access(false, func(b []byte) error { out = append([]byte(nil), b...); return nil })
	return out, err
}

// fillSeed fills b with bytes drawn from seed (the same on both sides of
// a test: the peer is this binary).
func fillSeed(b []byte, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := 0; i < len(b); i += 8 {
		v := rng.Uint64()
		for j := 0; j < 8 && i+j < len(b); j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
}

func seeded(n int, seed uint64) []byte {
	b := make([]byte, n)
	fillSeed(b, seed)
	return b
}

// kvSeq is a KV cache with one sequence whose layer-0 keys are the
// tensor: remap preempts (Drop) and resumes the sequence, which revokes
// the old tensor's lease and hands out a new one.
type kvSeq struct {
	c   *kvcache.Cache
	s   *kvcache.Seq
	t   *tensor.Tensor
	len int
}

const kvTokens = 256 // 256 tokens of 2 heads of 64 float16: 64 KiB of keys per layer

func newKVSeq(h *hostMem, seed uint64) (*kvSeq, error) {
	c, err := kvcache.New(h.space, h.mem, kvcache.Config{Layers: 1, KVHeads: 2, HeadDim: 64, DType: tensor.Float16,
		BlockTokens: 16, MaxContext: 2 * kvTokens, MaxSeqs: 2, PageSize: gran, MapAhead: -1, NoPrefixSharing: true})
	if err != nil {
		return nil, err
	}
	k := &kvSeq{c: c}
	prompt := make([]int, kvTokens)
	for i := range prompt {
		prompt[i] = i + 1
	}
	if k.s, err = c.Admit(prompt, 0); err == nil {
		_, err = k.s.Append(prompt[k.s.Len():])
	}
	if err == nil {
		err = k.fresh(seed)
	}
	if err != nil {
		return nil, errors.CombineErrors(err, c.Close())
	}
	return k, nil
}

// fresh takes the sequence's current keys tensor and fills it from seed.
func (k *kvSeq) fresh(seed uint64) error {
	t, err := k.s.K(0)
	if err != nil {
		return err
	}
	k.t = t
	return t.Access(true, func(b []byte) error { fillSeed(b, seed); return nil })
}

func (k *kvSeq) remap(seed uint64) error {
	if err := k.s.Preempt(kvcache.Drop); err != nil {
		return err
	}
	if _, err := k.s.Resume(); err != nil {
		return err
	}
	return k.fresh(seed)
}

func (k *kvSeq) close() error { return k.c.Close() }

func errorsAs(err error, target any) bool { return errors.As(err, target) }

func errorsIs(err, target error) bool { return errors.Is(err, target) }
