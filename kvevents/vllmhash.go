package kvevents

import (
	"crypto/sha256"
	"encoding/binary"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/kvcache"
)

// maxTranslated bounds the blocks a VLLMHasher keeps a vLLM hash of:
// past it, newly stored blocks are left out of the stream it hands on
// (Untranslated counts them), so a hostile or runaway cache cannot grow
// it without end. A cache's prefix index holds far fewer (80 GiB of a
// llama3-8b's 16-token blocks is about 41,000).
const maxTranslated = 1 << 20

// VLLMHasher rewrites a cache's KV events so that each block is named
// by the hash vLLM gives it (vllm/v1/core/kv_cache_utils.py
// hash_block_tokens with sha256_cbor, as the int a KV event carries by
// default, VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1), so that a router that
// hashes prompts itself, as llm-d's indexer does, finds this cache's
// blocks:
//
//	NONE_HASH = sha256(cbor(seed))                 (init_none_hash, seed = PYTHONHASHSEED)
//	h(block)  = sha256(cbor([parent or NONE_HASH, [token ids...], null]))
//	event id  = the last 8 bytes of h, big-endian   (maybe_convert_block_hash)
//
// where cbor is RFC 8949's deterministic encoding (cbor2.dumps with
// canonical=True: a tuple is an array, bytes a byte string, None null).
// Extra keys are always null: the cache's extra key (an adapter, a salt)
// is part of its own hash, not vLLM's, so two prompts of the same tokens
// under different extra keys are one vLLM block; the hasher counts the
// cache's blocks behind each vLLM hash and says BlockStored when the
// first is stored and BlockRemoved when the last is removed.
//
// A block whose parent it does not know (stored before the hasher saw
// the stream, or past maxTranslated) is left out, and so are the blocks
// that follow it in the same event: a router misses those hits, it is
// never told a hash vLLM would not give the same tokens. A VLLMHasher is
// not safe for concurrent use; Publisher serializes it.
type VLLMHasher struct {
	none [32]byte
	// ours maps the cache's block hash to vLLM's.
	ours map[uint64][32]byte
	// refs counts the cache's blocks behind each vLLM hash.
	refs  map[[32]byte]int
	stats HashStats
}

// HashStats count what a VLLMHasher did.
type HashStats struct {
	// Translated counts blocks stored under a vLLM hash; Untranslated
	// those left out (an unknown parent, or past the bound); Merged the
	// stored blocks whose vLLM hash another of the cache's blocks held
	// already (no event).
	Translated, Untranslated, Merged int
}

// NewVLLMHasher returns a hasher seeded as vLLM is when PYTHONHASHSEED
// is seed (without one, vLLM seeds from os.urandom and no one else can
// compute its hashes).
func NewVLLMHasher(seed string) *VLLMHasher {
	var e cborEnc
	e.text(seed)
	return &VLLMHasher{none: sha256.Sum256(e.b), ours: map[uint64][32]byte{}, refs: map[[32]byte]int{}}
}

// made says whether h was made by NewVLLMHasher: a nil or zero hasher
// has no seed, and hashing with none would name blocks wrongly.
func (h *VLLMHasher) made(op string) error {
	if h == nil || h.ours == nil {
		return errors.Wrapf(driver.ErrInvalid, "kvevents: %s: the hasher was not made by NewVLLMHasher", op)
	}
	return nil
}

// NoneHash is vLLM's NONE_HASH for the seed.
func (h *VLLMHasher) NoneHash() ([32]byte, error) {
	if err := h.made("none hash"); err != nil {
		return [32]byte{}, err
	}
	return h.none, nil
}

// Stats reads the counts (zero for a hasher not made by NewVLLMHasher).
func (h *VLLMHasher) Stats() HashStats {
	if h.made("stats") != nil {
		return HashStats{}
	}
	return h.stats
}

// BlockHash is vLLM's hash of a block of tokens after parent (nil for a
// prompt's first block).
func (h *VLLMHasher) BlockHash(parent *[32]byte, tokens []int) ([32]byte, error) {
	if err := h.made("block hash"); err != nil {
		return [32]byte{}, err
	}
	return h.blockHash(parent, tokens), nil
}

func (h *VLLMHasher) blockHash(parent *[32]byte, tokens []int) [32]byte {
	if parent == nil {
		parent = &h.none
	}
	var e cborEnc
	e.head(4, 3)
	e.bytes(parent[:])
	e.head(4, uint64(len(tokens)))
	for _, t := range tokens {
		e.int(int64(t))
	}
	e.b = append(e.b, 0xf6) // extra_keys: None
	return sha256.Sum256(e.b)
}

// EventHash is the int a KV event carries for vLLM hash v.
func EventHash(v [32]byte) uint64 { return binary.BigEndian.Uint64(v[24:]) }

// Translate returns b with every block named by vLLM's hash; events it
// has nothing left of are dropped (a batch may come back empty). b is
// not changed. A hasher not made by NewVLLMHasher is an error marked
// driver.ErrInvalid.
func (h *VLLMHasher) Translate(b kvcache.EventBatch) (kvcache.EventBatch, error) {
	if err := h.made("translate"); err != nil {
		return kvcache.EventBatch{}, err
	}
	out := kvcache.EventBatch{TS: b.TS, Events: make([]kvcache.Event, 0, len(b.Events))}
	for _, e := range b.Events {
		switch e := e.(type) {
		case *kvcache.BlockStored:
			out.Events = h.stored(out.Events, e)
		case *kvcache.BlockRemoved:
			if r := h.removed(e); r != nil {
				out.Events = append(out.Events, r)
			}
		case *kvcache.AllBlocksCleared:
			clear(h.ours)
			clear(h.refs)
			out.Events = append(out.Events, e)
		default:
			out.Events = append(out.Events, e) // EncodeBatch refuses it
		}
	}
	return out, nil
}

// stored appends e's blocks under vLLM's hashes: one event per run of
// blocks new to vLLM's index, each run's parent the block before it.
func (h *VLLMHasher) stored(events []kvcache.Event, e *kvcache.BlockStored) []kvcache.Event {
	if e == nil || e.BlockSize <= 0 || len(e.TokenIDs) != len(e.BlockHashes)*e.BlockSize {
		if e != nil {
			h.stats.Untranslated += len(e.BlockHashes)
		}
		return events
	}
	var parent *[32]byte
	if e.ParentBlockHash != nil {
		p, ok := h.ours[*e.ParentBlockHash]
		if !ok {
			h.stats.Untranslated += len(e.BlockHashes)
			return events
		}
		parent = &p
	}
	var run *kvcache.BlockStored
	for i, ours := range e.BlockHashes {
		tokens := e.TokenIDs[i*e.BlockSize : (i+1)*e.BlockSize]
		v, known := h.ours[ours]
		if !known {
			if len(h.ours) >= maxTranslated {
				h.stats.Untranslated += len(e.BlockHashes) - i
				return events
			}
			v = h.blockHash(parent, tokens)
			h.ours[ours] = v
			h.refs[v]++
		}
		if known || h.refs[v] > 1 {
			// vLLM's index has it already: the run ends here.
			if !known {
				h.stats.Merged++
			}
			run = nil
		} else {
			if run == nil {
				run = new(kvcache.BlockStored)
				*run = *e // the fields the translation does not touch
				run.BlockHashes, run.TokenIDs, run.ParentBlockHash = nil, nil, nil
				if parent != nil {
					ph := EventHash(*parent)
					run.ParentBlockHash = &ph
				}
				events = append(events, run)
			}
			run.BlockHashes = append(run.BlockHashes, EventHash(v))
			run.TokenIDs = append(run.TokenIDs, tokens...)
			h.stats.Translated++
		}
		parent = &v
	}
	return events
}

// removed is e under vLLM's hashes, the blocks whose last holder left;
// nil if none.
func (h *VLLMHasher) removed(e *kvcache.BlockRemoved) *kvcache.BlockRemoved {
	if e == nil {
		return nil
	}
	var gone []uint64
	for _, ours := range e.BlockHashes {
		v, ok := h.ours[ours]
		if !ok {
			continue
		}
		delete(h.ours, ours)
		if h.refs[v]--; h.refs[v] == 0 {
			delete(h.refs, v)
			gone = append(gone, EventHash(v))
		}
	}
	if len(gone) == 0 {
		return nil
	}
	r := new(kvcache.BlockRemoved)
	*r = *e
	r.BlockHashes = gone
	return r
}

// cborEnc writes RFC 8949 deterministic CBOR: the shortest head for
// every length and integer.
type cborEnc struct{ b []byte }

// head writes major type major with argument n.
func (e *cborEnc) head(major byte, n uint64) {
	m := major << 5
	switch {
	case n < 24:
		e.b = append(e.b, m|byte(n))
	case n <= 0xff:
		e.b = append(e.b, m|24, byte(n))
	case n <= 0xffff:
		e.b = binary.BigEndian.AppendUint16(append(e.b, m|25), uint16(n))
	case n <= 0xffffffff:
		e.b = binary.BigEndian.AppendUint32(append(e.b, m|26), uint32(n))
	default:
		e.b = binary.BigEndian.AppendUint64(append(e.b, m|27), n)
	}
}

func (e *cborEnc) int(v int64) {
	if v >= 0 {
		e.head(0, uint64(v))
	} else {
		e.head(1, uint64(-1-v))
	}
}

func (e *cborEnc) bytes(b []byte) {
	e.head(2, uint64(len(b)))
	e.b = append(e.b, b...)
}

func (e *cborEnc) text(s string) {
	e.head(3, uint64(len(s)))
	e.b = append(e.b, s...)
}
