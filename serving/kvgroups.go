package serving

// A model's layers in groups of one kind of KV each: what the hybrid
// schemes hold per group.

import "fmt"

// GroupKind is what one group of a model's layers keeps for a sequence.
type GroupKind uint8

const (
	// FullAttention layers keep a key and a value of every token.
	FullAttention GroupKind = iota
	// SlidingWindow layers attend to the last Window tokens only: what is
	// behind the window is never read again.
	SlidingWindow
	// LatentAttention layers (DeepSeek's multi-head latent attention) keep
	// one latent vector of every token.
	LatentAttention
	// Recurrent layers (linear attention, Mamba) keep a state of a fixed
	// size a sequence, not a row a token.
	Recurrent
)

// groupKindNames are GroupKind's String, by value.
var groupKindNames = [...]string{"full attention", "sliding window", "latent attention", "recurrent"}

func (k GroupKind) String() string {
	if int(k) < len(groupKindNames) {
		return groupKindNames[k]
	}
	return fmt.Sprintf("GroupKind(%d)", uint8(k))
}

// LayerGroup is the layers of a model of one kind, as Model.Groups gives
// them.
type LayerGroup struct {
	Kind GroupKind
	// Layers is how many layers the group has.
	Layers int
	// Window is a SlidingWindow group's window in tokens; 0 for the others.
	Window int
	// TokenBytes is the KV one token keeps in all the group's layers (0 for
	// a Recurrent group).
	TokenBytes uint64
	// StateBytes is the state one sequence keeps in all the group's layers
	// (Recurrent only; 0 for the others).
	StateBytes uint64
}

// Groups is m's layers by kind, in the order FullAttention (or
// LatentAttention), SlidingWindow, Recurrent, each present only when it
// has layers: a transformer of full attention is one group, Gemma 3 two
// (10 full and 52 window layers of 27b), Qwen3-Next two (12 full, 36
// recurrent). A latent KV's layers are all LatentAttention.
func (m Model) Groups() []LayerGroup {
	per := m.LayerTokenBytes()
	full := m.AttentionLayers() - m.WindowLayers
	var gs []LayerGroup
	if full > 0 {
		kind := FullAttention
		if m.Latent {
			kind = LatentAttention
		}
		gs = append(gs, LayerGroup{Kind: kind, Layers: full, TokenBytes: per * uint64(full)})
	}
	if m.WindowLayers > 0 {
		gs = append(gs, LayerGroup{Kind: SlidingWindow, Layers: m.WindowLayers, Window: m.SlidingWindow, TokenBytes: per * uint64(m.WindowLayers)})
	}
	if m.RecurrentLayers > 0 {
		gs = append(gs, LayerGroup{Kind: Recurrent, Layers: m.RecurrentLayers, StateBytes: m.StateBytes * uint64(m.RecurrentLayers)})
	}
	return gs
}

// Hybrid says whether m has layers that do not keep every token: a sliding
// window or recurrent layers. The hybrid schemes serve such a model by
// its groups; the uniform ones keep every token in every layer.
func (m Model) Hybrid() bool { return m.WindowLayers > 0 || m.RecurrentLayers > 0 }

// ExactNeed is the KV one sequence of tokens tokens needs, by m's groups:
// every token in the full (or latent) layers, the last Window tokens (all
// of them, when fewer) in the window layers, and the recurrent layers'
// state. It is what a scheme that wasted nothing would hold.
func (m Model) ExactNeed(tokens int) uint64 { return exactNeed(m.Groups(), tokens, 1) }

// exactNeed is ExactNeed of a model of groups gs while a chunk of its
// last chunk tokens is computed (1: a decode): its window layers read
// the last Window tokens before each of them, the last Window-1+chunk.
func exactNeed(gs []LayerGroup, tokens, chunk int) uint64 {
	var need uint64
	for _, g := range gs {
		switch g.Kind {
		case SlidingWindow:
			need += g.TokenBytes * uint64(min(tokens, g.Window-1+max(chunk, 1)))
		case Recurrent:
			need += g.StateBytes
		default:
			need += g.TokenBytes * uint64(tokens)
		}
	}
	return need
}

// PagedHybridHeld is the KV memory vLLM's hybrid KV cache manager holds
// for one sequence of tokens tokens of m, in blocks of blockTokens, and
// what each of m.Groups holds of it. It is the arithmetic of the paged
// baseline for a hybrid model, not a scheme (no simulation serves it):
//
//   - vLLM (vllm/v1/core/kv_cache_utils.py, the uniform page size case)
//     cuts each kind's layers into KV cache groups of groupSize layers
//     (_get_kv_cache_groups_uniform_page_size): the fewest layers any
//     kind has, or the most where that is under 1.5 times the fewest, so
//     that every block of its one pool
//     is groupSize layers of blockTokens tokens, whichever group takes it;
//     a kind's last group, short of groupSize layers, still takes whole
//     blocks.
//   - A full (or latent) group holds ceil(tokens/blockTokens) blocks; a
//     window group (vllm/v1/core/single_type_kv_cache_manager.py,
//     SlidingWindowManager) frees the blocks wholly behind the window:
//     the first (tokens - Window + 1) / blockTokens of them.
//   - A recurrent group holds one block a sequence, of groupSize states
//     (vLLM pads the attention block to the state's size; that padding is
//     not counted here).
func (m Model) PagedHybridHeld(tokens, blockTokens int) (held uint64, perGroup []uint64) {
	gs := m.Groups()
	if len(gs) == 0 || tokens < 0 || blockTokens < 1 {
		return 0, nil
	}
	size := pagedGroupSize(gs)
	perLayer := m.LayerTokenBytes() * uint64(blockTokens) * uint64(size) // a block's bytes
	blocks := (tokens + blockTokens - 1) / blockTokens
	perGroup = make([]uint64, len(gs))
	for i, g := range gs {
		groups := uint64((g.Layers + size - 1) / size)
		switch g.Kind {
		case SlidingWindow:
			skipped := max(tokens-g.Window+1, 0) / blockTokens
			perGroup[i] = groups * uint64(blocks-skipped) * perLayer
		case Recurrent:
			perGroup[i] = groups * uint64(size) * (g.StateBytes / uint64(g.Layers))
		default:
			perGroup[i] = groups * uint64(blocks) * perLayer
		}
		held += perGroup[i]
	}
	return held, perGroup
}
