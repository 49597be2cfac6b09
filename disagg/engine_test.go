package disagg

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/transfer"
	"github.com/vmarena/vmarena/vaspace"
)

// TestEngineMatchesLocal: the two sides joined by two tcp transfer engines
// decode as one process does, fetch what Local would, and the engines
// count the bytes the sides do.
func TestEngineMatchesLocal(t *testing.T) {
	for _, layout := range []kvcache.Layout{kvcache.PerLayer, kvcache.TokenMajor} {
		t.Run(layout.String(), func(t *testing.T) {
			ctx := context.Background()
			s := newSides(t, layout, 256, 4)
			pe, err := transfer.New(transfer.Config{})
			require.NoError(t, err)
			defer pe.Close()
			de, err := transfer.New(transfer.Config{})
			require.NoError(t, err)
			defer de.Close()
			peer, err := de.Connect(ctx, pe.Addr())
			require.NoError(t, err)
			s.prefill, err = NewPrefill(s.pc, s.model, EngineExporter(pe))
			require.NoError(t, err)
			s.decode, err = NewDecode(s.dc, s.model, EngineFetcher(de, peer))
			require.NoError(t, err)
			rng := rand.New(rand.NewPCG(1, uint64(layout)))
			prefill := func(p []int) (Handoff, error) { return s.prefill.Prefill(p, 0) }
			total := s.decodeAll(t, layout, sharingPrompts(rng, layout), prefill, s.prefill, s.decode)
			require.Equal(t, total, de.Stats().BytesIn)
			require.Equal(t, total, pe.Stats().BytesOut)
			require.NoError(t, peer.Close())
			require.NoError(t, s.prefill.Close())
		})
	}
}

// sharingPrompts are four prompts of the engine tests: a base of two
// units and a bit, one sharing its two units, the base again (all of it
// known but its last unit), and an unrelated one.
func sharingPrompts(rng *rand.Rand, layout kvcache.Layout) [][]int {
	tpu := unitTokensOf(layout)
	base := randomTokens(rng, 2*tpu+6)
	return [][]int{base, append(slices.Clone(base[:2*tpu]), randomTokens(rng, 5)...), base, randomTokens(rng, tpu+3)}
}

// decodeAll prefills each prompt (prefill), decodes 4 tokens of it from
// src through d, and checks the tokens and logits against the reference,
// the units cached against the decode cache's index and the bytes moved
// against the units it lacked; it returns the bytes moved in all. Of
// sharingPrompts, the third finds units cached.
func (s *sides) decodeAll(t *testing.T, layout kvcache.Layout, prompts [][]int, prefill func([]int) (Handoff, error), src Source, d *Decode) uint64 {
	t.Helper()
	var total uint64
	shared := len(prompts) > 2 && slices.Equal(prompts[0], prompts[2])
	for i, p := range prompts {
		cached := s.index.cached(p)
		h, err := prefill(p)
		require.NoError(t, err)
		res, err := d.Decode(context.Background(), src, h, 4)
		require.NoError(t, err)
		want, wantLogits := reference(t, s.model, p, 4)
		require.Equal(t, want, res.Tokens, "prompt %d", i)
		require.Equal(t, wantLogits, res.Logits, "prompt %d: bit for bit", i)
		require.Equal(t, cached, res.Cached, "prompt %d: units the decode cache held", i)
		require.Equal(t, uint64(h.Units-res.Cached)*unitBytesOf(layout), res.Bytes, "prompt %d: the units it lacked, no more", i)
		if i == 2 && shared {
			require.Positive(t, res.Cached, "the third prompt repeats the first")
		}
		total += res.Bytes
	}
	return total
}

// TestEngineFetcherRefusesLengths: EngineFetcher used on its own refuses
// a ref shorter or longer than its destination before any byte moves
// (the destination keeps what it held), and fetches a ref of the right
// length whole.
func TestEngineFetcherRefusesLengths(t *testing.T) {
	ctx := context.Background()
	drv, err := host.New(host.Options{Capacity: 64 << 20})
	require.NoError(t, err)
	drivertest.CloseAtEnd(t, drv)
	a, err := arena.New(vaspace.New(drv), physical.New(drv), arena.Options{Max: 64 << 20})
	require.NoError(t, err)
	var made []*tensor.Tensor
	defer func() {
		for _, x := range made {
			require.NoError(t, x.Release())
		}
		require.NoError(t, a.Close())
	}()
	pe, de, peer := joinedEngines(t)
	tensorOf := func(fill byte) *tensor.Tensor {
		x, err := tensor.OnArena(a, tensor.Uint8, 64)
		require.NoError(t, err)
		made = append(made, x)
		require.NoError(t, x.Access(true, func(b []byte) error {
			for i := range b {
				b[i] = fill + byte(i)
			}
			return nil
		}))
		return x
	}
	bytesOf := func(x *tensor.Tensor) (out []byte) {
		require.NoError(t, x.Access(false, func(b []byte) error { out = slices.Clone(b); return nil }))
		return out
	}
	src := tensorOf(1)
	ref, release, err := EngineExporter(pe).Export(src)
	require.NoError(t, err)
	defer release()
	f := EngineFetcher(de, peer)
	for _, n := range []uint64{0, 32, 63, 65} {
		dst := tensorOf(100)
		before := bytesOf(dst)
		bad := ref
		bad.Len = n
		drivertest.RequireIs(t, f.Fetch(ctx, []*tensor.Tensor{dst}, []Ref{bad}), driver.ErrInvalid, "its destination has 64")
		require.Equal(t, before, bytesOf(dst), "a ref of %d bytes: nothing moved", n)
	}
	dst := tensorOf(100)
	require.NoError(t, f.Fetch(ctx, []*tensor.Tensor{dst}, []Ref{ref}))
	require.Equal(t, bytesOf(src), bytesOf(dst))
}
