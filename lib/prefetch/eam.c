// SPDX-License-Identifier: MIT
/*
 * MoE-Infinity's request-level Expert Activation Matrix: the current
 * request's expert counts so far, matched by cosine against the matrices of
 * finished requests; the best match's rows say what to fetch d layers ahead.
 *
 * Counts are whole numbers, so dot products and norms are exact in double in
 * any order: a gate adds its k counts to the running dot product with every
 * stored matrix (k per matrix) instead of recomputing all of them.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "prefetch/policy.h"

struct eam {
	uint32_t lj;
	uint32_t cap;
	uint32_t count;
	uint32_t next;		/* oldest record: replaced when full */
	float *store;		/* [lj][cap]: value i of every matrix, matrix-contiguous */
	double *norm_sq;	/* [cap] */
	uint32_t *gen;		/* [cap]: changes with every write of the matrix */
	uint32_t writes;
	float *P;		/* [experts] scratch */
};

/* A request's matrix so far (per iter: requests decoded together keep their own). */
struct eam_req {
	float *cur;		/* [lj]: this request's counts */
	double cur_sq;		/* its squared norm */
	double *dot;		/* [cap]: its dot product with each stored matrix */
	uint32_t *gen;		/* [cap]: the write each product belongs to (0: none) */
	uint32_t request;
	bool started;
	bool active;		/* cur holds something */
};

static uint32_t capacity(const struct mp_prefetch *pf)
{
	return pf->env.emap_capacity ? pf->env.emap_capacity : 1024;
}

static int eam_init(struct mp_prefetch *pf)
{
	struct eam *e = calloc(1, sizeof(*e));

	if (!e)
		return -ENOMEM;
	pf->priv = e;
	e->lj = pf->env.layers * pf->env.experts;
	e->cap = capacity(pf);
	e->store = calloc((size_t)e->cap * e->lj, sizeof(float));
	e->norm_sq = calloc(e->cap, sizeof(double));
	e->gen = calloc(e->cap, sizeof(uint32_t));
	e->P = calloc(pf->env.experts, sizeof(float));
	if (!e->store || !e->norm_sq || !e->gen || !e->P)
		return mp_err(-ENOMEM, "prefetch eam: no memory for %u matrices", e->cap);
	return 0;
}

static int eam_iter_init(struct mp_prefetch *pf, struct mp_prefetch_iter *it)
{
	struct eam_req *q = it->priv;

	q->cur = calloc((size_t)pf->env.layers * pf->env.experts, sizeof(float));
	q->dot = calloc(capacity(pf), sizeof(double));
	q->gen = calloc(capacity(pf), sizeof(uint32_t));
	return q->cur && q->dot && q->gen ? 0 : -ENOMEM;
}

static void eam_iter_fini(struct mp_prefetch *pf, struct mp_prefetch_iter *it)
{
	struct eam_req *q = it->priv;

	(void)pf;
	free(q->cur);
	free(q->dot);
	free(q->gen);
}

static void finish_request(struct eam *e, struct eam_req *q)
{
	double sq = 0;

	if (!q->active)
		return;
	for (uint32_t i = 0; i < e->lj; i++) {
		e->store[(size_t)i * e->cap + e->next] = q->cur[i];
		sq += (double)q->cur[i] * q->cur[i];
	}
	e->norm_sq[e->next] = sq;
	if (!++e->writes)
		e->writes = 1;		/* never 0: a product's "none" */
	e->gen[e->next] = e->writes;
	e->next = (e->next + 1) % e->cap;
	if (e->count < e->cap)
		e->count++;
	memset(q->cur, 0, e->lj * sizeof(float));
	q->cur_sq = 0;
	/* An empty matrix's products are 0 with whatever is stored now. */
	memset(q->dot, 0, e->cap * sizeof(*q->dot));
	memcpy(q->gen, e->gen, e->cap * sizeof(*q->gen));
	q->active = false;
}

/* The stored matrix most similar to the request's (cosine, as mp_cosine()), or -1. */
static int best_match(struct eam *e, struct eam_req *q)
{
	float best = -1.0f;
	int arg = -1;

	for (uint32_t y = 0; y < e->count; y++) {
		float c = 0.0f;

		/* Written since (another request finished): its whole product. */
		if (q->gen[y] != e->gen[y]) {
			double dot = 0;

			for (uint32_t i = 0; i < e->lj; i++)
				if (q->cur[i] != 0)
					dot += (double)q->cur[i] * e->store[(size_t)i * e->cap + y];
			q->dot[y] = dot;
			q->gen[y] = e->gen[y];
		}
		if (q->cur_sq > 0 && e->norm_sq[y] > 0)
			c = (float)(q->dot[y] / sqrt(q->cur_sq * e->norm_sq[y]));
		if (c > best) {
			best = c;
			arg = (int)y;
		}
	}
	return arg;
}

static void plan_row(struct mp_prefetch *pf, struct eam *e, int y, uint32_t layer, int32_t l_now)
{
	const float *col = e->store + (size_t)layer * pf->env.experts * e->cap + y;
	double sum = 0;

	for (uint32_t j = 0; j < pf->env.experts; j++)
		sum += col[(size_t)j * e->cap];
	if (!(sum > 0))
		return;
	for (uint32_t j = 0; j < pf->env.experts; j++)
		e->P[j] = (float)(col[(size_t)j * e->cap] / sum);
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

/* Adds one count at index i: the request's norm and its product with every matrix follow. */
static void count(struct eam *e, struct eam_req *q, uint32_t i)
{
	const float *col = e->store + (size_t)i * e->cap;

	q->cur_sq += 2.0 * q->cur[i] + 1.0;	/* (c + 1)^2 - c^2 */
	q->cur[i] += 1;
	for (uint32_t y = 0; y < e->count; y++)
		q->dot[y] += col[y];
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
		count(e, q, layer * pf->env.experts + ids[i]);
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
	free(e->norm_sq);
	free(e->gen);
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
