package kvevents

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/vmarena/vmarena/internal/errors"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"

	"github.com/vmarena/vmarena/kvcache"
)

// The subscriber's side: a strict decoder of the payload as vLLM's own
// classes define it (vllm/distributed/kv_events.py): KVEventBatch
// (array_like) of ts, events, data_parallel_rank — three elements,
// counted — and each event a tagged struct whose fields come in
// declaration order, the required ones present, the defaulted ones
// trailing (Array) or named (Map). It knows the field lists on its own
// (vLLM's, written out here), not through the encoder's.

// vllmFields are vLLM's classes: each field, and how many lead without a
// default.
var vllmFields = map[string]struct {
	names    []string
	required int
}{
	"BlockStored": {[]string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
		"extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"}, 7},
	"BlockRemoved":     {[]string{"block_hashes", "medium", "group_idx"}, 2},
	"AllBlocksCleared": {nil, 0},
}

// wireEvent is a decoded event; a field absent on the wire is nil.
type wireEvent struct {
	Tag           string
	Fields        int // fields on the wire, the tag aside
	BlockHashes   []uint64
	Parent        *uint64
	TokenIDs      []int64
	BlockSize     *int64
	LoRAID        *int64
	Medium        *string
	LoRAName      *string
	ExtraKeys     any
	GroupIdx      *int64
	SpecKind      *string
	SlidingWindow *int64
}

type wireBatch struct {
	TS     float64
	Events []wireEvent
	Rank   *int64
}

// decodeBatch decodes payload strictly, in layout.
func decodeBatch(payload []byte, layout Layout) (wireBatch, error) {
	r := bytes.NewReader(payload)
	d := msgpack.NewDecoder(r)
	var b wireBatch
	n, err := d.DecodeArrayLen()
	if err != nil {
		return b, err
	}
	if n != 3 {
		return b, errors.Newf("a batch of %d elements, want 3 (ts, events, data_parallel_rank)", n)
	}
	if c, err := d.PeekCode(); err != nil || c != msgpcode.Double {
		return b, errors.Newf("ts is not a float64 (code %#x, %v)", c, err)
	}
	if b.TS, err = d.DecodeFloat64(); err != nil {
		return b, err
	}
	ne, err := d.DecodeArrayLen()
	if err != nil || ne < 0 {
		return b, errors.Newf("events: not an array (%d, %v)", ne, err)
	}
	for i := range ne {
		e, err := decodeEvent(d, layout)
		if err != nil {
			return b, errors.Wrapf(err, "event %d", i)
		}
		b.Events = append(b.Events, e)
	}
	if b.Rank, err = optInt(d); err != nil {
		return b, errors.Wrapf(err, "data_parallel_rank")
	}
	if r.Len() != 0 {
		return b, errors.Newf("%d bytes after the batch", r.Len())
	}
	return b, nil
}

func decodeEvent(d *msgpack.Decoder, layout Layout) (wireEvent, error) {
	var e wireEvent
	var n int
	var err error
	if layout == Array {
		if n, err = d.DecodeArrayLen(); err != nil || n < 1 {
			return e, errors.Newf("not a tagged array (%d, %v)", n, err)
		}
	} else {
		if n, err = d.DecodeMapLen(); err != nil || n < 1 {
			return e, errors.Newf("not a tagged map (%d, %v)", n, err)
		}
		if k, err := d.DecodeString(); err != nil || k != "type" {
			return e, errors.Newf("the first key is %q, want the tag field \"type\" (%v)", k, err)
		}
	}
	if e.Tag, err = d.DecodeString(); err != nil {
		return e, err
	}
	class, ok := vllmFields[e.Tag]
	if !ok {
		return e, errors.Newf("unknown tag %q", e.Tag)
	}
	e.Fields = n - 1
	if e.Fields < class.required || e.Fields > len(class.names) {
		return e, errors.Newf("%s with %d fields, want %d to %d", e.Tag, e.Fields, class.required, len(class.names))
	}
	at := 0 // the next field's index in declaration order
	for range e.Fields {
		name := class.names[at]
		if layout == Map {
			k, err := d.DecodeString()
			if err != nil {
				return e, err
			}
			j := slices.Index(class.names, k)
			if j < at {
				return e, errors.Newf("%s: field %q unknown or out of declaration order", e.Tag, k)
			}
			if j > at && at < class.required {
				return e, errors.Newf("%s: required field %q missing", e.Tag, class.names[at])
			}
			at, name = j, k
		}
		if err := decodeField(d, &e, name); err != nil {
			return e, errors.Wrapf(err, "%s.%s", e.Tag, name)
		}
		at++
	}
	if at < class.required {
		return e, errors.Newf("%s: required field %q missing", e.Tag, class.names[at])
	}
	return e, nil
}

func decodeField(d *msgpack.Decoder, e *wireEvent, name string) error {
	var err error
	switch name {
	case "block_hashes":
		e.BlockHashes, err = uints(d)
	case "parent_block_hash":
		var c byte
		if c, err = d.PeekCode(); err == nil && c == msgpcode.Nil {
			err = d.DecodeNil()
		} else if err == nil {
			var v uint64
			v, err = d.DecodeUint64()
			e.Parent = &v
		}
	case "token_ids":
		var n int
		if n, err = d.DecodeArrayLen(); err == nil && n < 0 {
			err = errors.New("nil, want a list")
		}
		for range max(n, 0) {
			v, err := d.DecodeInt64()
			if err != nil {
				return err
			}
			e.TokenIDs = append(e.TokenIDs, v)
		}
	case "block_size":
		if e.BlockSize, err = optInt(d); err == nil && e.BlockSize == nil {
			err = errors.New("nil, want an int")
		}
	case "lora_id":
		e.LoRAID, err = optInt(d)
	case "medium":
		e.Medium, err = optStr(d)
	case "lora_name":
		e.LoRAName, err = optStr(d)
	case "extra_keys":
		e.ExtraKeys, err = d.DecodeInterface()
	case "group_idx":
		e.GroupIdx, err = optInt(d)
	case "kv_cache_spec_kind":
		e.SpecKind, err = optStr(d)
	case "kv_cache_spec_sliding_window":
		e.SlidingWindow, err = optInt(d)
	default:
		err = errors.Newf("no such field")
	}
	return err
}

func uints(d *msgpack.Decoder) ([]uint64, error) {
	n, err := d.DecodeArrayLen()
	if err != nil {
		return nil, err
	}
	if n < 0 {
		return nil, errors.New("nil, want a list")
	}
	out := make([]uint64, 0, n)
	for range n {
		v, err := d.DecodeUint64()
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

func optInt(d *msgpack.Decoder) (*int64, error) {
	c, err := d.PeekCode()
	if err != nil {
		return nil, err
	}
	if c == msgpcode.Nil {
		return nil, d.DecodeNil()
	}
	v, err := d.DecodeInt64()
	return &v, err
}

func optStr(d *msgpack.Decoder) (*string, error) {
	c, err := d.PeekCode()
	if err != nil {
		return nil, err
	}
	if c == msgpcode.Nil {
		return nil, d.DecodeNil()
	}
	v, err := d.DecodeString()
	return &v, err
}

// expected is what decodeBatch must find for b: the fields this package
// promises (doc.go), not the encoder's code.
func expected(b kvcache.EventBatch, rank *int, layout Layout) wireBatch {
	w := wireBatch{TS: float64(b.TS.UnixNano()) / 1e9}
	if rank != nil {
		r := int64(*rank)
		w.Rank = &r
	}
	str := func(s string) *string { return &s }
	i64 := func(v int64) *int64 { return &v }
	for _, e := range b.Events {
		switch e := e.(type) {
		case *kvcache.BlockStored:
			x := wireEvent{Tag: "BlockStored", Fields: 10, BlockHashes: slices.Clone(e.BlockHashes), BlockSize: i64(int64(e.BlockSize)),
				GroupIdx: i64(int64(e.GroupIdx)), SpecKind: str("full_attention")}
			if e.SpecKind != "" {
				x.SpecKind = str(e.SpecKind)
			}
			if e.SlidingWindow > 0 {
				x.SlidingWindow = i64(int64(e.SlidingWindow))
				x.Fields++
			}
			if layout == Map {
				x.Fields-- // extra_keys, None, is named only when set
			}
			if e.ParentBlockHash != nil {
				p := *e.ParentBlockHash
				x.Parent = &p
			}
			for _, t := range e.TokenIDs {
				x.TokenIDs = append(x.TokenIDs, int64(t))
			}
			if e.Medium != "" {
				x.Medium = str(e.Medium)
			}
			w.Events = append(w.Events, x)
		case *kvcache.BlockRemoved:
			x := wireEvent{Tag: "BlockRemoved", Fields: 3, BlockHashes: slices.Clone(e.BlockHashes), GroupIdx: i64(int64(e.GroupIdx))}
			if e.Medium != "" {
				x.Medium = str(e.Medium)
			}
			w.Events = append(w.Events, x)
		case *kvcache.AllBlocksCleared:
			w.Events = append(w.Events, wireEvent{Tag: "AllBlocksCleared"})
		}
	}
	return w
}

// makeBatch is batch i of a test stream, the same in every process: a
// mix of the three events with hashes over the whole uint64 range, or
// (tokens > 0) one BlockStored of that many tokens.
func makeBatch(i int, tokens int) kvcache.EventBatch {
	rng := rand.New(rand.NewPCG(uint64(i), 42))
	b := kvcache.EventBatch{TS: time.Unix(1764219600+int64(i), int64(i%1000)*1000)}
	if tokens > 0 {
		ids := make([]int, tokens)
		for j := range ids {
			ids[j] = rng.IntN(1 << 17)
		}
		b.Events = []kvcache.Event{&kvcache.BlockStored{BlockHashes: []uint64{rng.Uint64()}, TokenIDs: ids, BlockSize: tokens, Medium: kvcache.EventMedium}}
		return b
	}
	for range 1 + rng.IntN(4) {
		switch rng.IntN(5) {
		case 0:
			b.Events = append(b.Events, &kvcache.AllBlocksCleared{})
		case 1, 2:
			n := 1 + rng.IntN(3)
			e := &kvcache.BlockRemoved{Medium: kvcache.EventMedium}
			for range n {
				e.BlockHashes = append(e.BlockHashes, rng.Uint64())
			}
			b.Events = append(b.Events, e)
		default:
			n, bs := 1+rng.IntN(3), 1+rng.IntN(16)
			e := &kvcache.BlockStored{BlockSize: bs, Medium: kvcache.EventMedium}
			if rng.IntN(2) == 0 {
				p := rng.Uint64()
				e.ParentBlockHash = &p
			}
			for range n {
				e.BlockHashes = append(e.BlockHashes, rng.Uint64())
				for range bs {
					e.TokenIDs = append(e.TokenIDs, rng.IntN(1<<20))
				}
			}
			b.Events = append(b.Events, e)
		}
	}
	return b
}

// checkPayload decodes payload and compares it with batch i.
func checkPayload(payload []byte, i, tokens int, rank *int, layout Layout) error {
	got, err := decodeBatch(payload, layout)
	if err != nil {
		return errors.Wrapf(err, "batch %d", i)
	}
	want := expected(makeBatch(i, tokens), rank, layout)
	if g, w := fmt.Sprintf("%+v", deref(got)), fmt.Sprintf("%+v", deref(want)); g != w {
		return errors.Newf("batch %d decoded as\n%s\nwant\n%s", i, g, w)
	}
	return nil
}

// deref makes a batch printable by value (pointers as what they point at).
func deref(b wireBatch) string {
	p := func(v any) string {
		switch v := v.(type) {
		case *int64:
			if v != nil {
				return fmt.Sprint(*v)
			}
		case *uint64:
			if v != nil {
				return fmt.Sprint(*v)
			}
		case *string:
			if v != nil {
				return fmt.Sprintf("%q", *v)
			}
		}
		return "nil"
	}
	var s bytes.Buffer
	fmt.Fprintf(&s, "ts %v rank %s\n", b.TS, p(b.Rank))
	for _, e := range b.Events {
		fmt.Fprintf(&s, "%s/%d %v parent %s tokens %v size %s lora %s medium %s loraname %s extra %v group %s kind %s window %s\n",
			e.Tag, e.Fields, e.BlockHashes, p(e.Parent), e.TokenIDs, p(e.BlockSize), p(e.LoRAID), p(e.Medium), p(e.LoRAName), e.ExtraKeys,
			p(e.GroupIdx), p(e.SpecKind), p(e.SlidingWindow))
	}
	return s.String()
}

type kvcacheBatch = kvcache.EventBatch
