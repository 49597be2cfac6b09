# Block hashes as vLLM computes them with prefix_caching_hash_algo
# sha256_cbor (vllm/utils/hashing.py sha256_cbor, vllm/v1/core/
# kv_cache_utils.py init_none_hash, hash_block_tokens and
# maybe_convert_block_hash with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1),
# written apart from the Go code: a CBOR encoder of the few types the
# hash input holds, by RFC 8949's rules for deterministic encoding
# (cbor2.dumps(..., canonical=True) writes the same; where cbor2 is
# installed, this script checks it does). Prints the vectors as JSON;
# vllm_hash_vectors.json is its output, TestVLLMHashVectors compares.
import hashlib, json, sys

def head(major, n):
    m = major << 5
    if n < 24: return bytes([m | n])
    if n < 1 << 8: return bytes([m | 24]) + n.to_bytes(1, "big")
    if n < 1 << 16: return bytes([m | 25]) + n.to_bytes(2, "big")
    if n < 1 << 32: return bytes([m | 26]) + n.to_bytes(4, "big")
    return bytes([m | 27]) + n.to_bytes(8, "big")

def enc(x):
    if x is None: return b"\xf6"
    if isinstance(x, bool): raise TypeError("bool")
    if isinstance(x, int): return head(0, x) if x >= 0 else head(1, -1 - x)
    if isinstance(x, bytes): return head(2, len(x)) + x
    if isinstance(x, str):
        b = x.encode(); return head(3, len(b)) + b
    if isinstance(x, (tuple, list)): return head(4, len(x)) + b"".join(enc(i) for i in x)
    raise TypeError(type(x))

try:
    import cbor2
    def dumps(x):
        mine = enc(x)
        assert mine == cbor2.dumps(x, canonical=True), x
        return mine
except ImportError:
    dumps = enc

def sha256_cbor(x): return hashlib.sha256(dumps(x)).digest()

def chain(seed, blocks):
    none = sha256_cbor(seed)
    parent, out = None, []
    for toks in blocks:
        h = sha256_cbor((parent if parent else none, tuple(toks), None))
        out.append({"tokens": toks, "hash": h.hex(), "event": int.from_bytes(h, "big") & ((1 << 64) - 1)})
        parent = h
    return {"seed": seed, "none_hash": none.hex(), "blocks": out}

cases = [
    chain("0", [list(range(16)), list(range(16, 32)), [7] * 16]),
    chain("", [[1, 2, 3, 4]]),
    chain("12345", [[0, 23, 24, 255, 256, 65535, 65536, 4294967295, 4294967296, 151643, 128000, 2**40, 5, 6, 7, 8]]),
    chain("0", [list(range(100000, 100030))]),
]
json.dump(cases, sys.stdout, indent=1)
print()
