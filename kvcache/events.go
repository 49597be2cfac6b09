package kvcache

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/isnil"
)

// KV events, as vLLM emits them (vllm/distributed/kv_events.py), so that
// a router indexing the caches of several servers (llm-d's KV-cache
// indexer, NVIDIA Dynamo) can index this one: a block is one prefix store
// unit, its hash the prefix hash the store keys it by.
//
// What is told: BlockStored when units enter the prefix index (a
// MarkWritten publishes them), BlockRemoved when they leave it (evicted:
// for room, by SetBudget, to recycle their memory), AllBlocksCleared when
// the whole index goes (Close). Those stored and not yet removed are
// exactly the units the index lists: a unit published while another with
// its hash is listed is never listed, so never told.
//
// Delivery (Config.Events): events are queued under the cache's lock,
// one batch per call that changed the index, and handed to the callback
// after the lock is let go, in order, by one goroutine at a time (the
// caller whose call queued them, or the one delivering already, which
// delivers the rest before it returns). The callback may call the cache.
// A panic in it is recovered and counted (Stats.EventPanics), the cache's
// books untouched; the consumer, which may have taken part of the batch,
// is sent a resync next (below), at once — or, if the resync panics too,
// at the next call that unlocks, so that a callback that always panics
// costs one try a call. A slow callback blocks no lock: the calls that
// queue events meanwhile return at once; the queue holds at most
// maxQueuedEvents events, past which they are dropped
// (Stats.EventsDropped) and the next batch delivered starts afresh:
// AllBlocksCleared, then a BlockStored for every unit the index lists
// then (a resync, so a consumer's index is never wrong for long, only
// late).

// Event is a KV event: *BlockStored, *BlockRemoved or *AllBlocksCleared.
type Event interface {
	// Type is the event's name in vLLM's encoding (the "type" tag).
	Type() string
}

// BlockStored says blocks entered the prefix index: a chain, each block
// following the one before it (the first follows ParentBlockHash, nil for
// a prompt's first block), their tokens in TokenIDs, BlockSize each.
type BlockStored struct {
	BlockHashes     []uint64
	ParentBlockHash *uint64
	TokenIDs        []int
	BlockSize       int
	// LoRAID is always nil: the cache knows adapters only through the
	// extra key, which is in the hash.
	LoRAID *int
	Medium string
	// GroupIdx is the layer group the blocks belong to (vLLM's
	// group_idx): 0 in a Cache, the group's index in a Hybrid.
	GroupIdx int
	// SpecKind is the group's kind as vLLM's KVCacheSpecKind names it
	// ("" is "full_attention"; a Hybrid's groups say "sliding_window" or
	// "mla_attention"), and SlidingWindow its window in tokens (0: none).
	SpecKind      string
	SlidingWindow int
}

// BlockRemoved says blocks left the prefix index.
type BlockRemoved struct {
	BlockHashes []uint64
	Medium      string
	// GroupIdx is as BlockStored's.
	GroupIdx int
}

// AllBlocksCleared says every block left the index.
type AllBlocksCleared struct{}

// Type is "BlockStored".
func (*BlockStored) Type() string { return "BlockStored" }

// Type is "BlockRemoved".
func (*BlockRemoved) Type() string { return "BlockRemoved" }

// Type is "AllBlocksCleared".
func (*AllBlocksCleared) Type() string { return "AllBlocksCleared" }

// EventBatch is the events of one call, in order, and when they were
// handed over (vLLM's KVEventBatch, less data_parallel_rank: one cache
// is one rank; the writer adds it when asked).
type EventBatch struct {
	TS     time.Time
	Events []Event
}

// EventMedium is the medium every event names: the cache is the device
// tier (vLLM's MEDIUM_GPU), whatever the driver.
const EventMedium = "GPU"

// maxQueuedEvents bounds the events queued while a callback runs.
const maxQueuedEvents = 1 << 16

// eventQueue is the cache's event books (mu guards them).
//
// Invariants: queue is empty when no one listens; resync means events
// were dropped and queue is empty until it is delivered; delivering says
// a goroutine is handing batches over (it alone may).
type eventQueue struct {
	queue      []EventBatch
	queued     int // events in queue
	max        int // maxQueuedEvents; tests lower it
	resync     bool
	delivering bool
	// open says the current batch (queue's last) is still being filled:
	// the call holding mu started it.
	open            bool
	panics, dropped int
	clearing        bool // Close is evicting: one AllBlocksCleared says it all
}

// listening reports whether events are to be queued.
func (c *Cache) listening() bool { return c.cfg.Events != nil && !c.ev.resync && !c.ev.clearing }

// pushEventLocked queues e in the batch of the call holding mu.
func (c *Cache) pushEventLocked(e Event) {
	if c.ev.queued >= c.ev.max {
		c.ev.dropped += c.ev.queued + 1
		c.ev.queue, c.ev.queued, c.ev.open, c.ev.resync = nil, 0, false, true
		return
	}
	if !c.ev.open {
		c.ev.queue = append(c.ev.queue, EventBatch{})
		c.ev.open = true
	}
	b := &c.ev.queue[len(c.ev.queue)-1]
	b.Events = append(b.Events, e)
	c.ev.queued++
}

// storedLocked tells that su entered the index; units published by one
// call one after another in a chain, of as many tokens each, go in one
// event (in the Contiguous layout a unit lists the tokens it completes,
// a number that varies from unit to unit by one).
func (c *Cache) storedLocked(su *storeUnit) {
	if !c.listening() {
		return
	}
	if c.ev.open {
		b := &c.ev.queue[len(c.ev.queue)-1]
		if last, ok := b.Events[len(b.Events)-1].(*BlockStored); ok && last.BlockHashes[len(last.BlockHashes)-1] == su.parent && su.u > 0 && last.BlockSize == len(su.tokens) {
			last.BlockHashes = append(last.BlockHashes, su.key)
			last.TokenIDs = append(last.TokenIDs, su.tokens...)
			return
		}
	}
	c.pushEventLocked(c.blockStored(su))
}

// blockStored is the event telling su alone.
func (c *Cache) blockStored(su *storeUnit) *BlockStored {
	e := &BlockStored{BlockHashes: []uint64{su.key}, TokenIDs: slices.Clone(su.tokens), BlockSize: len(su.tokens), Medium: EventMedium}
	if su.u > 0 {
		p := su.parent
		e.ParentBlockHash = &p
	}
	return e
}

// removedLocked tells that su left the index; removals one after another
// in a call go in one event.
func (c *Cache) removedLocked(su *storeUnit) {
	if !c.listening() {
		return
	}
	if c.ev.open {
		b := &c.ev.queue[len(c.ev.queue)-1]
		if last, ok := b.Events[len(b.Events)-1].(*BlockRemoved); ok {
			last.BlockHashes = append(last.BlockHashes, su.key)
			return
		}
	}
	c.pushEventLocked(&BlockRemoved{BlockHashes: []uint64{su.key}, Medium: EventMedium})
}

// clearedLocked tells that the whole index went.
func (c *Cache) clearedLocked() {
	if c.cfg.Events == nil || c.ev.resync {
		return // a resync delivers the index as it is then: empty
	}
	c.pushEventLocked(&AllBlocksCleared{})
}

// resyncLocked is the batch that replaces dropped events: the index
// as it is, from scratch, parents before children.
func (c *Cache) resyncLocked() EventBatch {
	b := EventBatch{Events: []Event{&AllBlocksCleared{}}}
	listed := make([]*storeUnit, 0, len(c.ps.byKey))
	for _, su := range c.ps.byKey {
		listed = append(listed, su)
	}
	slices.SortFunc(listed, func(x, y *storeUnit) int {
		if x.u != y.u {
			return x.u - y.u
		}
		return x.idx - y.idx
	})
	for _, su := range listed {
		b.Events = append(b.Events, c.blockStored(su))
	}
	return b
}

// unlock lets mu go and hands the queued batches to Config.Events, unless
// another goroutine is doing so (it hands these over too). It replaces
// mu.Unlock in the calls that may change the index.
func (c *Cache) unlock() {
	c.ev.open = false
	if c.ev.delivering || (len(c.ev.queue) == 0 && !c.ev.resync) {
		c.mu.Unlock()
		return
	}
	c.ev.delivering = true
	for {
		var batches []EventBatch
		resync := c.ev.resync
		if resync {
			batches = []EventBatch{c.resyncLocked()}
			c.ev.resync = false
		} else {
			batches = c.ev.queue
		}
		c.ev.queue, c.ev.queued = nil, 0
		if len(batches) == 0 {
			c.ev.delivering = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		ts := time.Now()
		ok := true
		for _, b := range batches {
			b.TS = ts
			if ok = c.deliver(b); !ok {
				break // the rest is in the resync
			}
		}
		c.mu.Lock()
		c.ev.open = false
		if !ok && resync {
			// The resync itself panicked: the next call tries again,
			// so that a callback that always panics costs one try a call.
			c.ev.delivering = false
			c.mu.Unlock()
			return
		}
	}
}

// deliver hands b to the callback, outside mu. A panic is recovered and
// counted, and the consumer, which may have taken part of b, is sent the
// whole index next (a resync, replacing what is queued); it reports
// whether b was taken whole.
func (c *Cache) deliver(b EventBatch) (ok bool) {
	defer func() {
		if r := recover(); r != nil {
			c.mu.Lock()
			c.ev.panics++
			c.ev.dropped += c.ev.queued
			c.ev.queue, c.ev.queued, c.ev.open, c.ev.resync = nil, 0, false, true
			c.mu.Unlock()
		}
	}()
	c.cfg.Events(b)
	return true
}

// EventWriter writes event batches as JSON lines: one object per batch,
// with vLLM's field names (its msgpack encoding of KVEventBatch, as
// JSON):
//
//	{"ts":1764219600.123456,"events":[{"type":"BlockStored","block_hashes":[...],
//	"parent_block_hash":null,"token_ids":[...],"block_size":16,"lora_id":null,
//	"medium":"GPU","lora_name":null}],"data_parallel_rank":0}
//
// ts is seconds since the epoch; hashes are unsigned 64-bit integers,
// written whole (a reader decoding numbers as float64 loses their low
// bits: decode them as integers); data_parallel_rank is written only when
// Rank is set. Write is the Config.Events callback: it is not safe for
// concurrent use on its own, but the cache calls it from one goroutine at
// a time.
type EventWriter struct {
	W    io.Writer
	Rank *int
	// Err is the first write error; later batches are not written.
	Err error
}

// Write writes b as one line (nothing once a write failed: see Err).
func (w *EventWriter) Write(b EventBatch) {
	if w == nil || w.W == nil || w.Err != nil {
		return
	}
	line, err := MarshalEventBatch(b, w.Rank)
	if err == nil {
		_, err = w.W.Write(line)
	}
	if err != nil {
		w.Err = errors.Wrapf(err, "kvcache: write a KV event batch")
	}
}

// wire forms, in vLLM's field order.
type (
	wireBatch struct {
		TS     json.Number `json:"ts"`
		Events []any       `json:"events"`
		Rank   *int        `json:"data_parallel_rank,omitempty"`
	}
	wireStored struct {
		Type            string   `json:"type"`
		BlockHashes     []uint64 `json:"block_hashes"`
		ParentBlockHash *uint64  `json:"parent_block_hash"`
		TokenIDs        []int    `json:"token_ids"`
		BlockSize       int      `json:"block_size"`
		LoRAID          *int     `json:"lora_id"`
		Medium          *string  `json:"medium"`
		LoRAName        *string  `json:"lora_name"`
	}
	wireRemoved struct {
		Type        string   `json:"type"`
		BlockHashes []uint64 `json:"block_hashes"`
		Medium      *string  `json:"medium"`
	}
	wireCleared struct {
		Type string `json:"type"`
	}
)

// MarshalEventBatch encodes b as EventWriter writes it: one JSON object
// and a newline; rank, when not nil, is its data_parallel_rank. It
// refuses an event of a type it does not know.
func MarshalEventBatch(b EventBatch, rank *int) ([]byte, error) {
	ts := b.TS.UnixMicro()
	sign := ""
	if ts < 0 {
		sign, ts = "-", -ts
	}
	w := wireBatch{TS: json.Number(fmt.Sprintf("%s%d.%06d", sign, ts/1e6, ts%1e6)), Events: make([]any, 0, len(b.Events)), Rank: rank}
	medium := func(m string) *string {
		if m == "" {
			return nil
		}
		return &m
	}
	for i, e := range b.Events {
		if isnil.Is(e) {
			return nil, errors.Wrapf(driver.ErrInvalid, "kvcache: encode a KV event batch: event %d is nil", i)
		}
		switch e := e.(type) {
		case *BlockStored:
			w.Events = append(w.Events, wireStored{Type: e.Type(), BlockHashes: nonNil(e.BlockHashes), ParentBlockHash: e.ParentBlockHash,
				TokenIDs: nonNil(e.TokenIDs), BlockSize: e.BlockSize, LoRAID: e.LoRAID, Medium: medium(e.Medium)})
		case *BlockRemoved:
			w.Events = append(w.Events, wireRemoved{Type: e.Type(), BlockHashes: nonNil(e.BlockHashes), Medium: medium(e.Medium)})
		case *AllBlocksCleared:
			w.Events = append(w.Events, wireCleared{Type: e.Type()})
		default:
			return nil, errors.Wrapf(driver.ErrInvalid, "kvcache: encode a KV event batch: event %d is a %T, not a KV event of this package", i, e)
		}
	}
	line, err := json.Marshal(w)
	if err != nil {
		return nil, errors.Wrapf(err, "kvcache: encode a KV event batch")
	}
	return append(line, '\n'), nil
}

// nonNil is s, or an empty slice for nil (JSON [] rather than null).
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// countEvents is the events in batches.
func countEvents(batches []EventBatch) int {
	n := 0
	for _, b := range batches {
		n += len(b.Events)
	}
	return n
}
