package kvevents

import (
	"bytes"

	"github.com/vmarena/vmarena/internal/errors"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/isnil"
	"github.com/vmarena/vmarena/kvcache"
)

// Layout is how an event is encoded inside a batch.
type Layout int

const (
	// Array encodes each event as a msgspec tagged array (array_like=True,
	// tag=True): the tag ("BlockStored", ...) first, then the fields in
	// declaration order, trailing fields at their default (None) left
	// off as omit_defaults does.
	Array Layout = iota
	// Map encodes each event as a msgspec tagged map: "type" and the tag,
	// then every field without a default, and each defaulted field that
	// is not None (omit_defaults), in declaration order.
	Map
)

// String is "array" or "map".
func (l Layout) String() string {
	switch l {
	case Array:
		return "array"
	case Map:
		return "map"
	}
	return "Layout(?)"
}

// ParseLayout is the Layout String names.
func ParseLayout(s string) (Layout, error) {
	switch s {
	case "array":
		return Array, nil
	case "map":
		return Map, nil
	}
	return 0, errors.Wrapf(driver.ErrInvalid, "kvevents: layout %q, want array or map", s)
}

// specKind is the kv_cache_spec_kind of an event that names none: a
// Cache's prefix index is one group of full attention, vLLM's
// FullAttentionSpec.
const specKind = "full_attention"

// The fields of vLLM's event classes in declaration order (the tag
// aside); required counts those without a default.
var (
	storedFields = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
		"extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"}
	removedFields = []string{"block_hashes", "medium", "group_idx"}
)

const (
	storedRequired  = 7
	removedRequired = 2
)

// EncodeBatch is b as vLLM's msgspec encodes a KVEventBatch: a msgpack
// array of three — ts (seconds since the epoch, a float64), the events
// (each in layout), data_parallel_rank (rank, or nil when rank is nil).
// It refuses a nil event and one of a type kvcache does not define.
func EncodeBatch(b kvcache.EventBatch, rank *int, layout Layout) ([]byte, error) {
	if layout != Array && layout != Map {
		return nil, errors.Wrapf(driver.ErrInvalid, "kvevents: encode a batch: layout %d, want Array or Map", int(layout))
	}
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	w := &writer{enc: enc}
	w.arrayLen(3)
	w.float(float64(b.TS.UnixNano()) / 1e9)
	w.arrayLen(len(b.Events))
	for i, e := range b.Events {
		if isnil.Is(e) {
			return nil, errors.Wrapf(driver.ErrInvalid, "kvevents: encode a batch: event %d is nil", i)
		}
		switch e := e.(type) {
		case *kvcache.BlockStored:
			w.stored(e, layout)
		case *kvcache.BlockRemoved:
			w.removed(e, layout)
		case *kvcache.AllBlocksCleared:
			w.event(layout, e.Type(), 0)
		default:
			return nil, errors.Wrapf(driver.ErrInvalid, "kvevents: encode a batch: event %d is a %T, not a kvcache event", i, e)
		}
	}
	if rank == nil {
		w.nil()
	} else {
		w.int(int64(*rank))
	}
	if w.err != nil {
		return nil, errors.Wrapf(w.err, "kvevents: encode a batch")
	}
	return buf.Bytes(), nil
}

// writer is a msgpack encoder that keeps its first error.
type writer struct {
	enc *msgpack.Encoder
	err error
}

func (w *writer) do(err error) {
	if w.err == nil {
		w.err = err
	}
}

func (w *writer) arrayLen(n int)  { w.do(w.enc.EncodeArrayLen(n)) }
func (w *writer) float(f float64) { w.do(w.enc.EncodeFloat64(f)) }
func (w *writer) int(i int64)     { w.do(w.enc.EncodeInt(i)) }
func (w *writer) uint(u uint64)   { w.do(w.enc.EncodeUint(u)) }
func (w *writer) str(s string)    { w.do(w.enc.EncodeString(s)) }
func (w *writer) nil()            { w.do(w.enc.EncodeNil()) }
func (w *writer) key(l Layout, k string) {
	if l == Map {
		w.str(k)
	}
}

// event starts an event of tag with n fields after it.
func (w *writer) event(l Layout, tag string, n int) {
	if l == Map {
		w.do(w.enc.EncodeMapLen(n + 1))
		w.str("type")
	} else {
		w.arrayLen(n + 1)
	}
	w.str(tag)
}

func (w *writer) optStr(s string) {
	if s == "" {
		w.nil()
		return
	}
	w.str(s)
}

func (w *writer) hashes(h []uint64) {
	w.arrayLen(len(h))
	for _, x := range h {
		w.uint(x)
	}
}

// stored writes e: in Array, the seven required fields, then extra_keys
// (nil: the cache's extra key is inside its hash), group_idx,
// kv_cache_spec_kind and, when e has one, the sliding window (None
// otherwise, trailing and left off); in Map, the required fields,
// group_idx, kv_cache_spec_kind and the window when set.
func (w *writer) stored(e *kvcache.BlockStored, l Layout) {
	window := e.SlidingWindow > 0
	n := storedRequired + 3 + b2i(window) // Array: extra_keys, group_idx, kind, window
	if l == Map {
		n = storedRequired + 2 + b2i(window)
	}
	w.event(l, e.Type(), n)
	w.key(l, "block_hashes")
	w.hashes(e.BlockHashes)
	w.key(l, "parent_block_hash")
	if e.ParentBlockHash == nil {
		w.nil()
	} else {
		w.uint(*e.ParentBlockHash)
	}
	w.key(l, "token_ids")
	w.arrayLen(len(e.TokenIDs))
	for _, t := range e.TokenIDs {
		w.int(int64(t))
	}
	w.key(l, "block_size")
	w.int(int64(e.BlockSize))
	w.key(l, "lora_id")
	if e.LoRAID == nil {
		w.nil()
	} else {
		w.int(int64(*e.LoRAID))
	}
	w.key(l, "medium")
	w.optStr(e.Medium)
	w.key(l, "lora_name")
	w.nil()
	if l == Array {
		w.nil() // extra_keys
	}
	w.key(l, "group_idx")
	w.int(int64(e.GroupIdx))
	w.key(l, "kv_cache_spec_kind")
	if e.SpecKind == "" {
		w.str(specKind)
	} else {
		w.str(e.SpecKind)
	}
	if window {
		w.key(l, "kv_cache_spec_sliding_window")
		w.int(int64(e.SlidingWindow))
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// removed writes e: block_hashes, medium, group_idx.
func (w *writer) removed(e *kvcache.BlockRemoved, l Layout) {
	w.event(l, e.Type(), removedRequired+1)
	w.key(l, "block_hashes")
	w.hashes(e.BlockHashes)
	w.key(l, "medium")
	w.optStr(e.Medium)
	w.key(l, "group_idx")
	w.int(int64(e.GroupIdx))
}
