package replay

// The model a serving simulation serves and the price of one of its steps:
// the two things every KV scheme of a simulation shares, so that their
// figures differ by how they hold KV memory and nothing else.

import (
	"sort"
	"strings"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/driver"
)

// Model is a decoder-only transformer as the serving simulation sees it:
// the KV it keeps per token, and what one token costs to compute.
type Model struct {
	// Name is the preset's name ("llama3-8b"), or any label.
	Name string
	// Layers, KVHeads and HeadDim shape the KV cache: each token keeps, in
	// every layer, a key and a value of KVHeads x HeadDim elements (the
	// fields kvcache.Config names the same way).
	Layers, KVHeads, HeadDim int
	// ElemBytes is the size of one element of K and V (2: fp16 or bf16).
	ElemBytes int
	// QueryHeads is the number of attention heads of the queries: KVHeads
	// without grouped-query attention, a multiple of it with. Attention's
	// arithmetic grows with it, the KV cache does not.
	QueryHeads int
	// Params is the number of parameters: every step reads all of them
	// (ElemBytes each), and every token computed costs 2*Params FLOPs of
	// matrix products.
	Params int64
}

// TokenBytes is the KV one token keeps: a key and a value in each layer,
// 2 * Layers * KVHeads * HeadDim * ElemBytes.
func (m Model) TokenBytes() uint64 {
	return 2 * uint64(m.Layers) * uint64(m.KVHeads) * uint64(m.HeadDim) * uint64(m.ElemBytes)
}

// The largest model shape check accepts; nothing this side of them is a
// transformer anyone serves, and they keep TokenBytes and the step's
// arithmetic far from overflowing.
const (
	maxModelDim    = 1 << 16 // layers, heads, head dimension
	maxModelElem   = 8       // bytes an element
	maxModelParams = 1 << 44 // parameters
)

// check refuses a model shape no step can be priced for, with
// driver.ErrInvalid.
func (m Model) check() error {
	for _, f := range []struct {
		name string
		v    int
	}{{"Layers", m.Layers}, {"KVHeads", m.KVHeads}, {"HeadDim", m.HeadDim}, {"QueryHeads", m.QueryHeads}} {
		if f.v < 1 || f.v > maxModelDim {
			return errors.Wrapf(driver.ErrInvalid, "replay: model %q: %s %d, want 1 to %d", m.Name, f.name, f.v, maxModelDim)
		}
	}
	if m.ElemBytes < 1 || m.ElemBytes > maxModelElem {
		return errors.Wrapf(driver.ErrInvalid, "replay: model %q: ElemBytes %d, want 1 to %d", m.Name, m.ElemBytes, maxModelElem)
	}
	if m.Params < 0 || m.Params > maxModelParams {
		return errors.Wrapf(driver.ErrInvalid, "replay: model %q: Params %d, want 0 to %d", m.Name, m.Params, int64(maxModelParams))
	}
	return nil
}

// modelPresets are the shapes of the models the issue names. The
// parameter counts are those of the published checkpoints (LLaMA-7B:
// 6,738,415,616; Llama-3-8B: 8,030,261,248, its 128k-token vocabulary
// included); both have 32 query heads of 128 over a hidden size of 4096.
var modelPresets = map[string]Model{
	// LLaMA (Touvron et al., 2023), 7B: multi-head attention.
	"llama-7b": {Name: "llama-7b", Layers: 32, KVHeads: 32, HeadDim: 128, ElemBytes: 2, QueryHeads: 32, Params: 6_738_415_616},
	// Llama 3 8B: grouped-query attention, 8 KV heads for 32 query heads.
	"llama3-8b": {Name: "llama3-8b", Layers: 32, KVHeads: 8, HeadDim: 128, ElemBytes: 2, QueryHeads: 32, Params: 8_030_261_248},
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

// ModelPreset is the model of that name: "llama-7b" (32 layers x 32 KV
// heads x 128, fp16: 512 KiB of KV a token) or "llama3-8b" (32 x 8 x 128,
// fp16: 128 KiB a token). Another name is an error marked
// driver.ErrInvalid that lists the presets.
func ModelPreset(name string) (Model, error) {
	m, ok := modelPresets[name]
	if !ok {
		return Model{}, errors.Wrapf(driver.ErrInvalid, "replay: no model preset %q, want one of %s", name, strings.Join(ModelPresets(), ", "))
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
//	FLOPs += 2 * Params * n                             (the matrix products)
//	       + 4 * Layers * QueryHeads * HeadDim * (n*s + n*(n+1)/2)
//	                                                    (QK^T and AV, causal)
//	bytes += TokenBytes * ((s + n) + n)                 (read its KV, write n)
//
// and every step reads the weights once: bytes += Params * ElemBytes. A
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
	seqs  int
	flops float64
	bytes float64
}

// add counts n tokens of a sequence that holds s before them.
func (w *stepWork) add(m Model, s, n int) {
	fs, fn := float64(s), float64(n)
	w.seqs++
	w.flops += 2*float64(m.Params)*fn +
		4*float64(m.Layers)*float64(m.QueryHeads)*float64(m.HeadDim)*(fn*fs+fn*(fn+1)/2)
	w.bytes += float64(m.TokenBytes()) * (fs + 2*fn)
}

// time is how long the step takes on sm.
func (sm StepModel) time(m Model, w stepWork) time.Duration {
	bytes := w.bytes + float64(m.Params)*float64(m.ElemBytes)
	var secs float64
	if sm.PeakFLOPS > 0 {
		secs = w.flops / sm.PeakFLOPS
	}
	if sm.Bandwidth > 0 {
		secs = max(secs, bytes/sm.Bandwidth)
	}
	return sm.StepOverhead + time.Duration(w.seqs)*sm.SeqOverhead + time.Duration(secs*float64(time.Second))
}
