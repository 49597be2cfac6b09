package kvcache

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/tensor"
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
	dropped bool
}

// windowRun counts what a window model run did.
type windowRun struct {
	appends, steps, releases, frees, preempts, resumes, forks, ooms, hits int
}

// runWindowModel runs the ops of data on a window cache of layout
// (Window from the config byte) and a plain model (each sequence's
// tokens), comparing after every op: the bytes of every running
// sequence's tokens from WindowStart to Len (at least its last Window
// tokens), the first unit it holds (exactly the units wholly behind the
// window of its last Append's first token are released), that it holds
// nothing else below its tokens' end, Stats against the model and Check.
func runWindowModel(t *testing.T, data []byte, layout Layout) (r windowRun) {
	cfgByte, ops := decode(data)
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
	c := e.cache(t, cfg)
	g := c.g
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
			toks := more(s, min(n, cfg.MaxContext-len(s.tokens)))
			pos := len(s.tokens)
			st, err := s.real.Append(toks)
			if errors.Is(err, driver.ErrOutOfMemory) {
				r.ooms++
				s.lastPos = max(s.lastPos, pos) // the release stays done
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
					s.lastPos = max(s.lastPos, len(s.tokens))
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
			before := c.Stats()
			err := s.real.Preempt(Swap)
			if s.real.sl.lo > 0 {
				requireIs(t, err, driver.ErrUnsupported, step)
				require.Equal(t, before.Preemptions, c.Stats().Preemptions, step)
				require.NoError(t, s.real.Preempt(Drop), step)
				s.dropped = true
			} else {
				require.NoError(t, err, step)
				s.dropped = true
			}
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
			s.dropped, s.lastPos = false, -1
			r.resumes++
		case opFork:
			s := pick(o, true)
			if s == nil {
				continue
			}
			before := snapBooks(t, c, e)
			f, err := s.real.Fork()
			switch {
			case s.real.sl.lo > 0:
				require.Error(t, err, step)
				if len(s.tokens) >= len(s.real.prompt) {
					requireIs(t, err, driver.ErrUnsupported, step)
				}
				require.Equal(t, before, snapBooks(t, c, e), step)
			case errors.Is(err, driver.ErrBusy) || errors.Is(err, driver.ErrOutOfMemory) || errors.Is(err, driver.ErrUnsupported) || errors.Is(err, driver.ErrInvalid):
			default:
				require.NoError(t, err, step)
				seqs = append(seqs, &wseq{real: f, tokens: slices.Clone(s.tokens), extra: s.extra, lastPos: -1})
				r.forks++
			}
		case opVerify, opSetBudget:
		}
		// Compare.
		released := 0
		for _, s := range running() {
			n := len(s.tokens)
			require.Equal(t, n, s.real.Len(), step)
			lo := 0
			if s.lastPos >= 0 {
				lo = g.unitsBehind(s.lastPos + 1 - cfg.Window)
			}
			sl := s.real.sl
			require.Equal(t, lo, sl.lo, "%s: the units released behind the window of the sequence in slot %d (%d tokens, last append at %d)", step, sl.idx, n, s.lastPos)
			released += lo
			held := 0
			for u := 0; u < g.unitsFor(n); u++ {
				held += b2i(sl.units[u].state != unitEmpty)
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
// every layout against the model.
func TestWindowModel(t *testing.T) {
	var total windowRun
	for _, layout := range []Layout{PerLayer, TokenMajor, Contiguous} {
		for seed := uint64(0); seed < 12; seed++ {
			t.Run(fmt.Sprint(layout, "/", seed), func(t *testing.T) {
				r := runWindowModel(t, randomInput(rand.New(rand.NewPCG(seed, 31)), 120), layout)
				total.appends += r.appends
				total.steps += r.steps
				total.releases += r.releases
				total.preempts += r.preempts
				total.resumes += r.resumes
				total.forks += r.forks
				total.ooms += r.ooms
				total.hits += r.hits
			})
		}
	}
	t.Logf("%+v", total)
	require.Greater(t, total.appends, 300)
	require.Greater(t, total.releases, 100, "units are released behind windows")
	require.Positive(t, total.resumes)
	require.Positive(t, total.forks)
	require.Positive(t, total.hits, "prompts of one family share prefixes")
}

// FuzzWindowModel fuzzes the window model's operation sequences.
func FuzzWindowModel(f *testing.F) {
	for seed := uint64(0); seed < 4; seed++ {
		f.Add(randomInput(rand.New(rand.NewPCG(seed, 37)), 40))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		_ = runWindowModel(t, data, PerLayer)
		_ = runWindowModel(t, data, Contiguous)
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
