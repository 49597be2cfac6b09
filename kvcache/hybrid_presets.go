package kvcache

import (
	"slices"
	"strings"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/tensor"
)

// hybridPresets are the layer groups of public models, from the fields
// of their Hugging Face config.json (named beside each); bf16 is kept as
// Float16 (2 bytes). They set Groups and DType only.
var hybridPresets = map[string]HybridConfig{
	// google/gemma-3-27b-it, text_config: num_hidden_layers 62,
	// num_key_value_heads 16, head_dim 128, sliding_window 1024,
	// sliding_window_pattern 6 (five local layers, then one global: layers
	// 5, 11, ..., 59 global, 10 of them; 52 local).
	"gemma-3-27b": {Groups: []Group{
		{Kind: FullAttention, Layers: 10, KVHeads: 16, HeadDim: 128},
		{Kind: SlidingWindow, Layers: 52, KVHeads: 16, HeadDim: 128, Window: 1024},
	}, DType: tensor.Float16},
	// mistralai/Mistral-7B-v0.1: num_hidden_layers 32,
	// num_key_value_heads 8, hidden_size 4096 / num_attention_heads 32 =
	// head_dim 128, sliding_window 4096 on every layer.
	"mistral-7b": {Groups: []Group{
		{Kind: SlidingWindow, Layers: 32, KVHeads: 8, HeadDim: 128, Window: 4096},
	}, DType: tensor.Float16},
	// deepseek-ai/DeepSeek-V3: num_hidden_layers 61, kv_lora_rank 512 +
	// qk_rope_head_dim 64 = one latent row of 576 a layer and a token
	// (70,272 bytes a token, as Preset("deepseek-v3")'s K and V of 288).
	"deepseek-v3": {Groups: []Group{
		{Kind: Latent, Layers: 61, KVHeads: 1, HeadDim: 576},
	}, DType: tensor.Float16},
	// Qwen/Qwen3-Next-80B-A3B-Instruct: num_hidden_layers 48,
	// full_attention_interval 4 (every fourth layer full attention: 12;
	// the other 36 Gated DeltaNet linear attention), num_key_value_heads
	// 2, head_dim 256; linear_num_key_heads 16, linear_num_value_heads 32,
	// linear_key_head_dim 128, linear_value_head_dim 128,
	// linear_conv_kernel_dim 4. A linear layer's state: the recurrent
	// state 32 x 128 x 128 and the convolution's last 3 inputs of
	// 2*16*128 + 32*128 = 8,192 channels, (524,288 + 24,576) x 2 bytes =
	// 1,097,728.
	"qwen3-next-80b-a3b": {Groups: []Group{
		{Kind: FullAttention, Layers: 12, KVHeads: 2, HeadDim: 256},
		{Kind: Recurrent, Layers: 36, StateBytes: 1_097_728},
	}, DType: tensor.Float16},
	// openai/gpt-oss-120b: num_hidden_layers 36, layer_types alternating
	// "sliding_attention" and "full_attention" (18 each),
	// sliding_window 128, num_key_value_heads 8, head_dim 64.
	"gpt-oss-120b": {Groups: []Group{
		{Kind: FullAttention, Layers: 18, KVHeads: 8, HeadDim: 64},
		{Kind: SlidingWindow, Layers: 18, KVHeads: 8, HeadDim: 64, Window: 128},
	}, DType: tensor.Float16},
}

// HybridPresets lists the names HybridPreset knows, sorted.
func HybridPresets() []string {
	names := make([]string, 0, len(hybridPresets))
	for n := range hybridPresets {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// HybridPreset returns the layer groups and dtype of a public model; the
// caller fills in the rest. An unknown name is ErrInvalid.
func HybridPreset(name string) (HybridConfig, error) {
	cfg, ok := hybridPresets[name]
	if !ok {
		return HybridConfig{}, errors.Wrapf(driver.ErrInvalid, "kvcache: no hybrid preset %q (known: %s)", name, strings.Join(HybridPresets(), ", "))
	}
	cfg.Groups = slices.Clone(cfg.Groups)
	return cfg, nil
}
