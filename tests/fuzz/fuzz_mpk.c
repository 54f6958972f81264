// SPDX-License-Identifier: MIT
/*
 * libFuzzer target: the .mpk reader on any bytes. The input is the file's
 * first bytes; when the header's file_bytes asks for more (up to 16 MiB),
 * the rest reads as zeros, as a sparse file's holes do. Each input runs
 * twice: as is, and with the header and tables checksums recomputed, so
 * mutations reach the checks behind them. A store that opens is read
 * through (tensors, experts, verify) and its promises are checked.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include <moepager.h>

#include "fuzz_file.h"

#define MAX_FILE	(16ull << 20)
#define HEADER		4096u
#define MAX_EXPERTS	64u		/* experts read per input */

static int fd = -1;
static const char *path;

#define CHECK(c) do {							\
	if (!(c)) {							\
		fprintf(stderr, "fuzz_mpk: broken promise: %s\n", #c);	\
		__builtin_trap();					\
	}								\
} while (0)

static uint64_t le64(const uint8_t *p)
{
	uint64_t v;

	memcpy(&v, p, sizeof(v));
	return v;
}

static uint32_t le32(const uint8_t *p)
{
	uint32_t v;

	memcpy(&v, p, sizeof(v));
	return v;
}

/* The input, then zeros up to the header's file_bytes (at most MAX_FILE). */
static int put_file(const uint8_t *d, size_t n)
{
	uint64_t want = n;
	int err = fuzz_put_file(fd, d, n);

	if (err)
		return err;
	if (n >= 24 && le64(d + 16) > n && le64(d + 16) <= MAX_FILE)
		want = le64(d + 16);
	if (want > n && ftruncate(fd, (off_t)want))
		return -errno;
	return 0;
}

static void read_through(struct mp_store *s, bool verify)
{
	const struct mp_geometry *g = mp_store_geometry(s);
	uint64_t file = mp_store_file_bytes(s), xb = mp_store_expert_bytes(s);
	struct mp_verify_result bad[4];
	uint32_t n = 0;
	uint8_t *buf;
	int ret;

	CHECK(xb == mp_geometry_expert_bytes(g));
	CHECK(mp_store_total_expert_bytes(s) == xb * g->layers * g->experts);
	CHECK(strlen(mp_store_name(s)) < 64);
	for (uint32_t i = 0; i < mp_store_tensor_count(s); i++) {
		const struct mp_tensor_info *t = mp_store_tensor_at(s, i);

		CHECK(t && t->offset % 4096 == 0 && t->offset + t->bytes <= file);
		CHECK(mp_store_tensor(s, t->name) != NULL);
		buf = malloc(t->bytes ? t->bytes : 1);
		if (!buf)
			continue;
		ret = mp_store_read_tensor(s, t, buf);
		CHECK(ret == 0 || ret == -EBADMSG || ret == -EIO || ret == -ENODATA);
		CHECK(ret || mp_checksum(buf, t->bytes) == t->checksum);
		free(buf);
	}
	CHECK(mp_store_tensor_at(s, mp_store_tensor_count(s)) == NULL);
	buf = malloc(xb ? xb : 1);
	if (!buf)
		return;
	for (uint32_t l = 0; l < g->layers && n < MAX_EXPERTS; l++) {
		for (uint32_t e = 0; e < g->experts && n < MAX_EXPERTS; e++, n++) {
			const struct mp_expert_info *x = mp_store_expert(s, l, e);

			CHECK(x && x->layer == l && x->expert == e && x->bytes == xb);
			CHECK(x->offset % MP_EXPERT_ALIGN == 0 && x->offset + x->bytes <= file);
			ret = mp_store_read_expert(s, l, e, buf);
			CHECK(ret == 0 || ret == -EBADMSG || ret == -EIO || ret == -ENODATA);
			CHECK(ret || mp_checksum(buf, xb) == x->checksum);
		}
	}
	CHECK(mp_store_expert(s, g->layers, 0) == NULL);
	CHECK(mp_store_read_expert(s, 0, g->experts, buf) == -ERANGE);
	free(buf);
	if (!verify)
		return;
	ret = mp_store_verify(s, bad, 4, NULL, NULL);
	CHECK(ret >= 0 && (uint32_t)ret <= mp_store_tensor_count(s) +
	      g->layers * g->experts);
}

static void run(const uint8_t *d, size_t n)
{
	struct mp_store *s = NULL;
	int ret;

	if (put_file(d, n))
		return;
	ret = mp_store_open(path, &s);
	CHECK(ret <= 0);
	if (ret) {
		CHECK(s == NULL);
		return;
	}
	/*
	 * verify takes a 16 MiB buffer, which costs ten times the rest of an
	 * input under ASan: a quarter of the inputs (fixed by their bytes) run it.
	 */
	read_through(s, (mp_checksum(d, n) & 3) == 0);
	mp_store_close(s);
}

/* Recomputes tables_checksum and header_checksum from the input's own fields. */
static void fix_checksums(uint8_t *d, size_t n)
{
	uint64_t toff = le64(d + 80), eoff = le64(d + 96);
	uint64_t tlen = (uint64_t)le32(d + 88) * le32(d + 92);
	uint64_t elen = (uint64_t)le32(d + 104) * le32(d + 108);
	uint64_t sum;

	if (toff <= n && tlen <= n - toff && eoff <= n && elen <= n - eoff) {
		XXH3_state_t *h = XXH3_createState();

		if (h) {
			XXH3_64bits_reset(h);
			XXH3_64bits_update(h, d + toff, tlen);
			XXH3_64bits_update(h, d + eoff, elen);
			sum = XXH3_64bits_digest(h);
			memcpy(d + 128, &sum, sizeof(sum));
			XXH3_freeState(h);
		}
	}
	sum = XXH3_64bits(d, HEADER - 8);
	memcpy(d + HEADER - 8, &sum, sizeof(sum));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	path = fuzz_file("fuzz.mpk", &fd);
	fuzz_twice(data, size, HEADER, run, fix_checksums);
	return 0;
}
