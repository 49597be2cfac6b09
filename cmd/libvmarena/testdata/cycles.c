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
 *
 * It prints "ok" and exits 0 when every check holds; else a FAIL line.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "vmarena.h"

#define CHECK(cond, ...)                                                        \
	do {                                                                        \
		if (!(cond)) {                                                          \
			fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                \
			fprintf(stderr, __VA_ARGS__);                                       \
			fprintf(stderr, " (last error: %s)\n", vmarena_last_error());       \
			exit(1);                                                            \
		}                                                                       \
	} while (0)

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
	CHECK(vmarena_sleep("weights", mode) == sleep_code, "sleep weights, cycle %ld", c);
	if (sleep_code == VMARENA_ERR_UNSUPPORTED)
		CHECK(vmarena_last_error()[0] != '\0', "sleep's message");
	if (sleep_code == VMARENA_OK) {
		/* The memory went back: the host driver's memfd pages are gone. */
		long given = shmem - status_field("RssShmem: %ld kB");
		CHECK(given >= (long)(wsize / 1024) - 4, "cycle %ld: sleep gave back %ld KiB of %zu", c, given, wsize / 1024);
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
};

static struct snapshot take(void) {
	struct snapshot s = {count_fds(), count_maps(), count_lines("memfd:vmarena"), status_field("Threads: %ld"),
	                     rss_kib(), mallinfo2().uordblks};
	return s;
}

static void print(const char *when, struct snapshot s) {
	printf("%s: fds %d, mappings %d (vmarena memfd %d), threads %ld, rss %ld KiB, C heap %zu B\n", when, s.fds,
	       s.maps, s.memfd_maps, s.threads, s.rss_kib, s.heap);
}

int main(int argc, char **argv) {
	if (argc == 3 && strcmp(argv[1], "bench") == 0) return bench(atol(argv[2]));
	if (argc == 2 && strcmp(argv[1], "threads") == 0) return threads();
	CHECK(argc == 4 && strcmp(argv[1], "run") == 0, "usage: cycles run N SLEEP_CODE | cycles threads | cycles bench N");
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
		CHECK(after.memfd_maps == before.memfd_maps, "round %d: vmarena's memfd mappings went from %d to %d", round,
		      before.memfd_maps, after.memfd_maps);
		if (after.rss_kib - before.rss_kib < RSS_ROUND_KIB) rss_held = 1;
		if (after.threads == before.threads && after.maps == before.maps && after.heap <= before.heap) held++;
		else print("a round that changed", after);
	}
	print("after the warm-up round", first);
	print("after the last round", after);
	CHECK(held > 0, "every round changed the mappings or the C heap (or started a thread)");
	CHECK(rss_held && after.rss_kib - first.rss_kib < RSS_MAX_KIB, "resident memory grew from %ld to %ld KiB",
	      first.rss_kib, after.rss_kib);
	char *js = vmarena_stats_json();
	CHECK(js != NULL && strstr(js, "\"live\":1") == NULL, "allocations live after the cycles: %s", js);
	vmarena_free_string(js);
	CHECK(vmarena_shutdown() == VMARENA_OK, "shutdown");
	CHECK(count_fds() < after.fds, "shutdown closed no descriptor");
	CHECK(count_lines("memfd:vmarena") == 0, "vmarena's memfd still mapped after shutdown");
	printf("ok\n");
	return 0;
}
