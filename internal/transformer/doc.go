// Package transformer is a small decoder-only transformer in plain Go: the
// reference computation against which the KV cache (package kvcache) is
// proven. Its logits computed by full attention with no cache (Forward) are
// the truth; the same model decoding one token at a time through a KV store
// (Step, over the KV interface that a cache implements) must reproduce them
// within 1e-4.
//
// How much that comparison proves: Forward and Step share every kernel and
// summation order, so through a store that gives back exactly the float32s
// it was given, Step's logits equal Forward's bit for bit, and a cache
// storing float32 can demand equality. Within the 1e-4 tolerance (for a
// store that converts or reorders), measured with the default
// configuration: a position read for another, a layer read for another or
// keys of two positions swapped move the logits by more than 0.1; a single
// value element off by 0.05 or key element off by 1, by 5 to 10 times the
// tolerance; a single key element off by a few hundredths can pass. Swapping two positions' keys and values together
// cannot be seen at all, and is harmless: keys are stored already rotated
// for their position, and attention sums over (key, value) pairs in any
// order. So the comparison proves what the store gives back for each
// position, not where it keeps it.
//
// The model: float32 throughout; weights drawn deterministically from a seed
// (same seed, same binary: the same logits, bit for bit); token embedding,
// then Layers blocks of pre-norm attention and MLP with residual
// connections, a final RMSNorm and a separate (untied) output head scaled so
// that logits are of order one (an absolute tolerance of 1e-4 is then a
// relative one too). Attention has Heads query heads over KVHeads key/value
// heads (grouped-query when KVHeads < Heads: query head h reads key/value
// head h/(Heads/KVHeads)), rotary position embeddings on interleaved pairs
// (x[2i], x[2i+1]) with base 10000, a causal mask and 1/sqrt(HeadDim)
// scaling. The MLP is SiLU-gated: down(silu(gate(x)) * up(x)). The model
// width is Heads*HeadDim. Keys are stored after the rotation, as serving
// engines store them.
//
// What it never does: it never imports another vmarena package (it is layer
// 0, so the cache's tests can use it without a cycle), never touches device
// memory, never keeps state between calls (a Model is immutable after New
// and safe for concurrent use; all per-sequence state lives in the KV the
// caller passes), and never batches, quantizes or approximates for speed.
// It is slow on purpose: about 2*Layers*(Width*(Width+2*KVWidth) + Width*Width
// + 3*Width*Hidden) + 2*Width*Vocab floating-point operations per token, plus
// attention — some 21 MFLOP a token with the default configuration, a few
// milliseconds in plain Go. Size test sequences accordingly.
package transformer
