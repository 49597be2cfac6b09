/*
 * gpucycles.c drives libvmarena on the cuda driver as PyTorch would, through
 * the CUDA driver API (libcuda.so.1, or $VMARENA_CUDA_LIBRARY, loaded with
 * dlopen: no CUDA header or toolkit is needed to build it):
 *
 *   gpucycles N MIB   with the device's primary context current on the
 *                     thread (PyTorch's), N cycles of: allocate MIB MiB
 *                     under "weights" and 16 MiB under "kv_cache", write
 *                     them (cuMemcpyHtoD), sleep the weights (host copy;
 *                     every 10th cycle a file), check that the device's
 *                     free memory (cuMemGetInfo) grew by what the tag held,
 *                     wake, read back (cuMemcpyDtoH) and compare, sleep
 *                     and wake the KV cache discarding, free. The device's
 *                     free memory must be the same after every cycle past
 *                     the first tenth, and the primary context current
 *                     after every call. Then: a context of the caller's own
 *                     (cuCtxCreate) is current again after every call; a
 *                     free waits for the work queued on its stream (the
 *                     stream still busy before vmarena_free, idle after);
 *                     after vmarena_shutdown the device's free memory is
 *                     what it was before the first allocation.
 *
 * It prints "ok" and exits 0 when every check holds; else a FAIL line. It
 * is for a machine with a GPU (go test ./cmd/libvmarena -run GPU builds and
 * runs it where one is); over the stand-in it runs too, without the free
 * memory checks (the stand-in has no cuMemGetInfo).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"


typedef int CUresult;
typedef uint64_t CUdeviceptr;
static struct {
	CUresult (*init)(unsigned);
	CUresult (*device_get)(int *, int);
	CUresult (*primary_retain)(void **, int);
	CUresult (*primary_release)(int);
	CUresult (*ctx_create)(void **, unsigned, int);
	CUresult (*ctx_destroy)(void *);
	CUresult (*ctx_get)(void **);
	CUresult (*ctx_set)(void *);
	CUresult (*htod)(CUdeviceptr, const void *, size_t);
	CUresult (*dtoh)(void *, CUdeviceptr, size_t);
	CUresult (*stream_create)(void **, unsigned);
	CUresult (*stream_destroy)(void *);
	CUresult (*stream_query)(void *);
	CUresult (*stream_sync)(void *);
	CUresult (*memset_async)(CUdeviceptr, unsigned char, size_t, void *);
	CUresult (*mem_info)(size_t *, size_t *); /* NULL where libcuda lacks it */
} cu;

static void *sym(void *h, const char *name, int need) {
	void *f = dlsym(h, name);
	CHECK(f != NULL || !need, "libcuda lacks %s", name);
	return f;
}

static void open_cuda(void) {
	const char *path = getenv("VMARENA_CUDA_LIBRARY");
	if (path == NULL || *path == '\0') path = "libcuda.so.1";
	void *h = dlopen(path, RTLD_NOW);
	CHECK(h != NULL, "dlopen %s: %s", path, dlerror());
	*(void **)&cu.init = sym(h, "cuInit", 1);
	*(void **)&cu.device_get = sym(h, "cuDeviceGet", 1);
	*(void **)&cu.primary_retain = sym(h, "cuDevicePrimaryCtxRetain", 1);
	*(void **)&cu.primary_release = sym(h, "cuDevicePrimaryCtxRelease_v2", 1);
	*(void **)&cu.ctx_create = sym(h, "cuCtxCreate_v2", 1);
	*(void **)&cu.ctx_destroy = sym(h, "cuCtxDestroy_v2", 1);
	*(void **)&cu.ctx_get = sym(h, "cuCtxGetCurrent", 1);
	*(void **)&cu.ctx_set = sym(h, "cuCtxSetCurrent", 1);
	*(void **)&cu.htod = sym(h, "cuMemcpyHtoD_v2", 1);
	*(void **)&cu.dtoh = sym(h, "cuMemcpyDtoH_v2", 1);
	*(void **)&cu.stream_create = sym(h, "cuStreamCreate", 1);
	*(void **)&cu.stream_destroy = sym(h, "cuStreamDestroy_v2", 1);
	*(void **)&cu.stream_query = sym(h, "cuStreamQuery", 1);
	*(void **)&cu.stream_sync = sym(h, "cuStreamSynchronize", 1);
	*(void **)&cu.memset_async = sym(h, "cuMemsetD8Async", 1);
	*(void **)&cu.mem_info = sym(h, "cuMemGetInfo_v2", 0);
}

static void *current(void) {
	void *c = (void *)1;
	CHECK(cu.ctx_get(&c) == 0, "cuCtxGetCurrent");
	return c;
}

/* device_free is the device's free memory, or 0 where it cannot be read. */
static size_t device_free(void) {
	size_t f = 0, t = 0;
	if (cu.mem_info == NULL) return 0;
	CHECK(cu.mem_info(&f, &t) == 0, "cuMemGetInfo_v2");
	return f;
}

/* device_total is the device's memory, or 0 where it cannot be read. */
static size_t device_total(void) {
	size_t f = 0, t = 0;
	if (cu.mem_info == NULL) return 0;
	CHECK(cu.mem_info(&f, &t) == 0, "cuMemGetInfo_v2");
	return t;
}

static void fill(unsigned char *h, size_t n, unsigned seed) {
	for (size_t i = 0; i < n; i++) h[i] = (unsigned char)(seed + i * 131 + (i >> 12));
}

static void put(void *p, const unsigned char *h, size_t n) {
	CHECK(cu.htod((CUdeviceptr)(uintptr_t)p, h, n) == 0, "cuMemcpyHtoD %zu bytes", n);
}

static int same(void *p, const unsigned char *want, unsigned char *scratch, size_t n) {
	CHECK(cu.dtoh(scratch, (CUdeviceptr)(uintptr_t)p, n) == 0, "cuMemcpyDtoH %zu bytes", n);
	return memcmp(scratch, want, n) == 0;
}

int main(int argc, char **argv) {
	CHECK(argc == 3, "usage: gpucycles N MIB");
	long cycles = atol(argv[1]);
	size_t wsize = (size_t)atol(argv[2]) * (1 << 20) + 123, ksize = 16 << 20;
	CHECK(cycles >= 10 && wsize > 123, "at least 10 cycles of at least 1 MiB");
	open_cuda();
	int dev;
	void *primary;
	CHECK(cu.init(0) == 0 && cu.device_get(&dev, 0) == 0, "cuInit, cuDeviceGet");
	CHECK(cu.primary_retain(&primary, dev) == 0 && cu.ctx_set(primary) == 0, "the primary context, as PyTorch has it");
	unsigned char *want = malloc(wsize), *got = malloc(wsize > ksize ? wsize : ksize), *kwant = malloc(ksize);
	CHECK(want && got && kwant, "malloc");
	size_t free0 = device_free(), settled = 0;
	printf("device free memory before: %zu MiB\n", free0 >> 20);

#define PRIMARY_AFTER(what) CHECK(current() == primary, "the primary context is not current after %s", what)
	for (long c = 0; c < cycles; c++) {
		fill(want, wsize, (unsigned)c);
		fill(kwant, ksize, (unsigned)c + 77);
		CHECK(vmarena_set_tag("weights") == VMARENA_OK, "set_tag");
		void *w = vmarena_alloc((ssize_t)wsize, 0, NULL);
		CHECK(w != NULL, "alloc weights, cycle %ld", c);
		PRIMARY_AFTER("vmarena_alloc");
		put(w, want, wsize);
		CHECK(vmarena_set_tag("kv_cache") == VMARENA_OK, "set_tag");
		void *k = vmarena_alloc((ssize_t)ksize, 0, NULL);
		CHECK(k != NULL, "alloc kv_cache, cycle %ld", c);
		put(k, kwant, ksize);

		int mode = c % 10 == 1 ? VMARENA_SLEEP_FILE : VMARENA_SLEEP_HOST;
		long awake = awake_bytes("weights");
		size_t before = device_free();
		CHECK(vmarena_sleep("weights", mode) == VMARENA_OK, "sleep weights, cycle %ld", c);
		PRIMARY_AFTER("vmarena_sleep");
		size_t after = device_free();
		CHECK(cu.mem_info == NULL || (awake >= (long)wsize && after >= before + (size_t)awake),
		      "cycle %ld: the device's free memory went from %zu to %zu bytes; the tag held %ld", c, before, after,
		      awake);
		CHECK(vmarena_wake("weights") == VMARENA_OK, "wake weights, cycle %ld", c);
		PRIMARY_AFTER("vmarena_wake");
		CHECK(same(w, want, got, wsize), "the weights' bytes after sleep and wake, cycle %ld", c);
		CHECK(same(k, kwant, got, ksize), "the KV cache's bytes after the weights' sleep and wake, cycle %ld", c);
		CHECK(vmarena_sleep("kv_cache", VMARENA_SLEEP_DISCARD) == VMARENA_OK, "sleep kv_cache");
		CHECK(vmarena_wake("kv_cache") == VMARENA_OK, "wake kv_cache");
		vmarena_free(w, wsize, 0, NULL);
		PRIMARY_AFTER("vmarena_free");
		vmarena_free(k, ksize, 0, NULL);
		size_t now = device_free();
		if (c + 1 == cycles / 10) settled = now;
		CHECK(c < cycles / 10 || now == settled, "cycle %ld: the device's free memory is %zu bytes, %zu after the first tenth",
		      c, now, settled);
	}
	printf("%ld cycles of %zu MiB: the device's free memory settled at %zu MiB and stayed\n", cycles, wsize >> 20,
	       settled >> 20);

	/* A context of the caller's own. */
	void *own = NULL;
	CHECK(cu.ctx_create(&own, 0, dev) == 0 && current() == own, "cuCtxCreate_v2");
#define OWN_AFTER(what) CHECK(current() == own, "the caller's own context is not current after %s", what)
	CHECK(vmarena_set_tag("weights") == VMARENA_OK, "set_tag");
	void *w = vmarena_alloc((ssize_t)wsize, 0, NULL);
	CHECK(w != NULL, "alloc");
	OWN_AFTER("vmarena_alloc");
	CHECK(vmarena_sleep("weights", VMARENA_SLEEP_HOST) == VMARENA_OK, "sleep");
	OWN_AFTER("vmarena_sleep");
	CHECK(vmarena_wake("weights") == VMARENA_OK, "wake");
	OWN_AFTER("vmarena_wake");
	vmarena_free(w, wsize, 0, NULL);
	OWN_AFTER("vmarena_free");
	CHECK(cu.ctx_destroy(own) == 0, "cuCtxDestroy_v2");
	CHECK(cu.ctx_set(primary) == 0, "cuCtxSetCurrent");
	printf("a context of the caller's own stayed current\n");

	/* A free waits for its stream: the stream is made busy (memsets over
	 * a scratch allocation, then one over the memory to free), is still
	 * busy before vmarena_free, and must be idle when it returns. */
	void *s;
	CHECK(cu.stream_create(&s, 1) == 0, "cuStreamCreate");
	/* A GPU's memsets are fast: 256 MiB of them keep its stream busy; the
	 * stand-in's device (under 1 GiB) is memory of this process, and its
	 * library's allocator a small one. */
	const size_t scratch = device_total() >= (size_t)1 << 30 ? (size_t)256 << 20 : (size_t)16 << 20, psize = 2 << 20;
	CHECK(vmarena_set_tag("scratch") == VMARENA_OK, "set_tag");
	void *b = vmarena_alloc((ssize_t)scratch, 0, s), *p = vmarena_alloc((ssize_t)psize, 0, s);
	CHECK(b != NULL && p != NULL, "alloc on the stream");
	int busy = 0;
	for (int round = 0; round < 6 && !busy; round++) {
		int n = 50 << round;
		for (int i = 0; i < n; i++)
			CHECK(cu.memset_async((CUdeviceptr)(uintptr_t)b, (unsigned char)i, scratch, s) == 0, "cuMemsetD8Async");
		CHECK(cu.memset_async((CUdeviceptr)(uintptr_t)p, 7, psize, s) == 0, "cuMemsetD8Async");
		CUresult q = cu.stream_query(s);
		CHECK(q == 0 || q == 600, "cuStreamQuery: %d", q);
		if (q == 600) {
			busy = 1;
			vmarena_free(p, psize, 0, s);
			CHECK(cu.stream_query(s) == 0, "vmarena_free returned with %d memsets of %zu MiB queued on its stream unfinished",
			      n, scratch >> 20);
			printf("vmarena_free waited for %d memsets of %zu MiB on its stream\n", n, scratch >> 20);
		} else {
			CHECK(cu.stream_sync(s) == 0, "cuStreamSynchronize");
		}
	}
	CHECK(busy, "the stream never stayed busy long enough to test");
	vmarena_free(b, scratch, 0, s);
	CHECK(cu.stream_destroy(s) == 0, "cuStreamDestroy");

	CHECK(vmarena_shutdown() == VMARENA_OK, "shutdown");
	PRIMARY_AFTER("vmarena_shutdown");
	size_t end = device_free();
	CHECK(cu.mem_info == NULL || end == free0, "the device's free memory is %zu bytes after shutdown, %zu before", end,
	      free0);
	CHECK(cu.primary_release(dev) == 0, "cuDevicePrimaryCtxRelease");
	printf("ok\n");
	return 0;
}
