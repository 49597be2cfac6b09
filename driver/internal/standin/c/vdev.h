/*
 * vdev.h - the emulated device ("vdev") behind every front-end of the
 * vmarena stand-in: the vendor-neutral half of a fake accelerator driver
 * library that runs on host memory with the real virtual-memory rules.
 *
 * A front-end (cuda.c, acl.c) exports its vendor's symbols with its
 * vendor's signatures and error codes; it checks arguments that only exist
 * in its own API (struct fields, enum values, flags), then calls the vdev_*
 * functions here and translates the vdev_status they return. Nothing in
 * this file knows a vendor's numbers, except the raw codes a test injects
 * (vmstandin_fail), which travel through as they are. Where the vendors'
 * rules differ (a sticky fault, explicit contexts, whole-mapping unmaps,
 * tokens) the core offers each reading and the front-end picks its own.
 *
 * vdev.c keeps the books; vshare.c shares memory with other processes by
 * token over them.
 *
 * The vmstandin_* functions (configuration, fault injection, counters) are
 * exported by the library itself; every vdev_* name is hidden.
 *
 * States of address space, as in the real APIs (and driver/doc.go):
 *
 *   reserved    inside a reservation, no allocation behind it:
 *               PROT_NONE anonymous memory. Reached by vdev_reserve and
 *               vdev_unmap.
 *   mapped      an allocation's memory is mapped there (MAP_SHARED of a
 *               memfd) but no device may touch it: PROT_NONE. Reached by
 *               vdev_map, and by vdev_set_access removing the last access.
 *   accessible  mapped and readable, or readable and writable, by an
 *               explicit set of devices (the books say which, per granule);
 *               the pages carry the widest access any device has.
 */
#ifndef VMSTANDIN_VDEV_H
#define VMSTANDIN_VDEV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* VDEV_EXPORT marks a symbol of the library's interface; everything else
 * declared between the pragmas is private to the library. */
#define VDEV_EXPORT __attribute__((visibility("default")))

#pragma GCC visibility push(hidden)

enum { VDEV_MAX_DEVICES = 32 };

/* vdev_status is what every vdev_* call returns; each front-end maps it to
 * its vendor's codes. */
typedef enum vdev_status {
	VDEV_OK = 0,
	VDEV_INVALID,         /* a bad argument: size, alignment, range, flags */
	VDEV_OOM,             /* not enough free capacity (or host memory) */
	VDEV_NOT_MAPPED,      /* nothing is mapped at the address */
	VDEV_OVERLAP,         /* the range is mapped already, at least in part */
	VDEV_BAD_HANDLE,      /* unknown, released or stale handle, stream, event */
	VDEV_NO_DEVICE,       /* a device ordinal out of range */
	VDEV_ILLEGAL_ADDRESS, /* a device touched memory it may not (sticky) */
	VDEV_NOT_SUPPORTED,   /* the configuration leaves the feature out */
	VDEV_NOT_PERMITTED,   /* the object does not allow it (export of a
	                       * non-shareable allocation) */
	VDEV_NOT_READY,       /* work is still pending */
	VDEV_NO_CONTEXT,      /* no usable context current on this thread */
	VDEV_ALREADY,         /* done before (peer access enabled twice) */
	VDEV_NOT_INITIALIZED, /* vdev_init has not succeeded */
	VDEV_RAW,             /* an injected vendor code, in the out parameter */
	VDEV_OS,              /* a system call failed unexpectedly */
	VDEV_BUSY,            /* the object is in use (a handle still mapped) */
} vdev_status;

/* --- a vector of pointers, for the books of every file ------------------- */

/* vec holds n pointers in at[0..n); cap >= n. */
struct vec {
	void **at;
	size_t n, cap;
};

static inline bool vec_insert(struct vec *v, size_t i, void *p)
{
	if (v->n == v->cap) {
		size_t cap = v->cap ? 2 * v->cap : 16;
		void **at = realloc(v->at, cap * sizeof *at);
		if (!at)
			return false;
		v->at = at;
		v->cap = cap;
	}
	memmove(&v->at[i + 1], &v->at[i], (v->n - i) * sizeof *v->at);
	v->at[i] = p;
	v->n++;
	return true;
}

static inline bool vec_push(struct vec *v, void *p) { return vec_insert(v, v->n, p); }

/* vec_cut removes at[i..j). */
static inline void vec_cut(struct vec *v, size_t i, size_t j)
{
	memmove(&v->at[i], &v->at[j], (v->n - j) * sizeof *v->at);
	v->n -= j - i;
}

/* vec_find returns p's index, or n when p is not there. It compares
 * pointers only, so it is safe on garbage handed in by a caller. */
static inline size_t vec_find(const struct vec *v, const void *p)
{
	for (size_t i = 0; i < v->n; i++)
		if (v->at[i] == p)
			return i;
	return v->n;
}

/* Access of one device to one granule. Values are the ones CUDA and
 * AscendCL share, so front-ends pass their flags through. */
enum {
	VDEV_ACCESS_NONE = 0,
	VDEV_ACCESS_READ = 1,
	VDEV_ACCESS_READWRITE = 3,
};

/* vdev_config is fixed by vmstandin_configure before vdev_init. There is
 * one granularity for every device. */
struct vdev_config {
	int devices;       /* 1 .. VDEV_MAX_DEVICES */
	uint64_t capacity; /* bytes per device, a multiple of mingran */
	uint64_t mingran;  /* power of two, at least the OS page */
	uint64_t recgran;  /* a multiple of mingran */
	bool novmm;        /* no virtual memory management */
	bool noposix;      /* no POSIX file descriptor export/import */
	bool nopools;      /* no stream-ordered memory pools (an attribute only) */
	bool nopeer;       /* devices cannot access each other as peers */
	bool stub;         /* the vendor's link stub: every call fails */
	bool nodevice;     /* initialisation finds no device */
};

const struct vdev_config *vdev_config(void);

/* --- initialisation ------------------------------------------------------ */

/* vdev_init sets up the devices once, for a vendor whose name appears in
 * shareable memory names ("vmstandin:<vendor>:<dev>:<size>") and token
 * sockets; later calls return what the first returned. VDEV_NO_DEVICE with
 * nodevice. sticky_faults: an access violation of asynchronous work
 * poisons its context (CUDA's illegal address); without it the failure is
 * the stream's alone (AscendCL has no poisoned contexts). */
vdev_status vdev_init(const char *vendor, bool sticky_faults);
bool vdev_initialized(void);
/* vdev_vendor is the name vdev_init was given ("" before). */
const char *vdev_vendor(void);

/* --- call accounting and fault injection --------------------------------- */

/* vdev_enter counts a call of the exported function fn and returns the code
 * an injection makes it fail with (0: none). When exec is not NULL it
 * receives the code of an ":exec" injection that fires for this call (0:
 * none): the caller enqueues the operation and makes it fail as it runs.
 * slot caches fn's row in the call table; give each function its own
 * static, initialised to -1. */
int vdev_enter(int *slot, const char *fn, int *exec);

/* vdev_fault is an injected failure an operation reports when it runs:
 * code is the vendor's own number (0: none); poison makes it sticky, as an
 * illegal address is. */
typedef struct vdev_fault {
	int code;
	bool poison;
} vdev_fault;

/* --- contexts ------------------------------------------------------------ */

/* A vdev_ctx is a context of one device: the device's primary context (one
 * per device, CUDA's primary context and AscendCL's default context), or
 * an explicit one (AscendCL's aclrtCreateContext). A primary context is
 * usable while retained; an explicit one from its creation to its
 * destruction. The end of a context's life destroys what lives in it
 * (streams, events) and clears a sticky fault, as destroying a real
 * context does. Allocations, reservations and pinned host memory outlive
 * it. An explicit context's memory is never freed: a stale pointer to it
 * (a thread's current context, a closed stream's worker) reads a dead
 * context, never freed memory. */
typedef struct vdev_ctx vdev_ctx;

vdev_status vdev_ctx_retain(int dev, vdev_ctx **out);
/* vdev_ctx_release drops a reference of dev's primary context:
 * VDEV_NO_CONTEXT when it holds none. */
vdev_status vdev_ctx_release(int dev);
/* vdev_ctx_create makes an explicit context of dev; vdev_ctx_destroy ends
 * one (VDEV_BAD_HANDLE for anything else: a primary context, a destroyed
 * or unknown one) and unsets it on the calling thread. */
vdev_status vdev_ctx_create(int dev, vdev_ctx **out);
vdev_status vdev_ctx_destroy(vdev_ctx *c);
/* vdev_ctx_set_current makes c current on the calling thread; NULL unsets.
 * An unknown or unusable c is VDEV_NO_CONTEXT. */
vdev_status vdev_ctx_set_current(vdev_ctx *c);
vdev_ctx *vdev_ctx_get_current(void);
/* vdev_ctx_use returns the calling thread's current context for a call that
 * needs one: VDEV_NO_CONTEXT when none is usable, VDEV_ILLEGAL_ADDRESS when
 * it carries a sticky fault. */
vdev_status vdev_ctx_use(vdev_ctx **out);
int vdev_ctx_device(const vdev_ctx *c);

/* vdev_peer_can says whether dev can reach peer as a peer. */
vdev_status vdev_peer_can(int dev, int peer, bool *can);
/* vdev_peer_enable lets cur's device reach peer's memory: VDEV_NO_CONTEXT
 * for an unusable peer, VDEV_INVALID for the same device,
 * VDEV_NOT_SUPPORTED with nopeer, VDEV_ALREADY the second time. */
vdev_status vdev_peer_enable(vdev_ctx *cur, vdev_ctx *peer);

/* --- virtual memory management -------------------------------------------
 * Every call here is VDEV_NOT_SUPPORTED with novmm. Addresses are process
 * addresses. */

/* vdev_reserve takes size bytes of address space (a multiple of mingran)
 * aligned to align (0 or a power of two; at least mingran), at hint when
 * that is free. */
vdev_status vdev_reserve(uint64_t size, uint64_t align, uint64_t hint, uint64_t *out);
/* vdev_reserve_odd takes size bytes at an odd multiple of mingran: aligned
 * to the granularity and deliberately never to twice it, so a caller that
 * needs more alignment must make it itself (AscendCL takes no alignment). */
vdev_status vdev_reserve_odd(uint64_t size, uint64_t *out);
/* vdev_unreserve returns exactly a reservation, with nothing mapped in it;
 * vdev_unreserve_at the reservation that starts at addr, whatever its size. */
vdev_status vdev_unreserve(uint64_t addr, uint64_t size);
vdev_status vdev_unreserve_at(uint64_t addr);
/* vdev_reservation_of returns the reservation holding addr (VDEV_INVALID:
 * none). */
vdev_status vdev_reservation_of(uint64_t addr, uint64_t *base, uint64_t *size);
/* vdev_create makes an allocation of size bytes (a positive multiple of
 * mingran) on dev; shareable ones have a memfd of their own that
 * vdev_export can hand out (VDEV_NOT_SUPPORTED with noposix). */
vdev_status vdev_create(int dev, uint64_t size, bool shareable, uint64_t *handle);
/* vdev_release gives up a handle; the memory goes with its last mapping.
 * vdev_release_unmapped refuses (VDEV_BUSY, nothing changed) a handle
 * that is still mapped. */
vdev_status vdev_release(uint64_t handle);
vdev_status vdev_release_unmapped(uint64_t handle);
/* vdev_allocation_size is the size of a live allocation's memory. */
vdev_status vdev_allocation_size(uint64_t handle, uint64_t *size);
/* vdev_map maps the first size bytes of handle's allocation at addr. */
vdev_status vdev_map(uint64_t addr, uint64_t size, uint64_t offset, uint64_t handle);
/* vdev_unmap returns one or more whole, contiguous mappings to reserved;
 * vdev_unmap_at the one mapping that starts at addr. */
vdev_status vdev_unmap(uint64_t addr, uint64_t size);
vdev_status vdev_unmap_at(uint64_t addr);
/* vdev_in_reserved says whether [addr, addr+n) meets a reservation: device
 * address space rather than host memory. */
bool vdev_in_reserved(uint64_t addr, uint64_t n);

struct vdev_access {
	int dev;
	int flags; /* VDEV_ACCESS_* */
};
/* vdev_set_access gives each listed device its access over a range of
 * adjacent whole mappings (never a piece of one, as cuMemSetAccess on real
 * hardware); vdev_set_access_one over exactly one whole mapping. */
vdev_status vdev_set_access(uint64_t addr, uint64_t size, const struct vdev_access *acc, size_t n);
vdev_status vdev_set_access_one(uint64_t addr, uint64_t size, const struct vdev_access *acc, size_t n);
vdev_status vdev_get_access(int dev, uint64_t addr, int *flags);
/* vdev_export hands out a new descriptor of a shareable allocation's memfd;
 * the caller owns it. */
vdev_status vdev_export(uint64_t handle, int *fd);
/* vdev_import makes a new handle over a duplicate of fd, a memfd another
 * stand-in of the same vendor exported; the caller keeps fd. */
vdev_status vdev_import(int fd, uint64_t *handle);

/* --- tokens (vshare.c) ----------------------------------------------------
 * Memory shared with other processes by a nonzero 64-bit number instead of
 * a descriptor, with an allow-list of importing processes (AscendCL's
 * model). How the number finds the memory is described in vshare.c. */

/* vdev_token_export makes the token of a shareable allocation: once per
 * handle (VDEV_ALREADY the second time). validate_pids: only processes
 * vdev_token_allow names may import it; otherwise any process may. */
vdev_status vdev_token_export(uint64_t handle, bool validate_pids, uint64_t *token);
/* vdev_token_allow adds process IDs to the allow-list of a token this
 * library exported (VDEV_INVALID for any other). */
vdev_status vdev_token_allow(uint64_t token, const int32_t *pids, size_t n);
/* vdev_token_revoke ends a token this library exported: later imports
 * find nothing; memory already imported stays with its importers. */
vdev_status vdev_token_revoke(uint64_t token);
/* vdev_token_import makes a new handle over the memory of a token another
 * process (or another stand-in instance) exported: VDEV_INVALID for a
 * token nobody exports, VDEV_NOT_PERMITTED when the exporter's allow-list
 * leaves the caller out, VDEV_NOT_SUPPORTED for a token this library
 * exported itself. */
vdev_status vdev_token_import(uint64_t token, uint64_t *handle);
/* vdev_tokens counts the tokens this library exports now. */
size_t vdev_tokens(void);

/* --- streams, events, copies ---------------------------------------------
 * A NULL stream is the context's default stream (made on first use). The
 * device of a stream's context makes its copies; the access each copy needs
 * is checked against the books when the copy runs. */
typedef struct vdev_stream vdev_stream;
typedef struct vdev_event vdev_event;

vdev_status vdev_stream_create(vdev_ctx *cur, vdev_stream **out);
vdev_status vdev_stream_destroy(vdev_stream *s);
/* vdev_stream_sync waits for the work enqueued so far and returns, then
 * clears, the stream's failure; VDEV_RAW puts an injected code in *raw.
 * After a failure a stream skips its work until the failure is taken. */
vdev_status vdev_stream_sync(vdev_ctx *cur, vdev_stream *s, int *raw);
/* vdev_stream_context finds the context of a live stream (not NULL). */
vdev_status vdev_stream_context(vdev_stream *s, vdev_ctx **out);
/* vdev_sync_device waits for the work enqueued so far on every stream of
 * cur (whole_device: of every context on cur's device), default streams
 * included (cuCtxSynchronize, aclrtSynchronizeDevice). It takes no
 * stream's failure: each stream keeps its own for its own sync. A sticky
 * fault of cur is VDEV_ILLEGAL_ADDRESS. */
vdev_status vdev_sync_device(vdev_ctx *cur, bool whole_device);
vdev_status vdev_stream_query(vdev_ctx *cur, vdev_stream *s, int *raw);

/* vdev_enqueue_copy copies n bytes; dst_dev/src_dev say which side is
 * device memory (the other is a host pointer, trusted). */
vdev_status vdev_enqueue_copy(vdev_ctx *cur, vdev_stream *s, uint64_t dst, bool dst_dev, uint64_t src,
			      bool src_dev, uint64_t n, vdev_fault f);
vdev_status vdev_enqueue_fill(vdev_ctx *cur, vdev_stream *s, uint64_t dst, uint8_t byte, uint64_t n,
			      vdev_fault f);
vdev_status vdev_enqueue_host_fn(vdev_ctx *cur, vdev_stream *s, void (*fn)(void *), void *user, vdev_fault f);
/* vdev_copy copies on the calling thread, as cur's device. An access
 * violation is VDEV_ILLEGAL_ADDRESS without a sticky fault; an injected
 * fault is VDEV_RAW (sticky when f.poison). */
vdev_status vdev_copy(vdev_ctx *cur, uint64_t dst, bool dst_dev, uint64_t src, bool src_dev, uint64_t n,
		      vdev_fault f, int *raw);

vdev_status vdev_event_create(vdev_ctx *cur, vdev_event **out);
/* vdev_event_record marks the point after the work enqueued so far on s;
 * the event and the stream must belong to one context. */
vdev_status vdev_event_record(vdev_ctx *cur, vdev_event *e, vdev_stream *s, vdev_fault f);
/* vdev_event_sync waits for the point e marks. take: a failure of e's
 * stream at or before that point is returned, and cleared, as
 * vdev_stream_sync would (AscendCL); otherwise only a sticky fault is. */
vdev_status vdev_event_sync(vdev_event *e, bool take, int *raw);
vdev_status vdev_event_query(vdev_event *e);
vdev_status vdev_event_destroy(vdev_event *e);

/* --- pinned host memory -------------------------------------------------- */

vdev_status vdev_host_alloc(uint64_t size, void **out);
/* vdev_host_free takes exactly the start of a live host allocation. */
vdev_status vdev_host_free(void *p);

#pragma GCC visibility pop

/* --- the library's own interface, for tests ------------------------------ */

VDEV_EXPORT int vmstandin_configure(const char *spec);
VDEV_EXPORT void vmstandin_fail(const char *fn, int nth, int count, int code);
VDEV_EXPORT void vmstandin_clear(void);
VDEV_EXPORT uint64_t vmstandin_calls(const char *fn);
VDEV_EXPORT uint64_t vmstandin_used(int dev);
VDEV_EXPORT int64_t vmstandin_live(const char *what);
VDEV_EXPORT int vmstandin_access(uint64_t addr, int dev);
VDEV_EXPORT int64_t vmstandin_retire(void);
VDEV_EXPORT int vmstandin_hold(int dev);
VDEV_EXPORT void vmstandin_release(void);
VDEV_EXPORT uint64_t vmstandin_held(void);

#endif /* VMSTANDIN_VDEV_H */
