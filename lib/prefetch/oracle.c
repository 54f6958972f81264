// SPDX-License-Identifier: MIT
/* The oracle: reads the replayed trace's future and fetches exactly what will be used, d ahead. */
#include <string.h>

#include <moepager/trace.h>

#include "base/base.h"
#include "prefetch/policy.h"

/* The true distribution of (request, token, layer): 1 on each routed expert. */
static void plan_true(struct mp_prefetch *pf, uint32_t layer, int32_t l_now)
{
	uint32_t J = pf->env.experts;
	float P[MP_MAX_EXPERTS];
	const uint32_t *ids;
	const float *w;

	/* A guess past the request's end (the driver's early begin) has no future. */
	if (layer >= pf->env.layers || pf->it->request >= mp_trace_requests(pf->env.trace) ||
	    pf->it->token >= mp_trace_tokens(pf->env.trace, pf->it->request) ||
	    mp_trace_route(pf->env.trace, pf->it->request, pf->it->token, layer, &ids, &w))
		return;
	memset(P, 0, J * sizeof(float));
	for (uint32_t i = 0; i < pf->env.topk; i++)
		P[ids[i]] = 1.0f / pf->env.topk;
	mp_prefetch_plan(pf, layer, P, 1.0f, l_now);
}

static int oracle_init(struct mp_prefetch *pf)
{
	if (!pf->env.trace)
		return mp_err(-EINVAL, "prefetch oracle: needs the replayed trace (a trace "
			      "replay)");
	if (mp_trace_layers(pf->env.trace) != pf->env.layers ||
	    mp_trace_experts(pf->env.trace) != pf->env.experts ||
	    mp_trace_topk(pf->env.trace) != pf->env.topk)
		return mp_err(-EINVAL, "prefetch oracle: the trace's geometry differs from the "
			      "model's");
	return 0;
}

static void oracle_begin(struct mp_prefetch *pf)
{
	for (uint32_t l = 0; l < pf->env.distance; l++)
		plan_true(pf, l, -1);
}

static void oracle_gate(struct mp_prefetch *pf, uint32_t layer, const uint32_t *ids, uint32_t k,
			const float *spec)
{
	(void)ids;
	(void)k;
	(void)spec;
	plan_true(pf, layer + pf->env.distance, (int32_t)layer);
}

const struct mp_prefetch_ops mp_prefetch_oracle = {
	.name = "oracle",
	.description = "the trace's future experts, d layers ahead (upper bound, comparison only)",
	.init = oracle_init,
	.begin = oracle_begin,
	.gate = oracle_gate,
};
