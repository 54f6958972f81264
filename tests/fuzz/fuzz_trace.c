// SPDX-License-Identifier: MIT
/* libFuzzer target: the moe-trace v1 reader (mp_trace_parse) on any bytes, and every accessor. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <moepager.h>

#define MAX_ROWS	4096u	/* rows walked per input */

#define CHECK(c) do {							\
	if (!(c)) {							\
		fprintf(stderr, "fuzz_trace: broken promise: %s\n", #c);	\
		__builtin_trap();					\
	}								\
} while (0)

static void walk(const struct mp_trace *t)
{
	uint32_t layers = mp_trace_layers(t), experts = mp_trace_experts(t), k = mp_trace_topk(t);
	uint32_t requests = mp_trace_requests(t), rows = 0;
	bool weights = mp_trace_has_weights(t);
	struct mp_geometry g;
	const uint32_t *ids;
	const float *w;

	CHECK(layers >= 1 && layers <= 1024 && experts >= 1 && experts <= 4096);
	CHECK(k >= 1 && k <= 64 && k <= experts && requests >= 1);
	for (uint32_t r = 0; r < requests && rows < MAX_ROWS; r++) {
		uint32_t tokens = mp_trace_tokens(t, r);

		CHECK(tokens >= 1);
		for (uint32_t tok = 0; tok < tokens && rows < MAX_ROWS; tok++) {
			for (uint32_t l = 0; l < layers; l++, rows++) {
				const float *p = mp_trace_probs(t, r, tok, l);

				CHECK(mp_trace_route(t, r, tok, l, &ids, &w) == 0);
				CHECK((w != NULL) == weights);
				for (uint32_t i = 0; i < k; i++) {
					CHECK(ids[i] < experts);
					for (uint32_t j = 0; j < i; j++)
						CHECK(ids[j] != ids[i]);
					CHECK(!w || (isfinite(w[i]) && w[i] >= 0));
				}
				for (uint32_t e = 0; p && e < experts; e++)
					CHECK(isfinite(p[e]) && p[e] >= 0);
			}
		}
		CHECK(mp_trace_route(t, r, tokens, 0, &ids, &w) == -ERANGE);
		if (tokens <= MAX_ROWS) {
			uint32_t *tid = malloc(tokens * sizeof(*tid));
			int err;

			CHECK(tid != NULL);
			err = mp_trace_token_ids(t, r, tid);
			CHECK(err == 0 || err == -ENOENT || err == -EINVAL);
			free(tid);
		}
	}
	CHECK(mp_trace_token_ids(t, requests, (uint32_t[1]){ 0 }) == -EINVAL);
	CHECK(mp_trace_route(t, requests, 0, 0, &ids, &w) == -ERANGE);
	CHECK(mp_trace_route(t, 0, 0, layers, &ids, &w) == -ERANGE);
	CHECK(mp_trace_tokens(t, requests) == 0);
	CHECK(mp_trace_probs(t, requests, 0, 0) == NULL);
	(void)mp_trace_meta(t, "name");
	CHECK(mp_trace_meta(t, "no such key, ever") == NULL);
	memset(&g, 0, sizeof(g));
	g.layers = layers;
	g.experts = experts;
	g.topk = k;
	CHECK(mp_trace_check_geometry(t, &g) == 0);
	g.topk = k + 1;
	CHECK(mp_trace_check_geometry(t, &g) == -EINVAL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct mp_trace *t = NULL;
	int ret = mp_trace_parse((const char *)data, size, "fuzz", &t);

	CHECK(ret <= 0);
	if (ret) {
		CHECK(t == NULL);
		return 0;
	}
	walk(t);
	mp_trace_close(t);
	return 0;
}
