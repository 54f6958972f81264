// SPDX-License-Identifier: MIT
/*
 * Dependency prefetch: layer-to-layer transition counts (the same counts the
 * BPF `transitions` map keeps) turned into probabilities and propagated from
 * the experts just routed, d layers ahead.
 */
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "prefetch/policy.h"

struct dependency {
	uint32_t J;
	double *trans;		/* [L - 1][J][J]: layer l expert a -> layer l+1 expert b */
	double *row_sum;	/* [L - 1][J]: each row's total (counts: exact in any order) */
	double *first;		/* [J]: layer 0 counts */
	double *q;		/* [J] scratch */
	double *nq;		/* [J] scratch */
	float *P;		/* [J] scratch */
};

static int dependency_init(struct mp_prefetch *pf)
{
	uint32_t L = pf->env.layers, J = pf->env.experts;
	struct dependency *d = calloc(1, sizeof(*d));

	if (!d)
		return -ENOMEM;
	d->J = J;
	d->trans = calloc((size_t)(L > 1 ? L - 1 : 1) * J * J, sizeof(double));
	d->row_sum = calloc((size_t)(L > 1 ? L - 1 : 1) * J, sizeof(double));
	d->first = calloc(J, sizeof(double));
	d->q = calloc(J, sizeof(double));
	d->nq = calloc(J, sizeof(double));
	d->P = calloc(J, sizeof(float));
	pf->priv = d;
	if (!d->trans || !d->row_sum || !d->first || !d->q || !d->nq || !d->P)
		return mp_err(-ENOMEM, "prefetch dependency: no memory for %u x %u x %u counts",
			      L, J, J);
	return 0;
}

typedef double v8d __attribute__((vector_size(64)));

/*
 * nq[b] += qa * t[b] / row for every b < J: eight at a time, each the
 * same operations in the same order (the same bits); the AVX-512 and AVX2
 * clones do them in one and two registers. A step of the propagation is
 * J x J of these, d steps per gate.
 */
#ifndef __SANITIZE_THREAD__	/* TSan instruments ifunc resolvers, which run before it is up */
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static void add_row(double *restrict nq, double qa, const double *restrict t, double row,
		    uint32_t J)
{
	uint32_t b = 0;

	for (; b + 8 <= J; b += 8) {
		v8d x, n;

		memcpy(&x, t + b, sizeof(x));
		memcpy(&n, nq + b, sizeof(n));
		n += qa * x / row;
		memcpy(nq + b, &n, sizeof(n));
	}
	for (; b < J; b++)
		nq[b] += qa * t[b] / row;
}

/* q holds layer `from`'s distribution; moves it to layer `to` through the counts. */
static bool propagate(struct dependency *d, uint32_t from, uint32_t to)
{
	uint32_t J = d->J;

	for (uint32_t l = from; l < to; l++) {
		const double *T = d->trans + (size_t)l * J * J;
		double total = 0;

		memset(d->nq, 0, J * sizeof(double));
		for (uint32_t a = 0; a < J; a++) {
			double row = d->row_sum[(size_t)l * J + a];

			if (d->q[a] > 0 && row > 0)
				add_row(d->nq, d->q[a], T + (size_t)a * J, row, J);
		}
		for (uint32_t b = 0; b < J; b++)
			total += d->nq[b];
		if (!(total > 0))
			return false;
		for (uint32_t b = 0; b < J; b++)
			d->q[b] = d->nq[b] / total;
	}
	return true;
}

static void plan_q(struct mp_prefetch *pf, struct dependency *d, uint32_t layer, int32_t l_now)
{
	for (uint32_t j = 0; j < d->J; j++)
		d->P[j] = (float)d->q[j];
	/* The k most probable: transition counts give no similarity score to widen the set. */
	mp_prefetch_plan(pf, layer, d->P, 1.0f, l_now);
}

static void dependency_begin(struct mp_prefetch *pf)
{
	struct dependency *d = pf->priv;
	double total = 0;

	for (uint32_t j = 0; j < d->J; j++)
		total += d->first[j];
	if (!(total > 0))
		return;
	for (uint32_t j = 0; j < d->J; j++)
		d->q[j] = d->first[j] / total;
	for (uint32_t l = 0; l < pf->env.distance; l++) {
		if (l && !propagate(d, l - 1, l))
			return;
		plan_q(pf, d, l, -1);
	}
}

static void dependency_gate(struct mp_prefetch *pf, uint32_t layer, const uint32_t *ids,
			    uint32_t k, const float *spec)
{
	struct dependency *d = pf->priv;
	uint32_t J = d->J, target = layer + pf->env.distance;

	(void)spec;
	/* Learn every pair of the previous and this layer's sets, as the BPF map counts. */
	if (layer == 0) {
		for (uint32_t i = 0; i < k; i++)
			d->first[ids[i]] += 1;
	} else {
		const float *prev = pf->it->traj + (size_t)(layer - 1) * J;
		double *T = d->trans + (size_t)(layer - 1) * J * J;
		double *rows = d->row_sum + (size_t)(layer - 1) * J;

		for (uint32_t a = 0; a < J; a++) {
			if (!(prev[a] > 0))
				continue;
			for (uint32_t i = 0; i < k; i++)
				T[a * J + ids[i]] += 1;
			rows[a] += k;
		}
	}
	if (target >= pf->env.layers)
		return;
	for (uint32_t j = 0; j < J; j++)
		d->q[j] = pf->it->traj[(size_t)layer * J + j];
	if (propagate(d, layer, target))
		plan_q(pf, d, target, (int32_t)layer);
}

static void dependency_fini(struct mp_prefetch *pf)
{
	struct dependency *d = pf->priv;

	if (!d)
		return;
	free(d->trans);
	free(d->row_sum);
	free(d->first);
	free(d->q);
	free(d->nq);
	free(d->P);
	free(d);
	pf->priv = NULL;
}

const struct mp_prefetch_ops mp_prefetch_dependency = {
	.name = "dependency",
	.description = "layer-to-layer transition probabilities from recorded transition counts",
	.init = dependency_init,
	.begin = dependency_begin,
	.gate = dependency_gate,
	.fini = dependency_fini,
};
