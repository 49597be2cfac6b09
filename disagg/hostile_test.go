package disagg

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/transfer"
)

// hostileSource is a prefill side that bends its answers: units passes
// every answer of the real source through bend before the decode side
// sees it.
type hostileSource struct {
	Source
	bend func(refs [][]Ref) [][]Ref
}

func (h hostileSource) Units(ctx context.Context, id uint64, from, to int) ([][]Ref, error) {
	refs, err := h.Source.Units(ctx, id, from, to)
	if err != nil {
		return nil, err
	}
	return h.bend(refs), nil
}

// joinedEngines are two tcp transfer engines, the prefill side's and the
// decode side's, and the decode side's peer of the other, closed at the
// test's end.
func joinedEngines(t *testing.T) (pe, de *transfer.Engine, peer *transfer.Peer) {
	t.Helper()
	pe, err := transfer.New(transfer.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pe.Close() })
	de, err = transfer.New(transfer.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = de.Close() })
	peer, err = de.Connect(context.Background(), pe.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { _ = peer.Close() })
	return pe, de, peer
}

// engineSides is s with its sides joined by two tcp transfer engines.
func engineSides(t *testing.T, s *sides) {
	t.Helper()
	pe, de, peer := joinedEngines(t)
	var err error
	s.prefill, err = NewPrefill(s.pc, s.model, EngineExporter(pe))
	require.NoError(t, err)
	s.decode, err = NewDecode(s.dc, s.model, EngineFetcher(de, peer))
	require.NoError(t, err)
}

// TestHostileShortRefs: a prefill side whose refs say fewer bytes than
// the decode side's extents hold (which a transfer engine would move,
// leaving the rest of each unit as it was) is refused before anything is
// fetched; the decode cache publishes nothing of the prompt and ends as
// it was, and a later honest request decodes as one process does.
func TestHostileShortRefs(t *testing.T) {
	ctx := context.Background()
	for _, layout := range []kvcache.Layout{kvcache.PerLayer, kvcache.TokenMajor} {
		t.Run(layout.String(), func(t *testing.T) {
			s := newSides(t, layout, 256, 4)
			engineSides(t, s)
			for _, delta := range []int64{-1, 1} {
				prompt := randomTokens(rand.New(rand.NewPCG(7, uint64(delta+2))), 2*unitTokensOf(layout)+3)
				h, err := s.prefill.Prefill(prompt, 0)
				require.NoError(t, err)
				before := s.dc.Stats()
				src := hostileSource{s.prefill, func(refs [][]Ref) [][]Ref {
					for _, unit := range refs {
						for i := range unit {
							unit[i].Len = uint64(int64(unit[i].Len) + delta)
						}
					}
					return refs
				}}
				_, err = s.decode.Decode(ctx, src, h, 3)
				drivertest.RequireIs(t, err, driver.ErrInvalid, "bytes")
				require.Zero(t, s.index.cached(prompt), "nothing of the prompt is published")
				require.Equal(t, before.Running, s.dc.Stats().Running)
				require.NoError(t, s.dc.Check())
				require.Zero(t, s.prefill.Stats().Held, "the request was released")
				prefill := func(p []int) (Handoff, error) { return s.prefill.Prefill(p, 0) }
				s.decodeAll(t, layout, [][]int{prompt}, prefill, s.prefill, s.decode)
			}
			require.NoError(t, s.prefill.Close())
			require.NoError(t, s.pc.Check())
		})
	}
}

// TestHostileTokens: a handoff whose first token or a prompt token is
// outside the model's vocabulary is refused before anything is admitted
// or fetched, whatever the count; the request stays held at the prefill
// side, for the decode side's caller to release.
func TestHostileTokens(t *testing.T) {
	ctx := context.Background()
	s := newSides(t, kvcache.TokenMajor, 128, 2)
	prompt := randomTokens(rand.New(rand.NewPCG(8, 8)), 20)
	h, err := s.prefill.Prefill(prompt, 0)
	require.NoError(t, err)
	before := s.dc.Stats()
	for _, c := range []struct {
		name string
		bend func(*Handoff)
	}{
		{"first past the vocabulary", func(h *Handoff) { h.First = modelConfig.Vocab }},
		{"negative first", func(h *Handoff) { h.First = -1 }},
		{"prompt token past the vocabulary", func(h *Handoff) { h.Prompt[3] = modelConfig.Vocab + 7 }},
		{"negative prompt token", func(h *Handoff) { h.Prompt[len(h.Prompt)-1] = -2 }},
	} {
		for _, n := range []int{1, 3} {
			bad := h
			bad.Prompt = append([]int(nil), h.Prompt...)
			c.bend(&bad)
			_, err := s.decode.Decode(ctx, s.prefill, bad, n)
			drivertest.RequireIs(t, err, driver.ErrInvalid, "vocabulary")
			require.Equal(t, before, s.dc.Stats(), "%s, %d tokens: the decode cache is untouched", c.name, n)
			require.Zero(t, s.link.Stats().Exports, "%s, %d tokens: nothing was exported", c.name, n)
			require.Equal(t, 1, s.prefill.Stats().Held, "%s, %d tokens: the request is still held", c.name, n)
		}
	}
	res, err := s.decode.Decode(ctx, s.prefill, h, 3)
	require.NoError(t, err)
	want, _ := reference(t, s.model, prompt, 3)
	require.Equal(t, want, res.Tokens)
	s.close(t)
}

// TestHostileUnitsFlood: a decode side that asks for the same units over
// and over (a replay, or a flood) gets the refs it got the first time,
// and the prefill side exports each extent of a request once, however
// often it is asked; a range overlapping what was exported exports only
// the units new to it. Release lets every extent go.
func TestHostileUnitsFlood(t *testing.T) {
	ctx := context.Background()
	s := newSides(t, kvcache.PerLayer, 256, 2)
	tpu := unitTokensOf(kvcache.PerLayer)
	h, err := s.prefill.Prefill(randomTokens(rand.New(rand.NewPCG(9, 9)), 3*tpu+1), 0)
	require.NoError(t, err)
	require.Equal(t, 4, h.Units)
	first, err := s.prefill.Units(ctx, h.ID, 1, 3)
	require.NoError(t, err)
	perUnit := len(first[0])
	require.Equal(t, 2*perUnit, s.link.Stats().Exports)
	for range 100 {
		again, err := s.prefill.Units(ctx, h.ID, 1, 3)
		require.NoError(t, err)
		require.Equal(t, first, again, "the same refs")
	}
	require.Equal(t, 2*perUnit, s.link.Stats().Exports, "nothing exported again")
	all, err := s.prefill.Units(ctx, h.ID, 0, 4)
	require.NoError(t, err)
	require.Equal(t, first, all[1:3])
	require.Equal(t, 4*perUnit, s.link.Stats().Live, "units 0 and 3 exported, once")
	require.Equal(t, 4*perUnit, s.prefill.Stats().Exported)
	// The refs handed out are the caller's: bending them changes nothing
	// of what the prefill side answers next.
	all[1][0].Len++
	all[1][0].Desc[0] ^= 0xff
	again, err := s.prefill.Units(ctx, h.ID, 1, 3)
	require.NoError(t, err)
	require.Equal(t, first, again)
	require.NoError(t, s.prefill.Release(ctx, h.ID))
	require.Zero(t, s.link.Stats().Live)
	s.close(t)
}

// failingFetcher copies the first ok extents through f, then fails.
type failingFetcher struct {
	f  Fetcher
	ok int
}

func (x failingFetcher) Fetch(ctx context.Context, dst []*tensor.Tensor, src []Ref) error {
	n := min(x.ok, len(dst))
	if err := x.f.Fetch(ctx, dst[:n], src[:n]); err != nil {
		return err
	}
	return driver.Closed("the peer went away mid-transfer")
}

// TestHostilePeerHandled: what a broken or hostile prefill side can
// answer that the decode side refuses as it is: units of another count,
// extents of another count, refs it never made, a peer gone mid-transfer
// or cancelled, and the same handoff decoded twice at once. Each ends
// with the decode cache holding no sequence, consistent, its prefix
// store without the prompt, and the prefill side holding nothing.
func TestHostilePeerHandled(t *testing.T) {
	ctx := context.Background()
	s := newSides(t, kvcache.TokenMajor, 256, 4)
	rng := rand.New(rand.NewPCG(10, 10))
	tpu := unitTokensOf(kvcache.TokenMajor)
	for _, c := range []struct {
		name string
		bend func([][]Ref) [][]Ref
		frag string
	}{
		{"a unit short", func(r [][]Ref) [][]Ref { return r[1:] }, "got"},
		{"a unit more", func(r [][]Ref) [][]Ref { return append(r, r[0]) }, "got"},
		{"an extent short", func(r [][]Ref) [][]Ref { r[0] = r[0][1:]; return r }, "extents"},
		{"an extent more", func(r [][]Ref) [][]Ref { r[0] = append(r[0], r[0][0]); return r }, "extents"},
		{"a ref never made", func(r [][]Ref) [][]Ref { r[1][0].Desc = []byte{0xff, 0xff, 0, 0, 0, 0, 0, 0}; return r }, "never exported"},
		{"a ref cut short", func(r [][]Ref) [][]Ref { r[0][0].Desc = r[0][0].Desc[:3]; return r }, "a local ref is 8"},
	} {
		prompt := randomTokens(rng, 2*tpu+1)
		h, err := s.prefill.Prefill(prompt, 0)
		require.NoError(t, err)
		_, err = s.decode.Decode(ctx, hostileSource{s.prefill, c.bend}, h, 2)
		drivertest.RequireIs(t, err, driver.ErrInvalid, c.frag)
		require.Zero(t, s.dc.Stats().Running, c.name)
		require.NoError(t, s.dc.Check(), c.name)
		require.Zero(t, s.index.cached(prompt), c.name)
		require.Zero(t, s.prefill.Stats().Held, c.name)
	}

	// The peer goes away after some extents moved.
	prompt := randomTokens(rng, 3*tpu)
	h, err := s.prefill.Prefill(prompt, 0)
	require.NoError(t, err)
	broken, err := NewDecode(s.dc, s.model, failingFetcher{s.link, 3})
	require.NoError(t, err)
	_, err = broken.Decode(ctx, s.prefill, h, 2)
	drivertest.RequireIs(t, err, driver.ErrClosed, "mid-transfer")
	require.Zero(t, s.dc.Stats().Running)
	require.NoError(t, s.dc.Check())
	require.Zero(t, s.index.cached(prompt))

	// Cancelled before the units are asked for.
	h, err = s.prefill.Prefill(prompt, 0)
	require.NoError(t, err)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = s.decode.Decode(cancelled, s.prefill, h, 2)
	drivertest.RequireIs(t, err, context.Canceled)
	require.Zero(t, s.dc.Stats().Running)
	require.Zero(t, s.prefill.Stats().Held, "Prefill.Release does not look at the context")

	// One handoff decoded twice at once (a replay): at most one takes
	// it; the other is refused, and the books hold.
	h, err = s.prefill.Prefill(prompt, 0)
	require.NoError(t, err)
	errs := make(chan error, 2)
	for range 2 {
		go func() { _, err := s.decode.Decode(ctx, s.prefill, h, 2); errs <- err }()
	}
	var failed int
	for range 2 {
		if err := <-errs; err != nil {
			failed++
		}
	}
	require.GreaterOrEqual(t, failed, 1, "a handoff is taken once")
	require.Zero(t, s.dc.Stats().Running)
	require.NoError(t, s.dc.Check())
	require.NoError(t, s.pc.Check())
	s.close(t)
}

// TestHostileGuessedIDs: a decode peer that knows one handoff's ID and
// asks for the IDs around it (another peer's requests, were IDs counted
// up) is refused every one, and the other request stays held, whole:
// IDs are random, never 0.
func TestHostileGuessedIDs(t *testing.T) {
	ctx := context.Background()
	s := newSides(t, kvcache.PerLayer, 256, 2)
	rng := rand.New(rand.NewPCG(10, 10))
	mine, err := s.prefill.Prefill(randomTokens(rng, 20), 0)
	require.NoError(t, err)
	theirs, err := s.prefill.Prefill(randomTokens(rng, 20), 0)
	require.NoError(t, err)
	require.NotZero(t, mine.ID)
	require.NotEqual(t, mine.ID, theirs.ID)
	for d := uint64(1); d <= 64; d++ {
		for _, id := range []uint64{mine.ID + d, mine.ID - d, d - 1} {
			if id == mine.ID {
				continue
			}
			// Were theirs among these (a chance of 2^-57 with random
			// IDs), the guess would reach it.
			_, err := s.prefill.Units(ctx, id, 0, 1)
			drivertest.RequireIs(t, err, driver.ErrInvalid, "holds no request")
			drivertest.RequireIs(t, s.prefill.Release(ctx, id), driver.ErrInvalid, "holds no request")
		}
	}
	require.Equal(t, 2, s.prefill.Stats().Held)
	res, err := s.decode.Decode(ctx, s.prefill, theirs, 2)
	require.NoError(t, err)
	want, _ := reference(t, s.model, theirs.Prompt, 2)
	require.Equal(t, want, res.Tokens)
	require.NoError(t, s.prefill.Release(ctx, mine.ID))
	s.close(t)
}
