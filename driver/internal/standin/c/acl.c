/*
 * acl.c - the AscendCL front-end of the stand-in: the acl* symbols of
 * libascendcl.so with the real names, signatures, structs and error codes
 * (shared/ACL_ABI.md), over the emulated device of vdev.c and the tokens of
 * vshare.c.
 *
 * Each function here counts its call and applies injected failures
 * (ENTER), checks initialisation and the current context where the
 * runtime needs them, checks what only exists in AscendCL's API (struct
 * fields, enum values, flags), and translates the vdev status. Every
 * failure also leaves a message for aclGetRecentErrMsg on the calling
 * thread. The configuration's stub, noposix and nopools are CUDA's: there
 * is no link stub here, nopools means nothing, and noposix leaves sharing
 * out (export and import answer ACL_ERROR_RT_FEATURE_NOT_SUPPORT).
 *
 * The rules AscendCL documents are kept as documented: one aclInit
 * (ACL_ERROR_REPEAT_INITIALIZE after), aclrtSetDevice counted per device
 * and undone by aclrtResetDevice, reservations without alignment or hint,
 * a map of a whole handle at offset 0, accessible at once to the handle's
 * device (aclrtMemMapNoAccess: to none), aclrtMemSetAccess over exactly one
 * mapping, a reservation bound to one device's memory and to local or
 * imported memory, never both, export of a handle once per process
 * as a 64-bit token with an allow-list of importer PIDs, no import in the
 * exporting process, 64-byte aligned async copies, peer access from the
 * current device. Where the documents are silent the stand-in takes the
 * strict reading (marked "Strict:" at the functions); a difference found on
 * an NPU is a fix here. The readings:
 *
 *   - every call but aclInit, aclFinalize, aclrtGetDeviceCount, the device
 *     and context calls, aclrtDeviceCanAccessPeer, aclrtDeviceGetBareTgid
 *     and the two string calls needs a current context
 *     (ACL_ERROR_RT_CONTEXT_NULL without one);
 *   - aclInit's configuration file must be readable (contents unread);
 *     after aclFinalize nothing works again, aclInit included;
 *   - aclrtResetDevice of a device not set is ACL_ERROR_RT_CONTEXT_NULL; a
 *     default context is no aclrtDestroyContext's; an unknown or destroyed
 *     context is ACL_ERROR_RT_INVALID_HANDLE;
 *   - reservation and allocation sizes are multiples of the minimum
 *     granularity (nothing is rounded up), and a reservation is never
 *     aligned to more than it;
 *   - aclrtFreePhysical refuses a handle still mapped; a handle may be
 *     mapped at several addresses;
 *   - an address is device memory when it lies in a reservation; a copy
 *     whose kind says otherwise is refused, and so is a fill of host
 *     memory;
 *   - the synchronous copy refuses a device that lacks access
 *     (ACL_ERROR_RT_PARAM_INVALID); an asynchronous one fails when it runs
 *     with ACL_ERROR_RT_SYS_DMA on its stream alone (AscendCL has no sticky
 *     context fault), the stream's later work skipped until the failure is
 *     taken by aclrtSynchronizeStream or by aclrtSynchronizeEvent of an
 *     event recorded after it;
 *   - a stream is used with its own context current
 *     (ACL_ERROR_RT_STREAM_CONTEXT);
 *   - a device and itself are no peers: aclrtDeviceCanAccessPeer and
 *     aclrtDeviceEnablePeerAccess answer ACL_ERROR_RT_INVALID_DEVICEID;
 *   - a token is exported from an aclrtMallocPhysical handle only, imported
 *     once per process while its handle lives, and an import of this
 *     process's own token is ACL_ERROR_RT_FEATURE_NOT_SUPPORT; SetPid takes
 *     at least one positive PID;
 *   - aclGetRecentErrMsg hands a message out once (NULL after);
 *   - aclrtGetMemInfo knows ACL_DDR_MEM .. ACL_HBM_MEM_NORMAL (0 .. 5): HBM
 *     kinds report the device, DDR kinds nothing, others are refused.
 *
 * One documented rule is not enforced: an import onto another device than
 * the memory's does not need aclrtDeviceEnablePeerAccess first.
 *
 * Handles, contexts, streams and events are pointers to the stand-in's own
 * structs, and each is looked up in the books before it is read: a stale
 * or garbage one is ACL_ERROR_RT_INVALID_HANDLE, never a crash (an address
 * malloc has handed out again names the new object, as with any pointer
 * handle).
 *
 * Compile-time omissions (-DVMSTANDIN_OMIT_<GROUP>) leave a group's symbols
 * undefined: export (the four sharing calls), events, peer, streams
 * (streams, async copies and fills), hostalloc, synccopy (aclrtMemcpy),
 * vmm (every physical-memory, reservation, map, access and granularity
 * call, and the sharing calls with them), mapnoaccess (aclrtMemMapNoAccess,
 * which older CANN releases lack). hostfunc has no AscendCL symbol.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

#include "vdev.h"

#define API VDEV_EXPORT

/* ===== AscendCL's types, mirrored from the documented ABI ================= */

typedef int aclError;
typedef vdev_ctx *aclrtContext;
typedef vdev_stream *aclrtStream;
typedef vdev_event *aclrtEvent;
typedef struct acl_mem *aclrtDrvMemHandle;

/* aclrtMemLocation: 8 bytes, {id, type} — id first. */
struct acl_location {
	uint32_t id;
	int32_t type;
};

/* aclrtPhysicalMemProp: 32 bytes, align 8. */
struct acl_prop {
	int32_t handle_type;
	int32_t allocation_type;
	int32_t mem_attr;
	struct acl_location location;
	uint64_t reserve;
};

/* aclrtMemAccessDesc: 24 bytes, align 4 — flags first. */
struct acl_access_desc {
	int32_t flags;
	struct acl_location location;
	uint8_t rsv[12];
};

_Static_assert(sizeof(struct acl_location) == 8 && _Alignof(struct acl_location) == 4, "aclrtMemLocation is 8 bytes");
_Static_assert(offsetof(struct acl_location, type) == 4, "aclrtMemLocation.type at 4");
_Static_assert(sizeof(struct acl_prop) == 32 && _Alignof(struct acl_prop) == 8, "aclrtPhysicalMemProp is 32 bytes");
_Static_assert(offsetof(struct acl_prop, mem_attr) == 8, "aclrtPhysicalMemProp.memAttr at 8");
_Static_assert(offsetof(struct acl_prop, location) == 12, "aclrtPhysicalMemProp.location at 12");
_Static_assert(offsetof(struct acl_prop, reserve) == 24, "aclrtPhysicalMemProp.reserve at 24");
_Static_assert(sizeof(struct acl_access_desc) == 24 && _Alignof(struct acl_access_desc) == 4,
	       "aclrtMemAccessDesc is 24 bytes");
_Static_assert(offsetof(struct acl_access_desc, location) == 4, "aclrtMemAccessDesc.location at 4");
_Static_assert(offsetof(struct acl_access_desc, rsv) == 12, "aclrtMemAccessDesc.rsv at 12");

enum {
	ACL_SUCCESS = 0,
	ACL_ERROR_UNINITIALIZE = 100001,
	ACL_ERROR_REPEAT_INITIALIZE = 100002,
	ACL_ERROR_INVALID_FILE = 100003,
	ACL_ERROR_REPEAT_FINALIZE = 100037,
	ACL_ERROR_RT_PARAM_INVALID = 107000,
	ACL_ERROR_RT_INVALID_DEVICEID = 107001,
	ACL_ERROR_RT_CONTEXT_NULL = 107002,
	ACL_ERROR_RT_STREAM_CONTEXT = 107003,
	ACL_ERROR_RT_ADDR_UNALIGNED = 107008,
	ACL_ERROR_RT_INVALID_HANDLE = 107017,
	ACL_ERROR_RT_FEATURE_NOT_SUPPORT = 207000,
	ACL_ERROR_RT_MEMORY_ALLOCATION = 207001,
	ACL_ERROR_RT_NO_PERMISSION = 207006,
	ACL_ERROR_RT_INTERNAL_ERROR = 507000,
	ACL_ERROR_RT_STREAM_NOT_COMPLETE = 507004,
	ACL_ERROR_RT_SYS_DMA = 507013,
};

enum {
	LOCATION_DEVICE = 1,  /* ACL_MEM_LOCATION_TYPE_DEVICE */
	ALLOCATION_PINNED = 0, /* ACL_MEM_ALLOCATION_TYPE_PINNED */
	HANDLE_NONE = 0,       /* ACL_MEM_HANDLE_TYPE_NONE */
	GRANULARITY_MINIMUM = 0,
	GRANULARITY_RECOMMENDED = 1,
	EXPORT_DISABLE_PID_VALIDATION = 1,
	COPY_ALIGN = 64, /* the async copies' address alignment */
	MAX_ACCESS_DESCS = 4 * VDEV_MAX_DEVICES,
	MAX_PIDS = 1 << 16,
};

/* aclrtMemcpyKind. */
enum { HOST_TO_HOST = 0, HOST_TO_DEVICE = 1, DEVICE_TO_HOST = 2, DEVICE_TO_DEVICE = 3 };

/* aclrtMemAttr: the kinds of device memory aclrtGetMemInfo reports on. */
enum { DDR_MEM = 0, HBM_MEM = 1, DDR_MEM_HUGE = 2, DDR_MEM_NORMAL = 3, HBM_MEM_HUGE = 4, HBM_MEM_NORMAL = 5 };

/* mem_attr_ok: the aclrtMemAttr values ACL_ABI.md lists for physical
 * memory (ACL_HBM_MEM_HUGE, ACL_HBM_MEM_NORMAL, ACL_MEM_NORMAL,
 * ACL_MEM_HUGE, ACL_MEM_HUGE1G, ACL_MEM_P2P_HUGE). Every one has the same
 * granularity in the stand-in. */
static inline bool mem_attr_ok(int a) { return a == 4 || a == 5 || a == 12 || a == 13 || a == 14 || a == 16; }

static const char SOC_NAME[] = "Ascend910B-vmstandin";

/* ===== the last error of each thread ======================================= */

/* errmsg is the message of this thread's last failure; errmsg_set says
 * aclGetRecentErrMsg has not handed it out yet. */
static __thread char errmsg[384];
static __thread bool errmsg_set;

/* fail records why fn failed and returns code. */
__attribute__((format(printf, 3, 4))) static aclError fail(aclError code, const char *fn, const char *fmt, ...)
{
	int n = snprintf(errmsg, sizeof errmsg, "%s: ", fn);
	va_list ap;
	va_start(ap, fmt);
	if (n > 0 && (size_t)n < sizeof errmsg)
		vsnprintf(errmsg + n, sizeof errmsg - (size_t)n, fmt, ap);
	va_end(ap);
	errmsg_set = true;
	return code;
}

#define FAIL(code, ...) fail((code), __func__, __VA_ARGS__)

static const char *status_text(vdev_status st)
{
	switch (st) {
	case VDEV_OK:
		return "success";
	case VDEV_INVALID:
		return "invalid argument";
	case VDEV_OOM:
		return "out of device memory";
	case VDEV_NOT_MAPPED:
		return "nothing is mapped there";
	case VDEV_OVERLAP:
		return "the range is mapped already";
	case VDEV_BAD_HANDLE:
		return "unknown, freed or stale handle";
	case VDEV_NO_DEVICE:
		return "no such device";
	case VDEV_ILLEGAL_ADDRESS:
		return "the device may not touch that memory";
	case VDEV_NOT_SUPPORTED:
		return "not supported";
	case VDEV_NOT_PERMITTED:
		return "not permitted";
	case VDEV_NOT_READY:
		return "work still pending";
	case VDEV_NO_CONTEXT:
		return "no usable context";
	case VDEV_ALREADY:
		return "done already";
	case VDEV_NOT_INITIALIZED:
		return "not initialised";
	case VDEV_RAW:
		return "injected failure";
	case VDEV_OS:
		return "a system call failed";
	case VDEV_BUSY:
		return "still in use";
	}
	return "unknown status";
}

/* code_of translates a vdev status; raw is the code of VDEV_RAW. A device
 * touching what it may not is an error of the DMA engine: AscendCL reports
 * it on the stream (the synchronous copy translates it itself). */
static aclError code_of(vdev_status st, int raw)
{
	switch (st) {
	case VDEV_OK:
		return ACL_SUCCESS;
	case VDEV_INVALID:
	case VDEV_NOT_MAPPED:
	case VDEV_OVERLAP:
	case VDEV_ALREADY:
	case VDEV_BUSY:
		return ACL_ERROR_RT_PARAM_INVALID;
	case VDEV_OOM:
		return ACL_ERROR_RT_MEMORY_ALLOCATION;
	case VDEV_BAD_HANDLE:
		return ACL_ERROR_RT_INVALID_HANDLE;
	case VDEV_NO_DEVICE:
		return ACL_ERROR_RT_INVALID_DEVICEID;
	case VDEV_ILLEGAL_ADDRESS:
		return ACL_ERROR_RT_SYS_DMA;
	case VDEV_NOT_SUPPORTED:
		return ACL_ERROR_RT_FEATURE_NOT_SUPPORT;
	case VDEV_NOT_PERMITTED:
		return ACL_ERROR_RT_NO_PERMISSION;
	case VDEV_NOT_READY:
		return ACL_ERROR_RT_STREAM_NOT_COMPLETE;
	case VDEV_NO_CONTEXT:
		return ACL_ERROR_RT_CONTEXT_NULL;
	case VDEV_NOT_INITIALIZED:
		return ACL_ERROR_UNINITIALIZE;
	case VDEV_RAW:
		if (raw)
			return raw;
		break;
	case VDEV_OS:
		break;
	}
	return ACL_ERROR_RT_INTERNAL_ERROR;
}

/* RESULT returns the translation of st, recording why when it failed. */
#define RESULT(st, raw, ...) result_of(__func__, (st), (raw), __VA_ARGS__)

__attribute__((format(printf, 4, 5))) static aclError result_of(const char *fn, vdev_status st, int raw,
								 const char *fmt, ...)
{
	if (st == VDEV_OK)
		return ACL_SUCCESS;
	char what[192];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(what, sizeof what, fmt, ap);
	va_end(ap);
	aclError code = code_of(st, raw);
	return fail(code, fn, "%s: %s", what, st == VDEV_RAW ? "injected failure" : status_text(st));
}

/* ===== initialisation ====================================================== */

/* state: 0 before aclInit, 1 initialised, 2 finalised (for good). devices:
 * how many devices aclInit found (0 with nodevice). Both under init_mu,
 * read atomically. */
static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;
static int state;
static int ndevices;

static bool initialised(void) { return __atomic_load_n(&state, __ATOMIC_ACQUIRE) == 1; }

static bool device_valid(int32_t dev) { return dev >= 0 && dev < __atomic_load_n(&ndevices, __ATOMIC_ACQUIRE); }

/* ===== the checks every call starts with =================================== */

/* ENTER counts the call (by the function's own name) and returns an
 * injected code. exec, when not NULL, receives the code of a run-time
 * (":exec") injection. */
#define ENTER(exec)                                                                                      \
	do {                                                                                             \
		static int slot_ = -1;                                                                   \
		int injected_ = vdev_enter(&slot_, __func__, (exec));                                    \
		if (injected_)                                                                           \
			return FAIL(injected_, "injected failure %d", injected_);                        \
	} while (0)

#define NEED_INIT()                                                                                      \
	do {                                                                                             \
		if (!initialised())                                                                      \
			return FAIL(ACL_ERROR_UNINITIALIZE, "aclInit has not succeeded (or aclFinalize ran)"); \
	} while (0)

/* NEED_CTX: the call needs a current context on this thread; ctx receives
 * it. Strict: the documents have every runtime call work "on the current
 * context" without saying which fail without one. */
#define NEED_CTX(ctx)                                                                                    \
	do {                                                                                             \
		NEED_INIT();                                                                             \
		if (vdev_ctx_use(&(ctx)) != VDEV_OK)                                                     \
			return FAIL(ACL_ERROR_RT_CONTEXT_NULL,                                           \
				    "no current context on this thread (aclrtSetDevice or aclrtSetCurrentContext first)"); \
	} while (0)

#define NEED_VMM()                                                                                       \
	do {                                                                                             \
		if (vdev_config()->novmm)                                                                \
			return FAIL(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, "the device has no virtual memory management"); \
	} while (0)

/* fault_of makes a run-time injection; AscendCL has no sticky fault. */
static inline vdev_fault fault_of(int code) { return (vdev_fault){.code = code, .poison = false}; }

static inline uint64_t addr_of(const void *p) { return (uint64_t)(uintptr_t)p; }

API aclError aclInit(const char *config_path)
{
	ENTER(NULL);
	pthread_mutex_lock(&init_mu);
	aclError code = ACL_SUCCESS;
	if (state != 0) {
		/* Strict: after aclFinalize the runtime does not come back. */
		code = FAIL(ACL_ERROR_REPEAT_INITIALIZE, state == 1 ? "initialised already" : "finalised: aclInit works once per process");
		goto out;
	}
	/* Strict: a configuration file must exist; its contents are not read. */
	if (config_path && access(config_path, R_OK) != 0) {
		code = FAIL(ACL_ERROR_INVALID_FILE, "cannot read the configuration file %s", config_path);
		goto out;
	}
	vdev_status st = vdev_init("acl", false);
	if (st != VDEV_OK && st != VDEV_NO_DEVICE) {
		code = RESULT(st, 0, "setting up the devices");
		goto out;
	}
	/* No NPU: AscendCL initialises, and then counts none. */
	__atomic_store_n(&ndevices, st == VDEV_OK ? vdev_config()->devices : 0, __ATOMIC_RELEASE);
	__atomic_store_n(&state, 1, __ATOMIC_RELEASE);
out:
	pthread_mutex_unlock(&init_mu);
	return code;
}

API aclError aclFinalize(void)
{
	ENTER(NULL);
	pthread_mutex_lock(&init_mu);
	aclError code = ACL_SUCCESS;
	if (state == 0)
		code = FAIL(ACL_ERROR_UNINITIALIZE, "aclInit has not succeeded");
	else if (state == 2)
		code = FAIL(ACL_ERROR_REPEAT_FINALIZE, "finalised already");
	else
		__atomic_store_n(&state, 2, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&init_mu);
	return code;
}

/* aclrtGetSocName names the NPU (one name per process); NULL before
 * aclInit. */
API const char *aclrtGetSocName(void)
{
	static int slot = -1;
	vdev_enter(&slot, __func__, NULL);
	return initialised() ? SOC_NAME : NULL;
}

/* aclGetRecentErrMsg hands out the message of this thread's last failure
 * once; NULL when there was none since. Strict: the documents leave open
 * whether a message is kept after it was read. */
API const char *aclGetRecentErrMsg(void)
{
	static int slot = -1;
	vdev_enter(&slot, __func__, NULL);
	if (!errmsg_set)
		return NULL;
	errmsg_set = false;
	return errmsg;
}

/* ===== devices and contexts ================================================ */

API aclError aclrtGetDeviceCount(uint32_t *count)
{
	ENTER(NULL);
	NEED_INIT();
	if (!count)
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "count is NULL");
	*count = (uint32_t)__atomic_load_n(&ndevices, __ATOMIC_ACQUIRE);
	return ACL_SUCCESS;
}

/* aclrtSetDevice takes a reference on the device's default context (the
 * primary context of the core) and makes it current on this thread. */
API aclError aclrtSetDevice(int32_t dev)
{
	vdev_ctx *c;
	ENTER(NULL);
	NEED_INIT();
	if (!device_valid(dev))
		return FAIL(ACL_ERROR_RT_INVALID_DEVICEID, "device %d (the runtime has %d)", dev, ndevices);
	vdev_status st = vdev_ctx_retain(dev, &c);
	if (st == VDEV_OK)
		st = vdev_ctx_set_current(c);
	return RESULT(st, 0, "device %d", dev);
}

/* aclrtResetDevice undoes one aclrtSetDevice; the last one destroys the
 * default context and what lives in it. Strict: a device this process did
 * not set is ACL_ERROR_RT_CONTEXT_NULL. */
API aclError aclrtResetDevice(int32_t dev)
{
	vdev_ctx *tmp;
	ENTER(NULL);
	NEED_INIT();
	if (!device_valid(dev))
		return FAIL(ACL_ERROR_RT_INVALID_DEVICEID, "device %d (the runtime has %d)", dev, ndevices);
	vdev_status st = vdev_ctx_release(dev);
	if (st == VDEV_NO_CONTEXT)
		return FAIL(ACL_ERROR_RT_CONTEXT_NULL, "device %d was not set (aclrtSetDevice) in this process", dev);
	/* A default context that just died is current here no more. */
	if (st == VDEV_OK && vdev_ctx_get_current() && vdev_ctx_use(&tmp) == VDEV_NO_CONTEXT)
		vdev_ctx_set_current(NULL);
	return RESULT(st, 0, "device %d", dev);
}

/* aclrtCreateContext makes an explicit context and makes it current on
 * this thread, as AscendCL does. Strict on nothing: the device need not
 * have been set. */
API aclError aclrtCreateContext(aclrtContext *ctx, int32_t dev)
{
	vdev_ctx *c;
	ENTER(NULL);
	NEED_INIT();
	if (!ctx)
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "context is NULL");
	if (!device_valid(dev))
		return FAIL(ACL_ERROR_RT_INVALID_DEVICEID, "device %d (the runtime has %d)", dev, ndevices);
	vdev_status st = vdev_ctx_create(dev, &c);
	if (st == VDEV_OK) {
		vdev_ctx_set_current(c);
		*ctx = c;
	}
	return RESULT(st, 0, "device %d", dev);
}

/* aclrtDestroyContext ends an explicit context: its streams and events go.
 * A default context is no explicit one (aclrtResetDevice ends it). */
API aclError aclrtDestroyContext(aclrtContext ctx)
{
	ENTER(NULL);
	NEED_INIT();
	if (!ctx)
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "context is NULL");
	return RESULT(vdev_ctx_destroy(ctx), 0, "context %p (not one aclrtCreateContext made, or destroyed)", (void *)ctx);
}

API aclError aclrtSetCurrentContext(aclrtContext ctx)
{
	ENTER(NULL);
	NEED_INIT();
	if (!ctx)
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "context is NULL");
	if (vdev_ctx_set_current(ctx) != VDEV_OK)
		return FAIL(ACL_ERROR_RT_INVALID_HANDLE, "context %p is unknown or destroyed", (void *)ctx);
	return ACL_SUCCESS;
}

API aclError aclrtGetCurrentContext(aclrtContext *ctx)
{
	vdev_ctx *c;
	ENTER(NULL);
	NEED_CTX(c);
	if (!ctx)
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "context is NULL");
	*ctx = c;
	return ACL_SUCCESS;
}

/* aclrtGetMemInfo reports the current device's memory: HBM kinds its
 * capacity and what this process leaves free of it; DDR kinds nothing
 * (the stand-in's NPU has no DDR). Strict: other attributes are refused. */
API aclError aclrtGetMemInfo(int attr, size_t *free_bytes, size_t *total)
{
	vdev_ctx *c;
	ENTER(NULL);
	NEED_CTX(c);
	if (!free_bytes || !total)
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "free or total is NULL");
	switch (attr) {
	case DDR_MEM:
	case DDR_MEM_HUGE:
	case DDR_MEM_NORMAL:
		*free_bytes = *total = 0;
		return ACL_SUCCESS;
	case HBM_MEM:
	case HBM_MEM_HUGE:
	case HBM_MEM_NORMAL: {
		uint64_t cap = vdev_config()->capacity, used = vmstandin_used(vdev_ctx_device(c));
		*total = cap;
		*free_bytes = used < cap ? cap - used : 0;
		return ACL_SUCCESS;
	}
	}
	return FAIL(ACL_ERROR_RT_PARAM_INVALID, "memory attribute %d", attr);
}

/* ===== physical memory handles ============================================= */
#ifndef VMSTANDIN_OMIT_VMM

/* An acl_mem is one aclrtDrvMemHandle: the core's allocation behind it, its
 * size and device, and its token (the one it was exported as, or imported
 * from; 0: none). Every live one is in `mems`, guarded by mems_mu, which
 * is a leaf: nothing else is taken under it. A handle is looked up there
 * before it is read, and its fields are copied out under the lock. */
struct acl_mem {
	uint64_t handle;
	uint64_t size;
	int dev;
	bool imported;
	uint64_t token;
};

static pthread_mutex_t mems_mu = PTHREAD_MUTEX_INITIALIZER;
static struct vec mems;

/* mem_get copies out the live handle h: false when it is none. */
static bool mem_get(const struct acl_mem *h, struct acl_mem *out)
{
	pthread_mutex_lock(&mems_mu);
	bool ok = h && vec_find(&mems, h) < mems.n;
	if (ok)
		*out = *h;
	pthread_mutex_unlock(&mems_mu);
	return ok;
}

/* prop_device checks an aclrtPhysicalMemProp (pinned memory of a listed
 * kind on a device, no handle type, reserve 0) and returns its device, or
 * -1 with *code set. */
static int prop_device(const char *fn, const struct acl_prop *p, aclError *code)
{
	*code = ACL_ERROR_RT_PARAM_INVALID;
	if (!p)
		*code = fail(*code, fn, "prop is NULL");
	else if (p->handle_type != HANDLE_NONE)
		*code = fail(*code, fn, "prop.handleType %d (ACL_MEM_HANDLE_TYPE_NONE only)", p->handle_type);
	else if (p->allocation_type != ALLOCATION_PINNED)
		*code = fail(*code, fn, "prop.allocationType %d (ACL_MEM_ALLOCATION_TYPE_PINNED only)", p->allocation_type);
	else if (p->location.type != LOCATION_DEVICE)
		*code = fail(*code, fn, "prop.location.type %d (ACL_MEM_LOCATION_TYPE_DEVICE only)", p->location.type);
	else if (!mem_attr_ok(p->mem_attr))
		*code = fail(*code, fn, "prop.memAttr %d", p->mem_attr);
	else if (p->reserve != 0)
		*code = fail(*code, fn, "prop.reserve must be 0");
	else if (!device_valid((int32_t)p->location.id))
		*code = fail(ACL_ERROR_RT_INVALID_DEVICEID, fn, "prop.location.id %u", p->location.id);
	else
		return (int)p->location.id;
	return -1;
}

API aclError aclrtMemGetAllocationGranularity(const struct acl_prop *prop, int option, size_t *granularity)
{
	vdev_ctx *c;
	aclError code;
	ENTER(NULL);
	NEED_CTX(c);
	NEED_VMM();
	if (!granularity)
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "granularity is NULL");
	if (prop_device(__func__, prop, &code) < 0)
		return code;
	if (option == GRANULARITY_MINIMUM)
		*granularity = vdev_config()->mingran;
	else if (option == GRANULARITY_RECOMMENDED)
		*granularity = vdev_config()->recgran;
	else
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "option %d", option);
	return ACL_SUCCESS;
}

/* aclrtReserveMemAddress: alignment 0, no hint, flags 0, as documented.
 * The address is aligned to the granularity and never to twice it (see
 * vdev_reserve_odd). Strict: the size must be a multiple of the minimum
 * granularity (no rounding up). */
API aclError aclrtReserveMemAddress(void **ptr, size_t size, size_t alignment, void *hint, uint64_t flags)
{
	vdev_ctx *c;
	uint64_t p;
	ENTER(NULL);
	NEED_CTX(c);
	NEED_VMM();
	if (!ptr)
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "ptr is NULL");
	if (alignment != 0 || hint != NULL || flags != 0)
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "alignment %zu, hint %p, flags %#llx: all must be 0", alignment,
			    hint, (unsigned long long)flags);
	vdev_status st = vdev_reserve_odd(size, &p);
	if (st == VDEV_OK)
		*ptr = (void *)(uintptr_t)p;
	return RESULT(st, 0, "%zu bytes (a positive multiple of %llu)", size,
		      (unsigned long long)vdev_config()->mingran);
}

/* aclrtReleaseMemAddress takes the start of a reservation (no size), with
 * nothing mapped inside. */
API aclError aclrtReleaseMemAddress(void *ptr)
{
	vdev_ctx *c;
	ENTER(NULL);
	NEED_CTX(c);
	NEED_VMM();
	return RESULT(vdev_unreserve_at(addr_of(ptr)), 0, "%p (not the start of a reservation, or something is mapped in it)", ptr);
}

API aclError aclrtMallocPhysical(aclrtDrvMemHandle *handle, size_t size, const struct acl_prop *prop, uint64_t flags)
{
	vdev_ctx *c;
	aclError code;
	ENTER(NULL);
	NEED_CTX(c);
	NEED_VMM();
	if (!handle)
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "handle is NULL");
	if (flags != 0)
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "flags %#llx (must be 0)", (unsigned long long)flags);
	int dev = prop_device(__func__, prop, &code);
	if (dev < 0)
		return code;
	struct acl_mem *m = calloc(1, sizeof *m);
	if (!m)
		return FAIL(ACL_ERROR_RT_MEMORY_ALLOCATION, "no host memory");
	/* Every AscendCL allocation may be exported: it has a memfd of its
	 * own, unless the configuration leaves sharing out. */
	vdev_status st = vdev_create(dev, size, !vdev_config()->noposix, &m->handle);
	if (st != VDEV_OK) {
		free(m);
		return RESULT(st, 0, "%zu bytes on device %d (a positive multiple of %llu)", size, dev,
			      (unsigned long long)vdev_config()->mingran);
	}
	m->size = size;
	m->dev = dev;
	pthread_mutex_lock(&mems_mu);
	bool ok = vec_push(&mems, m);
	pthread_mutex_unlock(&mems_mu);
	if (!ok) {
		vdev_release(m->handle);
		free(m);
		return FAIL(ACL_ERROR_RT_MEMORY_ALLOCATION, "no host memory");
	}
	*handle = m;
	return ACL_SUCCESS;
}

/* aclrtFreePhysical frees a handle of this process; the memory goes when
 * every process that shares it has freed its handle. An exported handle's
 * token ends with it: later imports fail, earlier importers keep the
 * memory. Strict: a handle still mapped is refused. */
API aclError aclrtFreePhysical(aclrtDrvMemHandle handle)
{
	vdev_ctx *c;
	struct acl_mem m;
	ENTER(NULL);
	NEED_CTX(c);
	NEED_VMM();
	if (!mem_get(handle, &m))
		return FAIL(ACL_ERROR_RT_INVALID_HANDLE, "handle %p is unknown or freed", (void *)handle);
	vdev_status st = vdev_release_unmapped(m.handle);
	if (st == VDEV_BUSY)
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "handle %p is still mapped (aclrtUnmapMem first)", (void *)handle);
	if (st != VDEV_OK)
		return RESULT(st, 0, "handle %p", (void *)handle);
	/* Only this call freed the core's allocation, so only it removes and
	 * frees the handle. */
	pthread_mutex_lock(&mems_mu);
	size_t i = vec_find(&mems, handle);
	if (i < mems.n)
		vec_cut(&mems, i, i + 1);
	pthread_mutex_unlock(&mems_mu);
	if (m.token && !m.imported)
		vdev_token_revoke(m.token);
	free(handle);
	return ACL_SUCCESS;
}

/* A bind is one live mapping as AscendCL's rules about reservations see
 * it: the device and the origin (aclrtMallocPhysical or an import) of the
 * handle mapped. `binds` holds every live one, under binds_mu, which is
 * held across a map or unmap and its record (vdev's locks are taken under
 * it; mems_mu never is). */
struct acl_bind {
	uint64_t addr, size;
	int dev;
	bool imported;
};

static pthread_mutex_t binds_mu = PTHREAD_MUTEX_INITIALIZER;
static struct vec binds;

/* map_handle is aclrtMapMem and aclrtMemMapNoAccess: a whole handle at
 * ptr, offset 0, flags 0, size the handle's own, as documented; inside one
 * reservation, aligned, over no mapping. A handle may be mapped at several
 * addresses. As documented, a reservation is never bound to the memory of
 * two devices at once, nor to handles of aclrtMallocPhysical and of
 * aclrtMemImportFromShareableHandle at once. grant: aclrtMapMem's mapping
 * is read-write for the handle's device at once. */
static aclError map_handle(const char *fn, void *ptr, size_t size, size_t offset, aclrtDrvMemHandle handle,
			   uint64_t flags, bool grant)
{
	struct acl_mem m;
	uint64_t base, rsize, addr = addr_of(ptr);
	if (!mem_get(handle, &m))
		return fail(ACL_ERROR_RT_INVALID_HANDLE, fn, "handle %p is unknown or freed", (void *)handle);
	if (offset != 0 || flags != 0)
		return fail(ACL_ERROR_RT_PARAM_INVALID, fn, "offset %zu and flags %#llx must be 0", offset,
			    (unsigned long long)flags);
	if (size != m.size)
		return fail(ACL_ERROR_RT_PARAM_INVALID, fn, "size %zu: the handle is %llu bytes, mapped whole", size,
			    (unsigned long long)m.size);
	pthread_mutex_lock(&binds_mu);
	aclError code = ACL_SUCCESS;
	if (vdev_reservation_of(addr, &base, &rsize) == VDEV_OK) {
		for (size_t i = 0; i < binds.n && code == ACL_SUCCESS; i++) {
			const struct acl_bind *b = binds.at[i];
			if (b->addr < base || b->addr >= base + rsize)
				continue;
			if (b->dev != m.dev)
				code = fail(ACL_ERROR_RT_PARAM_INVALID, fn,
					    "the reservation at %#llx holds memory of device %d: it may not bind device %d's too",
					    (unsigned long long)base, b->dev, m.dev);
			else if (b->imported != m.imported)
				code = fail(ACL_ERROR_RT_PARAM_INVALID, fn,
					    "the reservation at %#llx holds %s memory: it may not bind %s memory too",
					    (unsigned long long)base, b->imported ? "imported" : "aclrtMallocPhysical's",
					    m.imported ? "imported" : "aclrtMallocPhysical's");
		}
	}
	struct acl_bind *b = NULL;
	if (code == ACL_SUCCESS && !(b = calloc(1, sizeof *b)))
		code = fail(ACL_ERROR_RT_MEMORY_ALLOCATION, fn, "no host memory");
	if (code == ACL_SUCCESS)
		code = result_of(fn, vdev_map(addr, size, 0, m.handle), 0, "%zu bytes at %p", size, ptr);
	if (code == ACL_SUCCESS && grant) {
		struct vdev_access rw = {.dev = m.dev, .flags = VDEV_ACCESS_READWRITE};
		code = result_of(fn, vdev_set_access_one(addr, size, &rw, 1), 0, "making %p accessible", ptr);
		if (code != ACL_SUCCESS)
			vdev_unmap_at(addr);
	}
	if (code == ACL_SUCCESS) {
		*b = (struct acl_bind){.addr = addr, .size = size, .dev = m.dev, .imported = m.imported};
		if (!vec_push(&binds, b)) {
			vdev_unmap_at(addr);
			code = fail(ACL_ERROR_RT_MEMORY_ALLOCATION, fn, "no host memory");
		} else
			b = NULL;
	}
	free(b);
	pthread_mutex_unlock(&binds_mu);
	return code;
}

/* aclrtMapMem maps a whole handle at ptr (map_handle), read-write for the
 * handle's own device at once: AscendCL's mapping is accessible without
 * aclrtMemSetAccess. */
API aclError aclrtMapMem(void *ptr, size_t size, size_t offset, aclrtDrvMemHandle handle, uint64_t flags)
{
	vdev_ctx *c;
	ENTER(NULL);
	NEED_CTX(c);
	NEED_VMM();
	return map_handle(__func__, ptr, size, offset, handle, flags, true);
}

#ifndef VMSTANDIN_OMIT_MAPNOACCESS
/* aclrtMemMapNoAccess maps as aclrtMapMem does, inaccessible to every
 * device until aclrtMemSetAccess. */
API aclError aclrtMemMapNoAccess(void *ptr, size_t size, size_t offset, aclrtDrvMemHandle handle, uint64_t flags)
{
	vdev_ctx *c;
	ENTER(NULL);
	NEED_CTX(c);
	NEED_VMM();
	return map_handle(__func__, ptr, size, offset, handle, flags, false);
}
#endif

/* aclrtUnmapMem takes the start of a mapping (no size) and unmaps it
 * whole. */
API aclError aclrtUnmapMem(void *ptr)
{
	vdev_ctx *c;
	ENTER(NULL);
	NEED_CTX(c);
	NEED_VMM();
	pthread_mutex_lock(&binds_mu);
	vdev_status st = vdev_unmap_at(addr_of(ptr));
	if (st == VDEV_OK) {
		for (size_t i = 0; i < binds.n; i++) {
			struct acl_bind *b = binds.at[i];
			if (b->addr == addr_of(ptr)) {
				vec_cut(&binds, i, i + 1);
				free(b);
				break;
			}
		}
	}
	pthread_mutex_unlock(&binds_mu);
	return RESULT(st, 0, "%p (not the start of a mapping)", ptr);
}

/* aclrtMemSetAccess: flags none, read or read-write; a device location;
 * rsv zero; exactly one mapping, the virPtr and size aclrtMapMem was
 * given, as Huawei's reference says. */
API aclError aclrtMemSetAccess(void *ptr, size_t size, struct acl_access_desc *desc, size_t count)
{
	struct vdev_access acc[MAX_ACCESS_DESCS];
	vdev_ctx *c;
	ENTER(NULL);
	NEED_CTX(c);
	NEED_VMM();
	if (!desc || count == 0 || count > MAX_ACCESS_DESCS)
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "%zu descriptors at %p", count, (void *)desc);
	for (size_t i = 0; i < count; i++) {
		const struct acl_access_desc *d = &desc[i];
		int f = d->flags;
		if (f != VDEV_ACCESS_NONE && f != VDEV_ACCESS_READ && f != VDEV_ACCESS_READWRITE)
			return FAIL(ACL_ERROR_RT_PARAM_INVALID, "desc[%zu].flags %d", i, f);
		if (d->location.type != LOCATION_DEVICE)
			return FAIL(ACL_ERROR_RT_PARAM_INVALID, "desc[%zu].location.type %d", i, d->location.type);
		if (!device_valid((int32_t)d->location.id))
			return FAIL(ACL_ERROR_RT_INVALID_DEVICEID, "desc[%zu].location.id %u", i, d->location.id);
		for (size_t k = 0; k < sizeof d->rsv; k++)
			if (d->rsv[k])
				return FAIL(ACL_ERROR_RT_PARAM_INVALID, "desc[%zu].rsv must be zero", i);
		acc[i].dev = (int)d->location.id;
		acc[i].flags = f;
	}
	return RESULT(vdev_set_access_one(addr_of(ptr), size, acc, count), 0,
		      "%zu bytes at %p (must be one whole mapping: aclrtMapMem's virPtr and size)", size, ptr);
}

API aclError aclrtMemGetAccess(void *ptr, struct acl_location *location, uint64_t *flags)
{
	vdev_ctx *c;
	int f;
	ENTER(NULL);
	NEED_CTX(c);
	NEED_VMM();
	if (!location || !flags)
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "location or flags is NULL");
	if (location->type != LOCATION_DEVICE)
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "location.type %d", location->type);
	if (!device_valid((int32_t)location->id))
		return FAIL(ACL_ERROR_RT_INVALID_DEVICEID, "location.id %u", location->id);
	vdev_status st = vdev_get_access((int)location->id, addr_of(ptr), &f);
	if (st == VDEV_OK)
		*flags = (uint64_t)f;
	return RESULT(st, 0, "%p", ptr);
}

/* ===== sharing between processes =========================================== */
#ifndef VMSTANDIN_OMIT_EXPORT

/* aclrtMemExportToShareableHandle: handle type NONE, flags 0 (importers
 * validated) or DISABLE_PID_VALIDATION; a handle of this process made by
 * aclrtMallocPhysical, once (a second export, or one of an imported
 * handle, is ACL_ERROR_RT_PARAM_INVALID). The token works in other
 * processes (vshare.c). */
API aclError aclrtMemExportToShareableHandle(aclrtDrvMemHandle handle, int handle_type, uint64_t flags,
					     uint64_t *token)
{
	vdev_ctx *c;
	struct acl_mem m;
	uint64_t t;
	ENTER(NULL);
	NEED_CTX(c);
	NEED_VMM();
	if (!token)
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "shareableHandle is NULL");
	if (handle_type != HANDLE_NONE)
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "handleType %d (ACL_MEM_HANDLE_TYPE_NONE only)", handle_type);
	if (flags != 0 && flags != EXPORT_DISABLE_PID_VALIDATION)
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "flags %#llx", (unsigned long long)flags);
	if (!mem_get(handle, &m))
		return FAIL(ACL_ERROR_RT_INVALID_HANDLE, "handle %p is unknown or freed", (void *)handle);
	if (m.imported)
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "handle %p was imported: only aclrtMallocPhysical's may be exported",
			    (void *)handle);
	if (m.token)
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "handle %p is exported already (once per handle)", (void *)handle);
	vdev_status st = vdev_token_export(m.handle, flags == 0, &t);
	if (st == VDEV_ALREADY)
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "handle %p is exported already (once per handle)", (void *)handle);
	if (st != VDEV_OK)
		return RESULT(st, 0, "handle %p", (void *)handle);
	pthread_mutex_lock(&mems_mu);
	bool live = vec_find(&mems, handle) < mems.n;
	if (live)
		handle->token = t;
	pthread_mutex_unlock(&mems_mu);
	if (!live) { /* freed by another thread meanwhile */
		vdev_token_revoke(t);
		return FAIL(ACL_ERROR_RT_INVALID_HANDLE, "handle %p was freed", (void *)handle);
	}
	*token = t;
	return ACL_SUCCESS;
}

/* aclrtMemSetPidToShareableHandle adds importer PIDs to a token this
 * process exported. Strict: no PIDs, or one that is not positive, is
 * refused. */
API aclError aclrtMemSetPidToShareableHandle(uint64_t token, int32_t *pids, size_t n)
{
	vdev_ctx *c;
	ENTER(NULL);
	NEED_CTX(c);
	NEED_VMM();
	if (!pids || n == 0 || n > MAX_PIDS)
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "%zu PIDs at %p", n, (void *)pids);
	for (size_t i = 0; i < n; i++)
		if (pids[i] <= 0)
			return FAIL(ACL_ERROR_RT_PARAM_INVALID, "pid[%zu] is %d", i, pids[i]);
	return RESULT(vdev_token_allow(token, pids, n), 0, "token %#llx (not one this process exported)",
		      (unsigned long long)token);
}

static aclError import_token(const char *fn, uint64_t token, int32_t device_id, aclrtDrvMemHandle *handle);

/* imports serialises this process's imports, so that one token never gets
 * two handles; it is held while the exporter answers (another process,
 * which takes none of this process's locks). */
static pthread_mutex_t imports = PTHREAD_MUTEX_INITIALIZER;

/* aclrtMemImportFromShareableHandle makes a handle of this process over the
 * memory of another process's token. Refused: a token this process
 * exported (ACL_ERROR_RT_FEATURE_NOT_SUPPORT: AscendCL does not support
 * export and import in one process), a token imported already and not
 * freed (one handle per token per process), an unknown or revoked token
 * (ACL_ERROR_RT_PARAM_INVALID), an importer the allow-list leaves out
 * (ACL_ERROR_RT_NO_PERMISSION). The memory stays on the exporter's device;
 * device_id is checked but, unlike the documents' cross-device rule, peer
 * access is not required. */
API aclError aclrtMemImportFromShareableHandle(uint64_t token, int32_t device_id, aclrtDrvMemHandle *handle)
{
	vdev_ctx *c;
	ENTER(NULL);
	NEED_CTX(c);
	NEED_VMM();
	if (!handle)
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "handle is NULL");
	if (!device_valid(device_id))
		return FAIL(ACL_ERROR_RT_INVALID_DEVICEID, "device %d (the runtime has %d)", device_id, ndevices);
	pthread_mutex_lock(&imports);
	aclError code = import_token(__func__, token, device_id, handle);
	pthread_mutex_unlock(&imports);
	return code;
}

/* import_token is the import of token, imports held. */
static aclError import_token(const char *fn, uint64_t token, int32_t device_id, aclrtDrvMemHandle *handle)
{
	uint64_t h;
	bool twice = false;
	pthread_mutex_lock(&mems_mu);
	for (size_t i = 0; i < mems.n && !twice; i++) {
		const struct acl_mem *m = mems.at[i];
		twice = m->imported && m->token == token;
	}
	pthread_mutex_unlock(&mems_mu);
	if (twice)
		return fail(ACL_ERROR_RT_PARAM_INVALID, fn, "token %#llx is imported already (one handle per token per process)",
			    (unsigned long long)token);
	vdev_status st = vdev_token_import(token, &h);
	switch (st) {
	case VDEV_OK:
		break;
	case VDEV_NOT_SUPPORTED:
		return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, fn, "token %#llx: %s", (unsigned long long)token,
			    vdev_config()->noposix ? "sharing is left out"
						   : "exported by this process (export and import in one process are not supported)");
	case VDEV_NOT_PERMITTED:
		return fail(ACL_ERROR_RT_NO_PERMISSION, fn, "process %d is not on the allow-list of token %#llx",
			    (int)getpid(), (unsigned long long)token);
	case VDEV_INVALID:
		return fail(ACL_ERROR_RT_PARAM_INVALID, fn, "token %#llx: no process exports it", (unsigned long long)token);
	default:
		return result_of(fn, st, 0, "token %#llx", (unsigned long long)token);
	}
	struct acl_mem *m = calloc(1, sizeof *m);
	bool ok = false;
	if (m) {
		m->handle = h;
		m->imported = true;
		m->token = token;
		vdev_allocation_size(h, &m->size);
		m->dev = device_id;
		pthread_mutex_lock(&mems_mu);
		ok = vec_push(&mems, m);
		pthread_mutex_unlock(&mems_mu);
	}
	if (!ok) {
		vdev_release(h);
		free(m);
		return fail(ACL_ERROR_RT_MEMORY_ALLOCATION, fn, "no host memory");
	}
	*handle = m;
	return ACL_SUCCESS;
}

/* aclrtDeviceGetBareTgid is the host process ID: getpid, since the
 * stand-in runs in no container of its own. */
API aclError aclrtDeviceGetBareTgid(int32_t *pid)
{
	ENTER(NULL);
	NEED_INIT();
	if (!pid)
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "pid is NULL");
	*pid = (int32_t)getpid();
	return ACL_SUCCESS;
}

#endif /* VMSTANDIN_OMIT_EXPORT */
#endif /* VMSTANDIN_OMIT_VMM */

/* ===== copies ============================================================== */

#if !defined(VMSTANDIN_OMIT_SYNCCOPY) || !defined(VMSTANDIN_OMIT_STREAMS)

/* copy_sides checks kind against where dst and src lie (an address in a
 * reservation is device memory) and says which side is the device's. */
static aclError copy_sides(const char *fn, const void *dst, const void *src, size_t count, int kind, bool *dst_dev,
			   bool *src_dev)
{
	if (kind < HOST_TO_HOST || kind > DEVICE_TO_DEVICE)
		return fail(ACL_ERROR_RT_PARAM_INVALID, fn, "kind %d", kind);
	bool want_dst = kind == HOST_TO_DEVICE || kind == DEVICE_TO_DEVICE;
	bool want_src = kind == DEVICE_TO_HOST || kind == DEVICE_TO_DEVICE;
	*dst_dev = vdev_in_reserved(addr_of(dst), count);
	*src_dev = vdev_in_reserved(addr_of(src), count);
	if (*dst_dev != want_dst || *src_dev != want_src)
		return fail(ACL_ERROR_RT_PARAM_INVALID, fn, "kind %d, but dst %p is %s memory and src %p is %s memory", kind,
			    dst, *dst_dev ? "device" : "host", src, *src_dev ? "device" : "host");
	return ACL_SUCCESS;
}

#endif

#ifndef VMSTANDIN_OMIT_SYNCCOPY

/* aclrtMemcpy copies on the calling thread as the current context's device,
 * which needs read access over a device source and read-write over a
 * device destination. Strict: a device without that access is refused with
 * ACL_ERROR_RT_PARAM_INVALID, and nothing moves. */
API aclError aclrtMemcpy(void *dst, size_t dest_max, const void *src, size_t count, int kind)
{
	vdev_ctx *c;
	int exec, raw = 0;
	bool dst_dev = false, src_dev = false;
	ENTER(&exec);
	NEED_CTX(c);
	if (count > dest_max)
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "count %zu is more than destMax %zu", count, dest_max);
	if (count == 0)
		return ACL_SUCCESS;
	if (!dst || !src)
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "dst %p, src %p", dst, src);
	aclError code = copy_sides(__func__, dst, src, count, kind, &dst_dev, &src_dev);
	if (code)
		return code;
	vdev_status st = vdev_copy(c, addr_of(dst), dst_dev, addr_of(src), src_dev, count, fault_of(exec), &raw);
	if (st == VDEV_ILLEGAL_ADDRESS)
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "device %d may not %s [%p, +%zu)", vdev_ctx_device(c),
			    dst_dev ? "write" : "read", dst_dev ? dst : src, count);
	return RESULT(st, raw, "%zu bytes", count);
}

#endif /* VMSTANDIN_OMIT_SYNCCOPY */

#ifndef VMSTANDIN_OMIT_DEVSYNC
/* aclrtSynchronizeDevice waits for the work of every stream of every
 * context on the current context's device, default streams included; a
 * stream's own failure stays with it for aclrtSynchronizeStream. */
API aclError aclrtSynchronizeDevice(void)
{
	vdev_ctx *c;
	ENTER(NULL);
	NEED_CTX(c);
	return RESULT(vdev_sync_device(c, true), 0, "the work of device %d", vdev_ctx_device(c));
}
#endif /* VMSTANDIN_OMIT_DEVSYNC */

/* ===== streams and asynchronous copies ===================================== */
#ifndef VMSTANDIN_OMIT_STREAMS

/* own_stream checks that s (NULL: the current context's default stream) is
 * a live stream of the current context c. */
static aclError own_stream(const char *fn, vdev_ctx *c, vdev_stream *s)
{
	vdev_ctx *owner;
	if (!s)
		return ACL_SUCCESS;
	if (vdev_stream_context(s, &owner) != VDEV_OK)
		return fail(ACL_ERROR_RT_INVALID_HANDLE, fn, "stream %p is unknown or destroyed", (void *)s);
	/* Strict: a stream is used with its own context current. */
	if (owner != c)
		return fail(ACL_ERROR_RT_STREAM_CONTEXT, fn, "stream %p belongs to another context than the current one",
			    (void *)s);
	return ACL_SUCCESS;
}

API aclError aclrtCreateStream(aclrtStream *stream)
{
	vdev_ctx *c;
	ENTER(NULL);
	NEED_CTX(c);
	if (!stream)
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "stream is NULL");
	return RESULT(vdev_stream_create(c, stream), 0, "in the current context");
}

API aclError aclrtDestroyStream(aclrtStream stream)
{
	vdev_ctx *c;
	ENTER(NULL);
	NEED_CTX(c);
	if (!stream)
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "stream is NULL (the default stream is the context's)");
	aclError code = own_stream(__func__, c, stream);
	if (code)
		return code;
	return RESULT(vdev_stream_destroy(stream), 0, "stream %p", (void *)stream);
}

/* aclrtSynchronizeStream waits for the stream's work and returns, once,
 * the first failure of it since the last synchronisation. */
API aclError aclrtSynchronizeStream(aclrtStream stream)
{
	vdev_ctx *c;
	int raw = 0;
	ENTER(NULL);
	NEED_CTX(c);
	aclError code = own_stream(__func__, c, stream);
	if (code)
		return code;
	vdev_status st = vdev_stream_sync(c, stream, &raw);
	return RESULT(st, raw, "the work of stream %p", (void *)stream);
}

/* aclrtMemcpyAsync enqueues a copy: both addresses 64-byte aligned
 * (ACL_ERROR_RT_ADDR_UNALIGNED), the kind true to them, checked now; the
 * device's access is checked when the copy runs. */
API aclError aclrtMemcpyAsync(void *dst, size_t dest_max, const void *src, size_t count, int kind,
			      aclrtStream stream)
{
	vdev_ctx *c;
	int exec;
	bool dst_dev = false, src_dev = false;
	ENTER(&exec);
	NEED_CTX(c);
	if (count > dest_max)
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "count %zu is more than destMax %zu", count, dest_max);
	if (!dst || !src)
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "dst %p, src %p", dst, src);
	if (addr_of(dst) % COPY_ALIGN || addr_of(src) % COPY_ALIGN)
		return FAIL(ACL_ERROR_RT_ADDR_UNALIGNED, "dst %p and src %p must be %d-byte aligned", dst, src, COPY_ALIGN);
	aclError code = copy_sides(__func__, dst, src, count, kind, &dst_dev, &src_dev);
	if (!code)
		code = own_stream(__func__, c, stream);
	if (code)
		return code;
	return RESULT(vdev_enqueue_copy(c, stream, addr_of(dst), dst_dev, addr_of(src), src_dev, count, fault_of(exec)),
		      0, "on stream %p", (void *)stream);
}

/* aclrtMemsetAsync enqueues a fill of count bytes with value's low byte
 * (memset's rule). Strict: dst must be device memory. */
API aclError aclrtMemsetAsync(void *dst, size_t max_count, int32_t value, size_t count, aclrtStream stream)
{
	vdev_ctx *c;
	int exec;
	ENTER(&exec);
	NEED_CTX(c);
	if (count > max_count)
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "count %zu is more than maxCount %zu", count, max_count);
	if (!dst)
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "dst is NULL");
	if (addr_of(dst) % COPY_ALIGN)
		return FAIL(ACL_ERROR_RT_ADDR_UNALIGNED, "dst %p must be %d-byte aligned", dst, COPY_ALIGN);
	if (!vdev_in_reserved(addr_of(dst), count))
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "dst %p is not device memory", dst);
	aclError code = own_stream(__func__, c, stream);
	if (code)
		return code;
	return RESULT(vdev_enqueue_fill(c, stream, addr_of(dst), (uint8_t)value, count, fault_of(exec)), 0,
		      "on stream %p", (void *)stream);
}

#endif /* VMSTANDIN_OMIT_STREAMS */

/* ===== events ============================================================== */
#ifndef VMSTANDIN_OMIT_EVENTS

API aclError aclrtCreateEvent(aclrtEvent *event)
{
	vdev_ctx *c;
	ENTER(NULL);
	NEED_CTX(c);
	if (!event)
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "event is NULL");
	return RESULT(vdev_event_create(c, event), 0, "in the current context");
}

/* aclrtRecordEvent marks the point after the work enqueued so far on the
 * stream (NULL: the default stream); event and stream share a context. */
API aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream)
{
	vdev_ctx *c;
	int exec;
	ENTER(&exec);
	NEED_CTX(c);
#ifndef VMSTANDIN_OMIT_STREAMS
	aclError code = own_stream(__func__, c, stream);
	if (code)
		return code;
#endif
	return RESULT(vdev_event_record(c, event, stream, fault_of(exec)), 0,
		      "event %p on stream %p (unknown, destroyed, or of another context)", (void *)event, (void *)stream);
}

/* aclrtSynchronizeEvent waits for the event's point, and returns, and
 * takes, a failure of its stream's work before that point: the driver can
 * wait with events alone. */
API aclError aclrtSynchronizeEvent(aclrtEvent event)
{
	vdev_ctx *c;
	int raw = 0;
	ENTER(NULL);
	NEED_CTX(c);
	vdev_status st = vdev_event_sync(event, true, &raw);
	return RESULT(st, raw, "event %p", (void *)event);
}

API aclError aclrtDestroyEvent(aclrtEvent event)
{
	vdev_ctx *c;
	ENTER(NULL);
	NEED_CTX(c);
	return RESULT(vdev_event_destroy(event), 0, "event %p", (void *)event);
}

#endif /* VMSTANDIN_OMIT_EVENTS */

/* ===== peers =============================================================== */
#ifndef VMSTANDIN_OMIT_PEER

/* aclrtDeviceCanAccessPeer: 1 between two devices unless the configuration
 * has no peers. Strict: a device and itself are no peers, and asking is
 * ACL_ERROR_RT_INVALID_DEVICEID. */
API aclError aclrtDeviceCanAccessPeer(int32_t *can, int32_t dev, int32_t peer)
{
	ENTER(NULL);
	NEED_INIT();
	if (!can)
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "canAccessPeer is NULL");
	if (!device_valid(dev) || !device_valid(peer) || dev == peer)
		return FAIL(ACL_ERROR_RT_INVALID_DEVICEID, "devices %d and %d (two different ones of %d)", dev, peer, ndevices);
	*can = !vdev_config()->nopeer;
	return ACL_SUCCESS;
}

/* aclrtDeviceEnablePeerAccess lets the current context's device reach
 * peer's memory; enabling it again is no error. Like the core's CUDA rule,
 * it opens nothing: a device reaches memory its access was set for. */
API aclError aclrtDeviceEnablePeerAccess(int32_t peer, uint32_t flags)
{
	vdev_ctx *c;
	ENTER(NULL);
	NEED_CTX(c);
	if (flags != 0)
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "flags %#x (must be 0)", flags);
	if (!device_valid(peer) || peer == vdev_ctx_device(c))
		return FAIL(ACL_ERROR_RT_INVALID_DEVICEID, "peer %d from device %d", peer, vdev_ctx_device(c));
	if (vdev_config()->nopeer)
		return FAIL(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, "devices %d and %d cannot be peers", vdev_ctx_device(c), peer);
	return ACL_SUCCESS;
}

#endif /* VMSTANDIN_OMIT_PEER */

/* ===== pinned host memory ================================================== */
#ifndef VMSTANDIN_OMIT_HOSTALLOC

API aclError aclrtMallocHost(void **ptr, size_t size)
{
	vdev_ctx *c;
	ENTER(NULL);
	NEED_CTX(c);
	if (!ptr || size == 0)
		return FAIL(ACL_ERROR_RT_PARAM_INVALID, "ptr %p, size %zu", (void *)ptr, size);
	return RESULT(vdev_host_alloc(size, ptr), 0, "%zu bytes", size);
}

API aclError aclrtFreeHost(void *ptr)
{
	vdev_ctx *c;
	ENTER(NULL);
	NEED_CTX(c);
	return RESULT(vdev_host_free(ptr), 0, "%p (not the start of a live aclrtMallocHost buffer)", ptr);
}

#endif /* VMSTANDIN_OMIT_HOSTALLOC */
