package kvcache

import (
	"fmt"

	"github.com/cockroachdb/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/lockrank"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/vaspace"
)

// GroupKind is the kind of a hybrid model's layer group.
type GroupKind uint8

const (
	// FullAttention layers attend to every token before: each token keeps
	// a key and a value of KVHeads*HeadDim elements a layer.
	FullAttention GroupKind = iota
	// SlidingWindow layers attend to the last Window tokens only.
	SlidingWindow
	// Latent layers keep one latent row a token and a layer (multi-head
	// latent attention, DeepSeek-V2/V3): HeadDim elements, no separate key
	// and value.
	Latent
	// Recurrent layers (Mamba, linear attention) keep a fixed-size state
	// per sequence, StateBytes a layer, whatever its length.
	Recurrent
	numGroupKinds
)

func (k GroupKind) String() string {
	switch k {
	case FullAttention:
		return "full"
	case SlidingWindow:
		return "window"
	case Latent:
		return "latent"
	case Recurrent:
		return "recurrent"
	}
	return fmt.Sprintf("GroupKind(%d)", uint8(k))
}

// attends says a group of kind k keeps rows a token (a Cache of its own).
func (k GroupKind) attends() bool { return k < Recurrent }

// Group is one layer group of a hybrid model: layers of one kind and
// shape.
type Group struct {
	Kind GroupKind
	// Layers is the number of layers of this kind.
	Layers int
	// KVHeads is the attention kinds' KV heads (Latent: 1).
	KVHeads int
	// HeadDim is the attention kinds' head width (Latent: the latent
	// row's width, one row a token and a layer, not a K and a V).
	HeadDim int
	// Window is SlidingWindow's tokens attended.
	Window int
	// StateBytes is Recurrent's bytes of state a layer keeps per sequence.
	StateBytes uint64
}

// HybridConfig is the shape of a hybrid cache: its groups, the sequences
// it holds and the one budget they all draw on.
type HybridConfig struct {
	// Groups are the model's layer groups, at least one.
	Groups []Group
	DType  tensor.DType
	// BlockTokens is the unit of prefix hashing and of recurrent
	// checkpoints, in tokens (default 16).
	BlockTokens int
	// MaxContext is the most tokens one sequence holds.
	MaxContext int
	// MaxSeqs is the number of sequence slots (every group has as many).
	MaxSeqs int
	// Budget is the most memory all groups together keep committed
	// (default, 0: the device's capacity). SetBudget changes it.
	Budget uint64
	// PageSize is every group's unit of commit (default, 0: the device's
	// recommended granularity).
	PageSize uint64
	// Device holds every page.
	Device driver.DeviceID
	// Ring asks sliding-window groups for the double-mapped ring (the
	// last Window tokens one contiguous slice).
	Ring bool
	// NoPrefixSharing turns prefix sharing off in every group.
	NoPrefixSharing bool
	// Events, when set, is told every group's prefix index changes, each
	// BlockStored and BlockRemoved naming its group (GroupIdx).
	Events func(EventBatch)
}

// Hybrid is a KV cache of a model whose layers are of several kinds: one
// Cache per attention group and a state store for the recurrent groups,
// under one budget. Safe for concurrent use.
type Hybrid struct {
	cfg HybridConfig
	// mu orders every call: the groups' budgets move under it.
	mu lockrank.Mutex[lockrank.KVHybrid]
}

// HybridSeq is one sequence of a Hybrid: a Seq in every attention group
// and a state slot in the recurrent store, all of the same tokens.
type HybridSeq struct {
	h *Hybrid
}

// HybridStep is what an Append or a Resume made room for: positions
// [Pos, Pos+N) for the caller to compute. Groups[i] is group i's Step
// (zero for a recurrent group): after a Resume a group may start later
// than Pos (its rows below its own Pos are there), and the caller writes
// each group's rows from its own Pos.
type HybridStep struct {
	Pos, N int
	Groups []Step
}

// HybridStats is a Hybrid's figures.
type HybridStats struct {
	// Budget is the one budget; Committed the memory all groups keep
	// committed (pooled pages included).
	Budget, Committed uint64
	// Groups[i] is attention group i's Stats (zero for a recurrent one).
	Groups []Stats
	// StateBytes is the recurrent store's committed memory: sequences'
	// states and checkpoints.
	StateBytes uint64
	// StateSlots and Checkpoints are the states held by live sequences
	// and the checkpoints kept.
	StateSlots, Checkpoints int
	// CheckpointHits is the admissions that started from a checkpoint.
	CheckpointHits int
	// Seqs is the live sequences.
	Seqs int
}

// NewHybrid makes a hybrid cache of cfg's groups on space and mem: one
// Cache per attention group and one recurrent state store, every page
// counted against cfg.Budget. It refuses a config it cannot hold
// (ErrInvalid, naming the field).
func NewHybrid(space *vaspace.Space, mem *physical.Memory, cfg HybridConfig) (*Hybrid, error) {
	return nil, errors.Wrap(driver.ErrUnsupported, "kvcache: new hybrid cache: not built yet")
}

// Config is the config the cache was made with, defaults filled in.
func (h *Hybrid) Config() HybridConfig {
	if h == nil {
		return HybridConfig{}
	}
	return h.cfg
}

// CanAdmit says whether Admit of prompt, followed by the Append of the
// rest of it and expectedOutput more tokens, would fit now in every
// group, changing nothing.
func (h *Hybrid) CanAdmit(prompt []int, expectedOutput int) (bool, error) {
	return false, errors.Wrap(driver.ErrUnsupported, "kvcache: hybrid can admit: not built yet")
}

// Admit starts a sequence of prompt in every group, from the longest
// prefix every group can serve (full and latent units the stores hold,
// window units still held, a recurrent checkpoint at that boundary). It
// plans every group before any driver call; a refused admission changes
// nothing.
func (h *Hybrid) Admit(prompt []int) (*HybridSeq, error) {
	return nil, errors.Wrap(driver.ErrUnsupported, "kvcache: hybrid admit: not built yet")
}

// Stats is the cache's figures now.
func (h *Hybrid) Stats() HybridStats { return HybridStats{} }

// SetBudget changes the one budget: lowered, it gives back idle and
// cached pages of every group, then preempts the latest admitted
// sequences in mode until all fits, returning them.
func (h *Hybrid) SetBudget(budget uint64, mode PreemptMode) ([]*HybridSeq, error) {
	return nil, errors.Wrap(driver.ErrUnsupported, "kvcache: hybrid set budget: not built yet")
}

// Check walks every group's books and the recurrent store's.
func (h *Hybrid) Check() error {
	return errors.Wrap(driver.ErrUnsupported, "kvcache: hybrid check: not built yet")
}

// Close frees every sequence and releases every group's memory.
func (h *Hybrid) Close() error {
	return errors.Wrap(driver.ErrUnsupported, "kvcache: hybrid close: not built yet")
}

// Append adds tokens to the sequence in every group and makes room for
// their rows (and the recurrent state stays in its slot).
func (s *HybridSeq) Append(tokens []int) (HybridStep, error) {
	return HybridStep{}, errors.Wrap(driver.ErrUnsupported, "kvcache: hybrid append: not built yet")
}

// MarkWritten says the first n tokens' rows are written in every group
// and the recurrent state is that of n tokens: whole prompt units become
// shareable, and a recurrent checkpoint is taken at the prompt's last
// unit boundary once n reaches it.
func (s *HybridSeq) MarkWritten(n int) error {
	return errors.Wrap(driver.ErrUnsupported, "kvcache: hybrid mark written: not built yet")
}

// Len is the sequence's tokens.
func (s *HybridSeq) Len() int { return 0 }

// Matched is the tokens Admit (or the last Resume) found in every group.
func (s *HybridSeq) Matched() int { return 0 }

// Fork makes a child sharing the sequence's pages in every attention
// group (Seq.Fork) and a copy of its recurrent state.
func (s *HybridSeq) Fork() (*HybridSeq, error) {
	return nil, errors.Wrap(driver.ErrUnsupported, "kvcache: hybrid fork: not built yet")
}

// Preempt preempts the sequence in every group (mode as Seq.Preempt);
// its recurrent state is kept.
func (s *HybridSeq) Preempt(mode PreemptMode) error {
	return errors.Wrap(driver.ErrUnsupported, "kvcache: hybrid preempt: not built yet")
}

// Resume brings a preempted sequence back in every group; the step says
// what to recompute.
func (s *HybridSeq) Resume() (HybridStep, error) {
	return HybridStep{}, errors.Wrap(driver.ErrUnsupported, "kvcache: hybrid resume: not built yet")
}

// Free ends the sequence in every group.
func (s *HybridSeq) Free() error {
	return errors.Wrap(driver.ErrUnsupported, "kvcache: hybrid free: not built yet")
}

// Group is attention group i's sequence (nil for a recurrent group or an
// index out of range), for its tensors (K, V, Rows of a Step) only: its
// Append, Fork, Preempt, Resume and Free go through the HybridSeq.
func (s *HybridSeq) Group(i int) *Seq { return nil }

// State is the recurrent state of recurrent layer layer (numbered across
// the recurrent groups in order): StateBytes bytes, for the caller to
// read and write.
func (s *HybridSeq) State(layer int) (*tensor.Tensor, error) {
	return nil, errors.Wrap(driver.ErrUnsupported, "kvcache: hybrid state: not built yet")
}
