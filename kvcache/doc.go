// Package kvcache owns the key-value cache of LLM serving: for every
// running sequence (a request), the attention keys and values of every
// token so far, in memory committed as tokens arrive, at addresses that
// never move while the sequence lives (safe to capture in a CUDA graph).
//
// # What it owns
//
// One arena.Sparse, the slot range, reserves MaxSeqs slots, each sized
// for MaxContext tokens in the chosen layout and rounded up to whole
// pages (PageSize). A sequence gets a slot at Admit and keeps it — and its
// addresses — until Free, also while preempted. Pages are committed only
// as tokens arrive (Append). A second arena.Sparse, the prefix store,
// holds the pages of prompts that sequences share. The cache also owns a
// goroutine that maps ahead and a stream for its copies. Nothing else
// reserves or commits: the arena does, the cache decides where.
//
// # Layouts
//
// A token keeps, in each layer, a key and a value of row = KVHeads *
// HeadDim * dtype-size bytes.
//
//   - PerLayer (vAttention's): a slot is 2*Layers regions — layer l's K,
//     then its V — each MaxContext*row bytes rounded up to a page; token t
//     of layer l's K lies at regionK(l) + t*row. K(l) is a plain row-major
//     tensor [tokens, KVHeads, HeadDim]. The unit of commit is one page in
//     every region (2*Layers pages), so the tail of a sequence wastes up to
//     2*Layers pages.
//   - TokenMajor: a page holds tpg = PageSize / (2*Layers*row) tokens of
//     every layer, laid out [layer][K, V][tpg tokens][heads][dim]. K(l) is
//     a strided tensor [groups, tpg, KVHeads, HeadDim] with strides
//     [PageSize/elt, KVHeads*HeadDim, HeadDim, 1] at element offset
//     l*2*tpg*row/elt (V: tpg*row/elt further). The tail wastes at most one
//     page; a page that is not a whole number of tokens wastes the rest of
//     it, in every page. A token larger than a page takes a group of
//     ceil(2*Layers*row / PageSize) pages of its own (tpg = 1; the first
//     stride is the group).
//   - Contiguous: a slot's tokens lie back to back, token t at
//     t*2*Layers*row, laid out [token][layer][K, V][heads][dim], tokens
//     straddling page boundaries. K(l) is a strided tensor [tokens,
//     KVHeads, HeadDim] with strides [2*Layers*row/elt, HeadDim, 1] at
//     element offset 2*l*row/elt (V: row/elt further): one uniform stride
//     a token, no block table, the shape FlashAttention's
//     flash_attn_with_kvcache takes for a cache without one. No byte of a
//     page inside a sequence is unused; the tail wastes less than a page.
//     The unit of commit is one page.
//
// The figures, with 2 MiB pages and MaxContext 32768 (go test ./kvcache
// -run TestLayoutFigures -v prints them, and at 64 KiB pages): internal
// waste is per token, the tail per sequence (worst and mean over lengths;
// the paged scheme's 16-token block wastes 7.5 tokens on average):
//
//	model        layout       tokens/page  internal  tail worst  tail mean  ÷ a block's
//	llama3-8b    PerLayer     16           0         127.9 MiB   63.9 MiB   (1024 rows a region's page)
//	llama3-8b    TokenMajor   16           0         1.88 MiB    0.94 MiB   (16 a page: 1x)
//	llama3-8b    Contiguous   16           0         1.88 MiB    0.94 MiB
//	qwen2.5-7b   TokenMajor   36.57        910 B     1.95 MiB    0.99 MiB   2.4x
//	qwen2.5-7b   Contiguous   36.57        0         1.99 MiB    1.00 MiB   2.4x
//	deepseek-v3  TokenMajor   29.84        2043 B    1.93 MiB    0.99 MiB   2.0x
//	deepseek-v3  Contiguous   29.84        0         2.00 MiB    1.00 MiB   2.0x
//
// PickLayout (and AutoLayout) takes the layout whose worst-case waste per
// sequence, over every length up to MaxContext, is the least (WorstWaste):
// TokenMajor where a page is a whole number of tokens (a tie with
// Contiguous, which it wins: its pages hold whole tokens), Contiguous
// where it is not (TokenMajor's internal waste grows with the length);
// PerLayer, whose tail is a page in each of 2*Layers regions, never wins
// on the presets.
//
// PerLayer hands attention kernels the same contiguous tensor a static
// buffer would and commits rarely (64 map calls every 1024 tokens for
// llama3-8b); TokenMajor and Contiguous waste 64 times less per sequence
// and commit a page at a time; TokenMajor's kernels index [t/tpg, t%tpg],
// Contiguous's [t] with a row stride — address arithmetic, no block
// table.
//
// # The states of a slot's unit
//
// A unit is one page of every region (PerLayer), one group (TokenMajor)
// or one page (Contiguous):
//
//	empty       reserved address space only
//	owned       the slot's own pages, committed in the slot range
//	borrowed    a prefix store unit's pages mapped here (arena.Sparse.Borrow)
//	committing  being committed by the mapping-ahead goroutine
//
// Occupancy hands out a copy of every slot's unit states, its sequence's
// state and length, and its pages: the cache's memory map.
//
// Invariants (Check walks them all): a running sequence's units below
// unitsFor(Len) are owned or borrowed; a preempted sequence's slot and an
// idle slot borrow nothing; a slot's shared units (those a match mapped)
// are borrowed, below its running sequence's tokens and mapped read-only
// (unless the driver cannot grant read-only access), and its other
// borrowed units writable;
// a store unit's borrower count is the number of slots mapping it, and a
// store unit no one maps is cached (listed, in the LRU list); the pages
// counted committed are the slots' owned units plus the store's pages,
// and never exceed the budget but by pages a lowered budget has not yet
// reclaimed.
//
// # Prefix sharing
//
// A prompt's whole units — all of whose tokens are the prompt's — are
// committed in a second arena.Sparse, the prefix store, and borrowed into
// the slot (arena.Sparse.Borrow), also where the slot kept a page from
// its last sequence (Deferred reclaim). A store unit is keyed by a chained
// 64-bit hash of the tokens up to its end: block i (BlockTokens tokens)
// hashes as hash(hash of block i-1, extra key, tokens of block i), the
// extra key covering adapters and salts; it keeps its tokens too, so a
// match is exact. It becomes matchable once its owner has written it —
// published when the owner's Seq.MarkWritten covers it, never before: a
// sequence freed or preempted before its rows were marked gives its units
// back unpublished, so no one is served keys never computed. A later
// sequence whose prompt starts with the same units under the same extra
// key maps the same physical pages at its own addresses, no copy, and
// read-only: its tensors refuse writes to those rows (ErrAccessDenied),
// and the pages are mapped read-only at its addresses — on the host
// driver, CUDA and AscendCL, wherever the driver grants read-only access
// — so that no kernel of a sharer changes what the others read. On the
// host driver the slot's tensors lie over read-only arena views
// (arena.Sparse.ViewReadOnly), which let those pages be read-only: a
// store through a slice Data handed out there faults, as a kernel's
// write faults on a device. The owner, which computed them, keeps them
// writable: rows it marked written must not be written again. The unit after them, partly covered by a
// cached unit's blocks, is copied once into the sequence's own unit. A
// store unit no sequence maps stays cached and is evicted least recently
// used first — a whole unit, hence whole pages — when memory is needed,
// before any running sequence is touched; a sequence gives its units back
// last first, so a chain is evicted from its end (a unit is found only
// through those before it). When the memory is needed for the whole units
// of a prompt, an evicted unit's pages stay committed and become the new
// store unit's (recycled: no decommit, no commit); pages not so reused
// are decommitted before anything else is committed. In the PerLayer layout sharing needs a page
// to hold whole rows (PageSize a multiple of KVHeads*HeadDim*dtype size);
// otherwise, or with NoPrefixSharing, every page is the slot's own. In
// the Contiguous layout a store unit is one page, listed with the tokens
// it completes (those whose last byte lies in it); where a match ends at
// a page boundary a token straddles, the sequence borrows the pages
// before the one that token starts in and copies that page into its own,
// so that it writes the token's rows in its own memory; if the budget has
// no room for the copy, the borrowed pages back to the last boundary no
// token straddles (every 2*Layers*row / gcd(2*Layers*row, PageSize)
// pages) are given back too.
//
// # KV events
//
// With Config.Events set, the cache tells the prefix index's changes as
// vLLM's KV events (vllm/distributed/kv_events.py), so that a router
// (llm-d's KV-cache indexer, NVIDIA Dynamo) can index it: BlockStored
// when a MarkWritten publishes units (a block is one store unit; its hash
// the prefix hash the store keys it by, its parent the previous unit's,
// none for a prompt's first; its tokens; Medium "GPU"; no LoRA id: the
// extra key is in the hash), BlockRemoved when units are evicted (for
// room, by SetBudget, to recycle their memory), AllBlocksCleared at
// Close. The blocks stored and not removed since are exactly the units
// the index lists. Events are queued under the cache's lock, one batch
// per call (EventBatch), and handed to the callback after the lock is let
// go, in order, from one goroutine at a time; the callback may call the
// cache. A panic in it is recovered and counted (Stats.EventPanics), the
// cache untouched, and the next batch is a resync — AllBlocksCleared,
// then every unit listed then — for the consumer may have lost the batch.
// A slow callback holds no lock: calls meanwhile queue their batches and
// return; past 65,536 queued events the queue is dropped
// (Stats.EventsDropped) and the next batch is a resync too. With no callback nothing
// is queued and no call allocates for events. EventWriter.Write, as the
// callback, writes each batch as one JSON line with vLLM's field names:
//
//	{"ts":1764219600.123456,"events":[{"type":"BlockStored","block_hashes":[11,12],
//	"parent_block_hash":null,"token_ids":[1,2,3,4],"block_size":2,"lora_id":null,
//	"medium":"GPU","lora_name":null}]}
//
// (vLLM sends msgpack; hashes here are unsigned 64-bit integers, written
// whole; data_parallel_rank is written when EventWriter.Rank is set).
//
// # Deferred reclaim
//
// Free gives back what the sequence borrowed but keeps its slot's own
// pages committed; a new sequence prefers a slot that has some. They are
// decommitted only when memory is needed (budget): whole units — so whole
// pages — of idle slots, the longest idle first and from their end. A
// kept page serves the next sequence where the unit is that sequence's
// own; where the unit is a whole unit of its prompt, which belongs in the
// prefix store, the Append that reaches it decommits the page and backs
// the unit from the store as if it were empty: the page's memory is the
// room for the store unit's, so nothing else is given back for it (and a
// kept page where a matched unit goes is given back at Admit). Only where the store has
// no unit to give (all mapped) does the kept page stay the slot's own.
// The mapping-ahead goroutine never commits a whole unit of its
// sequence's prompt (it leaves those to the store), so what it
// commits for a running sequence is never given back so; it is a kept
// page only for the slot's next sequence.
//
// # Mapping ahead
//
// A goroutine of the cache's own commits, for every running sequence, its
// next unit whenever fewer than MapAhead tokens of room remain, within the
// budget (it never reclaims, evicts or preempts), so that a decode step
// finds its page mapped. An Append that must still commit a page itself,
// or wait for one in flight, counts in Stats.Waits. Close stops it.
//
// For prompt chunks, which mapping ahead leaves to Append, an engine that
// schedules a step ahead calls Seq.Reserve while the step before
// computes: the chunk's pages are committed within the free budget
// (never reclaiming, evicting or preempting; Len unchanged) and its
// Append finds them. Cache.Warm creates pages for the page pool ahead,
// within the free budget, so that commits only map.
//
// # The step API
//
// Cache.Step takes a serving step's batch — a StepRequest per sequence,
// its tokens (one for a decode, a chunk for a prefill) — and appends them
// all under one lock, in slot order, handing back per sequence (SeqStep)
// its slot's address (Base), its length after the step and the positions
// the step writes; with Views, also the rows' tensors, as Append makes
// them. Token p of layer l's K (kv 0) or V (kv 1) lies at Base +
// RowOffset(l, kv, p). The bytes and books are those of one Append per
// request in slot order. It is atomic: the pages the batch's empty units
// need are counted against what the budget can give before anything is
// committed, and a batch that does not fit is refused (ErrOutOfMemory,
// naming the first sequence past it) with nothing changed. A sequence
// whose next page mapping ahead put there costs the step a look at the
// units its tokens reach; passing the last step's results back (into)
// makes a step allocate nothing.
//
// # The page pool
//
// The slot range and the prefix store share an arena.Pool: a page either
// gives back (a reclaim, an eviction, a Free or a Preempt) stays
// committed, unmapped, and the next commit of either maps it instead of
// creating one, so under pressure a page costs an unmap and a map, not a
// release and a create too (the dearest driver calls: 193 µs a create on
// an A100, 1.5 µs a map). Pooled pages are counted apart
// (Stats.PooledPages) and within the budget with the pages in use: a
// lowered budget trims the pool (SetBudget), and Close releases it.
//
// # Budget, admission and preemption
//
// Committed memory never exceeds the budget: an Append that needs pages
// first gives back, in order, the pages of idle slots, cached prefix store
// units no sequence maps (least recently used first) and the pages running
// sequences hold beyond their tokens; if that is not enough it fails with
// ErrOutOfMemory and changes nothing. SetBudget lowers (or raises) the budget at run time —
// several models sharing a device — giving back the same way and then
// preempting running sequences, the latest admitted first. A preempted
// sequence keeps its slot, addresses and tokens: Swap copies its bytes to
// pinned host memory (stream.HostBuffer) first and Resume puts them back
// identical; Drop loses them and Resume hands back views of the positions
// to recompute.
//
// Admission never over-promises. Admit and Resume plan first, under the
// cache's lock and without a driver call: the units the prefix store
// lends, the pages to commit for the rest (Admit: the whole prompt, less
// the pages the slot kept; Resume: every token), and the room — free
// pages, idle slots', cached store units but those the call borrows,
// surplus. Only a plan that fits is carried out; a refused one
// (ErrOutOfMemory; Stats.FailedAdmits, Stats.FailedResumes) has mapped,
// unmapped and committed nothing, and every book — Stats, Occupancy, the
// store and its LRU order, events — is as it was. CanAdmit and
// Seq.CanResume answer from the same plans, for the call and an Append
// after it (to the prompt and expected output; to the context and more),
// exactly when no other call comes between. The plans' lookups start
// from the units the last one matched (CanAdmit's for the same prompt
// slice, a sequence's own for CanResume), so a request asked about every
// step costs its matched units, not its prompt's tokens.
//
// # Lifetimes
//
// The tensors Append, K, V and UnitBytes return are views of the cache's
// memory (no copy), valid while their sequence runs. When the sequence is preempted
// or freed, the cache closed, or pages under them taken back, the cache
// revokes them (tensor.Lease) before the memory goes: each of them, and
// every view made from it, then answers ErrClosed instead of touching
// unmapped memory. Each At, Set or Copy through them holds the lease for
// its access, and the revoke waits for the accesses in flight: Preempt,
// SetBudget, Free and Close never unmap memory an access is touching, and
// never wait longer than one access (they do not wait for the caller to
// let go of the tensors, which simply stop working). They wait without
// the cache's lock: an access can last as long as its caller makes it (a
// transfer target's Access reads a peer's socket, up to its engine's
// LeaseTimeout), and every other call on the cache goes on meanwhile —
// including calls an access's callback makes into the cache. Once the
// revoke has begun, the sequence's tensors answer ErrClosed and new ones
// asked for it (Append, K, V) are refused likewise until the accesses in
// flight end; if the revoking call then refuses (a Preempt's swap finds
// no host memory) or SetBudget plans again without that sequence, the
// sequence runs on, and its next tensors are new. A slice their Data
// or Bytes handed out is not covered: it must not outlive the sequence's
// run, as with any device memory.
//
// # A sequence's units as bytes
//
// Seq.UnitBytes hands unit u of a sequence out as uint8 tensors, one per
// contiguous extent (TokenMajor: the unit's page group; Contiguous: its page; PerLayer: its
// page of each of the 2*Layers regions), for a transfer engine to move a
// sequence to another cache of the same shape (Layers, KVHeads, HeadDim,
// DType, PageSize, Layout) — disaggregated prefill and decode, package
// disagg. Unit u holds the same positions in both (Cache.UnitTokens;
// Cache.UnitsFor(n) is the units n tokens reach), so copying each extent
// into the other sequence's makes its keys and values the same. The
// receiving side fetches only the units its prefix store does not hold:
// the shared ones (Seq.SharedUnits, all of whose tokens are below
// Matched), which are read-only there as through K and V.
//
// # The sim driver
//
// Its memory cannot be addressed by the process: the cache keeps every
// book (slots, pages, borrowing, budget, stats) but hands out no tensors
// (Append's views are nil; K, V and UnitBytes are ErrUnsupported) and
// copies nothing.
// The serving simulation runs this way with model-sized memory.
//
// # Cost
//
// A call touches only what it changes, whatever the context or the
// sequences seen: an Append looks at the units its new tokens reach (and
// at the few past them MapAhead covers), Preempt and Free at the units
// they give back, and Stats reads counters kept as units, lengths and
// states change — pages owned, idle and surplus, running tokens, shared
// store units — which Check recomputes by walking and compares. Idle
// slots wait for reclaim in a list kept in the order they were freed; a
// sequence's unwritten store units in a list that publishing takes from
// the front; the mapping-ahead goroutine is handed the slots that want a
// unit rather than looking through them. A sequence's generated tokens
// are kept in blocks of 1,024 (the first starts at 16 and doubles), so
// no Append copies the context or allocates more than a block; a
// prefix lookup hashes only as far as it matches. Three walks remain,
// none of a running sequence's context or of the sequences seen: Admit
// and CanAdmit look at every slot to choose one, giving back running
// sequences' surplus passes over the slots until enough is free (both
// bounded by MaxSeqs), and a first prefix lookup of a prompt compares it
// as far as the store shares it (one asked again looks at the units it
// matched). What a page costs beyond that — its commit, borrow,
// read-only grant or decommit — is the arena's and the layers' below it
// (a match takes one read-only grant per region). A prompt's units take
// the store places they are given (free or recycled) in the store's
// order, and those side by side in the store are committed, and borrowed
// into a slot, in one arena call per run (per region and run in the
// PerLayer layout, arena.Sparse.BorrowEach: the access of the run granted
// in one driver call a region, read-only for a match's shared units in
// that same call); at Free a run of borrowed units goes back
// in one decommit per region. Maps and unmaps stay one driver call a page:
// cuMemMap maps one handle, and cuMemUnmap (like aclrtUnmapMem) takes the
// whole range one map made. A
// prompt page that recycles an evicted unit's still costs a chunk's map
// into the slot and, at Free, its unmap: the arena maps and unmaps chunk
// by chunk. A kept page at a whole prompt unit costs its decommit
// (one arena call per region and run of such pages) and the store
// unit's commit, which keeping it had saved.
//
// # What it never does
//
// It never copies a sequence to grow it, never moves a live sequence's
// addresses, never touches memory itself (the arena maps, tensors are
// views), never commits past the budget, and never changes anything in a
// call that fails.
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
package kvcache
