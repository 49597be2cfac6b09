package serving

// A model read from a Hugging Face config.json: the KV shape, the element
// size and an estimate of the parameters, from the fields transformers
// writes for Llama, Mistral, Qwen, DeepSeek and their kin.

import (
	"encoding/json"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// hfConfig holds the fields of a config.json ModelFromConfig reads; a nil
// field is one the file does not give (or gives as null).
type hfConfig struct {
	ModelType         string  `json:"model_type"`
	NumHiddenLayers   *int    `json:"num_hidden_layers"`
	NumAttentionHeads *int    `json:"num_attention_heads"`
	NumKeyValueHeads  *int    `json:"num_key_value_heads"`
	HiddenSize        *int    `json:"hidden_size"`
	HeadDim           *int    `json:"head_dim"`
	IntermediateSize  *int    `json:"intermediate_size"`
	VocabSize         *int    `json:"vocab_size"`
	TieWordEmbeddings *bool   `json:"tie_word_embeddings"`
	AttentionBias     *bool   `json:"attention_bias"`
	TorchDType        *string `json:"torch_dtype"`
	DType             *string `json:"dtype"`

	SlidingWindow    *int     `json:"sliding_window"`
	UseSlidingWindow *bool    `json:"use_sliding_window"`
	LayerTypes       []string `json:"layer_types"`
	// Gemma 3: every sliding_window_pattern-th layer is full attention.
	SlidingWindowPattern *int `json:"sliding_window_pattern"`
	// Llama 4's chunked local attention: a layer that uses RoPE
	// (no_rope_layers' 1s; by default all but every
	// no_rope_layer_interval-th, 4) attends within its chunk of
	// attention_chunk_size tokens.
	AttentionChunkSize  *int  `json:"attention_chunk_size"`
	NoRopeLayers        []int `json:"no_rope_layers"`
	NoRopeLayerInterval *int  `json:"no_rope_layer_interval"`

	// Linear attention (Qwen3-Next's Gated DeltaNet): every
	// full_attention_interval-th layer is full attention where layer_types
	// does not say.
	FullAttentionInterval *int `json:"full_attention_interval"`
	LinearNumKeyHeads     *int `json:"linear_num_key_heads"`
	LinearNumValueHeads   *int `json:"linear_num_value_heads"`
	LinearKeyHeadDim      *int `json:"linear_key_head_dim"`
	LinearValueHeadDim    *int `json:"linear_value_head_dim"`
	LinearConvKernelDim   *int `json:"linear_conv_kernel_dim"`

	// Mamba layers: Granite 4's Mamba-2 (mamba_n_heads, mamba_d_head,
	// mamba_n_groups; layer_types "mamba") and Jamba's Mamba
	// (mamba_expand; attention every attn_layer_period-th layer from
	// attn_layer_offset).
	MambaDState     *int `json:"mamba_d_state"`
	MambaDConv      *int `json:"mamba_d_conv"`
	MambaExpand     *int `json:"mamba_expand"`
	MambaNHeads     *int `json:"mamba_n_heads"`
	MambaDHead      *int `json:"mamba_d_head"`
	MambaNGroups    *int `json:"mamba_n_groups"`
	AttnLayerPeriod *int `json:"attn_layer_period"`
	AttnLayerOffset *int `json:"attn_layer_offset"`

	// Multi-head latent attention (DeepSeek-V2, V3).
	KVLoraRank    *int `json:"kv_lora_rank"`
	QLoraRank     *int `json:"q_lora_rank"`
	QKRopeHeadDim *int `json:"qk_rope_head_dim"`
	QKNopeHeadDim *int `json:"qk_nope_head_dim"`
	VHeadDim      *int `json:"v_head_dim"`

	// A mixture of experts: DeepSeek's n_routed_experts, Mixtral's
	// num_local_experts, Qwen-MoE's num_experts.
	NRoutedExperts               *int `json:"n_routed_experts"`
	NumLocalExperts              *int `json:"num_local_experts"`
	NumExperts                   *int `json:"num_experts"`
	NumExpertsPerTok             *int `json:"num_experts_per_tok"`
	NSharedExperts               *int `json:"n_shared_experts"`
	MoEIntermediateSize          *int `json:"moe_intermediate_size"`
	SharedExpertIntermediateSize *int `json:"shared_expert_intermediate_size"`
	FirstKDenseReplace           *int `json:"first_k_dense_replace"`

	// TextConfig is a multimodal model's language model (Gemma 3, Llama
	// 4, Mistral 3), read where the top level has no num_hidden_layers.
	TextConfig json.RawMessage `json:"text_config"`
}

// Bounds on a config's sizes past ModelFromConfig's dimension bound
// (maxModelDim): far above any published model.
const (
	maxConfigWidth   = 1 << 20 // hidden_size, intermediate sizes, ranks
	maxConfigVocab   = 1 << 24 // vocab_size
	maxConfigExperts = 1 << 14 // experts
)

// configDTypes are the element sizes of the dtypes a config names.
var configDTypes = map[string]int{"bfloat16": 2, "float16": 2, "float32": 4}

// ModelFromConfig is the model a Hugging Face config.json describes,
// labelled name:
//
//   - Layers is num_hidden_layers; QueryHeads num_attention_heads; KVHeads
//     num_key_value_heads (num_attention_heads where absent or null:
//     multi-head attention); HeadDim head_dim, else hidden_size /
//     num_attention_heads.
//   - With kv_lora_rank (DeepSeek-V2 and V3's multi-head latent
//     attention) each token keeps one latent vector a layer: Latent,
//     KVHeads 1, HeadDim kv_lora_rank + qk_rope_head_dim.
//   - ElemBytes comes from dtype or torch_dtype: bfloat16 and float16 are
//     2 bytes, float32 4.
//   - SlidingWindow is sliding_window, unless use_sliding_window is false
//     (Qwen2's configs give a window they do not use); WindowLayers counts
//     the "sliding_attention" entries of layer_types where the config has
//     them (models that alternate: Gemma 2 and 3, gpt-oss), else every
//     layer (Mistral 7B v0.1). A config that alternates without
//     layer_types (older Gemma 2 files) is read as windowed everywhere.
//     Llama 4's chunked local attention (attention_chunk_size, on the
//     layers no_rope_layers marks 1, by default all but every 4th; or
//     layer_types' "chunked_attention") is read as a window of the
//     chunk's size: an upper bound of what a chunked layer keeps.
//   - Params (and ActiveParams, for a mixture of experts) are estimated,
//     not read: no config gives them. The estimate counts the embeddings
//     (twice unless tie_word_embeddings), each layer's attention
//     projections (Qwen2's q, k and v biases, attention_bias's), a gated
//     MLP of three matrices (SwiGLU, as all these models have) or the
//     experts (routed, shared and the router), and the norms; it is exact
//     for the Llama, Mistral and Qwen2.5 checkpoints and DeepSeek-V2-Lite,
//     and ignores small terms others add (Qwen3's q and k norms, expert
//     score biases) and sparse-step layouts other than DeepSeek's
//     first_k_dense_replace.
//
// A missing field is an error marked driver.ErrInvalid that names it and
// says what to add; so is a value no model has (a zero or negative size,
// heads that do not divide, an unknown dtype).
func ModelFromConfig(name string, data []byte) (Model, error) {
	if len(data) > MaxConfigBytes {
		return Model{}, errors.Wrapf(driver.ErrInvalid, "serving: %s: a config of %d bytes, more than %d (MaxConfigBytes)", name, len(data), MaxConfigBytes)
	}
	var c hfConfig
	if err := json.Unmarshal(data, &c); err != nil {
		return Model{}, errors.Wrapf(driver.ErrInvalid, "serving: %s: not a config.json: %v", name, err)
	}
	if c.NumHiddenLayers == nil && len(c.TextConfig) > 0 {
		var text hfConfig
		if err := json.Unmarshal(c.TextConfig, &text); err != nil {
			return Model{}, errors.Wrapf(driver.ErrInvalid, "serving: %s: text_config: %v", name, err)
		}
		if text.TorchDType == nil && text.DType == nil {
			text.TorchDType, text.DType = c.TorchDType, c.DType
		}
		c = text
	}
	r := configReader{name: name}
	m := r.model(&c)
	if r.err != nil {
		return Model{}, r.err
	}
	m.Name = name
	if err := m.check(); err != nil {
		return Model{}, err
	}
	return m, nil
}

// configReader reads a config's fields, keeping the first error.
type configReader struct {
	name string
	err  error
}

// fail records the first error: the config's name, then format.
func (r *configReader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = errors.Wrapf(driver.ErrInvalid, "serving: %s: "+format, append([]any{r.name}, args...)...)
	}
}

// need is the value of a field the model needs, between 1 and most; what
// says what the field is, for the error that asks to add it.
func (r *configReader) need(field string, v *int, most int, what string) int {
	if v == nil {
		r.fail("no %q: add it, %s", field, what)
		return 1
	}
	return r.within(field, *v, most)
}

// within refuses a size outside 1 to most.
func (r *configReader) within(field string, v, most int) int {
	if v < 1 || v > most {
		r.fail("%q is %d, want 1 to %d", field, v, most)
		return 1
	}
	return v
}

// orDefault is *v, or def where the field is absent.
func orDefault(v *int, def int) int {
	if v == nil {
		return def
	}
	return *v
}

func (r *configReader) model(c *hfConfig) Model {
	layers := r.need("num_hidden_layers", c.NumHiddenLayers, maxModelDim, "the number of decoder layers")
	heads := r.need("num_attention_heads", c.NumAttentionHeads, maxModelDim, "the number of query heads")
	hidden := r.need("hidden_size", c.HiddenSize, maxConfigWidth, "the model's width")
	m := Model{Layers: layers, QueryHeads: heads}

	dtype := c.TorchDType
	if c.DType != nil {
		dtype = c.DType
	}
	if dtype == nil {
		r.fail(`no "torch_dtype" (or "dtype"): add the dtype the KV is kept in, "bfloat16", "float16" or "float32"`)
	} else if m.ElemBytes = configDTypes[*dtype]; m.ElemBytes == 0 {
		r.fail("dtype %q, want bfloat16, float16 or float32", *dtype)
	}

	latent := c.KVLoraRank != nil && *c.KVLoraRank != 0
	if latent {
		rank := r.within("kv_lora_rank", *c.KVLoraRank, maxConfigWidth)
		rope := r.need("qk_rope_head_dim", c.QKRopeHeadDim, maxModelDim, "the rotary part of a query or key head (64 for DeepSeek)")
		m.Latent, m.KVHeads, m.HeadDim = true, 1, rank+rope
	} else {
		m.KVHeads = heads
		if c.NumKeyValueHeads != nil {
			m.KVHeads = r.within("num_key_value_heads", *c.NumKeyValueHeads, maxModelDim)
		}
		if heads%m.KVHeads != 0 {
			r.fail("num_attention_heads %d is not a multiple of num_key_value_heads %d", heads, m.KVHeads)
		}
		if c.HeadDim != nil {
			m.HeadDim = r.within("head_dim", *c.HeadDim, maxModelDim)
		} else if hidden%heads != 0 {
			r.fail(`hidden_size %d is not a multiple of num_attention_heads %d: add "head_dim"`, hidden, heads)
		} else {
			m.HeadDim = hidden / heads
		}
	}

	r.layers(c, &m, hidden)
	if r.err == nil {
		r.params(c, &m, hidden)
	}
	return m
}

// Layer kinds a config's layer_types names: attention of every token,
// of a window, and recurrent (linear attention, Mamba).
const (
	layerFull = iota
	layerWindow
	layerRecurrent
)

// layerTypeKinds are the layer_types entries the reader knows. A chunked
// layer (Llama 4's) is read as a window of its chunk (see layers).
var layerTypeKinds = map[string]int{
	"full_attention": layerFull, "attention": layerFull, "sliding_attention": layerWindow,
	"chunked_attention": layerWindow, "linear_attention": layerRecurrent, "mamba": layerRecurrent,
}

// llama4NoRopeInterval is Llama4TextConfig's no_rope_layer_interval
// default: every 4th layer is global attention without RoPE.
const llama4NoRopeInterval = 4

// gemma3Defaults are Gemma3TextConfig's defaults for what Gemma 3's
// text_config leaves out: a full layer every 6th, and the vocabulary.
const (
	gemma3Pattern = 6
	gemma3Vocab   = 262_208
)

// layers reads which layers are full, windowed and recurrent into m: from
// layer_types where the config has it; else Llama 4's
// attention_chunk_size with no_rope_layers, Gemma 3's
// sliding_window_pattern, Qwen3-Next's full_attention_interval or
// Jamba's attn_layer_period and attn_layer_offset; else every layer is
// windowed where there is a window (Mistral 7B v0.1) and full otherwise.
// A chunked layer is read as a window of attention_chunk_size tokens: it
// attends to at most that many either way, and the window keeps at least
// what the chunk does (at the chunk's end, the same), so the KV need it
// gives is an upper bound of the chunked layer's, about twice it on
// average over a long sequence. The recurrent layers' state is read from
// their fields (recurrentState).
func (r *configReader) layers(c *hfConfig, m *Model, hidden int) {
	kinds := make([]int, m.Layers)
	windowed := c.SlidingWindow != nil && (c.UseSlidingWindow == nil || *c.UseSlidingWindow)
	// chunked says the window layers are chunked ones (Llama 4's).
	chunked := false
	every := func(field string, v *int, offset int) {
		n := r.within(field, *v, m.Layers)
		for i := range kinds {
			if (i+1-offset)%n != 0 {
				kinds[i] = layerWindow
			}
		}
	}
	switch {
	case c.LayerTypes != nil:
		if len(c.LayerTypes) != m.Layers {
			r.fail("layer_types has %d entries for %d num_hidden_layers", len(c.LayerTypes), m.Layers)
			return
		}
		sliding := false
		for i, t := range c.LayerTypes {
			k, ok := layerTypeKinds[t]
			if !ok {
				r.fail("layer_types[%d] is %.40q, want full_attention, sliding_attention, chunked_attention, linear_attention, attention or mamba", i, t)
				return
			}
			kinds[i] = k
			chunked = chunked || t == "chunked_attention"
			sliding = sliding || t == "sliding_attention"
		}
		if chunked && sliding {
			r.fail(`layer_types names both "sliding_attention" and "chunked_attention" layers: one window size is read`)
			return
		}
	case c.AttentionChunkSize != nil && *c.AttentionChunkSize != 0:
		chunked = true
		if len(c.NoRopeLayers) > 0 {
			if len(c.NoRopeLayers) != m.Layers {
				r.fail("no_rope_layers has %d entries for %d num_hidden_layers", len(c.NoRopeLayers), m.Layers)
				return
			}
			for i, rope := range c.NoRopeLayers {
				if rope != 0 && rope != 1 {
					r.fail("no_rope_layers[%d] is %d, want 1 (RoPE, chunked attention) or 0 (global attention)", i, rope)
					return
				}
				if rope == 1 {
					kinds[i] = layerWindow
				}
			}
			break
		}
		if c.NoRopeLayerInterval != nil {
			every("no_rope_layer_interval", c.NoRopeLayerInterval, 0)
			break
		}
		// transformers' default, whatever the layer count: fewer than
		// 4 layers are all chunked.
		for i := range kinds {
			if (i+1)%llama4NoRopeInterval != 0 {
				kinds[i] = layerWindow
			}
		}
	case c.SlidingWindowPattern != nil || (c.ModelType == "gemma3_text" && windowed):
		pattern := gemma3Pattern
		if c.SlidingWindowPattern != nil {
			pattern = r.within("sliding_window_pattern", *c.SlidingWindowPattern, m.Layers)
		}
		every("sliding_window_pattern", &pattern, 0)
	case c.FullAttentionInterval != nil:
		every("full_attention_interval", c.FullAttentionInterval, 0)
		for i := range kinds {
			if kinds[i] == layerWindow {
				kinds[i] = layerRecurrent
			}
		}
	case c.AttnLayerPeriod != nil:
		period := r.within("attn_layer_period", *c.AttnLayerPeriod, m.Layers)
		offset := orDefault(c.AttnLayerOffset, 0)
		if offset < 0 || offset >= period {
			r.fail("attn_layer_offset is %d, want 0 to attn_layer_period-1 (%d)", offset, period-1)
			return
		}
		for i := range kinds {
			if i%period != offset {
				kinds[i] = layerRecurrent
			}
		}
	case windowed:
		for i := range kinds {
			kinds[i] = layerWindow
		}
	}
	if r.err != nil {
		return
	}
	counts := [3]int{}
	for _, k := range kinds {
		counts[k]++
	}
	switch {
	case counts[layerWindow] > 0 && chunked:
		if windowed {
			r.fail(`both "sliding_window" and chunked layers ("attention_chunk_size"): one window size is read`)
			return
		}
		if c.AttentionChunkSize == nil {
			r.fail(`layer_types names %d "chunked_attention" layers but there is no "attention_chunk_size": add the chunk in tokens`, counts[layerWindow])
			return
		}
		m.SlidingWindow = r.within("attention_chunk_size", *c.AttentionChunkSize, maxModelWindow)
		m.WindowLayers = counts[layerWindow]
	case counts[layerWindow] > 0 && windowed:
		m.SlidingWindow = r.within("sliding_window", *c.SlidingWindow, maxModelWindow)
		m.WindowLayers = counts[layerWindow]
	case counts[layerWindow] > 0 && c.SlidingWindow == nil && c.LayerTypes != nil:
		r.fail(`layer_types names %d "sliding_attention" layers but there is no "sliding_window": add the window in tokens`, counts[layerWindow])
		return
	}
	if counts[layerRecurrent] > 0 {
		if counts[layerRecurrent] == m.Layers {
			r.fail("every one of the %d layers is recurrent: want at least one attention layer", m.Layers)
			return
		}
		m.RecurrentLayers = counts[layerRecurrent]
		m.StateBytes = r.recurrentState(c, hidden, m.ElemBytes)
	}
}

// recurrentState is the bytes of one recurrent layer's state a sequence,
// in the model's dtype, as vLLM sizes it (its MambaStateShapeCalculator,
// vllm/model_executor/layers/mamba/mamba_utils.py): a convolution state of
// kernel-1 columns of the convolved channels, and the recurrent state.
//
//   - Gated DeltaNet (linear_*): conv channels 2*keyHeads*keyDim +
//     valueHeads*valueDim, state valueHeads*keyDim*valueDim.
//   - Mamba-2 (mamba_n_heads): inner mamba_n_heads*mamba_d_head, conv
//     channels inner + 2*mamba_n_groups*mamba_d_state, state
//     mamba_n_heads*mamba_d_head*mamba_d_state.
//   - Mamba (Jamba's): inner mamba_expand*hidden_size, conv channels
//     inner, state inner*mamba_d_state.
func (r *configReader) recurrentState(c *hfConfig, hidden, elem int) uint64 {
	var conv, kernel, state uint64
	switch {
	case c.LinearNumValueHeads != nil || c.LinearNumKeyHeads != nil:
		nk := uint64(r.need("linear_num_key_heads", c.LinearNumKeyHeads, maxModelDim, "the linear attention's key heads"))
		nv := uint64(r.need("linear_num_value_heads", c.LinearNumValueHeads, maxModelDim, "the linear attention's value heads"))
		dk := uint64(r.need("linear_key_head_dim", c.LinearKeyHeadDim, maxModelDim, "the linear attention's key head size"))
		dv := uint64(r.need("linear_value_head_dim", c.LinearValueHeadDim, maxModelDim, "the linear attention's value head size"))
		kernel = uint64(r.need("linear_conv_kernel_dim", c.LinearConvKernelDim, maxModelDim, "the linear attention's convolution width"))
		conv, state = 2*nk*dk+nv*dv, nv*dk*dv
	case c.MambaNHeads != nil:
		nh := uint64(r.within("mamba_n_heads", *c.MambaNHeads, maxModelDim))
		dh := uint64(r.need("mamba_d_head", c.MambaDHead, maxModelDim, "the size of a Mamba-2 head"))
		ds := uint64(r.need("mamba_d_state", c.MambaDState, maxModelDim, "the Mamba state's size"))
		ng := uint64(r.within("mamba_n_groups", orDefault(c.MambaNGroups, 1), maxModelDim))
		kernel = uint64(r.need("mamba_d_conv", c.MambaDConv, maxModelDim, "the Mamba convolution's width"))
		conv, state = nh*dh+2*ng*ds, nh*dh*ds
	case c.MambaExpand != nil:
		inner := uint64(r.within("mamba_expand", *c.MambaExpand, maxModelDim)) * uint64(hidden)
		ds := uint64(r.need("mamba_d_state", c.MambaDState, maxModelDim, "the Mamba state's size"))
		kernel = uint64(r.need("mamba_d_conv", c.MambaDConv, maxModelDim, "the Mamba convolution's width"))
		conv, state = inner, inner*ds
	default:
		r.fail("recurrent layers but no state fields: add linear_num_key_heads, linear_num_value_heads, linear_key_head_dim, linear_value_head_dim and linear_conv_kernel_dim (linear attention), or the mamba_* fields")
		return 1
	}
	if kernel < 2 {
		r.fail("a convolution of width %d, want at least 2", kernel)
		return 1
	}
	b := ((kernel-1)*conv + state) * uint64(elem)
	if b > maxModelState {
		r.fail("a recurrent state of %d bytes a layer, more than %d", b, uint64(maxModelState))
		return 1
	}
	return b
}

// params estimates m.Params and, for a mixture of experts, m.ActiveParams
// (see ModelFromConfig), in float64: exact at these sizes, and an
// impossible config overflows nothing before check refuses it.
func (r *configReader) params(c *hfConfig, m *Model, hidden int) {
	h := float64(hidden)
	vocabSize, tied := c.VocabSize, c.TieWordEmbeddings
	if c.ModelType == "gemma3_text" {
		if vocabSize == nil {
			vocabSize = new(int)
			*vocabSize = gemma3Vocab
		}
		if tied == nil {
			tied = new(bool)
			*tied = true
		}
	}
	vocab := float64(r.need("vocab_size", vocabSize, maxConfigVocab, "the number of tokens of the vocabulary"))
	embed := vocab * h
	if tied == nil || !*tied {
		embed *= 2 // the output projection, lm_head
	}
	heads := float64(m.QueryHeads)

	var attn float64
	if m.Latent {
		rank := float64(*c.KVLoraRank)
		rope := float64(*c.QKRopeHeadDim)
		nope := float64(r.need("qk_nope_head_dim", c.QKNopeHeadDim, maxModelDim, "the non-rotary part of a query or key head (128 for DeepSeek)"))
		v := float64(r.need("v_head_dim", c.VHeadDim, maxModelDim, "the size of a value head (128 for DeepSeek)"))
		qHead := heads * (nope + rope)
		if c.QLoraRank != nil && *c.QLoraRank != 0 {
			q := float64(r.within("q_lora_rank", *c.QLoraRank, maxConfigWidth))
			attn = h*q + q + q*qHead // q_a_proj, its norm, q_b_proj
		} else {
			attn = h * qHead // q_proj
		}
		attn += h*(rank+rope) + rank + rank*heads*(nope+v) // kv_a_proj_with_mqa, its norm, kv_b_proj
		attn += heads * v * h                              // o_proj
	} else {
		q, kv := heads*float64(m.HeadDim), float64(m.KVHeads*m.HeadDim)
		attn = 2*h*q + 2*h*kv // q and o, k and v
		if c.ModelType == "qwen2" {
			attn += q + 2*kv
		}
		if c.AttentionBias != nil && *c.AttentionBias {
			attn += q + 2*kv + h
		}
	}
	norms := 2 * h
	// The recurrent layers have their own mixer in place of attention.
	attnLayers, recLayers := float64(m.AttentionLayers()), float64(m.RecurrentLayers)
	attnAll := attnLayers*attn + recLayers*r.recurrentParams(c, hidden)

	experts, expertsField := c.NRoutedExperts, "n_routed_experts"
	for _, f := range []struct {
		v    *int
		name string
	}{{c.NumLocalExperts, "num_local_experts"}, {c.NumExperts, "num_experts"}} {
		if experts == nil || *experts == 0 {
			experts, expertsField = f.v, f.name
		}
	}
	layers := float64(m.Layers)
	if experts == nil || *experts == 0 {
		inter := float64(r.need("intermediate_size", c.IntermediateSize, maxConfigWidth, "the width of the MLP"))
		m.Params = r.count(embed + attnAll + layers*(norms+3*h*inter) + h)
		return
	}
	e := float64(r.within(expertsField, *experts, maxConfigExperts))
	perTok := float64(r.need("num_experts_per_tok", c.NumExpertsPerTok, *experts, "how many experts a token is routed to"))
	width := c.MoEIntermediateSize
	if width == nil {
		width = c.IntermediateSize
	}
	expert := 3 * h * float64(r.need("moe_intermediate_size", width, maxConfigWidth, "the width of an expert's MLP"))
	shared := float64(orDefault(c.NSharedExperts, 0)) * expert
	if c.SharedExpertIntermediateSize != nil {
		shared += 3 * h * float64(r.within("shared_expert_intermediate_size", *c.SharedExpertIntermediateSize, maxConfigWidth))
	}
	router := e * h
	dense := float64(orDefault(c.FirstKDenseReplace, 0))
	if dense < 0 || dense > layers {
		r.fail("first_k_dense_replace is %v, want 0 to num_hidden_layers %d", dense, m.Layers)
		return
	}
	var denseMLP float64
	if dense > 0 {
		denseMLP = 3 * h * float64(r.need("intermediate_size", c.IntermediateSize, maxConfigWidth, "the width of the dense layers' MLP"))
	}
	common := embed + attnAll + layers*norms + dense*denseMLP + h
	sparse := layers - dense
	m.Params = r.count(common + sparse*(e*expert+shared+router))
	m.ActiveParams = r.count(common + sparse*(perTok*expert+shared+router))
	m.Experts, m.ExpertsPerToken = int(e), int(perTok)
}

// recurrentParams estimates one recurrent layer's mixer (0 without
// recurrent layers): a Gated DeltaNet's input projections (q, k, v, the
// output gate z, b and a), convolution and output projection; a Mamba's
// input projection, convolution and output projection. Small terms (the
// norms, dt and A vectors) are left out.
func (r *configReader) recurrentParams(c *hfConfig, hidden int) float64 {
	h := float64(hidden)
	switch {
	case c.LinearNumKeyHeads != nil && c.LinearNumValueHeads != nil && c.LinearKeyHeadDim != nil && c.LinearValueHeadDim != nil && c.LinearConvKernelDim != nil:
		key := float64(*c.LinearNumKeyHeads) * float64(*c.LinearKeyHeadDim)
		value := float64(*c.LinearNumValueHeads) * float64(*c.LinearValueHeadDim)
		return h*(2*key+2*value) + h*2*float64(*c.LinearNumValueHeads) + (2*key+value)*float64(*c.LinearConvKernelDim) + value*h
	case c.MambaNHeads != nil && c.MambaDHead != nil && c.MambaDState != nil && c.MambaDConv != nil:
		inner := float64(*c.MambaNHeads) * float64(*c.MambaDHead)
		groups := float64(orDefault(c.MambaNGroups, 1)) * float64(*c.MambaDState)
		return h*(2*inner+2*groups+float64(*c.MambaNHeads)) + (inner+2*groups)*float64(*c.MambaDConv) + inner*h
	case c.MambaExpand != nil && c.MambaDState != nil && c.MambaDConv != nil:
		inner := float64(*c.MambaExpand) * h
		rank := math.Ceil(h / 16)
		return h*2*inner + inner*float64(*c.MambaDConv) + inner*(rank+2*float64(*c.MambaDState)) + rank*inner + inner*h
	}
	return 0
}

// count is an estimate as a parameter count, refused past what check
// accepts.
func (r *configReader) count(p float64) int64 {
	if p > maxModelParams {
		r.fail("an estimated %.4g parameters, more than the %.4g a model may have", p, float64(maxModelParams))
		return 0
	}
	return int64(math.Round(p))
}

// LoadModel is the model arg names: a preset (ModelPresets), or the path
// of a Hugging Face config.json, or of a directory holding one, read by
// ModelFromConfig and labelled with its directory's name (a file of
// another name: the name less ".json"). An arg that is neither is an
// error marked driver.ErrInvalid listing the presets; so is a directory
// without a config.json, a file that is not a regular one, and one of
// more than MaxConfigBytes.
func LoadModel(arg string) (Model, error) {
	if m, ok := modelPresets[arg]; ok {
		return m, nil
	}
	path := arg
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		path = filepath.Join(path, "config.json")
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			return Model{}, errors.WithHint(errors.Wrapf(driver.ErrInvalid, "serving: model config: the directory %s has no config.json", arg),
				"name a Hugging Face model directory (one holding config.json), the path of a config.json, or a preset")
		}
	}
	data, err := in.ReadFile(path, "model config", MaxConfigBytes)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) && !strings.ContainsAny(arg, `/\`) && !strings.HasSuffix(arg, ".json") {
			return Model{}, errors.Wrapf(driver.ErrInvalid, "serving: no model preset %q, want one of %s, or the path of a Hugging Face config.json",
				arg, strings.Join(ModelPresets(), ", "))
		}
		return Model{}, err
	}
	name := strings.TrimSuffix(filepath.Base(path), ".json")
	if name == "config" {
		name = filepath.Base(filepath.Dir(path))
	}
	return ModelFromConfig(name, data)
}
