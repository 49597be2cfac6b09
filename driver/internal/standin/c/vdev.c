/*
 * vdev.c - the emulated device of the vmarena stand-in: devices with a
 * capacity, reservations, physical allocations, mappings with per-device
 * access per granule, shareable memfds, streams with worker threads,
 * events, pinned host memory, fault injection and counters.
 *
 * Device addresses are real process addresses and device memory is real
 * shared memory (memfd), so the host can look at it; what a device may
 * touch is decided by the books kept here, and every copy a device makes is
 * checked against them before a byte moves. Each rule below says which rule
 * of the real accelerator APIs it mirrors.
 *
 * Locks, in the order they are taken:
 *
 *   touch      rwlock. Held for reading by a copy from its access check
 *              until its last byte has moved; held for writing by whatever
 *              can take access away (vdev_unmap, vdev_set_access). So a copy
 *              never meets a page whose protection changed after its check:
 *              an access violation is an error code, never a SIGSEGV.
 *   books      mutex over the device table, reservations, allocations,
 *              backings, mappings, the stream and event registries, events
 *              and host allocations. Never held while a host function runs
 *              or while anybody waits for a stream.
 *   stream.mu  each stream's queue, counters and failure.
 *   stats      call counts and injections; a leaf, nothing is taken under
 *              it.
 *
 * A context's refs, poisoned and gen are also read without the books (the
 * hot path of every call); they are written under the books with atomic
 * stores. vshare.c's own lock (shares) is taken before the books, never
 * under them.
 */
#define _GNU_SOURCE
#include "vdev.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

#define MIB (1024ull * 1024)

/* The flags of address space that is reserved and nothing more. */
#define RESERVED_FLAGS (MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE)

/* The seals of a shareable memfd: its size can never change, and nobody can
 * lift that (CUDA: an exported allocation keeps its size in every process). */
#define SHARE_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

/* A device heap is a sparse memfd this many times the capacity, so first-fit
 * never runs out of offsets before the device runs out of capacity. */
enum { HEAP_SPAN = 64 };

/* Handles are counted from here: far from small integers (a handle confused
 * with an index shows) and above 2^63 (a signed handle shows). */
#define HANDLE_BASE 0xc0de000000000001ull

/* The largest capacity a device may have: its heap must fit in an off_t. */
#define MAX_CAPACITY (1ull << 50)

static inline uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }
static inline void *ptr_of(uint64_t a) { return (void *)(uintptr_t)a; }
static inline uint64_t addr_of(const void *p) { return (uint64_t)(uintptr_t)p; }

/* ===== configuration ====================================================== */

#define DEFAULT_CONFIG                                                                                   \
	{                                                                                                \
		.devices = 2, .capacity = 64 * MIB, .mingran = 2 * MIB, .recgran = 2 * MIB,              \
	}

static struct vdev_config cfg = DEFAULT_CONFIG;

const struct vdev_config *vdev_config(void) { return &cfg; }

static pthread_mutex_t books = PTHREAD_MUTEX_INITIALIZER;

/* init_done: vdev_init ran to a lasting answer, init_result (books; read
 * atomically by vdev_initialized). */
static int init_done;
static vdev_status init_result;

/* parse_u64 reads a whole decimal number, nothing else. */
static bool parse_u64(const char *s, uint64_t *out)
{
	uint64_t v = 0;
	if (!*s)
		return false;
	for (; *s; s++) {
		if (*s < '0' || *s > '9')
			return false;
		uint64_t d = (uint64_t)(*s - '0');
		if (v > (UINT64_MAX - d) / 10)
			return false;
		v = v * 10 + d;
	}
	*out = v;
	return true;
}

static bool *config_flag(struct vdev_config *c, const char *key)
{
	static const struct {
		const char *key;
		size_t off;
	} flags[] = {
		{"novmm", offsetof(struct vdev_config, novmm)},
		{"noposix", offsetof(struct vdev_config, noposix)},
		{"nopools", offsetof(struct vdev_config, nopools)},
		{"nopeer", offsetof(struct vdev_config, nopeer)},
		{"stub", offsetof(struct vdev_config, stub)},
		{"nodevice", offsetof(struct vdev_config, nodevice)},
	};
	for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
		if (!strcmp(key, flags[i].key))
			return (bool *)((char *)c + flags[i].off);
	return NULL;
}

/* vmstandin_configure sets the configuration from spec, a comma-separated
 * list of key=value (empty items are ignored); keys not given keep their
 * defaults. An unset recgran is the larger of 2 MiB and mingran. It fails,
 * changing nothing, on a bad spec or once vdev_init has run. */
VDEV_EXPORT int vmstandin_configure(const char *spec)
{
	struct vdev_config c = DEFAULT_CONFIG;
	bool recgran_set = false;
	char buf[512];

	if (!spec || strlen(spec) >= sizeof buf)
		return -1;
	strcpy(buf, spec);
	char *save = NULL;
	for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(item, '=');
		uint64_t v;
		if (!eq)
			return -1;
		*eq = '\0';
		if (!parse_u64(eq + 1, &v))
			return -1;
		if (!strcmp(item, "devices")) {
			if (v < 1 || v > VDEV_MAX_DEVICES)
				return -1;
			c.devices = (int)v;
		} else if (!strcmp(item, "capacity")) {
			c.capacity = v;
		} else if (!strcmp(item, "mingran")) {
			c.mingran = v;
		} else if (!strcmp(item, "recgran")) {
			c.recgran = v;
			recgran_set = true;
		} else {
			bool *flag = config_flag(&c, item);
			if (!flag || v > 1)
				return -1;
			*flag = v == 1;
		}
	}
	if (!recgran_set && c.recgran < c.mingran)
		c.recgran = c.mingran;
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
	if (c.mingran < page || (c.mingran & (c.mingran - 1)) || c.mingran > (1ull << 30))
		return -1;
	if (c.recgran == 0 || c.recgran % c.mingran)
		return -1;
	if (c.capacity == 0 || c.capacity % c.mingran || c.capacity > MAX_CAPACITY)
		return -1;

	pthread_mutex_lock(&books);
	int rc = -1;
	if (!init_done) {
		cfg = c;
		rc = 0;
	}
	pthread_mutex_unlock(&books);
	return rc;
}

/* ===== call accounting and fault injection ================================ */

enum { MAX_FNS = 256, MAX_INJECTIONS = 64, FN_NAME = 64 };

/* fn_count: calls of one exported function so far, injected ones included. */
struct fn_count {
	char name[FN_NAME];
	uint64_t calls;
};

/* injection: calls nth .. nth+count-1 (count <= 0: every call from nth on)
 * of name, counted from when it was set (seen), fail with code, at the call
 * or, with exec, when the operation runs. One per (name, exec). */
struct injection {
	char name[FN_NAME];
	bool exec;
	int nth, count, code;
	int64_t seen;
};

static pthread_mutex_t stats = PTHREAD_MUTEX_INITIALIZER;
static struct fn_count fns[MAX_FNS];
static int nfns;
static struct injection injections[MAX_INJECTIONS];
static int ninjections;

/* fn_row returns fn's row of fns, adding it (-1 when the table is full or
 * the name too long). stats held. */
static int fn_row(const char *fn, bool add)
{
	for (int i = 0; i < nfns; i++)
		if (!strcmp(fns[i].name, fn))
			return i;
	if (!add || nfns == MAX_FNS || strlen(fn) >= FN_NAME)
		return -1;
	strcpy(fns[nfns].name, fn);
	return nfns++;
}

int vdev_enter(int *slot, const char *fn, int *exec)
{
	int code = 0, exec_code = 0;

	pthread_mutex_lock(&stats);
	if (*slot < 0)
		*slot = fn_row(fn, true);
	if (*slot >= 0)
		fns[*slot].calls++;
	for (int i = 0; i < ninjections; i++) {
		struct injection *in = &injections[i];
		if (strcmp(in->name, fn))
			continue;
		in->seen++;
		if (in->seen < in->nth || (in->count > 0 && in->seen >= (int64_t)in->nth + in->count))
			continue;
		if (in->exec)
			exec_code = in->code;
		else
			code = in->code;
	}
	pthread_mutex_unlock(&stats);
	if (exec)
		*exec = exec_code;
	return code;
}

/* vmstandin_fail sets (nth > 0) or clears (nth <= 0) the injection of fn;
 * "fn:exec" is the run-time one. Code 0 injects nothing. */
VDEV_EXPORT void vmstandin_fail(const char *fn, int nth, int count, int code)
{
	static const char suffix[] = ":exec";
	const size_t slen = sizeof suffix - 1;
	char name[FN_NAME];
	bool exec = false;

	if (!fn)
		return;
	size_t len = strlen(fn);
	if (len > slen && !strcmp(fn + len - slen, suffix)) {
		exec = true;
		len -= slen;
	}
	if (len == 0 || len >= FN_NAME)
		return;
	memcpy(name, fn, len);
	name[len] = '\0';

	pthread_mutex_lock(&stats);
	int i = 0;
	while (i < ninjections && (strcmp(injections[i].name, name) || injections[i].exec != exec))
		i++;
	if (nth <= 0 || code == 0) {
		if (i < ninjections)
			injections[i] = injections[--ninjections];
	} else if (i < ninjections || ninjections < MAX_INJECTIONS) {
		if (i == ninjections)
			ninjections++;
		struct injection *in = &injections[i];
		strcpy(in->name, name);
		in->exec = exec;
		in->nth = nth;
		in->count = count;
		in->code = code;
		in->seen = 0;
	}
	pthread_mutex_unlock(&stats);
}

VDEV_EXPORT void vmstandin_clear(void)
{
	pthread_mutex_lock(&stats);
	ninjections = 0;
	pthread_mutex_unlock(&stats);
}

VDEV_EXPORT uint64_t vmstandin_calls(const char *fn)
{
	uint64_t n = 0;
	if (!fn)
		return 0;
	pthread_mutex_lock(&stats);
	int row = fn_row(fn, false);
	if (row >= 0)
		n = fns[row].calls;
	pthread_mutex_unlock(&stats);
	return n;
}

/* ===== the books =========================================================== */

/* A reservation is [base, base+size) of address space this library owns;
 * every byte of it no mapping covers is PROT_NONE anonymous memory.
 * Reservations never overlap; `reservations` is sorted by base. */
struct reservation {
	uint64_t base, size;
};

/* A backing is the memory behind allocation handles: a range of its
 * device's heap memfd (fd < 0), or a memfd of its own (shareable, sealed).
 * refs counts the allocations over it: more than one only where this
 * process imported memory it already held. Its bytes count in its device's
 * used from creation until refs drops to 0. */
struct backing {
	int dev;
	uint64_t size;
	int fd;       /* own memfd, or -1 for a heap range */
	uint64_t off; /* offset in the heap; 0 with an own memfd */
	dev_t st_dev; /* identity of the own memfd, to find a re-import */
	ino_t st_ino;
	int refs;
};

/* An allocation is one handle. It lives until it is released and its last
 * mapping is gone (CUDA: cuMemRelease defers the free to the last unmap).
 * `allocations` is sorted by handle (handles only grow). */
struct allocation {
	uint64_t handle;
	struct backing *mem;
	bool released;
	int maps; /* live mappings of this handle */
};

/* A mapping places the first size bytes of alloc at [addr, addr+size),
 * inside one reservation. acc[g*devices + d] is device d's access to
 * granule g, the mingran bytes at addr + g*mingran. The pages carry the
 * widest access any device has. Mappings never overlap; `mappings` is
 * sorted by addr. */
struct mapping {
	uint64_t addr, size;
	struct allocation *alloc;
	uint8_t *acc;
};

static uint64_t mapping_end(const struct mapping *m) { return m->addr + m->size; }

struct host_alloc {
	void *p;
	uint64_t size;
};

/* A context. refs > 0: usable (a primary context's references; 1 for a
 * live explicit one). poisoned: a sticky fault happened in it. gen counts
 * its destructions, so that streams of an earlier life run nothing more. */
struct vdev_ctx {
	int dev;
	int refs;
	int poisoned;
	unsigned gen;
	uint32_t peers;           /* devices reachable as peers (books) */
	vdev_stream *null_stream; /* the default stream, made on first use (books) */
};

/* A device: a capacity, a heap, a primary context. The heap is a sparse
 * memfd of heap_size bytes; `ranges` holds the backings carved from it,
 * sorted by off, never overlapping, each committed with fallocate. used
 * counts every live backing of the device, heap range or own memfd, and
 * never exceeds the capacity except through imports. */
struct device {
	int heap_fd;
	uint64_t heap_size;
	uint64_t used;
	struct vec ranges;
	struct vdev_ctx ctx;
};

static char vendor_name[32];
/* sticky_faults: an access violation of asynchronous work poisons its
 * context (fixed by vdev_init). */
static bool sticky_faults;
static struct device devices[VDEV_MAX_DEVICES];
static struct vec reservations, allocations, mappings, streams, events, host_allocs;
/* contexts holds every explicit context ever made, live or destroyed: it
 * never shrinks, and its contexts are never freed. */
static struct vec contexts;
static uint64_t next_handle = HANDLE_BASE;
static pthread_rwlock_t touch = PTHREAD_RWLOCK_INITIALIZER;
static __thread vdev_ctx *current;

/* ===== initialisation ====================================================== */

bool vdev_initialized(void)
{
	return __atomic_load_n(&init_done, __ATOMIC_ACQUIRE) && init_result == VDEV_OK;
}

const char *vdev_vendor(void) { return vendor_name; }

vdev_status vdev_init(const char *vendor, bool sticky)
{
	pthread_mutex_lock(&books);
	if (init_done) {
		vdev_status st = init_result;
		pthread_mutex_unlock(&books);
		return st;
	}
	vdev_status st = VDEV_OK;
	if (cfg.nodevice) {
		st = VDEV_NO_DEVICE; /* cuInit on a machine without a GPU */
	} else {
		int d;
		for (d = 0; d < cfg.devices; d++) {
			char name[64];
			snprintf(name, sizeof name, "vmstandin-heap:%s:%d", vendor, d);
			struct device *dv = &devices[d];
			dv->heap_size = cfg.capacity * HEAP_SPAN;
			dv->heap_fd = memfd_create(name, MFD_CLOEXEC);
			if (dv->heap_fd < 0)
				break;
			if (ftruncate(dv->heap_fd, (off_t)dv->heap_size) < 0) {
				close(dv->heap_fd);
				break;
			}
			dv->ctx.dev = d;
		}
		if (d < cfg.devices) {
			while (d-- > 0)
				close(devices[d].heap_fd);
			pthread_mutex_unlock(&books);
			return VDEV_OS; /* not lasting: a later call may try again */
		}
		snprintf(vendor_name, sizeof vendor_name, "%s", vendor);
		sticky_faults = sticky;
	}
	init_result = st;
	__atomic_store_n(&init_done, 1, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&books);
	return st;
}

static bool device_ok(int dev) { return dev >= 0 && dev < cfg.devices; }

/* ===== contexts ============================================================ */

static bool poisoned(const vdev_ctx *c) { return __atomic_load_n(&c->poisoned, __ATOMIC_ACQUIRE); }

/* poison makes c's fault sticky: CUDA reports an illegal address for every
 * later call in the context, until the context is destroyed. */
static void poison(vdev_ctx *c) { __atomic_store_n(&c->poisoned, 1, __ATOMIC_RELEASE); }

/* ctx_primary says whether c is one of the primary contexts. It compares
 * addresses only, so a garbage pointer is never read. */
static bool ctx_primary(const vdev_ctx *c)
{
	for (int d = 0; d < cfg.devices; d++)
		if (c == &devices[d].ctx)
			return true;
	return false;
}

/* ctx_known says whether c is a primary or an explicit context, live or
 * not; it compares addresses only. books held. */
static bool ctx_known(const vdev_ctx *c) { return ctx_primary(c) || vec_find(&contexts, c) < contexts.n; }

/* ctx_usable says whether c is a context and alive. It takes the books to
 * look among the explicit contexts: call it with no lock held. */
static bool ctx_usable(const vdev_ctx *c)
{
	if (!c)
		return false;
	bool known = ctx_primary(c);
	if (!known) {
		pthread_mutex_lock(&books);
		known = vec_find(&contexts, c) < contexts.n;
		pthread_mutex_unlock(&books);
	}
	return known && __atomic_load_n(&c->refs, __ATOMIC_ACQUIRE) > 0;
}

/* ctx_alive checks again, under the books, a context the caller found
 * usable without them: another thread may have released it since, and
 * nothing may be made in a destroyed context. books held. */
static bool ctx_alive(const vdev_ctx *c) { return c->refs > 0; }

static void stream_close(vdev_stream *s);
static void event_free(vdev_event *e);

/* ctx_destroy ends a context's life, as the release of a primary context's
 * last reference does in CUDA: its streams and events go (queued work is
 * skipped), its peers and sticky fault are forgotten. books held. */
static void ctx_destroy(vdev_ctx *c);

vdev_status vdev_ctx_retain(int dev, vdev_ctx **out)
{
	if (!vdev_initialized())
		return VDEV_NOT_INITIALIZED;
	if (!device_ok(dev))
		return VDEV_NO_DEVICE;
	pthread_mutex_lock(&books);
	vdev_ctx *c = &devices[dev].ctx;
	__atomic_store_n(&c->refs, c->refs + 1, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&books);
	*out = c;
	return VDEV_OK;
}

vdev_status vdev_ctx_release(int dev)
{
	if (!vdev_initialized())
		return VDEV_NOT_INITIALIZED;
	if (!device_ok(dev))
		return VDEV_NO_DEVICE;
	pthread_mutex_lock(&books);
	vdev_ctx *c = &devices[dev].ctx;
	vdev_status st = VDEV_OK;
	if (c->refs == 0) {
		st = VDEV_NO_CONTEXT;
	} else {
		__atomic_store_n(&c->refs, c->refs - 1, __ATOMIC_RELEASE);
		if (c->refs == 0)
			ctx_destroy(c);
	}
	pthread_mutex_unlock(&books);
	return st;
}

vdev_status vdev_ctx_create(int dev, vdev_ctx **out)
{
	if (!vdev_initialized())
		return VDEV_NOT_INITIALIZED;
	if (!device_ok(dev))
		return VDEV_NO_DEVICE;
	vdev_ctx *c = calloc(1, sizeof *c);
	if (!c)
		return VDEV_OOM;
	c->dev = dev;
	c->refs = 1;
	pthread_mutex_lock(&books);
	bool ok = vec_push(&contexts, c);
	pthread_mutex_unlock(&books);
	if (!ok) {
		free(c);
		return VDEV_OOM;
	}
	*out = c;
	return VDEV_OK;
}

vdev_status vdev_ctx_destroy(vdev_ctx *c)
{
	vdev_status st = VDEV_BAD_HANDLE;
	pthread_mutex_lock(&books);
	if (c && !ctx_primary(c) && ctx_known(c) && c->refs > 0) {
		__atomic_store_n(&c->refs, 0, __ATOMIC_RELEASE);
		ctx_destroy(c);
		st = VDEV_OK;
	}
	pthread_mutex_unlock(&books);
	if (st == VDEV_OK && current == c)
		current = NULL;
	return st;
}

vdev_status vdev_ctx_set_current(vdev_ctx *c)
{
	if (c && !ctx_usable(c))
		return VDEV_NO_CONTEXT;
	current = c;
	return VDEV_OK;
}

vdev_ctx *vdev_ctx_get_current(void) { return current; }

vdev_status vdev_ctx_use(vdev_ctx **out)
{
	vdev_ctx *c = current;
	if (!ctx_usable(c))
		return VDEV_NO_CONTEXT;
	if (poisoned(c))
		return VDEV_ILLEGAL_ADDRESS;
	*out = c;
	return VDEV_OK;
}

int vdev_ctx_device(const vdev_ctx *c) { return c->dev; }

vdev_status vdev_peer_can(int dev, int peer, bool *can)
{
	if (!device_ok(dev) || !device_ok(peer))
		return VDEV_NO_DEVICE;
	*can = dev != peer && !cfg.nopeer;
	return VDEV_OK;
}

/* Peer access is recorded and refused as the real driver refuses it, but
 * it opens nothing: a device reaches VMM memory of another device exactly
 * when vdev_set_access granted it (CUDA's VMM rule). */
vdev_status vdev_peer_enable(vdev_ctx *cur, vdev_ctx *peer)
{
	if (!ctx_usable(peer))
		return VDEV_NO_CONTEXT;
	if (peer->dev == cur->dev)
		return VDEV_INVALID;
	if (cfg.nopeer)
		return VDEV_NOT_SUPPORTED;
	pthread_mutex_lock(&books);
	vdev_status st = VDEV_OK;
	uint32_t bit = 1u << peer->dev;
	if (cur->peers & bit)
		st = VDEV_ALREADY;
	else
		cur->peers |= bit;
	pthread_mutex_unlock(&books);
	return st;
}

/* ===== searching the books ================================================= */

/* mapping_search returns the index of the first mapping that ends above
 * addr (mappings.n if none): the one holding addr, if any, else the next. */
static size_t mapping_search(uint64_t addr)
{
	size_t lo = 0, hi = mappings.n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const struct mapping *m = mappings.at[mid];
		if (mapping_end(m) <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static size_t reservation_search(uint64_t addr)
{
	size_t lo = 0, hi = reservations.n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const struct reservation *r = reservations.at[mid];
		if (r->base + r->size <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* in_reservation says whether one reservation holds all of [addr, end). */
static bool in_reservation(uint64_t addr, uint64_t end)
{
	size_t i = reservation_search(addr);
	if (i == reservations.n)
		return false;
	const struct reservation *r = reservations.at[i];
	return r->base <= addr && end <= r->base + r->size;
}

vdev_status vdev_reservation_of(uint64_t addr, uint64_t *base, uint64_t *size)
{
	pthread_mutex_lock(&books);
	vdev_status st = VDEV_INVALID;
	size_t i = reservation_search(addr);
	if (i < reservations.n) {
		const struct reservation *r = reservations.at[i];
		if (r->base <= addr && addr < r->base + r->size) {
			*base = r->base;
			*size = r->size;
			st = VDEV_OK;
		}
	}
	pthread_mutex_unlock(&books);
	return st;
}

/* touches_reservation says whether [addr, end) meets any reservation. */
static bool touches_reservation(uint64_t addr, uint64_t end)
{
	size_t i = reservation_search(addr);
	return i < reservations.n && ((const struct reservation *)reservations.at[i])->base < end;
}

/* mapped_run checks that [addr, end) is mapped throughout, by one or more
 * mappings that follow each other without a gap, and returns the index of
 * the first. */
static bool mapped_run(uint64_t addr, uint64_t end, size_t *first)
{
	size_t i = mapping_search(addr);
	*first = i;
	for (uint64_t a = addr; a < end; i++) {
		if (i == mappings.n)
			return false;
		const struct mapping *m = mappings.at[i];
		if (m->addr > a)
			return false;
		a = mapping_end(m);
	}
	return true;
}

static size_t allocation_index(uint64_t handle)
{
	size_t lo = 0, hi = allocations.n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (((const struct allocation *)allocations.at[mid])->handle < handle)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* allocation_find returns the live, unreleased allocation of handle. */
static struct allocation *allocation_find(uint64_t handle)
{
	size_t i = allocation_index(handle);
	if (i == allocations.n)
		return NULL;
	struct allocation *a = allocations.at[i];
	return a->handle == handle && !a->released ? a : NULL;
}

/* ===== reservations ======================================================== */

/* reserve takes size bytes of fresh address space at skew bytes past a
 * multiple of align (a power of two, skew < align): at hint when that is
 * free and placed so, elsewhere otherwise. */
static vdev_status reserve(uint64_t size, uint64_t align, uint64_t skew, uint64_t hint, uint64_t *out)
{
	if (size > UINT64_MAX / 4 || align > UINT64_MAX / 4)
		return VDEV_OOM;

	struct reservation *r = malloc(sizeof *r);
	if (!r)
		return VDEV_OOM;
	void *p = MAP_FAILED;
	if (hint && hint % align == skew) {
		p = mmap(ptr_of(hint), size, PROT_NONE, RESERVED_FLAGS | MAP_FIXED_NOREPLACE, -1, 0);
		if (p != MAP_FAILED && addr_of(p) != hint) {
			/* A kernel before 4.17 takes NOREPLACE for a plain hint. */
			munmap(p, size);
			p = MAP_FAILED;
		}
	}
	if (p == MAP_FAILED) {
		uint64_t span = size + align + skew;
		char *q = mmap(NULL, span, PROT_NONE, RESERVED_FLAGS, -1, 0);
		if (q == MAP_FAILED) {
			free(r);
			return VDEV_OOM;
		}
		uint64_t start = ((addr_of(q) + align - 1) & ~(align - 1)) + skew;
		uint64_t head = start - addr_of(q), tail = span - head - size;
		if (head)
			munmap(q, head);
		if (tail)
			munmap(ptr_of(start + size), tail);
		p = ptr_of(start);
	}
	r->base = addr_of(p);
	r->size = size;

	pthread_mutex_lock(&books);
	bool ok = vec_insert(&reservations, reservation_search(r->base), r);
	pthread_mutex_unlock(&books);
	if (!ok) {
		munmap(p, size);
		free(r);
		return VDEV_OOM;
	}
	*out = r->base;
	return VDEV_OK;
}

/* vdev_reserve mirrors cuMemAddressReserve: fresh address space, aligned,
 * at the hint when it is free and aligned, elsewhere otherwise. */
vdev_status vdev_reserve(uint64_t size, uint64_t align, uint64_t hint, uint64_t *out)
{
	if (cfg.novmm)
		return VDEV_NOT_SUPPORTED;
	if (size == 0 || size % cfg.mingran || (align & (align - 1)))
		return VDEV_INVALID;
	if (align < cfg.mingran)
		align = cfg.mingran;
	return reserve(size, align, 0, hint, out);
}

/* vdev_reserve_odd is AscendCL's aclrtReserveMemAddress as the stand-in
 * plays it: the documents promise no alignment beyond the granularity, so
 * the stand-in gives no more, ever, and a driver that assumes more fails
 * its tests rather than a customer's NPU. */
vdev_status vdev_reserve_odd(uint64_t size, uint64_t *out)
{
	if (cfg.novmm)
		return VDEV_NOT_SUPPORTED;
	if (size == 0 || size % cfg.mingran)
		return VDEV_INVALID;
	return reserve(size, 2 * cfg.mingran, cfg.mingran, 0, out);
}

/* unreserve returns reservation i if nothing is mapped inside it. books
 * held. */
static vdev_status unreserve(size_t i)
{
	struct reservation *r = reservations.at[i];
	size_t j = mapping_search(r->base);
	if (j < mappings.n && ((const struct mapping *)mappings.at[j])->addr < r->base + r->size)
		return VDEV_INVALID;
	munmap(ptr_of(r->base), r->size);
	vec_cut(&reservations, i, i + 1);
	free(r);
	return VDEV_OK;
}

/* vdev_unreserve mirrors cuMemAddressFree: exactly a reservation, and
 * nothing may be mapped inside it. */
vdev_status vdev_unreserve(uint64_t addr, uint64_t size)
{
	if (cfg.novmm)
		return VDEV_NOT_SUPPORTED;
	pthread_mutex_lock(&books);
	vdev_status st = VDEV_INVALID;
	size_t i = reservation_search(addr);
	struct reservation *r = i < reservations.n ? reservations.at[i] : NULL;
	if (r && r->base == addr && r->size == size)
		st = unreserve(i);
	pthread_mutex_unlock(&books);
	return st;
}

/* vdev_unreserve_at mirrors aclrtReleaseMemAddress, which takes no size:
 * the reservation that starts exactly at addr, nothing mapped inside. */
vdev_status vdev_unreserve_at(uint64_t addr)
{
	if (cfg.novmm)
		return VDEV_NOT_SUPPORTED;
	pthread_mutex_lock(&books);
	vdev_status st = VDEV_INVALID;
	size_t i = reservation_search(addr);
	if (i < reservations.n && ((const struct reservation *)reservations.at[i])->base == addr)
		st = unreserve(i);
	pthread_mutex_unlock(&books);
	return st;
}

/* ===== physical allocations ================================================ */

/* heap_take carves b->size bytes for b from its device's heap, first fit
 * from the lowest offset, and commits them. books held. */
static vdev_status heap_take(struct device *dv, struct backing *b)
{
	uint64_t off = 0;
	size_t i;
	for (i = 0; i < dv->ranges.n; i++) {
		const struct backing *r = dv->ranges.at[i];
		if (r->off - off >= b->size)
			break;
		off = r->off + r->size;
	}
	if (off + b->size > dv->heap_size)
		return VDEV_OOM;
	/* Commit now: CUDA's cuMemCreate either has the memory or fails with
	 * out of memory; it never faults later. */
	if (fallocate(dv->heap_fd, 0, (off_t)off, (off_t)b->size) < 0)
		return errno == ENOSPC ? VDEV_OOM : VDEV_OS;
	b->off = off;
	if (!vec_insert(&dv->ranges, i, b)) {
		fallocate(dv->heap_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)b->size);
		return VDEV_OOM;
	}
	return VDEV_OK;
}

/* own_memfd gives b a committed, sealed memfd of its own, named so that
 * another process can tell it is shareable memory of this vendor's
 * stand-in, and on which device: "vmstandin:<vendor>:<dev>:<size>". */
static vdev_status own_memfd(struct backing *b)
{
	char name[96];
	struct stat st;
	snprintf(name, sizeof name, "vmstandin:%s:%d:%llu", vendor_name, b->dev, (unsigned long long)b->size);
	int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return errno == EMFILE || errno == ENFILE ? VDEV_OOM : VDEV_OS;
	vdev_status s = VDEV_OS;
	if (ftruncate(fd, (off_t)b->size) < 0)
		goto fail;
	if (fallocate(fd, 0, 0, (off_t)b->size) < 0) {
		s = errno == ENOSPC ? VDEV_OOM : VDEV_OS;
		goto fail;
	}
	if (fcntl(fd, F_ADD_SEALS, SHARE_SEALS) < 0 || fstat(fd, &st) < 0)
		goto fail;
	b->fd = fd;
	b->st_dev = st.st_dev;
	b->st_ino = st.st_ino;
	return VDEV_OK;
fail:
	close(fd);
	return s;
}

/* backing_unref drops a reference; the last one frees the memory: a hole
 * punched in the heap, or the memfd closed. books held. */
static void backing_unref(struct backing *b)
{
	if (--b->refs > 0)
		return;
	struct device *dv = &devices[b->dev];
	dv->used -= b->size;
	if (b->fd >= 0) {
		close(b->fd);
	} else {
		fallocate(dv->heap_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)b->off, (off_t)b->size);
		size_t i = vec_find(&dv->ranges, b);
		if (i < dv->ranges.n)
			vec_cut(&dv->ranges, i, i + 1);
	}
	free(b);
}

/* allocation_add books a new handle over b. books held. */
static struct allocation *allocation_add(struct backing *b)
{
	struct allocation *a = calloc(1, sizeof *a);
	if (!a)
		return NULL;
	a->handle = next_handle;
	a->mem = b;
	if (!vec_push(&allocations, a)) {
		free(a);
		return NULL;
	}
	next_handle++;
	return a;
}

/* allocation_end removes a released allocation whose last mapping went.
 * books held. */
static void allocation_end(struct allocation *a)
{
	size_t i = allocation_index(a->handle);
	vec_cut(&allocations, i, i + 1);
	backing_unref(a->mem);
	free(a);
}

/* vdev_create mirrors cuMemCreate: a positive multiple of the granularity,
 * committed at once, and out of memory (changing nothing) past capacity. */
vdev_status vdev_create(int dev, uint64_t size, bool shareable, uint64_t *handle)
{
	if (cfg.novmm || (shareable && cfg.noposix))
		return VDEV_NOT_SUPPORTED;
	if (!device_ok(dev))
		return VDEV_NO_DEVICE;
	if (size == 0 || size % cfg.mingran)
		return VDEV_INVALID;

	pthread_mutex_lock(&books);
	struct device *dv = &devices[dev];
	vdev_status st = VDEV_OOM;
	struct backing *b = NULL;
	struct allocation *a = NULL;
	if (dv->used > cfg.capacity || size > cfg.capacity - dv->used)
		goto out;
	b = calloc(1, sizeof *b);
	if (!b)
		goto out;
	b->dev = dev;
	b->size = size;
	b->fd = -1;
	b->refs = 1;
	st = shareable ? own_memfd(b) : heap_take(dv, b);
	if (st != VDEV_OK) {
		free(b);
		goto out;
	}
	dv->used += size;
	a = allocation_add(b);
	if (!a) {
		backing_unref(b);
		st = VDEV_OOM;
		goto out;
	}
	*handle = a->handle;
out:
	pthread_mutex_unlock(&books);
	return st;
}

/* vdev_release mirrors cuMemRelease: the handle is gone at once, the
 * memory with the handle's last mapping. */
vdev_status vdev_release(uint64_t handle)
{
	if (cfg.novmm)
		return VDEV_NOT_SUPPORTED;
	pthread_mutex_lock(&books);
	struct allocation *a = allocation_find(handle);
	if (a) {
		a->released = true;
		if (a->maps == 0)
			allocation_end(a);
	}
	pthread_mutex_unlock(&books);
	return a ? VDEV_OK : VDEV_BAD_HANDLE;
}

vdev_status vdev_allocation_size(uint64_t handle, uint64_t *size)
{
	pthread_mutex_lock(&books);
	struct allocation *a = allocation_find(handle);
	if (a)
		*size = a->mem->size;
	pthread_mutex_unlock(&books);
	return a ? VDEV_OK : VDEV_BAD_HANDLE;
}

/* vdev_release_unmapped mirrors aclrtFreePhysical as the stand-in reads it
 * (strictly: the documents free the memory at once and say nothing of a
 * handle still mapped): a handle still mapped is refused. */
vdev_status vdev_release_unmapped(uint64_t handle)
{
	if (cfg.novmm)
		return VDEV_NOT_SUPPORTED;
	pthread_mutex_lock(&books);
	vdev_status st = VDEV_BAD_HANDLE;
	struct allocation *a = allocation_find(handle);
	if (a && a->maps > 0) {
		st = VDEV_BUSY;
	} else if (a) {
		a->released = true;
		allocation_end(a);
		st = VDEV_OK;
	}
	pthread_mutex_unlock(&books);
	return st;
}

/* ===== mappings ============================================================ */

/* vdev_map mirrors cuMemMap: offset 0, a granule-aligned address inside one
 * reservation, never over a mapping, the first size bytes of the handle;
 * the new mapping is inaccessible to every device until vdev_set_access. */
vdev_status vdev_map(uint64_t addr, uint64_t size, uint64_t offset, uint64_t handle)
{
	if (cfg.novmm)
		return VDEV_NOT_SUPPORTED;
	pthread_mutex_lock(&books);
	vdev_status st = VDEV_BAD_HANDLE;
	struct mapping *m = NULL;
	struct allocation *a = allocation_find(handle);
	if (!a)
		goto out;
	st = VDEV_INVALID;
	if (offset != 0 || size == 0 || size % cfg.mingran || size > a->mem->size || addr % cfg.mingran ||
	    addr + size < addr || !in_reservation(addr, addr + size))
		goto out;
	size_t i = mapping_search(addr);
	if (i < mappings.n && ((const struct mapping *)mappings.at[i])->addr < addr + size) {
		st = VDEV_OVERLAP;
		goto out;
	}
	st = VDEV_OOM;
	m = calloc(1, sizeof *m);
	if (!m || !(m->acc = calloc(size / cfg.mingran, (size_t)cfg.devices)))
		goto out;
	const struct backing *b = a->mem;
	int fd = b->fd >= 0 ? b->fd : devices[b->dev].heap_fd;
	if (mmap(ptr_of(addr), size, PROT_NONE, MAP_SHARED | MAP_FIXED, fd, (off_t)b->off) == MAP_FAILED) {
		st = errno == ENOMEM ? VDEV_OOM : VDEV_OS;
		goto out;
	}
	if (!vec_insert(&mappings, i, m)) {
		mmap(ptr_of(addr), size, PROT_NONE, RESERVED_FLAGS | MAP_FIXED, -1, 0);
		goto out;
	}
	m->addr = addr;
	m->size = size;
	m->alloc = a;
	a->maps++;
	m = NULL;
	st = VDEV_OK;
out:
	if (m) {
		free(m->acc);
		free(m);
	}
	pthread_mutex_unlock(&books);
	return st;
}

/* unmap returns whole mappings only (one, or several side by side) to
 * reserved, in one system call. touch held for writing, books held. */
static vdev_status unmap(uint64_t addr, uint64_t size)
{
	uint64_t end = addr + size;
	size_t i = mapping_search(addr), j = i;
	if (size == 0 || end < addr)
		return VDEV_INVALID;
	if (i == mappings.n || ((const struct mapping *)mappings.at[i])->addr > addr)
		return VDEV_NOT_MAPPED;
	/* From the start of a mapping, through whole mappings without a gap,
	 * to the end of one: anything else takes part of a mapping. */
	for (uint64_t a = addr; a < end; j++) {
		if (j == mappings.n || ((const struct mapping *)mappings.at[j])->addr != a)
			return VDEV_INVALID;
		const struct mapping *m = mappings.at[j];
		a = mapping_end(m);
		if (a > end)
			return VDEV_INVALID;
	}
	if (mmap(ptr_of(addr), size, PROT_NONE, RESERVED_FLAGS | MAP_FIXED, -1, 0) == MAP_FAILED)
		return VDEV_OS;
	for (size_t k = i; k < j; k++) {
		struct mapping *m = mappings.at[k];
		struct allocation *al = m->alloc;
		free(m->acc);
		free(m);
		if (--al->maps == 0 && al->released)
			allocation_end(al);
	}
	vec_cut(&mappings, i, j);
	return VDEV_OK;
}

/* vdev_unmap mirrors cuMemUnmap: whole mappings only. */
vdev_status vdev_unmap(uint64_t addr, uint64_t size)
{
	if (cfg.novmm)
		return VDEV_NOT_SUPPORTED;
	pthread_rwlock_wrlock(&touch);
	pthread_mutex_lock(&books);
	vdev_status st = unmap(addr, size);
	pthread_mutex_unlock(&books);
	pthread_rwlock_unlock(&touch);
	return st;
}

/* vdev_unmap_at mirrors aclrtUnmapMem, which takes no size: the mapping
 * that starts exactly at addr, whole. */
vdev_status vdev_unmap_at(uint64_t addr)
{
	if (cfg.novmm)
		return VDEV_NOT_SUPPORTED;
	pthread_rwlock_wrlock(&touch);
	pthread_mutex_lock(&books);
	vdev_status st = VDEV_NOT_MAPPED;
	size_t i = mapping_search(addr);
	if (i < mappings.n && ((const struct mapping *)mappings.at[i])->addr == addr)
		st = unmap(addr, ((const struct mapping *)mappings.at[i])->size);
	pthread_mutex_unlock(&books);
	pthread_rwlock_unlock(&touch);
	return st;
}

bool vdev_in_reserved(uint64_t addr, uint64_t n)
{
	uint64_t end = addr + (n ? n : 1);
	if (end < addr)
		end = UINT64_MAX;
	pthread_mutex_lock(&books);
	bool in = touches_reservation(addr, end);
	pthread_mutex_unlock(&books);
	return in;
}

/* ===== access ============================================================== */

static uint8_t *acc_row(const struct mapping *m, uint64_t a)
{
	return &m->acc[(a - m->addr) / cfg.mingran * (uint64_t)cfg.devices];
}

/* widest is the access of the pages: the union of every device's. Access
 * values nest (none 0 within read 1 within read-write 3), so it is an OR. */
static int widest(const uint8_t *row)
{
	int w = 0;
	for (int d = 0; d < cfg.devices; d++)
		w |= row[d];
	return w;
}

static int prot_of(int access)
{
	return access == VDEV_ACCESS_READWRITE ? PROT_READ | PROT_WRITE
	       : access == VDEV_ACCESS_READ     ? PROT_READ
					       : PROT_NONE;
}

/* protect_rows mprotects the granules [addr, addr + n*mingran) from rows
 * (devices bytes per granule), a run of equal widest access per call. It
 * returns how many granules it finished before a failure (n on success). */
static uint64_t protect_rows(uint64_t addr, const uint8_t *rows, uint64_t n)
{
	const uint64_t g = cfg.mingran, d = (uint64_t)cfg.devices;
	uint64_t k = 0;
	while (k < n) {
		int w = widest(&rows[k * d]);
		uint64_t e = k + 1;
		while (e < n && widest(&rows[e * d]) == w)
			e++;
		if (mprotect(ptr_of(addr + k * g), (e - k) * g, prot_of(w)) < 0)
			return k;
		k = e;
	}
	return n;
}

/* set_access mirrors cuMemSetAccess: a granule-aligned range of whole
 * mappings, adjacent (of one only when `one`); a range that starts or ends
 * inside a mapping is VDEV_INVALID, as an H100 (CUDA 13.0) answers it with
 * CUDA_ERROR_INVALID_VALUE ("the range must be a fully mapped address range
 * containing all allocations created by cuMemMap / cuMemCreate", the
 * cuMemSetAccess reference). Each listed device gets exactly the access
 * given, the others keep theirs. A failure changes nothing. */
static vdev_status set_access(uint64_t addr, uint64_t size, const struct vdev_access *acc, size_t n, bool one)
{
	if (cfg.novmm)
		return VDEV_NOT_SUPPORTED;
	if (!acc || n == 0)
		return VDEV_INVALID;
	for (size_t k = 0; k < n; k++) {
		if (!device_ok(acc[k].dev))
			return VDEV_NO_DEVICE;
		int f = acc[k].flags;
		if (f != VDEV_ACCESS_NONE && f != VDEV_ACCESS_READ && f != VDEV_ACCESS_READWRITE)
			return VDEV_INVALID;
	}
	if (size == 0 || addr % cfg.mingran || size % cfg.mingran || addr + size < addr)
		return VDEV_INVALID;

	const uint64_t g = cfg.mingran, d = (uint64_t)cfg.devices, ng = size / g;
	pthread_rwlock_wrlock(&touch);
	pthread_mutex_lock(&books);
	vdev_status st = VDEV_INVALID;
	uint8_t *old = NULL, *now = NULL;
	size_t first, i;
	if (!mapped_run(addr, addr + size, &first))
		goto out;
	if (((const struct mapping *)mappings.at[first])->addr != addr)
		goto out; /* starts inside a mapping */
	i = first;
	while (mapping_end(mappings.at[i]) < addr + size)
		i++;
	if (mapping_end(mappings.at[i]) != addr + size || (one && i != first))
		goto out; /* ends inside a mapping, or spans several for `one` */
	st = VDEV_OOM;
	old = calloc(ng, d);
	now = calloc(ng, d);
	if (!old || !now)
		goto out;
	/* Build every new row aside, so a failed mprotect can be undone. */
	i = first;
	for (uint64_t k = 0; k < ng; k++) {
		uint64_t a = addr + k * g;
		while (mapping_end(mappings.at[i]) <= a)
			i++;
		memcpy(&old[k * d], acc_row(mappings.at[i], a), d);
		memcpy(&now[k * d], &old[k * d], d);
		for (size_t x = 0; x < n; x++)
			now[k * d + (uint64_t)acc[x].dev] = (uint8_t)acc[x].flags;
	}
	uint64_t done = protect_rows(addr, now, ng);
	if (done < ng) {
		protect_rows(addr, old, done);
		goto out;
	}
	i = first;
	for (uint64_t k = 0; k < ng; k++) {
		uint64_t a = addr + k * g;
		while (mapping_end(mappings.at[i]) <= a)
			i++;
		memcpy(acc_row(mappings.at[i], a), &now[k * d], d);
	}
	st = VDEV_OK;
out:
	free(old);
	free(now);
	pthread_mutex_unlock(&books);
	pthread_rwlock_unlock(&touch);
	return st;
}

vdev_status vdev_set_access(uint64_t addr, uint64_t size, const struct vdev_access *acc, size_t n)
{
	return set_access(addr, size, acc, n, false);
}

/* vdev_set_access_one is aclrtMemSetAccess as Huawei's reference has it:
 * exactly one mapping, the virPtr and size aclrtMapMem was given — neither
 * a piece of one nor a range over several. */
vdev_status vdev_set_access_one(uint64_t addr, uint64_t size, const struct vdev_access *acc, size_t n)
{
	return set_access(addr, size, acc, n, true);
}

/* vdev_get_access mirrors cuMemGetAccess: one device's access at a mapped
 * address. */
vdev_status vdev_get_access(int dev, uint64_t addr, int *flags)
{
	if (cfg.novmm)
		return VDEV_NOT_SUPPORTED;
	if (!device_ok(dev))
		return VDEV_NO_DEVICE;
	pthread_mutex_lock(&books);
	vdev_status st = VDEV_NOT_MAPPED;
	size_t i = mapping_search(addr);
	if (i < mappings.n && ((const struct mapping *)mappings.at[i])->addr <= addr) {
		*flags = acc_row(mappings.at[i], addr)[dev];
		st = VDEV_OK;
	}
	pthread_mutex_unlock(&books);
	return st;
}

/* ===== shareable memory ==================================================== */

/* vdev_export mirrors cuMemExportToShareableHandle with a POSIX descriptor:
 * a new descriptor each time, for allocations made shareable only. */
vdev_status vdev_export(uint64_t handle, int *fd)
{
	if (cfg.novmm || cfg.noposix)
		return VDEV_NOT_SUPPORTED;
	pthread_mutex_lock(&books);
	vdev_status st = VDEV_BAD_HANDLE;
	struct allocation *a = allocation_find(handle);
	if (a) {
		st = VDEV_NOT_PERMITTED;
		if (a->mem->fd >= 0) {
			int nfd = fcntl(a->mem->fd, F_DUPFD_CLOEXEC, 0);
			st = nfd < 0 ? VDEV_OS : VDEV_OK;
			if (nfd >= 0)
				*fd = nfd;
		}
	}
	pthread_mutex_unlock(&books);
	return st;
}

/* parse_dec reads the decimal digits at *p (at least one), advancing it. */
static bool parse_dec(const char **p, uint64_t *v)
{
	const char *s = *p;
	uint64_t x = 0;
	if (*s < '0' || *s > '9')
		return false;
	for (; *s >= '0' && *s <= '9'; s++) {
		if (x > (UINT64_MAX - 9) / 10)
			return false;
		x = x * 10 + (uint64_t)(*s - '0');
	}
	*p = s;
	*v = x;
	return true;
}

/* shared_name reads "/memfd:vmstandin:<vendor>:<dev>:<size>[ (deleted)]",
 * the /proc link of a memfd own_memfd made. */
static bool shared_name(const char *link, int *dev, uint64_t *size)
{
	char prefix[64];
	uint64_t d;
	snprintf(prefix, sizeof prefix, "/memfd:vmstandin:%s:", vendor_name);
	size_t n = strlen(prefix);
	if (strncmp(link, prefix, n))
		return false;
	const char *p = link + n;
	if (!parse_dec(&p, &d) || *p++ != ':' || !parse_dec(&p, size))
		return false;
	if (*p && strcmp(p, " (deleted)"))
		return false;
	if (d >= VDEV_MAX_DEVICES)
		return false;
	*dev = (int)d;
	return true;
}

/* vdev_import mirrors cuMemImportFromShareableHandle: only memory another
 * stand-in of this vendor exported (a memfd named so, of its size, sealed
 * so, open for reading and writing); the new handle holds a duplicate, and
 * the memory counts on the device the name gives, once per process. */
vdev_status vdev_import(int fd, uint64_t *handle)
{
	char path[64], link[256];
	struct stat st;
	uint64_t size;
	int dev;

	if (cfg.novmm || cfg.noposix)
		return VDEV_NOT_SUPPORTED;
	if (fd < 0)
		return VDEV_INVALID;
	snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
	ssize_t n = readlink(path, link, sizeof link - 1);
	if (n < 0)
		return VDEV_INVALID;
	link[n] = '\0';
	if (!shared_name(link, &dev, &size) || !device_ok(dev) || size == 0 || size % cfg.mingran)
		return VDEV_INVALID;
	int seals = fcntl(fd, F_GET_SEALS);
	int mode = fcntl(fd, F_GETFL);
	if (fstat(fd, &st) < 0 || (uint64_t)st.st_size != size || seals < 0 || (seals & SHARE_SEALS) != SHARE_SEALS ||
	    mode < 0 || (mode & O_ACCMODE) != O_RDWR)
		return VDEV_INVALID;

	pthread_mutex_lock(&books);
	vdev_status s = VDEV_OOM;
	struct backing *b = NULL;
	for (size_t i = 0; i < allocations.n && !b; i++) {
		struct backing *m = ((struct allocation *)allocations.at[i])->mem;
		if (m->fd >= 0 && m->st_dev == st.st_dev && m->st_ino == st.st_ino)
			b = m;
	}
	if (b) {
		b->refs++;
	} else {
		b = calloc(1, sizeof *b);
		if (!b)
			goto out;
		b->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
		if (b->fd < 0) {
			free(b);
			s = VDEV_OS;
			goto out;
		}
		b->dev = dev;
		b->size = size;
		b->st_dev = st.st_dev;
		b->st_ino = st.st_ino;
		b->refs = 1;
		devices[dev].used += size;
	}
	struct allocation *a = allocation_add(b);
	if (!a) {
		backing_unref(b);
		goto out;
	}
	*handle = a->handle;
	s = VDEV_OK;
out:
	pthread_mutex_unlock(&books);
	return s;
}

/* ===== copies ============================================================== */

/* may_touch says whether dev has at least `need` access to every byte of
 * [addr, addr+n): mapped throughout and granted, granule by granule.
 * books held. */
static bool may_touch(int dev, uint64_t addr, uint64_t n, int need)
{
	uint64_t end = addr + n;
	if (end < addr)
		return false;
	size_t i = mapping_search(addr);
	for (uint64_t a = addr; a < end; i++) {
		if (i == mappings.n)
			return false;
		const struct mapping *m = mappings.at[i];
		if (m->addr > a)
			return false;
		uint64_t stop = min_u64(end, mapping_end(m));
		for (uint64_t x = a; x < stop; x = (x - m->addr) / cfg.mingran * cfg.mingran + m->addr + cfg.mingran)
			if ((acc_row(m, x)[dev] & need) != need)
				return false;
		a = stop;
	}
	return true;
}

/* side_ok checks one side of a copy for dev. Device memory needs access;
 * a host pointer is trusted, unless it lies in a reservation, where it is
 * device memory after all (unified addressing) and is checked as such.
 * books held. */
static bool side_ok(int dev, uint64_t p, bool is_dev, uint64_t n, int need)
{
	if (!is_dev && !touches_reservation(p, p + n))
		return true;
	return may_touch(dev, p, n, need);
}

/* move_bytes copies n bytes (or fills them with byte) as device dev: the
 * device needs read access to the whole source and read-write access to
 * the whole destination, else VDEV_ILLEGAL_ADDRESS and nothing moves. */
static vdev_status move_bytes(int dev, uint64_t dst, bool dst_dev, uint64_t src, bool src_dev, uint64_t n,
			      bool fill, uint8_t byte)
{
	if (n == 0)
		return VDEV_OK;
	pthread_rwlock_rdlock(&touch);
	pthread_mutex_lock(&books);
	bool ok = side_ok(dev, dst, dst_dev, n, VDEV_ACCESS_READWRITE) &&
		  (fill || side_ok(dev, src, src_dev, n, VDEV_ACCESS_READ));
	pthread_mutex_unlock(&books);
	if (ok) {
		if (fill)
			memset(ptr_of(dst), byte, n);
		else
			memmove(ptr_of(dst), ptr_of(src), n);
	}
	pthread_rwlock_unlock(&touch);
	return ok ? VDEV_OK : VDEV_ILLEGAL_ADDRESS;
}

vdev_status vdev_copy(vdev_ctx *cur, uint64_t dst, bool dst_dev, uint64_t src, bool src_dev, uint64_t n,
		      vdev_fault f, int *raw)
{
	if (f.code) {
		if (f.poison)
			poison(cur);
		*raw = f.code;
		return VDEV_RAW;
	}
	return move_bytes(cur->dev, dst, dst_dev, src, src_dev, n, false, 0);
}

/* ===== streams ============================================================= */

enum op_kind { OP_COPY, OP_FILL, OP_HOST_FN, OP_MARKER };

/* op is one operation in a stream's queue. */
struct op {
	struct op *next;
	enum op_kind kind;
	uint64_t seq;          /* 1, 2, ... in the order enqueued */
	uint64_t dst, src, n;  /* OP_COPY, OP_FILL */
	bool dst_dev, src_dev; /* OP_COPY */
	uint8_t byte;          /* OP_FILL */
	void (*fn)(void *);    /* OP_HOST_FN */
	void *user;
	vdev_fault fault;
};

/* A stream is a FIFO of operations that one worker thread of its own runs
 * in order. Invariants: completed <= enqueued, and the queue holds the
 * operations numbered (completed, enqueued] less the one running. refs
 * counts its holders: the registry (or its context, for a default stream)
 * until destroyed, the worker until it exits, each event last recorded on
 * it, each thread waiting for it; the last one frees it. */
struct vdev_stream {
	vdev_ctx *ctx;        /* where it was made; never changes */
	unsigned gen;         /* ctx->gen then: a stream outliving its context runs nothing */
	pthread_mutex_t mu;   /* guards what follows */
	pthread_cond_t work;  /* the worker waits here for an op or closing */
	pthread_cond_t done;  /* waiters wait here for completed to move */
	struct op *head, *tail;
	uint64_t enqueued, completed;
	vdev_status err;  /* the first failure since the last sync; VDEV_OK: none */
	int raw;          /* the vendor's code when err is VDEV_RAW */
	uint64_t err_seq; /* the number of the operation that failed */
	bool closing;    /* destroyed: the worker exits once the queue is empty */
	int refs;
};

static void stream_ref(vdev_stream *s)
{
	pthread_mutex_lock(&s->mu);
	s->refs++;
	pthread_mutex_unlock(&s->mu);
}

static void stream_unref(vdev_stream *s)
{
	pthread_mutex_lock(&s->mu);
	int left = --s->refs;
	pthread_mutex_unlock(&s->mu);
	if (left > 0)
		return;
	pthread_cond_destroy(&s->work);
	pthread_cond_destroy(&s->done);
	pthread_mutex_destroy(&s->mu);
	free(s);
}

/* stream_dead says whether s may run no more work: its context carries a
 * sticky fault (a faulted GPU context runs nothing more) or was destroyed. */
static bool stream_dead(const vdev_stream *s)
{
	return poisoned(s->ctx) || __atomic_load_n(&s->ctx->gen, __ATOMIC_ACQUIRE) != s->gen;
}

/* op_run performs one operation on the worker thread, no lock held. */
static vdev_status op_run(vdev_stream *s, const struct op *op, int *raw)
{
	if (op->fault.code) {
		if (op->fault.poison)
			poison(s->ctx);
		*raw = op->fault.code;
		return VDEV_RAW;
	}
	vdev_status st = VDEV_OK;
	switch (op->kind) {
	case OP_COPY:
	case OP_FILL:
		st = move_bytes(s->ctx->dev, op->dst, op->kind == OP_FILL || op->dst_dev, op->src, op->src_dev,
				op->n, op->kind == OP_FILL, op->byte);
		/* An illegal address in CUDA is sticky: the context is lost.
		 * AscendCL reports it on the stream alone. */
		if (st == VDEV_ILLEGAL_ADDRESS && sticky_faults)
			poison(s->ctx);
		break;
	case OP_HOST_FN:
		op->fn(op->user);
		break;
	case OP_MARKER:
		break;
	}
	return st;
}

/* stream_worker runs s's operations in order. After a failure the stream
 * skips what follows until a sync takes the failure; a dead stream skips
 * everything. A skipped operation still completes, so waiters wake. */
static void *stream_worker(void *arg)
{
	vdev_stream *s = arg;
	pthread_mutex_lock(&s->mu);
	for (;;) {
		while (!s->head && !s->closing)
			pthread_cond_wait(&s->work, &s->mu);
		struct op *op = s->head;
		if (!op)
			break;
		s->head = op->next;
		if (!s->head)
			s->tail = NULL;
		bool skip = s->err != VDEV_OK || stream_dead(s);
		pthread_mutex_unlock(&s->mu);

		int raw = 0;
		vdev_status st = skip ? VDEV_OK : op_run(s, op, &raw);

		pthread_mutex_lock(&s->mu);
		if (st != VDEV_OK && s->err == VDEV_OK) {
			s->err = st;
			s->raw = raw;
			s->err_seq = op->seq;
		}
		s->completed = op->seq;
		pthread_cond_broadcast(&s->done);
		free(op);
	}
	pthread_mutex_unlock(&s->mu);
	stream_unref(s);
	return NULL;
}

/* stream_new makes a stream of c with its worker; its owner holds one
 * reference, the worker the other. books held. */
static vdev_stream *stream_new(vdev_ctx *c)
{
	vdev_stream *s = calloc(1, sizeof *s);
	if (!s)
		return NULL;
	s->ctx = c;
	s->gen = __atomic_load_n(&c->gen, __ATOMIC_ACQUIRE);
	s->refs = 2;
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->work, NULL);
	pthread_cond_init(&s->done, NULL);

	pthread_attr_t attr;
	pthread_t t;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	int rc = pthread_create(&t, &attr, stream_worker, s);
	pthread_attr_destroy(&attr);
	if (rc) {
		pthread_cond_destroy(&s->work);
		pthread_cond_destroy(&s->done);
		pthread_mutex_destroy(&s->mu);
		free(s);
		return NULL;
	}
	return s;
}

/* stream_close tells the worker to exit after the queue and drops the
 * owner's reference; it does not wait (cuStreamDestroy returns at once). */
static void stream_close(vdev_stream *s)
{
	pthread_mutex_lock(&s->mu);
	s->closing = true;
	pthread_cond_signal(&s->work);
	pthread_mutex_unlock(&s->mu);
	stream_unref(s);
}

/* stream_resolve turns the caller's stream into a live one: NULL is cur's
 * default stream; anything else must be in the registry, and its context
 * free of a sticky fault. books held. */
static vdev_status stream_resolve(vdev_ctx *cur, vdev_stream **s)
{
	if (!*s) {
		if (!ctx_alive(cur))
			return VDEV_NO_CONTEXT;
		if (!cur->null_stream && !(cur->null_stream = stream_new(cur)))
			return VDEV_OOM;
		*s = cur->null_stream;
		return VDEV_OK;
	}
	if (vec_find(&streams, *s) == streams.n)
		return VDEV_BAD_HANDLE;
	if (poisoned((*s)->ctx))
		return VDEV_ILLEGAL_ADDRESS;
	return VDEV_OK;
}

/* enqueue appends op to s, wakes its worker and returns op's number (op
 * itself may be gone by then). books held. */
static uint64_t enqueue(vdev_stream *s, struct op *op)
{
	pthread_mutex_lock(&s->mu);
	uint64_t seq = op->seq = ++s->enqueued;
	if (s->tail)
		s->tail->next = op;
	else
		s->head = op;
	s->tail = op;
	pthread_cond_signal(&s->work);
	pthread_mutex_unlock(&s->mu);
	return seq;
}

/* enqueue_op resolves s and queues op on it, or frees op. */
static vdev_status enqueue_op(vdev_ctx *cur, vdev_stream *s, struct op *op)
{
	pthread_mutex_lock(&books);
	vdev_status st = stream_resolve(cur, &s);
	if (st == VDEV_OK)
		enqueue(s, op);
	pthread_mutex_unlock(&books);
	if (st != VDEV_OK)
		free(op);
	return st;
}

vdev_status vdev_stream_create(vdev_ctx *cur, vdev_stream **out)
{
	pthread_mutex_lock(&books);
	vdev_status st = VDEV_NO_CONTEXT;
	if (ctx_alive(cur)) {
		vdev_stream *s = stream_new(cur);
		st = VDEV_OOM;
		if (s && vec_push(&streams, s)) {
			*out = s;
			st = VDEV_OK;
		} else if (s) {
			stream_close(s);
		}
	}
	pthread_mutex_unlock(&books);
	return st;
}

vdev_status vdev_stream_destroy(vdev_stream *s)
{
	pthread_mutex_lock(&books);
	size_t i = vec_find(&streams, s);
	vdev_status st = VDEV_BAD_HANDLE;
	if (s && i < streams.n) {
		vec_cut(&streams, i, i + 1);
		stream_close(s);
		st = VDEV_OK;
	}
	pthread_mutex_unlock(&books);
	return st;
}

/* stream_take returns s's failure and clears it; s->mu held. */
static vdev_status stream_take(vdev_stream *s, int *raw)
{
	vdev_status st = s->err;
	*raw = s->raw;
	s->err = VDEV_OK;
	s->raw = 0;
	s->err_seq = 0;
	if (st == VDEV_OK && poisoned(s->ctx))
		st = VDEV_ILLEGAL_ADDRESS;
	return st;
}

/* stream_hold resolves s and takes a reference on it for a wait. */
static vdev_status stream_hold(vdev_ctx *cur, vdev_stream **s)
{
	pthread_mutex_lock(&books);
	vdev_status st = stream_resolve(cur, s);
	if (st == VDEV_OK)
		stream_ref(*s);
	pthread_mutex_unlock(&books);
	return st;
}

vdev_status vdev_stream_sync(vdev_ctx *cur, vdev_stream *s, int *raw)
{
	vdev_status st = stream_hold(cur, &s);
	if (st != VDEV_OK)
		return st;
	pthread_mutex_lock(&s->mu);
	uint64_t target = s->enqueued;
	while (s->completed < target)
		pthread_cond_wait(&s->done, &s->mu);
	st = stream_take(s, raw);
	pthread_mutex_unlock(&s->mu);
	stream_unref(s);
	return st;
}

/* sync_match says whether a stream of context c is one vdev_sync_device
 * waits for. */
static bool sync_match(const vdev_ctx *c, const vdev_ctx *cur, bool whole_device)
{
	return whole_device ? c->dev == cur->dev : c == cur;
}

/* sync_hold adds s, with the work enqueued on it now, to what
 * vdev_sync_device waits for. books held. */
static void sync_hold(vdev_stream *s, vdev_stream **held, uint64_t *target, size_t *n)
{
	pthread_mutex_lock(&s->mu);
	s->refs++;
	target[*n] = s->enqueued;
	pthread_mutex_unlock(&s->mu);
	held[(*n)++] = s;
}

vdev_status vdev_sync_device(vdev_ctx *cur, bool whole_device)
{
	pthread_mutex_lock(&books);
	if (!ctx_alive(cur)) {
		pthread_mutex_unlock(&books);
		return VDEV_NO_CONTEXT;
	}
	size_t cap = streams.n + contexts.n + (size_t)cfg.devices + 1;
	vdev_stream **held = calloc(cap, sizeof *held);
	uint64_t *target = calloc(cap, sizeof *target);
	if (!held || !target) {
		pthread_mutex_unlock(&books);
		free(held);
		free(target);
		return VDEV_OOM;
	}
	size_t n = 0;
	for (size_t i = 0; i < streams.n; i++) {
		vdev_stream *s = streams.at[i];
		if (sync_match(s->ctx, cur, whole_device))
			sync_hold(s, held, target, &n);
	}
	for (int d = 0; d < cfg.devices; d++) {
		vdev_ctx *c = &devices[d].ctx;
		if (c->null_stream && sync_match(c, cur, whole_device))
			sync_hold(c->null_stream, held, target, &n);
	}
	for (size_t i = 0; i < contexts.n; i++) {
		vdev_ctx *c = contexts.at[i];
		if (c->null_stream && sync_match(c, cur, whole_device))
			sync_hold(c->null_stream, held, target, &n);
	}
	pthread_mutex_unlock(&books);
	for (size_t i = 0; i < n; i++) {
		vdev_stream *s = held[i];
		pthread_mutex_lock(&s->mu);
		while (s->completed < target[i])
			pthread_cond_wait(&s->done, &s->mu);
		pthread_mutex_unlock(&s->mu);
		stream_unref(s);
	}
	free(held);
	free(target);
	return poisoned(cur) ? VDEV_ILLEGAL_ADDRESS : VDEV_OK;
}

vdev_status vdev_stream_context(vdev_stream *s, vdev_ctx **out)
{
	pthread_mutex_lock(&books);
	vdev_status st = VDEV_BAD_HANDLE;
	if (s && vec_find(&streams, s) < streams.n) {
		*out = s->ctx;
		st = VDEV_OK;
	}
	pthread_mutex_unlock(&books);
	return st;
}

vdev_status vdev_stream_query(vdev_ctx *cur, vdev_stream *s, int *raw)
{
	vdev_status st = stream_hold(cur, &s);
	if (st != VDEV_OK)
		return st;
	pthread_mutex_lock(&s->mu);
	st = s->completed < s->enqueued ? VDEV_NOT_READY : stream_take(s, raw);
	pthread_mutex_unlock(&s->mu);
	stream_unref(s);
	return st;
}

static struct op *op_new(enum op_kind kind, vdev_fault f)
{
	struct op *op = calloc(1, sizeof *op);
	if (op) {
		op->kind = kind;
		op->fault = f;
	}
	return op;
}

vdev_status vdev_enqueue_copy(vdev_ctx *cur, vdev_stream *s, uint64_t dst, bool dst_dev, uint64_t src,
			      bool src_dev, uint64_t n, vdev_fault f)
{
	struct op *op = op_new(OP_COPY, f);
	if (!op)
		return VDEV_OOM;
	op->dst = dst;
	op->dst_dev = dst_dev;
	op->src = src;
	op->src_dev = src_dev;
	op->n = n;
	return enqueue_op(cur, s, op);
}

vdev_status vdev_enqueue_fill(vdev_ctx *cur, vdev_stream *s, uint64_t dst, uint8_t byte, uint64_t n,
			      vdev_fault f)
{
	struct op *op = op_new(OP_FILL, f);
	if (!op)
		return VDEV_OOM;
	op->dst = dst;
	op->byte = byte;
	op->n = n;
	return enqueue_op(cur, s, op);
}

vdev_status vdev_enqueue_host_fn(vdev_ctx *cur, vdev_stream *s, void (*fn)(void *), void *user, vdev_fault f)
{
	struct op *op = op_new(OP_HOST_FN, f);
	if (!op)
		return VDEV_OOM;
	op->fn = fn;
	op->user = user;
	return enqueue_op(cur, s, op);
}

/* ===== events ============================================================== */

/* An event is the point seq of stream s (s NULL: never recorded, hence
 * complete); it holds a reference on s. Guarded by the books. */
struct vdev_event {
	vdev_ctx *ctx;
	vdev_stream *s;
	uint64_t seq;
};

static void event_free(vdev_event *e)
{
	if (e->s)
		stream_unref(e->s);
	free(e);
}

static bool event_known(const vdev_event *e) { return e && vec_find(&events, e) < events.n; }

vdev_status vdev_event_create(vdev_ctx *cur, vdev_event **out)
{
	vdev_event *e = calloc(1, sizeof *e);
	if (!e)
		return VDEV_OOM;
	e->ctx = cur;
	pthread_mutex_lock(&books);
	vdev_status st = !ctx_alive(cur) ? VDEV_NO_CONTEXT : vec_push(&events, e) ? VDEV_OK : VDEV_OOM;
	pthread_mutex_unlock(&books);
	if (st != VDEV_OK) {
		free(e);
		return st;
	}
	*out = e;
	return VDEV_OK;
}

/* vdev_event_record mirrors cuEventRecord: a marker after the work queued
 * so far; the event and the stream must share a context. */
vdev_status vdev_event_record(vdev_ctx *cur, vdev_event *e, vdev_stream *s, vdev_fault f)
{
	struct op *op = op_new(OP_MARKER, f);
	if (!op)
		return VDEV_OOM;
	pthread_mutex_lock(&books);
	vdev_status st = VDEV_BAD_HANDLE;
	if (!event_known(e))
		goto out;
	st = stream_resolve(cur, &s);
	if (st != VDEV_OK)
		goto out;
	if (s->ctx != e->ctx) {
		st = VDEV_BAD_HANDLE;
		goto out;
	}
	stream_ref(s);
	if (e->s)
		stream_unref(e->s);
	e->s = s;
	e->seq = enqueue(s, op);
	op = NULL;
out:
	pthread_mutex_unlock(&books);
	free(op);
	return st;
}

/* event_hold finds e's stream and point and takes a reference on the
 * stream (none when never recorded). */
static vdev_status event_hold(vdev_event *e, vdev_stream **s, uint64_t *seq, vdev_ctx **ctx)
{
	pthread_mutex_lock(&books);
	vdev_status st = VDEV_BAD_HANDLE;
	if (event_known(e)) {
		*s = e->s;
		*seq = e->seq;
		*ctx = e->ctx;
		if (*s)
			stream_ref(*s);
		st = VDEV_OK;
	}
	pthread_mutex_unlock(&books);
	return st;
}

vdev_status vdev_event_sync(vdev_event *e, bool take, int *raw)
{
	vdev_stream *s;
	vdev_ctx *c;
	uint64_t seq;
	vdev_status st = event_hold(e, &s, &seq, &c);
	if (st != VDEV_OK)
		return st;
	if (s) {
		pthread_mutex_lock(&s->mu);
		while (s->completed < seq)
			pthread_cond_wait(&s->done, &s->mu);
		if (take && s->err != VDEV_OK && s->err_seq <= seq)
			st = stream_take(s, raw);
		pthread_mutex_unlock(&s->mu);
		stream_unref(s);
	}
	if (st == VDEV_OK && poisoned(c))
		st = VDEV_ILLEGAL_ADDRESS;
	return st;
}

vdev_status vdev_event_query(vdev_event *e)
{
	vdev_stream *s;
	vdev_ctx *c;
	uint64_t seq;
	vdev_status st = event_hold(e, &s, &seq, &c);
	if (st != VDEV_OK)
		return st;
	if (s) {
		pthread_mutex_lock(&s->mu);
		if (s->completed < seq)
			st = VDEV_NOT_READY;
		pthread_mutex_unlock(&s->mu);
		stream_unref(s);
	}
	if (st == VDEV_OK && poisoned(c))
		st = VDEV_ILLEGAL_ADDRESS;
	return st;
}

vdev_status vdev_event_destroy(vdev_event *e)
{
	pthread_mutex_lock(&books);
	size_t i = vec_find(&events, e);
	vdev_status st = VDEV_BAD_HANDLE;
	if (e && i < events.n) {
		vec_cut(&events, i, i + 1);
		event_free(e);
		st = VDEV_OK;
	}
	pthread_mutex_unlock(&books);
	return st;
}

static void ctx_destroy(vdev_ctx *c)
{
	__atomic_store_n(&c->gen, c->gen + 1, __ATOMIC_RELEASE);
	for (size_t i = events.n; i-- > 0;) {
		vdev_event *e = events.at[i];
		if (e->ctx == c) {
			vec_cut(&events, i, i + 1);
			event_free(e);
		}
	}
	for (size_t i = streams.n; i-- > 0;) {
		vdev_stream *s = streams.at[i];
		if (s->ctx == c) {
			vec_cut(&streams, i, i + 1);
			stream_close(s);
		}
	}
	if (c->null_stream) {
		stream_close(c->null_stream);
		c->null_stream = NULL;
	}
	c->peers = 0;
	__atomic_store_n(&c->poisoned, 0, __ATOMIC_RELEASE);
}

/* ===== pinned host memory ================================================== */

/* vdev_host_alloc mirrors cuMemHostAlloc: page-aligned host memory, which
 * the stand-in need not pin (host pointers are trusted by copies anyway). */
vdev_status vdev_host_alloc(uint64_t size, void **out)
{
	if (size == 0)
		return VDEV_INVALID;
	struct host_alloc *h = malloc(sizeof *h);
	if (!h)
		return VDEV_OOM;
	h->p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (h->p == MAP_FAILED) {
		free(h);
		return VDEV_OOM;
	}
	h->size = size;
	pthread_mutex_lock(&books);
	bool ok = vec_push(&host_allocs, h);
	pthread_mutex_unlock(&books);
	if (!ok) {
		munmap(h->p, size);
		free(h);
		return VDEV_OOM;
	}
	*out = h->p;
	return VDEV_OK;
}

vdev_status vdev_host_free(void *p)
{
	vdev_status st = VDEV_INVALID;
	pthread_mutex_lock(&books);
	for (size_t i = 0; i < host_allocs.n; i++) {
		struct host_alloc *h = host_allocs.at[i];
		if (h->p == p) {
			munmap(h->p, h->size);
			vec_cut(&host_allocs, i, i + 1);
			free(h);
			st = VDEV_OK;
			break;
		}
	}
	pthread_mutex_unlock(&books);
	return st;
}

/* ===== counters ============================================================ */

VDEV_EXPORT uint64_t vmstandin_used(int dev)
{
	uint64_t n = 0;
	pthread_mutex_lock(&books);
	if (init_done && init_result == VDEV_OK && device_ok(dev))
		n = devices[dev].used;
	pthread_mutex_unlock(&books);
	return n;
}

/* The kinds of live object, as vmstandin_live names them; "tokens" and
 * "contexts" are counted apart (tokens have a lock of their own). */
static const struct {
	const char *name;
	const struct vec *v;
} live_kinds[] = {
	{"reservations", &reservations}, {"allocations", &allocations}, {"mappings", &mappings},
	{"streams", &streams},           {"events", &events},           {"hostallocs", &host_allocs},
};

/* live_contexts counts primary contexts' references (CUDA's retains,
 * AscendCL's aclrtSetDevice calls) and live explicit contexts once each
 * (books held). */
static int64_t live_contexts(void)
{
	int64_t n = 0;
	for (int d = 0; d < cfg.devices; d++)
		n += devices[d].ctx.refs;
	for (size_t i = 0; i < contexts.n; i++)
		n += ((const vdev_ctx *)contexts.at[i])->refs > 0;
	return n;
}

/* live_locked counts the live objects of kind what, or of every kind but
 * tokens when what is NULL; -1 for an unknown kind (books held). */
static int64_t live_locked(const char *what)
{
	int64_t n = what ? -1 : 0;
	for (size_t i = 0; i < sizeof live_kinds / sizeof live_kinds[0]; i++) {
		if (!what)
			n += (int64_t)live_kinds[i].v->n;
		else if (!strcmp(what, live_kinds[i].name))
			n = (int64_t)live_kinds[i].v->n;
	}
	if (!what)
		n += live_contexts();
	else if (!strcmp(what, "contexts"))
		n = live_contexts();
	return n;
}

VDEV_EXPORT int64_t vmstandin_live(const char *what)
{
	if (!what)
		return -1;
	if (!strcmp(what, "tokens"))
		return (int64_t)vdev_tokens();
	pthread_mutex_lock(&books);
	int64_t n = live_locked(what);
	pthread_mutex_unlock(&books);
	return n;
}

/* Held work: vmstandin_hold queues, on the default stream of device dev's
 * primary context (a stream the driver under test never made, as a
 * framework's would be), work that runs until vmstandin_release; what a
 * whole-device synchronisation must wait for. vmstandin_held counts the
 * held operations that have finished. */
static pthread_mutex_t hold_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hold_cv = PTHREAD_COND_INITIALIZER;
static bool hold_closed;
static uint64_t hold_done;

static void hold_run(void *user)
{
	(void)user;
	pthread_mutex_lock(&hold_mu);
	while (hold_closed)
		pthread_cond_wait(&hold_cv, &hold_mu);
	hold_done++;
	pthread_mutex_unlock(&hold_mu);
}

VDEV_EXPORT int vmstandin_hold(int dev)
{
	if (!device_ok(dev))
		return -1;
	struct op *op = calloc(1, sizeof *op);
	if (!op)
		return -1;
	op->kind = OP_HOST_FN;
	op->fn = hold_run;
	pthread_mutex_lock(&hold_mu);
	hold_closed = true;
	pthread_mutex_unlock(&hold_mu);
	return enqueue_op(&devices[dev].ctx, NULL, op) == VDEV_OK ? 0 : -1;
}

VDEV_EXPORT void vmstandin_release(void)
{
	pthread_mutex_lock(&hold_mu);
	hold_closed = false;
	pthread_cond_broadcast(&hold_cv);
	pthread_mutex_unlock(&hold_mu);
}

VDEV_EXPORT uint64_t vmstandin_held(void)
{
	pthread_mutex_lock(&hold_mu);
	uint64_t n = hold_done;
	pthread_mutex_unlock(&hold_mu);
	return n;
}

/* vmstandin_retire ends an instance a test is done with: when nothing of
 * it is live, it closes the devices' heaps (the one descriptor each device
 * holds for the life of an instance) and leaves the instance without
 * devices, so a process that loads thousands of instances (go test
 * -count=N) does not run out of descriptors. It returns the number of live
 * objects that kept it from retiring, 0 once retired. */
VDEV_EXPORT int64_t vmstandin_retire(void)
{
	int64_t live = (int64_t)vdev_tokens();
	pthread_mutex_lock(&books);
	live += live_locked(NULL);
	if (live == 0 && init_done && init_result == VDEV_OK) {
		for (int d = 0; d < cfg.devices; d++) {
			close(devices[d].heap_fd);
			devices[d].heap_fd = -1;
		}
		init_result = VDEV_NO_DEVICE;
	}
	pthread_mutex_unlock(&books);
	return live;
}

/* vmstandin_access is the hardware's own view: dev's access at addr as the
 * books hold it, -1 where nothing is mapped (or for no such device). */
VDEV_EXPORT int vmstandin_access(uint64_t addr, int dev)
{
	int acc = -1;
	pthread_mutex_lock(&books);
	size_t i = mapping_search(addr);
	if (device_ok(dev) && i < mappings.n && ((const struct mapping *)mappings.at[i])->addr <= addr)
		acc = acc_row(mappings.at[i], addr)[dev];
	pthread_mutex_unlock(&books);
	return acc;
}
