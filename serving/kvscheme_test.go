package serving

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// tinyConfig is 8 blocks of 16 tokens of tinyModel (16 KiB each), or two
// reservations of 64 tokens.
var tinyConfig = Config{Model: tinyModel, Budget: 128 * units.KiB, MaxContext: 64, MaxSeqs: 4}

// simReq is request id of a trace, not yet served.
func simReq(id, input, output int, blocks ...int64) *SimRequest {
	return &SimRequest{id: id, prompt: id, req: Request{Input: input, Output: output, Blocks: blocks}, context: input}
}

// TestTokens: Mooncake's hash_ids make equal prompt tokens where the ids
// are equal, to the partial last block; everything else is the request's
// own.
func TestTokens(t *testing.T) {
	a := simReq(0, 600, 10, 5, 6)  // blocks [0,512) and [512,600)
	b := simReq(1, 1000, 10, 5, 6) // the same two ids, the second longer
	c := simReq(2, 600, 10, 5, 9)  // the same first block only
	d := simReq(3, 600, 10)        // no ids: all its own
	e := simReq(4, 600, 10)        // no ids: all its own
	require.Equal(t, a.Tokens(nil, 0, 600), b.Tokens(nil, 0, 600))
	require.Equal(t, a.Tokens(nil, 0, 512), c.Tokens(nil, 0, 512))
	require.NotEqual(t, a.Token(512), c.Token(512))
	require.NotEqual(t, a.Token(600), b.Token(600), "a's output is its own, b's prompt goes on")
	require.NotEqual(t, d.Token(0), e.Token(0))
	require.NotEqual(t, d.Token(0), d.Token(1))
	seen := map[int]bool{}
	for _, r := range []*SimRequest{a, b, c, d, e} {
		for _, tok := range r.Tokens(nil, 0, 700) {
			require.GreaterOrEqual(t, tok, 0)
			seen[tok] = true
		}
	}
	// Of tokens 0 to 699 of each: a's 600 prompt tokens and 100 of output;
	// b's 100 prompt tokens past 600; c's 88 in block 9 and 100 of output;
	// all of d's and e's.
	require.Equal(t, 600+100+100+88+100+700+700, len(seen))
}

// TestTokensOfSmallBlocks: a Bailian trace's 16-token blocks make equal
// tokens where the ids are equal, whatever ids come before them; tokens
// past the blocks named are the request's own.
func TestTokensOfSmallBlocks(t *testing.T) {
	small := func(id, input int, blocks ...int64) *SimRequest {
		r := simReq(id, input, 4, blocks...)
		r.req.BlockTokens = 16
		return r
	}
	a := small(0, 40, 7, 8, 9)
	b := small(1, 40, 8, 7)    // the same ids in another order, and a block fewer
	c := small(2, 40, 7, 8, 9) // a's ids
	require.Equal(t, a.Tokens(nil, 0, 40), c.Tokens(nil, 0, 40))
	require.Equal(t, a.Tokens(nil, 0, 16), b.Tokens(nil, 16, 32), "block 7, first in a and second in b")
	require.Equal(t, a.Tokens(nil, 16, 32), b.Tokens(nil, 0, 16))
	require.NotEqual(t, a.Token(32), b.Token(32), "b names no third block: its tokens there are its own")
	require.NotEqual(t, a.Token(1), a.Token(17))
}

func TestKVConfig(t *testing.T) {
	cfg := tinyConfig
	require.NoError(t, cfg.Check())
	require.Equal(t, 128, cfg.ContextCap(), "8 blocks of 16 tokens of 1 KiB")
	cfg.MaxContext = 128
	require.NoError(t, cfg.Check())
	cfg.MaxContext = 113 // 8 blocks
	require.NoError(t, cfg.Check())

	for _, tc := range []struct {
		change func(c *Config)
		says   string
	}{
		{func(c *Config) { c.MaxContext = 129 }, "a budget of 128 KiB does not hold one sequence of 129 tokens of tiny (1 KiB a token, in blocks of 16): want at least 144 KiB, or a shorter max context (at most 128 tokens)"},
		{func(c *Config) { c.MaxContext = 0 }, "max context of 0 tokens, want 1 to"},
		{func(c *Config) { c.MaxSeqs = 0 }, "at most 0 sequences, want 1 to"},
		{func(c *Config) { c.BlockTokens = -1 }, "block of -1 tokens"},
		{func(c *Config) { c.Model.HeadDim = 0 }, `model "tiny": HeadDim 0, want 1 to 65536`},
		{func(c *Config) { c.Model.ElemBytes = 16 }, `model "tiny": ElemBytes 16, want 1 to 8`},
		{func(c *Config) { c.Model.Params = -1 }, `model "tiny": Params -1`},
		{func(c *Config) { c.Model = Model{} }, `model "": Layers 0`},
	} {
		c := tinyConfig
		tc.change(&c)
		err := c.Check()
		require.ErrorIs(t, err, driver.ErrInvalid, tc.says)
		require.ErrorContains(t, err, tc.says)
	}

	// FitMaxContext: the longest request rounded up to a block, as much as
	// the budget holds.
	reqs := []Request{{Input: 30, Output: 3}, {Input: 10, Output: 40}}
	cfg.MaxContext = 0
	require.Equal(t, 64, FitMaxContext(reqs, cfg), "50 tokens, in 16-token blocks")
	require.Equal(t, 16, FitMaxContext(nil, cfg))
	reqs = append(reqs, Request{Input: 500})
	require.Equal(t, 128, FitMaxContext(reqs, cfg), "the budget holds 128")
	cfg.Budget = units.KiB
	require.Equal(t, 0, cfg.ContextCap())
	require.Equal(t, 16, FitMaxContext(reqs, cfg), "one block, which Check refuses")
}

// TestWindowNote: no note without a window; exact within it; flagged past
// it, with how many layers use it.
func TestWindowNote(t *testing.T) {
	l3, err := ModelPreset("llama3-8b")
	require.NoError(t, err)
	require.Empty(t, Config{Model: l3, MaxContext: 1 << 20}.WindowNote())
	mistral, err := ModelPreset("mistral-7b")
	require.NoError(t, err)
	require.Equal(t, "sliding window: all 32 layers of mistral-7b attend to the last 4096 tokens, no fewer than the max context of 4096, so the window drops no token and the figures are exact",
		Config{Model: mistral, MaxContext: 4096}.WindowNote())
	require.Equal(t, "sliding window not modelled: all 32 layers of mistral-7b attend to the last 4096 tokens only, but every scheme keeps each token of a sequence in every layer; "+
		"for sequences longer than 4096 tokens (the max context is 8192) the figures are full attention's, more KV than the model needs",
		Config{Model: mistral, MaxContext: 8192}.WindowNote())
	mistral.WindowLayers = 16
	require.Contains(t, Config{Model: mistral, MaxContext: 8192}.WindowNote(), "not modelled: 16 of 32 layers of mistral-7b")
}

// TestContextCapOfBadConfigs: ContextCap and FitMaxContext take a
// caller's Config and requests as they are, before Check: a block whose
// bytes overflow (llama3-8b's 128 KiB token times 2^47 tokens is 2^64,
// which wrapped to 0 and divided by it), a model Check refuses, and
// prompts and outputs out of range answer a figure, never a panic.
func TestContextCapOfBadConfigs(t *testing.T) {
	l3 := modelPresets["llama3-8b"]
	for _, c := range []Config{
		{Model: l3, Budget: 80 * units.GiB, BlockTokens: 1 << 47},
		{Model: l3, Budget: 80 * units.GiB, BlockTokens: -3},
		{Model: Model{Name: "bad", Layers: -1, KVHeads: 8, HeadDim: 128, ElemBytes: 2}, Budget: 80 * units.GiB},
	} {
		require.NotPanics(t, func() { require.Zero(t, c.ContextCap()) }, "%+v", c)
	}
	huge := []Request{{Input: int(^uint(0) >> 1), Output: int(^uint(0) >> 1)}, {Input: -5, Output: -5}}
	c := Config{Model: l3, Budget: 8 * units.TiB} // 64M tokens, past the cap
	require.Equal(t, 2*MaxTokens, c.ContextCap())
	require.Equal(t, 2*MaxTokens, FitMaxContext(huge, c), "each field counted at MaxTokens")
	c.BlockTokens = 1 << 47
	require.NotPanics(t, func() { FitMaxContext(huge, c) })
}

// TestTokensAreToken: Tokens, which mixes once a run of tokens, names
// every token as Token does, across block ends, the prompt's end and the
// output, for blocks of every size and fewer blocks than the prompt.
func TestTokensAreToken(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		input := rng.IntN(100)
		blocks := make([]int64, rng.IntN(8))
		for j := range blocks {
			blocks[j] = rng.Int64N(5)
		}
		r := simReq(i, input, 10, blocks...)
		r.req.BlockTokens = []int{0, 1, 3, 16, 512, 1 << 62}[rng.IntN(6)]
		from := rng.IntN(130) - 5
		to := from + rng.IntN(60)
		want := []int{}
		for tk := from; tk < to; tk++ {
			want = append(want, r.Token(tk))
		}
		require.Equal(t, want, r.Tokens([]int{}, from, to), "request %d: tokens %d to %d, blocks of %d", i, from, to, r.req.BlockTokens)
	}
	var none *SimRequest
	require.Equal(t, []int{0, 0}, none.Tokens(nil, 3, 5))
	require.Zero(t, simReq(0, 10, 10, 3).Token(-1), "no position is negative")
}
