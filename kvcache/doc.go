// Package kvcache owns the key-value cache of LLM serving: for every
// running sequence (a request), the attention keys and values of every
// token so far, in memory committed as tokens arrive, at addresses that
// never move while the sequence lives (safe to capture in a CUDA graph).
// The manual — layouts and their figures, prefix sharing, KV events,
// deferred reclaim, mapping ahead, the step API, the page pool, admission
// and preemption, lifetimes, cost — is docs/kvcache.md.
//
// # What it owns
//
// One arena.Sparse, the slot range, reserves MaxSeqs slots, each sized
// for MaxContext tokens in the chosen Layout (PerLayer, TokenMajor,
// Contiguous) and rounded up to whole pages (PageSize). A sequence gets a
// slot at Admit and keeps it — and its addresses — until Free, also while
// preempted. Pages are committed only as tokens arrive (Append, Step). A
// second arena.Sparse, the prefix store, holds the pages of prompts that
// sequences share, borrowed into their slots (read-only to all but the
// sequence that wrote them); both share one arena.Pool of committed,
// unmapped pages. The cache also owns a goroutine that maps ahead and a
// stream for its copies. Nothing else reserves or commits: the arena
// does, the cache decides where.
//
// # Invariants
//
// A slot's unit (a page of every region, a group or a page, by layout) is
// empty, owned (committed in the slot range), borrowed (a store unit's
// pages mapped here), committing (by the mapping-ahead goroutine) or kept
// (a listed store unit's pages its last sequence borrowed, left mapped
// for the next one: kept.go).
// Check walks them all:
//
//   - a running sequence's units below unitsFor(Len) are owned or
//     borrowed, but those wholly behind its window (Config.Window),
//     which are empty, and its slot keeps none; a preempted sequence's
//     slot and an idle slot borrow nothing (they may keep units);
//   - a slot's shared units (those a match mapped) are borrowed, below
//     its running sequence's tokens and mapped read-only (unless the
//     driver cannot grant read-only access); its other borrowed units are
//     writable;
//   - a store unit's borrower count is the number of slots borrowing it,
//     its kept list the slots keeping it; a store unit no one borrows is
//     cached, in the LRU list, and its eviction unmaps its kept mappings
//     first; a unit is matchable only once its owner marked its rows
//     written;
//   - the pages counted committed are the slots' owned units plus the
//     store's pages, and with the pooled pages (counted apart) never
//     exceed the budget but by pages a lowered budget has not yet
//     reclaimed;
//   - the counters Stats reads equal what Check recomputes by walking.
//
// Admission never over-promises: Admit and Resume plan before any driver
// call, Step counts its batch's pages against the budget before it
// commits any, and only what fits is carried out. A call touches
// only what it changes, never a running sequence's whole context.
//
// Seq.Fork shares a running sequence's written pages with a child at its
// own slot, read-only in both, through the prefix store (its own units
// handed over without a copy); only a partly written last unit is copied,
// on the first write of either side. A fork costs a map per shared page
// and at most one unit copied, never a copy of the context.
//
// With a Window, an Append first gives back the units wholly behind the
// window of its first token, at the same addresses (window.go): a
// sequence holds O(Window). With a Ring (PerLayer only, no prefix
// sharing) each layer's K and V is a ring of pages of a range of its own,
// mapped twice back to back in the slot, so the last Window tokens are
// one contiguous slice (ring.go); the ring's pages are committed at the
// first Append and never again.
//
// # What it never does
//
// It never copies a sequence to grow it, never moves a live sequence's
// addresses, never touches memory itself (the arena maps, tensors are
// views), never commits past the budget, never lets a tensor outlive the
// memory under it (revoked views answer ErrClosed), and never changes
// anything in a call that fails, but one: a Hybrid.SetBudget below what
// no preemption frees keeps the preemptions it made and sets the budget
// to what stays held, answering ErrOutOfMemory. On the CUDA and AscendCL drivers its
// tensors are device tensors (an address and a length; the driver's
// copies move their bytes). On the sim driver it keeps every book but
// hands out no tensors.
//
// # Errors
//
// Every refusal is marked with one sentinel of the driver package, its
// message starting "kvcache: ": ErrInvalid for a value no call could
// accept (a bad config names its field; a preempted sequence where a
// running one is needed), ErrClosed for a closed cache or a freed
// sequence, ErrBusy when every slot holds a sequence, ErrOutOfMemory when
// the budget cannot hold what is asked even after giving back idle and
// cached pages, ErrUnsupported for tensors on the sim driver. Its tensors
// answer ErrClosed once revoked and ErrAccessDenied to a write into rows
// shared through the prefix store.
//
// The calls that end a sequence's tensors (Free, Preempt, Close, a
// SetBudget that preempts it, an Append or Step that must move the
// memory under them) wait for the accesses in flight through them, as
// tensor.Lease.Revoke does. An access may call into the cache,
// but one of those calls on its own sequence, made from inside the
// access, waits for itself and never returns.
//
// # Hybrid models
//
// A Hybrid (hybrid.go) holds a model whose layers are of several kinds:
// one Cache per attention group (FullAttention; SlidingWindow with
// Config.Window, or its Ring; Latent, one row of HeadDim a token and a
// layer, kept as a K and a V of half of it each side by side in the
// Contiguous layout) and one recurrent state store (recurrent.go: a slot
// of every recurrent layer's StateBytes a sequence, in an arena.Sparse of
// its own, and copied checkpoints at unit boundaries). All draw on one
// budget (hybrid_share.go): between calls each group's budget is what it
// holds; a call into a group is granted the free memory, and the other
// groups give back for it, stage by stage, pooled pages, cached prefix
// units and checkpoints, idle and surplus pages — never a running
// sequence's tokens. Its lock (lockrank KVHybrid) is taken before any
// group's. A hybrid prompt starts from the longest prefix every group
// serves, at a recurrent checkpoint when there are recurrent groups;
// Admit, Append, Fork and Resume plan every group before any driver call.
// Fork copies the recurrent state (it is rewritten whole every step, so
// sharing it would copy at the next step anyway); Swap keeps it in its
// slot, Drop gives it back and Resume restarts from a checkpoint.
//
// # Use
//
//	c, err := kvcache.New(space, mem, cfg) // cfg from kvcache.Preset, then MaxContext, MaxSeqs
//	seq, err := c.Admit(prompt, 0)         // 0: no extra key
//	step, err := seq.Append(prompt[seq.Len():])
//	// write the rows' K and V through step.Layers, then
//	seq.MarkWritten(seq.Len()) // the prompt's whole units become shareable
//	err = seq.Free()
//
// Example and ExampleCache_Step run this whole.
package kvcache
