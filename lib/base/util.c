// SPDX-License-Identifier: MIT
/* Small helpers every layer uses: the clock, a whole file in memory, checksums, a median. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <xxhash.h>

#include "base/base.h"

uint64_t mp_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int mp_read_file(const char *what, const char *path, char **buf, size_t *len)
{
	FILE *f = fopen(path, "rbe");
	size_t cap = 1 << 16, n = 0;
	char *b = NULL;
	int err = 0;

	if (!f)
		return mp_err(-errno, "%s %s: cannot open: %s", what, path, strerror(errno));
	for (;;) {
		size_t got;

		if (n + 1 >= cap || !b) {
			char *nb = realloc(b, cap *= 2);

			if (!nb) {
				err = mp_err(-ENOMEM, "%s %s: out of memory", what, path);
				goto close_file;
			}
			b = nb;
		}
		got = fread(b + n, 1, cap - n - 1, f);
		n += got;
		if (got)
			continue;
		if (ferror(f))
			err = mp_err(-EIO, "%s %s: read error", what, path);
		break;
	}
	if (!err) {
		b[n] = '\0';
		*buf = b;
		*len = n;
		b = NULL;
	}
close_file:
	fclose(f);
	free(b);
	return err;
}

uint64_t mp_checksum(const void *buf, size_t len)
{
	return XXH3_64bits(buf, len);
}

int mp_check_reserved(const uint64_t *words, size_t n, const char *what)
{
	for (size_t i = 0; i < n; i++)
		if (words[i])
			return mp_err(-EINVAL, "%s: reserved word %zu is not zero (a field this "
				      "library version does not know)", what, i);
	return 0;
}

int mp_check_reserved_ops(void (*const *slots)(void), size_t n, const char *what)
{
	for (size_t i = 0; i < n; i++)
		if (slots[i])
			return mp_err(-EINVAL, "%s: reserved op %zu is set (an op this library "
				      "version does not know)", what, i);
	return 0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

double mp_median(double *v, size_t n)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return v[(n - 1) / 2];
}
