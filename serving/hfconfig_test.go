package serving

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
)

// presetConfigs are the testdata/models directories (config.json files
// written from the Hugging Face repositories testdata/models/README.md
// names) whose model each preset is.
var presetConfigs = map[string]string{
	"llama-7b":           "llama-7b",
	"llama3-8b":          "Meta-Llama-3-8B",
	"llama3.1-8b":        "Llama-3.1-8B",
	"llama3.1-70b":       "Llama-3.3-70B-Instruct",
	"llama3.3-70b":       "Llama-3.3-70B-Instruct",
	"qwen2.5-7b":         "Qwen2.5-7B-Instruct",
	"mistral-7b":         "Mistral-7B-v0.1",
	"deepseek-v2-lite":   "DeepSeek-V2-Lite",
	"deepseek-v3":        "DeepSeek-V3",
	"gemma-3-27b":        "gemma-3-27b-it",
	"gpt-oss-120b":       "gpt-oss-120b",
	"qwen3-next-80b-a3b": "Qwen3-Next-80B-A3B-Instruct",
}

// TestPresetsAreTheirConfigs reads each preset's config.json and requires
// the preset's Model, parameter estimate included.
func TestPresetsAreTheirConfigs(t *testing.T) {
	require.Len(t, presetConfigs, len(modelPresets))
	for preset, dir := range presetConfigs {
		want, err := ModelPreset(preset)
		require.NoError(t, err, preset)
		got, err := LoadModel(filepath.Join("testdata", "models", dir))
		require.NoError(t, err, dir)
		require.Equal(t, dir, got.Name, "a directory's model is named after it")
		got.Name = preset
		require.Equal(t, want, got, preset)
	}
}

// TestPresetParams are the published parameter counts the estimate meets
// exactly (the checkpoints' tensors summed), and the MoE models' totals to
// the model cards' precision.
func TestPresetParams(t *testing.T) {
	for preset, want := range map[string]int64{
		"llama-7b":     6_738_415_616,
		"llama3-8b":    8_030_261_248,
		"llama3.3-70b": 70_553_706_496,
		"qwen2.5-7b":   7_615_616_512,
		"mistral-7b":   7_241_732_096,
	} {
		m, err := ModelPreset(preset)
		require.NoError(t, err)
		require.Equal(t, want, m.Params, preset)
		require.Zero(t, m.ActiveParams, preset)
	}
	v2, err := ModelPreset("deepseek-v2-lite")
	require.NoError(t, err)
	require.InDelta(t, 15.7e9, float64(v2.Params), 0.05e9)
	v3, err := ModelPreset("deepseek-v3")
	require.NoError(t, err)
	require.InDelta(t, 671e9, float64(v3.Params), 0.5e9)
	require.InDelta(t, 37e9, float64(v3.ActiveParams), 1e9)
}

// llama31 is Llama-3.1-8B's config.json as a map, to take fields from.
func llama31(t *testing.T) map[string]any {
	data, err := os.ReadFile("testdata/models/Llama-3.1-8B/config.json")
	require.NoError(t, err)
	var c map[string]any
	require.NoError(t, json.Unmarshal(data, &c))
	return c
}

func fromMap(t *testing.T, c map[string]any) (Model, error) {
	data, err := json.Marshal(c)
	require.NoError(t, err)
	return ModelFromConfig("test", data)
}

func TestModelFromConfigFields(t *testing.T) {
	// Without num_key_value_heads: multi-head attention.
	c := llama31(t)
	delete(c, "num_key_value_heads")
	m, err := fromMap(t, c)
	require.NoError(t, err)
	require.Equal(t, 32, m.KVHeads)
	require.Equal(t, uint64(2*32*32*128*2), m.TokenBytes())

	// null is absent too.
	c["num_key_value_heads"] = nil
	m, err = fromMap(t, c)
	require.NoError(t, err)
	require.Equal(t, 32, m.KVHeads)

	// head_dim wins over hidden_size / num_attention_heads (Gemma's 256
	// over 3072/16 = 192), and dtype over torch_dtype; float32 is 4 bytes.
	c = llama31(t)
	c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"] = 3072, 16, 16, 256
	delete(c, "torch_dtype")
	c["dtype"] = "float32"
	m, err = fromMap(t, c)
	require.NoError(t, err)
	require.Equal(t, 256, m.HeadDim)
	require.Equal(t, 4, m.ElemBytes)
	require.Equal(t, uint64(2*32*16*256*4), m.TokenBytes())

	// A multimodal model's language model is its text_config.
	outer := map[string]any{"model_type": "llava", "torch_dtype": "bfloat16", "text_config": llama31(t)}
	delete(outer["text_config"].(map[string]any), "torch_dtype")
	m, err = fromMap(t, outer)
	require.NoError(t, err)
	l31, err := ModelPreset("llama3.1-8b")
	require.NoError(t, err)
	l31.Name = "test"
	require.Equal(t, l31, m)
}

func TestModelFromConfigWindow(t *testing.T) {
	// Mistral 7B v0.1: every layer.
	m, err := LoadModel("testdata/models/Mistral-7B-v0.1/config.json")
	require.NoError(t, err)
	require.Equal(t, "Mistral-7B-v0.1", m.Name)
	require.Equal(t, 4096, m.SlidingWindow)
	require.Equal(t, 32, m.WindowLayers)
	require.Equal(t, uint64(2*32*8*128*2), m.TokenBytes(), "the window does not change what a token keeps")

	// Qwen2.5 gives a window it does not use.
	m, err = LoadModel("testdata/models/Qwen2.5-7B-Instruct")
	require.NoError(t, err)
	require.Zero(t, m.SlidingWindow)
	require.Zero(t, m.WindowLayers)
	require.Equal(t, uint64(2*28*4*128*2), m.TokenBytes())

	// Alternating layers, as layer_types says (Gemma 2, gpt-oss).
	c := llama31(t)
	c["sliding_window"] = 4096
	c["layer_types"] = slices.Repeat([]string{"sliding_attention", "full_attention"}, 16)
	m, err = fromMap(t, c)
	require.NoError(t, err)
	require.Equal(t, 4096, m.SlidingWindow)
	require.Equal(t, 16, m.WindowLayers)

	// layer_types without a sliding layer: no window, whatever
	// sliding_window says.
	c["layer_types"] = repeat("full_attention", 32)
	m, err = fromMap(t, c)
	require.NoError(t, err)
	require.Zero(t, m.SlidingWindow)

	// A null window is none.
	c = llama31(t)
	c["sliding_window"] = nil
	m, err = fromMap(t, c)
	require.NoError(t, err)
	require.Zero(t, m.SlidingWindow)
}

// TestModelFromConfigChunked: Llama 4's chunked local attention is read as
// a window of its chunk, on the layers that use RoPE (by default all but
// every 4th), from a multimodal config's text_config too. The configs are
// Llama 3.1's with Llama 4's fields added, not copies of a Llama 4 file.
func TestModelFromConfigChunked(t *testing.T) {
	c := llama31(t)
	c["sliding_window"] = nil
	c["attention_chunk_size"] = 8192
	c["no_rope_layers"] = []int{}
	m, err := fromMap(t, c)
	require.NoError(t, err)
	require.Equal(t, 8192, m.SlidingWindow)
	require.Equal(t, 24, m.WindowLayers, "32 layers, every 4th global")

	c["no_rope_layer_interval"] = 2
	m, err = fromMap(t, c)
	require.NoError(t, err)
	require.Equal(t, 16, m.WindowLayers)
	delete(c, "no_rope_layer_interval")

	rope := make([]int, 32)
	for i := range rope {
		if i%3 != 0 {
			rope[i] = 1
		}
	}
	c["no_rope_layers"] = rope
	m, err = fromMap(t, c)
	require.NoError(t, err)
	require.Equal(t, 21, m.WindowLayers, "the layers no_rope_layers marks 1")

	c["layer_types"] = slices.Repeat([]string{"chunked_attention", "chunked_attention", "chunked_attention", "full_attention"}, 8)
	m, err = fromMap(t, c)
	require.NoError(t, err)
	require.Equal(t, 24, m.WindowLayers, "layer_types first")
	require.Equal(t, 8192, m.SlidingWindow)

	// In a multimodal config's text_config.
	text := llama31(t)
	text["sliding_window"] = nil
	text["attention_chunk_size"] = 8192
	m, err = fromMap(t, map[string]any{"text_config": text, "torch_dtype": "bfloat16"})
	require.NoError(t, err)
	require.Equal(t, 24, m.WindowLayers)

	// Fewer layers than the default interval: all of them chunked, as
	// transformers' default pattern has them.
	short := llama31(t)
	short["sliding_window"], short["attention_chunk_size"], short["num_hidden_layers"] = nil, 8192, 3
	m, err = fromMap(t, short)
	require.NoError(t, err)
	require.Equal(t, 3, m.WindowLayers)

	// No chunk, a zero or a null one: full attention.
	for _, chunk := range []any{0, nil} {
		c := llama31(t)
		c["sliding_window"] = nil
		c["attention_chunk_size"] = chunk
		m, err := fromMap(t, c)
		require.NoError(t, err)
		require.Zero(t, m.WindowLayers)
	}

	for _, tc := range []struct {
		name   string
		edit   func(c map[string]any)
		errMsg string
	}{
		{"no_rope_layers too short", func(c map[string]any) { c["no_rope_layers"] = []int{1, 0} }, "no_rope_layers has 2 entries for 32 num_hidden_layers"},
		{"no_rope_layers not 0 or 1", func(c map[string]any) {
			r := make([]int, 32)
			r[5] = 2
			c["no_rope_layers"] = r
		}, "no_rope_layers[5] is 2, want 1 (RoPE, chunked attention) or 0 (global attention)"},
		{"a zero interval", func(c map[string]any) { c["no_rope_layer_interval"] = 0 }, `"no_rope_layer_interval" is 0, want 1 to 32`},
		{"a negative chunk", func(c map[string]any) { c["attention_chunk_size"] = -1 }, `"attention_chunk_size" is -1`},
		{"a window and a chunk", func(c map[string]any) { c["sliding_window"] = 4096 }, `both "sliding_window" and chunked layers ("attention_chunk_size"): one window size is read`},
		{"chunked layer_types without a chunk", func(c map[string]any) {
			delete(c, "attention_chunk_size")
			c["layer_types"] = repeat("chunked_attention", 32)
		}, `layer_types names 32 "chunked_attention" layers but there is no "attention_chunk_size": add the chunk in tokens`},
		{"sliding and chunked layer_types", func(c map[string]any) {
			c["layer_types"] = slices.Repeat([]string{"chunked_attention", "sliding_attention"}, 16)
		}, `layer_types names both "sliding_attention" and "chunked_attention" layers: one window size is read`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := llama31(t)
			c["sliding_window"] = nil
			c["attention_chunk_size"] = 8192
			tc.edit(c)
			m, err := fromMap(t, c)
			require.ErrorIs(t, err, driver.ErrInvalid)
			require.ErrorContains(t, err, "serving: test: "+tc.errMsg)
			require.Equal(t, Model{}, m)
		})
	}
}

func TestModelFromConfigLatent(t *testing.T) {
	m, err := LoadModel("testdata/models/DeepSeek-V2-Lite")
	require.NoError(t, err)
	require.True(t, m.Latent)
	require.Equal(t, 1, m.KVHeads)
	require.Equal(t, 512+64, m.HeadDim)
	require.Equal(t, 16, m.QueryHeads)
	// One latent a layer, not a key and a value of 16 heads: 27 * 576 * 2.
	require.Equal(t, uint64(27*576*2), m.TokenBytes())
	require.Equal(t, uint64(31104), m.TokenBytes())
	m, err = LoadModel("testdata/models/DeepSeek-V3")
	require.NoError(t, err)
	require.Equal(t, uint64(61*576*2), m.TokenBytes())
}

// TestModelFromConfigRefused: a missing field is named with what to add;
// a value no model has is refused.
func TestModelFromConfigRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		edit   func(c map[string]any)
		errMsg string
	}{
		{"no layers", func(c map[string]any) { delete(c, "num_hidden_layers") }, `no "num_hidden_layers": add it, the number of decoder layers`},
		{"no heads", func(c map[string]any) { delete(c, "num_attention_heads") }, `no "num_attention_heads": add it`},
		{"no hidden", func(c map[string]any) { delete(c, "hidden_size") }, `no "hidden_size": add it`},
		{"no dtype", func(c map[string]any) { delete(c, "torch_dtype") }, `no "torch_dtype" (or "dtype"): add`},
		{"no vocab", func(c map[string]any) { delete(c, "vocab_size") }, `no "vocab_size": add it`},
		{"no mlp", func(c map[string]any) { delete(c, "intermediate_size") }, `no "intermediate_size": add it, the width of the MLP`},
		{"zero layers", func(c map[string]any) { c["num_hidden_layers"] = 0 }, `"num_hidden_layers" is 0, want 1 to 65536`},
		{"negative heads", func(c map[string]any) { c["num_key_value_heads"] = -8 }, `"num_key_value_heads" is -8, want 1 to 65536`},
		{"huge head", func(c map[string]any) { c["head_dim"] = 1 << 20 }, `"head_dim" is 1048576, want 1 to 65536`},
		{"fractional layers", func(c map[string]any) { c["num_hidden_layers"] = 32.5 }, "not a config.json"},
		{"layers as text", func(c map[string]any) { c["num_hidden_layers"] = "32" }, "not a config.json"},
		{"heads that do not divide", func(c map[string]any) { c["num_key_value_heads"] = 7 }, "num_attention_heads 32 is not a multiple of num_key_value_heads 7"},
		{"width that does not divide", func(c map[string]any) { c["hidden_size"] = 4097 }, `hidden_size 4097 is not a multiple of num_attention_heads 32: add "head_dim"`},
		{"int8", func(c map[string]any) { c["torch_dtype"] = "int8" }, `dtype "int8", want bfloat16, float16 or float32`},
		{"negative window", func(c map[string]any) { c["sliding_window"] = -1 }, `"sliding_window" is -1`},
		{"layer_types too short", func(c map[string]any) { c["layer_types"] = []string{"sliding_attention"} }, "layer_types has 1 entries for 32 num_hidden_layers"},
		{"layer_types without a window", func(c map[string]any) {
			c["layer_types"] = repeat("sliding_attention", 32)
		}, `layer_types names 32 "sliding_attention" layers but there is no "sliding_window": add the window in tokens`},
		{"too many parameters", func(c map[string]any) { c["vocab_size"] = 1 << 24; c["hidden_size"] = 1 << 20; c["head_dim"] = 128 }, "an estimated 3.697e+13 parameters, more than the 1.759e+13 a model may have"},
		{"latent without rope", func(c map[string]any) { c["kv_lora_rank"] = 512 }, `no "qk_rope_head_dim": add it`},
		{"experts without routing", func(c map[string]any) { c["num_local_experts"] = 8 }, `no "num_experts_per_tok": add it`},
		{"negative experts", func(c map[string]any) { c["num_local_experts"] = -8 }, `"num_local_experts" is -8, want 1 to 16384`},
		{"routed to more than there are", func(c map[string]any) { c["num_local_experts"] = 8; c["num_experts_per_tok"] = 9 }, `"num_experts_per_tok" is 9, want 1 to 8`},
		{"more dense layers than layers", func(c map[string]any) {
			c["n_routed_experts"], c["num_experts_per_tok"], c["first_k_dense_replace"] = 8, 2, 33
		}, "first_k_dense_replace is 33, want 0 to num_hidden_layers 32"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := llama31(t)
			tc.edit(c)
			m, err := fromMap(t, c)
			require.ErrorIs(t, err, driver.ErrInvalid)
			require.ErrorContains(t, err, "serving: test: "+tc.errMsg)
			require.Equal(t, Model{}, m)
		})
	}
	_, err := ModelFromConfig("test", []byte("{"))
	require.ErrorIs(t, err, driver.ErrInvalid)
	require.ErrorContains(t, err, "serving: test: not a config.json")
}

// TestModelFromConfigMoE counts a Mixtral-shaped mixture of experts:
// every layer's MLP is 8 experts of which a token goes through 2.
func TestModelFromConfigMoE(t *testing.T) {
	c := llama31(t)
	c["vocab_size"], c["num_local_experts"], c["num_experts_per_tok"] = 32000, 8, 2
	m, err := fromMap(t, c)
	require.NoError(t, err)
	embed := int64(2 * 32000 * 4096)
	attn := int64(2*4096*4096 + 2*4096*1024)
	expert := int64(3 * 4096 * 14336)
	common := embed + 32*(attn+2*4096+8*4096) + 4096
	require.Equal(t, common+32*8*expert, m.Params)
	require.Equal(t, common+32*2*expert, m.ActiveParams)
	require.Equal(t, []int{8, 2}, []int{m.Experts, m.ExpertsPerToken})
	require.InDelta(t, 46.7e9, float64(m.Params), 0.1e9, "Mixtral 8x7B's published 46.7 B")
}

func TestLoadModel(t *testing.T) {
	m, err := LoadModel("llama3-8b")
	require.NoError(t, err)
	require.Equal(t, "llama3-8b", m.Name)

	_, err = LoadModel("gpt2")
	require.ErrorIs(t, err, driver.ErrInvalid)
	require.ErrorContains(t, err, `serving: no model preset "gpt2", want one of deepseek-v2-lite, deepseek-v3, gemma-3-27b, `)
	require.ErrorContains(t, err, "or the path of a Hugging Face config.json")

	dir := t.TempDir()
	_, err = LoadModel(filepath.Join(dir, "config.json"))
	require.ErrorIs(t, err, driver.ErrInvalid)
	require.ErrorIs(t, err, os.ErrNotExist, "the file's error is kept")
	require.ErrorContains(t, err, "serving: model config: open ")

	_, err = LoadModel(dir) // a directory without a config.json
	require.ErrorIs(t, err, driver.ErrInvalid)
	require.ErrorContains(t, err, "config.json")

	other := filepath.Join(dir, "mymodel.json")
	data, err := os.ReadFile("testdata/models/Mistral-7B-v0.1/config.json")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(other, data, 0o600))
	m, err = LoadModel(other)
	require.NoError(t, err)
	require.Equal(t, "mymodel", m.Name)
	require.Equal(t, 4096, m.SlidingWindow)
}

// FuzzModelFromConfig: any input is a model check accepts or an error
// marked driver.ErrInvalid, never a panic.
func FuzzModelFromConfig(f *testing.F) {
	for _, dir := range presetConfigs {
		data, err := os.ReadFile(filepath.Join("testdata", "models", dir, "config.json"))
		require.NoError(f, err)
		f.Add(data)
	}
	f.Add([]byte(`{"num_hidden_layers": 1, "num_attention_heads": 1, "hidden_size": 1, "intermediate_size": 1, "vocab_size": 1, "dtype": "float32", "kv_lora_rank": -1, "qk_rope_head_dim": 1, "qk_nope_head_dim": 1, "v_head_dim": 1}`))
	f.Add([]byte(`{"num_hidden_layers": 4, "num_attention_heads": 2, "hidden_size": 8, "intermediate_size": 8, "vocab_size": 8, "dtype": "bfloat16", "layer_types": ["mamba", "attention", "mamba", "sliding_attention"], "sliding_window": 4, "mamba_n_heads": 2, "mamba_d_head": 4, "mamba_d_state": 8, "mamba_d_conv": 4}`))
	f.Add([]byte(`{"text_config": {"model_type": "gemma3_text", "num_hidden_layers": 7, "num_attention_heads": 2, "hidden_size": 8, "intermediate_size": 8, "sliding_window": 16}, "torch_dtype": "bfloat16"}`))
	f.Add([]byte(`{"text_config": {"num_hidden_layers": 8, "num_attention_heads": 2, "hidden_size": 8, "intermediate_size": 8, "vocab_size": 8, "attention_chunk_size": 16, "no_rope_layers": [1, 1, 1, 0, 1, 1, 1, 0]}, "torch_dtype": "bfloat16"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ModelFromConfig("fuzz", data)
		if err != nil {
			require.ErrorIs(t, err, driver.ErrInvalid)
			return
		}
		require.NoError(t, m.check())
		require.NotZero(t, m.TokenBytes())
	})
}
