package kvcache

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/tensor"
)

// TestLayoutFigures: the figures docs/kvcache.md's Layouts section gives for
// the layouts, worked out by the cache's own geometry: for each preset,
// page size and layout, the tokens a page holds, the commit unit, the
// internal waste (bytes of committed pages no token can use, per token),
// the tail waste (the worst and the mean over lengths, per sequence) and,
// where the tail holds more tokens than the paged scheme's 16-token
// block, how much more it costs than a block's tail; the layout
// PickLayout takes is marked.
func TestLayoutFigures(t *testing.T) {
	const maxCtx = 32768
	for _, pg := range []uint64{2 * units.MiB, 64 * units.KiB} {
		t.Logf("pages of %s, MaxContext %d; waste per token is internal, per sequence the tail (worst, mean over lengths); the paged scheme's block of 16 tokens wastes at worst 15 tokens, 7.5 on average", units.Bytes(pg), maxCtx)
		t.Logf("%-12s %-12s %8s %6s %10s %22s %22s %10s", "model", "layout", "tok/page", "unit", "int./token", "tail worst (tokens)", "tail mean (tokens)", "÷ block")
		for _, name := range Presets() {
			if name == "tiny" {
				continue
			}
			cfg, err := Preset(name)
			require.NoError(t, err)
			cfg.MaxContext, cfg.MaxSeqs, cfg.PageSize = maxCtx, 1, pg
			pick, err := PickLayout(cfg)
			require.NoError(t, err)
			for _, l := range []Layout{PerLayer, TokenMajor, Contiguous} {
				cfg.Layout = l
				g, err := cfg.check([]driver.Device{{RecommendedGranularity: pg}}, pg)
				require.NoError(t, err)
				tb := g.tokenBytes()
				// Internal waste: what a full unit leaves unused, per
				// token it holds.
				_, end := g.unitTokens(0)
				full := uint64(g.unitPages()) * g.page
				internal := 0.0
				if l == TokenMajor {
					internal = float64(full-uint64(g.tpg)*tb) / float64(g.tpg)
				}
				// Tail: committed past the tokens, over every length
				// of one period of the layout (the mean) and the worst.
				period := g.period
				if l != Contiguous {
					period = 1
				}
				var sum, worst uint64
				lens := 0
				for n := 1; n <= min(maxCtx, max(end, 1)*period*4); n++ {
					w := uint64(g.unitsFor(n))*full - uint64(n)*tb
					if l == TokenMajor {
						w -= uint64(g.unitsFor(n)-1) * (full - uint64(g.tpg)*tb) // the internal part, counted apart
					}
					sum += w
					worst = max(worst, w)
					lens++
				}
				mean := float64(sum) / float64(lens)
				block := 7.5 * float64(tb) // the paged scheme's mean tail
				ratio := ""
				if tpp := float64(g.page) / float64(tb); tpp > 16 {
					ratio = fmt.Sprintf("%.1fx", mean/block)
				}
				mark := ""
				if l == pick {
					mark = " <- PickLayout"
				}
				t.Logf("%-12s %-12s %8.2f %3d pg %10s %13s (%6.1f) %13s (%6.1f) %10s%s", name, l, float64(g.page)/float64(tb),
					g.unitPages(), units.Bytes(uint64(internal)), units.Bytes(worst), float64(worst)/float64(tb),
					units.Bytes(uint64(mean)), mean/float64(tb), ratio, mark)
				switch l {
				case Contiguous:
					require.Zero(t, internal, "%s: no byte of a page inside a sequence is unused", name)
					require.Less(t, worst, g.page, "%s: the tail wastes less than a page", name)
				case TokenMajor:
					require.Less(t, worst, uint64(g.unitPages())*g.page, name)
				}
				ww, err := WorstWaste(cfg, l)
				require.NoError(t, err)
				require.GreaterOrEqual(t, ww, worst, "%s %s: WorstWaste bounds the tails seen", name, l)
			}
		}
	}
	// The figures the package doc quotes.
	for _, c := range []struct {
		preset string
		pg     uint64
		want   Layout
	}{
		{"llama3-8b", 2 * units.MiB, TokenMajor}, // 16 whole tokens a page: a tie, and whole tokens win
		{"qwen2.5-7b", 2 * units.MiB, Contiguous},
		{"deepseek-v3", 2 * units.MiB, Contiguous},
		{"qwen2.5-7b", 64 * units.KiB, Contiguous},
		{"llama3-8b", 64 * units.KiB, TokenMajor}, // a token is two pages
	} {
		cfg, err := Preset(c.preset)
		require.NoError(t, err)
		cfg.MaxContext, cfg.MaxSeqs, cfg.PageSize = maxCtx, 1, c.pg
		l, err := PickLayout(cfg)
		require.NoError(t, err)
		require.Equal(t, c.want, l, "%s at %s", c.preset, units.Bytes(c.pg))
	}
}

// TestPresets: the presets fill the shape only; an unknown one is
// ErrInvalid and lists the known.
func TestPresets(t *testing.T) {
	require.Equal(t, []string{"deepseek-v3", "llama-7b", "llama3-8b", "mistral-7b", "qwen2.5-7b", "tiny"}, Presets())
	cfg, err := Preset("llama3-8b")
	require.NoError(t, err)
	require.Equal(t, Config{Layers: 32, KVHeads: 8, HeadDim: 128, DType: tensor.Float16}, cfg)
	_, err = Preset("gpt-5")
	drivertest.RequireIs(t, err, driver.ErrInvalid, "gpt-5", "llama-7b, llama3-8b")
	for _, l := range []Layout{PerLayer, TokenMajor, Contiguous, AutoLayout} {
		got, err := ParseLayout(l.String())
		require.NoError(t, err)
		require.Equal(t, l, got)
	}
	_, err = ParseLayout("paged")
	drivertest.RequireIs(t, err, driver.ErrInvalid, "per-layer", "contiguous", "auto")
	_, err = WorstWaste(cfg, AutoLayout)
	drivertest.RequireIs(t, err, driver.ErrInvalid)
	_, err = PickLayout(Config{})
	drivertest.RequireIs(t, err, driver.ErrInvalid, "Layers")
}

// TestConfigRefusals: every config New cannot hold is refused with a
// message naming the field, and reserves nothing.
func TestConfigRefusals(t *testing.T) {
	e := hostEnv(t, 16*units.MiB)
	good := tinyConfig(PerLayer, 64, 2)
	for _, c := range []struct {
		name     string
		change   func(*Config)
		sentinel error
		mentions string
	}{
		{"no layers", func(c *Config) { c.Layers = 0 }, driver.ErrInvalid, "Layers 0"},
		{"negative heads", func(c *Config) { c.KVHeads = -1 }, driver.ErrInvalid, "KVHeads -1"},
		{"bad dtype", func(c *Config) { c.DType = 99 }, driver.ErrInvalid, "DType"},
		{"no context", func(c *Config) { c.MaxContext = 0 }, driver.ErrInvalid, "MaxContext"},
		{"no slots", func(c *Config) { c.MaxSeqs = 0 }, driver.ErrInvalid, "MaxSeqs"},
		{"negative block", func(c *Config) { c.BlockTokens = -4 }, driver.ErrInvalid, "BlockTokens"},
		{"bad layout", func(c *Config) { c.Layout = 7 }, driver.ErrInvalid, "Layout 7"},
		{"no device", func(c *Config) { c.Device = 3 }, driver.ErrNoDevice, "device 3"},
		{"odd page", func(c *Config) { c.PageSize = page + 4096 }, driver.ErrMisaligned, "PageSize"},
		{"huge heads", func(c *Config) { c.KVHeads, c.HeadDim = 1<<40, 1<<30 }, driver.ErrInvalid, "overflows"},
		{"huge slots", func(c *Config) { c.MaxContext, c.MaxSeqs = 1<<40, 1<<20 }, driver.ErrInvalid, "overflows"},
		// 2^17 units a slot, 2^10 slots: books of 2^27 entries, in 64 TiB
		// of address space the process could reserve.
		{"too many units", func(c *Config) { c.MaxContext, c.MaxSeqs = 1<<22, 1<<10 }, driver.ErrInvalid, "MaxUnits"},
		// PickLayout weighs the worst waste over 2^40 lengths without
		// walking them; two slots of 2^62 bytes overflow.
		{"auto, long, huge pages", func(c *Config) { c.Layout, c.MaxContext, c.PageSize = AutoLayout, 1<<40, 1<<62 }, driver.ErrInvalid, "address space overflows"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := good
			c.change(&cfg)
			_, err := New(e.space, e.mem, cfg)
			drivertest.RequireIs(t, err, c.sentinel, c.mentions)
			require.Empty(t, e.space.Reservations())
		})
	}
}

// TestWriteReadBack: for both layouts, keys and values written through
// Append's views read back through K and V, across appends of every size
// that cross pages and page groups; addresses never move.
func TestWriteReadBack(t *testing.T) {
	for _, layout := range []Layout{PerLayer, TokenMajor} {
		t.Run(layout.String(), func(t *testing.T) {
			e := hostEnv(t, 64*units.MiB)
			c := e.cache(t, tinyConfig(layout, 256, 2))
			prompt := []int{5, 6, 7, 8, 9, 10, 11}
			s, err := c.Admit(prompt, 0)
			require.NoError(t, err)
			require.Zero(t, s.Len())
			for _, get := range []func(int) (*tensor.Tensor, error){s.K, s.V} {
				empty, err := get(3)
				require.NoError(t, err)
				require.Zero(t, empty.NumElements(), "nothing stored yet")
			}
			tokens := append([]int(nil), prompt...)
			step, err := s.Append(prompt)
			require.NoError(t, err)
			require.Equal(t, Step{Pos: 0, N: 7, Layers: step.Layers}, step)
			writeStep(t, step, tokens, 0)
			addrs := []driver.Addr{firstAddr(t, s, 0), firstAddr(t, s, 3)}
			for i, n := range []int{1, 1, 3, 30, 1, 64, 5, 1, 100} {
				more := make([]int, n)
				for j := range more {
					more[j] = 100 + i*7 + j
				}
				tokens = append(tokens, more...)
				step, err := s.Append(more)
				require.NoError(t, err)
				require.Equal(t, len(tokens)-n, step.Pos)
				if layout == PerLayer {
					require.Len(t, step.Layers[0], 1, "one run per layer")
				}
				writeStep(t, step, tokens, 0)
				require.Equal(t, addrs, []driver.Addr{firstAddr(t, s, 0), firstAddr(t, s, 3)}, "addresses never move")
				checkSeq(t, s, tokens, 0, 0, len(tokens))
				require.NoError(t, c.Check())
			}
			require.Equal(t, len(tokens), s.Len())
			require.Equal(t, tokens, s.Tokens())
			k, err := s.K(2)
			require.NoError(t, err)
			if layout == PerLayer {
				require.Equal(t, []int{len(tokens), 8, 64}, k.Shape())
				require.True(t, k.IsContiguous())
			} else {
				tpg := c.TokensPerGroup()
				require.Equal(t, 4, tpg)
				require.Equal(t, []int{(len(tokens) + tpg - 1) / tpg, tpg, 8, 64}, k.Shape())
				require.Equal(t, []int{int(page / 4), 8 * 64, 64, 1}, k.Strides())
				require.Equal(t, 2*2*tpg*8*64, k.Offset(), "layer 2's K: past 2 layers of K and V")
				v, err := s.V(2)
				require.NoError(t, err)
				require.Equal(t, k.Offset()+tpg*8*64, v.Offset())
			}
			st := c.Stats()
			require.Equal(t, len(tokens), st.TokensStored)
			require.Equal(t, uint64(len(tokens))*2*4*2048, st.UsedBytes)
			require.NoError(t, s.Free())
		})
	}
}

// TestSimBookkeeping: on the sim driver a model-sized cache keeps the
// same books but hands out no tensors.
func TestSimBookkeeping(t *testing.T) {
	for _, layout := range []Layout{PerLayer, TokenMajor} {
		t.Run(layout.String(), func(t *testing.T) {
			e := simEnv(t, 80*units.GiB, 0)
			cfg, err := Preset("llama3-8b")
			require.NoError(t, err)
			cfg.MaxContext, cfg.MaxSeqs, cfg.Layout, cfg.MapAhead = 32768, 256, layout, -1
			c := e.cache(t, cfg)
			require.Equal(t, 2*units.MiB, c.Config().PageSize, "the device's recommended granularity")
			require.Equal(t, 80*units.GiB, c.Config().Budget, "the device's capacity")
			s, err := c.Admit(make([]int, 3000), 9)
			require.NoError(t, err)
			step, err := s.Append(make([]int, 3000))
			require.NoError(t, err)
			require.Nil(t, step.Layers)
			require.Equal(t, 3000, step.N)
			_, err = s.K(0)
			drivertest.RequireIs(t, err, driver.ErrUnsupported, "no memory to hand out")
			st := c.Stats()
			tokenBytes := uint64(2 * 32 * 8 * 128 * 2)
			require.Equal(t, uint64(3000)*tokenBytes, st.UsedBytes)
			var pages int
			if layout == PerLayer {
				pages = 64 * 3 // 1024 tokens a page, 3 pages in each of 64 regions
			} else {
				pages = (3000 + 15) / 16
			}
			require.Equal(t, pages, st.PagesCommitted)
			require.Equal(t, uint64(pages)*2*units.MiB-uint64(3000)*tokenBytes, st.Waste)
			require.NoError(t, c.Check())
			require.NoError(t, s.MarkWritten(3000)) // the model's rows, in a simulation
			require.NoError(t, s.Free())
			st = c.Stats()
			// The prompt's whole units went to the prefix store (cached
			// now); the rest stays with the slot.
			storeUnits := 2 // 1024 tokens a unit
			if layout == TokenMajor {
				storeUnits = 3000 / 16
			}
			require.Equal(t, storeUnits*c.g.unitPages(), st.CachedPages)
			require.Equal(t, pages-st.CachedPages, st.IdlePages, "kept for the next sequence")
		})
	}
}

// TestFreeKeepsPagesForTheSlot: a freed sequence's pages stay committed
// (deferred reclaim); the next sequence prefers that slot and reuses them
// without committing; its keys land at the same addresses.
func TestFreeKeepsPagesForTheSlot(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	c := e.cache(t, tinyConfig(TokenMajor, 256, 3))
	a, err := c.Admit([]int{1}, 0)
	require.NoError(t, err)
	b, err := c.Admit([]int{2}, 0)
	require.NoError(t, err)
	require.NotEqual(t, a.Slot(), b.Slot())
	tokens := make([]int, 40)
	step, err := b.Append(append([]int{2}, tokens[1:]...))
	require.NoError(t, err)
	writeStep(t, step, append([]int{2}, tokens[1:]...), 0)
	addr := firstAddr(t, b, 0)
	used := e.used(t)
	require.NoError(t, b.Free())
	err = b.Free()
	drivertest.RequireIs(t, err, driver.ErrClosed, "kvcache: free a sequence: the sequence was freed")
	require.Contains(t, errors.FlattenHints(err), "a sequence is done with after its Free")
	_, err = b.Append([]int{1})
	drivertest.RequireIs(t, err, driver.ErrClosed, "freed")
	st := c.Stats()
	require.Equal(t, 10, st.IdlePages, "40 tokens, 4 a page")
	require.Equal(t, used, e.used(t), "nothing decommitted")
	commits := st.Commits

	d, err := c.Admit([]int{3, 4}, 0)
	require.NoError(t, err)
	require.Equal(t, b.Slot(), d.Slot(), "the slot with pages is preferred")
	step, err = d.Append(make([]int, 2, 2))
	drivertest.RequireIs(t, err, driver.ErrInvalid, "not the prompt's")
	step, err = d.Append([]int{3, 4, 5, 6, 7, 8})
	require.NoError(t, err)
	writeStep(t, step, []int{3, 4, 5, 6, 7, 8}, 0)
	require.Equal(t, commits, c.Stats().Commits, "the kept pages serve it")
	require.Equal(t, addr, firstAddr(t, d, 0), "same slot, same addresses")
	checkSeq(t, d, []int{3, 4, 5, 6, 7, 8}, 0, 0, 6)
	st = c.Stats()
	require.Equal(t, 0, st.IdlePages)
	require.Equal(t, 8, st.SurplusPages, "the 8 pages past its tokens")
	require.Equal(t, uint64(8*page)+uint64(2*page-6*16*units.KiB), st.Waste, "the 8 pages past its tokens, and the rest of its 2")
	require.NoError(t, c.Check())
	require.NoError(t, a.Free())
	require.NoError(t, d.Free())
}

// TestBudgetReclaimsIdleSlots: when the budget is reached, the pages of
// idle slots are given back (the longest idle first, whole pages) before
// an Append fails; one that cannot be held fails with ErrOutOfMemory and
// changes nothing.
func TestBudgetReclaimsIdleSlots(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	cfg := tinyConfig(TokenMajor, 256, 3)
	cfg.Budget = 16 * page
	c := e.cache(t, cfg)
	a, err := c.Admit([]int{1}, 0)
	require.NoError(t, err)
	_, err = a.Append(make([]int, 1, 1))
	drivertest.RequireIs(t, err, driver.ErrInvalid, "prompt")
	_, err = a.Append(append([]int{1}, make([]int, 39)...)) // 10 pages
	require.NoError(t, err)
	require.NoError(t, a.Free())
	b, err := c.Admit([]int{2}, 0)
	require.NoError(t, err)
	require.Equal(t, a.Slot(), b.Slot())
	x, err := c.Admit([]int{3}, 0)
	require.NoError(t, err)
	require.NotEqual(t, a.Slot(), x.Slot())
	_, err = b.Append(append([]int{2}, make([]int, 3)...)) // uses 1 kept page; 9 remain
	require.NoError(t, err)
	_, err = x.Append(append([]int{3}, make([]int, 23)...)) // 6 pages: 6 free in the budget
	require.NoError(t, err)
	require.Equal(t, 16, c.Stats().PagesCommitted)
	require.Zero(t, c.Stats().Reclaims)
	// x needs 4 more: the surplus of b's slot goes, from its end.
	_, err = x.Append(make([]int, 16))
	require.NoError(t, err)
	st := c.Stats()
	require.Equal(t, 16, st.PagesCommitted)
	require.Equal(t, 1, st.Reclaims)
	require.Equal(t, 4, st.ReclaimedPages)
	require.NoError(t, c.Check())
	// More than the budget can hold: refused, nothing changed.
	before := c.Stats()
	_, err = x.Append(make([]int, 200))
	drivertest.RequireIs(t, err, driver.ErrOutOfMemory, "needs 50 pages")
	require.Equal(t, before, c.Stats())
	require.Equal(t, 40, x.Len())
	require.NoError(t, c.Check())
}

// TestNilArguments: the exported API refuses nil and zero values with
// ErrInvalid, and panics nowhere.
func TestNilArguments(t *testing.T) {
	e := hostEnv(t, 16*units.MiB)
	cfg := tinyConfig(PerLayer, 64, 1)
	_, err := New(nil, e.mem, cfg)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "nil")
	_, err = New(e.space, nil, cfg)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "nil")
	var nilCache *Cache
	for name, c := range map[string]*Cache{"nil": nilCache, "zero": {}} {
		t.Run(name, func(t *testing.T) {
			_, err := c.Admit([]int{1}, 0)
			drivertest.RequireIs(t, err, driver.ErrInvalid, "not a cache")
			drivertest.RequireIs(t, c.Close(), driver.ErrInvalid, "not a cache")
			drivertest.RequireIs(t, c.Check(), driver.ErrInvalid, "not a cache")
			_, err = c.SetBudget(page, Drop)
			drivertest.RequireIs(t, err, driver.ErrInvalid, "not a cache")
			_, err = c.CanAdmit([]int{1}, 0, 1)
			drivertest.RequireIs(t, err, driver.ErrInvalid, "not a cache")
			require.Equal(t, Stats{}, c.Stats())
			require.Nil(t, c.Occupancy())
			require.True(t, c.Closed())
			require.Zero(t, c.Base())
		})
	}
	var nilSeq *Seq
	for name, s := range map[string]*Seq{"nil": nilSeq, "zero": {}} {
		t.Run(name+" sequence", func(t *testing.T) {
			_, err := s.Append([]int{1})
			drivertest.RequireIs(t, err, driver.ErrInvalid, "not a sequence")
			_, err = s.K(0)
			drivertest.RequireIs(t, err, driver.ErrInvalid, "not a sequence")
			_, err = s.V(0)
			drivertest.RequireIs(t, err, driver.ErrInvalid, "not a sequence")
			drivertest.RequireIs(t, s.Free(), driver.ErrInvalid, "not a sequence")
			drivertest.RequireIs(t, s.Preempt(Swap), driver.ErrInvalid, "not a sequence")
			_, err = s.Resume()
			drivertest.RequireIs(t, err, driver.ErrInvalid, "not a sequence")
			_, err = s.Fork()
			drivertest.RequireIs(t, err, driver.ErrInvalid, "not a sequence")
			require.Zero(t, s.Len())
			require.Zero(t, s.Matched())
			require.Equal(t, -1, s.Slot())
			require.Nil(t, s.Tokens())
		})
	}
}

// TestBadInput: every misuse is refused with its sentinel and leaves the
// cache, its ranges and the device as they were.
func TestBadInput(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	cfg := tinyConfig(PerLayer, 64, 2)
	cfg.Budget = 12 * page
	c := e.cache(t, cfg)
	s, err := c.Admit([]int{1, 2, 3}, 0)
	require.NoError(t, err)
	other, err := c.Admit([]int{9}, 0) // its unit fits in the budget, before s's is committed
	require.NoError(t, err)
	_, err = s.Append([]int{1, 2, 3, 4})
	require.NoError(t, err)
	type state struct {
		st     Stats
		layout string
		used   uint64
		len    int
	}
	snap := func() state {
		require.NoError(t, c.Check())
		return state{c.Stats(), fmt.Sprint(c.slots.Layout()), e.used(t), s.Len()}
	}
	for _, k := range []struct {
		name     string
		call     func() error
		sentinel error
		mentions string
	}{
		{"admit nothing", func() error { _, err := c.Admit(nil, 0); return err }, driver.ErrInvalid, "at least one token"},
		{"admit too long", func() error { _, err := c.Admit(make([]int, 65), 0); return err }, driver.ErrInvalid, "MaxContext is 64"},
		{"admit negative", func() error { _, err := c.Admit([]int{1, -2}, 0); return err }, driver.ErrInvalid, "token -2 at position 1"},
		{"admit with no slot", func() error { _, err := c.Admit([]int{1}, 0); return err }, driver.ErrBusy, "all 2 slots"},
		{"append nothing", func() error { _, err := s.Append(nil); return err }, driver.ErrInvalid, "nothing to append"},
		{"append past the context", func() error { _, err := s.Append(make([]int, 61)); return err }, driver.ErrInvalid, "MaxContext is 64"},
		{"append negative", func() error { _, err := s.Append([]int{0, -1}); return err }, driver.ErrInvalid, "position 5"},
		{"append against the prompt", func() error { _, err := other.Append([]int{8}); return err }, driver.ErrInvalid, "not the prompt's 9"},
		{"append past the budget", func() error { _, err := s.Append(make([]int, 60)); return err }, driver.ErrOutOfMemory, "budget"},
		{"K of no layer", func() error { _, err := s.K(4); return err }, driver.ErrInvalid, "layers 0 to 3"},
		{"V of a negative layer", func() error { _, err := s.V(-1); return err }, driver.ErrInvalid, "layers 0 to 3"},
		{"preempt in no mode", func() error { return s.Preempt(0) }, driver.ErrInvalid, "preempt mode 0"},
		{"resume a running sequence", func() error { _, err := s.Resume(); return err }, driver.ErrInvalid, "running"},
		{"a zero budget", func() error { _, err := c.SetBudget(0, Drop); return err }, driver.ErrInvalid, "zero"},
		{"a budget in no mode", func() error { _, err := c.SetBudget(page, 3); return err }, driver.ErrInvalid, "preempt mode 3"},
		{"can admit nothing", func() error { _, err := c.CanAdmit(nil, 0, 0); return err }, driver.ErrInvalid, "at least one token"},
		{"can admit negative output", func() error { _, err := c.CanAdmit([]int{1}, 0, -1); return err }, driver.ErrInvalid, "not negative"},
		{"can admit a negative token", func() error { _, err := c.CanAdmit([]int{-1}, 0, 0); return err }, driver.ErrInvalid, "negative"},
	} {
		t.Run(k.name, func(t *testing.T) {
			before := snap()
			drivertest.RequireIs(t, k.call(), k.sentinel, k.mentions)
			require.Equal(t, before, snap())
		})
	}
	require.NoError(t, other.Free())
	require.NoError(t, c.Close())
	drivertest.RequireIs(t, c.Close(), driver.ErrClosed, "closed")
	_, err = c.Admit([]int{1}, 0)
	drivertest.RequireIs(t, err, driver.ErrClosed, "closed")
	_, err = s.Append([]int{1})
	drivertest.RequireIs(t, err, driver.ErrClosed, "closed")
	_, err = s.K(0)
	drivertest.RequireIs(t, err, driver.ErrClosed, "closed")
	err = s.Free()
	drivertest.RequireIs(t, err, driver.ErrClosed, "kvcache: free a sequence: the cache is closed")
	require.Contains(t, errors.FlattenHints(err), "make a new cache")
	require.Zero(t, e.used(t), "Close gave back everything")
	require.Empty(t, e.space.Reservations())
}

// TestManySlotsCountTheirBooks: MaxUnits bounds the books New builds, and
// a slot's own entry (its state, lists, views) weighs several units': a
// config of MaxUnits slots of one unit each — some 2^26 slot entries, many
// GiB of host memory — is refused (ErrInvalid, naming MaxUnits) by the
// check before anything is built, and New reserves nothing for it. A
// config of a few slots is still accepted.
func TestManySlotsCountTheirBooks(t *testing.T) {
	cfg := tinyConfig(PerLayer, 1, MaxUnits) // one unit a slot
	cfg.NoPrefixSharing = true
	devs := []driver.Device{{Kind: driver.KindSim, Capacity: 1 << 40, MinGranularity: page, RecommendedGranularity: page}}
	c := cfg
	_, err := c.check(devs, page)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "MaxUnits", "MaxSeqs")
	e := simEnv(t, 1<<40, page)
	_, err = New(e.space, e.mem, cfg)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "kvcache: new cache", "MaxUnits")
	require.Empty(t, e.space.Reservations())
	cfg.MaxSeqs = 64
	ok := e.cache(t, cfg)
	s, err := ok.Admit([]int{1}, 0)
	require.NoError(t, err)
	_, err = s.Append([]int{1})
	require.NoError(t, err)
	require.NoError(t, ok.Check())
}
