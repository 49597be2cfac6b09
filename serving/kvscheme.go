package serving

// The contract between the serving simulation and a way of holding KV
// memory (a KV scheme), and the request as both see it.

import (
	"fmt"
	"math/bits"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// Scheme is one way of holding the KV memory of the sequences a server
// runs, driven by Simulate one call at a time (no scheme here is safe for
// concurrent use, and none needs to be). A sequence's life, as Simulate
// calls it:
//
//	CanAdmit? -> Admit -> Append ... -> Finish
//	                        \-> Preempt -> (CanAdmit? -> Resume -> Append ...)
//
// The scheme never decides what runs: Simulate admits in arrival order,
// and when an Append does not fit it preempts the latest admitted sequence
// and tries again. Every failed call changes nothing; misuse (a nil
// request, a request in the wrong state, a zero-valued scheme) is an error
// marked driver.ErrInvalid.
//
// The two baselines are BlockTable (vLLM's paged KV) and
// StaticReservation; this library's cache is Cache (package kvcache on
// the sim driver with model-sized memory). All three are built from the
// same Config. Cache's CanAdmit can ask for room for an expected
// output too (CacheOptions.ExpectOutput): Simulate's requests carry the
// trace's output, which a server does not know, so it guesses from what
// it has seen (see Cache).
type Scheme interface {
	// Name labels the scheme's column ("paged (vLLM)").
	Name() string
	// CanAdmit says whether r, new or preempted, could start now: room
	// for its whole context (r.Context() tokens), less what the scheme
	// already holds of it (a cached prefix). It changes nothing.
	CanAdmit(r *SimRequest) bool
	// Admit starts r, a request not yet admitted, and returns how many of
	// its first tokens the scheme already holds the KV of (a cached
	// prefix; at most r.Context()-1, since the last token must be
	// computed for its logits): Simulate computes only the rest. Simulate
	// asks CanAdmit first; a scheme that takes memory here (a static
	// reservation, a partly shared page's copy) fails with an error
	// marked driver.ErrOutOfMemory when it has none, changing nothing.
	Admit(r *SimRequest) (held int, err error)
	// Append makes room for the KV of n more tokens of r. When the budget
	// cannot hold them the error is marked driver.ErrOutOfMemory and
	// nothing changes.
	Append(r *SimRequest, n int) error
	// Finish frees r: what it holds goes back, or stays cached for later
	// requests.
	Finish(r *SimRequest) error
	// Preempt takes r's memory away. recompute says its KV is gone and must
	// be computed again after Resume; otherwise Resume gets it back whole
	// (swapped out).
	Preempt(r *SimRequest) (recompute bool, err error)
	// Resume restarts a preempted r and returns how many of its first
	// tokens the scheme holds the KV of, as Admit does: all of them after a
	// swap, a cached prefix (or nothing) after a recompute preemption.
	// Room is as for Admit.
	Resume(r *SimRequest) (held int, err error)
	// Stats is what the scheme holds now and has done so far.
	Stats() Stats
	// Check walks the scheme's books and reports every inconsistency.
	Check() error
}

// forker is a scheme that starts a sequence as a fork of another
// (Cache, HybridCache): Fork starts child, a sample not admitted, holding the KV of
// parent's computed tokens (its prompt, all computed), which it shares
// rather than copies. A refusal changes nothing: ErrOutOfMemory or
// ErrBusy for want of room, ErrUnsupported where the scheme cannot fork
// (the sample is then admitted as a request of its own).
type forker interface {
	Fork(parent, child *SimRequest) error
}

// checkFork refuses (ErrInvalid) a fork of parent into child that no
// scheme makes: a child admitted already, or not another sample of
// parent's prompt; a parent whose appended tokens (appended, its
// sequence holding held) are not exactly those computed.
func checkFork(scheme string, parent, child *SimRequest, admitted bool, appended, held int) error {
	switch {
	case admitted:
		return errors.Wrapf(driver.ErrInvalid, "serving: %s: fork request %d into %d: it is admitted already", scheme, parent.id, child.id)
	case child.prompt != parent.prompt || child.id == parent.id:
		return errors.Wrapf(driver.ErrInvalid, "serving: %s: fork request %d into %d: not another sample of its prompt", scheme, parent.id, child.id)
	case appended != parent.computed || held != appended:
		return errors.Wrapf(driver.ErrInvalid, "serving: %s: fork request %d: %d tokens appended, %d computed", scheme, parent.id, held, parent.computed)
	}
	return nil
}

// kvWriter is a scheme told when the tokens a step appended to a request
// are computed — their keys and values written — at the step's end (or,
// with Options.AdmitAhead, once the step is launched: every later
// step reads after it): Cache and HybridCache, whose prefix stores share
// only what a sequence wrote. Simulate tells Cache, and a HybridCache
// with no recurrent layers, sooner: as it schedules the tokens
// (simulation.scheduled).
type kvWriter interface {
	Computed(r *SimRequest) error
}

// Stats is what a KV scheme holds at one moment (the bytes) and has done
// since it was made (the counts). Bytes are of KV memory.
type Stats struct {
	// InUse is the memory held for the running sequences: blocks in use
	// (paged), reservations (static), the pages of live sequences' slots
	// and the prefix store pages they map (this cache). It is not all the
	// memory a scheme has committed: Cached is the rest (for this cache,
	// InUse + Cached is kvcache.Stats.Committed, the metric
	// vmarena_kvcache_committed_bytes).
	InUse uint64
	// Stored is the KV of the tokens kept in InUse memory, a token two
	// sequences share counted once. InUse - Stored is the waste.
	Stored uint64
	// Logical is the KV the running sequences see, a shared token counted
	// once per sequence: Logical - Stored is what sharing saves.
	Logical uint64
	// Cached is memory holding no running sequence's KV but kept for reuse
	// and given up when memory is needed: cached prefix blocks, and (this
	// cache) the pages idle slots keep for their next sequence.
	Cached uint64
	// Commits counts the times the scheme took memory for a sequence: a
	// block from the free list (paged), a reservation (static), a commit
	// call to the driver (this cache). The baselines' are bookkeeping, not
	// driver calls: their memory is allocated once, up front.
	Commits int64
	// PrefixQueried counts the tokens looked up in the prefix cache at
	// admission, PrefixHit those found (whole blocks of them).
	PrefixQueried, PrefixHit int64
	// Evictions counts cached blocks taken back for other content.
	Evictions int64
}

// Waste is the memory in use beyond the tokens stored in it.
func (s Stats) Waste() uint64 { return s.InUse - min(s.Stored, s.InUse) }

// Saved is what sharing saves: the KV the sequences see less what is
// stored.
func (s Stats) Saved() uint64 { return s.Logical - min(s.Stored, s.Logical) }

// DefaultBlockTokens is the paged scheme's block: vLLM's default 16 tokens,
// also the unit of its prefix hashing.
const DefaultBlockTokens = 16

// Bounds on a Config, far past any model's: they keep token counts
// within an int of any size and byte counts within 64 bits.
const (
	maxBlockTokens = 1 << 16
	maxKVSeqs      = 1 << 20
)

// Config is what every scheme of a simulation is built from, and the
// simulation itself: the same model, budget and limits for each, so that
// their figures compare.
type Config struct {
	// Model is the model served.
	Model Model
	// Budget is the bytes of KV memory all sequences share.
	Budget uint64
	// MaxContext is the most tokens one sequence holds, prompt and output
	// together. A request longer than that is refused at arrival. The
	// static scheme reserves this much for every sequence.
	MaxContext int
	// MaxSeqs is the most sequences running at once (vLLM's max_num_seqs,
	// 256 by default).
	MaxSeqs int
	// BlockTokens is the paged scheme's block size in tokens, the unit of
	// prefix hashing (0: DefaultBlockTokens).
	BlockTokens int
}

func (c *Config) defaults() {
	if c.BlockTokens == 0 {
		c.BlockTokens = DefaultBlockTokens
	}
}

// Check refuses a configuration no scheme can run with, with
// driver.ErrInvalid and a message that says what would be valid: a model
// Model.check refuses, BlockTokens, MaxSeqs or MaxContext out of range, or
// a budget that cannot hold one sequence of MaxContext tokens in whole
// blocks (every scheme must be able to run the longest request alone).
func (c Config) Check() error {
	c.defaults()
	if err := c.Model.check(); err != nil {
		return err
	}
	switch {
	case c.BlockTokens < 1 || c.BlockTokens > maxBlockTokens:
		return errors.Wrapf(driver.ErrInvalid, "serving: block of %d tokens, want 1 to %d", c.BlockTokens, maxBlockTokens)
	case c.MaxSeqs < 1 || c.MaxSeqs > maxKVSeqs:
		return errors.Wrapf(driver.ErrInvalid, "serving: at most %d sequences, want 1 to %d", c.MaxSeqs, maxKVSeqs)
	case c.MaxContext < 1 || c.MaxContext > MaxTokens*2:
		return errors.Wrapf(driver.ErrInvalid, "serving: max context of %d tokens, want 1 to %d", c.MaxContext, MaxTokens*2)
	}
	tb := c.Model.TokenBytes()
	blocks := (uint64(c.MaxContext) + uint64(c.BlockTokens) - 1) / uint64(c.BlockTokens)
	if need := blocks * uint64(c.BlockTokens) * tb; c.Budget < need {
		return errors.Wrapf(driver.ErrInvalid, "serving: a budget of %s does not hold one sequence of %d tokens of %s (%s a token, in blocks of %d): want at least %s, or a shorter max context (at most %d tokens)",
			units.Bytes(c.Budget), c.MaxContext, c.Model.Name, units.Bytes(tb), c.BlockTokens, units.Bytes(need), c.ContextCap())
	}
	return nil
}

// WindowNote says, for a simulation's header, what the uniform schemes
// make of the model's sliding window: "" for a model without one. They do
// not model the window (the hybrid schemes, HybridBlockTable and
// HybridCache, do): each keeps every token of a sequence in every layer,
// as full attention must. Where MaxContext is within the window that is exact (the
// window drops nothing); past it the note says that the figures are full
// attention's, more KV than the model needs for the longer sequences.
func (c Config) WindowNote() string {
	m := c.Model
	if m.SlidingWindow == 0 {
		return ""
	}
	layers := fmt.Sprintf("all %d layers", m.Layers)
	if m.WindowLayers < m.Layers {
		layers = fmt.Sprintf("%d of %d layers", m.WindowLayers, m.Layers)
	}
	if c.MaxContext <= m.SlidingWindow {
		return fmt.Sprintf("sliding window: %s of %s attend to the last %d tokens, no fewer than the max context of %d, so the window drops no token and the figures are exact",
			layers, m.Name, m.SlidingWindow, c.MaxContext)
	}
	return fmt.Sprintf("sliding window not modelled: %s of %s attend to the last %d tokens only, but every scheme keeps each token of a sequence in every layer; "+
		"for sequences longer than %d tokens (the max context is %d) the figures are full attention's, more KV than the model needs",
		layers, m.Name, m.SlidingWindow, m.SlidingWindow, c.MaxContext)
}

// ContextCap is the longest context the budget holds for one sequence in
// whole blocks: the most MaxContext may be. It is 0 for a model or block
// size Check refuses.
func (c Config) ContextCap() int {
	c.defaults()
	if c.Model.check() != nil || c.BlockTokens < 1 || c.BlockTokens > maxBlockTokens {
		return 0
	}
	hi, block := bits.Mul64(c.Model.TokenBytes(), uint64(c.BlockTokens))
	if hi != 0 || block == 0 {
		return 0
	}
	blocks := c.Budget / block
	return int(min(min(blocks, 2*MaxTokens)*uint64(c.BlockTokens), 2*MaxTokens))
}

// FitMaxContext is the MaxContext that refuses no request of reqs if the
// budget allows: the longest prompt plus output, rounded up to a whole
// block, at most ContextCap. At least one block. A prompt or output out of
// 0 to MaxTokens counts as the nearest bound (Simulate refuses it).
func FitMaxContext(reqs []Request, c Config) int {
	c.defaults()
	longest := 1
	for _, r := range reqs {
		longest = max(longest, min(max(r.Input, 0), MaxTokens)+min(max(r.Output, 0), MaxTokens))
	}
	bt := min(max(c.BlockTokens, 1), maxBlockTokens)
	longest = (longest + bt - 1) / bt * bt
	return min(longest, max(c.ContextCap(), bt))
}

// SimRequest is a request of a trace as a simulation serves it: the trace's
// Request, and how far it has got. A scheme reads it and never changes it;
// only Simulate does.
type SimRequest struct {
	// id is the sequence's index among the simulation's sequences (a
	// trace request of n samples is n consecutive ones): its output's
	// content identity. prompt is the first sample's id: its prompt's
	// content identity where the trace names none, so that the samples of
	// one request have equal prompts (prompt is id for a request of one).
	id, prompt int
	req        Request
	// context is the tokens known: the prompt and the tokens generated so
	// far. computed is those whose KV has been computed and is held;
	// computed <= context, and context - computed is 1 when decoding (the
	// last token generated), more while a prompt (or, after a recompute
	// preemption, the whole context) is computed in chunks.
	context, computed int
	// generated is the output tokens produced so far, <= req.Output.
	generated int
	state     simState
	// preempted says the request has been preempted: it starts again
	// through Resume, not Admit.
	preempted bool
	// forks are, on a request's first sample under a scheme that forks,
	// its other samples, to fork from it when it produces its first token.
	forks []*SimRequest
}

type simState uint8

const (
	simWaiting  simState = iota // arrived, not running (new or preempted)
	simRunning                  // admitted, holds KV
	simFinished                 // generated its output, freed
	simRefused                  // longer than MaxContext or empty: never ran
)

// ID is the sequence's index among the simulation's: the request's
// index in its trace where no request before it samples several.
func (r *SimRequest) ID() int {
	if r == nil {
		return 0
	}
	return r.id
}

// Prompt is the prompt's length in tokens.
func (r *SimRequest) Prompt() int {
	if r == nil {
		return 0
	}
	return r.req.Input
}

// Context is the tokens known: the prompt and the output generated so
// far. A running request holds the KV of all of them but the last one
// generated (it is computed in the next step).
func (r *SimRequest) Context() int {
	if r == nil {
		return 0
	}
	return r.context
}

// Token is token t of the request's context: a synthetic token id that
// stands for its content. Where the trace names t's block (Mooncake's and
// Bailian's hash_ids), the prompt's token t is a function of its block's
// id and its place in it, so equal ids give equal tokens; any other prompt
// token (an Azure or BurstGPT prompt's) is a function of its request's
// first sample's ID and t, shared by that request's samples alone; any
// output token is a function of the sequence's ID and t, shared with no
// other. Distinct contents give
// distinct tokens but with probability 2^-63 a pair. A nil request's
// tokens, and a negative t, are 0: no position holds them.
func (r *SimRequest) Token(t int) int {
	if r == nil || t < 0 {
		return 0
	}
	if bt := r.req.BlockSize(); t < r.req.Input && t/bt < len(r.req.Blocks) {
		return tokenID(1, uint64(r.req.Blocks[t/bt]), uint64(t%bt))
	}
	if t < r.req.Input {
		return tokenID(2, uint64(r.prompt), uint64(t))
	}
	return tokenID(2, uint64(r.id), uint64(t))
}

// Tokens appends tokens from to to-1 to dst, as Token names them. It
// mixes the first two words of tokenID once a run of tokens that share
// them (a named block, the rest of the prompt, the output), not once a
// token: the same tokens, a third of the mixing.
func (r *SimRequest) Tokens(dst []int, from, to int) []int {
	if r == nil || from < 0 {
		for t := from; t < to; t++ {
			dst = append(dst, r.Token(t))
		}
		return dst
	}
	t := from
	bt := r.req.BlockSize()
	// The tokens of named blocks end at the prompt's end or the last
	// block's, min(to, Input, nb*bt), written so that nb*bt is taken only
	// where it is at most named: it cannot overflow.
	named := min(to, r.req.Input)
	if nb := len(r.req.Blocks); nb < named/bt+1 {
		named = min(named, nb*bt)
	}
	for t < named {
		h := tokenRun(1, uint64(r.req.Blocks[t/bt]))
		end := named // the block's end where it comes first, t+rem without overflow
		if rem := bt - t%bt; rem < end-t {
			end = t + rem
		}
		for ; t < end; t++ {
			dst = append(dst, tokenAt(h, uint64(t%bt)))
		}
	}
	if end := min(to, r.req.Input); t < end {
		h := tokenRun(2, uint64(r.prompt))
		for ; t < end; t++ {
			dst = append(dst, tokenAt(h, uint64(t)))
		}
	}
	if t < to {
		h := tokenRun(2, uint64(r.id))
		for ; t < to; t++ {
			dst = append(dst, tokenAt(h, uint64(t)))
		}
	}
	return dst
}

// tokenID mixes a tag and two words into a non-negative int.
func tokenID(tag, a, b uint64) int {
	return tokenAt(tokenRun(tag, a), b)
}

// tokenRun is tokenID's mix of its first two words, the same for a run of
// tokens.
func tokenRun(tag, a uint64) uint64 { return mix64(mix64(tag) ^ a) }

// tokenAt is tokenID of the run whose mix is h and word b.
func tokenAt(h, b uint64) int { return int(mix64(h^b) >> 1) }

// mix64 is the finalizer of SplitMix64 (Steele, Lea and Flood, 2014):
// every bit of x moves about half the bits of the result.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// checkRequest refuses a nil request, for a scheme's method op.
func checkRequest(scheme, op string, r *SimRequest) error {
	if r == nil {
		return errors.Wrapf(driver.ErrInvalid, "serving: %s: %s: the request is nil", scheme, op)
	}
	return nil
}
