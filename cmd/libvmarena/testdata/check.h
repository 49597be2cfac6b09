/*
 * check.h: what cycles.c and gpucycles.c share: CHECK, which fails the
 * program with the library's last error, and awake_bytes, which reads a
 * tag's awake bytes from vmarena_stats_json.
 */
#ifndef VMARENA_TESTDATA_CHECK_H
#define VMARENA_TESTDATA_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* awake_bytes reads tag's awake_bytes from the stats. */
static inline long awake_bytes(const char *tag) {
	char *js = vmarena_stats_json(), want[200];
	CHECK(js != NULL, "stats_json");
	snprintf(want, sizeof want, "\"tag\":\"%s\",", tag);
	const char *at = strstr(js, want);
	CHECK(at != NULL, "no tag %s in %s", tag, js);
	at = strstr(at, "\"awake_bytes\":");
	CHECK(at != NULL, "no awake_bytes in %s", js);
	long n = strtol(at + strlen("\"awake_bytes\":"), NULL, 10);
	vmarena_free_string(js);
	return n;
}

#endif
