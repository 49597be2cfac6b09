package transformer

import (
	"math"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"
)

// tolerance is the largest absolute difference allowed between a logit
// decoded through a KV and the same logit from Forward.
const tolerance = 1e-4

// defaultModel is New(Config{}, 1), built once: drawing its 10.8 million
// weights is the slowest part of several tests under the race detector.
var defaultModel = sync.OnceValues(func() (*Model, error) { return New(Config{}, 1) })

// randomTokens is n token ids below vocab, the same for the same seed.
func randomTokens(seed uint64, n, vocab int) []int {
	r := rand.New(rand.NewPCG(seed, 0x6b76))
	t := make([]int, n)
	for i := range t {
		t[i] = r.IntN(vocab)
	}
	return t
}

// maxAbsDiff is the largest |a[i]-b[i]|; a and b have the same length.
func maxAbsDiff(t *testing.T, a, b []float32) float64 {
	t.Helper()
	require.Len(t, b, len(a))
	var m float64
	for i := range a {
		d := math.Abs(float64(a[i]) - float64(b[i]))
		if math.IsNaN(d) {
			return math.Inf(1)
		}
		m = max(m, d)
	}
	return m
}

// TestStepMatchesForward: decoding token by token through a MemKV gives
// every position's logits within tolerance of Forward's, for several
// shapes (multi-head, grouped-query, multi-query) and sequences up to 300
// tokens (100 under the race detector). One Forward over the whole
// sequence serves every prefix, since attention is causal
// (TestForwardIsCausal).
func TestStepMatchesForward(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cfg     Config
		lengths []int
	}{
		{"default", Config{}, []int{1, 12}},
		{"narrow", Config{Layers: 4, Heads: 4, HeadDim: 16, Vocab: 256}, []int{1, 17, 300}},
		{"gqa", Config{Layers: 3, Heads: 8, KVHeads: 2, HeadDim: 8, Vocab: 97, Hidden: 96}, []int{5, 300}},
		{"mqa", Config{Layers: 2, Heads: 4, KVHeads: 1, HeadDim: 12, Vocab: 50}, []int{300}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := New(tc.cfg, 1)
			if tc.cfg == (Config{}) {
				m, err = defaultModel()
			}
			require.NoError(t, err)
			for si, n := range tc.lengths {
				if raceEnabled {
					n = min(n, 100)
				}
				tokens := randomTokens(uint64(100+si), n, m.Config().Vocab)
				want, err := m.Forward(tokens)
				require.NoError(t, err)
				require.Len(t, want, n)
				kv, err := NewMemKV(tc.cfg)
				require.NoError(t, err)
				var worst float64
				for pos, tok := range tokens {
					got, err := m.Step(kv, pos, tok)
					require.NoError(t, err)
					d := maxAbsDiff(t, want[pos], got)
					require.LessOrEqual(t, d, tolerance, "length %d, position %d", n, pos)
					worst = max(worst, d)
				}
				require.Equal(t, n, kv.Len())
				t.Logf("length %d: largest |Step - Forward| %.3g", n, worst)
			}
		})
	}
}

// TestStepIsExact: Forward and Step share every kernel and every
// summation order (the masked scores add exact zeros), so through a store
// that gives back exactly what it was given, Step's logits equal Forward's
// bit for bit — a comparison a cache storing float32 can demand, catching
// an error in a single element of a key that the tolerance lets pass.
func TestStepIsExact(t *testing.T) {
	cfg := Config{Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 16, Vocab: 64}
	m, err := New(cfg, 8)
	require.NoError(t, err)
	tokens := randomTokens(4, 64, cfg.Vocab)
	want, err := m.Forward(tokens)
	require.NoError(t, err)
	kv, err := NewMemKV(cfg)
	require.NoError(t, err)
	got, err := m.Prefill(kv, tokens, 0)
	require.NoError(t, err)
	require.Equal(t, want, got)

	// One key element off by 1e-3 is seen by the exact comparison.
	spoilt := &corruptKV{MemKV: kv, spoil: func(layer, pos int, k, _ []float32) {
		if layer == 1 && pos == 10 {
			k[5] += 1e-3
		}
	}}
	last, err := m.Step(spoilt, 63, tokens[63])
	require.NoError(t, err)
	require.NotEqual(t, want[63], last)
}

// TestPrefillMatchesForward: a prompt prefilled in pieces, then decoded,
// gives Forward's logits at every position.
func TestPrefillMatchesForward(t *testing.T) {
	cfg := Config{Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 16, Vocab: 64}
	m, err := New(cfg, 3)
	require.NoError(t, err)
	tokens := randomTokens(7, 40, cfg.Vocab)
	want, err := m.Forward(tokens)
	require.NoError(t, err)

	kv, err := NewMemKV(cfg)
	require.NoError(t, err)
	var got [][]float32
	for _, cut := range [][2]int{{0, 13}, {13, 13}, {13, 30}, {30, 40}} {
		l, err := m.Prefill(kv, tokens[cut[0]:cut[1]], cut[0])
		require.NoError(t, err)
		require.Len(t, l, cut[1]-cut[0])
		got = append(got, l...)
	}
	require.Len(t, got, len(tokens))
	for pos := range tokens {
		require.LessOrEqual(t, maxAbsDiff(t, want[pos], got[pos]), tolerance, "position %d", pos)
	}
}

// TestForwardIsCausal: the logits of a position depend on the tokens up
// to it and on none after it, and Forward of a prefix is the prefix of
// Forward.
func TestForwardIsCausal(t *testing.T) {
	cfg := Config{Layers: 2, Heads: 2, HeadDim: 16, Vocab: 32}
	m, err := New(cfg, 5)
	require.NoError(t, err)
	tokens := randomTokens(9, 20, cfg.Vocab)
	all, err := m.Forward(tokens)
	require.NoError(t, err)

	prefix, err := m.Forward(tokens[:12])
	require.NoError(t, err)
	require.Equal(t, all[:12], prefix)

	changed := append([]int(nil), tokens...)
	changed[12] = (changed[12] + 1) % cfg.Vocab
	other, err := m.Forward(changed)
	require.NoError(t, err)
	require.Equal(t, all[:12], other[:12], "positions before the change")
	for pos := 12; pos < len(tokens); pos++ {
		require.Greater(t, maxAbsDiff(t, all[pos], other[pos]), 1e-3, "position %d sees the change", pos)
	}
}

// TestPositionMatters: the logits at a position depend on the order of
// the tokens before it (attention alone sums over its context without
// regard to order; the rotary embeddings are what tell positions apart),
// and logits are finite and of order one.
func TestPositionMatters(t *testing.T) {
	m, err := New(Config{Layers: 2, Heads: 2, HeadDim: 8, Vocab: 16}, 11)
	require.NoError(t, err)
	a, err := m.Forward([]int{3, 5, 7, 9})
	require.NoError(t, err)
	b, err := m.Forward([]int{5, 3, 7, 9})
	require.NoError(t, err)
	require.Greater(t, maxAbsDiff(t, a[3], b[3]), 1e-3)
	for _, row := range append(a, b...) {
		for _, x := range row {
			require.False(t, math.IsNaN(float64(x)) || math.IsInf(float64(x), 0))
			require.Less(t, math.Abs(float64(x)), 10.0)
		}
	}
}

// corruptKV passes calls to a MemKV and spoils what one Load returns.
type corruptKV struct {
	*MemKV
	spoil func(layer, pos int, k, v []float32)
}

func (c *corruptKV) Load(layer, pos int, k, v []float32) error {
	if err := c.MemKV.Load(layer, pos, k, v); err != nil {
		return err
	}
	c.spoil(layer, pos, k, v)
	return nil
}

// TestCorruptionIsSeen: the comparison with Forward within tolerance
// catches a store that gets one thing wrong — a position read for another,
// keys of two positions swapped, a layer read from another (all by more
// than 0.1), one key element off by 1 or one value element off by 0.05
// (by 5 to 10 times the tolerance). Smaller errors in a single element can
// pass within tolerance (a key element off by 0.05 moves the logits by
// some 1e-5); TestStepIsExact is the comparison that sees those. (Swapping two positions' keys and
// values together is the one mix-up no step can see, and it is harmless:
// keys are stored rotated for their own position, and attention sums over
// the (key, value) pairs in any order; TestSwappedPairsAreInvisible.)
func TestCorruptionIsSeen(t *testing.T) {
	cfg := Config{}
	m, err := defaultModel()
	require.NoError(t, err)
	tokens := randomTokens(2, 12, m.Config().Vocab)
	want, err := m.Forward(tokens)
	require.NoError(t, err)
	last := len(tokens) - 1
	mem, err := NewMemKV(cfg)
	require.NoError(t, err)
	_, err = m.Prefill(mem, tokens[:last], 0)
	require.NoError(t, err)
	for _, c := range []struct {
		name  string
		spoil func(s *MemKV, layer, pos int, k, v []float32)
	}{
		{"position 3 read for position 4", func(s *MemKV, layer, pos int, k, v []float32) {
			if pos == 4 {
				require.NoError(t, s.Load(layer, 3, k, v))
			}
		}},
		{"keys of positions 3 and 4 swapped", func(s *MemKV, layer, pos int, k, _ []float32) {
			if pos == 3 || pos == 4 {
				require.NoError(t, s.Load(layer, 7-pos, k, make([]float32, len(k))))
			}
		}},
		{"layer 2 read from layer 1", func(s *MemKV, layer, pos int, k, v []float32) {
			if layer == 2 {
				require.NoError(t, s.Load(1, pos, k, v))
			}
		}},
		{"one key of layer 3 off by 1", func(_ *MemKV, layer, pos int, k, _ []float32) {
			if layer == 3 && pos == 5 {
				k[100]++
			}
		}},
		{"one value of layer 0 off by 0.05", func(_ *MemKV, layer, pos int, _, v []float32) {
			if layer == 0 && pos == 5 {
				v[300] += 0.05
			}
		}},
		{"the current token's value zeroed", func(_ *MemKV, layer, pos int, _, v []float32) {
			if pos == last && layer == 1 {
				clear(v)
			}
		}},
	} {
		// Each case's step overwrites position last in mem with the same
		// keys and values; positions before it are as the prefill left them.
		kv := &corruptKV{MemKV: mem, spoil: func(layer, pos int, k, v []float32) { c.spoil(mem, layer, pos, k, v) }}
		got, err := m.Step(kv, last, tokens[last])
		require.NoError(t, err)
		d := maxAbsDiff(t, want[last], got)
		t.Logf("%s: largest |Step - Forward| %.3g", c.name, d)
		require.Greater(t, d, 5*tolerance, c.name)
	}
}

// TestDeterministicWeights: the same configuration and seed give the same
// logits bit for bit, from separately built models; another seed gives
// others.
func TestDeterministicWeights(t *testing.T) {
	cfg := Config{Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 16, Vocab: 64}
	tokens := randomTokens(1, 16, cfg.Vocab)
	run := func(seed uint64) [][]float32 {
		m, err := New(cfg, seed)
		require.NoError(t, err)
		l, err := m.Forward(tokens)
		require.NoError(t, err)
		return l
	}
	a, b, c := run(42), run(42), run(43)
	require.Equal(t, a, b)
	require.Greater(t, maxAbsDiff(t, a[len(a)-1], c[len(c)-1]), 1e-3)

	// The generator's stream is fixed by its definition: the first value
	// from seed 0 is splitmix64's published first output.
	r := splitMix{}
	require.Equal(t, uint64(0xe220a8397b1dcdaf), r.next())
}

// TestConfigDefaults: zero fields take the documented defaults; a set
// field keeps its value.
func TestConfigDefaults(t *testing.T) {
	require.Equal(t, Config{Layers: 4, Heads: 8, KVHeads: 8, HeadDim: 64, Vocab: 256, Hidden: 1024}, DefaultConfig())
	m, err := defaultModel()
	require.NoError(t, err)
	require.Equal(t, DefaultConfig(), m.Config())
	require.Equal(t, 512, m.Config().Width())
	require.Equal(t, 512, m.Config().KVWidth())

	m, err = New(Config{Heads: 4, KVHeads: 1, HeadDim: 8}, 0)
	require.NoError(t, err)
	require.Equal(t, Config{Layers: 4, Heads: 4, KVHeads: 1, HeadDim: 8, Vocab: 256, Hidden: 64}, m.Config())
	require.Equal(t, 8, m.Config().KVWidth())
}

// TestBadConfig: every configuration New refuses is refused with
// ErrInvalid and a message naming the field.
func TestBadConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Layers: -1}, "Layers is -1"},
		{Config{Heads: -8}, "Heads is -8"},
		{Config{KVHeads: -1}, "KVHeads is -1"},
		{Config{HeadDim: -64}, "HeadDim is -64"},
		{Config{Vocab: -1}, "Vocab is -1"},
		{Config{Hidden: -1}, "Hidden is -1"},
		{Config{HeadDim: 7}, "HeadDim is 7; it must be even"},
		{Config{Heads: 8, KVHeads: 3}, "8 heads over 3 KV heads"},
		{Config{Heads: 2, KVHeads: 4}, "2 heads over 4 KV heads"},
		{Config{KVHeads: 16}, "8 heads over 16 KV heads"},
		{Config{Layers: maxDim + 1}, "Layers is 1048577; at most 1048576"},
		{Config{Heads: 1 << 12, HeadDim: 1 << 12}, "width Heads*HeadDim is 4096*4096"},
		{Config{Heads: 1 << 10, HeadDim: 1 << 10}, "needs more than"},
		{Config{Layers: 1 << 20}, "needs more than"},
		{Config{Vocab: 1 << 20, Heads: 1 << 10, KVHeads: 1, HeadDim: 2, Hidden: 1}, "needs more than"},
	} {
		m, err := New(tc.cfg, 1)
		require.ErrorIs(t, err, ErrInvalid, "%+v", tc.cfg)
		require.ErrorContains(t, err, tc.want)
		require.Nil(t, m)
		kv, err := NewMemKV(tc.cfg)
		require.ErrorIs(t, err, ErrInvalid, "%+v", tc.cfg)
		require.Nil(t, kv)
	}
}

// TestBadInput: token ids outside the vocabulary, empty sequences,
// negative or too large positions and nil KVs are refused with ErrInvalid,
// before anything is stored.
func TestBadInput(t *testing.T) {
	cfg := Config{Layers: 2, Heads: 2, HeadDim: 8, Vocab: 10}
	m, err := New(cfg, 1)
	require.NoError(t, err)
	kv, err := NewMemKV(cfg)
	require.NoError(t, err)

	for _, tokens := range [][]int{nil, {}, {-1}, {0, 10}, {3, 4, math.MaxInt}, {math.MinInt}} {
		_, err := m.Forward(tokens)
		require.ErrorIs(t, err, ErrInvalid, "Forward(%v)", tokens)
		_, err = m.Prefill(kv, tokens, 0)
		if len(tokens) == 0 {
			require.NoError(t, err, "Prefill of nothing does nothing")
			continue
		}
		require.ErrorIs(t, err, ErrInvalid, "Prefill(%v)", tokens)
	}
	_, err = m.Forward([]int{0, 10})
	require.ErrorContains(t, err, "token 10 (index 1) is outside the vocabulary 0..9")

	var typedNil *MemKV
	for _, c := range []struct {
		kv         KV
		pos, token int
		want       string
	}{
		{kv, 0, -1, "token -1"},
		{kv, 0, 10, "token 10 is outside the vocabulary 0..9"},
		{kv, -1, 0, "position -1"},
		{kv, math.MinInt, 0, "positions start at 0"},
		{kv, math.MaxInt, 0, "last position is"},
		{kv, m.maxPosition() + 1, 0, "last position is"},
		{nil, 0, 0, "nil KV"},
		{typedNil, 0, 0, "nil KV (*transformer.MemKV)"},
	} {
		_, err := m.Step(c.kv, c.pos, c.token)
		require.ErrorIs(t, err, ErrInvalid, "Step(%v, %d, %d)", c.kv, c.pos, c.token)
		require.ErrorContains(t, err, c.want)
	}
	_, err = m.Prefill(kv, []int{1, 2}, m.maxPosition())
	require.ErrorContains(t, err, "last position is")
	require.Zero(t, kv.Len(), "nothing was stored")

	// A step whose predecessors were never stored fails in Load.
	_, err = m.Step(kv, 3, 1)
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, "loading layer 0 position 0")
}

// TestNilArguments: a nil *Model and a nil *MemKV answer ErrInvalid (or a
// zero value from an accessor), never a panic.
func TestNilArguments(t *testing.T) {
	var m *Model
	require.Equal(t, Config{}, m.Config())
	_, err := m.Forward([]int{1})
	require.ErrorIs(t, err, ErrInvalid)
	kv, err := NewMemKV(Config{})
	require.NoError(t, err)
	_, err = m.Step(kv, 0, 1)
	require.ErrorIs(t, err, ErrInvalid)
	_, err = m.Prefill(kv, []int{1}, 0)
	require.ErrorIs(t, err, ErrInvalid)

	var s *MemKV
	k := make([]float32, 512)
	require.ErrorIs(t, s.Store(0, 0, k, k), ErrInvalid)
	require.ErrorIs(t, s.Load(0, 0, k, k), ErrInvalid)
	require.Zero(t, s.Len())
}

// TestSwappedPairsAreInvisible: two positions' keys and values swapped
// together change the logits only by rounding (the attention sum runs in
// another order), which is why the comparison with Forward is not a check
// of where a cache puts a token, only of what it gives back for it.
func TestSwappedPairsAreInvisible(t *testing.T) {
	cfg := Config{Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 16, Vocab: 64}
	m, err := New(cfg, 1)
	require.NoError(t, err)
	tokens := randomTokens(2, 12, cfg.Vocab)
	want, err := m.Forward(tokens)
	require.NoError(t, err)
	mem, err := NewMemKV(cfg)
	require.NoError(t, err)
	_, err = m.Prefill(mem, tokens[:11], 0)
	require.NoError(t, err)
	kv := &corruptKV{MemKV: mem, spoil: func(layer, pos int, k, v []float32) {
		if pos == 3 || pos == 4 {
			require.NoError(t, mem.Load(layer, 7-pos, k, v))
		}
	}}
	got, err := m.Step(kv, 11, tokens[11])
	require.NoError(t, err)
	require.LessOrEqual(t, maxAbsDiff(t, want[11], got), tolerance)
}

// failingKV passes calls to a MemKV until the call numbered failAt (from
// 0, counting Stores and Loads together, or only the kind named by op)
// and fails that one and every later one.
type failingKV struct {
	*MemKV
	op     string // "Store", "Load" or "" for either
	failAt int
	calls  int
	after  int // calls made after the failure
}

var errDevice = errors.New("device lost")

func (f *failingKV) call(op string) error {
	if f.op != "" && f.op != op {
		return nil
	}
	f.calls++
	if f.calls > f.failAt+1 {
		f.after++
	}
	if f.calls > f.failAt {
		return errors.Wrapf(errDevice, "%s number %d", op, f.calls-1)
	}
	return nil
}

func (f *failingKV) Store(layer, pos int, k, v []float32) error {
	if err := f.call("Store"); err != nil {
		return err
	}
	return f.MemKV.Store(layer, pos, k, v)
}

func (f *failingKV) Load(layer, pos int, k, v []float32) error {
	if err := f.call("Load"); err != nil {
		return err
	}
	return f.MemKV.Load(layer, pos, k, v)
}

// TestKVErrorStopsStep: a KV error ends the step at once (no further KV
// call) and comes back wrapped, naming where it happened; a later step
// over a KV that works again is unaffected.
func TestKVErrorStopsStep(t *testing.T) {
	cfg := Config{Layers: 3, Heads: 2, HeadDim: 8, Vocab: 16}
	m, err := New(cfg, 1)
	require.NoError(t, err)
	tokens := []int{1, 2, 3}
	want, err := m.Forward(tokens)
	require.NoError(t, err)

	for _, c := range []struct {
		op     string
		failAt int
		msg    string
	}{
		{"Store", 0, "step at position 2: storing layer 0: Store number 0: device lost"},
		{"Store", 2, "step at position 2: storing layer 2"},
		{"Load", 0, "step at position 2: loading layer 0 position 0"},
		{"Load", 4, "step at position 2: loading layer 1 position 1"},
		{"", 3, "step at position 2: loading layer 0 position 2"},
	} {
		mem, err := NewMemKV(cfg)
		require.NoError(t, err)
		_, err = m.Prefill(mem, tokens[:2], 0)
		require.NoError(t, err)
		f := &failingKV{MemKV: mem, op: c.op, failAt: c.failAt}
		logits, err := m.Step(f, 2, tokens[2])
		require.ErrorIs(t, err, errDevice, "%+v", c)
		require.NotErrorIs(t, err, ErrInvalid)
		require.ErrorContains(t, err, c.msg)
		require.Nil(t, logits)
		require.Zero(t, f.after, "no KV call after the failing one")

		// The same step again, through the store itself, completes.
		logits, err = m.Step(mem, 2, tokens[2])
		require.NoError(t, err)
		require.LessOrEqual(t, maxAbsDiff(t, want[2], logits), tolerance)
	}

	// Prefill stops at the failing position.
	mem, err := NewMemKV(cfg)
	require.NoError(t, err)
	f := &failingKV{MemKV: mem, op: "Store", failAt: 4}
	_, err = m.Prefill(f, tokens, 0)
	require.ErrorIs(t, err, errDevice)
	require.ErrorContains(t, err, "step at position 1: storing layer 1")
	require.Equal(t, 1, mem.Len())
}

// TestMemKV: what is stored is loaded back, copied both ways; bad layers,
// positions and lengths are refused.
func TestMemKV(t *testing.T) {
	cfg := Config{Layers: 2, Heads: 2, KVHeads: 1, HeadDim: 4}
	s, err := NewMemKV(cfg)
	require.NoError(t, err)
	k, v := []float32{1, 2, 3, 4}, []float32{5, 6, 7, 8}
	require.NoError(t, s.Store(1, 2, k, v))
	require.Zero(t, s.Len(), "positions 0 and 1 are missing")
	k[0] = 100 // the store kept a copy
	gk, gv := make([]float32, 4), make([]float32, 4)
	require.NoError(t, s.Load(1, 2, gk, gv))
	require.Equal(t, []float32{1, 2, 3, 4}, gk)
	require.Equal(t, []float32{5, 6, 7, 8}, gv)
	gk[1] = 200
	require.NoError(t, s.Load(1, 2, gk, gv))
	require.Equal(t, float32(2), gk[1], "Load copied out")

	for l := range 2 {
		for p := range 3 {
			require.NoError(t, s.Store(l, p, k, v))
		}
	}
	require.Equal(t, 3, s.Len())

	for _, err := range []error{
		s.Load(0, 3, gk, gv),
		s.Load(-1, 0, gk, gv),
		s.Store(2, 0, k, v),
		s.Store(0, -1, k, v),
		s.Store(0, math.MaxInt, k, v),
		s.Store(0, 0, k[:3], v),
		s.Load(0, 0, gk, make([]float32, 5)),
	} {
		require.ErrorIs(t, err, ErrInvalid)
	}
	require.Equal(t, 3, s.Len())
}

func TestGreedy(t *testing.T) {
	require.Equal(t, 0, Greedy(nil))
	require.Equal(t, 2, Greedy([]float32{-1, 0.5, 3, 3, -7}), "the first of equals")
	require.Equal(t, 0, Greedy([]float32{-2, -3}))
}
