package kvevents

import (
	"encoding/hex"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/kvcache"
)

// TestEncodeDecodes: every batch of a stream decodes, strictly, as
// vLLM's classes define the format, in both layouts, with and without a
// rank.
func TestEncodeDecodes(t *testing.T) {
	zero, three := 0, 3
	for _, layout := range []Layout{Array, Map} {
		for _, rank := range []*int{nil, &zero, &three} {
			for i := range 300 {
				payload, err := EncodeBatch(makeBatch(i, 0), rank, layout)
				require.NoError(t, err)
				require.NoError(t, checkPayload(payload, i, 0, rank, layout), "layout %s", layout)
			}
		}
	}
}

// TestEncodeBytes pins the bytes of one small batch in each layout,
// worked out by hand from msgpack's spec and vLLM's classes.
func TestEncodeBytes(t *testing.T) {
	p := uint64(7)
	b := kvcache.EventBatch{TS: time.Unix(2, 500_000_000), Events: []kvcache.Event{
		&kvcache.BlockStored{BlockHashes: []uint64{1}, ParentBlockHash: &p, TokenIDs: []int{5, 6}, BlockSize: 2, Medium: "GPU"},
		&kvcache.BlockRemoved{BlockHashes: []uint64{1}, Medium: "GPU"},
		&kvcache.AllBlocksCleared{},
	}}
	zero := 0
	// [2.5, [ev...], 0]
	const head = "93" + "cb4004000000000000" + "93"
	const stored = "ab426c6f636b53746f726564" + // "BlockStored"
		"9101" + "07" + "920506" + "02" + "c0" + "a3475055" + "c0" // hashes [1], parent 7, tokens [5 6], size 2, lora_id nil, "GPU", lora_name nil
	const kind = "ae66756c6c5f617474656e74696f6e" // "full_attention"
	const removedTag = "ac426c6f636b52656d6f766564"
	const clearedTag = "b0416c6c426c6f636b73436c6561726564"
	arr := head +
		"9b" + stored + "c0" + "00" + kind + // 11: tag, 7 required, extra_keys nil, group 0, kind
		"94" + removedTag + "9101" + "a3475055" + "00" +
		"91" + clearedTag +
		"00"
	got, err := EncodeBatch(b, &zero, Array)
	require.NoError(t, err)
	require.Equal(t, arr, hex.EncodeToString(got))

	key := func(k string) string { return hex.EncodeToString(append([]byte{0xa0 | byte(len(k))}, k...)) }
	mstored := "8a" + key("type") + "ab426c6f636b53746f726564" +
		key("block_hashes") + "9101" + key("parent_block_hash") + "07" + key("token_ids") + "920506" + key("block_size") + "02" +
		key("lora_id") + "c0" + key("medium") + "a3475055" + key("lora_name") + "c0" + key("group_idx") + "00" + key("kv_cache_spec_kind") + kind
	mremoved := "84" + key("type") + removedTag + key("block_hashes") + "9101" + key("medium") + "a3475055" + key("group_idx") + "00"
	mcleared := "81" + key("type") + clearedTag
	got, err = EncodeBatch(b, nil, Map)
	require.NoError(t, err)
	require.Equal(t, head+mstored+mremoved+mcleared+"c0", hex.EncodeToString(got))
}

type otherEvent struct{}

func (otherEvent) Type() string { return "Other" }

// TestEncodeRefuses: a nil event, a foreign one and a bad layout are
// errors marked driver.ErrInvalid.
func TestEncodeRefuses(t *testing.T) {
	var nilStored *kvcache.BlockStored
	for _, b := range []kvcache.EventBatch{
		{Events: []kvcache.Event{nil}},
		{Events: []kvcache.Event{nilStored}},
		{Events: []kvcache.Event{otherEvent{}}},
	} {
		_, err := EncodeBatch(b, nil, Array)
		require.ErrorIs(t, err, driver.ErrInvalid)
	}
	_, err := EncodeBatch(kvcache.EventBatch{}, nil, Layout(9))
	require.ErrorIs(t, err, driver.ErrInvalid)
	_, err = ParseLayout("tuple")
	require.ErrorIs(t, err, driver.ErrInvalid)
	l, err := ParseLayout("map")
	require.NoError(t, err)
	require.Equal(t, Map, l)
}

// TestEncodeGroups: a hybrid cache's events carry their group, kind and
// sliding window (vLLM's group_idx, kv_cache_spec_kind,
// kv_cache_spec_sliding_window), decoded strictly in both layouts.
func TestEncodeGroups(t *testing.T) {
	b := kvcache.EventBatch{TS: time.Unix(3, 0), Events: []kvcache.Event{
		&kvcache.BlockStored{BlockHashes: []uint64{9}, TokenIDs: []int{1, 2}, BlockSize: 2, Medium: "GPU",
			GroupIdx: 1, SpecKind: "sliding_window", SlidingWindow: 1024},
		&kvcache.BlockStored{BlockHashes: []uint64{8}, TokenIDs: []int{1, 2}, BlockSize: 2, Medium: "GPU",
			GroupIdx: 2, SpecKind: "mla_attention"},
		&kvcache.BlockRemoved{BlockHashes: []uint64{9}, Medium: "GPU", GroupIdx: 1},
	}}
	for _, layout := range []Layout{Array, Map} {
		payload, err := EncodeBatch(b, nil, layout)
		require.NoError(t, err)
		got, err := decodeBatch(payload, layout)
		require.NoError(t, err, "layout %s", layout)
		require.Equal(t, deref(expected(b, nil, layout)), deref(got), "layout %s", layout)
		require.Equal(t, int64(1), *got.Events[0].GroupIdx)
		require.Equal(t, int64(1024), *got.Events[0].SlidingWindow)
		require.Equal(t, "mla_attention", *got.Events[1].SpecKind)
		require.Nil(t, got.Events[1].SlidingWindow)
		require.Equal(t, int64(1), *got.Events[2].GroupIdx)
	}
}
