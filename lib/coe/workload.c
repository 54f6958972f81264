// SPDX-License-Identifier: MIT
/*
 * Boards: component images arriving one every interval, each a request to
 * the classifier the router picks (drawn from the start probabilities), as
 * in CoServe's evaluation (2,500 or 3,500 requests, one every 4 ms).
 */
#include <errno.h>
#include <stdlib.h>

#include "base/base.h"
#include "coe/coe_priv.h"

#define DEFAULT_REQUESTS	2500u
#define DEFAULT_INTERVAL_NS	(4ull * 1000 * 1000)

int mp_coe_workload(const struct mp_coe *c, const struct mp_coe_workload_config *cfg,
		    struct mp_coe_request **out)
{
	uint32_t n = cfg && cfg->requests ? cfg->requests : DEFAULT_REQUESTS;
	uint64_t iv = cfg && cfg->interval_ns ? cfg->interval_ns : DEFAULT_INTERVAL_NS;
	uint64_t seed = cfg && cfg->seed ? cfg->seed : 1;
	struct mp_coe_request *r;
	double *cdf;
	int err;

	if (cfg && (err = mp_check_reserved(cfg->reserved, MP_ARRAY_SIZE(cfg->reserved),
					    "coe workload config")))
		return err;
	if (n > (1u << 24))
		return mp_err(-EINVAL, "coe workload: %u requests (at most %u)", n, 1u << 24);
	r = calloc(n, sizeof(*r));
	cdf = malloc(c->n_models * sizeof(*cdf));
	if (!r || !cdf) {
		free(r);
		free(cdf);
		return mp_err(-ENOMEM, "coe workload: out of memory for %u requests", n);
	}
	for (uint32_t m = 0; m < c->n_models; m++)
		cdf[m] = (m ? cdf[m - 1] : 0) + c->models[m].p_first;
	for (uint32_t i = 0; i < n; i++) {
		double u = (double)(coe_mix(seed, i) >> 11) * 0x1.0p-53 * cdf[c->n_models - 1];
		uint32_t lo = 0, hi = c->n_models - 1;

		/* The first model whose cumulative probability passes u (never one of p = 0). */
		while (lo < hi) {
			uint32_t mid = (lo + hi) / 2;

			if (cdf[mid] > u)
				hi = mid;
			else
				lo = mid + 1;
		}
		r[i] = (struct mp_coe_request){ .id = i, .model = lo, .arrival_ns = i * iv };
	}
	free(cdf);
	*out = r;
	return (int)n;
}
