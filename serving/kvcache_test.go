package serving

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/internal/invariants"
	"github.com/vmarena/vmarena/internal/race"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/kvcache"
)

// newKVCache makes the scheme and closes it when the test ends.
func newKVCache(t *testing.T, cfg Config, opts CacheOptions) *Cache {
	t.Helper()
	k, err := NewCache(cfg, opts)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, k.Close()) })
	return k
}

// TestSimulateBailianTrace serves a Bailian trace read from its file: the
// turns of each chat repeat the earlier turns' blocks, so both this cache
// and the paged scheme find prefixes, and the paged scheme, whose blocks
// are a Bailian block's 16 tokens, finds no more than the trace's whole
// reused blocks hold.
func TestSimulateBailianTrace(t *testing.T) {
	l3, err := ModelPreset("llama3-8b")
	require.NoError(t, err)
	var b strings.Builder
	rng := rand.New(rand.NewPCG(7, 7))
	next := int64(1)
	chats := map[int][]int64{} // each chat's blocks so far
	for i := range 60 {
		chat, turn := i%12, i/12+1
		blocks := chats[chat]
		for range 3 + rng.IntN(20) {
			blocks = append(blocks, next)
			next++
		}
		chats[chat] = blocks
		input := 16*len(blocks) - rng.IntN(16)
		parent := -1
		if turn > 1 {
			parent = chat
		}
		fmt.Fprintf(&b, `{"chat_id": %d, "parent_chat_id": %d, "timestamp": %.3f, "input_length": %d, "output_length": %d, "type": "text", "turn": %d, "hash_ids": [%s]}`+"\n",
			i, parent, float64(i)*0.25, input, 8+rng.IntN(64), turn, joinIDs(blocks))
	}
	name := filepath.Join(t.TempDir(), "qwen_traceA_blksz_16.jsonl")
	require.NoError(t, os.WriteFile(name, []byte(b.String()), 0o600))
	reqs, err := ParseRequestsFile(name)
	require.NoError(t, err)
	require.Len(t, reqs, 60)
	sum := SummarizeRequests(reqs)
	require.Equal(t, 16, sum.BlockTokens)
	require.Positive(t, sum.ReusedTokens)

	cfg := Config{Model: l3, Budget: 16 * units.GiB, MaxSeqs: 32}
	cfg.MaxContext = FitMaxContext(reqs, cfg)
	opts := Options{Config: cfg, CheckEvery: 7}
	paged, err := NewBlockTable(cfg)
	require.NoError(t, err)
	pres, err := Simulate(reqs, paged, opts)
	require.NoError(t, err)
	cres, err := Simulate(reqs, newKVCache(t, cfg, CacheOptions{Layout: kvcache.TokenMajor}), opts) // kv simulate's layout for llama3-8b
	require.NoError(t, err)
	for _, res := range []Result{pres, cres} {
		require.Equal(t, len(reqs), res.Finished, res.Scheme)
		require.Equal(t, sum.OutputTokens, res.OutputTokens, res.Scheme)
		require.Positive(t, res.Stats.PrefixHit, res.Scheme)
	}
	require.LessOrEqual(t, pres.Stats.PrefixHit, sum.ReusedTokens)
	t.Logf("prefix tokens found: paged %d, this cache %d, of %d in reused blocks", pres.Stats.PrefixHit, cres.Stats.PrefixHit, sum.ReusedTokens)
}

// TestKVCacheTraceSlices serves the first 200 requests of each real trace
// (Mooncake's first 100; 30, and Mooncake's 8, in 32 slots under the
// invariants tag or the race detector) with llama3-8b in 16 GiB, as
// TestSimulateTraceSlices serves them with the baselines, in both
// layouts, checking the cache's books every few steps. Whatever the
// figures: every request finishes; token-major pages hold 16 tokens, a
// paged block's worth, so its waste is below a block per sequence, and
// per-layer's below a page per region per sequence; the cache never
// holds more than the budget; with no preemption each token is computed
// once, less the prefixes found; the Mooncake slice shares prefixes; at
// least as many sequences run at once as with static reservation; and a
// second run gives the same figures.
func TestKVCacheTraceSlices(t *testing.T) {
	l3, err := ModelPreset("llama3-8b")
	require.NoError(t, err)
	tb := l3.TokenBytes()
	// Every change checks every slot under the invariants tag, and the
	// race detector slows the arena's books twentyfold: a few requests
	// and slots then.
	short := invariants.Enabled || race.Enabled
	for _, name := range []string{"AzureLLMInferenceTrace_conv.csv", "AzureLLMInferenceTrace_code.csv", "mooncake_synthetic_trace.jsonl"} {
		reqs, err := ParseRequestsFile(filepath.Join("testdata", "requests", name))
		require.NoError(t, err)
		cfg := Config{Model: l3, Budget: 16 * units.GiB, MaxSeqs: 256}
		mooncake := len(reqs[0].Blocks) > 0
		switch {
		case short && mooncake:
			reqs, cfg.MaxSeqs = reqs[:8], 32
		case short:
			reqs, cfg.MaxSeqs = reqs[:30], 32
		case mooncake:
			// Mooncake's long prompts make 200 requests take seconds; its
			// first 62 hold its two runs of shared blocks.
			reqs = reqs[:100]
		}
		cfg.MaxContext = FitMaxContext(reqs, cfg)
		sum := SummarizeRequests(reqs)
		opts := Options{Config: cfg, CheckEvery: 97}
		st, err := NewStaticReservation(cfg)
		require.NoError(t, err)
		static, err := Simulate(reqs, st, opts)
		require.NoError(t, err)
		for _, layout := range []kvcache.Layout{kvcache.TokenMajor, kvcache.PerLayer, kvcache.Contiguous} {
			t.Run(name+"/"+layout.String(), func(t *testing.T) {
				k := newKVCache(t, cfg, CacheOptions{Layout: layout})
				res, err := Simulate(reqs, k, opts)
				require.NoError(t, err)
				require.Equal(t, "this cache ("+layout.String()+")", res.Scheme)
				require.Equal(t, len(reqs), res.Finished)
				require.Zero(t, res.Refused)
				require.Equal(t, sum.OutputTokens, res.OutputTokens)
				require.Positive(t, res.MeanTTFT)
				if res.Preemptions == 0 {
					require.Equal(t, sum.PromptTokens+sum.OutputTokens-int64(len(reqs))-res.Stats.PrefixHit, res.ComputedTokens)
				}
				tail := 15 * tb // a page of 16 tokens but one
				if layout == kvcache.PerLayer {
					tail = 2 * uint64(l3.Layers) * 2 * units.MiB
				}
				require.LessOrEqual(t, res.PeakWaste, uint64(res.PeakSeqs)*tail)
				require.LessOrEqual(t, res.PeakInUse+res.PeakCached, 2*cfg.Budget)
				require.LessOrEqual(t, res.Stats.InUse+res.Stats.Cached, cfg.Budget)
				require.Zero(t, res.Stats.InUse, "nothing runs at the end")
				require.GreaterOrEqual(t, res.PeakSeqs, static.PeakSeqs)
				switch {
				case sum.Blocks > 0 && !short:
					require.Positive(t, res.Stats.PrefixHit)
				case res.Preemptions == 0:
					require.Zero(t, res.Stats.PrefixHit, "no two requests share content")
				}
				t.Logf("%d preemptions, %d of %d tokens found, %s saved at the peak", res.Preemptions, res.Stats.PrefixHit, res.Stats.PrefixQueried, units.Bytes(res.PeakSaved))
				if sum.Blocks == 0 {
					require.Zero(t, res.PeakSaved, "no two requests share content")
				}
				require.LessOrEqual(t, res.Stats.PrefixHit, res.Stats.PrefixQueried)
				if layout != kvcache.TokenMajor {
					return
				}
				again, err := Simulate(reqs, newKVCache(t, cfg, CacheOptions{Layout: layout}), opts)
				require.NoError(t, err)
				again.WallTime, again.CPUTime = res.WallTime, res.CPUTime
				require.Equal(t, res, again)
			})
		}
	}
}

// tinyPages is 16 pages of 16 KiB of tinyModel (1 KiB of KV a token): a
// page holds 16 tokens, one block, in the token-major layout; in the
// per-layer one, a page of each of its 2 regions holds 32 tokens' rows.
var tinyPages = Config{Model: tinyModel, Budget: 256 * units.KiB, MaxContext: 64, MaxSeqs: 4}

// TestKVCacheSharesPrefixByHand drives the scheme by hand: two requests
// whose prompts are the same 40 tokens (Mooncake's hash_id 7). A's whole
// prompt pages go to the prefix store; B, admitted before A has written
// them (the step's end, Computed, publishes them), finds nothing; admitted after,
// it maps the same physical pages — 32 tokens, two pages in the
// token-major layout, one unit of 32 tokens in the per-layer one — and
// computes only the rest. Shared tokens are stored once.
func TestKVCacheSharesPrefixByHand(t *testing.T) {
	for _, layout := range []kvcache.Layout{kvcache.TokenMajor, kvcache.PerLayer, kvcache.Contiguous} {
		t.Run(layout.String(), func(t *testing.T) {
			k := newKVCache(t, tinyPages, CacheOptions{Layout: layout, PageSize: 16 * units.KiB})
			a, b, early := simReq(0, 40, 10, 7), simReq(1, 40, 10, 7), simReq(2, 40, 10, 7)
			require.True(t, k.CanAdmit(a))
			held, err := k.Admit(a)
			require.NoError(t, err)
			require.Zero(t, held)
			require.NoError(t, k.Append(a, 40))
			a.computed, a.context = 40, 41

			held, err = k.Admit(early)
			require.NoError(t, err)
			require.Zero(t, held, "a's pages are not written until its step ends")
			_, err = k.Preempt(early)
			require.NoError(t, err)

			require.NoError(t, k.Computed(a)) // the step's end: a's prompt is written
			require.NoError(t, k.Append(a, 1))
			require.True(t, k.CanAdmit(b))
			held, err = k.Admit(b)
			require.NoError(t, err)
			require.Equal(t, 32, held, "two whole blocks; the last token is always computed")
			require.NoError(t, k.Append(b, 8))
			require.NoError(t, k.Check())

			st := k.cache.Stats()
			require.Equal(t, 2, st.SharedPages, "a's first two pages (token-major) or its first unit's page in each region (per-layer)")
			require.Equal(t, 2*16*units.KiB, st.SavedBytes)
			ks := k.Stats()
			require.Equal(t, uint64(41+8)*units.KiB, ks.Stored, "a's 41 tokens, and b's 8 it computed")
			require.Equal(t, uint64(41+40)*units.KiB, ks.Logical)
			require.Equal(t, 32*units.KiB, ks.Saved())
			pages := uint64(4) // a: two shared, one own; b: one own
			if layout == kvcache.PerLayer {
				pages = 6 // a: its shared unit's two pages, its own unit's two; b: its own unit's two
			}
			require.Equal(t, pages*16*units.KiB, ks.InUse)
			require.Equal(t, int64(3*32), ks.PrefixQueried, "a's, early's and b's two whole blocks")
			require.Equal(t, int64(32), ks.PrefixHit)
			// Token-major: a commits its two prompt pages in the store, side
			// by side (one call), and a page of its own; b a page of its
			// own.
			// Per-layer: a commits its prompt's unit in the store (one
			// call), and a unit of its own (a call per region); b too.
			commits := map[kvcache.Layout]int64{kvcache.TokenMajor: 1 + 1 + 1, kvcache.Contiguous: 1 + 1 + 1, kvcache.PerLayer: 1 + 2 + 2}[layout] // contiguous: 16 whole tokens a page, as token-major
			require.Equal(t, commits, ks.Commits)
		})
	}
}

// TestKVCacheSharesWhatAStepSchedules serves two requests that arrive
// together with the same 40-token prompt (hash_id 7) from tinyPages, one
// step admitting both. The first's prompt is scheduled into the step
// before the second is admitted, so the second shares its two whole
// pages (32 tokens) at once, as the paged scheme shares the blocks
// Append registers: each request's keys and values of a layer are
// written before that layer's attention reads any. Both schemes compute
// the same tokens, 40 + 8 for the prompts and one decode each, with or
// without mapping ahead.
func TestKVCacheSharesWhatAStepSchedules(t *testing.T) {
	reqs := []Request{{Input: 40, Output: 2, Blocks: []int64{7}}, {Input: 40, Output: 2, Blocks: []int64{7}}}
	for _, ahead := range []bool{false, true} {
		t.Run(fmt.Sprintf("ahead=%v", ahead), func(t *testing.T) {
			opts := Options{Config: tinyPages, MaxBatchedTokens: 1000, Steps: tenMs, CheckEvery: 1, AdmitAhead: ahead}
			bt, err := NewBlockTable(tinyPages)
			require.NoError(t, err)
			paged, err := Simulate(reqs, bt, opts)
			require.NoError(t, err)
			for _, layout := range []kvcache.Layout{kvcache.TokenMajor, kvcache.PerLayer, kvcache.Contiguous} {
				k := newKVCache(t, tinyPages, CacheOptions{Layout: layout, PageSize: 16 * units.KiB})
				res, err := Simulate(reqs, k, opts)
				require.NoError(t, err)
				require.Equal(t, 2, res.Finished, layout)
				require.Equal(t, int64(40+8+2), paged.ComputedTokens)
				require.Equal(t, paged.ComputedTokens, res.ComputedTokens, "%s: the second prompt shares what the first's step computes", layout)
				require.Equal(t, int64(32), res.Stats.PrefixHit, layout)
				require.Equal(t, paged.MeanTTFT, res.MeanTTFT, layout)
			}
		})
	}
}

// TestKVCachePreemptionByHand serves TestSimulatePreemptionByHand's two
// requests (16-token prompts, 20 output tokens each, arriving together)
// from 4 token-major pages of 16 tokens, every step 10 ms:
//
//	step 1      A and B are admitted (no request has finished: the expected
//	            output is 0), each prefills its prompt, one whole page, in
//	            the prefix store, and produces its first token
//	step 2      each takes a page of its own for its 17th token (A's and B's
//	            prompt pages are published)
//	steps 3-17  decodes; after step 17 each holds 32 tokens
//	step 18     A's 33rd token needs a page: no page is idle, cached or
//	            surplus, so B, admitted last, is preempted: its own page is
//	            decommitted, its prompt page stays cached; A commits the page
//	            freed
//	steps 19-20 A decodes; B's Resume is tried each step and refused (its
//	            prompt page is found, but no page is free for the rest), and
//	            counts nothing; A finishes, its slot keeping its two pages
//	step 21     B resumes in its slot: its prompt page borrowed again (16
//	            tokens held, 16 found of 16 looked up), a page of A's idle slot
//	            reclaimed for the rest; it recomputes positions 16 to 31 into
//	            it and computes its 33rd token into a page reclaimed the same
//	            way (with Drop; with Swap it holds its 32 tokens back and
//	            computes only the 33rd)
//	steps 22-23 B's 19th and 20th tokens: done at 230 ms
//
// Pages committed: 4 in steps 1-2, 1 in step 18, 2 in step 21, as the
// paged scheme takes blocks; nothing is evicted (idle pages go first). At
// the end the two prompt pages are cached and B's slot keeps its two.
func TestKVCachePreemptionByHand(t *testing.T) {
	cfg := Config{Model: tinyModel, Budget: 64 * units.KiB, MaxContext: 64, MaxSeqs: 4}
	reqs := []Request{{Input: 16, Output: 20}, {Input: 16, Output: 20}}
	opts := Options{Config: cfg, MaxBatchedTokens: 1000, Steps: tenMs, CheckEvery: 1}
	for _, mode := range []kvcache.PreemptMode{kvcache.Drop, kvcache.Swap} {
		t.Run(mode.String(), func(t *testing.T) {
			k := newKVCache(t, cfg, CacheOptions{Layout: kvcache.TokenMajor, Preempt: mode, PageSize: 16 * units.KiB})
			res, err := Simulate(reqs, k, opts)
			require.NoError(t, err)
			require.Equal(t, 2, res.Finished)
			require.Equal(t, 1, res.Preemptions)
			require.Equal(t, 23, res.Steps)
			require.Equal(t, 230*time.Millisecond, res.SimTime)
			require.Equal(t, 2, res.PeakSeqs)
			require.Equal(t, 10*time.Millisecond, res.MeanTTFT)
			require.Equal(t, int64(40), res.OutputTokens)
			computed := int64(35 + 16 + 16 + 17 + 2) // A's; B's 16, 16 decoded, 17 recomputed, 2 decoded
			if mode == kvcache.Swap {
				computed = 35 + 16 + 16 + 1 + 2
			}
			require.Equal(t, computed, res.ComputedTokens)
			require.Equal(t, 64*units.KiB, res.PeakInUse)
			require.Equal(t, 2*15*units.KiB, res.PeakWaste, "after step 2, A's and B's last pages hold a token of 16")
			require.Equal(t, Stats{Cached: 4 * 16 * units.KiB, Commits: 7, PrefixQueried: 48, PrefixHit: 16}, res.Stats)
			st := k.cache.Stats()
			require.Equal(t, [4]int{1, 1, 0, 2}, [4]int{st.Preemptions, st.Resumes, st.Evictions, st.IdlePages})
			require.Equal(t, map[kvcache.PreemptMode]int{kvcache.Drop: 1}[mode], st.Drops)
		})
	}
}

// TestKVCacheBadInput: options kvcache refuses, and calls for a request in
// the wrong state, are driver.ErrInvalid and change nothing; a closed
// scheme refuses a second Close with driver.ErrClosed.
func TestKVCacheBadInput(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		opts CacheOptions
		says string
	}{
		{tinyPages, CacheOptions{Preempt: 9}, "preempt mode PreemptMode(9), want drop or swap"},
		{tinyPages, CacheOptions{PageSize: 3000}, "a page of 3000 bytes, want a power of two from 4 KiB to 1 GiB"},
		{tinyPages, CacheOptions{PageSize: 2 * units.GiB}, "a page of 2147483648 bytes, want a power of two from 4 KiB to 1 GiB"},
		{tinyPages, CacheOptions{Layout: 7}, "Layout 7 is none of PerLayer (0), TokenMajor (1), Contiguous (2), AutoLayout (255)"},
		{Config{}, CacheOptions{}, `model "": Layers 0`},
		{Config{Model: Model{Name: "odd", Layers: 1, KVHeads: 1, HeadDim: 1, ElemBytes: 3, QueryHeads: 1}, Budget: units.MiB, MaxContext: 16, MaxSeqs: 1},
			CacheOptions{}, `model "odd" has 3-byte elements, want 1, 2, 4 or 8`},
		{Config{Model: Model{Name: "odd latent", Layers: 1, KVHeads: 1, HeadDim: 577, Latent: true, ElemBytes: 2, QueryHeads: 1}, Budget: units.MiB, MaxContext: 16, MaxSeqs: 1},
			CacheOptions{}, `model "odd latent" has a latent KV of 577 elements, an odd number this cache cannot keep as a key and a value of half each`},
	} {
		_, err := NewCache(tc.cfg, tc.opts)
		require.ErrorIs(t, err, driver.ErrInvalid, tc.says)
		require.ErrorContains(t, err, tc.says)
	}

	k, err := NewCache(tinyPages, CacheOptions{Layout: kvcache.TokenMajor, PageSize: 16 * units.KiB})
	require.NoError(t, err)
	a, b := simReq(0, 20, 5), simReq(1, 20, 5)
	_, err = k.Admit(a)
	require.NoError(t, err)
	require.NoError(t, k.Append(a, 20))
	before := k.Stats()
	for _, tc := range []struct {
		call func() error
		says string
	}{
		{func() error { _, err := k.Admit(a); return err }, "admit request 0: it is admitted already"},
		{func() error { _, err := k.Resume(a); return err }, "resume request 0: it is running"},
		{func() error { return k.Append(a, -1) }, "append -1 tokens to request 0 at 20: want 0 to 0"},
		{func() error { return k.Append(a, 1) }, "append 1 tokens to request 0 at 20: want 0 to 0"},
		{func() error { return k.Append(b, 1) }, "append request 1: it is not admitted"},
		{func() error { _, err := k.Preempt(b); return err }, "preempt request 1: it is not admitted"},
		{func() error { _, err := k.Resume(b); return err }, "resume request 1: it is not admitted"},
		{func() error { return k.Finish(b) }, "finish request 1: it is not admitted"},
		{func() error { _, err := k.Reserve(a, -1); return err }, "reserve -1 tokens of request 0 at 20: want 0 to 1"},
		{func() error { _, err := k.Reserve(a, 2); return err }, "reserve 2 tokens of request 0 at 20: want 0 to 1"},
		{func() error { _, err := k.Reserve(b, 1); return err }, "reserve request 1: it is not admitted"},
		{func() error { return k.ClearKept(-1) }, "kvcache: clear free slots' kept units, at most -1 pages: a negative count"},
		{func() error { return (&Cache{}).ClearKept(1) }, "clear kept mappings: the scheme was not made by NewCache"},
	} {
		err := tc.call()
		require.ErrorIs(t, err, driver.ErrInvalid, tc.says)
		require.ErrorContains(t, err, tc.says)
	}
	require.False(t, k.CanAdmit(a), "running")
	_, err = k.Preempt(a)
	require.NoError(t, err)
	_, err = k.Preempt(a)
	require.ErrorIs(t, err, driver.ErrInvalid)
	require.ErrorContains(t, err, "preempt request 0: it is preempted")
	_, err = k.Reserve(a, 0)
	require.ErrorIs(t, err, driver.ErrInvalid)
	require.ErrorContains(t, err, "reserve request 0: it is preempted")
	require.True(t, k.CanAdmit(a), "preempted: Resume is the test")
	require.NoError(t, k.Check())
	require.Equal(t, before.Commits, k.Stats().Commits)

	require.NoError(t, k.Close())
	require.ErrorIs(t, k.Close(), driver.ErrClosed)
	require.False(t, k.CanAdmit(b))
	_, err = k.Admit(b)
	require.ErrorIs(t, err, driver.ErrClosed)
	require.NoError(t, k.Check())
	st := k.Stats()
	require.Zero(t, st.InUse+st.Cached+st.Stored+st.Logical, "closed: nothing held")
}

// TestKVCacheExpectOutput: a request a finished with 32 output tokens, and
// c holds two of the budget's four 16-token pages. A 16-token prompt b
// fits the two pages left (a's idle slot gives its back), so the default
// admission, the prompt's room, says yes; with ExpectOutput it asks for
// b's prompt and 32 expected tokens, three pages, and says no. Asking
// changes nothing.
func TestKVCacheExpectOutput(t *testing.T) {
	cfg := Config{Model: tinyModel, Budget: 64 * units.KiB, MaxContext: 64, MaxSeqs: 4}
	for _, expect := range []bool{false, true} {
		t.Run(fmt.Sprint("ExpectOutput=", expect), func(t *testing.T) {
			k := newKVCache(t, cfg, CacheOptions{Layout: kvcache.TokenMajor, PageSize: 16 * units.KiB, ExpectOutput: expect})
			a, b, c := simReq(0, 16, 32), simReq(1, 16, 32), simReq(2, 32, 8)
			_, err := k.Admit(a)
			require.NoError(t, err)
			a.context = 48
			require.NoError(t, k.Append(a, 48))
			require.NoError(t, k.Finish(a))
			_, err = k.Admit(c)
			require.NoError(t, err)
			require.NoError(t, k.Append(c, 32))
			before := k.cache.Stats()
			require.Equal(t, !expect, k.CanAdmit(b))
			require.Equal(t, before, k.cache.Stats())
			require.NoError(t, k.Check())
		})
	}
}

// TestKVCacheLatentModel serves a few requests of DeepSeek-V2-Lite, whose
// KV is one 576-element latent a layer (31,104 bytes a token): the cache
// keeps it as a key and a value of 288 each, the same bytes a token as the
// baselines count, so token for token its stored KV is theirs.
func TestKVCacheLatentModel(t *testing.T) {
	m, err := ModelPreset("deepseek-v2-lite")
	require.NoError(t, err)
	reqs, err := ParseRequestsFile(filepath.Join("testdata", "requests", "AzureLLMInferenceTrace_conv.csv"))
	require.NoError(t, err)
	reqs = reqs[:12]
	cfg := Config{Model: m, Budget: 256 * units.MiB, MaxSeqs: 8}
	cfg.MaxContext = FitMaxContext(reqs, cfg)
	k := newKVCache(t, cfg, CacheOptions{Layout: kvcache.TokenMajor})
	kc := k.cache.Config()
	require.Equal(t, []int{27, 1, 288}, []int{kc.Layers, kc.KVHeads, kc.HeadDim})
	require.Equal(t, m.TokenBytes(), uint64(2*kc.Layers*kc.KVHeads*kc.HeadDim*kc.DType.Size()))

	// Mid-run, one sequence's stored bytes are its tokens at 31,104 each.
	a := simReq(0, 100, 5)
	_, err = k.Admit(a)
	require.NoError(t, err)
	require.NoError(t, k.Append(a, 100))
	require.Equal(t, uint64(100*31104), k.Stats().Logical)
	require.NoError(t, k.Finish(a))

	opts := Options{Config: cfg, CheckEvery: 7}
	res, err := Simulate(reqs, k, opts)
	require.NoError(t, err)
	tbl, err := NewBlockTable(cfg)
	require.NoError(t, err)
	paged, err := Simulate(reqs, tbl, opts)
	require.NoError(t, err)
	require.Equal(t, len(reqs), res.Finished)
	require.Equal(t, len(reqs), paged.Finished)
	require.Equal(t, paged.OutputTokens, res.OutputTokens)
}

// TestKVCachePresetsAgree: package kvcache's presets are the shapes this
// package's model presets of the same name give the cache (cacheShape,
// elemDType): a latent KV as a key and a value of half of it each.
func TestKVCachePresetsAgree(t *testing.T) {
	seen := 0
	for _, name := range kvcache.Presets() {
		m, err := ModelPreset(name)
		if err != nil {
			continue // tiny: a test shape, no model
		}
		want, err := kvcache.Preset(name)
		require.NoError(t, err)
		heads, dim, err := cacheShape(m)
		require.NoError(t, err)
		dt, err := elemDType(m)
		require.NoError(t, err)
		require.Equal(t, want, kvcache.Config{Layers: m.Layers, KVHeads: heads, HeadDim: dim, DType: dt}, name)
		require.Equal(t, m.TokenBytes(), uint64(2*want.Layers*want.KVHeads*want.HeadDim*want.DType.Size()), name)
		seen++
	}
	require.GreaterOrEqual(t, seen, 5)
}

// TestKVCacheAutoLayout: AutoLayout runs the layout kvcache.PickLayout
// picks, and Name says which.
func TestKVCacheAutoLayout(t *testing.T) {
	for _, c := range []struct {
		model string
		want  kvcache.Layout
	}{{"qwen2.5-7b", kvcache.Contiguous}, {"llama3-8b", kvcache.TokenMajor}} {
		m, err := ModelPreset(c.model)
		require.NoError(t, err)
		cfg := Config{Model: m, Budget: 64 * units.MiB, MaxSeqs: 4, BlockTokens: 16, MaxContext: 256}
		require.NoError(t, cfg.Check())
		k := newKVCache(t, cfg, CacheOptions{Layout: kvcache.AutoLayout})
		require.Equal(t, c.want, k.cache.Config().Layout, c.model)
		require.Equal(t, "this cache ("+c.want.String()+")", k.Name())
	}
}

// TestKVCacheAsksBeforeItCalls serves a burst that preempts — 48
// requests, each a system prompt of 4 blocks and a block of its own, and
// a long output, in 2 GiB of llama3-8b; the first alone, the rest a
// second later, once the first has computed (and so published) the
// system prompt — and the Mooncake slice: the scheme asks kvcache's
// CanAdmit and CanResume (for the whole context, as the paged scheme's
// CanAdmit asks) before every Admit and Resume, so the cache refuses
// none; and it preempts no more than the paged scheme does on the same
// requests, budget and steps.
func TestKVCacheAsksBeforeItCalls(t *testing.T) {
	l3, err := ModelPreset("llama3-8b")
	require.NoError(t, err)
	n := 48
	if invariants.Enabled || race.Enabled {
		n = 16
	}
	var burst []Request
	for i := range n {
		burst = append(burst, Request{Arrival: time.Duration(min(i, 1)) * time.Second, Input: 5 * DefaultBlockTokens, Output: 1500 + 40*i,
			Blocks: []int64{1, 2, 3, 4, int64(100 + i)}})
	}
	mooncake, err := ParseRequestsFile(filepath.Join("testdata", "requests", "mooncake_synthetic_trace.jsonl"))
	require.NoError(t, err)
	for i, reqs := range [][]Request{burst, mooncake[:n]} {
		cfg := Config{Model: l3, Budget: 2 * units.GiB, MaxSeqs: 64}
		cfg.MaxContext = FitMaxContext(reqs, cfg)
		opts := Options{Config: cfg, CheckEvery: 61}
		bt, err := NewBlockTable(cfg)
		require.NoError(t, err)
		paged, err := Simulate(reqs, bt, opts)
		require.NoError(t, err)
		k := newKVCache(t, cfg, CacheOptions{Layout: kvcache.TokenMajor})
		res, err := Simulate(reqs, k, opts)
		require.NoError(t, err)
		require.Equal(t, len(reqs), res.Finished+res.Refused)
		require.Equal(t, paged.Finished, res.Finished)
		st := k.cache.Stats()
		t.Logf("this cache: %d preemptions, %d resumes; paged: %d preemptions", res.Preemptions, st.Resumes, paged.Preemptions)
		require.Zero(t, st.FailedAdmits)
		require.Zero(t, st.FailedResumes)
		require.Equal(t, res.Preemptions, st.Resumes, "each preempted request resumed once")
		require.LessOrEqual(t, res.Preemptions, paged.Preemptions)
		if i == 0 {
			require.Positive(t, res.Preemptions, "the burst preempts")
		}
	}
}

// TestSmallPagesServeEveryRequest: at 64 KiB pages a llama3-8b token
// (128 KiB) is a unit of two pages; the slots commit it page by page and
// the prefix store as one chunk, so the pool kept pages of one size while
// the store needed the other. With the device full of pooled pages the
// cache refused requests with nothing running ("it can never run"), at
// the first admission of the squeeze trace at 1 GiB. The pooled chunks
// of the other size are room now (arena's TestPoolRoomForOtherSizes):
// the uniform cache and the hybrid (mistral-7b's sliding window) finish
// and refuse what the paged scheme does on the same traces.
func TestSmallPagesServeEveryRequest(t *testing.T) {
	if race.Enabled {
		t.Skip("one goroutine's simulations, ten times slower under the detector: scripts/test runs it without")
	}
	for _, c := range []struct {
		model, shape string
		budget       uint64
	}{
		{"llama3-8b", "shared-prefix", 4 * units.GiB},
		{"llama3-8b", "squeeze", 1 * units.GiB},
		{"mistral-7b", "bursts", 2 * units.GiB},
	} {
		t.Run(c.model+"/"+c.shape, func(t *testing.T) {
			m, err := ModelPreset(c.model)
			require.NoError(t, err)
			reqs, err := RequestTrace{Shape: c.shape, Seed: 1, Requests: 20}.Generate()
			require.NoError(t, err)
			cfg := Config{Model: m, Budget: c.budget, MaxSeqs: 32}
			cfg.MaxContext = FitMaxContext(reqs, cfg)
			opts := Options{Config: cfg, CheckEvery: 100}
			paged, err := NewBlockTable(cfg)
			require.NoError(t, err)
			pres, err := Simulate(reqs, paged, opts)
			require.NoError(t, err)
			var scheme Scheme
			if m.Hybrid() {
				h, err := NewHybridCache(cfg, HybridCacheOptions{PageSize: 64 * units.KiB})
				require.NoError(t, err)
				t.Cleanup(func() { require.NoError(t, h.Close()) })
				scheme = h
			} else {
				scheme = newKVCache(t, cfg, CacheOptions{Layout: kvcache.TokenMajor, PageSize: 64 * units.KiB})
			}
			res, err := Simulate(reqs, scheme, opts)
			require.NoError(t, err)
			require.Equal(t, pres.Finished, res.Finished)
			require.Equal(t, len(reqs), res.Finished+res.Refused, "every request served or refused as longer than the context")
			require.Equal(t, pres.Refused, res.Refused)
		})
	}
}

// TestWarmBudget: with Options.WarmBudget the cache's page pool is warmed
// before serving with the whole budget (a trace holding more than the
// budget), so every create is made then, none while serving, and steps
// wait for less driver time than when the pool is warmed a step at a
// time (steps of 512 tokens here, a fraction of the budget); with a
// budget larger than the trace, the warm stops at the trace's memory,
// and serving keeps a step's pages pooled on top, as without WarmBudget.
func TestWarmBudget(t *testing.T) {
	m, err := ModelPreset("llama3-8b")
	require.NoError(t, err)
	reqs := make([]Request, 16)
	for i := range reqs {
		reqs[i] = Request{Arrival: time.Duration(i) * 20 * time.Millisecond, Input: 400 + 37*i, Output: 30}
	}
	run := func(budget uint64, warmBudget bool) Result {
		cfg := Config{Model: m, Budget: budget, MaxSeqs: 32}
		cfg.MaxContext = FitMaxContext(reqs, cfg)
		c := newKVCache(t, cfg, CacheOptions{Layout: kvcache.TokenMajor, PageSize: 64 * units.KiB})
		res, err := Simulate(reqs, c, Options{Config: cfg, MaxBatchedTokens: 512, CheckEvery: 50, Prices: sim.A100, WarmBudget: warmBudget})
		require.NoError(t, err)
		require.Equal(t, len(reqs), res.Finished+res.Refused)
		return res
	}
	var tokens uint64
	for _, r := range reqs {
		tokens += uint64(r.Input + r.Output)
	}
	small := tokens * m.TokenBytes() / 4 // the trace holds four budgets' worth
	step, whole := run(small, false), run(small, true)
	n := small / (128 * units.KiB) // llama3-8b's token: a unit of two pages
	require.Equal(t, n, whole.Driver.Calls.Create, "the budget's units, created once")
	require.Equal(t, time.Duration(n)*sim.A100.Create, whole.Driver.Startup, "every create before serving")
	require.Less(t, whole.Driver.Exposed, step.Driver.Exposed)
	require.LessOrEqual(t, whole.MeanTTFT, step.MeanTTFT)

	big := run(64*tokens*m.TokenBytes(), true)
	t.Logf("a budget of 64 traces: %d creates for %d tokens", big.Driver.Calls.Create, tokens)
	require.LessOrEqual(t, big.Driver.Calls.Create, tokens+512+1, "at most the trace's units and a step's pool, not the budget's")
}

// TestKVCacheHoldsAttentionLayersOnly: this cache keeps a token's KV in
// the model's attention layers only, Model.TokenBytes as the paged
// scheme counts it — a model with recurrent layers (qwen3-next: 12
// attention layers of 48) keeps no KV a token in the others — so the
// memory a prompt commits is its tokens' KV and less than a page more.
func TestKVCacheHoldsAttentionLayersOnly(t *testing.T) {
	for _, name := range ModelPresets() {
		m, err := ModelPreset(name)
		require.NoError(t, err)
		cfg := Config{Model: m, Budget: 4 * units.GiB, MaxContext: 4096, MaxSeqs: 2}
		k := newKVCache(t, cfg, CacheOptions{Layout: kvcache.AutoLayout})
		r := simReq(0, 4000, 1)
		_, err = k.Admit(r)
		require.NoError(t, err, name)
		require.NoError(t, k.Append(r, 4000), name)
		st := k.cache.Stats()
		want := 4000 * m.TokenBytes()
		require.GreaterOrEqual(t, st.UsedBytes+st.Waste, want, name)
		require.Less(t, st.UsedBytes+st.Waste, want+2*k.cache.Config().PageSize, "%s: %d attention layers of %d", name, m.AttentionLayers(), m.Layers)
	}
}
