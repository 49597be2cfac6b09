package serving

import (
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/invariants"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/kvcache"
)

// tenMs prices every step at 10 ms, whatever it computes.
var tenMs = StepModel{Name: "10 ms a step", StepOverhead: 10 * time.Millisecond}

// TestSimulatePreemptionByHand serves two requests that arrive together,
// each a 16-token prompt and 20 output tokens (35 tokens of KV at the
// end, 3 blocks), from 4 blocks of 16 tokens, every step 10 ms:
//
//	step 1      A and B are admitted, each prefills 16 tokens into a block
//	            ([0] and [1]) and produces its first token: TTFT 10 ms
//	step 2      A and B decode their 17th token, taking [2] and [3]
//	steps 3-17  decodes; after step 17 each holds 32 tokens, all cached
//	step 18     A's 33rd token needs a block, none is free: B, admitted
//	            last, is preempted; its blocks go to the free list last
//	            first, [3 1], and A takes [3], evicting B's second block
//	steps 19-20 A decodes alone (B's 33 tokens need 3 blocks, 1 is free);
//	            A produces its 20th token and finishes, freeing [3 2 0]
//	step 21     B resumes: its first block [1] is still cached (16 tokens
//	            found of the 32 looked up), it recomputes the other 17 (its
//	            context is 33) into [3] and [2] (evicting A's second block),
//	            and produces its 18th token
//	steps 22-23 B's 19th and 20th tokens: done at 230 ms
//
// Blocks taken: 4 in steps 1-2, 1 in step 18, 2 in step 21.
func TestSimulatePreemptionByHand(t *testing.T) {
	cfg := Config{Model: tinyModel, Budget: 64 * units.KiB, MaxContext: 64, MaxSeqs: 4}
	reqs := []Request{{Input: 16, Output: 20}, {Input: 16, Output: 20}}
	opts := Options{Config: cfg, MaxBatchedTokens: 1000, Steps: tenMs, CheckEvery: 1}

	tbl, err := NewBlockTable(cfg)
	require.NoError(t, err)
	res, err := Simulate(reqs, tbl, opts)
	require.NoError(t, err)
	require.Equal(t, "paged (vLLM)", res.Scheme)
	require.Equal(t, 2, res.Finished)
	require.Equal(t, 1, res.Preemptions)
	require.Equal(t, 23, res.Steps)
	require.Equal(t, 230*time.Millisecond, res.SimTime)
	require.Equal(t, 2, res.PeakSeqs)
	require.InDelta(t, 40.0/23, res.MeanSeqs, 1e-9, "2 running in steps 1-17, 1 in 18-23")
	require.Equal(t, 10*time.Millisecond, res.MeanTTFT)
	require.Equal(t, int64(40), res.OutputTokens)
	require.Equal(t, int64(35+16+16+17+2), res.ComputedTokens, "A's 35; B's 16, 16 decoded, 17 recomputed, 2 decoded")
	require.Equal(t, 64*units.KiB, res.PeakInUse)
	require.Equal(t, Stats{Cached: 3 * 16 * units.KiB, Commits: 7, PrefixQueried: 32, PrefixHit: 16, Evictions: 2}, res.Stats,
		"at the end, B's two full blocks [1 3] and A's first [0] are cached; [2] held B's last 3 tokens")

	// Static: one reservation of 64 tokens. B waits for A (200 ms), then
	// prefills and decodes alone; the reservation's waste is 64 less the
	// tokens held, 48 down to 29 over each request's 20 steps.
	st, err := NewStaticReservation(cfg)
	require.NoError(t, err)
	require.Equal(t, 1, st.Slots())
	res, err = Simulate(reqs, st, opts)
	require.NoError(t, err)
	require.Equal(t, 2, res.Finished)
	require.Zero(t, res.Preemptions)
	require.Equal(t, 40, res.Steps)
	require.Equal(t, 400*time.Millisecond, res.SimTime)
	require.Equal(t, 1, res.PeakSeqs)
	require.InDelta(t, 1.0, res.MeanSeqs, 1e-9)
	require.Equal(t, 110*time.Millisecond, res.MeanTTFT, "(10 + 210) / 2")
	require.Equal(t, 210*time.Millisecond, res.MedianTTFT)
	require.Equal(t, 210*time.Millisecond, res.P99TTFT)
	require.Equal(t, int64(70), res.ComputedTokens)
	require.Equal(t, int64(2), res.Stats.Commits)
	require.InDelta(t, 64*units.KiB, res.MeanInUse, 1e-6)
	require.InDelta(t, 2*770.0/40*1024, res.MeanWaste, 1e-6, "(48 + ... + 29) KiB twice, over 40 steps")
	require.Equal(t, 48*units.KiB, res.PeakWaste)
}

// TestSimulateArrivals: time skips to each arrival; a request longer than
// the max context, or with an empty prompt, is refused when it arrives;
// a request with no output finishes after its prompt.
func TestSimulateArrivals(t *testing.T) {
	cfg := Config{Model: tinyModel, Budget: 64 * units.KiB, MaxContext: 64, MaxSeqs: 4}
	reqs := []Request{
		{Arrival: 0, Input: 10, Output: 2},           // steps at 0 and 10 ms
		{Arrival: time.Second, Input: 60, Output: 5}, // refused: 65 > 64
		{Arrival: time.Second, Input: 0, Output: 5},  // refused: no prompt
		{Arrival: 2 * time.Second, Input: 50, Output: 0},
	}
	var progress []Progress
	for _, mk := range []func(Config) (Scheme, error){
		func(c Config) (Scheme, error) { return NewBlockTable(c) },
		func(c Config) (Scheme, error) { return NewStaticReservation(c) },
	} {
		sc, err := mk(cfg)
		require.NoError(t, err)
		progress = progress[:0]
		res, err := Simulate(reqs, sc, Options{Config: cfg, Steps: tenMs, CheckEvery: 1,
			Progress: func(p Progress) { progress = append(progress, p) }})
		require.NoError(t, err)
		require.Equal(t, 2, res.Finished, sc.Name())
		require.Equal(t, 2, res.Refused, sc.Name())
		require.Equal(t, 3, res.Steps, sc.Name())
		require.Equal(t, 2*time.Second+10*time.Millisecond, res.SimTime, sc.Name())
		require.Equal(t, 10*time.Millisecond, res.MeanTTFT, "only the first request produced a token")
		require.Equal(t, int64(2), res.OutputTokens)
		require.InDelta(t, 0.03/2.01, res.MeanSeqs, 1e-9, "one sequence in each of three steps")
		require.Equal(t, []Progress{{Scheme: sc.Name(), Done: 4, Total: 4, Now: res.SimTime, Steps: 3}}, progress)
	}
}

// overeager is a paged scheme whose CanAdmit says yes to everything, or,
// with never set, no to everything.
type overeager struct {
	*BlockTable
	never bool
}

func (o overeager) CanAdmit(*SimRequest) bool { return !o.never }

// TestSimulateSchemeDisagrees: when a scheme admits a request its Append
// then cannot hold, the request goes back to the queue, counted as a
// preemption, and runs later; a scheme that admits nothing with nothing
// running ends the simulation with an error. In 4 blocks, A (48 tokens, 3
// blocks) is admitted; B's 32 tokens do not fit (step 1), nor after A's
// 49th token takes the last block (step 2); A finishes, and B runs in
// step 3.
func TestSimulateSchemeDisagrees(t *testing.T) {
	cfg := Config{Model: tinyModel, Budget: 64 * units.KiB, MaxContext: 64, MaxSeqs: 4}
	reqs := []Request{{Input: 48, Output: 2}, {Input: 32, Output: 1}}
	tbl, err := NewBlockTable(cfg)
	require.NoError(t, err)
	res, err := Simulate(reqs, overeager{BlockTable: tbl}, Options{Config: cfg, Steps: tenMs, CheckEvery: 1})
	require.NoError(t, err)
	require.Equal(t, 2, res.Finished)
	require.Equal(t, 2, res.Preemptions)
	require.Equal(t, 3, res.Steps)
	require.Equal(t, int64(48+1+32), res.ComputedTokens)

	tbl, err = NewBlockTable(cfg)
	require.NoError(t, err)
	_, err = Simulate(reqs, overeager{BlockTable: tbl, never: true}, Options{Config: cfg, Steps: tenMs})
	require.ErrorIs(t, err, driver.ErrOutOfMemory)
	require.ErrorContains(t, err, "serving: simulate paged (vLLM) at 0s (step 0): serving: paged (vLLM) will not admit request 0 (48 tokens of context) with nothing running: it can never run")
}

// TestSimulateTraceSlices serves the first 200 requests of each real trace
// (80 in builds with the invariants tag) with llama3-8b in 16 GiB,
// checking each scheme's books every few steps, and what holds whatever
// the figures: every request finishes; the paged scheme wastes less than a
// block per sequence; a static reservation is the max context; with no
// preemption each token is computed once, less the prefixes found; the
// Mooncake slice shares prefixes; and a second run gives the same figures.
func TestSimulateTraceSlices(t *testing.T) {
	l3, err := ModelPreset("llama3-8b")
	require.NoError(t, err)
	tb := l3.TokenBytes()
	for _, name := range []string{"AzureLLMInferenceTrace_conv.csv", "AzureLLMInferenceTrace_code.csv", "mooncake_synthetic_trace.jsonl"} {
		t.Run(name, func(t *testing.T) {
			reqs, err := ParseRequestsFile(filepath.Join("testdata", "requests", name))
			require.NoError(t, err)
			if invariants.Enabled {
				// Every change checks all 8192 blocks: 200 requests take a
				// minute.
				reqs = reqs[:80]
			}
			cfg := Config{Model: l3, Budget: 16 * units.GiB, MaxSeqs: 256}
			cfg.MaxContext = FitMaxContext(reqs, cfg)
			sum := SummarizeRequests(reqs)
			require.Equal(t, (sum.LongestContext+15)/16*16, cfg.MaxContext)
			opts := Options{Config: cfg, CheckEvery: 97}

			tbl, err := NewBlockTable(cfg)
			require.NoError(t, err)
			paged, err := Simulate(reqs, tbl, opts)
			require.NoError(t, err)
			st, err := NewStaticReservation(cfg)
			require.NoError(t, err)
			static, err := Simulate(reqs, st, opts)
			require.NoError(t, err)

			for _, res := range []Result{paged, static} {
				require.Equal(t, len(reqs), res.Finished, res.Scheme)
				require.Zero(t, res.Refused)
				require.Equal(t, sum.OutputTokens, res.OutputTokens)
				require.Positive(t, res.MeanTTFT)
				require.LessOrEqual(t, res.MedianTTFT, res.P99TTFT)
				require.GreaterOrEqual(t, res.SimTime, sum.Span)
				if res.Preemptions == 0 {
					require.Equal(t, sum.PromptTokens+sum.OutputTokens-int64(len(reqs))-res.Stats.PrefixHit, res.ComputedTokens, res.Scheme)
				}
			}
			require.LessOrEqual(t, paged.PeakWaste, uint64(paged.PeakSeqs)*15*tb)
			require.LessOrEqual(t, paged.PeakInUse, cfg.Budget)
			require.Zero(t, static.Preemptions)
			require.LessOrEqual(t, static.PeakSeqs, st.Slots())
			require.Equal(t, uint64(static.PeakSeqs)*uint64(cfg.MaxContext)*tb, static.PeakInUse)
			require.GreaterOrEqual(t, paged.PeakSeqs, static.PeakSeqs)
			if sum.Blocks > 0 {
				require.Positive(t, paged.Stats.PrefixHit)
				require.Positive(t, paged.PeakSaved)
			} else {
				require.Zero(t, paged.Stats.PrefixHit)
				require.Zero(t, paged.PeakSaved)
			}

			tbl, err = NewBlockTable(cfg)
			require.NoError(t, err)
			again, err := Simulate(reqs, tbl, opts)
			require.NoError(t, err)
			again.WallTime, again.CPUTime = paged.WallTime, paged.CPUTime
			require.Equal(t, paged, again)
		})
	}
}

// TestSimulateBadArguments: a nil or typed-nil scheme, a zero-valued one,
// and options no simulation can run with are driver.ErrInvalid.
func TestSimulateBadArguments(t *testing.T) {
	cfg := Config{Model: tinyModel, Budget: 64 * units.KiB, MaxContext: 64, MaxSeqs: 4}
	reqs := []Request{{Input: 10, Output: 2}}
	tbl, err := NewBlockTable(cfg)
	require.NoError(t, err)
	for _, tc := range []struct {
		scheme Scheme
		opts   Options
		says   string
	}{
		{nil, Options{Config: cfg}, "the scheme is nil"},
		{(*BlockTable)(nil), Options{Config: cfg}, "the scheme is nil"},
		{(*StaticReservation)(nil), Options{Config: cfg}, "the scheme is nil"},
		{&BlockTable{}, Options{Config: cfg}, "the block table was not made by NewBlockTable"},
		{&StaticReservation{}, Options{Config: cfg}, "the scheme was not made by NewStaticReservation"},
		{(*Cache)(nil), Options{Config: cfg}, "the scheme is nil"},
		{&Cache{}, Options{Config: cfg}, "the scheme was not made by NewCache"},
		{tbl, Options{}, `model "": Layers 0`},
		{tbl, Options{Config: cfg, MaxBatchedTokens: -1}, "-1 tokens a step"},
		{tbl, Options{Config: cfg, Steps: StepModel{Name: "back", StepOverhead: -1}}, `step model "back": a negative or NaN price`},
		{tbl, Options{Config: cfg, CheckEvery: -1}, "check every -1 steps"},
	} {
		_, err := Simulate(reqs, tc.scheme, tc.opts)
		require.ErrorIs(t, err, driver.ErrInvalid, tc.says)
		require.ErrorContains(t, err, tc.says)
	}
	require.NoError(t, tbl.Check())
	require.Equal(t, Stats{}, tbl.Stats(), "the refusals left it untouched")
}

// TestNilArguments: every method of a nil or zero-valued scheme is an
// error marked driver.ErrInvalid (or false, or zero; Cache's Close
// too), and so is a nil request to every method of a working one; none
// panics or changes anything.
func TestNilArguments(t *testing.T) {
	r := simReq(0, 10, 1)
	for _, sc := range []Scheme{(*BlockTable)(nil), &BlockTable{}, (*StaticReservation)(nil), &StaticReservation{}, (*Cache)(nil), &Cache{}} {
		require.NotEmpty(t, sc.Name())
		require.False(t, sc.CanAdmit(r))
		_, err := sc.Admit(r)
		require.ErrorIs(t, err, driver.ErrInvalid)
		_, err = sc.Resume(r)
		require.ErrorIs(t, err, driver.ErrInvalid)
		require.ErrorIs(t, sc.Append(r, 1), driver.ErrInvalid)
		require.ErrorIs(t, sc.Finish(r), driver.ErrInvalid)
		_, err = sc.Preempt(r)
		require.ErrorIs(t, err, driver.ErrInvalid)
		require.ErrorIs(t, sc.Check(), driver.ErrInvalid)
		require.Equal(t, Stats{}, sc.Stats())
	}
	tbl, err := NewBlockTable(tinyConfig)
	require.NoError(t, err)
	st, err := NewStaticReservation(tinyConfig)
	require.NoError(t, err)
	k := newKVCache(t, tinyConfig, CacheOptions{PageSize: 16 * units.KiB})
	for _, sc := range []Scheme{tbl, st, k} {
		require.False(t, sc.CanAdmit(nil))
		_, err := sc.Admit(nil)
		require.ErrorIs(t, err, driver.ErrInvalid)
		_, err = sc.Resume(nil)
		require.ErrorIs(t, err, driver.ErrInvalid)
		require.ErrorIs(t, sc.Append(nil, 1), driver.ErrInvalid)
		require.ErrorIs(t, sc.Finish(nil), driver.ErrInvalid)
		_, err = sc.Preempt(nil)
		require.ErrorIs(t, err, driver.ErrInvalid)
		require.NoError(t, sc.Check())
		require.Equal(t, Stats{}, sc.Stats())
	}
	_, err = Simulate(nil, nil, Options{Config: tinyConfig})
	require.ErrorIs(t, err, driver.ErrInvalid)
	for _, k := range []*Cache{nil, {}} {
		require.ErrorIs(t, k.Close(), driver.ErrInvalid)
		require.Equal(t, "kvcache: not made by NewCache", k.String())
	}
}

func TestSummarizeRequests(t *testing.T) {
	reqs := []Request{
		{Arrival: 0, Input: 600, Output: 3, Blocks: []int64{1, 2}},
		{Arrival: time.Second, Input: 1100, Output: 4, Blocks: []int64{1, 2, 3}}, // 1 and 2 again: 1024 tokens
		{Arrival: 3 * time.Second, Input: 520, Output: 5, Blocks: []int64{1, 4}}, // 1 again: 512
	}
	s := SummarizeRequests(reqs)
	require.Equal(t, RequestsSummary{Requests: 3, Span: 3 * time.Second, PromptTokens: 2220, OutputTokens: 12, LongestContext: 1104,
		Blocks: 7, ReusedBlocks: 3, ReusedTokens: 1536, BlockTokens: BlockTokens}, s)
	require.InDelta(t, 1536.0/2220, s.ReusedFraction(), 1e-12)

	// Blocks hashed alone (a Bailian trace's): an id is reused only after
	// the same ids.
	bailian := []Request{
		{Input: 40, Blocks: []int64{7, 8, 9}, BlockTokens: 16},
		{Input: 40, Blocks: []int64{8, 9, 9}, BlockTokens: 16}, // 8 and 9 again, after other ids: none reused
		{Input: 36, Blocks: []int64{7, 8, 5}, BlockTokens: 16}, // 7 and 8 as before: 32 tokens
		{Input: 40, Blocks: []int64{7, 8, 9}, BlockTokens: 16}, // all three, the last of 8 tokens
	}
	s = SummarizeRequests(bailian)
	require.Equal(t, RequestsSummary{Requests: 4, PromptTokens: 156, LongestContext: 40, Blocks: 12, ReusedBlocks: 5, ReusedTokens: 72, BlockTokens: 16}, s)
	// Blocks past the prompt (a caller's requests; no reader makes them)
	// hold none of its tokens.
	s = SummarizeRequests([]Request{{Input: 16, Blocks: []int64{1, 2, 3}, BlockTokens: 16}, {Input: 16, Blocks: []int64{1, 2, 3}, BlockTokens: 16}})
	require.Equal(t, int64(16), s.ReusedTokens)
	require.Equal(t, RequestsSummary{}, SummarizeRequests(nil))
}

// TestSimulateSamples: a request of n samples is n sequences of one
// prompt, each generating its own output. The paged scheme serves them as
// vLLM V1 does, n requests of one prompt: the samples after the first
// find the prompt's whole blocks in its prefix cache and compute its last,
// partial block again. This cache forks the first sample once it has its
// first token: the prompt is computed once, the forks' first tokens come
// with the first's (the same TTFT), and no sample computes a prompt token.
// With too few slots for every fork, the forks refused (ErrBusy) queue
// the samples as requests of their own, which find the prompt's whole
// units in the prefix store; everything finishes and the books agree. An
// n out of range, or samples past MaxSampledSequences, is
// driver.ErrInvalid before the simulation starts, the scheme untouched.
func TestSimulateSamples(t *testing.T) {
	const prompt, block = 40, DefaultBlockTokens
	reqs := []Request{{Input: prompt, Output: 3, N: 4}, {Arrival: time.Second, Input: prompt, Output: 2}}
	for _, ahead := range []bool{false, true} {
		opts := Options{Config: tinyPages, CheckEvery: 1, AdmitAhead: ahead}
		tbl, err := NewBlockTable(tinyPages)
		require.NoError(t, err)
		cacheOpts := CacheOptions{Layout: kvcache.TokenMajor, PageSize: 16 * units.KiB}
		for _, sc := range []Scheme{tbl, newKVCache(t, tinyPages, cacheOpts)} {
			t.Run(fmt.Sprintf("%s/ahead=%t", sc.Name(), ahead), func(t *testing.T) {
				res, err := Simulate(reqs, sc, opts)
				require.NoError(t, err)
				require.Equal(t, 5, res.Requests, "four samples and one request")
				require.Equal(t, 3, res.Samples)
				require.Equal(t, 5, res.Finished)
				require.Equal(t, int64(4*3+2), res.OutputTokens, "each sample its own output")
				decode := int64(4*2 + 1) // the tokens after each sequence's first
				if sc == Scheme(tbl) {
					require.Zero(t, res.Forks)
					require.Equal(t, int64(prompt+3*(prompt%block)+prompt)+decode, res.ComputedTokens,
						"the samples after the first compute the prompt's partial block again")
					require.Equal(t, int64(3*(prompt/block*block)), res.Stats.PrefixHit)
				} else {
					require.Equal(t, 3, res.Forks)
					require.Zero(t, res.FailedForks)
					require.Equal(t, int64(2*prompt)+decode, res.ComputedTokens, "the prompt computed once")
					require.Equal(t, res.MedianTTFT, res.P99TTFT, "the forks' first tokens are the first's, the other request's as soon")
				}
				require.NoError(t, sc.Check())
			})
		}
	}
	t.Run("slots for one fork", func(t *testing.T) {
		cfg := tinyPages
		cfg.MaxSeqs = 2
		k := newKVCache(t, cfg, CacheOptions{Layout: kvcache.TokenMajor, PageSize: 16 * units.KiB})
		res, err := Simulate(reqs, k, Options{Config: cfg, CheckEvery: 1})
		require.NoError(t, err)
		require.Equal(t, 1, res.Forks)
		require.Equal(t, 2, res.FailedForks, "no free slot: ErrBusy")
		require.Equal(t, 5, res.Finished)
		require.Equal(t, int64(4*3+2), res.OutputTokens)
		require.Positive(t, res.Stats.PrefixHit, "the queued samples find the prompt in the prefix store")
		require.NoError(t, k.Check())
	})
	tbl, err := NewBlockTable(tinyPages)
	require.NoError(t, err)
	for _, tc := range []struct {
		reqs []Request
		says string
	}{
		{[]Request{{Input: 10, Output: 2, N: 1}, {Input: 10, Output: 2, N: -1}}, "request 1 has n -1, want 0 to 256"},
		{[]Request{{Input: 10, Output: 2}, {Input: 10, Output: 2, Blocks: []int64{1}, BlockTokens: -16}}, "request 1 has blocks of -16 tokens, want 0 to 16777216"},
		{[]Request{{Input: 10, Output: 2, Blocks: []int64{1}, BlockTokens: MaxTokens + 1}}, "request 0 has blocks of 16777217 tokens, want 0 to 16777216"},
		{[]Request{{Input: 10, Output: 2, N: 1}, {Input: 10, Output: 2, N: MaxN + 1}}, "request 1 has n 257, want 0 to 256"},
		{slices.Repeat([]Request{{Input: 10, Output: 2, N: MaxN}}, MaxSampledSequences/(MaxN-1)+1),
			fmt.Sprintf("request %d takes the samples beyond one a request past %d", MaxSampledSequences/(MaxN-1), MaxSampledSequences)},
	} {
		before := tbl.Stats()
		_, err := Simulate(tc.reqs, tbl, Options{Config: tinyPages})
		require.ErrorIs(t, err, driver.ErrInvalid, tc.says)
		require.ErrorContains(t, err, tc.says)
		require.NoError(t, tbl.Check())
		require.Equal(t, before, tbl.Stats(), "the refusal left it untouched")
	}
}

// sampledTrace is 24 requests of 0 to 8 samples (n), prompts of 1 to
// maxInput tokens, outputs of 1 to 12, up to 400 ms apart; with shared,
// half of them name one of 3 prompt blocks (a shared prompt).
func sampledTrace(rng *rand.Rand, maxInput int, shared bool) []Request {
	var reqs []Request
	var at time.Duration
	for range 24 {
		at += time.Duration(rng.IntN(400)) * time.Millisecond
		r := Request{Arrival: at, Input: 1 + rng.IntN(maxInput), Output: 1 + rng.IntN(12), N: rng.IntN(9)}
		if shared && rng.IntN(2) == 0 {
			r.Blocks = []int64{int64(rng.IntN(3))}
		}
		reqs = append(reqs, r)
	}
	return reqs
}

// TestSimulateSamplesRandom: seeded traces of requests of 1 to 8 samples,
// prompts sharing blocks or not, in a budget tight enough to preempt
// forks and parents alike; this cache (drop and swap preemption, a step
// ahead or not) and the paged scheme, their books checked after every
// step. Every sequence finishes or is refused, each with its own output;
// on the cache every sample is forked or queued, once. The hybrid cache
// and the hybrid paged scheme run the same way on a window model.
func TestSimulateSamplesRandom(t *testing.T) {
	cfg := tinyPages
	cfg.Budget = 128 * units.KiB // two sequences of the max context
	var forks, failed, preempted, forkPreempted int
	for seed := range uint64(6) {
		reqs := sampledTrace(rand.New(rand.NewPCG(seed, 11)), 60, true)
		want, seqsWant := int64(0), 0
		for _, r := range reqs {
			seqsWant += r.Sequences()
			if r.Input+r.Output <= cfg.MaxContext {
				want += int64(r.Sequences() * r.Output)
			}
		}
		for _, mode := range []kvcache.PreemptMode{kvcache.Drop, kvcache.Swap} {
			for _, ahead := range []bool{false, true} {
				tbl, err := NewBlockTable(cfg)
				require.NoError(t, err)
				k := newKVCache(t, cfg, CacheOptions{Layout: kvcache.TokenMajor, PageSize: 16 * units.KiB, Preempt: mode})
				for _, sc := range []Scheme{k, tbl} {
					res, err := Simulate(reqs, sc, Options{Config: cfg, CheckEvery: 1, AdmitAhead: ahead})
					require.NoError(t, err, "seed %d, %s, %v, ahead %t", seed, sc.Name(), mode, ahead)
					require.Equal(t, seqsWant, res.Requests)
					require.Equal(t, res.Requests, res.Finished+res.Refused)
					require.Equal(t, want, res.OutputTokens, "each sequence its own output")
					require.LessOrEqual(t, res.PeakSeqs, cfg.MaxSeqs, "forks run no more than MaxSeqs")
					if sc == Scheme(k) {
						refusedSamples := 0
						for _, r := range reqs {
							if r.Input+r.Output > cfg.MaxContext {
								refusedSamples += r.Sequences() - 1
							}
						}
						require.Equal(t, res.Samples-refusedSamples, res.Forks+res.FailedForks, "seed %d: every sample forked or queued", seed)
						forks, failed, forkPreempted = forks+res.Forks, failed+res.FailedForks, forkPreempted+res.Preemptions
					}
					preempted += res.Preemptions
					require.NoError(t, sc.Check())
				}
			}
		}
	}
	// The hybrid cache and the hybrid paged scheme on a window model, as
	// tight.
	hcfg := Config{Model: windowModel, Budget: 320 * units.KiB, MaxContext: cfg.MaxContext, MaxSeqs: cfg.MaxSeqs}
	var hforks, hpreempted int
	for seed := range uint64(6) {
		reqs := sampledTrace(rand.New(rand.NewPCG(seed, 12)), 50, false)
		hc, err := NewHybridCache(hcfg, HybridCacheOptions{PageSize: 16 * units.KiB})
		require.NoError(t, err)
		hp, err := NewHybridBlockTable(hcfg)
		require.NoError(t, err)
		for _, sc := range []Scheme{hc, hp} {
			res, err := Simulate(reqs, sc, Options{Config: hcfg, CheckEvery: 1})
			require.NoError(t, err, "seed %d, %s", seed, sc.Name())
			require.Equal(t, res.Requests, res.Finished+res.Refused)
			require.LessOrEqual(t, res.PeakSeqs, hcfg.MaxSeqs)
			require.NoError(t, sc.Check())
			if sc == Scheme(hc) {
				hforks, hpreempted = hforks+res.Forks, hpreempted+res.Preemptions
			}
		}
		require.NoError(t, hc.Close())
	}
	t.Logf("forks %d, refused forks %d, preemptions %d (%d on the cache); hybrid cache: forks %d, preemptions %d",
		forks, failed, preempted, forkPreempted, hforks, hpreempted)
	require.Positive(t, hforks)
	require.Positive(t, hpreempted, "the budget preempts the hybrid cache too")
	require.Positive(t, forks)
	require.Positive(t, failed, "some forks find no slot or no room")
	require.Positive(t, forkPreempted, "the budget preempts")
}

// TestForkRefusals: the caches' Fork refuses (ErrInvalid) a child that is
// not another sample of the parent's prompt, one admitted already, and a
// parent whose appended tokens are not all computed; each refusal leaves
// the scheme's books as they were.
func TestForkRefusals(t *testing.T) {
	hcfg := Config{Model: windowModel, Budget: 4 * units.MiB, MaxContext: 64, MaxSeqs: 4}
	hc, err := NewHybridCache(hcfg, HybridCacheOptions{PageSize: 16 * units.KiB})
	require.NoError(t, err)
	t.Cleanup(func() { _ = hc.Close() })
	for _, sc := range []interface {
		Scheme
		forker
	}{newKVCache(t, tinyPages, CacheOptions{Layout: kvcache.TokenMajor, PageSize: 16 * units.KiB}), hc} {
		t.Run(sc.Name(), func(t *testing.T) {
			parent, child, other := simReq(0, 20, 4), simReq(1, 20, 4), simReq(2, 20, 4)
			child.prompt = 0
			_, err := sc.Admit(parent)
			require.NoError(t, err)
			require.NoError(t, sc.Append(parent, 20))
			before := sc.Stats()
			err = sc.Fork(parent, child)
			require.ErrorIs(t, err, driver.ErrInvalid, "not computed yet")
			require.ErrorContains(t, err, "20 tokens appended, 0 computed")
			parent.computed = 20
			require.ErrorIs(t, sc.Fork(parent, other), driver.ErrInvalid, "another prompt")
			require.ErrorIs(t, sc.Fork(parent, parent), driver.ErrInvalid, "itself")
			require.Equal(t, before, sc.Stats())
			if w, ok := sc.(kvWriter); ok {
				require.NoError(t, w.Computed(parent))
			}
			require.NoError(t, sc.Fork(parent, child))
			err = sc.Fork(parent, child)
			require.ErrorIs(t, err, driver.ErrInvalid)
			require.ErrorContains(t, err, "admitted already")
			require.NoError(t, sc.Check())
			require.NoError(t, sc.Finish(child))
			require.NoError(t, sc.Finish(parent))
			require.NoError(t, sc.Check())
		})
	}
}

// TestSimulateRefusesCallersRequests: a caller's request list is held to
// what the trace readers return: a prompt or output out of 0 to
// MaxTokens, an arrival out of 0 to MaxArrival or before the request
// ahead of it, each refused (driver.ErrInvalid, naming the request)
// before a step runs, the scheme untouched. A negative output was served
// forever.
func TestSimulateRefusesCallersRequests(t *testing.T) {
	good := []Request{{Arrival: 0, Input: 40, Output: 4}, {Arrival: time.Millisecond, Input: 30, Output: 2}}
	cfg := Config{Model: tinyPages.Model, Budget: tinyPages.Budget, MaxContext: 128, MaxSeqs: 4}
	for _, c := range []struct {
		name   string
		change func(r []Request)
		says   string
	}{
		{"negative output", func(r []Request) { r[1].Output = math.MinInt64 }, "request 1: an output of -9223372036854775808 tokens"},
		{"output over MaxTokens", func(r []Request) { r[0].Output = MaxTokens + 1 }, "request 0: an output of"},
		{"negative prompt", func(r []Request) { r[0].Input = -1 }, "request 0: a prompt of -1 tokens"},
		{"prompt over MaxTokens", func(r []Request) { r[1].Input = math.MaxInt }, "request 1: a prompt of"},
		{"negative arrival", func(r []Request) { r[0].Arrival = -time.Second }, "request 0: arrives at -1s"},
		{"arrival past MaxArrival", func(r []Request) { r[1].Arrival = MaxArrival + 1 }, "request 1: arrives at"},
		{"out of order", func(r []Request) { r[0].Arrival = time.Second }, "request 1: arrives at 1ms, before request 0's 1s"},
	} {
		t.Run(c.name, func(t *testing.T) {
			reqs := slices.Clone(good)
			c.change(reqs)
			tbl, err := NewBlockTable(cfg)
			require.NoError(t, err)
			before := tbl.Stats()
			_, err = Simulate(reqs, tbl, Options{Config: cfg})
			require.ErrorIs(t, err, driver.ErrInvalid)
			require.ErrorContains(t, err, c.says)
			require.Equal(t, before, tbl.Stats())
		})
	}
	tbl, err := NewBlockTable(cfg)
	require.NoError(t, err)
	res, err := Simulate(good, tbl, Options{Config: cfg})
	require.NoError(t, err)
	require.Equal(t, 2, res.Finished)
}
