package serving

// The model a serving simulation serves and the price of one of its steps:
// the two things every KV scheme of a simulation shares, so that their
// figures differ by how they hold KV memory and nothing else.

import (
	"math"
	"sort"
	"strings"
	"time"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// Model is a decoder-only transformer as the serving simulation sees it:
// the KV it keeps per token, and what one token costs to compute.
// ModelPreset names the shapes of common models; ModelFromConfig reads
// one from a Hugging Face config.json.
type Model struct {
	// Name is the preset's name ("llama3-8b"), or any label.
	Name string
	// Layers, KVHeads and HeadDim shape the KV cache: each token keeps, in
	// every layer, a key and a value of KVHeads x HeadDim elements (the
	// fields kvcache.Config names the same way) — or, Latent, one vector.
	Layers, KVHeads, HeadDim int
	// Latent is multi-head latent attention (DeepSeek-V2 and V3): each
	// token keeps, in every layer, one compressed vector of HeadDim
	// elements (kv_lora_rank + qk_rope_head_dim) that every head's key and
	// value are computed from, not a key and a value; KVHeads is 1.
	Latent bool
	// ElemBytes is the size of one element of K and V (2: fp16 or bf16).
	ElemBytes int
	// QueryHeads is the number of attention heads of the queries: KVHeads
	// without grouped-query attention, a multiple of it with. Attention's
	// arithmetic grows with it, the KV cache does not.
	QueryHeads int
	// Params is the number of parameters: every step reads all of them
	// (ElemBytes each).
	Params int64
	// ActiveParams is the parameters one token goes through where fewer
	// than Params (a mixture of experts: the shared layers and the experts
	// it is routed to); 0: Params, a dense model. Every token computed
	// costs 2*ActiveParams FLOPs of matrix products.
	ActiveParams int64
	// Experts and ExpertsPerToken are a mixture of experts' routed
	// experts (a layer) and how many of them each token goes through: a
	// step reads only the experts its tokens are routed to (see
	// StepModel). 0 and 0 for a dense model.
	Experts, ExpertsPerToken int
	// SlidingWindow, when not 0, is a sliding-window attention's window in
	// tokens, and WindowLayers how many of the Layers attend only to the
	// last SlidingWindow tokens (all of them for Mistral 7B; every other
	// layer where a model alternates). The simulation does not model it:
	// every scheme keeps each of a sequence's tokens in every layer, as
	// full attention must, and Config.WindowNote says so where the
	// window would drop tokens. Groups cuts the layers by kind, and
	// ExactNeed and PagedHybridHeld count what each group holds.
	SlidingWindow, WindowLayers int
	// RecurrentLayers is how many of the Layers keep no KV but a state of
	// StateBytes a sequence each, whatever its length: the linear-attention
	// (Gated DeltaNet) layers of Qwen3-Next, the Mamba layers of Jamba and
	// Granite 4. 0 for a transformer. The KV of a token (TokenBytes) is
	// the other layers'.
	RecurrentLayers int
	StateBytes      uint64
}

// AttentionLayers is the layers that keep KV a token: Layers less the
// recurrent ones.
func (m Model) AttentionLayers() int { return m.Layers - m.RecurrentLayers }

// TokenBytes is the KV one token keeps: a key and a value in each
// attention layer, 2 * AttentionLayers * KVHeads * HeadDim * ElemBytes, or
// one latent vector, AttentionLayers * HeadDim * ElemBytes.
func (m Model) TokenBytes() uint64 {
	vectors := uint64(2)
	if m.Latent {
		vectors = 1
	}
	return vectors * uint64(m.AttentionLayers()) * uint64(m.KVHeads) * uint64(m.HeadDim) * uint64(m.ElemBytes)
}

// LayerTokenBytes is the KV one token keeps in one attention layer.
func (m Model) LayerTokenBytes() uint64 {
	if m.AttentionLayers() < 1 {
		return 0
	}
	return m.TokenBytes() / uint64(m.AttentionLayers())
}

// activeParams is what one token's matrix products go through.
func (m Model) activeParams() int64 {
	if m.ActiveParams > 0 {
		return m.ActiveParams
	}
	return m.Params
}

// The largest model shape check accepts; nothing this side of them is a
// transformer anyone serves, and they keep TokenBytes and the step's
// arithmetic far from overflowing.
const (
	maxModelDim    = 1 << 16 // layers, heads, head dimension
	maxModelElem   = 8       // bytes an element
	maxModelParams = 1 << 44 // parameters
	maxModelWindow = 1 << 24 // tokens of a sliding window
	maxModelState  = 1 << 34 // bytes of one recurrent layer's state
)

// check refuses a model shape no step can be priced for, with
// driver.ErrInvalid.
func (m Model) check() error {
	for _, f := range []struct {
		name string
		v    int
	}{{"Layers", m.Layers}, {"KVHeads", m.KVHeads}, {"HeadDim", m.HeadDim}, {"QueryHeads", m.QueryHeads}} {
		if f.v < 1 || f.v > maxModelDim {
			return errors.Wrapf(driver.ErrInvalid, "serving: model %q: %s %d, want 1 to %d", m.Name, f.name, f.v, maxModelDim)
		}
	}
	if m.ElemBytes < 1 || m.ElemBytes > maxModelElem {
		return errors.Wrapf(driver.ErrInvalid, "serving: model %q: ElemBytes %d, want 1 to %d", m.Name, m.ElemBytes, maxModelElem)
	}
	if m.Params < 0 || m.Params > maxModelParams {
		return errors.Wrapf(driver.ErrInvalid, "serving: model %q: Params %d, want 0 to %d", m.Name, m.Params, int64(maxModelParams))
	}
	switch {
	case m.ActiveParams < 0 || m.ActiveParams > m.Params:
		return errors.Wrapf(driver.ErrInvalid, "serving: model %q: ActiveParams %d, want 0 (dense) to Params %d", m.Name, m.ActiveParams, m.Params)
	case m.Experts < 0 || m.Experts > maxModelDim:
		return errors.Wrapf(driver.ErrInvalid, "serving: model %q: Experts %d, want 0 (dense) to %d", m.Name, m.Experts, maxModelDim)
	case (m.Experts == 0) != (m.ExpertsPerToken == 0) || m.ExpertsPerToken < 0 || m.ExpertsPerToken > m.Experts:
		return errors.Wrapf(driver.ErrInvalid, "serving: model %q: ExpertsPerToken %d, want 1 to Experts %d (0 for a dense model)", m.Name, m.ExpertsPerToken, m.Experts)
	case m.Experts > 0 && m.ActiveParams == 0:
		return errors.Wrapf(driver.ErrInvalid, "serving: model %q: %d experts but no ActiveParams, want the parameters a token goes through", m.Name, m.Experts)
	case m.Latent && m.KVHeads != 1:
		return errors.Wrapf(driver.ErrInvalid, "serving: model %q: a latent KV has one vector a layer, KVHeads %d, want 1", m.Name, m.KVHeads)
	case m.SlidingWindow < 0 || m.SlidingWindow > maxModelWindow:
		return errors.Wrapf(driver.ErrInvalid, "serving: model %q: SlidingWindow %d, want 0 (none) to %d tokens", m.Name, m.SlidingWindow, maxModelWindow)
	case m.SlidingWindow == 0 && m.WindowLayers != 0:
		return errors.Wrapf(driver.ErrInvalid, "serving: model %q: WindowLayers %d without a SlidingWindow, want 0", m.Name, m.WindowLayers)
	case m.SlidingWindow > 0 && (m.WindowLayers < 1 || m.WindowLayers > m.Layers):
		return errors.Wrapf(driver.ErrInvalid, "serving: model %q: WindowLayers %d, want 1 to Layers %d", m.Name, m.WindowLayers, m.Layers)
	case m.RecurrentLayers < 0 || (m.RecurrentLayers > 0 && m.RecurrentLayers+m.WindowLayers >= m.Layers):
		return errors.Wrapf(driver.ErrInvalid, "serving: model %q: RecurrentLayers %d and WindowLayers %d of %d layers, want at least one full attention layer beside the recurrent ones",
			m.Name, m.RecurrentLayers, m.WindowLayers, m.Layers)
	case (m.RecurrentLayers == 0) != (m.StateBytes == 0) || m.StateBytes > maxModelState:
		return errors.Wrapf(driver.ErrInvalid, "serving: model %q: StateBytes %d for %d recurrent layers, want 1 to %d with recurrent layers, 0 without",
			m.Name, m.StateBytes, m.RecurrentLayers, uint64(maxModelState))
	case m.Latent && m.RecurrentLayers > 0:
		return errors.Wrapf(driver.ErrInvalid, "serving: model %q: a latent KV and recurrent layers: no model has both", m.Name)
	}
	return nil
}

// modelPresets are the shapes of common models, each from its Hugging
// Face repository's config.json (the values quoted; an element is 2 bytes,
// the checkpoints' bfloat16). Params is what ModelFromConfig estimates
// from the same config (see estimateParams), next to the count the model
// card or the checkpoint publishes; the test reads each preset's
// config.json from testdata/models and requires the same Model.
var modelPresets = map[string]Model{
	// LLaMA (Touvron et al., 2023), 7B: multi-head attention. huggyllama/llama-7b:
	// num_hidden_layers 32, num_attention_heads 32, hidden_size 4096
	// (head_dim 128), intermediate_size 11008, vocab_size 32000,
	// float16. 6,738,415,616 parameters in the checkpoint.
	"llama-7b": {Name: "llama-7b", Layers: 32, KVHeads: 32, HeadDim: 128, ElemBytes: 2, QueryHeads: 32, Params: 6_738_415_616},
	// Llama 3 8B: grouped-query attention, 8 KV heads for 32 query heads.
	// meta-llama/Meta-Llama-3-8B: num_hidden_layers 32,
	// num_attention_heads 32, num_key_value_heads 8, hidden_size 4096,
	// intermediate_size 14336, vocab_size 128256, bfloat16;
	// 8,030,261,248 parameters in the checkpoint.
	"llama3-8b": {Name: "llama3-8b", Layers: 32, KVHeads: 8, HeadDim: 128, ElemBytes: 2, QueryHeads: 32, Params: 8_030_261_248},
	// Llama 3.1 8B, the same shape as Llama 3 8B (a longer context, 131072
	// max_position_embeddings, rope_scaling llama3). meta-llama/Llama-3.1-8B.
	"llama3.1-8b": {Name: "llama3.1-8b", Layers: 32, KVHeads: 8, HeadDim: 128, ElemBytes: 2, QueryHeads: 32, Params: 8_030_261_248},
	// Llama 3.1 70B, and 3.3 70B of the same config: grouped-query
	// attention, 8 KV heads for 64. meta-llama/Llama-3.1-70B and
	// meta-llama/Llama-3.3-70B-Instruct: num_hidden_layers 80,
	// num_attention_heads 64, num_key_value_heads 8, hidden_size 8192,
	// intermediate_size 28672, vocab_size 128256, bfloat16;
	// 70,553,706,496 parameters in the checkpoint.
	"llama3.1-70b": {Name: "llama3.1-70b", Layers: 80, KVHeads: 8, HeadDim: 128, ElemBytes: 2, QueryHeads: 64, Params: 70_553_706_496},
	"llama3.3-70b": {Name: "llama3.3-70b", Layers: 80, KVHeads: 8, HeadDim: 128, ElemBytes: 2, QueryHeads: 64, Params: 70_553_706_496},
	// Qwen2.5 7B: grouped-query attention, 4 KV heads for 28, biases on
	// q, k and v. Qwen/Qwen2.5-7B-Instruct: num_hidden_layers 28,
	// num_attention_heads 28, num_key_value_heads 4, hidden_size 3584,
	// intermediate_size 18944, vocab_size 152064, bfloat16,
	// sliding_window 131072 with use_sliding_window false (no window);
	// 7.61 B parameters (model card), 7,615,616,512 in the checkpoint.
	"qwen2.5-7b": {Name: "qwen2.5-7b", Layers: 28, KVHeads: 4, HeadDim: 128, ElemBytes: 2, QueryHeads: 28, Params: 7_615_616_512},
	// Mistral 7B v0.1: grouped-query and sliding-window attention, every
	// layer attending to the last 4096 tokens. mistralai/Mistral-7B-v0.1:
	// num_hidden_layers 32, num_attention_heads 32, num_key_value_heads 8,
	// hidden_size 4096, intermediate_size 14336, vocab_size 32000,
	// sliding_window 4096, bfloat16; 7,241,732,096 parameters in the
	// checkpoint. (v0.3 dropped the window: sliding_window null.)
	"mistral-7b": {Name: "mistral-7b", Layers: 32, KVHeads: 8, HeadDim: 128, ElemBytes: 2, QueryHeads: 32, Params: 7_241_732_096,
		SlidingWindow: 4096, WindowLayers: 32},
	// DeepSeek-V2-Lite: multi-head latent attention and a mixture of
	// experts. deepseek-ai/DeepSeek-V2-Lite: num_hidden_layers 27,
	// num_attention_heads 16, kv_lora_rank 512, qk_rope_head_dim 64
	// (a 576-element latent a layer), qk_nope_head_dim 128, v_head_dim
	// 128, q_lora_rank null, hidden_size 2048, intermediate_size 10944,
	// moe_intermediate_size 1408, n_routed_experts 64, n_shared_experts 2,
	// num_experts_per_tok 6, first_k_dense_replace 1, vocab_size 102400,
	// bfloat16; 15.7 B parameters, 2.4 B active (model card; the estimate's
	// 2.66 B active counts the embeddings).
	"deepseek-v2-lite": {Name: "deepseek-v2-lite", Layers: 27, KVHeads: 1, HeadDim: 576, Latent: true, ElemBytes: 2, QueryHeads: 16,
		Params: 15_706_484_224, ActiveParams: 2_661_150_208, Experts: 64, ExpertsPerToken: 6},
	// DeepSeek-V3: the same attention at scale. deepseek-ai/DeepSeek-V3:
	// num_hidden_layers 61, num_attention_heads 128, kv_lora_rank 512,
	// qk_rope_head_dim 64, qk_nope_head_dim 128, v_head_dim 128,
	// q_lora_rank 1536, hidden_size 7168, intermediate_size 18432,
	// moe_intermediate_size 2048, n_routed_experts 256, n_shared_experts
	// 1, num_experts_per_tok 8, first_k_dense_replace 3, vocab_size
	// 129280, bfloat16 (its weights are stored in fp8; the KV is bf16);
	// 671 B parameters, 37 B active (the paper; its multi-token
	// prediction module, 14 B more, is not counted).
	"deepseek-v3": {Name: "deepseek-v3", Layers: 61, KVHeads: 1, HeadDim: 576, Latent: true, ElemBytes: 2, QueryHeads: 128,
		Params: 671_026_404_352, ActiveParams: 37_552_282_624, Experts: 256, ExpertsPerToken: 8},
	// Gemma 3 27B: 5 sliding-window layers to 1 of full attention.
	// google/gemma-3-27b-it, its text_config: num_hidden_layers 62,
	// num_attention_heads 32, num_key_value_heads 16, head_dim 128,
	// hidden_size 5376, intermediate_size 21504, sliding_window 1024,
	// model_type gemma3_text (Gemma3TextConfig's sliding_window_pattern 6:
	// layers 5, 11, ..., 59 full, the other 52 windowed; its vocab_size
	// 262208, tied embeddings), bfloat16; 27 B parameters (model card,
	// with the vision tower's 0.4 B).
	"gemma-3-27b": {Name: "gemma-3-27b", Layers: 62, KVHeads: 16, HeadDim: 128, ElemBytes: 2, QueryHeads: 32, Params: 27_008_663_808,
		SlidingWindow: 1024, WindowLayers: 52},
	// gpt-oss-120b: alternating windowed and full layers and a mixture of
	// experts. openai/gpt-oss-120b: num_hidden_layers 36, layer_types
	// sliding_attention and full_attention in turn, sliding_window 128,
	// num_attention_heads 64, num_key_value_heads 8, head_dim 64,
	// hidden_size 2880, intermediate_size 2880, num_local_experts 128,
	// num_experts_per_tok 4, vocab_size 201088, attention_bias true,
	// bfloat16 (the experts' weights are stored in MXFP4; the KV is bf16);
	// 116.8 B parameters, 5.1 B active (model card).
	"gpt-oss-120b": {Name: "gpt-oss-120b", Layers: 36, KVHeads: 8, HeadDim: 64, ElemBytes: 2, QueryHeads: 64,
		Params: 116_789_336_640, ActiveParams: 5_710_731_840, Experts: 128, ExpertsPerToken: 4, SlidingWindow: 128, WindowLayers: 18},
	// Qwen3-Next 80B-A3B: 3 Gated DeltaNet (linear attention) layers to 1
	// of full attention. Qwen/Qwen3-Next-80B-A3B-Instruct:
	// num_hidden_layers 48, layer_types (full_attention_interval 4: layers
	// 3, 7, ..., 47 full, 36 linear_attention), num_attention_heads 16,
	// num_key_value_heads 2, head_dim 256, linear_num_key_heads 16,
	// linear_num_value_heads 32, linear_key_head_dim 128,
	// linear_value_head_dim 128, linear_conv_kernel_dim 4 (a state of
	// 3 x 8192 + 32 x 128 x 128 elements a layer, 1,097,728 bytes in
	// bf16), hidden_size 2048, num_experts 512, num_experts_per_tok 10,
	// moe_intermediate_size 512, shared_expert_intermediate_size 512,
	// vocab_size 151936, bfloat16; 80 B parameters, 3 B active (model
	// card).
	"qwen3-next-80b-a3b": {Name: "qwen3-next-80b-a3b", Layers: 48, KVHeads: 2, HeadDim: 256, ElemBytes: 2, QueryHeads: 16,
		Params: 79_573_616_640, ActiveParams: 3_774_154_752, Experts: 512, ExpertsPerToken: 10, RecurrentLayers: 36, StateBytes: 1_097_728},
}

// ModelPresets names the presets ModelPreset knows, sorted.
func ModelPresets() []string {
	names := make([]string, 0, len(modelPresets))
	for n := range modelPresets {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// ModelPreset is the model of that name, one of ModelPresets: for
// example "llama-7b" (32 layers x 32 KV heads x 128, fp16: 512 KiB of KV
// a token) or "llama3-8b" (32 x 8 x 128, bf16: 128 KiB a token). Another
// name is an error marked driver.ErrInvalid that lists the presets.
func ModelPreset(name string) (Model, error) {
	m, ok := modelPresets[name]
	if !ok {
		return Model{}, errors.Wrapf(driver.ErrInvalid, "serving: no model preset %q, want one of %s", name, strings.Join(ModelPresets(), ", "))
	}
	return m, nil
}

// StepModel prices one step of continuous batching: the batch's tokens go
// through the model once. It is a roofline: a step takes the longer of its
// arithmetic at PeakFLOPS and its memory traffic at Bandwidth, plus fixed
// costs,
//
//	time = StepOverhead + SeqOverhead * sequences
//	     + max(FLOPs / PeakFLOPS, bytes / Bandwidth)
//
// where, for the n tokens of a sequence computed after the s it already
// holds (a prompt chunk, or n = 1 for a decode),
//
//	FLOPs += 2 * ActiveParams * n                       (the matrix products)
//	       + 4 * Layers * QueryHeads * HeadDim * (n*s + n*(n+1)/2)
//	                                                    (QK^T and AV, causal)
//	bytes += TokenBytes * ((s + n) + n)                 (read its KV, write n)
//
// and every step reads the weights once: bytes += Params * ElemBytes. A
// mixture of experts' step reads the experts its T tokens are routed to:
// with each token routed to k of E experts a layer, uniformly and
// independently, a fraction 1 - (1 - k/E)^T of them, so that
//
//	bytes += (Params - routed * (1 - k/E)^T) * ElemBytes
//
// where routed, all the routed experts' parameters, is (Params -
// ActiveParams) * E / (E - k): a decode of one sequence reads about its
// active parameters, a step of hundreds of tokens nearly all of them.
// For a latent KV (Latent) HeadDim is the latent's, which attention
// works in when its products are absorbed, as DeepSeek serves it. A
// decode step of a few sequences is bound by the weights, one of many
// long sequences by their KV, a prompt chunk by its arithmetic. The model
// is ideal (no kernel reaches its peak), so times are lower bounds; what
// the simulation compares is KV schemes under the same prices, which the
// roofline's shape, not its scale, decides. A zero PeakFLOPS or Bandwidth
// makes that side free (tests price steps by their overheads alone).
type StepModel struct {
	// Name says which machine the figures describe.
	Name string
	// PeakFLOPS is the arithmetic rate, FLOP/s.
	PeakFLOPS float64
	// Bandwidth is the memory bandwidth, bytes/s.
	Bandwidth float64
	// StepOverhead is the fixed cost of a step: scheduling, preparing the
	// inputs and launching its kernels.
	StepOverhead time.Duration
	// SeqOverhead is the cost of each sequence in the step: its block table
	// or addresses, sampling, checking for the end.
	SeqOverhead time.Duration
}

// A100 prices steps on an NVIDIA A100 80GB SXM. PeakFLOPS and Bandwidth
// are NVIDIA's datasheet figures: 312 TFLOP/s of dense fp16/bf16 tensor
// core arithmetic, 2,039 GB/s of HBM2e. The overheads are assumptions, not
// measurements: 1 ms a step for the serving engine's scheduler and kernel
// launches (captured graphs keep launching to a few hundred microseconds;
// Python scheduling adds the rest), 10 µs a sequence. They were set once,
// before any simulation ran, and are the same for every scheme.
var A100 = StepModel{
	Name:         "A100 80GB roofline",
	PeakFLOPS:    312e12,
	Bandwidth:    2039e9,
	StepOverhead: time.Millisecond,
	SeqOverhead:  10 * time.Microsecond,
}

// stepWork adds up what one step computes, for StepModel.time.
type stepWork struct {
	seqs, tokens int
	flops        float64
	bytes        float64
}

// add counts n tokens of a sequence that holds s before them.
func (w *stepWork) add(m Model, s, n int) {
	fs, fn := float64(s), float64(n)
	w.seqs++
	w.tokens += n
	w.flops += 2*float64(m.activeParams())*fn +
		4*float64(m.AttentionLayers())*float64(m.QueryHeads)*float64(m.HeadDim)*(fn*fs+fn*(fn+1)/2)
	w.bytes += float64(m.TokenBytes()) * (fs + 2*fn)
}

// time is how long the step takes on sm.
func (sm StepModel) time(m Model, w stepWork) time.Duration {
	bytes := w.bytes + m.weightsRead(w.tokens)*float64(m.ElemBytes)
	var secs float64
	if sm.PeakFLOPS > 0 {
		secs = w.flops / sm.PeakFLOPS
	}
	if sm.Bandwidth > 0 {
		secs = max(secs, bytes/sm.Bandwidth)
	}
	return sm.StepOverhead + time.Duration(w.seqs)*sm.SeqOverhead + time.Duration(secs*float64(time.Second))
}

// weightsRead is the parameters a step of tokens reads (see StepModel):
// all of a dense model's, those of the experts a mixture of experts
// routes the tokens to.
func (m Model) weightsRead(tokens int) float64 {
	params := float64(m.Params)
	if m.Experts == 0 || m.ExpertsPerToken >= m.Experts {
		return params
	}
	e, k := float64(m.Experts), float64(m.ExpertsPerToken)
	routed := (params - float64(m.ActiveParams)) * e / (e - k)
	return params - routed*math.Pow(1-k/e, float64(tokens))
}
