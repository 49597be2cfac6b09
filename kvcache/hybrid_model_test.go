package kvcache

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/race"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/tensor"
)

// The hybrid model-based test: operations decoded from bytes (admit and
// prefill in unit chunks, decode appends, fork, preempt by swap or drop,
// resume, free, budget changes) run against a Hybrid on the host driver
// and against a plain model — each sequence's tokens and whether it runs
// — compared after every step: every running sequence's length, every
// group's K and V rows of every token (as writeStep wrote them for its
// tokens, the group's index the extra key so that groups differ), and
// its recurrent state's bytes (stateByte of its tokens). A refused
// operation must change nothing the model sees, nor the books Stats
// reads. `go test -fuzz FuzzHybridModel` explores the decoder.

// hybridBases are the prompts' sources: the first two share their first
// 160 tokens, the third shares nothing.
var hybridBases = func() [3][]int {
	var b [3][]int
	for i := range b {
		b[i] = make([]int, 480)
		for p := range b[i] {
			b[i][p] = 10 + p
			if p >= 160 || i == 2 {
				b[i][p] = 1000*(i+1) + p
			}
		}
	}
	return b
}()

// stateByte is byte j of recurrent layer l's state after tokens whose
// last prefix hash is pre (0: no token, a zero state).
func stateByte(pre uint64, l, j int) byte {
	if pre == 0 {
		return 0
	}
	x := pre ^ uint64(l*7_919+j)*0x9e3779b97f4a7c15
	return byte(x ^ x>>29)
}

func lastPrefix(tokens []int) uint64 {
	if len(tokens) == 0 {
		return 0
	}
	p := prefixes(tokens, 0)
	return p[len(p)-1]
}

// hmSeq is the model of one sequence.
type hmSeq struct {
	s       *HybridSeq
	tokens  []int
	prompt  []int
	running bool
}

type hybridModel struct {
	t     testing.TB
	h     *Hybrid
	seqs  []*hmSeq
	bytes bool
	// counts of what ran, for the test's coverage checks.
	admits, refused, forks, drops, swaps, resumes, frees, hits, givebacks, warms int
}

// writeState writes s's recurrent state as that of tokens.
func (m *hybridModel) writeState(s *HybridSeq, tokens []int) {
	pre := lastPrefix(tokens)
	for l := range len(m.h.rec.layerOff) {
		ten, err := s.State(l)
		require.NoError(m.t, err)
		data, err := tensor.Data[uint8](ten)
		require.NoError(m.t, err)
		for j := range data {
			data[j] = stateByte(pre, l, j)
		}
	}
}

// checkState compares s's recurrent state with that of tokens.
func (m *hybridModel) checkState(s *HybridSeq, tokens []int) {
	pre := lastPrefix(tokens)
	for l := range len(m.h.rec.layerOff) {
		ten, err := s.State(l)
		require.NoError(m.t, err)
		data, err := tensor.Data[uint8](ten)
		require.NoError(m.t, err)
		for j, b := range data {
			if want := stateByte(pre, l, j); b != want {
				require.Equal(m.t, want, b, "recurrent layer %d byte %d after %d tokens", l, j, len(tokens))
			}
		}
	}
}

// write writes the rows a step made room for in every group and the
// state after the sequence's tokens, then marks them written.
func (m *hybridModel) write(q *hmSeq, step HybridStep) {
	if !m.bytes {
		require.NoError(m.t, q.s.MarkWritten(len(q.tokens)))
		return
	}
	for i, gs := range step.Groups {
		if q.s.Group(i) == nil || gs.N == 0 {
			continue
		}
		writeStep(m.t, gs, q.tokens, uint64(i))
	}
	if m.h.rec != nil {
		m.writeState(q.s, q.tokens)
	}
	require.NoError(m.t, q.s.MarkWritten(len(q.tokens)))
}

// compare checks every sequence against the model and the books.
func (m *hybridModel) compare() {
	require.NoError(m.t, m.h.Check())
	st := m.h.Stats()
	require.LessOrEqual(m.t, st.Committed, st.Budget)
	require.Equal(m.t, len(m.seqs), st.Sequences)
	for _, q := range m.seqs {
		require.Equal(m.t, len(q.tokens), q.s.Len())
		if !q.running || !m.bytes {
			continue
		}
		for i := range m.h.groups {
			if gs := q.s.Group(i); gs != nil {
				checkWindowed(m.t, gs, q.tokens, uint64(i))
			}
		}
		if m.h.rec != nil {
			m.checkState(q.s, q.tokens)
		}
	}
}

// refuse checks a refused call's error and that nothing changed.
func (m *hybridModel) refuse(err error, before HybridStats, sentinels ...error) {
	m.t.Helper()
	ok := false
	for _, s := range sentinels {
		ok = ok || errors.Is(err, s)
	}
	require.True(m.t, ok, "refused with %v", err)
	after := m.h.Stats()
	require.Equal(m.t, before.Committed, after.Committed, "a refusal commits nothing")
	require.Equal(m.t, before.Sequences, after.Sequences)
	require.Equal(m.t, before.Running, after.Running)
	m.refused++
}

// prefill appends q's prompt past what it holds in unit chunks, writing
// and marking each; it stops at the first refusal (the sequence keeps
// what it has).
func (m *hybridModel) prefill(q *hmSeq, first HybridStep) {
	b := m.h.cfg.BlockTokens
	n := q.s.Len()
	q.tokens = q.prompt[:n]
	if first.N > 0 {
		m.write(q, first)
	}
	for n < len(q.prompt) {
		end := min((n/b+1)*b, len(q.prompt))
		before := m.h.Stats()
		step, err := q.s.Append(q.prompt[n:end])
		if err != nil {
			m.refuse(err, before, driver.ErrOutOfMemory)
			return
		}
		q.tokens = q.prompt[:end]
		m.write(q, step)
		n = end
	}
}

func (m *hybridModel) pick(b byte, running bool) *hmSeq {
	var c []*hmSeq
	for _, q := range m.seqs {
		if q.running == running {
			c = append(c, q)
		}
	}
	if len(c) == 0 {
		return nil
	}
	return c[int(b)%len(c)]
}

func (m *hybridModel) remove(q *hmSeq) {
	for i, x := range m.seqs {
		if x == q {
			m.seqs = append(m.seqs[:i], m.seqs[i+1:]...)
			return
		}
	}
}

// step runs one operation decoded from op and arg.
func (m *hybridModel) step(op, a, b byte) {
	t := m.t
	switch op % 8 {
	case 0: // admit and prefill
		base := hybridBases[int(a)%3]
		prompt := base[:1+int(b)%len(base)]
		can, err := m.h.CanAdmit(prompt, 0)
		require.NoError(t, err)
		before := m.h.Stats()
		s, err := m.h.Admit(prompt)
		if err != nil {
			m.refuse(err, before, driver.ErrOutOfMemory, driver.ErrBusy)
			return
		}
		m.admits++
		q := &hmSeq{s: s, prompt: prompt, running: true}
		m.seqs = append(m.seqs, q)
		if s.Matched() > 0 {
			m.hits++
		}
		if m.bytes && m.h.rec != nil {
			m.checkState(s, prompt[:s.Matched()])
		}
		m.prefill(q, HybridStep{})
		if can {
			require.Equal(t, len(prompt), len(q.tokens), "CanAdmit agreed: the prompt's Appends fit")
		}
	case 1: // decode
		q := m.pick(a, true)
		if q == nil || len(q.tokens) < len(q.prompt) || len(q.tokens)+3 > m.h.cfg.MaxContext {
			return
		}
		tokens := []int{int(b), int(a), int(b) + 1}[:1+int(b)%3]
		before := m.h.Stats()
		step, err := q.s.Append(tokens)
		if err != nil {
			m.refuse(err, before, driver.ErrOutOfMemory)
			return
		}
		q.tokens = append(q.tokens[:len(q.tokens):len(q.tokens)], tokens...)
		m.write(q, step)
	case 2: // fork
		q := m.pick(a, true)
		if q == nil || len(q.tokens) < len(q.prompt) {
			return
		}
		before := m.h.Stats()
		c, err := q.s.Fork()
		if err != nil {
			m.refuse(err, before, driver.ErrOutOfMemory, driver.ErrBusy, driver.ErrUnsupported)
			return
		}
		m.forks++
		m.seqs = append(m.seqs, &hmSeq{s: c, tokens: q.tokens[:len(q.tokens):len(q.tokens)], prompt: q.prompt, running: true})
	case 3, 4: // preempt
		q := m.pick(a, true)
		if q == nil {
			return
		}
		mode := Swap
		if op%8 == 4 {
			mode = Drop
		}
		before := m.h.Stats()
		if err := q.s.Preempt(mode); err != nil {
			// A window group's sequence with units released swaps no more.
			m.refuse(err, before, driver.ErrUnsupported)
			return
		}
		q.running = false
		if mode == Drop {
			m.drops++
		} else {
			m.swaps++
		}
	case 5: // resume
		q := m.pick(a, false)
		if q == nil {
			return
		}
		before := m.h.Stats()
		step, err := q.s.Resume()
		if err != nil {
			m.refuse(err, before, driver.ErrOutOfMemory)
			return
		}
		m.resumes++
		q.running = true
		require.Equal(t, len(q.tokens)-step.Pos, step.N)
		if m.bytes && m.h.rec != nil {
			m.checkState(q.s, q.tokens[:step.Pos])
		}
		if step.N > 0 {
			m.write(q, step)
		}
	case 6: // free
		q := m.pick(a, b%2 == 0)
		if q == nil {
			return
		}
		require.NoError(t, q.s.Free())
		m.remove(q)
		m.frees++
	case 7: // budget
		if b%8 >= 6 { // warm the pools ahead, or ask for too many tokens
			before := m.h.Stats()
			if b%8 == 7 {
				_, err := m.h.Warm(m.h.cfg.MaxContext + 1 + int(a))
				m.refuse(err, before, driver.ErrInvalid)
				return
			}
			// At most a pages more when a is odd (WarmAtMost), or the
			// free budget's, at most a pages, when a is 2 mod 4
			// (WarmBudget), else no bound (Warm).
			var pooled uint64
			var err error
			most := -1
			switch {
			case a%2 == 1:
				most = int(a)
				pooled, err = m.h.WarmAtMost(int(a)*2, most)
			case a%4 == 2:
				most = int(a)
				pooled, err = m.h.WarmBudget(most)
			default:
				pooled, err = m.h.Warm(int(a) * 2)
			}
			require.NoError(t, err)
			after := m.h.Stats()
			if most >= 0 {
				var had, have int
				for i := range after.Groups {
					had += before.Groups[i].PooledPages
					have += after.Groups[i].PooledPages
				}
				require.LessOrEqual(t, have, had+most, "WarmAtMost(%d, %d) or WarmBudget(%d)", int(a)*2, most, most)
			}
			require.LessOrEqual(t, after.Committed, after.Budget)
			require.Equal(t, before.Budget, after.Budget)
			require.Equal(t, before.Running, after.Running, "no sequence preempted")
			var inPools uint64
			for _, g := range after.Groups {
				inPools += uint64(g.PooledPages) * m.h.cfg.PageSize
			}
			require.Equal(t, inPools, pooled)
			m.warms++
			return
		}
		if b%4 >= 2 { // give back what is spare, as a member of a shared budget
			before, spare := m.h.Stats(), m.h.Spare()
			if b%4 == 3 {
				_, err := m.h.GiveBack(0)
				m.refuse(err, before, driver.ErrInvalid)
				require.Equal(t, before.Budget, m.h.Stats().Budget)
				return
			}
			page := m.h.cfg.PageSize
			want := uint64(a) * 64 * units.KiB
			got, err := m.h.GiveBack(max(want, 1))
			require.NoError(t, err)
			require.Equal(t, min((max(want, 1)+page-1)/page*page, spare), got, "what Spare counted, up to the ask")
			after := m.h.Stats()
			require.Equal(t, before.Budget-got, after.Budget)
			require.Equal(t, before.Running, after.Running, "no sequence preempted")
			require.Equal(t, before.Preemptions, after.Preemptions)
			require.LessOrEqual(t, after.Committed, after.Budget)
			if got == spare {
				require.Zero(t, m.h.Spare(), "all that was spare went")
			}
			m.givebacks++
			return
		}
		budgets := []uint64{6 * units.MiB, 10 * units.MiB, 24 * units.MiB}
		preempted, err := m.h.SetBudget(budgets[int(a)%3], [2]PreemptMode{Swap, Drop}[b%2])
		require.NoError(t, err)
		for _, s := range preempted {
			for _, q := range m.seqs {
				if q.s == s {
					q.running = false
				}
			}
		}
	}
}

// runHybridModel runs the operations data decodes to (three bytes each)
// on a host-driver Hybrid of tinyHybrid's groups.
func runHybridModel(t testing.TB, data []byte) *hybridModel {
	return runHybridModelChunk(t, data, 0)
}

// runHybridModelChunk is runHybridModel with HybridConfig.PrefillChunk
// chunk: the model prefills a block at a time, so a chunk of a block
// holds CanAdmit's promise that the prompt's Appends fit.
func runHybridModelChunk(t testing.TB, data []byte, chunk int) *hybridModel {
	e := hostEnv(t, 64*units.MiB)
	cfg := tinyHybrid(480, 4, 24*units.MiB)
	cfg.Groups[1].Window = 128
	if cfg.PrefillChunk = chunk; chunk > 0 {
		// The window group eight times the others: its plan binds.
		cfg.Groups[1].Layers *= 8
	}
	h := e.hybrid(t, cfg)
	m := &hybridModel{t: t, h: h, bytes: true}
	for i := 0; i+2 < len(data) && i < 3*200; i += 3 {
		m.step(data[i], data[i+1], data[i+2])
		m.compare()
	}
	for _, q := range m.seqs {
		require.NoError(t, q.s.Free())
	}
	require.NoError(t, h.Check())
	require.NoError(t, h.Close())
	require.Zero(t, e.used(t), "nothing committed after Close")
	return m
}

func randomHybridInput(r *rand.Rand, n int) []byte {
	out := make([]byte, 3*n)
	for i := range out {
		out[i] = byte(r.UintN(256))
	}
	return out
}

// TestHybridModel runs random operation sequences against the model and
// checks every kind of operation ran, and refusals too.
func TestHybridModel(t *testing.T) { testHybridModel(t, 0) }

// TestHybridModelChunked is TestHybridModel with a prefill chunk of a
// block (HybridConfig.PrefillChunk): the window group's admissions are
// planned for its window and a chunk, and every prefill CanAdmit agreed
// to fits.
func TestHybridModelChunked(t *testing.T) { testHybridModel(t, 16) }

func testHybridModel(t *testing.T, chunk int) {
	if race.Enabled && chunk > 0 {
		t.Skip("TestHybridModel's model with a larger window group; run without -race")
	}
	seeds := uint64(6)
	if race.Enabled {
		seeds = 2 // one goroutine's model, ten times slower under the detector; scripts/test runs the six without it
	}
	var total hybridModel
	for seed := range seeds {
		m := runHybridModelChunk(t, randomHybridInput(rand.New(rand.NewPCG(seed, 31)), 120), chunk)
		total.admits += m.admits
		total.refused += m.refused
		total.forks += m.forks
		total.drops += m.drops
		total.swaps += m.swaps
		total.resumes += m.resumes
		total.frees += m.frees
		total.hits += m.hits
		total.givebacks += m.givebacks
		total.warms += m.warms
	}
	t.Logf("admits %d, refused %d, forks %d, drops %d, swaps %d, resumes %d, frees %d, prefix hits %d, give-backs %d, warms %d",
		total.admits, total.refused, total.forks, total.drops, total.swaps, total.resumes, total.frees, total.hits, total.givebacks, total.warms)
	if seeds < 6 {
		return
	}
	require.Positive(t, total.admits)
	require.Positive(t, total.givebacks)
	require.Positive(t, total.warms)
	require.Positive(t, total.forks)
	require.Positive(t, total.drops)
	require.Positive(t, total.swaps)
	require.Positive(t, total.resumes)
	require.Positive(t, total.hits, "prompts served from the stores and checkpoints")
	require.Positive(t, total.refused, "refusals that changed nothing")
}

// FuzzHybridModel fuzzes the hybrid operation decoder.
func FuzzHybridModel(f *testing.F) {
	for seed := uint64(0); seed < 4; seed++ {
		f.Add(randomHybridInput(rand.New(rand.NewPCG(seed, 37)), 40))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		_ = runHybridModel(t, data)
		_ = runHybridModelChunk(t, data, 16)
	})
}

// checkWindowed is checkSeq of every position s still holds: from its
// WindowStart (0 but in a sliding-window group), where its K and V start.
func checkWindowed(t testing.TB, s *Seq, tokens []int, extra uint64) {
	t.Helper()
	ws, w := s.WindowStart(), s.c.cfg.Window
	if w == 0 || ws == 0 {
		checkSeq(t, s, tokens, extra, 0, len(tokens))
		return
	}
	require.LessOrEqual(t, ws, len(tokens)+1-w, "a window holds at least its last Window tokens")
	pre := prefixes(tokens, extra)
	cfg := s.c.cfg
	for l := 0; l < cfg.Layers; l++ {
		for kv, get := range []func(int) (*tensor.Tensor, error){s.K, s.V} {
			ten, err := get(l)
			require.NoError(t, err)
			sh := ten.Shape()
			for p := ws; p < len(tokens); p++ {
				var row *tensor.Tensor
				if len(sh) == 3 {
					require.Equal(t, len(tokens)-ws, sh[0], "K and V start at WindowStart")
					row, err = ten.Narrow(0, p-ws, 1)
				} else {
					// TokenMajor: groups from the one WindowStart starts.
					row, err = ten.Narrow(0, p/sh[1]-ws/sh[1], 1)
					require.NoError(t, err)
					row, err = row.Narrow(1, p%sh[1], 1)
				}
				require.NoError(t, err)
				data, err := tensor.Data[float32](row)
				require.NoError(t, err)
				for h := 0; h < cfg.KVHeads; h++ {
					for d := 0; d < cfg.HeadDim; d++ {
						if got, want := data[h*cfg.HeadDim+d], value(pre[p], l, kv, h, d); got != want {
							require.Equal(t, want, got, "layer %d %s position %d head %d dim %d", l, [2]string{"K", "V"}[kv], p, h, d)
						}
					}
				}
			}
		}
	}
}
