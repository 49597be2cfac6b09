/*
 * cuda.c - the CUDA front-end of the stand-in: the cu* symbols of
 * libcuda.so.1 with the real names, signatures and result codes (see
 * shared/CUDA_ABI.md), over the emulated device of vdev.c.
 *
 * Each function here counts its call and applies injected failures and the
 * stub mode (ENTER), checks initialisation and the current context where
 * the real driver needs them, checks what only exists in CUDA's API
 * (struct fields, enum values, flags), and translates the vdev status.
 *
 * Compile-time omissions (-DVMSTANDIN_OMIT_<GROUP>) leave a group's symbols
 * undefined, so a test can prove that a driver missing one symbol loses
 * just the feature it serves.
 */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "vdev.h"

#define API VDEV_EXPORT

/* ===== CUDA's types, mirrored from the documented ABI ====================== */

typedef int CUresult;
typedef int CUdevice;
typedef uint64_t CUdeviceptr;
typedef uint64_t CUmemGenericAllocationHandle;
typedef vdev_ctx *CUcontext;
typedef vdev_stream *CUstream;
typedef vdev_event *CUevent;

/* CUmemLocation: 8 bytes, {type, id}. */
struct cu_location {
	int32_t type;
	int32_t id;
};

/* CUmemAllocationProp: 32 bytes. */
struct cu_alloc_prop {
	int32_t type;
	int32_t requested_handle_types;
	struct cu_location location;
	void *win32_metadata;
	uint8_t compression_type;
	uint8_t gpu_direct_rdma_capable;
	uint16_t usage;
	uint8_t reserved[4];
};

/* CUmemAccessDesc: 12 bytes, {location, flags}; arrays at a 12-byte stride. */
struct cu_access_desc {
	struct cu_location location;
	int32_t flags;
};

_Static_assert(sizeof(struct cu_location) == 8, "CUmemLocation is 8 bytes");
_Static_assert(sizeof(struct cu_alloc_prop) == 32, "CUmemAllocationProp is 32 bytes");
_Static_assert(offsetof(struct cu_alloc_prop, location) == 8, "CUmemAllocationProp.location at 8");
_Static_assert(offsetof(struct cu_alloc_prop, win32_metadata) == 16, "win32HandleMetaData at 16");
_Static_assert(offsetof(struct cu_alloc_prop, compression_type) == 24, "allocFlags at 24");
_Static_assert(sizeof(struct cu_access_desc) == 12, "CUmemAccessDesc is 12 bytes");
_Static_assert(offsetof(struct cu_access_desc, flags) == 8, "CUmemAccessDesc.flags at 8");

enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_OUT_OF_MEMORY = 2,
	CUDA_ERROR_NOT_INITIALIZED = 3,
	CUDA_ERROR_STUB_LIBRARY = 34,
	CUDA_ERROR_NO_DEVICE = 100,
	CUDA_ERROR_INVALID_DEVICE = 101,
	CUDA_ERROR_INVALID_CONTEXT = 201,
	CUDA_ERROR_PEER_ACCESS_UNSUPPORTED = 217,
	CUDA_ERROR_INVALID_HANDLE = 400,
	CUDA_ERROR_NOT_READY = 600,
	CUDA_ERROR_ILLEGAL_ADDRESS = 700,
	CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704,
	CUDA_ERROR_NOT_SUPPORTED = 801,
	CUDA_ERROR_UNKNOWN = 999,
};

enum {
	DRIVER_VERSION = 12060,
	LOCATION_DEVICE = 1,
	ALLOCATION_PINNED = 1,
	HANDLE_POSIX_FD = 1,
	HANDLE_TYPES_KNOWN = 0xf, /* POSIX_FD 1, WIN32 2, WIN32_KMT 4, FABRIC 8 */
	GRANULARITY_MINIMUM = 0,
	GRANULARITY_RECOMMENDED = 1,
	STREAM_NON_BLOCKING = 1,
	EVENT_FLAGS = 1 | 2,          /* BLOCKING_SYNC, DISABLE_TIMING */
	HOST_ALLOC_FLAGS = 1 | 2 | 4, /* PORTABLE, DEVICEMAP, WRITECOMBINED */
	MAX_ACCESS_DESCS = 4 * VDEV_MAX_DEVICES,
	MULTIPROCESSORS = 4,
};

enum {
	ATTR_MULTIPROCESSOR_COUNT = 16,
	ATTR_UNIFIED_ADDRESSING = 41,
	ATTR_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
	ATTR_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED = 103,
	ATTR_MEMORY_POOLS_SUPPORTED = 115,
};

/* ===== the checks every call starts with =================================== */

/* ENTER counts the call (by the function's own name), returns an injected
 * code, and plays the link stub: the toolkit's stub libcuda.so answers every
 * call with CUDA_ERROR_STUB_LIBRARY. exec, when not NULL, receives the code
 * of a run-time (":exec") injection. */
#define ENTER(exec)                                                                                      \
	do {                                                                                             \
		static int slot_ = -1;                                                                   \
		int injected_ = vdev_enter(&slot_, __func__, (exec));                                    \
		if (injected_)                                                                           \
			return injected_;                                                                \
		if (vdev_config()->stub)                                                                 \
			return CUDA_ERROR_STUB_LIBRARY;                                                  \
	} while (0)

/* NEED_INIT: every call but cuInit, cuDriverGetVersion and cuGetErrorName
 * needs a successful cuInit. */
#define NEED_INIT()                                                                                      \
	do {                                                                                             \
		if (!vdev_initialized())                                                                 \
			return CUDA_ERROR_NOT_INITIALIZED;                                               \
	} while (0)

/* NEED_CTX: the call needs a current context on this thread (and one free
 * of a sticky fault); ctx receives it. */
#define NEED_CTX(ctx)                                                                                    \
	do {                                                                                             \
		NEED_INIT();                                                                             \
		vdev_status st_ = vdev_ctx_use(&(ctx));                                                  \
		if (st_ == VDEV_NO_CONTEXT)                                                              \
			return CUDA_ERROR_INVALID_CONTEXT;                                               \
		if (st_ != VDEV_OK)                                                                      \
			return CUDA_ERROR_ILLEGAL_ADDRESS;                                               \
	} while (0)

/* NEED_VMM: a VMM call on a driver or device without VMM. */
#define NEED_VMM()                                                                                       \
	do {                                                                                             \
		if (vdev_config()->novmm)                                                                \
			return CUDA_ERROR_NOT_SUPPORTED;                                                 \
	} while (0)

/* result translates a vdev status. In the VMM calls (vmm) the real driver
 * answers bad handles, overlaps and ranges that are not whole mappings with
 * CUDA_ERROR_INVALID_VALUE; elsewhere a bad stream or event is
 * CUDA_ERROR_INVALID_HANDLE. raw is the injected code of VDEV_RAW. */
static inline CUresult result(vdev_status st, bool vmm, int raw)
{
	switch (st) {
	case VDEV_OK:
		return CUDA_SUCCESS;
	case VDEV_INVALID:
	case VDEV_NOT_MAPPED:
	case VDEV_OVERLAP:
	case VDEV_NOT_PERMITTED:
	case VDEV_BUSY:
		return CUDA_ERROR_INVALID_VALUE;
	case VDEV_BAD_HANDLE:
		return vmm ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_INVALID_HANDLE;
	case VDEV_OOM:
		return CUDA_ERROR_OUT_OF_MEMORY;
	case VDEV_NO_DEVICE:
		return CUDA_ERROR_INVALID_DEVICE;
	case VDEV_ILLEGAL_ADDRESS:
		return CUDA_ERROR_ILLEGAL_ADDRESS;
	case VDEV_NOT_SUPPORTED:
		return CUDA_ERROR_NOT_SUPPORTED;
	case VDEV_NOT_READY:
		return CUDA_ERROR_NOT_READY;
	case VDEV_NO_CONTEXT:
		return CUDA_ERROR_INVALID_CONTEXT;
	case VDEV_ALREADY:
		return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
	case VDEV_NOT_INITIALIZED:
		return CUDA_ERROR_NOT_INITIALIZED;
	case VDEV_RAW:
		return raw;
	case VDEV_OS:
		break;
	}
	return CUDA_ERROR_UNKNOWN;
}

static inline CUresult vmm_result(vdev_status st) { return result(st, true, 0); }
static inline CUresult rt_result(vdev_status st) { return result(st, false, 0); }

/* fault_of makes a run-time injection: 700 is sticky, as a real illegal
 * address is. */
static inline vdev_fault fault_of(int code)
{
	return (vdev_fault){.code = code, .poison = code == CUDA_ERROR_ILLEGAL_ADDRESS};
}

static inline bool device_valid(CUdevice dev) { return dev >= 0 && dev < vdev_config()->devices; }

/* ===== initialisation, devices, errors ===================================== */

API CUresult cuInit(unsigned int flags)
{
	ENTER(NULL);
	if (flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	vdev_status st = vdev_init("cuda", true);
	return st == VDEV_NO_DEVICE ? CUDA_ERROR_NO_DEVICE : rt_result(st);
}

API CUresult cuDriverGetVersion(int *version)
{
	ENTER(NULL);
	if (!version)
		return CUDA_ERROR_INVALID_VALUE;
	*version = DRIVER_VERSION;
	return CUDA_SUCCESS;
}

API CUresult cuDeviceGetCount(int *count)
{
	ENTER(NULL);
	NEED_INIT();
	if (!count)
		return CUDA_ERROR_INVALID_VALUE;
	*count = vdev_config()->devices;
	return CUDA_SUCCESS;
}

API CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
	ENTER(NULL);
	NEED_INIT();
	if (!device)
		return CUDA_ERROR_INVALID_VALUE;
	if (!device_valid(ordinal))
		return CUDA_ERROR_INVALID_DEVICE;
	*device = ordinal;
	return CUDA_SUCCESS;
}

API CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
	ENTER(NULL);
	NEED_INIT();
	if (!name || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (!device_valid(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	snprintf(name, (size_t)len, "vmarena stand-in GPU %d", dev);
	return CUDA_SUCCESS;
}

API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
	ENTER(NULL);
	NEED_INIT();
	if (!bytes)
		return CUDA_ERROR_INVALID_VALUE;
	if (!device_valid(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	*bytes = vdev_config()->capacity;
	return CUDA_SUCCESS;
}

API CUresult cuDeviceGetAttribute(int *value, int attrib, CUdevice dev)
{
	ENTER(NULL);
	NEED_INIT();
	if (!value)
		return CUDA_ERROR_INVALID_VALUE;
	if (!device_valid(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	const struct vdev_config *c = vdev_config();
	switch (attrib) {
	case ATTR_MULTIPROCESSOR_COUNT:
		*value = MULTIPROCESSORS;
		break;
	case ATTR_UNIFIED_ADDRESSING:
		*value = 1;
		break;
	case ATTR_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
		*value = !c->novmm;
		break;
	case ATTR_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
		*value = !c->novmm && !c->noposix;
		break;
	case ATTR_MEMORY_POOLS_SUPPORTED:
		*value = !c->nopools;
		break;
	default:
		return CUDA_ERROR_INVALID_VALUE;
	}
	return CUDA_SUCCESS;
}

API CUresult cuGetErrorName(CUresult error, const char **name)
{
	static const struct {
		CUresult code;
		const char *name;
	} names[] = {
		{0, "CUDA_SUCCESS"},
		{1, "CUDA_ERROR_INVALID_VALUE"},
		{2, "CUDA_ERROR_OUT_OF_MEMORY"},
		{3, "CUDA_ERROR_NOT_INITIALIZED"},
		{4, "CUDA_ERROR_DEINITIALIZED"},
		{34, "CUDA_ERROR_STUB_LIBRARY"},
		{100, "CUDA_ERROR_NO_DEVICE"},
		{101, "CUDA_ERROR_INVALID_DEVICE"},
		{201, "CUDA_ERROR_INVALID_CONTEXT"},
		{208, "CUDA_ERROR_ALREADY_MAPPED"},
		{211, "CUDA_ERROR_NOT_MAPPED"},
		{217, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED"},
		{400, "CUDA_ERROR_INVALID_HANDLE"},
		{401, "CUDA_ERROR_ILLEGAL_STATE"},
		{600, "CUDA_ERROR_NOT_READY"},
		{700, "CUDA_ERROR_ILLEGAL_ADDRESS"},
		{704, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED"},
		{800, "CUDA_ERROR_NOT_PERMITTED"},
		{801, "CUDA_ERROR_NOT_SUPPORTED"},
		{999, "CUDA_ERROR_UNKNOWN"},
	};
	ENTER(NULL);
	if (!name)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
		if (names[i].code == error) {
			*name = names[i].name;
			return CUDA_SUCCESS;
		}
	}
	*name = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

/* ===== contexts ============================================================ */

API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	ENTER(NULL);
	NEED_INIT();
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	return rt_result(vdev_ctx_retain(dev, pctx));
}

API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
	ENTER(NULL);
	NEED_INIT();
	return rt_result(vdev_ctx_release(dev));
}

API CUresult cuCtxSetCurrent(CUcontext ctx)
{
	ENTER(NULL);
	NEED_INIT();
	return rt_result(vdev_ctx_set_current(ctx));
}

API CUresult cuCtxGetCurrent(CUcontext *pctx)
{
	ENTER(NULL);
	NEED_INIT();
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	*pctx = vdev_ctx_get_current();
	return CUDA_SUCCESS;
}

/* cuCtxCreate_v2 makes a context of the caller's own on dev (not the
 * primary one) and makes it current on the calling thread, as the real
 * call pushes it on the thread's stack; the driver under test never calls
 * it: a test makes one to prove that the driver leaves it current. The
 * stand-in keeps one current context per thread, no stack (cuCtxSetCurrent
 * replaces the stack's top, which is all the driver uses). flags must be 0
 * here: the scheduling flags change nothing the stand-in models. */
API CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	ENTER(NULL);
	NEED_INIT();
	if (!pctx || flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (!device_valid(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	vdev_ctx *c;
	vdev_status st = vdev_ctx_create(dev, &c);
	if (st != VDEV_OK)
		return rt_result(st);
	*pctx = c;
	return rt_result(vdev_ctx_set_current(c));
}

/* cuCtxDestroy_v2 ends a context cuCtxCreate_v2 made (a primary context is
 * CUDA_ERROR_INVALID_CONTEXT) and unsets it on the calling thread. */
API CUresult cuCtxDestroy_v2(CUcontext ctx)
{
	ENTER(NULL);
	NEED_INIT();
	return vdev_ctx_destroy(ctx) == VDEV_OK ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

/* ===== virtual memory management =========================================== */
#ifndef VMSTANDIN_OMIT_VMM

/* prop_device checks an allocation property (pinned memory on a device)
 * and returns its device, or -1 with *res set. */
static int prop_device(const struct cu_alloc_prop *prop, CUresult *res)
{
	*res = CUDA_ERROR_INVALID_VALUE;
	if (!prop || prop->type != ALLOCATION_PINNED || prop->location.type != LOCATION_DEVICE)
		return -1;
	if (!device_valid(prop->location.id)) {
		*res = CUDA_ERROR_INVALID_DEVICE;
		return -1;
	}
	return prop->location.id;
}

API CUresult cuMemGetAllocationGranularity(size_t *granularity, const struct cu_alloc_prop *prop, int option)
{
	CUresult res;
	ENTER(NULL);
	NEED_INIT();
	NEED_VMM();
	if (!granularity)
		return CUDA_ERROR_INVALID_VALUE;
	if (prop_device(prop, &res) < 0)
		return res;
	if (option == GRANULARITY_MINIMUM)
		*granularity = vdev_config()->mingran;
	else if (option == GRANULARITY_RECOMMENDED)
		*granularity = vdev_config()->recgran;
	else
		return CUDA_ERROR_INVALID_VALUE;
	return CUDA_SUCCESS;
}

API CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
				 unsigned long long flags)
{
	vdev_ctx *ctx;
	ENTER(NULL);
	NEED_CTX(ctx);
	NEED_VMM();
	if (!ptr || flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	return vmm_result(vdev_reserve(size, alignment, addr, ptr));
}

API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
	vdev_ctx *ctx;
	ENTER(NULL);
	NEED_CTX(ctx);
	NEED_VMM();
	return vmm_result(vdev_unreserve(ptr, size));
}

API CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const struct cu_alloc_prop *prop,
			 unsigned long long flags)
{
	vdev_ctx *ctx;
	CUresult res;
	ENTER(NULL);
	NEED_CTX(ctx);
	NEED_VMM();
	if (!handle || flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	int dev = prop_device(prop, &res);
	if (dev < 0)
		return res;
	int types = prop->requested_handle_types;
	if (types & ~HANDLE_TYPES_KNOWN)
		return CUDA_ERROR_INVALID_VALUE;
	if (types & ~HANDLE_POSIX_FD) /* Windows and fabric handles: not on this machine */
		return CUDA_ERROR_NOT_SUPPORTED;
	return vmm_result(vdev_create(dev, size, types == HANDLE_POSIX_FD, handle));
}

API CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
	vdev_ctx *ctx;
	ENTER(NULL);
	NEED_CTX(ctx);
	NEED_VMM();
	return vmm_result(vdev_release(handle));
}

API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
		      unsigned long long flags)
{
	vdev_ctx *ctx;
	ENTER(NULL);
	NEED_CTX(ctx);
	NEED_VMM();
	if (flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	return vmm_result(vdev_map(ptr, size, offset, handle));
}

API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	vdev_ctx *ctx;
	ENTER(NULL);
	NEED_CTX(ctx);
	NEED_VMM();
	return vmm_result(vdev_unmap(ptr, size));
}

API CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const struct cu_access_desc *desc, size_t count)
{
	struct vdev_access acc[MAX_ACCESS_DESCS];
	vdev_ctx *ctx;
	ENTER(NULL);
	NEED_CTX(ctx);
	NEED_VMM();
	if (!desc || count == 0 || count > MAX_ACCESS_DESCS)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < count; i++) {
		if (desc[i].location.type != LOCATION_DEVICE)
			return CUDA_ERROR_INVALID_VALUE;
		acc[i].dev = desc[i].location.id;
		acc[i].flags = desc[i].flags;
	}
	return vmm_result(vdev_set_access(ptr, size, acc, count));
}

API CUresult cuMemGetAccess(unsigned long long *flags, const struct cu_location *location, CUdeviceptr ptr)
{
	vdev_ctx *ctx;
	int f;
	ENTER(NULL);
	NEED_CTX(ctx);
	NEED_VMM();
	if (!flags || !location || location->type != LOCATION_DEVICE)
		return CUDA_ERROR_INVALID_VALUE;
	vdev_status st = vdev_get_access(location->id, ptr, &f);
	if (st == VDEV_OK)
		*flags = (unsigned long long)f;
	return vmm_result(st);
}

#ifndef VMSTANDIN_OMIT_EXPORT

API CUresult cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle handle, int type,
					  unsigned long long flags)
{
	vdev_ctx *ctx;
	int fd;
	ENTER(NULL);
	NEED_CTX(ctx);
	NEED_VMM();
	if (!shareable || type != HANDLE_POSIX_FD || flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	vdev_status st = vdev_export(handle, &fd);
	if (st == VDEV_OK)
		*(int *)shareable = fd;
	return vmm_result(st);
}

API CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *os_handle, int type)
{
	vdev_ctx *ctx;
	ENTER(NULL);
	NEED_CTX(ctx);
	NEED_VMM();
	if (!handle || type != HANDLE_POSIX_FD)
		return CUDA_ERROR_INVALID_VALUE;
	/* For POSIX descriptors the "pointer" is the descriptor's value. */
	return vmm_result(vdev_import((int)(intptr_t)os_handle, handle));
}

#endif /* VMSTANDIN_OMIT_EXPORT */
#endif /* VMSTANDIN_OMIT_VMM */

#ifndef VMSTANDIN_OMIT_DEVSYNC
/* cuCtxSynchronize waits for the work of every stream of the current
 * context, the default stream included; a stream's own failure stays with
 * it for cuStreamSynchronize (a sticky fault is every call's). */
API CUresult cuCtxSynchronize(void)
{
	vdev_ctx *ctx;
	ENTER(NULL);
	NEED_CTX(ctx);
	return rt_result(vdev_sync_device(ctx, false));
}
#endif /* VMSTANDIN_OMIT_DEVSYNC */

#ifndef VMSTANDIN_OMIT_MEMINFO
/* cuMemGetInfo_v2 answers for the current context's device: its capacity,
 * and what its live chunks leave of it. A real GPU counts every process's
 * memory (and its own reserve); each process's stand-in counts its own. */
API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
	vdev_ctx *ctx;
	ENTER(NULL);
	NEED_CTX(ctx);
	if (!free_bytes || !total)
		return CUDA_ERROR_INVALID_VALUE;
	uint64_t cap = vdev_config()->capacity;
	uint64_t used = vmstandin_used(vdev_ctx_device(ctx));
	*total = cap;
	*free_bytes = used < cap ? cap - used : 0;
	return CUDA_SUCCESS;
}
#endif /* VMSTANDIN_OMIT_MEMINFO */

/* ===== streams and asynchronous copies ===================================== */
#ifndef VMSTANDIN_OMIT_STREAMS

API CUresult cuStreamCreate(CUstream *stream, unsigned int flags)
{
	vdev_ctx *ctx;
	ENTER(NULL);
	NEED_CTX(ctx);
	if (!stream || (flags & ~(unsigned)STREAM_NON_BLOCKING))
		return CUDA_ERROR_INVALID_VALUE;
	return rt_result(vdev_stream_create(ctx, stream));
}

API CUresult cuStreamDestroy_v2(CUstream stream)
{
	vdev_ctx *ctx;
	ENTER(NULL);
	NEED_CTX(ctx);
	return rt_result(vdev_stream_destroy(stream));
}

API CUresult cuStreamSynchronize(CUstream stream)
{
	vdev_ctx *ctx;
	int raw = 0;
	ENTER(NULL);
	NEED_CTX(ctx);
	vdev_status st = vdev_stream_sync(ctx, stream, &raw);
	return result(st, false, raw);
}

API CUresult cuStreamQuery(CUstream stream)
{
	vdev_ctx *ctx;
	int raw = 0;
	ENTER(NULL);
	NEED_CTX(ctx);
	vdev_status st = vdev_stream_query(ctx, stream, &raw);
	return result(st, false, raw);
}

API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream stream)
{
	vdev_ctx *ctx;
	int exec;
	ENTER(&exec);
	NEED_CTX(ctx);
	if (!src && n)
		return CUDA_ERROR_INVALID_VALUE;
	return rt_result(vdev_enqueue_copy(ctx, stream, dst, true, (uint64_t)(uintptr_t)src, false, n, fault_of(exec)));
}

API CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream stream)
{
	vdev_ctx *ctx;
	int exec;
	ENTER(&exec);
	NEED_CTX(ctx);
	if (!dst && n)
		return CUDA_ERROR_INVALID_VALUE;
	return rt_result(vdev_enqueue_copy(ctx, stream, (uint64_t)(uintptr_t)dst, false, src, true, n, fault_of(exec)));
}

API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream)
{
	vdev_ctx *ctx;
	int exec;
	ENTER(&exec);
	NEED_CTX(ctx);
	return rt_result(vdev_enqueue_copy(ctx, stream, dst, true, src, true, n, fault_of(exec)));
}

API CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, CUstream stream)
{
	vdev_ctx *ctx;
	int exec;
	ENTER(&exec);
	NEED_CTX(ctx);
	return rt_result(vdev_enqueue_fill(ctx, stream, dst, value, n, fault_of(exec)));
}

#ifndef VMSTANDIN_OMIT_HOSTFUNC

API CUresult cuLaunchHostFunc(CUstream stream, void (*fn)(void *), void *user)
{
	vdev_ctx *ctx;
	int exec;
	ENTER(&exec);
	NEED_CTX(ctx);
	if (!fn)
		return CUDA_ERROR_INVALID_VALUE;
	return rt_result(vdev_enqueue_host_fn(ctx, stream, fn, user, fault_of(exec)));
}

#endif /* VMSTANDIN_OMIT_HOSTFUNC */
#endif /* VMSTANDIN_OMIT_STREAMS */

/* ===== events ============================================================== */
#ifndef VMSTANDIN_OMIT_EVENTS

API CUresult cuEventCreate(CUevent *event, unsigned int flags)
{
	vdev_ctx *ctx;
	ENTER(NULL);
	NEED_CTX(ctx);
	if (!event || (flags & ~(unsigned)EVENT_FLAGS))
		return CUDA_ERROR_INVALID_VALUE;
	return rt_result(vdev_event_create(ctx, event));
}

API CUresult cuEventRecord(CUevent event, CUstream stream)
{
	vdev_ctx *ctx;
	int exec;
	ENTER(&exec);
	NEED_CTX(ctx);
	return rt_result(vdev_event_record(ctx, event, stream, fault_of(exec)));
}

API CUresult cuEventSynchronize(CUevent event)
{
	vdev_ctx *ctx;
	ENTER(NULL);
	NEED_CTX(ctx);
	int raw = 0;
	/* CUDA reports a failure of the stream's work at the stream (or as
	 * a sticky fault), not at its events. */
	return result(vdev_event_sync(event, false, &raw), false, raw);
}

API CUresult cuEventQuery(CUevent event)
{
	vdev_ctx *ctx;
	ENTER(NULL);
	NEED_CTX(ctx);
	return rt_result(vdev_event_query(event));
}

API CUresult cuEventDestroy_v2(CUevent event)
{
	vdev_ctx *ctx;
	ENTER(NULL);
	NEED_CTX(ctx);
	return rt_result(vdev_event_destroy(event));
}

#endif /* VMSTANDIN_OMIT_EVENTS */

/* ===== synchronous copies ================================================== */
#ifndef VMSTANDIN_OMIT_SYNCCOPY

/* The synchronous copies run on the calling thread as the current context's
 * device. An access violation is reported (700) but, unlike an
 * asynchronous one, leaves the context usable: the stand-in lets a caller
 * probe access with them. */

API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
	vdev_ctx *ctx;
	int exec, raw = 0;
	ENTER(&exec);
	NEED_CTX(ctx);
	if (!src && n)
		return CUDA_ERROR_INVALID_VALUE;
	vdev_status st = vdev_copy(ctx, dst, true, (uint64_t)(uintptr_t)src, false, n, fault_of(exec), &raw);
	return result(st, false, raw);
}

API CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
	vdev_ctx *ctx;
	int exec, raw = 0;
	ENTER(&exec);
	NEED_CTX(ctx);
	if (!dst && n)
		return CUDA_ERROR_INVALID_VALUE;
	vdev_status st = vdev_copy(ctx, (uint64_t)(uintptr_t)dst, false, src, true, n, fault_of(exec), &raw);
	return result(st, false, raw);
}

#endif /* VMSTANDIN_OMIT_SYNCCOPY */

/* ===== peers =============================================================== */
#ifndef VMSTANDIN_OMIT_PEER

API CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer)
{
	bool ok;
	ENTER(NULL);
	NEED_INIT();
	if (!can)
		return CUDA_ERROR_INVALID_VALUE;
	vdev_status st = vdev_peer_can(dev, peer, &ok);
	if (st == VDEV_OK)
		*can = ok;
	return rt_result(st);
}

API CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags)
{
	vdev_ctx *ctx;
	ENTER(NULL);
	NEED_CTX(ctx);
	if (flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	switch (vdev_peer_enable(ctx, peer)) {
	case VDEV_OK:
		return CUDA_SUCCESS;
	case VDEV_NO_CONTEXT:
		return CUDA_ERROR_INVALID_CONTEXT;
	case VDEV_INVALID: /* the context's own device */
		return CUDA_ERROR_INVALID_DEVICE;
	case VDEV_NOT_SUPPORTED:
		return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
	case VDEV_ALREADY:
		return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
	default:
		return CUDA_ERROR_UNKNOWN;
	}
}

#endif /* VMSTANDIN_OMIT_PEER */

/* ===== pinned host memory ================================================== */
#ifndef VMSTANDIN_OMIT_HOSTALLOC

API CUresult cuMemHostAlloc(void **pp, size_t size, unsigned int flags)
{
	vdev_ctx *ctx;
	ENTER(NULL);
	NEED_CTX(ctx);
	if (!pp || (flags & ~(unsigned)HOST_ALLOC_FLAGS))
		return CUDA_ERROR_INVALID_VALUE;
	return rt_result(vdev_host_alloc(size, pp));
}

API CUresult cuMemFreeHost(void *p)
{
	vdev_ctx *ctx;
	ENTER(NULL);
	NEED_CTX(ctx);
	return rt_result(vdev_host_free(p));
}

#endif /* VMSTANDIN_OMIT_HOSTALLOC */
