package disagg

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/internal/leakcheck"
	"github.com/vmarena/vmarena/internal/transformer"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/vaspace"
)

// page is the tests' page: the host driver's smallest granularity here.
const page = 4 * units.KiB

// modelConfig is a small model (2 layers of one head of 32, a vocabulary
// of 64), cheap enough for hundreds of prompts under the race detector: a
// row of 128 bytes, so a 4 KiB page holds 32 positions of a region
// (PerLayer) or 8 positions of every layer (TokenMajor).
var modelConfig = transformer.Config{Layers: 2, Heads: 1, KVHeads: 1, HeadDim: 32, Vocab: 64, Hidden: 32}

// unitTokensOf is the positions a unit holds, worked out from the shapes
// alone (not asked of the cache): PerLayer a page of one region's rows,
// TokenMajor a page of every layer's K and V rows.
func unitTokensOf(layout kvcache.Layout) int {
	row := modelConfig.KVHeads * modelConfig.HeadDim * 4
	if layout == kvcache.PerLayer {
		return int(page) / row
	}
	return int(page) / (2 * modelConfig.Layers * row)
}

// unitBytesOf is a unit's bytes over all its extents, from the shapes.
func unitBytesOf(layout kvcache.Layout) uint64 {
	if layout == kvcache.PerLayer {
		return 2 * uint64(modelConfig.Layers) * page
	}
	return page
}

// sides is a prefill side and a decode side, each with its own cache on
// its own device of one host driver, joined by a Local.
type sides struct {
	model   *transformer.Model
	link    *Local
	pc, dc  *kvcache.Cache
	prefill *Prefill
	decode  *Decode
	drv     driver.Driver
	space   *vaspace.Space
	index   *index // the decode cache's prefix index, from its events
}

func newSides(t testing.TB, layout kvcache.Layout, maxCtx, maxSeqs int) *sides {
	t.Helper()
	drv, err := host.New(host.Options{Devices: 2, Capacity: 64 * units.MiB, Granularity: page})
	require.NoError(t, err)
	drivertest.CloseAtEnd(t, drv)
	return newSidesOn(t, drv, layout, maxCtx, maxSeqs)
}

// newSidesOn is newSides over drv's devices 0 (prefill) and 1 (decode).
func newSidesOn(t testing.TB, drv driver.Driver, layout kvcache.Layout, maxCtx, maxSeqs int) *sides {
	t.Helper()
	space, mem := vaspace.New(drv), physical.New(drv)
	m, err := transformer.New(modelConfig, 5)
	require.NoError(t, err)
	s := &sides{model: m, link: &Local{}, drv: drv, space: space, index: newIndex(unitTokensOf(layout))}
	for dev, c := range []**kvcache.Cache{&s.pc, &s.dc} {
		cfg := kvcache.Config{Layers: modelConfig.Layers, KVHeads: modelConfig.KVHeads, HeadDim: modelConfig.HeadDim,
			DType: tensor.Float32, BlockTokens: unitTokensOf(layout), MaxContext: maxCtx, MaxSeqs: maxSeqs,
			PageSize: page, Layout: layout, Device: driver.DeviceID(dev), MapAhead: -1}
		if dev == 1 {
			cfg.Events = s.index.event
		}
		*c, err = kvcache.New(space, mem, cfg)
		require.NoError(t, err)
		cache := *c
		t.Cleanup(func() { _ = cache.Close() })
	}
	s.prefill, err = NewPrefill(s.pc, m, s.link)
	require.NoError(t, err)
	s.decode, err = NewDecode(s.dc, m, s.link)
	require.NoError(t, err)
	return s
}

// close ends both sides and caches and checks that nothing is left.
func (s *sides) close(t testing.TB) {
	t.Helper()
	require.NoError(t, s.prefill.Close())
	require.Zero(t, s.link.Stats().Live, "every extent exported was released")
	for _, c := range []*kvcache.Cache{s.pc, s.dc} {
		require.NoError(t, c.Check())
		require.NoError(t, c.Close())
	}
}

// reference is one process doing both, with no cache at all: the model
// over Go slices prefills the prompt and decodes n tokens greedily.
func reference(t testing.TB, m *transformer.Model, prompt []int, n int) ([]int, [][]float32) {
	t.Helper()
	kv, err := transformer.NewMemKV(modelConfig)
	require.NoError(t, err)
	lg, err := m.Prefill(kv, prompt, 0)
	require.NoError(t, err)
	if n == 0 {
		return nil, nil
	}
	tok := transformer.Greedy(lg[len(lg)-1])
	tokens, logits := []int{tok}, [][]float32(nil)
	for pos := len(prompt); len(tokens) < n; pos++ {
		l, err := m.Step(kv, pos, tok)
		require.NoError(t, err)
		tok = transformer.Greedy(l)
		logits = append(logits, l)
		tokens = append(tokens, tok)
	}
	return tokens, logits
}

// index is an account, independent of the sides, of what the decode
// cache's prefix store can match: the blocks its KV events (kvcache
// Config.Events) say are stored and not removed, each one store unit of
// tpu positions, chained to its parent. The units a prompt's lookup finds
// are those whose tokens and chain the index lists.
type index struct {
	tpu int
	// mu guards blocks: events come from whichever goroutine delivers.
	mu     sync.Mutex
	blocks map[uint64]indexBlock
}

type indexBlock struct {
	parent    uint64
	hasParent bool
	tokens    []int
}

func newIndex(tpu int) *index { return &index{tpu: tpu, blocks: map[uint64]indexBlock{}} }

// event is the decode cache's Config.Events.
func (x *index) event(b kvcache.EventBatch) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, e := range b.Events {
		switch e := e.(type) {
		case *kvcache.BlockStored:
			parent, has := uint64(0), e.ParentBlockHash != nil
			if has {
				parent = *e.ParentBlockHash
			}
			for i, h := range e.BlockHashes {
				x.blocks[h] = indexBlock{parent: parent, hasParent: has, tokens: e.TokenIDs[i*e.BlockSize : (i+1)*e.BlockSize]}
				parent, has = h, true
			}
		case *kvcache.BlockRemoved:
			for _, h := range e.BlockHashes {
				delete(x.blocks, h)
			}
		case *kvcache.AllBlocksCleared:
			clear(x.blocks)
		}
	}
}

// cached is how many whole units of prompt, from its start, the index
// lists: a lookup leaves the prompt's last token to compute, so a unit
// reaching it is not found whole.
func (x *index) cached(prompt []int) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	c, parent := 0, uint64(0)
	for end := x.tpu; end <= len(prompt)-1; end += x.tpu {
		found := false
		for h, b := range x.blocks {
			if b.hasParent == (c > 0) && (c == 0 || b.parent == parent) && slices.Equal(b.tokens, prompt[end-x.tpu:end]) {
				found, parent = true, h
				break
			}
		}
		if !found {
			break
		}
		c++
	}
	return c
}

// ideal is what a prefix store holding every whole unit of every prompt
// seen (nothing evicted) would find of prompt: the upper bound on units
// cached. seen lists those prompts' whole-unit prefixes.
func ideal(seen map[string]bool, tpu int, prompt []int) int {
	c := 0
	for end := tpu; end <= len(prompt)-1 && seen[prefixKey(prompt[:end])]; end += tpu {
		c++
	}
	return c
}

// see lists prompt's whole-unit prefixes in seen.
func see(seen map[string]bool, tpu int, prompt []int) {
	for end := tpu; end <= len(prompt); end += tpu {
		seen[prefixKey(prompt[:end])] = true
	}
}

func prefixKey(tokens []int) string {
	var b strings.Builder
	for _, t := range tokens {
		fmt.Fprintf(&b, "%d,", t)
	}
	return b.String()
}

// run prefills and decodes prompt through s and checks the tokens and
// logits against the reference, and the units and bytes moved against the
// independent account.
func (s *sides) run(t testing.TB, layout kvcache.Layout, prompt []int, n int) Result {
	t.Helper()
	ctx := context.Background()
	before := s.link.Stats()
	cached := s.index.cached(prompt)
	h, err := s.prefill.Prefill(prompt, 0)
	require.NoError(t, err)
	res, err := s.decode.Decode(ctx, s.prefill, h, n)
	require.NoError(t, err)
	wantTokens, wantLogits := reference(t, s.model, prompt, n)
	require.Equal(t, wantTokens, res.Tokens, "the tokens of one process doing both")
	require.Equal(t, wantLogits, res.Logits, "bit for bit")

	tpu := unitTokensOf(layout)
	units := (len(prompt) + tpu - 1) / tpu
	require.Equal(t, units, res.Units)
	require.Equal(t, cached, res.Cached, "units the decode side held already")
	require.Equal(t, units-cached, res.Fetched)
	require.Equal(t, uint64(units-cached)*unitBytesOf(layout), res.Bytes, "the bytes of the written units less those cached")
	after := s.link.Stats()
	require.Equal(t, res.Bytes, after.Bytes-before.Bytes, "what the link copied")
	require.Zero(t, after.Live, "the prefill side let its extents go")
	require.Zero(t, s.prefill.Stats().Held)
	return res
}

func randomTokens(rng *rand.Rand, n int) []int {
	t := make([]int, n)
	for i := range t {
		t[i] = rng.IntN(modelConfig.Vocab)
	}
	return t
}

// TestDisaggMatchesOneProcess: prompts prefilled on one side and decoded
// on the other, in both layouts, generate the tokens (and logits, bit for
// bit) of one process doing both; the decode side fetches exactly the
// prompt units its prefix store lacks, so the second request of a shared
// prefix moves fewer units.
func TestDisaggMatchesOneProcess(t *testing.T) {
	for _, layout := range []kvcache.Layout{kvcache.PerLayer, kvcache.TokenMajor} {
		t.Run(layout.String(), func(t *testing.T) {
			s := newSides(t, layout, 256, 4)
			rng := rand.New(rand.NewPCG(1, uint64(layout)))
			tpu := unitTokensOf(layout)
			base := randomTokens(rng, 2*tpu+6)
			first := s.run(t, layout, base, 5)
			require.Zero(t, first.Cached)

			shared := append(slices.Clone(base[:2*tpu]), randomTokens(rng, tpu/2)...)
			second := s.run(t, layout, shared, 5)
			require.Equal(t, 2, second.Cached, "the shared prefix's two units are not sent again")
			require.Less(t, second.Fetched, second.Units)

			again := s.run(t, layout, base, 4) // all of it known but the last unit
			require.Equal(t, again.Units-1, again.Cached)
			s.run(t, layout, randomTokens(rng, tpu+3), 6)              // unrelated
			s.run(t, layout, append(slices.Clone(shared), 1, 2, 3), 3) // extends the second
			s.run(t, layout, base[:tpu-1], 1)                          // within one unit
			s.run(t, layout, base[:2*tpu], 0)                          // whole units, nothing generated

			st := s.decode.Stats()
			require.Equal(t, 7, st.Requests)
			require.Equal(t, s.link.Stats().Bytes, st.Bytes)
			ps := s.prefill.Stats()
			require.Equal(t, 7, ps.Requests)
			require.Positive(t, ps.Matched, "the prefill side's own prefix store served the repeated prompts")
			s.close(t)
		})
	}
}

// TestDecodeRefusals: a handoff the decode side cannot take is refused
// before anything is admitted or fetched; the prefill side refuses ids it
// does not hold and ranges outside the prompt; a closed side refuses all.
func TestDecodeRefusals(t *testing.T) {
	ctx := context.Background()
	s := newSides(t, kvcache.TokenMajor, 128, 2)
	prompt := randomTokens(rand.New(rand.NewPCG(2, 2)), 20)
	h, err := s.prefill.Prefill(prompt, 0)
	require.NoError(t, err)
	dst := s.dc.Stats()

	bad := h
	bad.Shape.Layout = kvcache.PerLayer
	_, err = s.decode.Decode(ctx, s.prefill, bad, 1)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "shape")
	bad = h
	bad.Units++
	_, err = s.decode.Decode(ctx, s.prefill, bad, 1)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "units")
	_, err = s.decode.Decode(ctx, s.prefill, h, -1)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "negative")
	_, err = s.decode.Decode(ctx, nil, h, 1)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "no source")
	require.Equal(t, dst, s.dc.Stats(), "the decode cache is untouched")
	require.Equal(t, 1, s.prefill.Stats().Held, "the request is still held")
	require.Zero(t, s.link.Stats().Exports, "nothing was exported")

	_, err = s.prefill.Units(ctx, h.ID+1, 0, 1)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "holds no request")
	for _, r := range [][2]int{{-1, 1}, {2, 1}, {0, h.Units + 1}} {
		_, err = s.prefill.Units(ctx, h.ID, r[0], r[1])
		drivertest.RequireIs(t, err, driver.ErrInvalid, "fills units")
	}
	require.Zero(t, s.link.Stats().Exports)

	// A ref released (the request released) is refused when fetched.
	refs, err := s.prefill.Units(ctx, h.ID, 0, 1)
	require.NoError(t, err)
	require.NoError(t, s.prefill.Release(ctx, h.ID))
	drivertest.RequireIs(t, s.prefill.Release(ctx, h.ID), driver.ErrInvalid, "holds no request")
	into := make([]*tensor.Tensor, len(refs[0]))
	for i := range into {
		into[i] = bytesTensor(t, int(refs[0][i].Len))
	}
	drivertest.RequireIs(t, s.link.Fetch(ctx, into, refs[0]), driver.ErrClosed, "released")

	// Decode of a request the prefill side no longer holds: refused, and
	// the decode cache ends with no sequence.
	_, err = s.decode.Decode(ctx, s.prefill, h, 1)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "holds no request")
	require.Zero(t, s.dc.Stats().Running)
	require.NoError(t, s.dc.Check())

	// Closed: held requests go, everything after is refused.
	h2, err := s.prefill.Prefill(prompt, 0)
	require.NoError(t, err)
	require.NoError(t, s.prefill.Close())
	require.Zero(t, s.pc.Stats().Running, "Close freed the held sequence")
	drivertest.RequireIs(t, s.prefill.Close(), driver.ErrClosed)
	_, err = s.prefill.Prefill(prompt, 0)
	drivertest.RequireIs(t, err, driver.ErrClosed)
	_, err = s.prefill.Units(ctx, h2.ID, 0, 1)
	drivertest.RequireIs(t, err, driver.ErrClosed)
	drivertest.RequireIs(t, s.prefill.Release(ctx, h2.ID), driver.ErrClosed)

	_, err = NewPrefill(nil, s.model, s.link)
	drivertest.RequireIs(t, err, driver.ErrInvalid)
	_, err = NewDecode(s.dc, s.model, nil)
	drivertest.RequireIs(t, err, driver.ErrInvalid)
	other, err := transformer.New(transformer.Config{Layers: 3, Heads: 1, KVHeads: 1, HeadDim: 32}, 1)
	require.NoError(t, err)
	_, err = NewDecode(s.dc, other, s.link)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "3 layers")
}

func bytesTensor(t testing.TB, n int) *tensor.Tensor {
	t.Helper()
	x, err := tensor.New(goBuffer(make([]byte, n)), tensor.Uint8, n)
	require.NoError(t, err)
	return x
}

// goBuffer is Go memory as a tensor.Buffer.
type goBuffer []byte

func (b goBuffer) Bytes() ([]byte, error) { return b, nil }
func (b goBuffer) Addr() driver.Addr      { return 0 }

// TestLocalRefusals: Local refuses what it cannot copy before copying
// anything, and a copy whose source was revoked — its sequence freed —
// fails with ErrClosed rather than reading memory given back.
func TestLocalRefusals(t *testing.T) {
	ctx := context.Background()
	s := newSides(t, kvcache.PerLayer, 128, 2)
	seq, err := s.pc.Admit([]int{1, 2, 3}, 0)
	require.NoError(t, err)
	_, err = seq.Append([]int{1, 2, 3})
	require.NoError(t, err)
	ts, err := seq.UnitBytes(0)
	require.NoError(t, err)
	l := s.link
	ref, release, err := l.Export(ts[0])
	require.NoError(t, err)
	require.Equal(t, uint64(page), ref.Len)
	dst := bytesTensor(t, int(page))
	for _, c := range []struct {
		dst  []*tensor.Tensor
		src  []Ref
		frag string
	}{
		{[]*tensor.Tensor{dst, dst}, []Ref{ref}, "destinations"},
		{[]*tensor.Tensor{bytesTensor(t, 8)}, []Ref{ref}, "has 8 bytes"},
		{[]*tensor.Tensor{dst}, []Ref{{Desc: []byte{1}, Len: page}}, "a local ref is 8"},
		{[]*tensor.Tensor{dst}, []Ref{{Desc: make([]byte, 8), Len: page}}, "never exported"},
		{[]*tensor.Tensor{dst}, []Ref{{Desc: ref.Desc, Len: 1}}, "says 1 bytes"},
		{[]*tensor.Tensor{nil}, []Ref{ref}, "nil"},
	} {
		drivertest.RequireIs(t, l.Fetch(ctx, c.dst, c.src), driver.ErrInvalid, c.frag)
	}
	require.Zero(t, l.Stats().Bytes)
	require.Equal(t, 6, l.Stats().Refusals)
	require.NoError(t, l.Fetch(ctx, []*tensor.Tensor{dst}, []Ref{ref}))
	require.Equal(t, uint64(page), l.Stats().Bytes)

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	drivertest.RequireIs(t, l.Fetch(cancelled, []*tensor.Tensor{dst}, []Ref{ref}), context.Canceled)

	require.NoError(t, seq.Free())
	drivertest.RequireIs(t, l.Fetch(ctx, []*tensor.Tensor{dst}, []Ref{ref}), driver.ErrClosed)
	require.Equal(t, uint64(page), l.Stats().Bytes, "nothing copied after the revoke")
	require.NoError(t, release())
	require.NoError(t, release(), "a second release is a no-op")
	require.Zero(t, l.Stats().Live)
	_, _, err = l.Export(nil)
	drivertest.RequireIs(t, err, driver.ErrInvalid)
	s.close(t)
}

// TestNoLeaks: both sides run requests and close, leaving the process's
// descriptors, mappings and resident memory as they were.
func TestNoLeaks(t *testing.T) {
	work := func() {
		s := newSides(t, kvcache.TokenMajor, 64, 2)
		rng := rand.New(rand.NewPCG(3, 3))
		p := randomTokens(rng, 20)
		s.run(t, kvcache.TokenMajor, p, 2)
		s.run(t, kvcache.TokenMajor, p, 2)
		s.close(t)
		require.Empty(t, s.space.Reservations())
		require.NoError(t, s.drv.Close())
	}
	leakcheck.Require(t, 3, work)
}

// TestConcurrentRequests: requests prefilled and decoded from several
// goroutines at once, prompts sharing prefixes, each decode as one process
// does; the bytes the sides count are those the link moved, and both
// caches end consistent.
func TestConcurrentRequests(t *testing.T) {
	const workers, each = 4, 2
	s := newSides(t, kvcache.TokenMajor, 128, workers)
	rng := rand.New(rand.NewPCG(4, 4))
	tpu := unitTokensOf(kvcache.TokenMajor)
	base := randomTokens(rng, 3*tpu)
	prompts := make([][]int, workers*each)
	want := make([][]int, len(prompts))
	for i := range prompts {
		prompts[i] = append(slices.Clone(base[:(i%3+1)*tpu]), randomTokens(rng, 1+i)...)
		want[i], _ = reference(t, s.model, prompts[i], 3)
	}
	got := make([][]int, len(prompts))
	errs := make([]error, len(prompts))
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(prompts); i += workers {
				h, err := s.prefill.Prefill(prompts[i], 0)
				if err != nil {
					errs[i] = err
					continue
				}
				res, err := s.decode.Decode(context.Background(), s.prefill, h, 3)
				got[i], errs[i] = res.Tokens, err
			}
		}()
	}
	wg.Wait()
	for i := range prompts {
		require.NoError(t, errs[i], "request %d", i)
		require.Equal(t, want[i], got[i], "request %d", i)
	}
	require.Equal(t, s.link.Stats().Bytes, s.decode.Stats().Bytes)
	require.Equal(t, len(prompts), s.decode.Stats().Requests)
	s.close(t)
}
