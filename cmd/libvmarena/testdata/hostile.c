/*
 * hostile.c calls libvmarena as a careless or hostile C caller would, and
 * checks that each bad call is refused with its code and a message, the
 * process alive:
 *
 *   hostile tags   tags without a terminator in reach: a string of
 *                  non-NUL bytes that ends at an unmapped page, passed to
 *                  vmarena_set_tag, vmarena_sleep and vmarena_wake.
 *   hostile strings vmarena_free_string of a string freed already, of one
 *                  the library never returned and of an interior pointer.
 *   hostile empty  vmarena_sleep and vmarena_wake of "": the default tag,
 *                  as vmarena_set_tag has it, not every tag as NULL is.
 *   hostile calls  calls before the first allocation and after shutdown,
 *                  shutdown twice, sizes at the ends of their types,
 *                  negative and huge devices and modes, frees of
 *                  pointers the library never returned: each refused (or
 *                  nothing to do), nothing live after.
 *   hostile race   threads allocate and free while another shuts the
 *                  library down over and over, and pairs of threads free
 *                  the same pointer at once: every allocation is freed
 *                  once, the other free of each pair is refused, and the
 *                  library shuts down at the end.
 *
 * It prints "ok" and exits 0 when every check holds; else a FAIL line (or
 * the signal that killed it).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <limits.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"

/* unterminated is n bytes of 'a' that end where an unmapped page begins. */
static const char *unterminated(size_t n) {
	long page = sysconf(_SC_PAGESIZE);
	char *m = mmap(NULL, 2 * (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(m != MAP_FAILED, "mmap");
	CHECK(mprotect(m + page, (size_t)page, PROT_NONE) == 0, "mprotect");
	CHECK(n <= (size_t)page, "n %zu", n);
	memset(m + page - n, 'a', n);
	return m + page - n;
}

static int tags(void) {
	CHECK(vmarena_set_tag("kv") == VMARENA_OK, "set_tag kv");
	void *p = vmarena_alloc(4096, 0, NULL);
	CHECK(p != NULL, "alloc");
	/* 129 bytes: one more than a tag may have, and no NUL before the
	 * unmapped page. */
	for (size_t n = 129; n <= 4096; n *= 2) {
		const char *bad = unterminated(n);
		CHECK(vmarena_set_tag(bad) == VMARENA_ERR_INVALID, "set_tag of %zu unterminated bytes", n);
		CHECK(strstr(vmarena_last_error(), "tag") != NULL, "set_tag's message: %s", vmarena_last_error());
		CHECK(vmarena_sleep(bad, VMARENA_SLEEP_DISCARD) == VMARENA_ERR_INVALID, "sleep of %zu unterminated bytes", n);
		CHECK(vmarena_wake(bad) == VMARENA_ERR_INVALID, "wake of %zu unterminated bytes", n);
	}
	/* The thread's tag did not change: the allocation is kv's. */
	void *q = vmarena_alloc(4096, 0, NULL);
	CHECK(q != NULL, "alloc");
	char *js = vmarena_stats_json();
	CHECK(js != NULL, "stats_json");
	CHECK(strstr(js, "\"tag\":\"kv\",\"live\":2,") != NULL, "both allocations are kv's: %s", js);
	vmarena_free_string(js);
	vmarena_free(p, 4096, 0, NULL);
	vmarena_free(q, 4096, 0, NULL);
	CHECK(vmarena_shutdown() == VMARENA_OK, "shutdown");
	return 0;
}

static int strings(void) {
	vmarena_free_string(NULL); /* nothing */
	char *js = vmarena_stats_json();
	CHECK(js != NULL, "stats_json");
	char *other = vmarena_stats_json();
	CHECK(other != NULL, "stats_json");
	vmarena_free_string(js);
	vmarena_free_string(js); /* freed already */
	CHECK(strstr(vmarena_last_error(), "free_string") != NULL, "a second free_string: %s", vmarena_last_error());
	char mine[] = "{}";
	vmarena_free_string(mine); /* not the library's */
	vmarena_free_string(other + 1); /* inside one of its strings */
	char *heap = malloc(16); /* the C heap's, not the library's */
	CHECK(heap != NULL, "malloc");
	vmarena_free_string(heap);
	free(heap);
	/* The string still live is whole and frees once. */
	CHECK(other[0] == '{', "the live string: %s", other);
	vmarena_free_string(other);
	return 0;
}

/* asleep says whether tag sleeps, from the stats. */
static int asleep(const char *tag) {
	char *js = vmarena_stats_json(), want[200];
	CHECK(js != NULL, "stats_json");
	snprintf(want, sizeof want, "\"tag\":\"%s\",", tag);
	const char *at = strstr(js, want);
	CHECK(at != NULL, "no tag %s in %s", tag, js);
	at = strstr(at, "\"asleep\":");
	CHECK(at != NULL, "no asleep in %s", js);
	int yes = strncmp(at + strlen("\"asleep\":"), "true", 4) == 0;
	vmarena_free_string(js);
	return yes;
}

static int empty(void) {
	void *d = vmarena_alloc(4096, 0, NULL);
	CHECK(d != NULL, "alloc under the default tag");
	CHECK(vmarena_set_tag("kv") == VMARENA_OK, "set_tag kv");
	void *k = vmarena_alloc(4096, 0, NULL);
	CHECK(k != NULL, "alloc under kv");
	CHECK(vmarena_sleep("", VMARENA_SLEEP_DISCARD) == VMARENA_OK, "sleep \"\"");
	CHECK(asleep("default"), "sleep \"\" sleeps the default tag");
	CHECK(!asleep("kv"), "sleep \"\" sleeps kv: it is not NULL, every tag");
	CHECK(vmarena_sleep("kv", VMARENA_SLEEP_DISCARD) == VMARENA_OK, "sleep kv");
	CHECK(vmarena_wake("") == VMARENA_OK, "wake \"\"");
	CHECK(!asleep("default"), "wake \"\" wakes the default tag");
	CHECK(asleep("kv"), "wake \"\" wakes kv: it is not NULL, every tag");
	CHECK(vmarena_wake(NULL) == VMARENA_OK, "wake NULL");
	CHECK(!asleep("kv"), "wake NULL wakes kv");
	vmarena_free(d, 4096, 0, NULL);
	vmarena_free(k, 4096, 0, NULL);
	CHECK(vmarena_shutdown() == VMARENA_OK, "shutdown");
	return 0;
}

static int calls(void) {
	/* Before anything is open. */
	CHECK(vmarena_shutdown() == VMARENA_OK, "shutdown before init");
	CHECK(vmarena_sleep(NULL, VMARENA_SLEEP_HOST) == VMARENA_OK, "sleep NULL before init");
	CHECK(vmarena_wake(NULL) == VMARENA_OK, "wake NULL before init");
	CHECK(vmarena_sleep("default", VMARENA_SLEEP_HOST) == VMARENA_ERR_INVALID, "sleep default before init");
	int local;
	vmarena_free(&local, 0, 0, NULL);
	CHECK(strstr(vmarena_last_error(), "nothing is allocated") != NULL, "free before init: %s", vmarena_last_error());
	char *js = vmarena_stats_json();
	CHECK(js != NULL && strstr(js, "\"open\":false") != NULL, "stats before init: %s", js ? js : "NULL");
	vmarena_free_string(js);

	/* Sizes and devices at the ends of their types. */
	ssize_t sizes[] = {0, -1, SSIZE_MAX, SSIZE_MAX - 4095, (ssize_t)1 << 62, -SSIZE_MAX - 1};
	for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
		CHECK(vmarena_alloc(sizes[i], 0, NULL) == NULL, "alloc of %zd", sizes[i]);
		CHECK(vmarena_last_error()[0] != 0, "alloc of %zd: no message", sizes[i]);
	}
	int devices[] = {-1, INT_MIN, INT_MAX, 1, 32};
	for (size_t i = 0; i < sizeof devices / sizeof devices[0]; i++)
		CHECK(vmarena_alloc(4096, devices[i], NULL) == NULL, "alloc on device %d", devices[i]);
	int modes[] = {-1, INT_MIN, INT_MAX, 3};
	for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
		CHECK(vmarena_sleep(NULL, modes[i]) == VMARENA_ERR_INVALID, "sleep mode %d", modes[i]);

	/* Frees of what the library did not return, or returned otherwise. */
	void *p = vmarena_alloc(5000, 0, NULL);
	CHECK(p != NULL, "alloc");
	vmarena_free(&local, 0, 0, NULL);
	vmarena_free((char *)p + 4096, 0, 0, NULL);
	vmarena_free((char *)p - 1, 0, 0, NULL);
	vmarena_free((void *)UINTPTR_MAX, 0, 0, NULL);
	vmarena_free(p, SIZE_MAX, 0, NULL);
	vmarena_free(p, 4096, 0, NULL);
	vmarena_free(p, 0, -1, NULL);
	vmarena_free(p, 0, INT_MIN, NULL); /* 8 refused frees here, 9 with the one before init */
	CHECK(vmarena_shutdown() == VMARENA_ERR_BUSY, "shutdown while p lives");
	js = vmarena_stats_json();
	CHECK(js != NULL && strstr(js, "\"free_errors\":9,") != NULL && strstr(js, "\"live\":1,") != NULL, "stats: %s", js ? js : "NULL");
	vmarena_free_string(js);
	vmarena_free(p, 5000, 0, NULL);
	CHECK(vmarena_shutdown() == VMARENA_OK, "shutdown");
	CHECK(vmarena_shutdown() == VMARENA_OK, "shutdown twice");

	/* After shutdown: p is nobody's, and the library opens again. */
	vmarena_free(p, 5000, 0, NULL);
	CHECK(strstr(vmarena_last_error(), "nothing is allocated") != NULL, "free after shutdown: %s", vmarena_last_error());
	void *q = vmarena_alloc(4096, 0, NULL);
	CHECK(q != NULL, "alloc after shutdown");
	vmarena_free(q, 4096, 0, NULL);
	CHECK(vmarena_shutdown() == VMARENA_OK, "shutdown");
	return 0;
}

enum { race_threads = 4, race_rounds = 300 };
static atomic_int racing;
static void *volatile race_slot[race_threads / 2];
static pthread_barrier_t race_barrier;

/* churn allocates and frees; threads 2i and 2i+1 then free one pointer
 * at once, each round. */
static void *churn(void *arg) {
	long i = (long)arg;
	for (int r = 0; r < race_rounds; r++) {
		void *p = vmarena_alloc(4096 * (1 + (r % 3)), 0, NULL);
		CHECK(p != NULL, "thread %ld: alloc, round %d", i, r);
		vmarena_free(p, 4096 * (1 + (r % 3)), 0, NULL);
		if (i % 2 == 0) {
			void *q = vmarena_alloc(8192, 0, NULL);
			CHECK(q != NULL, "thread %ld: alloc, round %d", i, r);
			race_slot[i / 2] = q;
		}
		pthread_barrier_wait(&race_barrier);
		vmarena_free(race_slot[i / 2], 8192, 0, NULL);
		pthread_barrier_wait(&race_barrier);
	}
	return NULL;
}

static void *shutter(void *arg) {
	(void)arg;
	while (atomic_load(&racing)) {
		int rc = vmarena_shutdown();
		CHECK(rc == VMARENA_OK || rc == VMARENA_ERR_BUSY, "shutdown: %d", rc);
		char *js = vmarena_stats_json();
		CHECK(js != NULL, "stats_json");
		vmarena_free_string(js);
	}
	return NULL;
}

static int race(void) {
	pthread_t th[race_threads], sh;
	pthread_barrier_init(&race_barrier, NULL, race_threads);
	atomic_store(&racing, 1);
	CHECK(pthread_create(&sh, NULL, shutter, NULL) == 0, "pthread_create");
	for (long i = 0; i < race_threads; i++) CHECK(pthread_create(&th[i], NULL, churn, (void *)i) == 0, "pthread_create");
	for (int i = 0; i < race_threads; i++) pthread_join(th[i], NULL);
	atomic_store(&racing, 0);
	pthread_join(sh, NULL);
	char *js = vmarena_stats_json();
	CHECK(js != NULL, "stats_json");
	for (const char *at = strstr(js, "\"live\":"); at != NULL; at = strstr(at + 1, "\"live\":"))
		CHECK(strncmp(at, "\"live\":0,", 9) == 0, "something is live: %s", js);
	vmarena_free_string(js);
	CHECK(vmarena_shutdown() == VMARENA_OK, "shutdown at the end");
	return 0;
}

int main(int argc, char **argv) {
	CHECK(argc == 2, "usage: hostile tags|strings|empty|calls|race");
	int rc = 1;
	if (strcmp(argv[1], "tags") == 0) rc = tags();
	else if (strcmp(argv[1], "strings") == 0) rc = strings();
	else if (strcmp(argv[1], "empty") == 0) rc = empty();
	else if (strcmp(argv[1], "calls") == 0) rc = calls();
	else if (strcmp(argv[1], "race") == 0) rc = race();
	else CHECK(0, "no such case %s", argv[1]);
	if (rc == 0) printf("ok\n");
	return rc;
}
