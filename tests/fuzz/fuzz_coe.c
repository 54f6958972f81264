// SPDX-License-Identifier: MIT
/* libFuzzer target: the CoE manifest parser (mp_coe_parse, no stores) on any bytes, and the graph. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include <moepager.h>

#define CHECK(c) do {							\
	if (!(c)) {							\
		fprintf(stderr, "fuzz_coe: broken promise: %s\n", #c);	\
		__builtin_trap();					\
	}								\
} while (0)

static void walk(const struct mp_coe *c)
{
	uint32_t n = mp_coe_model_count(c), ne = mp_coe_edge_count(c);
	const struct mp_coe_edge *e = mp_coe_edges(c);
	double sum = 0;

	CHECK(n >= 1 && mp_coe_arch_count(c) >= 1);
	for (uint32_t m = 0; m < n; m++) {
		struct mp_coe_model_info mi;

		CHECK(mp_coe_model(c, m, &mi) == 0);
		CHECK(mi.arch < mp_coe_arch_count(c));
		/* A request visits a model once at most: usage is a probability. */
		CHECK(mi.usage >= mi.p_first && mi.usage <= 1 + 1e-5);
		CHECK(mp_coe_model_find(c, mi.name) == (int)m);
		sum += mi.p_first;
		/* The chain after it ends or goes to one of its subsequent models. */
		for (uint32_t t = 0; t < 4; t++) {
			int next = mp_coe_next(c, m, t, t * 7);

			CHECK(next < 0 || (uint32_t)next < n);
		}
	}
	CHECK(fabs(sum - 1) <= 1e-6);
	for (uint32_t i = 0; i < ne; i++)
		CHECK(e[i].from < n && e[i].to < n && e[i].from != e[i].to && e[i].p > 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct mp_coe *c;

	if (mp_coe_parse((const char *)data, size, "/nonexistent", true, &c) == 0) {
		walk(c);
		mp_coe_close(c);
	}
	return 0;
}
