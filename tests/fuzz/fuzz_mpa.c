// SPDX-License-Identifier: MIT
/*
 * libFuzzer target: the .mpa adapter reader on any bytes. Each input runs
 * twice: as is, and with the table and header checksums recomputed so
 * mutations reach the checks behind them. An adapter that opens is read
 * through (every layer, find, read, verify) and its promises are checked.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <moepager.h>

#include "fuzz_file.h"

#define HEADER		4096u
#define OFF_TABLE_OFF	64
#define OFF_N_ENTRIES	72
#define OFF_TABLE_SUM	80

static int fd = -1;
static const char *path;

#define CHECK(c) do {							\
	if (!(c)) {							\
		fprintf(stderr, "fuzz_mpa: broken promise: %s\n", #c);	\
		__builtin_trap();					\
	}								\
} while (0)

static void read_through(struct mp_adapter *a, size_t file)
{
	uint32_t total = 0, most = 0, n;
	const struct mp_adapter_expert *e;
	uint8_t *buf = NULL;
	int ret;

	CHECK(mp_adapter_count(a) > 0 && strlen(mp_adapter_name(a)) > 0);
	for (uint32_t l = 0; l < mp_adapter_layers(a); l++) {
		e = mp_adapter_layer(a, l, &n);
		total += n;
		most = n > most ? n : most;
		for (uint32_t i = 0; i < n; i++) {
			CHECK(e[i].layer == l && (i == 0 || e[i].expert > e[i - 1].expert));
			CHECK(e[i].offset % 4096 == 0 && e[i].offset + e[i].bytes <= file);
			CHECK(mp_adapter_find(a, l, e[i].expert) == &e[i]);
			if (!buf)
				buf = malloc(e[i].bytes);
			if (!buf)
				return;
			ret = mp_adapter_read_expert(a, l, e[i].expert, buf);
			CHECK(ret == 0 || ret == -EBADMSG);
			CHECK(ret || mp_checksum(buf, e[i].bytes) == e[i].checksum);
		}
	}
	CHECK(total == mp_adapter_count(a) && most == mp_adapter_max_per_layer(a));
	CHECK(mp_adapter_layer(a, mp_adapter_layers(a), &n) == NULL && n == 0);
	ret = mp_adapter_verify(a);
	CHECK(ret >= 0 && (uint32_t)ret <= total);
	free(buf);
}

static void run(const uint8_t *d, size_t n)
{
	struct mp_adapter *a = NULL;
	int ret;

	if (fuzz_put_file(fd, d, n))
		return;
	ret = mp_adapter_open(path, &a);
	CHECK(ret <= 0);
	if (ret) {
		CHECK(a == NULL);
		return;
	}
	read_through(a, n);
	mp_adapter_close(a);
}

/* Recomputes table_checksum and header_checksum from the input's own fields. */
static void fix_checksums(uint8_t *d, size_t n)
{
	uint64_t toff, len, sum;
	uint32_t entries;

	memcpy(&toff, d + OFF_TABLE_OFF, 8);
	memcpy(&entries, d + OFF_N_ENTRIES, 4);
	len = (uint64_t)entries * 64;
	if (toff <= n && len <= n - toff) {
		sum = mp_checksum(d + toff, len);
		memcpy(d + OFF_TABLE_SUM, &sum, 8);
	}
	sum = mp_checksum(d, HEADER - 8);
	memcpy(d + HEADER - 8, &sum, 8);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	path = fuzz_file("fuzz.mpa", &fd);
	fuzz_twice(data, size, HEADER, run, fix_checksums);
	return 0;
}
