package disagg

import (
	"context"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/serving"
)

// The Mooncake trace scaled to the test model. A Mooncake hash id names a
// block of serving.BlockTokens (512) prompt tokens, equal ids equal
// content; here a block becomes one cache unit of positions (8 in the
// TokenMajor layout of the test model), so the trace's sharing — which
// prompts start with which blocks — is kept whole at the granularity the
// caches share at, and a prompt of n tokens becomes ceil(n*8/512)
// positions. Prompts are cut at traceUnits units (the trace's run to
// hundreds of blocks: whole, the model's quadratic prefill would take
// minutes, and 6 units keep it within 5 s under the race detector). The
// cut keeps each prompt's first blocks, where shared prefixes start: of
// the 5,330 blocks the 200 requests name, 323 (6.1%) continue a prefix
// seen before; of the 797 blocks left after the cut, 58 (7.3%). Token t of
// block id is a hash of (id, t), modulo the vocabulary.
const (
	traceLayout = kvcache.TokenMajor
	traceUnits  = 6 // units a prompt is cut at
	traceDecode = 4 // tokens decoded per request, at most (the trace's output when fewer)
)

// traceRequest is a request of the trace scaled: its prompt and the tokens
// to decode.
type traceRequest struct {
	prompt []int
	decode int
}

// loadTrace reads the first n requests of the bundled Mooncake trace,
// scaled.
func loadTrace(t testing.TB, n int) []traceRequest {
	t.Helper()
	f, err := os.Open("testdata/mooncake_synthetic_trace.jsonl")
	require.NoError(t, err)
	defer f.Close()
	reqs, err := serving.ParseMooncake(f)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(reqs), n)
	tpu := unitTokensOf(traceLayout)
	out := make([]traceRequest, n)
	for i, r := range reqs[:n] {
		length := min((r.Input*tpu+serving.BlockTokens-1)/serving.BlockTokens, traceUnits*tpu)
		prompt := make([]int, max(length, 1))
		for p := range prompt {
			id := uint64(r.Blocks[p/tpu])
			prompt[p] = int(mix64(mix64(id)^uint64(p%tpu)) % uint64(modelConfig.Vocab))
		}
		out[i] = traceRequest{prompt: prompt, decode: min(max(r.Output, 1), traceDecode)}
	}
	return out
}

// mix64 is SplitMix64's finalizer.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// traceFigures are what a run of the trace moved.
type traceFigures struct {
	requests         int
	units, cached    int    // prompt units written at the prefill side; of them, held by the decode side
	ideal            int    // units a store keeping every whole prompt unit would have held
	sent             int    // units fetched
	sentBytes, bytes uint64 // bytes fetched; bytes of every prompt unit (what sending all would move)
}

// runTrace prefills and decodes reqs through fresh sides, checking per
// request that the bytes moved are the prompt's units less those the
// decode side held, both counted independently of the sides; every
// check-th request's tokens are compared with one process doing both.
func runTrace(t testing.TB, reqs []traceRequest, check int) traceFigures {
	t.Helper()
	ctx := context.Background()
	s := newSides(t, traceLayout, traceUnits*unitTokensOf(traceLayout)+traceDecode, 2)
	tpu, ub := unitTokensOf(traceLayout), unitBytesOf(traceLayout)
	seen := map[string]bool{}
	var f traceFigures
	for i, r := range reqs {
		cached := s.index.cached(r.prompt)
		h, err := s.prefill.Prefill(r.prompt, 0)
		require.NoError(t, err)
		res, err := s.decode.Decode(ctx, s.prefill, h, r.decode)
		require.NoError(t, err)
		units := (len(r.prompt) + tpu - 1) / tpu
		require.Equal(t, units, res.Units, "request %d", i)
		require.Equal(t, cached, res.Cached, "request %d: units the decode side held", i)
		require.Equal(t, uint64(units-cached)*ub, res.Bytes, "request %d: the bytes moved", i)
		if check > 0 && i%check == 0 {
			want, _ := reference(t, s.model, r.prompt, r.decode)
			require.Equal(t, want, res.Tokens, "request %d: the tokens of one process doing both", i)
		}
		f.ideal += ideal(seen, tpu, r.prompt)
		see(seen, tpu, r.prompt)
		f.requests++
		f.units += units
		f.cached += cached
		f.sent += res.Fetched
		f.sentBytes += res.Bytes
		f.bytes += uint64(units) * ub
	}
	require.Zero(t, s.dc.Stats().Evictions, "the independent account assumes the decode side evicts nothing")
	require.Equal(t, f.sentBytes, s.link.Stats().Bytes, "what the link copied")
	require.Equal(t, f.sentBytes, s.decode.Stats().Bytes)
	s.close(t)
	return f
}

// TestMooncakeTrace: 200 requests of the Mooncake trace (50 under the race
// detector), scaled, go from the prefill side to the decode side; each
// moves exactly its prompt units less those the decode side's prefix store
// holds, and the trace's shared prefixes make that less than all of them.
func TestMooncakeTrace(t *testing.T) {
	f := runTrace(t, loadTrace(t, 200), 20)
	require.Equal(t, f.units-f.cached, f.sent)
	require.Positive(t, f.cached, "the trace shares prefixes")
	require.Equal(t, f.ideal, f.cached, "nothing evicted: every whole prompt unit seen before is cached")
	require.Less(t, f.sentBytes, f.bytes)
	t.Logf("%d requests: %d prompt units, %d cached at the decode side (%d with every whole prompt unit kept), %d sent (%d of %d bytes, %.3f)",
		f.requests, f.units, f.cached, f.ideal, f.sent, f.sentBytes, f.bytes, float64(f.sentBytes)/float64(f.bytes))
}

// BenchmarkMooncakeTrace runs the 200 scaled requests per iteration and
// reports the bytes and units moved against the baseline of sending every
// prompt unit (no reuse at the decode side), counted in the same run.
func BenchmarkMooncakeTrace(b *testing.B) {
	reqs := loadTrace(b, 200)
	var f traceFigures
	for b.Loop() {
		f = runTrace(b, reqs, 0)
	}
	b.ReportMetric(float64(f.sentBytes), "sent-bytes/op")
	b.ReportMetric(float64(f.bytes), "all-units-bytes/op")
	b.ReportMetric(float64(f.sent), "units-sent/op")
	b.ReportMetric(float64(f.cached), "units-cached/op")
	b.ReportMetric(float64(f.ideal), "units-cached-ideal/op")
	b.ReportMetric(float64(f.sentBytes)/float64(f.bytes), "sent/all")
}
