package kvcache

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/tensor"
)

// TestUnitGeometry: UnitsFor and UnitTokens agree — the units the first n
// tokens reach are exactly those whose tokens start below n — in both
// layouts, and nothing is named past the slot.
func TestUnitGeometry(t *testing.T) {
	for _, layout := range []Layout{PerLayer, TokenMajor} {
		t.Run(layout.String(), func(t *testing.T) {
			e := hostEnv(t, 64*units.MiB)
			c := e.cache(t, tinyConfig(layout, 100, 1))
			per := map[Layout]int{PerLayer: 32, TokenMajor: 4}[layout] // tinyConfig's tokens a unit
			units := (100 + per - 1) / per
			for u := range units {
				start, end := c.UnitTokens(u)
				require.Equal(t, [2]int{u * per, min((u+1)*per, 100)}, [2]int{start, end}, "unit %d", u)
			}
			for _, u := range []int{-1, units} {
				start, end := c.UnitTokens(u)
				require.Zero(t, start+end, "unit %d is no slot's", u)
			}
			for n := -1; n <= 100; n++ {
				k := 0
				for u := range units {
					if start, _ := c.UnitTokens(u); start < n {
						k++
					}
				}
				require.Equal(t, k, c.UnitsFor(n), "%d tokens", n)
			}
		})
	}
}

// TestUnitBytesMoveASequence: a sequence's units copied extent by extent
// into another cache's sequence of the same prompt give it the same keys
// and values, in both layouts; the copy, marked written, is matchable
// there, and a sequence matching it gets its shared units read-only.
func TestUnitBytesMoveASequence(t *testing.T) {
	for _, layout := range []Layout{PerLayer, TokenMajor} {
		t.Run(layout.String(), func(t *testing.T) {
			e := hostEnv(t, 64*units.MiB)
			cfg := tinyConfig(layout, 128, 2)
			src, dst := e.cache(t, cfg), e.cache(t, cfg)
			rng := rand.New(rand.NewPCG(7, uint64(layout)))
			prompt := make([]int, 70)
			for i := range prompt {
				prompt[i] = rng.IntN(1000)
			}
			a, err := src.Admit(prompt, 0)
			require.NoError(t, err)
			step, err := a.Append(prompt)
			require.NoError(t, err)
			writeStep(t, step, prompt, 0)
			require.NoError(t, a.MarkWritten(len(prompt)))

			b, err := dst.Admit(prompt, 0)
			require.NoError(t, err)
			require.Zero(t, b.Matched())
			_, err = b.Append(prompt)
			require.NoError(t, err)
			k := src.UnitsFor(len(prompt))
			require.Equal(t, k, dst.UnitsFor(b.Len()))
			regions := map[Layout]int{PerLayer: 2 * cfg.Layers, TokenMajor: 1}[layout]
			for u := range k {
				from, err := a.UnitBytes(u)
				require.NoError(t, err)
				to, err := b.UnitBytes(u)
				require.NoError(t, err)
				require.Len(t, from, regions)
				require.Len(t, to, regions)
				for i := range from {
					require.Equal(t, tensor.Uint8, from[i].DType())
					require.Equal(t, []int{int(page)}, from[i].Shape(), "an extent is one page")
					require.NoError(t, tensor.Copy(to[i], from[i]))
				}
			}
			checkSeq(t, b, prompt, 0, 0, len(prompt))
			require.NoError(t, b.MarkWritten(len(prompt)))
			require.NoError(t, dst.Check())

			// Matched in the copy's cache: the whole units below the last
			// token are shared, read-only through UnitBytes too.
			c2, err := dst.Admit(prompt, 0)
			require.NoError(t, err)
			shared := c2.SharedUnits()
			require.Positive(t, shared)
			_, end := dst.UnitTokens(shared - 1)
			require.LessOrEqual(t, end, c2.Matched(), "shared units hold matched tokens only")
			ro, err := c2.UnitBytes(shared - 1)
			require.NoError(t, err)
			before, err := tensor.Data[uint8](ro[0])
			require.NoError(t, err)
			was := append([]byte(nil), before...)
			junk, err := tensor.New(goBuffer(make([]byte, page)), tensor.Uint8, int(page))
			require.NoError(t, err)
			drivertest.RequireIs(t, tensor.Copy(ro[0], junk), driver.ErrAccessDenied, "read-only")
			drivertest.RequireIs(t, ro[0].Set(1, 0), driver.ErrAccessDenied)
			after, err := tensor.Data[uint8](ro[0])
			require.NoError(t, err)
			require.Equal(t, was, after, "a refused write changes nothing")
			require.Zero(t, a.SharedUnits(), "the computing sequence shares nothing it did not match")

			// The tensors live while the sequence runs.
			require.NoError(t, c2.Free())
			_, err = ro[0].At(0)
			drivertest.RequireIs(t, err, driver.ErrClosed)
			require.Zero(t, c2.SharedUnits())
			_, err = c2.UnitBytes(0)
			drivertest.RequireIs(t, err, driver.ErrClosed)
			require.NoError(t, a.Free())
			require.NoError(t, b.Free())
			require.NoError(t, src.Check())
			require.NoError(t, dst.Check())
		})
	}
}

// TestUnitBytesRefusals: a unit the sequence does not hold and a
// preempted sequence are ErrInvalid, the sim driver ErrUnsupported; none
// changes anything.
func TestUnitBytesRefusals(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	c := e.cache(t, tinyConfig(TokenMajor, 64, 1))
	s, err := c.Admit([]int{1, 2, 3, 4, 5}, 0)
	require.NoError(t, err)
	_, err = s.Append([]int{1, 2, 3, 4, 5})
	require.NoError(t, err)
	st := c.Stats()
	for _, u := range []int{-1, c.UnitsFor(s.Len()), 1000} {
		_, err := s.UnitBytes(u)
		drivertest.RequireIs(t, err, driver.ErrInvalid, "kvcache: bytes of unit", "holds units 0 to 1")
	}
	require.Equal(t, st, c.Stats())
	require.Equal(t, 5, s.Len())
	require.NoError(t, c.Check())
	held, err := s.UnitBytes(1)
	require.NoError(t, err)

	require.NoError(t, s.Preempt(Swap))
	_, err = held[0].At(0)
	drivertest.RequireIs(t, err, driver.ErrClosed)
	_, err = s.UnitBytes(0)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "preempted")
	_, err = s.Resume()
	require.NoError(t, err)
	ts, err := s.UnitBytes(0)
	require.NoError(t, err)
	require.Len(t, ts, 1)
	require.NoError(t, s.Free())

	se := simEnv(t, 256*units.MiB, page)
	sc := se.cache(t, tinyConfig(TokenMajor, 64, 1))
	ss, err := sc.Admit([]int{1, 2, 3}, 0)
	require.NoError(t, err)
	_, err = ss.Append([]int{1, 2, 3})
	require.NoError(t, err)
	st = sc.Stats()
	_, err = ss.UnitBytes(0)
	drivertest.RequireIs(t, err, driver.ErrUnsupported)
	require.Equal(t, st, sc.Stats())
	require.NoError(t, sc.Check())
}

// checkUnits checks the units of s, a running sequence of tokens (under
// extra) whose first matched were found in the prefix store: the shared
// units are those all of whose tokens are matched, every unit it holds
// has one extent of a page per region, each row of a token lies where
// the layout puts it with what writeStep wrote, and the unit past its
// tokens is refused.
func checkUnits(t testing.TB, c *Cache, s *Seq, tokens []int, extra uint64, matched, forkShared int, step string) {
	t.Helper()
	k := c.UnitsFor(len(tokens))
	shared := 0
	for shared < k && forkShared < 0 {
		if _, end := c.UnitTokens(shared); end > matched {
			break
		}
		shared++
	}
	cfg := c.Config()
	if forkShared >= 0 {
		shared = forkShared // a fork's (fork.go)
	}
	if got := s.SharedUnits(); forkShared < 0 && cfg.Layout == Contiguous && got == shared+1 {
		// A resume from host memory borrows the unit the first token
		// past Matched straddles out of.
		shared = got
	}
	require.Equal(t, shared, s.SharedUnits(), step)
	row := cfg.KVHeads * cfg.HeadDim * cfg.DType.Size()
	pre := prefixes(tokens, extra)
	for u := range k {
		ts, err := s.UnitBytes(u)
		require.NoError(t, err, step)
		require.Len(t, ts, map[Layout]int{PerLayer: 2 * cfg.Layers, TokenMajor: 1, Contiguous: 1}[cfg.Layout], step)
		start, end := c.UnitTokens(u)
		for p := start; p < min(end, len(tokens)); p++ {
			for l := range cfg.Layers {
				for kv := range 2 {
					// Where the layout (package doc) puts p's row of layer
					// l's K or V in unit u's extents.
					ext, off := 2*l+kv, (p-start)*row
					switch cfg.Layout {
					case TokenMajor:
						ext, off = 0, ((2*l+kv)*c.TokensPerGroup()+p-start)*row
					case Contiguous:
						ext, off = 0, p*2*cfg.Layers*row+(2*l+kv)*row-u*int(cfg.PageSize)
					}
					if cfg.Layout == TokenMajor {
					} else if off < 0 || off+row > int(cfg.PageSize) {
						continue // a row across pages (never when sharing)
					}
					b, err := tensor.Data[uint8](ts[ext])
					require.NoError(t, err, step)
					first := math.Float32frombits(binary.NativeEndian.Uint32(b[off:]))
					last := math.Float32frombits(binary.NativeEndian.Uint32(b[off+row-4:]))
					require.Equal(t, value(pre[p], l, kv, 0, 0), first, "%s: unit %d position %d layer %d kv %d", step, u, p, l, kv)
					require.Equal(t, value(pre[p], l, kv, cfg.KVHeads-1, cfg.HeadDim-1), last, step)
				}
			}
		}
	}
	_, err := s.UnitBytes(k)
	drivertest.RequireIs(t, err, driver.ErrInvalid)
}

// TestContiguousStrides: in the Contiguous layout K and V of layer l are
// [tokens, KVHeads, HeadDim] with strides [2*Layers*row/elt, HeadDim, 1]
// at element offset (2l+kv)*row/elt from the slot's base — Append's rows
// too, from their first position — and a token's bytes cross pages where
// the page is not a whole number of tokens; what is written through
// Append's rows reads back through K and V across those boundaries.
func TestContiguousStrides(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	cfg := tinyConfig(Contiguous, 64, 2)
	cfg.Layers = 3 // a token of 12 KiB: 5 1/3 a 64 KiB page
	c := e.cache(t, cfg)
	elt := cfg.DType.Size()
	row := cfg.KVHeads * cfg.HeadDim * elt
	tb := 2 * cfg.Layers * row
	require.Equal(t, 0, c.TokensPerGroup())
	prompt := family(0, 40)
	s, err := c.Admit(prompt, 0)
	require.NoError(t, err)
	base := c.Base() + driver.Addr(uint64(s.Slot())*c.SlotBytes())
	for _, cut := range []int{0, 7, 23, 40} {
		if cut == 0 {
			continue
		}
		from := s.Len()
		step, err := s.Append(prompt[from:cut])
		require.NoError(t, err)
		require.Len(t, step.Layers, cfg.Layers)
		for l, runs := range step.Layers {
			require.Len(t, runs, 1, "one run a layer")
			for kv, ten := range []*tensor.Tensor{runs[0].K, runs[0].V} {
				require.Equal(t, []int{cut - from, cfg.KVHeads, cfg.HeadDim}, ten.Shape())
				require.Equal(t, []int{tb / elt, cfg.HeadDim, 1}, ten.Strides())
				require.Equal(t, base+driver.Addr(from*tb+(2*l+kv)*row), ten.Addr()+driver.Addr(ten.Offset()*elt))
			}
		}
		writeStep(t, step, prompt[:cut], 0)
	}
	for l := range cfg.Layers {
		for kv, get := range []func(int) (*tensor.Tensor, error){s.K, s.V} {
			ten, err := get(l)
			require.NoError(t, err)
			require.Equal(t, []int{40, cfg.KVHeads, cfg.HeadDim}, ten.Shape())
			require.Equal(t, []int{tb / elt, cfg.HeadDim, 1}, ten.Strides())
			require.Equal(t, (2*l+kv)*row/elt, ten.Offset())
			require.Equal(t, base, ten.Addr())
		}
	}
	checkSeq(t, s, prompt, 0, 0, 40)
	// 40 tokens of 12 KiB are 7 1/2 pages: 8 committed, the tail less
	// than one.
	require.Equal(t, 8, c.UnitsFor(40))
	require.Equal(t, 8*int(cfg.PageSize), c.Stats().PagesCommitted*int(cfg.PageSize))
	require.NoError(t, s.Free())
}

// TestContiguousStraddleMatch: in the Contiguous layout (12 KiB tokens,
// 64 KiB pages) a match that ends where a token straddles two pages
// borrows the pages before the one that token starts in and copies that
// one; with no room for the copy and the prompt's other pages, Admit
// refuses and changes nothing.
func TestContiguousStraddleMatch(t *testing.T) {
	for _, c := range []struct {
		budget, matched, shared, copies int
	}{
		{11, 42, 7, 1}, // borrows pages 0-6, copies page 7 (token 42 starts in it)
		{9, 0, 0, 0},   // the budget is full: refused
	} {
		t.Run(fmt.Sprint(c.budget), func(t *testing.T) {
			e := hostEnv(t, 64*units.MiB)
			cfg := tinyConfig(Contiguous, 64, 2)
			cfg.Layers = 3
			cfg.Budget = uint64(c.budget) * page
			cache := e.cache(t, cfg)
			a, err := cache.Admit(family(0, 46), 0)
			require.NoError(t, err)
			step, err := a.Append(family(0, 46))
			require.NoError(t, err)
			writeStep(t, step, family(0, 46), 0)
			require.NoError(t, a.MarkWritten(46))
			require.Equal(t, 9, cache.Stats().PagesCommitted, "46 tokens of 12 KiB: 8 5/8 pages")
			prompt := append(family(0, 45), 7)
			if c.budget == 9 {
				before := cache.Stats()
				_, err := cache.Admit(prompt, 0)
				requireIs(t, err, driver.ErrOutOfMemory, "full")
				before.FailedAdmits++ // counted, nothing else changed
				require.Equal(t, before, cache.Stats())
				require.NoError(t, cache.Check())
				checkSeq(t, a, family(0, 46), 0, 0, 46)
				require.NoError(t, a.Free())
				return
			}
			b, err := cache.Admit(prompt, 0)
			require.NoError(t, err)
			require.Equal(t, c.matched, b.Matched())
			require.Equal(t, c.shared, b.SharedUnits())
			require.Equal(t, c.copies, cache.Stats().Copies)
			require.NoError(t, cache.Check())
			checkSeq(t, b, prompt, 0, 0, c.matched)
			if c.budget == 11 {
				// The rest fits: the token straddling pages 7 and 8 is
				// written in the copied page and a page of b's own.
				step, err = b.Append(prompt[b.Len():])
				require.NoError(t, err)
				writeStep(t, step, prompt, 0)
				checkSeq(t, b, prompt, 0, 0, len(prompt))
				checkSeq(t, a, family(0, 46), 0, 0, 46)
			}
			require.NoError(t, b.Free())
			require.NoError(t, a.Free())
			require.NoError(t, cache.Check())
		})
	}
}

// TestContiguousMatchGoesIntoNextUnit: in the Contiguous layout (12 KiB
// tokens, 64 KiB pages, 2-token blocks) a prompt that shares a cached
// prompt's tokens past a unit boundary a token straddles borrows the
// units whose keys it matches whole — the straddling token is the last
// of the unit before's key, so its first bytes there are this prompt's —
// and copies the next unit's whole blocks it shares, as the other layouts
// do: matched 30 tokens (units 0-4 borrowed, unit 5 copied) where the
// match used to stop at 26 (unit 4 copied). Where the prompt differs at
// the straddling token itself, unit 4 is not matched and is copied for
// the blocks it shares. Every shared position reads back.
func TestContiguousMatchGoesIntoNextUnit(t *testing.T) {
	for _, c := range []struct {
		name                    string
		prompt                  []int
		matched, shared, copies int
	}{
		{"past-the-straddle", append(family(0, 30), family(7, 20)...), 30, 5, 1},
		{"at-the-straddle", append(family(0, 26), family(7, 20)...), 26, 4, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := hostEnv(t, 64*units.MiB)
			cfg := tinyConfig(Contiguous, 64, 2)
			cfg.Layers, cfg.BlockTokens = 3, 2
			cache := e.cache(t, cfg)
			a := prefill(t, cache, family(0, 40), 0)
			require.NoError(t, a.Free())
			b, err := cache.Admit(c.prompt, 0)
			require.NoError(t, err)
			require.Equal(t, c.matched, b.Matched())
			require.Equal(t, c.shared, b.SharedUnits())
			require.Equal(t, c.copies, cache.Stats().Copies)
			require.NoError(t, cache.Check())
			checkSeq(t, b, c.prompt, 0, 0, c.matched)
			step, err := b.Append(c.prompt[b.Len():])
			require.NoError(t, err)
			writeStep(t, step, c.prompt, 0)
			require.NoError(t, b.MarkWritten(len(c.prompt)))
			checkSeq(t, b, c.prompt, 0, 0, len(c.prompt))
			// The cached prompt is whole still: a third sequence of it
			// reads it back.
			a2, err := cache.Admit(family(0, 40), 0)
			require.NoError(t, err)
			require.Greater(t, a2.Matched(), c.matched, "the cached prompt's own prefix is found past b's")
			checkSeq(t, a2, family(0, 40), 0, 0, a2.Matched())
			require.NoError(t, a2.Free())
			require.NoError(t, b.Free())
			require.NoError(t, cache.Check())
		})
	}
}

// TestContiguousCopiedUnitTakesTheCachedOnesPlace: in the Contiguous
// layout a match that ends where the prompt leaves the cached one, just
// past a unit whose last token straddles into the next, copies that unit
// (the straddling token is recomputed in the copy). The copy, once
// written, holds the cached unit's tokens under its key: it is listed in
// the cached unit's place and the cached one's page goes back, so that
// the prefix stays whole when the cache evicts — the cached unit, used
// no later than the admission, would go before the units the second
// sequence writes past it, and every later match would end there.
func TestContiguousCopiedUnitTakesTheCachedOnesPlace(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	cfg := tinyConfig(Contiguous, 64, 2)
	cfg.Layers, cfg.BlockTokens = 3, 2
	c := e.cache(t, cfg)
	g := c.g
	k := 2
	for {
		if _, copyNext, _ := g.cut(k + 1); copyNext {
			break
		}
		k++
	}
	_, keyEnd := g.keyTokens(k)
	stored := 0 // the store units of a's 40 tokens
	for u := 0; u < g.units; u++ {
		if _, end := g.unitTokens(u); end <= 40 {
			stored++
		}
	}
	a := prefill(t, c, family(0, 40), 0)
	require.NoError(t, a.Free())
	require.Equal(t, stored*g.unitPages(), c.Stats().CachedPages)

	prompt := append(family(0, keyEnd), family(7, 20)...)
	copies := c.Stats().Copies
	b := prefill(t, c, prompt, 0)
	require.Equal(t, k, b.SharedUnits(), "units [0, k) borrowed")
	require.Equal(t, copies+1, c.Stats().Copies, "unit k copied")
	require.Equal(t, (stored-k-1)*g.unitPages(), c.Stats().CachedPages, "a's unit k gave its place to b's copy")
	require.NoError(t, c.Check())
	checkSeq(t, b, prompt, 0, 0, len(prompt))
	require.NoError(t, b.Free())

	// Evict a's units past k, then one more: b's last.
	c.mu.Lock()
	for range stored - k - 1 + 1 {
		require.NoError(t, c.evictOneLocked())
	}
	c.mu.Unlock()
	require.NoError(t, c.Check())
	d, err := c.Admit(prompt, 0)
	require.NoError(t, err)
	_, bLast := g.keyTokens(c.UnitsFor(len(prompt)) - 2)
	require.Greater(t, d.Matched(), keyEnd, "b's prefix is whole past unit k")
	require.LessOrEqual(t, d.Matched(), bLast)
	checkSeq(t, d, prompt, 0, 0, d.Matched())
	require.NoError(t, d.Free())
	require.NoError(t, c.Check())
}

// TestContiguousTokenOverPage: in the Contiguous layout with a token
// larger than a page (68 KiB over 64 KiB pages) some pages complete no
// token; each store unit's key names its index too, so a prefix is still
// shared page after page, and the bytes read back.
func TestContiguousTokenOverPage(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	cfg := tinyConfig(Contiguous, 64, 2)
	cfg.Layers = 17 // 68 KiB a token
	c := e.cache(t, cfg)
	a, err := c.Admit(family(0, 40), 0)
	require.NoError(t, err)
	step, err := a.Append(family(0, 40))
	require.NoError(t, err)
	writeStep(t, step, family(0, 40), 0)
	require.NoError(t, a.MarkWritten(40))
	prompt := append(family(0, 39), 7)
	b, err := c.Admit(prompt, 0)
	require.NoError(t, err)
	// Token 38 is the last whole in the pages of tokens below 39 (the
	// prompt's last is computed); a match ends where token 38 would
	// straddle: 38*68/64 pages borrowed at most, the page token 38 starts
	// in copied.
	t.Logf("matched %d of %d tokens, %d units shared", b.Matched(), len(prompt), b.SharedUnits())
	require.GreaterOrEqual(t, b.Matched(), 32, "the prefix is shared past the pages that complete no token")
	require.NoError(t, c.Check())
	checkSeq(t, b, prompt, 0, 0, b.Matched())
	step, err = b.Append(prompt[b.Len():])
	require.NoError(t, err)
	writeStep(t, step, prompt, 0)
	checkSeq(t, b, prompt, 0, 0, len(prompt))
	checkSeq(t, a, family(0, 40), 0, 0, 40)
	require.NoError(t, b.Free())
	require.NoError(t, a.Free())
	require.NoError(t, c.Check())
}
