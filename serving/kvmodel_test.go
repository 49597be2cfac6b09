package serving

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// tinyModel keeps 1 KiB of KV a token, so that the hand-worked tests count
// in KiB: a 16-token block is 16 KiB.
var tinyModel = Model{Name: "tiny", Layers: 1, KVHeads: 1, HeadDim: 256, ElemBytes: 2, QueryHeads: 1}

func TestModelPresets(t *testing.T) {
	require.Equal(t, []string{"deepseek-v2-lite", "deepseek-v3", "gemma-3-27b", "gpt-oss-120b", "llama-7b", "llama3-8b", "llama3.1-70b", "llama3.1-8b",
		"llama3.3-70b", "mistral-7b", "qwen2.5-7b", "qwen3-next-80b-a3b"}, ModelPresets())
	// Each preset's KV a token, by hand: a key and a value (2) x layers x
	// KV heads x head dim x 2 bytes, or for a latent one vector of
	// kv_lora_rank + qk_rope_head_dim x layers x 2 bytes.
	for name, want := range map[string]uint64{
		"llama-7b":           2 * 32 * 32 * 128 * 2, // 512 KiB
		"llama3-8b":          2 * 32 * 8 * 128 * 2,  // 128 KiB
		"llama3.1-8b":        2 * 32 * 8 * 128 * 2,  // 128 KiB
		"llama3.1-70b":       2 * 80 * 8 * 128 * 2,  // 320 KiB
		"llama3.3-70b":       2 * 80 * 8 * 128 * 2,  // 320 KiB
		"qwen2.5-7b":         2 * 28 * 4 * 128 * 2,  // 56 KiB
		"mistral-7b":         2 * 32 * 8 * 128 * 2,  // 128 KiB
		"deepseek-v2-lite":   27 * (512 + 64) * 2,   // 30.4 KiB
		"deepseek-v3":        61 * (512 + 64) * 2,   // 68.6 KiB
		"gemma-3-27b":        2 * 62 * 16 * 128 * 2, // 496 KiB, 416 of it in window layers
		"gpt-oss-120b":       2 * 36 * 8 * 64 * 2,   // 72 KiB, half in window layers
		"qwen3-next-80b-a3b": 2 * 12 * 2 * 256 * 2,  // 24 KiB in the 12 attention layers
	} {
		m, err := ModelPreset(name)
		require.NoError(t, err)
		require.Equal(t, want, m.TokenBytes(), name)
		require.NoError(t, m.check(), name)
		require.Equal(t, name, m.Name)
	}
	m, err := ModelPreset("llama-7b")
	require.NoError(t, err)
	require.Equal(t, 512*units.KiB, m.TokenBytes())
	m, err = ModelPreset("llama3-8b")
	require.NoError(t, err)
	require.Equal(t, 128*units.KiB, m.TokenBytes())
	require.Equal(t, 32, m.QueryHeads)
	require.Equal(t, units.KiB, tinyModel.TokenBytes())

	_, err = ModelPreset("gpt2")
	require.ErrorIs(t, err, driver.ErrInvalid)
	require.ErrorContains(t, err, `no model preset "gpt2", want one of deepseek-v2-lite, deepseek-v3, gemma-3-27b, gpt-oss-120b, llama-7b,`)
}

// TestModelCheck refuses the new fields' nonsense.
func TestModelCheck(t *testing.T) {
	l3, err := ModelPreset("llama3-8b")
	require.NoError(t, err)
	for _, tc := range []struct {
		edit   func(m *Model)
		errMsg string
	}{
		{func(m *Model) { m.ActiveParams = m.Params + 1 }, "ActiveParams 8030261249, want 0 (dense) to Params 8030261248"},
		{func(m *Model) { m.ActiveParams = -1 }, "ActiveParams -1"},
		{func(m *Model) { m.Latent = true }, "a latent KV has one vector a layer, KVHeads 8, want 1"},
		{func(m *Model) { m.Experts = 8 }, "ExpertsPerToken 0, want 1 to Experts 8 (0 for a dense model)"},
		{func(m *Model) { m.Experts, m.ExpertsPerToken = 8, 9 }, "ExpertsPerToken 9, want 1 to Experts 8"},
		{func(m *Model) { m.Experts, m.ExpertsPerToken = -1, 0 }, "Experts -1, want 0 (dense) to 65536"},
		{func(m *Model) { m.Experts, m.ExpertsPerToken = 8, 2 }, "8 experts but no ActiveParams"},
		{func(m *Model) { m.SlidingWindow = -1 }, "SlidingWindow -1, want 0 (none) to 16777216 tokens"},
		{func(m *Model) { m.WindowLayers = 4 }, "WindowLayers 4 without a SlidingWindow, want 0"},
		{func(m *Model) { m.SlidingWindow = 4096 }, "WindowLayers 0, want 1 to Layers 32"},
		{func(m *Model) { m.SlidingWindow, m.WindowLayers = 4096, 33 }, "WindowLayers 33, want 1 to Layers 32"},
	} {
		m := l3
		tc.edit(&m)
		err := m.check()
		require.ErrorIs(t, err, driver.ErrInvalid)
		require.ErrorContains(t, err, `serving: model "llama3-8b": `+tc.errMsg)
	}
}

// TestStepModel prices steps by hand: FLOPs and bytes of a small model at
// round rates, and a decode on the A100.
func TestStepModel(t *testing.T) {
	// 32 bytes of KV a token (2 * 2 layers * 1 head * 4 * 2 bytes).
	m := Model{Name: "toy", Layers: 2, KVHeads: 1, HeadDim: 4, ElemBytes: 2, QueryHeads: 2, Params: 1000}
	sm := StepModel{PeakFLOPS: 1000, Bandwidth: 1000, StepOverhead: time.Millisecond, SeqOverhead: 10 * time.Microsecond}
	var w stepWork
	// A chunk of 2 tokens after 10: 2*1000*2 FLOPs of products, 4 * 2
	// layers * 2 heads * 4 * (2*10 + 2*3/2) = 1472 of attention; it reads
	// 12 tokens' KV and writes 2: 14*32 = 448 bytes, and the weights 2000.
	w.add(m, 10, 2)
	require.Equal(t, stepWork{seqs: 1, tokens: 2, flops: 5472, bytes: 448}, w)
	require.Equal(t, time.Millisecond+10*time.Microsecond+5472*time.Millisecond, sm.time(m, w), "bound by arithmetic")
	sm.PeakFLOPS = 10000
	require.Equal(t, time.Millisecond+10*time.Microsecond+2448*time.Millisecond, sm.time(m, w), "bound by memory")
	sm.PeakFLOPS, sm.Bandwidth = 0, 0
	require.Equal(t, time.Millisecond+10*time.Microsecond, sm.time(m, w), "zero rates are free")

	// A mixture of experts computes through its active parameters:
	// 400 of 1000 make 2*400*2 = 1600 FLOPs of products. With 4 experts, a
	// token routed to 1, the routed experts hold (1000-400)*4/3 = 800 (200
	// shared): a step of 2 tokens leaves (3/4)^2 of them unread, reading
	// 1000 - 800*9/16 = 550.
	moe := m
	moe.ActiveParams, moe.Experts, moe.ExpertsPerToken = 400, 4, 1
	require.NoError(t, moe.check())
	w = stepWork{}
	w.add(moe, 10, 2)
	require.Equal(t, stepWork{seqs: 1, tokens: 2, flops: 3072, bytes: 448}, w)
	require.InDelta(t, 550, moe.weightsRead(2), 1e-9)
	require.InDelta(t, 200, moe.weightsRead(0), 1e-9, "no token: the shared weights")
	require.InDelta(t, 1000, moe.weightsRead(1000), 1e-9, "many tokens: nearly all")
	sm = StepModel{Bandwidth: 1000}
	require.Equal(t, time.Duration((448+2*550)*float64(time.Millisecond)), sm.time(moe, w))
	// DeepSeek-V3's decode of one token reads its 37.6 B active
	// parameters, of 256 tokens 99.97% of its 671 B.
	v3, err := ModelPreset("deepseek-v3")
	require.NoError(t, err)
	require.InDelta(t, float64(v3.ActiveParams), v3.weightsRead(1), 1)
	require.InDelta(t, 0.9997, v3.weightsRead(256)/float64(v3.Params), 0.0001)

	// One llama3-8b decode at 1000 tokens on the A100: the weights (16.06
	// GB) and 1002 tokens' KV (131 MB) at 2.039 TB/s take 7.94 ms; its
	// 16.6 GFLOPs at 312 TFLOP/s 0.05 ms.
	l3, err := ModelPreset("llama3-8b")
	require.NoError(t, err)
	w = stepWork{}
	w.add(l3, 1000, 1)
	require.InDelta(t, 8.95, float64(A100.time(l3, w))/float64(time.Millisecond), 0.01)
}
