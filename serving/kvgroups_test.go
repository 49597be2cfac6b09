package serving

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
)

// TestModelGroups: the hybrid presets' groups, as their configs give them.
func TestModelGroups(t *testing.T) {
	for _, c := range []struct {
		preset string
		want   []LayerGroup
	}{
		{"gemma-3-27b", []LayerGroup{
			{Kind: FullAttention, Layers: 10, TokenBytes: 10 * 2 * 16 * 128 * 2},
			{Kind: SlidingWindow, Layers: 52, Window: 1024, TokenBytes: 52 * 2 * 16 * 128 * 2}}},
		{"mistral-7b", []LayerGroup{{Kind: SlidingWindow, Layers: 32, Window: 4096, TokenBytes: 32 * 2 * 8 * 128 * 2}}},
		{"gpt-oss-120b", []LayerGroup{
			{Kind: FullAttention, Layers: 18, TokenBytes: 18 * 2 * 8 * 64 * 2},
			{Kind: SlidingWindow, Layers: 18, Window: 128, TokenBytes: 18 * 2 * 8 * 64 * 2}}},
		{"deepseek-v3", []LayerGroup{{Kind: LatentAttention, Layers: 61, TokenBytes: 61 * 576 * 2}}},
		{"qwen3-next-80b-a3b", []LayerGroup{
			{Kind: FullAttention, Layers: 12, TokenBytes: 12 * 2 * 2 * 256 * 2},
			{Kind: Recurrent, Layers: 36, StateBytes: 36 * ((4-1)*(2*16*128+32*128) + 32*128*128) * 2}}},
		{"llama3-8b", []LayerGroup{{Kind: FullAttention, Layers: 32, TokenBytes: 32 * 2 * 8 * 128 * 2}}},
	} {
		m, err := ModelPreset(c.preset)
		require.NoError(t, err)
		require.Equal(t, c.want, m.Groups(), c.preset)
		require.Equal(t, c.preset != "llama3-8b" && c.preset != "deepseek-v3", m.Hybrid(), c.preset)
		var tb uint64
		for _, g := range c.want {
			tb += g.TokenBytes
		}
		require.Equal(t, tb, m.TokenBytes(), c.preset)
	}
	g, err := ModelPreset("gemma-3-27b")
	require.NoError(t, err)
	require.Equal(t, uint64(32768*10*2*16*128*2+1024*52*2*16*128*2), g.ExactNeed(32768))
	require.Equal(t, uint64(100*62*2*16*128*2), g.ExactNeed(100), "a sequence inside the window needs every layer's tokens")
}

// TestModelFromConfigRecurrent reads the state of Mamba layers: Granite
// 4's Mamba-2 by layer_types, Jamba's Mamba by attn_layer_period.
func TestModelFromConfigRecurrent(t *testing.T) {
	c := llama31(t)
	c["layer_types"] = slices.Repeat(append(repeat("mamba", 7), "attention"), 4)
	c["mamba_n_heads"], c["mamba_d_head"], c["mamba_d_state"], c["mamba_d_conv"], c["mamba_n_groups"] = 128, 64, 128, 4, 1
	m, err := fromMap(t, c)
	require.NoError(t, err)
	require.Equal(t, 28, m.RecurrentLayers)
	require.Equal(t, uint64((3*(128*64+2*128)+128*64*128)*2), m.StateBytes)
	require.Equal(t, uint64(2*4*8*128*2), m.TokenBytes(), "the KV is the 4 attention layers'")

	c = llama31(t)
	c["attn_layer_period"], c["attn_layer_offset"] = 8, 4
	c["mamba_expand"], c["mamba_d_state"], c["mamba_d_conv"] = 2, 16, 4
	m, err = fromMap(t, c)
	require.NoError(t, err)
	require.Equal(t, 28, m.RecurrentLayers)
	require.Equal(t, uint64((3*8192+8192*16)*2), m.StateBytes)

	// Qwen3-Next's interval, without layer_types.
	c = llama31(t)
	c["full_attention_interval"] = 4
	c["linear_num_key_heads"], c["linear_num_value_heads"], c["linear_key_head_dim"], c["linear_value_head_dim"], c["linear_conv_kernel_dim"] = 16, 32, 128, 128, 4
	m, err = fromMap(t, c)
	require.NoError(t, err)
	require.Equal(t, 24, m.RecurrentLayers)
	require.Equal(t, uint64(1_097_728), m.StateBytes)

	// Gemma 3's pattern, given.
	c = llama31(t)
	c["sliding_window"], c["sliding_window_pattern"] = 512, 4
	m, err = fromMap(t, c)
	require.NoError(t, err)
	require.Equal(t, 24, m.WindowLayers)
	require.Equal(t, 512, m.SlidingWindow)
}

// TestModelFromConfigLayersRefused: contradictory or incomplete layer
// fields are errors naming them, and no model.
func TestModelFromConfigLayersRefused(t *testing.T) {
	for _, c := range []struct {
		set  map[string]any
		want string
	}{
		{map[string]any{"layer_types": []string{"full_attention"}}, "layer_types has 1 entries for 32 num_hidden_layers"},
		{map[string]any{"layer_types": repeat("cross_attention", 32)}, `layer_types[0] is "cross_attention"`},
		{map[string]any{"layer_types": repeat("mamba", 32)}, "every one of the 32 layers is recurrent"},
		{map[string]any{"layer_types": append(repeat("mamba", 31), "attention")}, "recurrent layers but no state fields"},
		{map[string]any{"layer_types": append(repeat("linear_attention", 31), "attention"), "linear_num_key_heads": 16}, `no "linear_num_value_heads"`},
		{map[string]any{"layer_types": append(repeat("sliding_attention", 31), "full_attention")}, `no "sliding_window"`},
		{map[string]any{"sliding_window": 512, "sliding_window_pattern": 0}, `"sliding_window_pattern" is 0, want 1 to 32`},
		{map[string]any{"full_attention_interval": 40}, `"full_attention_interval" is 40, want 1 to 32`},
		{map[string]any{"attn_layer_period": 8, "attn_layer_offset": 8}, "attn_layer_offset is 8, want 0 to attn_layer_period-1 (7)"},
		{map[string]any{"full_attention_interval": 2, "linear_num_key_heads": 1, "linear_num_value_heads": 1, "linear_key_head_dim": 1, "linear_value_head_dim": 1, "linear_conv_kernel_dim": 1}, "a convolution of width 1"},
		{map[string]any{"attn_layer_period": 2, "mamba_expand": 65536, "mamba_d_state": 65536, "mamba_d_conv": 4}, "a recurrent state of"},
	} {
		cfg := llama31(t)
		for k, v := range c.set {
			cfg[k] = v
		}
		m, err := fromMap(t, cfg)
		require.ErrorIs(t, err, driver.ErrInvalid, c.want)
		require.ErrorContains(t, err, c.want)
		require.Equal(t, Model{}, m)
	}
}

func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// TestPagedHybridHeld: Gemma 3 27B, a 32k-token sequence in 16-token
// blocks. vLLM's groups are of 10 layers (its 10 full ones): one full
// group of 2,048 blocks, six window groups (52 layers, the last of 2
// padded to 10) of 64 blocks each (the 1,984 wholly behind the window
// freed). Held: 389,120 layer-blocks' rows against the exact need's
// 380,928: 2.15% over.
func TestPagedHybridHeld(t *testing.T) {
	g, err := ModelPreset("gemma-3-27b")
	require.NoError(t, err)
	row := g.LayerTokenBytes() // 8 KiB: a token of one layer
	held, per := g.PagedHybridHeld(32768, 16)
	require.Equal(t, []uint64{2048 * 16 * 10 * row, 6 * 64 * 16 * 10 * row}, per)
	require.Equal(t, per[0]+per[1], held)
	need := g.ExactNeed(32768)
	require.Equal(t, (32768*10+1024*52)*row, need)
	require.InDelta(t, 1.0215, float64(held)/float64(need), 0.0001)

	// A uniform model is its block table: whole blocks of every layer.
	l, err := ModelPreset("llama3-8b")
	require.NoError(t, err)
	held, _ = l.PagedHybridHeld(1000, 16)
	require.Equal(t, uint64(63*16)*l.TokenBytes(), held)

	// 12 full and 13 window layers: groups of 13, the full one padded.
	w := Model{Name: "w", Layers: 25, KVHeads: 1, HeadDim: 64, ElemBytes: 2, QueryHeads: 1, SlidingWindow: 32, WindowLayers: 13}
	_, per = w.PagedHybridHeld(64, 16)
	require.Equal(t, []uint64{4 * 16 * 13 * w.LayerTokenBytes(), 2 * 16 * 13 * w.LayerTokenBytes()}, per) // blocks 2 and 3: tokens 33 to 63 are in the window

	q, err := ModelPreset("qwen3-next-80b-a3b")
	require.NoError(t, err)
	held, per = q.PagedHybridHeld(32768, 16)
	require.Equal(t, []uint64{2048 * 16 * q.TokenBytes(), 3 * 12 * 1_097_728}, per)
	require.Equal(t, per[0]+per[1], held)
	held, per = q.PagedHybridHeld(-1, 16)
	require.Zero(t, held)
	require.Nil(t, per)
}
