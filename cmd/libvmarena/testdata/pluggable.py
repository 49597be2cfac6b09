"""pluggable.py loads libvmarena as torch.cuda.memory.CUDAPluggableAllocator
does, with ctypes alone (no torch needed), and drives it for N cycles:

    python3 pluggable.py LIBRARY N SLEEP_CODE

CUDAPluggableAllocator(path, "vmarena_alloc", "vmarena_free") runs
    allocator = ctypes.CDLL(path)
    alloc_fn = ctypes.cast(getattr(allocator, "vmarena_alloc"), ctypes.c_void_p).value
    free_fn = ctypes.cast(getattr(allocator, "vmarena_free"), ctypes.c_void_p).value
and hands the two addresses to its C++ side, which calls them as
    void* alloc(ssize_t size, int device, cudaStream_t stream)
    void free(void* ptr, size_t size, int device, cudaStream_t stream)
This script takes the addresses the same way and calls them through
CFUNCTYPEs of those signatures. Each cycle tags, allocates, writes, sleeps
and wakes (expecting SLEEP_CODE from both: 0 where the driver can keep
the mode, -4 where it cannot), reads back, checks the stats and frees. The process's
file descriptors, mappings (but the anonymous read-write ones, the heaps)
and resident memory must not grow from the
second fifth of the cycles on, judged as testdata/cycles.c judges them. Prints
"ok" on success; exits 1 with a FAIL line otherwise.
"""

import ctypes
import json
import os
import sys


def fail(msg):
    print("FAIL", msg, "(last error: %s)" % lib.vmarena_last_error().decode(), file=sys.stderr)
    sys.exit(1)


def anon_rw(line):
    f = line.split(None, 5)
    return f[1] == "rw-p" and (len(f) < 6 or f[5].startswith("["))


def snapshot():
    fds = len(os.listdir("/proc/self/fd")) - 1
    with open("/proc/self/maps") as f:
        lines = f.read().splitlines()
    status = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            status[k] = v.split()
    return {
        "fds": fds,
        # Anonymous read-write mappings are the heaps of C, Python and Go
        # and the thread stacks, which grow and split on their own; none is
        # vmarena's (its reservations are anonymous PROT_NONE, its memory
        # its memfd's).
        "maps": sum(not anon_rw(l) for l in lines),
        "memfd_maps": sum("memfd:vmarena" in l for l in lines),
        "threads": int(status["Threads"][0]),
        "rss_kib": int(status["VmRSS"][0]),
    }


path, cycles, sleep_code = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
lib = ctypes.CDLL(path)
lib.vmarena_last_error.restype = ctypes.c_char_p
lib.vmarena_set_tag.argtypes = [ctypes.c_char_p]
lib.vmarena_sleep.argtypes = [ctypes.c_char_p, ctypes.c_int]
lib.vmarena_wake.argtypes = [ctypes.c_char_p]
lib.vmarena_stats_json.restype = ctypes.c_void_p  # the caller frees it
lib.vmarena_free_string.argtypes = [ctypes.c_void_p]

# Exactly as CUDAPluggableAllocator takes them.
alloc_fn = ctypes.cast(getattr(lib, "vmarena_alloc"), ctypes.c_void_p).value
free_fn = ctypes.cast(getattr(lib, "vmarena_free"), ctypes.c_void_p).value
ALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)
FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
torch_alloc, torch_free = ALLOC(alloc_fn), FREE(free_fn)


def stats():
    p = lib.vmarena_stats_json()
    if not p:
        fail("stats_json returned NULL")
    s = json.loads(ctypes.string_at(p).decode())
    lib.vmarena_free_string(p)
    return s


# The contents the cycles write, made once: a cycle makes no large Python
# object, whose memory would come and go as mappings of its own.
SIZES = [2 * 1024 * 1024 + 17 * k for k in range(5)]
PATTERNS = [ctypes.create_string_buffer((bytes((k + i) & 0xFF for i in range(251)) * (SIZES[k] // 251 + 1))[:SIZES[k]], SIZES[k])
            for k in range(5)]
ONES = ctypes.create_string_buffer(b"\xab" * 4096, 4096)
libc = ctypes.CDLL(None)
libc.memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]


def cycle(c):
    size, data = SIZES[c % 5], PATTERNS[c % 5]
    if lib.vmarena_set_tag(b"weights") != 0:
        fail("set_tag")
    p = torch_alloc(size, 0, None)
    if not p:
        fail("alloc %d bytes, cycle %d" % (size, c))
    ctypes.memmove(p, data, size)
    if lib.vmarena_set_tag(None) != 0:
        fail("set_tag(None)")
    q = torch_alloc(4096, 0, None)
    if not q:
        fail("alloc 4096 bytes under the default tag, cycle %d" % c)
    ctypes.memset(q, 0xAB, 4096)
    if lib.vmarena_sleep(b"weights", 1) != sleep_code:
        fail("sleep, cycle %d: want %d" % (c, sleep_code))
    if sleep_code == 0:
        w = {t["tag"]: t for d in stats()["devices"] for t in d["tags"]}["weights"]
        if not w["asleep"] or w["awake_bytes"] != 0 or w["backup_bytes"] < size:
            fail("stats of sleeping weights: %s" % w)
    if lib.vmarena_wake(b"weights") != sleep_code:
        fail("wake, cycle %d: want %d" % (c, sleep_code))
    if libc.memcmp(p, data, size) != 0:
        fail("weights read back differ, cycle %d" % c)
    if libc.memcmp(q, ONES, 4096) != 0:
        fail("default tag's memory read back differs, cycle %d" % c)
    tags = {t["tag"]: t for d in stats()["devices"] for t in d["tags"]}
    if tags["weights"]["live"] != 1 or tags["weights"]["awake_bytes"] < size:
        fail("stats of weights: %s" % tags["weights"])
    torch_free(p, size, 0, None)
    torch_free(q, 4096, 0, None)
    errors = stats()["free_errors"]
    torch_free(p, size, 0, None)  # twice: refused, counted, nothing else
    if b"not a live allocation" not in lib.vmarena_last_error() or stats()["free_errors"] != errors + 1:
        fail("a double free was not refused")


# Resident memory, judged as testdata/cycles.c judges it: a leak grows it
# in every round (a leaked backup by megabytes a cycle), while the Go
# runtime's heap, whose garbage collector falls behind on a loaded machine,
# may grow it by a few megabytes in one round and then stops.
RSS_ROUND_KIB, RSS_MAX_KIB = 512, 64 * 1024

# A warm-up round of cycles/5 and eight rounds of the rest, judged as
# testdata/cycles.c judges them.
ROUNDS = 9
warm = cycles // 5
per, c, held, rss_held = (cycles - warm) // (ROUNDS - 1), 0, 0, False
for rnd in range(ROUNDS):
    before = snapshot()
    if rnd == 1:
        first = before
    end = warm if rnd == 0 else cycles if rnd == ROUNDS - 1 else c + per
    while c < end:
        cycle(c)
        c += 1
    after = snapshot()
    if rnd == 0:
        continue
    for k in ("fds", "memfd_maps"):
        if after[k] != before[k]:
            fail("round %d: %s went from %d to %d" % (rnd, k, before[k], after[k]))
    if after["rss_kib"] - before["rss_kib"] < RSS_ROUND_KIB:
        rss_held = True
    if after["threads"] == before["threads"] and after["maps"] == before["maps"]:
        held += 1
    else:
        print("a round that changed:", after)
print("after the warm-up round:", first)
print("after the last round:", after)
if held == 0:
    fail("every round changed the mappings (or started a thread)")
if not rss_held or after["rss_kib"] - first["rss_kib"] >= RSS_MAX_KIB:
    fail("resident memory grew from %d to %d KiB" % (first["rss_kib"], after["rss_kib"]))
if any(t["live"] for d in stats()["devices"] for t in d["tags"]):
    fail("allocations live after the cycles")
if lib.vmarena_shutdown() != 0:
    fail("shutdown")
if snapshot()["memfd_maps"] != 0:
    fail("vmarena's memfd still mapped after shutdown")
print("ok")
