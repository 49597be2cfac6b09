package kvcache

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/internal/leakcheck"
	"github.com/vmarena/vmarena/internal/race"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/vaspace"
)

// TestWindowConfigRefusals: a Window or Ring New cannot hold is refused
// naming the field, and reserves nothing.
func TestWindowConfigRefusals(t *testing.T) {
	e := hostEnv(t, 16*units.MiB)
	good := tinyConfig(PerLayer, 64, 2)
	for _, c := range []struct {
		name     string
		change   func(*Config)
		sentinel error
		mentions string
	}{
		{"negative window", func(c *Config) { c.Window = -1 }, driver.ErrInvalid, "Window -1"},
		{"window past context", func(c *Config) { c.Window = 65 }, driver.ErrInvalid, "MaxContext 64"},
		{"ring without window", func(c *Config) { c.Ring = true }, driver.ErrInvalid, "Ring"},
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

// wseq is the window model's sequence: its tokens, and where the last
// Append (or Step) of its started (-1: none since its admission or
// resume, so nothing was released).
type wseq struct {
	real    *Seq
	tokens  []int
	extra   uint64
	lastPos int
	matchLo int  // the first unit its admission's (or drop's resume's) match borrowed: past the units behind the window
	dropped bool // preempted
	swapped bool // with Swap: its window's units come back
}

// windowMatchLo is the first unit s (just admitted, or resumed after a
// drop) holds, checked against the sliding-window hit rule: 0 without a
// match; else at most the first unit the window of the first token past
// the match reaches, with every unit from there to the match's end held.
func windowMatchLo(t *testing.T, c *Cache, s *Seq, step string) int {
	t.Helper()
	lo, m := s.sl.lo, s.Len()
	if m == 0 || c.g.ring > 0 {
		require.Zero(t, lo, step)
		return lo
	}
	require.LessOrEqual(t, lo, max(c.g.unitsBehind(m+1-c.cfg.Window), 0), "%s: a match of %d tokens starts at unit %d", step, m, lo)
	for u := lo; u < c.g.unitsFor(m); u++ {
		require.NotEqual(t, unitEmpty, s.sl.units[u].state, "%s: unit %d of a match of %d tokens from unit %d", step, u, m, lo)
	}
	return lo
}

// windowRun counts what a window model run did.
type windowRun struct {
	appends, steps, releases, frees, preempts, resumes, forks, ooms, hits int
	windowHits                                                            int // matches that start past units behind the window
	windowSwaps                                                           int // swaps of sequences with units released
}

// runWindowModel runs the ops of data on a window cache of layout
// (Window from the config byte) and a plain model (each sequence's
// tokens), comparing after every op: the bytes of every running
// sequence's tokens from WindowStart to Len (at least its last Window
// tokens), the first unit it holds (exactly the units wholly behind the
// window of its last Append's first token are released), that it holds
// nothing else below its tokens' end, Stats against the model and Check.
func runWindowModel(t *testing.T, data []byte, layout Layout, ring bool) (r windowRun) {
	cfgByte, ops := decode(data)
	if len(ops) > 200 {
		ops = ops[:200] // as runModel: a long fuzz input costs no more than 200 ops
	}
	e := hostEnv(t, 64*units.MiB)
	cfg := tinyConfig(layout, 512, 3)
	cfg.Window = []int{1, 5, 32, 40, 64, 100, 200, 512}[cfgByte%8]
	cfg.NoPrefixSharing = cfgByte/8%4 == 3
	if cfgByte/32%2 == 1 {
		cfg.MapAhead = 8
	}
	if cfgByte/64%2 == 1 {
		cfg.Budget = 48 * page // small enough to refuse now and then
	}
	if ring {
		// A ring of each region's window: no prefix sharing, no
		// preemption (TestRingRefusals).
		cfg.Layout, cfg.Ring, cfg.NoPrefixSharing = PerLayer, true, true
		cfg.Budget = 0
	}
	c := e.cache(t, cfg)
	g := c.g
	unsupported := func(err error, before books, step string) {
		t.Helper()
		requireIs(t, err, driver.ErrUnsupported, step)
		require.Equal(t, before, snapBooks(t, c, e), step)
	}
	var seqs []*wseq
	running := func() []*wseq {
		var out []*wseq
		for _, s := range seqs {
			if !s.dropped {
				out = append(out, s)
			}
		}
		return out
	}
	pick := func(o op, onlyRunning bool) *wseq {
		pool := seqs
		if onlyRunning {
			pool = running()
		}
		if len(pool) == 0 {
			return nil
		}
		return pool[o.seq%len(pool)]
	}
	// more is n tokens to append to s: its prompt's rest first.
	more := func(s *wseq, n int) []int {
		out := make([]int, n)
		for i := range out {
			out[i] = 7 + (len(s.tokens)+i)*31%997
		}
		if p := s.real.prompt; len(s.tokens) < len(p) {
			k := copy(out, p[len(s.tokens):])
			out = out[:max(k, min(n, len(p)-len(s.tokens)))]
		}
		return out
	}
	for i, o := range ops {
		step := fmt.Sprintf("op %d (%+v), window %d, %s", i, o, cfg.Window, layout)
		switch o.kind {
		case opAdmit, opWarm:
			prompt := family(o.family, 1+o.n%300)
			s, err := c.Admit(prompt, o.extra)
			if errors.Is(err, driver.ErrBusy) || errors.Is(err, driver.ErrOutOfMemory) {
				r.ooms += b2i(errors.Is(err, driver.ErrOutOfMemory))
				continue
			}
			require.NoError(t, err, step)
			ws := &wseq{real: s, tokens: append([]int(nil), prompt[:s.Len()]...), extra: o.extra, lastPos: -1}
			r.hits += b2i(s.Len() > 0)
			ws.matchLo = windowMatchLo(t, c, s, step)
			r.windowHits += b2i(ws.matchLo > 0)
			seqs = append(seqs, ws)
		case opAppend, opAppendMore, opReserve:
			s := pick(o, true)
			if s == nil || len(s.tokens) == cfg.MaxContext {
				continue
			}
			n := 1
			if o.kind == opAppendMore {
				n = 1 + o.n%80
			}
			if ring {
				n = min(n, g.ringCap-cfg.Window+1)
			}
			toks := more(s, min(n, cfg.MaxContext-len(s.tokens)))
			pos := len(s.tokens)
			st, err := s.real.Append(toks)
			if errors.Is(err, driver.ErrOutOfMemory) {
				r.ooms++
				if !ring {
					s.lastPos = max(s.lastPos, pos) // the release stays done
				}
				continue
			}
			require.NoError(t, err, step)
			s.tokens = append(s.tokens, toks...)
			s.lastPos = pos
			writeStep(t, st, s.tokens, s.extra)
			require.NoError(t, s.real.MarkWritten(len(s.tokens)), step)
			r.appends++
		case opStep:
			var batch []StepRequest
			var who []*wseq
			for _, s := range running() {
				if len(s.tokens) < cfg.MaxContext {
					batch = append(batch, StepRequest{Seq: s.real, Tokens: more(s, 1), Views: true})
					who = append(who, s)
				}
			}
			if len(batch) == 0 {
				continue
			}
			out, err := c.Step(batch, nil)
			if errors.Is(err, driver.ErrOutOfMemory) {
				r.ooms++
				for _, s := range who {
					if !ring {
						s.lastPos = max(s.lastPos, len(s.tokens)) // the release stays done
					}
				}
				continue
			}
			require.NoError(t, err, step)
			for k, s := range who {
				s.lastPos = len(s.tokens)
				s.tokens = append(s.tokens, batch[k].Tokens...)
				writeStep(t, out[k].Step, s.tokens, s.extra)
				require.NoError(t, s.real.MarkWritten(len(s.tokens)), step)
			}
			r.steps++
		case opFree:
			s := pick(o, false)
			if s == nil {
				continue
			}
			require.NoError(t, s.real.Free(), step)
			seqs = slices.DeleteFunc(seqs, func(x *wseq) bool { return x == s })
			r.frees++
		case opPreempt:
			s := pick(o, true)
			if s == nil {
				continue
			}
			if ring {
				before := snapBooks(t, c, e)
				unsupported(s.real.Preempt(Drop), before, step)
				continue
			}
			mode := []PreemptMode{Swap, Drop}[o.n%2]
			r.windowSwaps += b2i(mode == Swap && s.real.sl.lo > 0)
			require.NoError(t, s.real.Preempt(mode), step)
			s.dropped, s.swapped = true, mode == Swap
			r.preempts++
		case opResume:
			var s *wseq
			for _, x := range seqs {
				if x.dropped {
					s = x
					break
				}
			}
			if s == nil {
				continue
			}
			st, err := s.real.Resume()
			if errors.Is(err, driver.ErrOutOfMemory) {
				r.ooms++
				continue
			}
			require.NoError(t, err, step)
			writeStep(t, st, s.tokens, s.extra)
			require.NoError(t, s.real.MarkWritten(len(s.tokens)), step)
			if !s.swapped {
				s.lastPos = -1 // recomputed from its match: nothing behind its window released yet
				s.matchLo = windowMatchLo(t, c, s.real, step)
				r.windowHits += b2i(s.matchLo > 0)
			}
			s.dropped, s.swapped = false, false
			r.resumes++
		case opFork:
			s := pick(o, true)
			if s == nil {
				continue
			}
			before := snapBooks(t, c, e)
			f, err := s.real.Fork()
			switch {
			case ring:
				unsupported(err, before, step)
			case errors.Is(err, driver.ErrBusy) || errors.Is(err, driver.ErrOutOfMemory) || errors.Is(err, driver.ErrUnsupported) || errors.Is(err, driver.ErrInvalid):
			default:
				require.NoError(t, err, step)
				seqs = append(seqs, &wseq{real: f, tokens: slices.Clone(s.tokens), extra: s.extra, lastPos: s.lastPos, matchLo: s.matchLo})
				r.forks++
			}
		case opVerify, opSetBudget:
		}
		// Compare.
		released := 0
		for _, s := range running() {
			n := len(s.tokens)
			require.Equal(t, n, s.real.Len(), step)
			sl := s.real.sl
			if ring {
				require.Zero(t, sl.lo, step)
				require.Equal(t, min(max(s.lastPos+1-cfg.Window, 0), n), s.real.WindowStart(), step)
				require.Equal(t, b2i(s.lastPos >= 0)*g.ringPages(), b2i(sl.ring)*g.ringPages(), "%s: the rings are committed at the first Append", step)
				checkWindow(t, s.real, s.tokens, s.extra)
				continue
			}
			lo := s.matchLo
			if s.lastPos >= 0 {
				lo = max(lo, g.unitsBehind(s.lastPos+1-cfg.Window))
			}
			require.Equal(t, lo, sl.lo, "%s: the units released behind the window of the sequence in slot %d (%d tokens, last append at %d)", step, sl.idx, n, s.lastPos)
			released += lo
			held := 0
			for u := 0; u < g.unitsFor(n); u++ {
				st := sl.units[u].state
				if u < lo {
					// Behind the window: gone, or a listed store unit
					// left mapped (kept), no page of the slot's.
					require.True(t, st == unitEmpty || st == unitKept, "%s: unit %d behind the window is %v", step, u, st)
					continue
				}
				held += b2i(st != unitEmpty)
			}
			require.Equal(t, g.unitsFor(n)-lo, held, step)
			start := s.real.WindowStart()
			require.Equal(t, min(g.firstWhole(lo), n), start, step)
			if s.lastPos >= 0 {
				require.LessOrEqual(t, start, max(0, s.lastPos+1-cfg.Window), "%s: the last append's first token sees its window", step)
			}
			require.GreaterOrEqual(t, start, max(0, n-cfg.Window-len(s.tokens)), step)
			checkWindow(t, s.real, s.tokens, s.extra)
		}
		st := c.Stats()
		require.Equal(t, released, c.behindUnits, step)
		r.releases = st.WindowReleases
		require.NoError(t, c.Check(), step)
	}
	return r
}

// TestWindowModel runs random operation sequences on window caches of
// every layout, and on ring caches, against the model.
func TestWindowModel(t *testing.T) {
	seeds := uint64(12)
	if race.Enabled {
		seeds = 3 // one goroutine's model, ten times slower under the detector; scripts/test runs the twelve without it
	}
	var total windowRun
	for _, kind := range []struct {
		layout Layout
		ring   bool
	}{{PerLayer, false}, {TokenMajor, false}, {Contiguous, false}, {PerLayer, true}} {
		layout := kind.layout
		for seed := range seeds {
			t.Run(fmt.Sprint(layout, "/ring=", kind.ring, "/", seed), func(t *testing.T) {
				r := runWindowModel(t, randomInput(rand.New(rand.NewPCG(seed, 31)), 120), layout, kind.ring)
				total.appends += r.appends
				total.steps += r.steps
				total.releases += r.releases
				total.preempts += r.preempts
				total.resumes += r.resumes
				total.forks += r.forks
				total.ooms += r.ooms
				total.hits += r.hits
				total.windowHits += r.windowHits
				total.windowSwaps += r.windowSwaps
			})
		}
	}
	t.Logf("%+v", total)
	if seeds < 12 {
		return
	}
	require.Greater(t, total.appends, 300)
	require.Greater(t, total.releases, 100, "units are released behind windows")
	require.Positive(t, total.windowHits, "matches start past the units behind the window")
	require.Positive(t, total.resumes)
	require.Positive(t, total.windowSwaps, "swaps of sequences with units behind their windows")
	require.Positive(t, total.forks)
	require.Positive(t, total.hits, "prompts of one family share prefixes")
}

// FuzzWindowModel fuzzes the window model's operation sequences.
func FuzzWindowModel(f *testing.F) {
	for seed := uint64(0); seed < 4; seed++ {
		f.Add(randomInput(rand.New(rand.NewPCG(seed, 37)), 40))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		_ = runWindowModel(t, data, PerLayer, false)
		_ = runWindowModel(t, data, Contiguous, false)
		_ = runWindowModel(t, data, PerLayer, true)
	})
}

// checkWindow reads every layer's K and V of s and compares each element
// of positions [WindowStart, Len) with what writeStep wrote for tokens:
// K and V start at WindowStart (TokenMajor: at its group).
func checkWindow(t testing.TB, s *Seq, tokens []int, extra uint64) {
	t.Helper()
	pre := prefixes(tokens, extra)
	start, n := s.WindowStart(), s.Len()
	tpg := s.c.TokensPerGroup()
	for l := 0; l < s.c.cfg.Layers; l++ {
		for kv, get := range []func(int) (*tensor.Tensor, error){s.K, s.V} {
			ten, err := get(l)
			require.NoError(t, err)
			require.NoError(t, ten.Check())
			for p := start; p < n; p++ {
				var row *tensor.Tensor
				if tpg == 0 {
					row, err = ten.Narrow(0, p-start, 1)
				} else {
					row, err = ten.Narrow(0, p/tpg-start/tpg, 1)
					require.NoError(t, err)
					row, err = row.Narrow(1, p%tpg, 1)
				}
				require.NoError(t, err)
				data, err := tensor.Data[float32](row)
				require.NoError(t, err)
				heads, dim := s.c.cfg.KVHeads, s.c.cfg.HeadDim
				for h := 0; h < heads; h++ {
					for d := 0; d < dim; d++ {
						if got, want := data[h*dim+d], value(pre[p], l, kv, h, d); got != want {
							require.Equal(t, want, got, "layer %d %s position %d head %d dim %d (window from %d)", l, [2]string{"K", "V"}[kv], p, h, d, start)
						}
					}
				}
			}
		}
	}
}

// TestWindowMemory32k prints (and bounds) the memory one 32k-token
// sequence of mistral-7b's shape holds, 2 MiB pages on the sim driver,
// with full attention, a sliding window of 1,024 tokens, and the same
// window as a double-mapped ring: a 4,096-token prompt in Appends of 512,
// then one token an Append to 32,768. The window holds the pages of its
// last 1,024 tokens (and the last Append's) in each of the 64 regions;
// the ring holds R = 2 pages a region, each mapped twice, committed once.
func TestWindowMemory32k(t *testing.T) {
	const total, prompt, chunk, window = 32768, 4096, 512, 1024
	type figures struct {
		peak, end                        int
		commits, decommits, borrows, rel int
	}
	run := func(w int, ring bool) figures {
		e := simEnv(t, 16*units.GiB, 0)
		cfg, err := Preset("mistral-7b")
		require.NoError(t, err)
		cfg.MaxContext, cfg.MaxSeqs, cfg.Layout, cfg.MapAhead = total, 1, PerLayer, -1
		cfg.Window, cfg.Ring, cfg.NoPrefixSharing = w, ring, true
		c := e.cache(t, cfg)
		tokens := make([]int, total)
		for i := range tokens {
			tokens[i] = i % 30000
		}
		s, err := c.Admit(tokens[:prompt], 0)
		require.NoError(t, err)
		var f figures
		for n := 0; n < total; {
			cnt := 1
			if n < prompt {
				cnt = chunk
			}
			_, err := s.Append(tokens[n : n+cnt])
			require.NoError(t, err)
			n += cnt
			f.peak = max(f.peak, c.Stats().PagesCommitted)
		}
		st := c.Stats()
		f.end, f.commits, f.decommits, f.borrows, f.rel = st.PagesCommitted, st.Commits, st.Decommits, st.Borrows, st.WindowUnits
		require.NoError(t, c.Check())
		return f
	}
	full, win, ring := run(0, false), run(window, false), run(window, true)
	for _, r := range []struct {
		name string
		f    figures
	}{{"full attention", full}, {"window 1024", win}, {"ring 1024", ring}} {
		t.Logf("%-15s peak %4d pages (%5d MiB), at 32k %4d; %5d commits, %5d decommits, %3d maps of a ring; %5d units released behind the window",
			r.name, r.f.peak, r.f.peak*2, r.f.end, r.f.commits, r.f.decommits, r.f.borrows, r.f.rel)
	}
	const regions = 64
	require.Equal(t, regions*32, full.peak, "full attention: 32 pages of 1,024 rows a region")
	// A window of 1,024 rows of 2 KiB is one page; the Append's first
	// token's window and its tokens reach 3 pages at most in a region
	// (2 once decoding).
	require.LessOrEqual(t, win.peak, regions*3)
	require.LessOrEqual(t, win.end, regions*2)
	require.Equal(t, regions*2, ring.peak, "R = 2 pages hold 1,024 + 16 rows")
	require.Equal(t, regions*2, ring.borrows, "each ring mapped twice, once")
	require.Equal(t, regions, ring.commits)
}

// TestWindowFork: a fork of a window sequence made before any unit left
// its window shares the parent's units; both then grow apart, each
// releasing its own and the shared units behind its window, and each
// reads its own tokens' bytes at every step. A fork made once units are
// released shares the window's units only, and all three grow on.
func TestWindowFork(t *testing.T) {
	for _, layout := range []Layout{PerLayer, TokenMajor, Contiguous} {
		t.Run(layout.String(), func(t *testing.T) {
			e := hostEnv(t, 64*units.MiB)
			cfg := tinyConfig(layout, 512, 3)
			cfg.Window = 40
			c := e.cache(t, cfg)
			prompt := family(0, 20)
			p, err := c.Admit(prompt, 0)
			require.NoError(t, err)
			st, err := p.Append(prompt)
			require.NoError(t, err)
			writeStep(t, st, prompt, 0)
			require.NoError(t, p.MarkWritten(len(prompt)))
			f, err := p.Fork()
			require.NoError(t, err)
			toks := map[*Seq][]int{p: slices.Clone(prompt), f: slices.Clone(prompt)}
			for i := 0; i < 200; i++ {
				for k, s := range []*Seq{p, f} {
					tok := 5000 + 2*i + k
					st, err := s.Append([]int{tok})
					require.NoError(t, err)
					toks[s] = append(toks[s], tok)
					writeStep(t, st, toks[s], 0)
					require.NoError(t, s.MarkWritten(len(toks[s])))
				}
				for _, s := range []*Seq{p, f} {
					checkWindow(t, s, toks[s], 0)
				}
				require.NoError(t, c.Check())
			}
			require.Positive(t, p.sl.lo)
			require.Positive(t, f.sl.lo)
			// A fork now shares the window's units only: a map for each
			// unit the parent holds, none behind its window.
			before := c.Stats()
			h, err := p.Fork()
			require.NoError(t, err)
			require.Equal(t, p.sl.lo, h.sl.lo)
			require.Equal(t, p.WindowStart(), h.WindowStart())
			held := c.g.unitsFor(p.Len()) - p.sl.lo
			require.Equal(t, held, h.sl.borrowed, "the child maps the units the parent holds, none behind its window")
			require.Equal(t, before.Forks+1, c.Stats().Forks)
			toks[h] = slices.Clone(toks[p])
			for i := 0; i < 100; i++ {
				for k, s := range []*Seq{p, f, h} {
					tok := 9000 + 3*i + k
					st, err := s.Append([]int{tok})
					require.NoError(t, err)
					toks[s] = append(toks[s], tok)
					writeStep(t, st, toks[s], 0)
					require.NoError(t, s.MarkWritten(len(toks[s])))
				}
				for _, s := range []*Seq{p, f, h} {
					checkWindow(t, s, toks[s], 0)
				}
				require.NoError(t, c.Check())
			}
			st2 := c.Stats()
			t.Logf("%+v", st2)
			require.Positive(t, st2.WindowUnits)
			require.NoError(t, p.Free())
			require.NoError(t, f.Free())
			require.NoError(t, h.Free())
			require.NoError(t, c.Check())
		})
	}
}

// TestWindowRace: window caches mapping ahead (the goroutine commits the
// next unit while sequences append and release behind their windows),
// sequences appended, read, freed and admitted again from several
// goroutines, Check and Stats beside them: under -race.
func TestWindowRace(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	cfg := tinyConfig(PerLayer, 512, 4)
	cfg.Window, cfg.MapAhead = 48, 8
	c := e.cache(t, cfg)
	done := make(chan error, 4)
	for w := 0; w < 3; w++ {
		go func() {
			done <- func() error {
				for round := 0; round < 3; round++ {
					prompt := family(w, 10+round)
					s, err := c.Admit(prompt, uint64(w))
					if err != nil {
						return err
					}
					toks := append([]int(nil), prompt[:s.Len()]...)
					for s.Len() < 300 {
						next := []int{7 + s.Len()}
						if s.Len() < len(prompt) {
							next = prompt[s.Len():]
						}
						if _, err := s.Append(next); err != nil {
							return err
						}
						toks = append(toks, next...)
						if err := s.MarkWritten(len(toks)); err != nil {
							return err
						}
						if _, err := s.K(round % cfg.Layers); err != nil {
							return err
						}
					}
					if err := s.Free(); err != nil {
						return err
					}
				}
				return nil
			}()
		}()
	}
	stop := make(chan struct{})
	go func() {
		var err error
		for err == nil {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			_ = c.Stats()
			err = c.Check()
		}
		done <- err
	}()
	for w := 0; w < 3; w++ {
		require.NoError(t, <-done)
	}
	close(stop)
	require.NoError(t, <-done)
	c.waitMapperIdle()
	require.NoError(t, c.Check())
	st := c.Stats()
	require.Positive(t, st.WindowUnits)
	require.Positive(t, st.MapperCommits, "the goroutine mapped ahead")
}

// TestWindowNoLeaks: window caches of every layout and a ring cache,
// grown far past their windows, mapping ahead, freed and closed with a
// sequence live, leave the process's descriptors, mappings and resident
// memory as they were, and the device with nothing committed.
func TestWindowNoLeaks(t *testing.T) {
	work := func() {
		drv, err := host.New(host.Options{Devices: 1, Capacity: 64 * units.MiB, Granularity: page})
		require.NoError(t, err)
		space, mem := vaspace.New(drv), physical.New(drv)
		for _, ring := range []bool{false, true} {
			cfg := tinyConfig(PerLayer, 512, 2)
			cfg.Window, cfg.MapAhead = 40, 8
			cfg.Ring, cfg.NoPrefixSharing = ring, ring
			c, err := New(space, mem, cfg)
			require.NoError(t, err)
			for k := 0; k < 2; k++ {
				s, err := c.Admit([]int{1, 2, 3}, 0)
				require.NoError(t, err)
				_, err = s.Append([]int{1, 2, 3})
				require.NoError(t, err)
				for s.Len() < 300 {
					_, err := s.Append([]int{4})
					require.NoError(t, err)
					_, err = s.K(1)
					require.NoError(t, err)
				}
				if k == 0 {
					require.NoError(t, s.Free())
				}
			}
			require.NoError(t, c.Close())
			u, err := mem.Usage(0)
			require.NoError(t, err)
			require.Zero(t, u.Used, "committed back to where it started")
		}
		require.Empty(t, space.Reservations())
		require.NoError(t, drv.Close())
	}
	leakcheck.Require(t, 3, work)
}

// TestWindowEvents: in a window cache, the KV events told, applied in
// order, are the prefix index after every call (prompt units released
// behind the window stay listed while cached, BlockRemoved once
// evicted), and AllBlocksCleared empties it at Close.
func TestWindowEvents(t *testing.T) {
	e := hostEnv(t, 64*units.MiB)
	x := newEventIndex()
	cfg := eventsConfig()
	cfg.Window = 300
	cfg.Events = x.apply
	c := e.cache(t, cfg)
	eventOps(t, c, func(step string) { x.check(t, c, step) })
	st := c.Stats()
	require.Positive(t, st.WindowUnits, "units released behind the window")
	require.Positive(t, st.Evictions, "the budget is small enough to evict")
	require.Zero(t, st.EventsDropped)
	x.closeChecked(t, c)
}

// TestWindowPrefixHit: vLLM's sliding-window hit rule. A prompt prefilled
// in chunks and decoded on has its units behind its window released; the
// store keeps them cached (nothing evicted), and a second admission of
// the prompt matches through its window's units alone: it borrows those,
// holds none behind its window, and reads its window's tokens' bytes. A
// prompt that shares only the first half of it (a document under another
// question) hits at the end of that half, through the units behind the
// first prompt's window: what dropping them lost. Events stay the index
// throughout.
func TestWindowPrefixHit(t *testing.T) {
	const n, window, chunk = 4000, 300, 512
	for _, layout := range []Layout{TokenMajor, PerLayer, Contiguous} {
		t.Run(layout.String(), func(t *testing.T) {
			e := hostEnv(t, 64*units.MiB)
			x := newEventIndex()
			cfg := microConfig(layout, 8192, 2)
			cfg.Window, cfg.Events = window, x.apply
			c := e.cache(t, cfg)
			prompt := seqTokens(n, n, 0)
			a, err := c.Admit(prompt, 0)
			require.NoError(t, err)
			for a.Len() < n {
				end := min(a.Len()+chunk, n)
				step, err := a.Append(prompt[a.Len():end])
				require.NoError(t, err)
				writeStep(t, step, prompt, 0)
				require.NoError(t, a.MarkWritten(end))
				x.check(t, c, "prefill")
			}
			all := slices.Clone(prompt)
			for i := range 8 {
				all = append(all, 50_000+i)
				step, err := a.Append(all[len(all)-1:])
				require.NoError(t, err)
				writeStep(t, step, all, 0)
				require.NoError(t, a.MarkWritten(len(all)))
			}
			x.check(t, c, "decoded")
			require.NoError(t, c.Check())
			st := c.Stats()
			require.Positive(t, st.WindowUnits, "units behind the window were released")
			require.Zero(t, st.Evictions, "and stay cached")
			require.NoError(t, a.Free())

			_, unitTok := c.g.unitTokens(0) // tokens a unit spans
			b, err := c.Admit(prompt, 0)
			require.NoError(t, err)
			m := b.Matched()
			units := c.g.wholeUnits(m)
			first, _ := c.g.unitTokens(c.windowLo(units))
			require.Greater(t, m, n-window-2*unitTok, "the match reaches the prompt's last window")
			require.Less(t, m, n)
			require.Positive(t, b.sl.lo, "the match borrows nothing behind the window of its first token")
			require.Less(t, first, m)
			require.Equal(t, st.Evictions, c.Stats().Evictions, "the admission evicts nothing")
			// finish appends the rest of s's prompt, writes and checks it,
			// and frees s.
			finish := func(s *Seq, prompt []int, what string) {
				step, err := s.Append(prompt[s.Len():])
				require.NoError(t, err)
				require.Equal(t, s.Matched(), step.Pos)
				writeStep(t, step, prompt, 0)
				require.NoError(t, s.MarkWritten(n))
				checkWindowed(t, s, prompt, 0)
				x.check(t, c, what)
				require.NoError(t, c.Check())
				require.NoError(t, s.Free())
			}
			require.Equal(t, m, b.Len())
			finish(b, prompt, "hit")

			// A prompt sharing only the first half.
			half := seqTokens(n, n/2, 900_000)
			h, err := c.Admit(half, 0)
			require.NoError(t, err)
			require.Greater(t, h.Matched(), n/2-2*unitTok, "a hit at the end of the shared half")
			require.LessOrEqual(t, h.Matched(), n/2)
			finish(h, half, "half")
			x.closeChecked(t, c)
		})
	}
}
