// Package kvevents owns the wire form of a kvcache's KV events: it
// publishes the batches kvcache.Config.Events hands over as vLLM's
// ZmqEventPublisher does (vllm/distributed/kv_events.py), so that a
// router that subscribes to vLLM servers (llm-d's KV-cache indexer,
// NVIDIA Dynamo) subscribes to this cache the same way.
//
// # The wire
//
// A ZMQ PUB socket sends each batch as one multipart message of three
// frames: the topic (Options.Topic, "" by default), the batch's sequence
// number (8 bytes, big-endian, from 0, one more each batch) and the
// payload, msgpack of vLLM's KVEventBatch as msgspec encodes it
// (array_like=True): an array of three — ts (float64 seconds since the
// epoch), the events, data_parallel_rank (Options.Rank, or nil) — always
// three, for strict decoders count them. Each event is a msgspec tagged
// struct (tag=True, omit_defaults=True) in one of two layouts
// (Options.Layout):
//
//   - Array (the default): an array, the tag first ("BlockStored",
//     "BlockRemoved", "AllBlocksCleared"), then the fields in
//     declaration order, trailing fields at their default left off, as
//     vLLM's KVCacheEvent with array_like=True encodes;
//   - Map: a map, "type" and the tag, then the fields by name, those
//     with a default left off while at it, as vLLM's KVCacheEvent
//     without array_like (its later form) encodes.
//
// The field order followed is vllm-project/vllm's at commit
// 0181ea3173e53eea8cf04a86891488e3dc89bb34: BlockStored is block_hashes,
// parent_block_hash, token_ids, block_size, lora_id, medium, lora_name,
// then the defaulted extra_keys, group_idx, kv_cache_spec_kind,
// kv_cache_spec_sliding_window; BlockRemoved is block_hashes, medium,
// then the defaulted group_idx; AllBlocksCleared has none. What this
// package writes in them: block hashes and the parent are the cache's
// own prefix hashes (unsigned 64-bit integers; vLLM's ExternalBlockHash
// is an int or bytes), not vLLM's hash of the tokens: a router that
// hashes prompts itself does not find these blocks, one that indexes
// the hashes it is sent does. lora_id and lora_name are nil, extra_keys
// nil (the cache's extra key, adapter or salt, is inside its hash),
// medium "GPU", group_idx 0 and kv_cache_spec_kind "full_attention"
// (the prefix index is one group of full attention); the sliding window
// is nil, so it is left off. Fields vLLM added after that commit
// (locality, ownership, session_id, the skipped_ ones) are defaulted
// and left off in both layouts, which its decoders accept.
//
// # Replay
//
// With Options.ReplayEndpoint, a ROUTER socket answers a replay request
// — frames identity, empty, start sequence number (8 bytes big-endian),
// as a DEALER sends it with an empty first frame or a REQ socket sends
// the number alone — with one message per kept batch from that number
// on (identity, empty, sequence number, payload) and then the end
// marker (identity, empty, -1 as 8 bytes, an empty payload), as vLLM's.
// The publisher keeps the last Options.BufferSteps batches (10,000, as
// vLLM) and at most Options.BufferBytes of them (256 MiB; vLLM bounds
// the count only); past either, the oldest go. A request from a number
// no longer kept is answered with what is still kept and the end marker,
// as vLLM's: the first number sent is then not the one asked for, and
// the client knows it lost what lay between. A request from a number not
// yet published gets the end marker alone. A malformed request (another
// frame count, a non-empty delimiter, a number not of 8 bytes) or a
// negative number is refused: counted (Stats.ReplayRefused) and
// answered by the end marker alone; it changes nothing.
//
// # Bounds
//
// The PUB socket has a high-water mark (Options.HWM, 100,000 messages,
// as vLLM): past it messages are dropped — for every subscriber at
// once, for zmq4's PUB has one queue and one writer where libzmq has one
// a subscriber — and a subscriber sees the gap in the sequence numbers
// and asks the replay socket. zmq4 trusts its peers, so both sockets
// listen through a transport of this package that reads what a peer
// sends before zmq4 does and closes a connection that sends a frame over
// 64 KiB, a message of more than 8 frames, or no handshake within 10 s,
// and gives each write to a peer 30 s (a subscriber that takes in
// nothing for that long is cut off, and reconnects and replays). What
// is left of zmq4 v0.17.0 that this does not fix: a PUB subscriber's
// connection goroutine that is handed more than 10 messages that are no
// subscription blocks until the process ends (the guard does not tell
// subscriptions from other messages).
//
// # What it never does
//
// It never blocks the cache: Publish encodes the batch on the caller's
// goroutine (the cache calls it outside its lock) and queues it with
// zmq4, which drops at the mark rather than wait. It never connects out
// (vLLM's publisher connects to an endpoint that names no wildcard; this
// one listens on every endpoint: a simulation is the stable end). It
// never asks the cache for a resync: a subscriber that lost batches the
// replay buffer no longer holds rebuilds its index from the next
// AllBlocksCleared. The library proper (kvcache and below) never imports
// this package, zmq4 or msgpack.
package kvevents
