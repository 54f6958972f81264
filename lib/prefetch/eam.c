// SPDX-License-Identifier: MIT
/*
 * MoE-Infinity's request-level Expert Activation Matrix: the current
 * request's expert counts so far, matched by cosine against the matrices of
 * finished requests; the best match's rows say what to fetch d layers ahead.
 */
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "prefetch/policy.h"

struct eam {
	uint32_t lj;
	uint32_t cap;
	uint32_t count;
	uint32_t next;		/* oldest record: replaced when full */
	float *store;		/* [cap][lj] */
	float *P;		/* [experts] scratch */
};

/* A request's matrix so far (per iter: requests decoded together keep their own). */
struct eam_req {
	float *cur;		/* [lj]: this request's counts */
	uint32_t request;
	bool started;
	bool active;		/* cur holds something */
};

static int eam_init(struct mp_prefetch *pf)
{
	struct eam *e = calloc(1, sizeof(*e));

	if (!e)
		return -ENOMEM;
	pf->priv = e;
	e->lj = pf->env.layers * pf->env.experts;
	e->cap = pf->env.emap_capacity ? pf->env.emap_capacity : 1024;
	e->store = calloc((size_t)e->cap * e->lj, sizeof(float));
	e->P = calloc(pf->env.experts, sizeof(float));
	if (!e->store || !e->P)
		return mp_err(-ENOMEM, "prefetch eam: no memory for %u matrices", e->cap);
	return 0;
}

static int eam_iter_init(struct mp_prefetch *pf, struct mp_prefetch_iter *it)
{
	struct eam_req *q = it->priv;

	q->cur = calloc((size_t)pf->env.layers * pf->env.experts, sizeof(float));
	return q->cur ? 0 : -ENOMEM;
}

static void eam_iter_fini(struct mp_prefetch *pf, struct mp_prefetch_iter *it)
{
	struct eam_req *q = it->priv;

	(void)pf;
	free(q->cur);
}

static void finish_request(struct eam *e, struct eam_req *q)
{
	if (!q->active)
		return;
	memcpy(e->store + (size_t)e->next * e->lj, q->cur, e->lj * sizeof(float));
	e->next = (e->next + 1) % e->cap;
	if (e->count < e->cap)
		e->count++;
	memset(q->cur, 0, e->lj * sizeof(float));
	q->active = false;
}

static int best_match(struct eam *e, const struct eam_req *q)
{
	float best = -1.0f;
	int arg = -1;

	for (uint32_t y = 0; y < e->count; y++) {
		float c = mp_cosine(q->cur, e->store + (size_t)y * e->lj, e->lj);

		if (c > best) {
			best = c;
			arg = (int)y;
		}
	}
	return arg;
}

static void plan_row(struct mp_prefetch *pf, struct eam *e, int y, uint32_t layer, int32_t l_now)
{
	const float *row = e->store + (size_t)y * e->lj + (size_t)layer * pf->env.experts;
	double sum = 0;

	for (uint32_t j = 0; j < pf->env.experts; j++)
		sum += row[j];
	if (!(sum > 0))
		return;
	for (uint32_t j = 0; j < pf->env.experts; j++)
		e->P[j] = (float)(row[j] / sum);
	/* The most activated experts of the matched request, top-k per layer. */
	mp_prefetch_plan(pf, layer, e->P, 1.0f, l_now);
}

static void eam_begin(struct mp_prefetch *pf)
{
	struct eam *e = pf->priv;
	struct eam_req *q = pf->it->priv;
	int y;

	if (q->started && pf->it->request != q->request)
		finish_request(e, q);
	q->started = true;
	q->request = pf->it->request;
	y = best_match(e, q);
	if (y < 0)
		return;
	for (uint32_t l = 0; l < pf->env.distance; l++)
		plan_row(pf, e, y, l, -1);
}

static void eam_gate(struct mp_prefetch *pf, uint32_t layer, const uint32_t *ids, uint32_t k,
		     const float *spec)
{
	struct eam *e = pf->priv;
	struct eam_req *q = pf->it->priv;
	uint32_t target = layer + pf->env.distance;
	int y;

	(void)spec;
	for (uint32_t i = 0; i < k; i++)
		q->cur[(size_t)layer * pf->env.experts + ids[i]] += 1;
	q->active = true;
	if (target >= pf->env.layers)
		return;
	y = best_match(e, q);
	if (y >= 0)
		plan_row(pf, e, y, target, (int32_t)layer);
}

static void eam_fini(struct mp_prefetch *pf)
{
	struct eam *e = pf->priv;

	if (!e)
		return;
	free(e->store);
	free(e->P);
	free(e);
	pf->priv = NULL;
}

const struct mp_prefetch_ops mp_prefetch_eam = {
	.name = "eam",
	.description = "request-level expert activation matrix matched by cosine (MoE-Infinity)",
	.init = eam_init,
	.begin = eam_begin,
	.gate = eam_gate,
	.fini = eam_fini,
	.iter_size = sizeof(struct eam_req),
	.iter_init = eam_iter_init,
	.iter_fini = eam_iter_fini,
};
