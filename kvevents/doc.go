// Package kvevents owns the wire form of a kvcache's KV events: it
// publishes the batches kvcache.Config.Events hands over as vLLM's
// ZmqEventPublisher does (vllm/distributed/kv_events.py), so that a
// router that subscribes to vLLM servers (llm-d's KV-cache indexer,
// NVIDIA Dynamo) subscribes to this cache the same way.
//
// # The wire
//
// The sockets listen on tcp://HOST:PORT or ipc://PATH (a Unix socket, as
// ZeroMQ's ipc transport), offset for a data-parallel rank above 0 as
// vLLM's offset_endpoint_port does (OffsetEndpoint).
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
// then the defaulted group_idx; AllBlocksCleared has none. The array
// forms are msgspec's for EventBatch and KVCacheEvent declared with
// array_like=True, as at vLLM commit
// b4e69e0af33f4698e157a262cc787fe61983cd3d (whose events had fewer
// fields); the map form is msgspec's for KVCacheEvent without it, as
// later vLLM declares it (its EventBatch stays array_like). What this
// package writes in them: block hashes and the parent are the cache's
// own prefix hashes (unsigned 64-bit integers; vLLM's ExternalBlockHash
// is an int or bytes), or with Options.VLLMHashSeed the hash vLLM gives
// the block's tokens (VLLMHasher says how), so that a router that hashes
// prompts itself finds these blocks too. lora_id and lora_name are nil, extra_keys
// nil (the cache's extra key, adapter or salt, is inside its hash),
// medium "GPU"; group_idx, kv_cache_spec_kind and
// kv_cache_spec_sliding_window are the event's GroupIdx, SpecKind ("" is
// "full_attention": a Cache's prefix index is one group of full
// attention) and SlidingWindow (0 is None, left off) — a kvcache.Hybrid
// names each group's index, kind and window. Fields vLLM added after that commit
// (locality, ownership, session_id, the skipped_ ones) are defaulted
// and left off in both layouts, which its decoders accept.
//
// # Replay
//
// With Options.ReplayEndpoint, a ROUTER socket answers a replay request
// — frames empty, start sequence number (8 bytes big-endian),
// as a DEALER sends it with an empty first frame or a REQ socket sends
// the number alone — with one message per kept batch from that number
// on (empty, sequence number, payload) and then the end marker (empty,
// -1 as 8 bytes, an empty payload), as vLLM's ROUTER sends them.
// The publisher keeps the last Options.BufferSteps batches (10,000, as
// vLLM) and at most Options.BufferBytes of them (256 MiB; vLLM bounds
// the count only); past either, the oldest go (a batch larger than
// BufferBytes is sent but not kept, and leaves nothing kept before it).
// A request from a number
// no longer kept is answered with what is still kept and the end marker,
// as vLLM's: the first number sent is then not the one asked for, and
// the client knows it lost what lay between. The answer ends at the
// newest batch published when the request came, and each batch is
// looked up as it is sent: one evicted while a slow client is answered
// is skipped likewise, and a client holds no batch but the one it is
// being sent. A request from a number not yet published gets the end
// marker alone. A malformed request (another
// frame count, a non-empty delimiter, a number not of 8 bytes) or a
// negative number is refused: counted (Stats.ReplayRefused) and
// answered by the end marker alone; it changes nothing.
//
// # Bounds
//
// Each subscriber has a queue of its own with a high-water mark
// (Options.HWM, 100,000 messages, as vLLM's) and at most
// Options.BufferBytes of payload (a batch larger than that is queued
// alone): past either, that subscriber's messages are dropped
// (Stats.Dropped) until its writer catches up; it sees the gap in the
// sequence numbers and asks the replay socket. The ZMTP wire is spoken by
// github.com/go-zeromq/zmq4 at the connection level only (zmq4.Open,
// Conn.SendMsg, Conn.RecvMsg): its sockets trust their peers (a frame of
// whatever length a peer announces is allocated, a handshake runs on the
// accept loop with no deadline, a slow subscriber stops the one writer of
// all), so this package runs the accept loops, the handshakes (a goroutine
// each), the queues and the writers itself (a subscriber's writer sends
// each message whole, and what zmq4 writes on the reading goroutine, a
// PONG to a subscriber's PING, goes between messages, never inside one),
// and reads every connection through a guard that closes it for what no
// subscriber or replay client sends: no ZMTP 3 greeting, a frame over 64
// KiB, a message of more than 8 frames (commands counted), a command frame
// with the MORE flag (a command is one frame), a message before the
// handshake's READY, a first command that is no READY of whole properties
// (zmq4's metadata parser slices past a short one and panics; a panic that
// zmq4 should still raise on a peer's input ends that connection, not the
// process), a handshake not done within 10 s, a peer of a socket type that
// does not fit (a subscriber must be SUB or XSUB, a replay client DEALER,
// REQ or ROUTER), a subscriber's message that is no subscription, or more
// than 256 subscriptions that are a prefix of the topic (one that is not
// matches nothing and is not kept, so a subscriber keeps len(Topic)+1 at
// most). A write that blocks 30 s cuts the peer off (a subscriber
// reconnects and replays). At most 256 subscribers and 256 replay clients
// are connected at once; Stats.Refused counts the connections closed. An
// accept that fails (no file descriptor left) is tried again after a pause
// doubling from 5 ms to 1 s, not in a loop that spins a core.
//
// # What it never does
//
// It never blocks the cache: Publish encodes the batch on the caller's
// goroutine (the cache calls it outside its lock) and queues it for each
// subscriber, dropping at the mark rather than wait. It never removes a
// file at an ipc:// path but a socket no one listens on. It never connects out
// (vLLM's publisher connects to an endpoint that names no wildcard; this
// one listens on every endpoint: a simulation is the stable end). It
// never asks the cache for a resync: a subscriber that lost batches the
// replay buffer no longer holds rebuilds its index from the next
// AllBlocksCleared. The library proper (kvcache and below) never imports
// this package, zmq4 or msgpack.
package kvevents
