// SPDX-License-Identifier: MIT
/*
 * The dependency graph: preliminary -> subsequent edges with the probability
 * that the subsequent model runs after the preliminary one. Checked acyclic,
 * with start probabilities summing to 1; a model's usage probability is the
 * chance a request reaches it (start, or through its preliminaries).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "coe/coe_priv.h"

/* Start probabilities may miss 1 by rounding in the file, no more. */
#define PROB_SLACK 1e-6

uint64_t coe_mix(uint64_t a, uint64_t b)
{
	uint64_t z = a * 0x9e3779b97f4a7c15ull + b + 0x632be59bd9b4e019ull;

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static int cmp_edge(const void *a, const void *b)
{
	const struct mp_coe_edge *x = a, *y = b;

	if (x->from != y->from)
		return x->from < y->from ? -1 : 1;
	return x->to < y->to ? -1 : x->to > y->to;
}

/* Names one cycle: walks back from a model left over by Kahn's order. */
static int report_cycle(const struct mp_coe *c, const char *what, const uint32_t *indeg)
{
	uint32_t start = 0, m;
	char path[256] = "";
	size_t len = 0;

	while (!indeg[start])
		start++;
	/* Step back along unresolved edges n_models times: we are then on a cycle. */
	m = start;
	for (uint32_t i = 0; i < c->n_models; i++)
		for (uint32_t j = 0; j < c->models[m].n_pre; j++)
			if (indeg[c->models[m].pre[j]]) {
				m = c->models[m].pre[j];
				break;
			}
	start = m;
	do {
		len += (size_t)snprintf(path + len, len < sizeof(path) ? sizeof(path) - len : 0,
					"%s <- ", c->models[m].name);
		for (uint32_t j = 0; j < c->models[m].n_pre; j++)
			if (indeg[c->models[m].pre[j]]) {
				m = c->models[m].pre[j];
				break;
			}
	} while (m != start && len < sizeof(path));
	return mp_err(-ELOOP, "%s: the dependency graph has a cycle: %s%s", what, path,
		      c->models[start].name);
}

/* Fills pre lists and first_edge (edges sorted by from); refuses duplicate edges. */
static int link_edges(struct mp_coe *c, const char *what)
{
	qsort(c->edges, c->n_edges, sizeof(*c->edges), cmp_edge);
	for (uint32_t i = 0; i < c->n_edges; i++) {
		struct mp_coe_edge *e = &c->edges[i];

		if (i && e->from == e[-1].from && e->to == e[-1].to)
			return mp_err(-EINVAL, "%s: dependency %s -> %s given twice",
				      what, c->models[e->from].name, c->models[e->to].name);
		if (!c->models[e->from].n_next++)
			c->models[e->from].first_edge = i;
		c->models[e->to].n_pre++;
	}
	for (uint32_t m = 0; m < c->n_models; m++) {
		c->models[m].pre = calloc(c->models[m].n_pre ? c->models[m].n_pre : 1,
					  sizeof(uint32_t));
		if (!c->models[m].pre)
			return -ENOMEM;
		c->models[m].n_pre = 0;
	}
	for (uint32_t i = 0; i < c->n_edges; i++) {
		struct coe_model *to = &c->models[c->edges[i].to];

		to->pre[to->n_pre++] = c->edges[i].from;
	}
	return 0;
}

static int check_probabilities(const struct mp_coe *c, const char *what)
{
	double sum = 0;

	for (uint32_t m = 0; m < c->n_models; m++) {
		const struct coe_model *x = &c->models[m];
		double out = 0;

		sum += x->p_first;
		for (uint32_t i = 0; i < x->n_next; i++)
			out += c->edges[x->first_edge + i].p;
		if (out > 1 + PROB_SLACK)
			return mp_err(-EINVAL, "%s: model \"%s\": its dependencies' "
				      "probabilities sum to %.9g (at most 1: one subsequent model "
				      "runs after it, or none)", what, x->name, out);
	}
	if (fabs(sum - 1) > PROB_SLACK)
		return mp_err(-EINVAL, "%s: the models' start probabilities (\"p\") sum to %.9g, "
			      "not 1", what, sum);
	return 0;
}

int coe_graph_build(struct mp_coe *c, const char *what)
{
	uint32_t *indeg, *order, head = 0, tail = 0;
	int err;

	err = link_edges(c, what);
	if (err)
		return err;
	err = check_probabilities(c, what);
	if (err)
		return err;
	indeg = calloc(c->n_models, sizeof(*indeg));
	order = calloc(c->n_models, sizeof(*order));
	if (!indeg || !order) {
		err = -ENOMEM;
		goto free_all;
	}
	for (uint32_t m = 0; m < c->n_models; m++) {
		indeg[m] = c->models[m].n_pre;
		c->models[m].usage = c->models[m].p_first;
		if (!indeg[m])
			order[tail++] = m;
	}
	/* Kahn's order; usage flows along each edge once its source is final. */
	while (head < tail) {
		const struct coe_model *x = &c->models[order[head++]];

		for (uint32_t i = 0; i < x->n_next; i++) {
			const struct mp_coe_edge *e = &c->edges[x->first_edge + i];

			c->models[e->to].usage += x->usage * e->p;
			if (!--indeg[e->to])
				order[tail++] = e->to;
		}
	}
	if (tail < c->n_models)
		err = report_cycle(c, what, indeg);
free_all:
	free(indeg);
	free(order);
	return err;
}

int mp_coe_next(const struct mp_coe *c, uint32_t model, uint64_t request, uint32_t token)
{
	const struct coe_model *x;
	double u, cum = 0;

	if (model >= c->n_models)
		return mp_err(-EINVAL, "coe: model %u out of range (%u)", model, c->n_models);
	x = &c->models[model];
	/* 53 random bits of (request, model, token): the same draw whatever ran before. */
	u = (double)(coe_mix(coe_mix(request, model), token) >> 11) * 0x1.0p-53;
	for (uint32_t i = 0; i < x->n_next; i++) {
		cum += c->edges[x->first_edge + i].p;
		if (u < cum)
			return (int)c->edges[x->first_edge + i].to;
	}
	return -ENOENT;
}
