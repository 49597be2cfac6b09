/*
 * cycles.c drives libvmarena as a C program would, through vmarena.h:
 *
 *   cycles run N SLEEP_CODE   N cycles of tag, alloc, write, sleep, wake,
 *                             read back, bad calls, stats, free; then checks
 *                             that file descriptors, mappings, the C heap and
 *                             resident memory did not grow after the first
 *                             cycles, and shuts the library down. SLEEP_CODE
 *                             is what vmarena_sleep and vmarena_wake must
 *                             return (0 where the driver can keep the
 *                             mode, VMARENA_ERR_UNSUPPORTED where not).
 *   cycles threads            four threads allocate under tags of their
 *                             own and fail calls of their own at once: each
 *                             allocation lands under its thread's tag, and
 *                             each thread reads its own last error.
 *   cycles bench N            times N vmarena_alloc + vmarena_free of a size
 *                             the library holds committed (no driver call)
 *                             and prints "ns/op X".
 *   cycles context            (the CUDA stand-in) a context of the caller's
 *                             own is current again after every call, and a
 *                             thread with none is left the primary context.
 *   cycles stream             (the CUDA stand-in) vmarena_free waits for the
 *                             work queued on its stream before it frees, and
 *                             a stream it cannot wait for frees nothing.
 *
 * On the host driver (the default) "given back" is the process's shared
 * resident memory (the host driver's memfd pages). With
 * VMARENA_TEST_STANDIN naming the stand-in library that VMARENA_DRIVER=cuda
 * or acl loads (driver/internal/standin), it is the emulated device's used
 * bytes (vmstandin_used), the stand-in's own memfd mappings are the ones
 * that must not grow, and after vmarena_shutdown it must hold nothing. The
 * stand-in's device memory is process memory, so this program writes and
 * reads it directly, as it could not on a GPU.
 * It prints "ok" and exits 0 when every check holds; else a FAIL line.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <stdint.h>
#include <unistd.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"


/* The stand-in's test interface and CUDA context calls, when
 * VMARENA_TEST_STANDIN names it (NULL otherwise). */
static struct {
	uint64_t (*used)(int dev);
	int64_t (*live)(const char *what);
	int (*hold)(int dev);
	void (*release)(void);
	uint64_t (*held)(void);
	int (*init)(unsigned flags);
	int (*ctx_create)(void **ctx, unsigned flags, int dev);
	int (*ctx_destroy)(void *ctx);
	int (*ctx_get)(void **ctx);
	int (*ctx_set)(void *ctx);
} sti;
static int standin;

static void *sym(void *h, const char *name) {
	void *f = dlsym(h, name);
	CHECK(f != NULL, "the stand-in lacks %s", name);
	return f;
}

/* open_standin loads the stand-in (the same instance the library's driver
 * loads: the loader opens a path once) and binds its calls. */
static void open_standin(void) {
	const char *path = getenv("VMARENA_TEST_STANDIN");
	if (path == NULL || *path == '\0') return;
	void *h = dlopen(path, RTLD_NOW);
	CHECK(h != NULL, "dlopen %s: %s", path, dlerror());
	standin = 1;
	*(void **)&sti.used = sym(h, "vmstandin_used");
	*(void **)&sti.live = sym(h, "vmstandin_live");
	*(void **)&sti.hold = sym(h, "vmstandin_hold");
	*(void **)&sti.release = sym(h, "vmstandin_release");
	*(void **)&sti.held = sym(h, "vmstandin_held");
	if (dlsym(h, "cuCtxCreate_v2") != NULL) {
		*(void **)&sti.init = sym(h, "cuInit");
		*(void **)&sti.ctx_create = sym(h, "cuCtxCreate_v2");
		*(void **)&sti.ctx_destroy = sym(h, "cuCtxDestroy_v2");
		*(void **)&sti.ctx_get = sym(h, "cuCtxGetCurrent");
		*(void **)&sti.ctx_set = sym(h, "cuCtxSetCurrent");
	}
}

/* memfd_name is what names the memory mappings of the driver's memory. */
static const char *memfd_name(void) { return standin ? "memfd:vmstandin" : "memfd:vmarena"; }

static int count_fds(void) {
	DIR *d = opendir("/proc/self/fd");
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL)
		if (e->d_name[0] != '.') n++;
	closedir(d);
	return n - 1; /* the directory itself */
}

/*
 * count_maps counts the process's mappings but the anonymous read-write
 * ones: those are the heaps of C, Go and the thread stacks, which grow and
 * split on their own; none is vmarena's (its reservations are anonymous
 * PROT_NONE, its memory is its memfd's).
 */
static int count_maps(void) {
	FILE *f = fopen("/proc/self/maps", "r");
	char line[4096], perms[8];
	int n = 0, rest = 0;
	while (fgets(line, sizeof line, f)) {
		if (sscanf(line, "%*s %7s %*s %*s %*s %n", perms, &rest) < 1) continue;
		const char *path = line + rest;
		int anon = *path == '\0' || *path == '\n' || *path == '[';
		if (!(anon && strcmp(perms, "rw-p") == 0)) n++;
	}
	fclose(f);
	return n;
}

/* count_lines counts the lines of /proc/self/maps that contain what. */
static int count_lines(const char *what) {
	FILE *f = fopen("/proc/self/maps", "r");
	char line[4096];
	int n = 0;
	while (fgets(line, sizeof line, f))
		if (strstr(line, what) != NULL) n++;
	fclose(f);
	return n;
}

static long status_field(const char *fmt) {
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long v = -1;
	while (fgets(line, sizeof line, f))
		if (sscanf(line, fmt, &v) == 1) break;
	fclose(f);
	return v;
}

static long rss_kib(void) {
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long kib = -1;
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "VmRSS: %ld kB", &kib) == 1) break;
	fclose(f);
	return kib;
}

static void fill(unsigned char *p, size_t n, unsigned seed) {
	for (size_t i = 0; i < n; i += 4096) p[i] = (unsigned char)(seed + i / 4096);
	p[n - 1] = (unsigned char)(seed * 7);
}

static int same(const unsigned char *p, size_t n, unsigned seed) {
	for (size_t i = 0; i < n; i += 4096)
		if (p[i] != (unsigned char)(seed + i / 4096)) return 0;
	return p[n - 1] == (unsigned char)(seed * 7);
}

static double now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int bench(long n) {
	const ssize_t size = 1 << 20;
	CHECK(vmarena_set_tag(NULL) == VMARENA_OK, "set_tag(NULL)");
	for (int i = 0; i < 100; i++) { /* warm: the chunk stays committed */
		void *p = vmarena_alloc(size, 0, NULL);
		CHECK(p != NULL, "warm alloc");
		vmarena_free(p, size, 0, NULL);
	}
	double t0 = now_ns();
	for (long i = 0; i < n; i++) {
		void *p = vmarena_alloc(size, 0, NULL);
		if (p == NULL) CHECK(0, "alloc %ld", i);
		vmarena_free(p, size, 0, NULL);
	}
	double dt = now_ns() - t0;
	printf("ns/op %.1f\n", dt / n);
	CHECK(vmarena_shutdown() == VMARENA_OK, "shutdown");
	printf("ok\n");
	return 0;
}

static long free_errors(void) {
	char *js = vmarena_stats_json();
	CHECK(js != NULL, "stats_json");
	const char *k = strstr(js, "\"free_errors\":");
	CHECK(k != NULL, "no free_errors in %s", js);
	long n = strtol(k + strlen("\"free_errors\":"), NULL, 10);
	vmarena_free_string(js);
	return n;
}

/* cycle runs cycle c: see the top of the file. ferr0 is the count of
 * failed frees the library reported before the first cycle. */
static void cycle(long c, int sleep_code, long *ferr0) {
	const size_t wsize = 3 * (1 << 20) + 123, ksize = 1 << 20;
	unsigned seed = (unsigned)c;
	CHECK(vmarena_set_tag("weights") == VMARENA_OK, "set_tag weights");
	unsigned char *w = vmarena_alloc((ssize_t)wsize, 0, NULL);
	CHECK(w != NULL, "alloc weights, cycle %ld", c);
	fill(w, wsize, seed);
	CHECK(vmarena_set_tag("kv_cache") == VMARENA_OK, "set_tag kv_cache");
	unsigned char *k = vmarena_alloc((ssize_t)ksize, 0, NULL);
	CHECK(k != NULL, "alloc kv_cache, cycle %ld", c);
	fill(k, ksize, seed + 1);
	CHECK(same(w, wsize, seed), "weights changed by the kv_cache allocation, cycle %ld", c);

	/* Weights sleep with a copy in host memory; every 50th cycle in a file
	 * (which costs a write and a read of the file). */
	int mode = c % 50 == 1 ? VMARENA_SLEEP_FILE : VMARENA_SLEEP_HOST;
	long shmem = status_field("RssShmem: %ld kB");
	long awake = awake_bytes("weights");
	uint64_t used = standin ? sti.used(0) : 0;
	CHECK(vmarena_sleep("weights", mode) == sleep_code, "sleep weights, cycle %ld", c);
	if (sleep_code == VMARENA_ERR_UNSUPPORTED)
		CHECK(vmarena_last_error()[0] != '\0', "sleep's message");
	if (sleep_code == VMARENA_OK) {
		if (standin) {
			/* The memory went back to the device: all the tag held. */
			uint64_t now = sti.used(0);
			CHECK(awake >= (long)wsize && now + (uint64_t)awake == used,
			      "cycle %ld: the device used %llu bytes before the sleep and %llu after; the tag held %ld", c,
			      (unsigned long long)used, (unsigned long long)now, awake);
		} else {
			/* The memory went back: the host driver's memfd pages are gone. */
			long given = shmem - status_field("RssShmem: %ld kB");
			CHECK(given >= (long)(wsize / 1024) - 4, "cycle %ld: sleep gave back %ld KiB of %zu", c, given,
			      wsize / 1024);
		}
		char *js = vmarena_stats_json();
		CHECK(js != NULL, "stats_json");
		const char *at = strstr(js, "\"tag\":\"weights\",\"live\":1,\"asleep\":true,");
		CHECK(at != NULL && strstr(at, "\"awake_bytes\":0,") != NULL &&
		          strstr(at, "\"awake_bytes\":0,") < strchr(at, '}'),
		      "weights' stats asleep: %s", js);
		vmarena_free_string(js);
		CHECK(vmarena_set_tag("weights") == VMARENA_OK, "set_tag weights");
		CHECK(vmarena_alloc(4096, 0, NULL) == NULL, "alloc under a sleeping tag");
		CHECK(strstr(vmarena_last_error(), "weights") != NULL, "the busy alloc's message names the tag");
	}
	CHECK(vmarena_sleep("weights", mode) == sleep_code, "sleep again, cycle %ld", c);
	CHECK(vmarena_wake("weights") == sleep_code, "wake weights, cycle %ld", c);
	CHECK(vmarena_wake("weights") == sleep_code, "wake again, cycle %ld", c);
	CHECK(same(w, wsize, seed), "weights after sleep and wake, cycle %ld", c);
	CHECK(same(k, ksize, seed + 1), "kv_cache after weights' sleep and wake, cycle %ld", c);
	/* The KV cache sleeps discarding, and is written again after. */
	CHECK(vmarena_sleep("kv_cache", VMARENA_SLEEP_DISCARD) == sleep_code, "sleep kv_cache, cycle %ld", c);
	CHECK(vmarena_wake("kv_cache") == sleep_code, "wake kv_cache, cycle %ld", c);
	fill(k, ksize, seed + 1);
	CHECK(vmarena_sleep("no such tag", VMARENA_SLEEP_HOST) == VMARENA_ERR_INVALID, "sleep of a tag never allocated");

	/* Bad calls: an error code or NULL, a message, nothing changed. */
	CHECK(vmarena_alloc(-1, 0, NULL) == NULL, "alloc(-1)");
	CHECK(strstr(vmarena_last_error(), "alloc of -1 bytes") != NULL, "alloc(-1)'s message");
	CHECK(vmarena_alloc(4096, 9, NULL) == NULL, "alloc on device 9");
	vmarena_free(w + 1, 0, 0, NULL);
	CHECK(strstr(vmarena_last_error(), "free") != NULL, "free(w+1)'s message");
	vmarena_free(w, wsize - 1, 0, NULL);
	CHECK(strstr(vmarena_last_error(), "allocated with") != NULL, "free with a wrong size's message");
	CHECK(vmarena_sleep(NULL, 7) == VMARENA_ERR_INVALID, "sleep mode 7");
	CHECK(vmarena_set_tag("bad\ttag") == VMARENA_ERR_INVALID, "a tag with a tab");
	CHECK(vmarena_shutdown() == VMARENA_ERR_BUSY, "shutdown while allocations live");
	{ long fe = free_errors(); CHECK(fe == *ferr0 + 2 * (c + 1), "free_errors is %ld, want %ld", fe, *ferr0 + 2 * (c + 1)); }
	CHECK(same(w, wsize, seed) && same(k, ksize, seed + 1), "contents after the bad calls");

	char *js = vmarena_stats_json();
	CHECK(js != NULL && strstr(js, "\"tag\":\"weights\",\"live\":1") != NULL, "stats: %s", js ? js : "NULL");
	vmarena_free_string(js);

	vmarena_free(w, wsize, 0, NULL);
	vmarena_free(k, 0, 0, NULL);
	CHECK(free_errors() == *ferr0 + 2 * (c + 1), "the good frees failed");
	vmarena_free(w, wsize, 0, NULL); /* twice: refused */
	CHECK(strstr(vmarena_last_error(), "not a live allocation") != NULL, "double free's message");
	(*ferr0)++;                       /* ... and counted */
	vmarena_free(NULL, 0, 0, NULL);   /* nothing */
}

enum { nthreads = 4, per_thread = 10 };
static pthread_barrier_t barrier;

/* tagged allocates under tag "thread<i>" (i in arg), fails a call that
 * names i, and checks its own last error after every thread has failed. */
static void *tagged(void *arg) {
	long i = (long)arg;
	char tag[32];
	snprintf(tag, sizeof tag, "thread%ld", i);
	CHECK(vmarena_set_tag(tag) == VMARENA_OK, "set_tag %s", tag);
	void *p[per_thread];
	for (int k = 0; k < per_thread; k++) {
		p[k] = vmarena_alloc((ssize_t)(i + 1) * 4096, 0, NULL);
		CHECK(p[k] != NULL, "%s: alloc %d", tag, k);
	}
	CHECK(vmarena_alloc(-(ssize_t)(i + 1), 0, NULL) == NULL, "%s: alloc of a negative size", tag);
	pthread_barrier_wait(&barrier); /* every thread has failed its call */
	char want[64];
	snprintf(want, sizeof want, "alloc of %ld bytes", -(i + 1));
	CHECK(strstr(vmarena_last_error(), want) != NULL, "%s reads another thread's error: %s", tag,
	      vmarena_last_error());
	pthread_barrier_wait(&barrier); /* main checks the stats */
	pthread_barrier_wait(&barrier);
	for (int k = 0; k < per_thread; k++) vmarena_free(p[k], (size_t)(i + 1) * 4096, 0, NULL);
	return NULL;
}

static int threads(void) {
	pthread_t th[nthreads];
	pthread_barrier_init(&barrier, NULL, nthreads + 1);
	CHECK(vmarena_set_tag("main") == VMARENA_OK, "set_tag main");
	for (long i = 0; i < nthreads; i++) CHECK(pthread_create(&th[i], NULL, tagged, (void *)i) == 0, "pthread_create");
	pthread_barrier_wait(&barrier);
	CHECK(strcmp(vmarena_last_error(), "") == 0, "the main thread reads a thread's error: %s", vmarena_last_error());
	pthread_barrier_wait(&barrier);
	char *js = vmarena_stats_json();
	CHECK(js != NULL, "stats_json");
	for (long i = 0; i < nthreads; i++) {
		char want[128];
		snprintf(want, sizeof want, "\"tag\":\"thread%ld\",\"live\":%d,\"asleep\":false,\"mode\":\"discard\",\"awake_bytes\":",
		         i, per_thread);
		const char *at = strstr(js, want);
		CHECK(at != NULL, "want %s in %s", want, js);
		/* The memory committed under the tag: at least what it allocated. */
		long awake = strtol(at + strlen(want), NULL, 10);
		CHECK(awake >= per_thread * (i + 1) * 4096, "thread%ld: awake_bytes %ld", i, awake);
	}
	CHECK(strstr(js, "\"tag\":\"main\"") == NULL, "the main thread allocated nothing: %s", js);
	vmarena_free_string(js);
	pthread_barrier_wait(&barrier);
	for (int i = 0; i < nthreads; i++) pthread_join(th[i], NULL);
	js = vmarena_stats_json();
	CHECK(js != NULL && strstr(js, "\"free_errors\":0") != NULL && strstr(js, "\"live\":1") == NULL, "after the frees: %s", js);
	vmarena_free_string(js);
	CHECK(vmarena_shutdown() == VMARENA_OK, "shutdown");
	printf("ok\n");
	return 0;
}

/* snapshot is what the process holds that the library could leak. */
struct snapshot {
	int fds, maps, memfd_maps;
	long threads, rss_kib;
	size_t heap;
	/* On a stand-in: the device's used bytes and the objects it holds. */
	uint64_t used;
	int64_t objects;
};

static struct snapshot take(void) {
	struct snapshot s = {count_fds(), count_maps(), count_lines(memfd_name()), status_field("Threads: %ld"),
	                     rss_kib(), mallinfo2().uordblks, 0, 0};
	if (standin) {
		s.used = sti.used(0);
		s.objects = sti.live("reservations") + sti.live("allocations") + sti.live("mappings") +
		            sti.live("streams") + sti.live("events") + sti.live("hostallocs");
	}
	return s;
}

static void print(const char *when, struct snapshot s) {
	printf("%s: fds %d, mappings %d (driver memfd %d), threads %ld, rss %ld KiB, C heap %zu B\n", when, s.fds,
	       s.maps, s.memfd_maps, s.threads, s.rss_kib, s.heap);
}

/* current is the calling thread's current CUDA context. */
static void *current(void) {
	void *cur = (void *)1;
	CHECK(sti.ctx_get(&cur) == 0, "cuCtxGetCurrent");
	return cur;
}

/* contexts: every call leaves the caller's context current. */
static int contexts(void) {
	CHECK(standin && sti.ctx_create != NULL, "cycles context needs VMARENA_TEST_STANDIN naming the CUDA stand-in");
	void *own = NULL;
	CHECK(sti.init(0) == 0, "cuInit");
	CHECK(sti.ctx_create(&own, 0, 0) == 0 && own != NULL && current() == own, "cuCtxCreate_v2");
	const size_t size = 3 << 20;
#define OWN_AFTER(what) CHECK(current() == own, "the caller's context is not current after %s", what)
	CHECK(vmarena_set_tag("weights") == VMARENA_OK, "set_tag");
	OWN_AFTER("vmarena_set_tag");
	unsigned char *p = vmarena_alloc((ssize_t)size, 0, NULL);
	CHECK(p != NULL, "alloc");
	OWN_AFTER("vmarena_alloc (the first: it opens the driver)");
	fill(p, size, 7);
	CHECK(vmarena_sleep("weights", VMARENA_SLEEP_HOST) == VMARENA_OK, "sleep");
	OWN_AFTER("vmarena_sleep");
	CHECK(vmarena_wake("weights") == VMARENA_OK, "wake");
	OWN_AFTER("vmarena_wake");
	CHECK(same(p, size, 7), "the bytes after sleep and wake");
	char *js = vmarena_stats_json();
	CHECK(js != NULL, "stats");
	vmarena_free_string(js);
	OWN_AFTER("vmarena_stats_json");
	CHECK(vmarena_alloc(-1, 0, NULL) == NULL, "alloc(-1)");
	OWN_AFTER("a failed vmarena_alloc");
	vmarena_free(p + 1, 0, 0, NULL);
	OWN_AFTER("a failed vmarena_free");
	unsigned char *q = vmarena_alloc(4096, 0, NULL);
	CHECK(q != NULL, "alloc");
	OWN_AFTER("vmarena_alloc");
	vmarena_free(q, 4096, 0, NULL);
	OWN_AFTER("vmarena_free");
	vmarena_free(p, size, 0, NULL);
	OWN_AFTER("vmarena_free");
	CHECK(vmarena_shutdown() == VMARENA_OK, "shutdown");
	OWN_AFTER("vmarena_shutdown");
#undef OWN_AFTER
	CHECK(sti.ctx_destroy(own) == 0 && current() == NULL, "cuCtxDestroy_v2");

	/* A thread with no context current is left the device's primary
	 * context (the driver's), as the CUDA runtime leaves it. */
	void *r = vmarena_alloc(4096, 0, NULL);
	CHECK(r != NULL, "alloc with no context current");
	void *primary = current();
	CHECK(primary != NULL, "no context current after a call on a thread that had none");
	vmarena_free(r, 4096, 0, NULL);
	CHECK(current() == primary, "the primary context changed");
	CHECK(vmarena_shutdown() == VMARENA_OK, "shutdown");
	printf("ok\n");
	return 0;
}

/* releaser lets the held work run after a pause. */
static void *releaser(void *arg) {
	(void)arg;
	struct timespec ts = {0, 200 * 1000 * 1000};
	nanosleep(&ts, NULL);
	sti.release();
	return NULL;
}

/* streams: vmarena_free waits for its stream's work. The stand-in holds
 * work on the default stream of device 0's primary context (PyTorch's
 * default stream: cudaStream_t 0) until another thread releases it, 200 ms
 * later; a free that did not wait would return with the work unfinished (a
 * machine slow enough could make this miss such a bug, never fail a right
 * one). */
static int streams(void) {
	CHECK(standin && sti.ctx_create != NULL, "cycles stream needs VMARENA_TEST_STANDIN naming the CUDA stand-in");
	const size_t size = 1 << 20;
	unsigned char *p = vmarena_alloc((ssize_t)size, 0, NULL);
	CHECK(p != NULL, "alloc");
	fill(p, size, 3);
	long ferr = free_errors();

	/* A stream the driver cannot wait for (no such stream): nothing is
	 * freed, the message says why, the failure is counted. */
	vmarena_free(p, size, 0, (cudaStream_t)(uintptr_t)0xdead0);
	CHECK(strstr(vmarena_last_error(), "stream 0xdead0") != NULL, "the message names the stream");
	CHECK(free_errors() == ferr + 1, "the failed free is counted");
	CHECK(same(p, size, 3), "the memory after a failed free");

	CHECK(sti.hold(0) == 0, "vmstandin_hold");
	uint64_t held = sti.held();
	pthread_t th;
	CHECK(pthread_create(&th, NULL, releaser, NULL) == 0, "pthread_create");
	vmarena_free(p, size, 0, NULL);
	CHECK(sti.held() == held + 1, "vmarena_free returned before the work on its stream had run");
	CHECK(free_errors() == ferr + 1, "the free failed");
	pthread_join(th, NULL);
	CHECK(vmarena_shutdown() == VMARENA_OK, "shutdown");
	printf("ok\n");
	return 0;
}

int main(int argc, char **argv) {
	open_standin();
	if (argc == 3 && strcmp(argv[1], "bench") == 0) return bench(atol(argv[2]));
	if (argc == 2 && strcmp(argv[1], "threads") == 0) return threads();
	if (argc == 2 && strcmp(argv[1], "context") == 0) return contexts();
	if (argc == 2 && strcmp(argv[1], "stream") == 0) return streams();
	CHECK(argc == 4 && strcmp(argv[1], "run") == 0,
	      "usage: cycles run N SLEEP_CODE | cycles threads | cycles bench N | cycles context | cycles stream");
	long cycles = atol(argv[2]);
	int sleep_code = atoi(argv[3]);
	long ferr0 = free_errors();
	CHECK(strcmp(vmarena_last_error(), "") == 0, "a fresh thread has no error");
	CHECK(cycles >= 10, "at least 10 cycles");

	/*
	 * A round of cycles/5 warms the library and the runtimes up (the Go
	 * heap and resident memory grow to a plateau in it), then eight rounds
	 * share the rest: the more rounds, the more chances of a quiet one on
	 * a loaded machine, and a leak shows in all of them. Each after the
	 * first must leave the process with the file descriptors and vmarena
	 * memfd mappings it had before it; and, as internal/leakcheck judges,
	 * at least one must leave it with the same mappings and C heap too:
	 * the runtimes map memory of their own now and then (a thread the Go
	 * runtime starts brings its stack, so a round in which the thread
	 * count changed proves nothing), while a leak shows in every round.
	 */
	/* Resident memory: a leak grows it in every round (a leaked backup by
	 * megabytes a cycle), while the Go runtime's heap, whose garbage
	 * collector falls behind on a loaded machine, may grow it by a few
	 * megabytes in one round and then stops. So some round must grow it by
	 * less than RSS_ROUND_KIB, and the whole run by less than RSS_MAX_KIB. */
	enum { RSS_ROUND_KIB = 512, RSS_MAX_KIB = 64 * 1024 };
	enum { ROUNDS = 9 };
	long warm = cycles / 5, per = (cycles - warm) / (ROUNDS - 1), c = 0;
	int held = 0, rss_held = 0;
	struct snapshot first = {0}, before, after;
	for (int round = 0; round < ROUNDS; round++) {
		before = take();
		if (round == 1) first = before;
		long end = round == 0 ? warm : round == ROUNDS - 1 ? cycles : c + per;
		for (; c < end; c++) cycle(c, sleep_code, &ferr0);
		after = take();
		if (round == 0) continue;
		CHECK(after.fds == before.fds, "round %d: file descriptors went from %d to %d", round, before.fds, after.fds);
		CHECK(after.memfd_maps == before.memfd_maps, "round %d: the driver's memfd mappings went from %d to %d", round,
		      before.memfd_maps, after.memfd_maps);
		CHECK(after.used == before.used && after.objects == before.objects,
		      "round %d: the device's used bytes went from %llu to %llu, the stand-in's objects from %lld to %lld",
		      round, (unsigned long long)before.used, (unsigned long long)after.used, (long long)before.objects,
		      (long long)after.objects);
		if (after.rss_kib - before.rss_kib < RSS_ROUND_KIB) rss_held = 1;
		if (after.threads == before.threads && after.maps == before.maps && after.heap <= before.heap) held++;
		else print("a round that changed", after);
	}
	print("after the warm-up round", first);
	print("after the last round", after);
	CHECK(held > 0, "every round changed the mappings or the C heap (or started a thread)");
	/* On a stand-in the run is short (100 cycles, the warm-up 20) and the
	 * device's own books judge it exactly (used bytes and objects, every
	 * round, above); resident memory there must still hold in some round,
	 * which a leaked backup never lets it, but the whole run's bound is
	 * left out: a file-mode sleep's 64 MiB staging buffer (the sleep
	 * package's) lifts the Go heap by 64 MiB once after so short a warm-up,
	 * as the 1,000 host cycles' longer warm-up absorbs. */
	CHECK(rss_held && (standin || after.rss_kib - first.rss_kib < RSS_MAX_KIB), "resident memory grew from %ld to %ld KiB",
	      first.rss_kib, after.rss_kib);
	char *js = vmarena_stats_json();
	CHECK(js != NULL && strstr(js, "\"live\":1") == NULL, "allocations live after the cycles: %s", js);
	vmarena_free_string(js);
	CHECK(vmarena_shutdown() == VMARENA_OK, "shutdown");
	if (standin) {
		/* The device's descriptors are the stand-in's, as the real
		 * driver's are, for the process's life: what must go is what
		 * the library held on the device. */
		CHECK(sti.used(0) == 0, "the device still uses %llu bytes after shutdown", (unsigned long long)sti.used(0));
		CHECK(sti.live("reservations") == 0 && sti.live("allocations") == 0 && sti.live("mappings") == 0 &&
		          sti.live("streams") == 0 && sti.live("hostallocs") == 0 && sti.live("contexts") == 0,
		      "the stand-in still holds, after shutdown, %lld allocations, %lld mappings, %lld reservations, "
		      "%lld contexts", (long long)sti.live("allocations"), (long long)sti.live("mappings"),
		      (long long)sti.live("reservations"), (long long)sti.live("contexts"));
	} else {
		CHECK(count_fds() < after.fds, "shutdown closed no descriptor");
	}
	CHECK(count_lines(memfd_name()) == 0, "the driver's memfd still mapped after shutdown");
	printf("ok\n");
	return 0;
}
