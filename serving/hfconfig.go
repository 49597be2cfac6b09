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

	"github.com/cockroachdb/errors"

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

	r.window(c, &m)
	if r.err == nil {
		r.params(c, &m, hidden)
	}
	return m
}

// window reads the sliding window into m.
func (r *configReader) window(c *hfConfig, m *Model) {
	windowed := m.Layers
	if c.LayerTypes != nil {
		if len(c.LayerTypes) != m.Layers {
			r.fail("layer_types has %d entries for %d num_hidden_layers", len(c.LayerTypes), m.Layers)
			return
		}
		windowed = 0
		for _, t := range c.LayerTypes {
			if t == "sliding_attention" {
				windowed++
			}
		}
		if windowed > 0 && c.SlidingWindow == nil {
			r.fail(`layer_types names %d "sliding_attention" layers but there is no "sliding_window": add the window in tokens`, windowed)
			return
		}
	}
	if c.SlidingWindow == nil || windowed == 0 || (c.UseSlidingWindow != nil && !*c.UseSlidingWindow) {
		return
	}
	m.SlidingWindow = r.within("sliding_window", *c.SlidingWindow, maxModelWindow)
	m.WindowLayers = windowed
}

// params estimates m.Params and, for a mixture of experts, m.ActiveParams
// (see ModelFromConfig), in float64: exact at these sizes, and an
// impossible config overflows nothing before check refuses it.
func (r *configReader) params(c *hfConfig, m *Model, hidden int) {
	h := float64(hidden)
	vocab := float64(r.need("vocab_size", c.VocabSize, maxConfigVocab, "the number of tokens of the vocabulary"))
	embed := vocab * h
	if c.TieWordEmbeddings == nil || !*c.TieWordEmbeddings {
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
		m.Params = r.count(embed + layers*(attn+norms+3*h*inter) + h)
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
	common := embed + layers*(attn+norms) + dense*denseMLP + h
	sparse := layers - dense
	m.Params = r.count(common + sparse*(e*expert+shared+router))
	m.ActiveParams = r.count(common + sparse*(perTok*expert+shared+router))
	m.Experts, m.ExpertsPerToken = int(e), int(perTok)
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
