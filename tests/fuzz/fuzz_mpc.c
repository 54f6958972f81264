// SPDX-License-Identifier: MIT
/*
 * libFuzzer target: the .mpc consolidation map reader on any bytes. Each
 * input runs twice: as is, and with the three table checksums and the
 * header's recomputed so mutations reach the checks behind them. A map that
 * opens is read through and its promises (Algorithm 1's ranks and owners,
 * distances that are sums of distances) are checked.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <moepager.h>

#include "fuzz_file.h"

#define HEADER		4096u
#define OFF_N_MODELS	24
#define OFF_TABLES	64
#define OFF_N_POSITIONS	96
#define OFF_SUMS	104

static int fd = -1;
static const char *path;

#define CHECK(c) do {							\
	if (!(c)) {							\
		fprintf(stderr, "fuzz_mpc: broken promise: %s\n", #c);	\
		__builtin_trap();					\
	}								\
} while (0)

/* Position (l, e): its owner is Algorithm 1's for its rank; its distance the sum of its pairs. */
static void check_position(const struct mp_consolidation *c, uint32_t l, uint32_t e,
			   uint8_t *seen, uint32_t *owned)
{
	uint32_t n = mp_consolidation_models(c), rank = mp_consolidation_rank(c, l, e);
	int owner = mp_consolidation_owner(c, l, e);
	double d = mp_consolidation_distance(c, l, e), sum = 0;

	CHECK(rank >= 1 && rank <= mp_consolidation_layers(c) * mp_consolidation_experts(c));
	CHECK(!seen[rank - 1]);
	seen[rank - 1] = 1;
	CHECK(owner == (rank <= mp_consolidation_capacity(c) ? (int)((rank - 1) % n) : -1));
	if (owner >= 0)
		owned[owner]++;
	for (uint32_t i = 0; i < n; i++)
		for (uint32_t j = i + 1; j < n; j++) {
			double x = mp_consolidation_pair_distance(c, i, j, l, e);

			CHECK(isfinite(x) && x >= 0 && x == mp_consolidation_pair_distance(c, j, i, l, e));
			sum += x;
		}
	CHECK(d == sum);
}

static void read_through(const struct mp_consolidation *c)
{
	uint32_t n = mp_consolidation_models(c), layers = mp_consolidation_layers(c);
	uint32_t experts = mp_consolidation_experts(c), owned[MP_CONSOL_MAX_MODELS] = { 0 };
	uint8_t *seen = calloc((size_t)layers * experts, 1);

	CHECK(n >= 1 && n <= MP_CONSOL_MAX_MODELS);
	if (!seen)
		return;
	for (uint32_t l = 0; l < layers; l++)
		for (uint32_t e = 0; e < experts; e++)
			check_position(c, l, e, seen, owned);
	for (uint32_t i = 0; i < n; i++) {
		CHECK(owned[i] == mp_consolidation_owned(c, i));
		CHECK(mp_consolidation_model_name(c, i) && mp_consolidation_model_file(c, i));
	}
	CHECK(mp_consolidation_owner(c, layers, 0) == MP_CONSOL_NONE);
	CHECK(mp_consolidation_rank(c, 0, experts) == 0);
	CHECK(mp_consolidation_model_name(c, n) == NULL);
	free(seen);
}

static void run(const uint8_t *d, size_t n)
{
	struct mp_consolidation *c = NULL;
	int ret;

	if (fuzz_put_file(fd, d, n))
		return;
	ret = mp_consolidation_open(path, &c);
	CHECK(ret <= 0);
	if (ret) {
		CHECK(c == NULL);
		return;
	}
	read_through(c);
	mp_consolidation_close(c);
}

/* Recomputes the table checksums and header_checksum from the input's own fields. */
static void fix_checksums(uint8_t *d, size_t size)
{
	uint32_t n, pos;
	uint64_t sum;

	memcpy(&n, d + OFF_N_MODELS, 4);
	memcpy(&pos, d + OFF_N_POSITIONS, 4);
	for (int t = 0; t < 3; t++) {
		uint64_t off, len = t == 0 ? n * 256ull : t == 1 ? pos * 16ull :
				    (uint64_t)n * (n - 1ull) / 2 * pos * 8;

		memcpy(&off, d + OFF_TABLES + 8 * t, 8);
		if (off > size || len > size - off)
			continue;
		sum = mp_checksum(d + off, len);
		memcpy(d + OFF_SUMS + 8 * t, &sum, 8);
	}
	sum = mp_checksum(d, HEADER - 8);
	memcpy(d + HEADER - 8, &sum, 8);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	path = fuzz_file("fuzz.mpc", &fd);
	fuzz_twice(data, size, HEADER, run, fix_checksums);
	return 0;
}
