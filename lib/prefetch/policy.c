// SPDX-License-Identifier: MIT
/* The prefetch policy table, the iteration bookkeeping every policy shares, and δ-selection. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <moepager/prefetch.h>

#include "base/base.h"
#include "evict/evict.h"
#include "prefetch/policy.h"

#define DEFAULT_DISTANCE 3u

static const struct mp_prefetch_ops *const policies[] = {
	&mp_prefetch_none,
	&mp_prefetch_nextlayer,
	&mp_prefetch_eam,
	&mp_prefetch_finemoe,
	&mp_prefetch_finemoe_nextlayer,
	&mp_prefetch_dependency,
	&mp_prefetch_oracle,
};

const struct mp_prefetch_ops *mp_prefetch_find(const char *name)
{
	for (size_t i = 0; name && i < MP_ARRAY_SIZE(policies); i++)
		if (!strcmp(policies[i]->name, name))
			return policies[i];
	return NULL;
}

const char *mp_prefetch_names(void)
{
	return "none, nextlayer, eam, finemoe, finemoe+nextlayer, dependency, oracle";
}

const char *mp_prefetch_policy_names(void)
{
	return mp_prefetch_names();
}

const char *mp_eviction_policy_names(void)
{
	return mp_evict_names();
}

int mp_prefetch_check_names(const char *prefetch, const char *eviction)
{
	if (prefetch && !mp_prefetch_find(prefetch))
		return mp_err(-EINVAL, "unknown prefetch policy '%s' (%s)", prefetch,
			      mp_prefetch_names());
	if (eviction && !mp_evict_find(eviction))
		return mp_err(-EINVAL, "unknown eviction policy '%s' (%s)", eviction,
			      mp_evict_names());
	return 0;
}

uint64_t mp_prefetch_cpu_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void iter_fini(struct mp_prefetch *pf, struct mp_prefetch_iter *it)
{
	if (it->priv && pf->ops && pf->ops->iter_fini)
		pf->ops->iter_fini(pf, it);
	free(it->priv);
	free(it->traj);
	free(it->context);
	free(it->hint_p);
	free(it->sem_buf);
}

static int iter_init(struct mp_prefetch *pf, struct mp_prefetch_iter *it)
{
	size_t lj = (size_t)pf->env.layers * pf->env.experts;

	it->traj = calloc(lj, sizeof(float));
	it->context = calloc(lj, sizeof(float));
	it->hint_p = malloc(lj * sizeof(float));
	it->sem_buf = pf->env.sem_dim ? calloc(pf->env.sem_dim, sizeof(float)) : NULL;
	it->priv = pf->ops->iter_size ? calloc(1, pf->ops->iter_size) : NULL;
	if (!it->traj || !it->context || !it->hint_p || (pf->env.sem_dim && !it->sem_buf) ||
	    (pf->ops->iter_size && !it->priv))
		return -ENOMEM;
	for (size_t i = 0; i < lj; i++)
		it->hint_p[i] = -1.0f;
	return pf->ops->iter_init ? pf->ops->iter_init(pf, it) : 0;
}

int mp_prefetch_init(struct mp_prefetch *pf, const struct mp_prefetch_ops *ops,
		     const struct mp_prefetch_env *env)
{
	int err;

	memset(pf, 0, sizeof(*pf));
	if (!ops || !env || !env->layers || env->layers > MP_MAX_LAYERS || !env->experts ||
	    env->experts > MP_MAX_EXPERTS || !env->topk || env->topk > env->experts ||
	    env->requests > MP_PREFETCH_MAX_REQUESTS)
		return mp_err(-EINVAL, "prefetch: bad geometry (layers %u, experts %u, topk %u, "
			      "requests %u)", env ? env->layers : 0, env ? env->experts : 0,
			      env ? env->topk : 0, env ? env->requests : 0);
	pf->ops = ops;
	pf->env = *env;
	if (!pf->env.distance)
		pf->env.distance = MP_MIN(DEFAULT_DISTANCE, env->layers);
	if (pf->env.distance > env->layers)
		return mp_err(-EINVAL, "prefetch %s: distance %u above the model's %u layers",
			      ops->name, pf->env.distance, env->layers);
	pf->spec_rows = !ops->layer_input ? 0 : ops->deep_input ? pf->env.distance : 1;
	pf->spec_want = UINT32_MAX;
	pf->niters = pf->env.requests ? pf->env.requests : 1;
	pf->iters = calloc(pf->niters, sizeof(*pf->iters));
	pf->hint_dirty = calloc(env->layers, 1);
	pf->cap = 4 * env->experts + 16;
	pf->items = malloc(pf->cap * sizeof(*pf->items));
	err = pf->iters && pf->hint_dirty && pf->items ? 0 : -ENOMEM;
	for (uint32_t i = 0; !err && i < pf->niters; i++)
		err = iter_init(pf, &pf->iters[i]);
	if (err) {
		mp_prefetch_fini(pf);
		return mp_err(err, "prefetch %s: no memory for %u requests' state", ops->name,
			      pf->niters);
	}
	pf->it = &pf->iters[0];
	if (ops->init) {
		err = ops->init(pf);
		if (err) {
			for (uint32_t i = 0; i < pf->niters; i++)
				iter_fini(pf, &pf->iters[i]);
			free(pf->iters);
			pf->iters = NULL;
			pf->ops = NULL;
			mp_prefetch_fini(pf);
			return err;
		}
	}
	return 0;
}

void mp_prefetch_fini(struct mp_prefetch *pf)
{
	for (uint32_t i = 0; pf->iters && i < pf->niters; i++)
		iter_fini(pf, &pf->iters[i]);
	if (pf->ops && pf->ops->fini)
		pf->ops->fini(pf);
	free(pf->iters);
	free(pf->hint_dirty);
	free(pf->items);
	memset(pf, 0, sizeof(*pf));
}

uint32_t mp_prefetch_switch(struct mp_prefetch *pf, uint32_t request)
{
	struct mp_prefetch_iter *pick = NULL;

	for (uint32_t i = 0; i < pf->niters && !pick; i++)
		if (pf->iters[i].used && pf->iters[i].request == request)
			pick = &pf->iters[i];
	for (uint32_t i = 0; i < pf->niters && !pick; i++)
		if (!pf->iters[i].used)
			pick = &pf->iters[i];
	if (!pick) {
		pick = &pf->iters[0];
		for (uint32_t i = 1; i < pf->niters; i++)
			if (pf->iters[i].last_use < pick->last_use)
				pick = &pf->iters[i];
	}
	pf->it = pick;
	pick->last_use = ++pf->uses;
	if (!pick->used || pick->request != request) {
		/* Taken over: what was open ends here, as a new request's begin would end it. */
		if (pick->in_iter)
			mp_prefetch_end(pf);
		pick->used = true;
		pick->request = request;
	}
	return (uint32_t)(pick - pf->iters);
}

void mp_prefetch_set_model(struct mp_prefetch *pf, uint32_t model)
{
	struct mp_prefetch_iter *it = pf->it;

	if (!it || it->model == model || model >= MP_PREFETCH_MAX_MODELS)
		return;
	if (it->in_iter)
		mp_prefetch_end(pf);
	it->model = model;
	it->have_context = false;
	/* Its hints were the old model's rows'. */
	for (size_t i = 0; i < (size_t)pf->env.layers * pf->env.experts; i++)
		it->hint_p[i] = -1.0f;
	memset(pf->hint_dirty, 1, pf->env.layers);
}

static void clear_out(struct mp_prefetch *pf)
{
	pf->n = 0;
	memset(pf->hint_dirty, 0, pf->env.layers);
}

void mp_prefetch_emit(struct mp_prefetch *pf, uint32_t layer, uint32_t expert, float p,
		      int32_t l_now)
{
	int32_t dist = (int32_t)layer - l_now;

	if (layer >= pf->env.layers || expert >= pf->env.experts)
		return;
	if (pf->n == pf->cap) {
		uint32_t cap = pf->cap * 2;
		struct mp_prefetch_item *it = realloc(pf->items, cap * sizeof(*it));

		if (!it)
			return;		/* a prediction lost, never an error for inference */
		pf->items = it;
		pf->cap = cap;
	}
	/* PRI = p / (l - l_now); a layer at or behind l_now is as urgent as the next one. */
	pf->items[pf->n++] = (struct mp_prefetch_item){
		.layer = layer, .expert = expert, .p = p,
		.prio = p / (float)(dist > 0 ? dist : 1),
	};
	pf->emitted++;
}

/* A probability as selection ranks it: NaN and negative values count as 0 (never as mass). */
static float rank_p(const float *p, uint32_t x)
{
	return p[x] > 0 ? p[x] : 0;
}

static int by_p_desc(const void *a, const void *b, void *arg)
{
	const float *p = arg;
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	float px = rank_p(p, x), py = rank_p(p, y);

	if (px != py)
		return px > py ? -1 : 1;
	return x < y ? -1 : x > y;
}

/* The `want` first of p's indices in by_p_desc() order, into out: insertion, want is small. */
static void first_by_p(const float *p, uint32_t n, uint32_t want, uint32_t *out)
{
	uint32_t cnt = 0;

	/* Indices come in increasing order: an equal value never goes before one already in. */
	for (uint32_t j = 0; j < n; j++) {
		float pj = rank_p(p, j);
		uint32_t i;

		if (cnt == want && !(pj > rank_p(p, out[cnt - 1])))
			continue;
		i = cnt < want ? cnt++ : cnt - 1;
		for (; i > 0 && pj > rank_p(p, out[i - 1]); i--)
			out[i] = out[i - 1];
		out[i] = j;
	}
}

/*
 * How many of the ranked out[0..avail) the selection takes: the smallest
 * prefix with mass >= delta and at least k members, never adding a zero
 * beyond k. UINT32_MAX when it needs to look past avail (< n).
 */
static uint32_t take(const float *p, const uint32_t *out, uint32_t avail, uint32_t n, uint32_t k,
		     float delta)
{
	double sum = 0;
	uint32_t m = 0;

	while (m < avail) {
		float pj = rank_p(p, out[m]);

		/* Enough mass and enough members; a zero-probability expert only fills up to k. */
		if (m >= k && (sum >= (double)delta - 1e-6 || !(pj > 0)))
			return m;
		sum += pj;
		m++;
	}
	return avail < n ? UINT32_MAX : m;
}

uint32_t mp_prefetch_select(const float *p, uint32_t n, uint32_t k, float score, uint32_t *out)
{
	float delta = 1.0f - score;
	uint32_t want, m;

	if (!(delta > 0))
		delta = 0;	/* also catches NaN scores: trust the map, take top-k */
	if (delta > 1)
		delta = 1;
	if (k > n)
		k = n;
	/* A set rarely goes far past k: rank that many first, and all only when it does. */
	want = MP_MIN(n, 2 * k + 2);
	first_by_p(p, n, want, out);
	m = take(p, out, want, n, k, delta);
	if (m != UINT32_MAX)
		return m;
	for (uint32_t j = 0; j < n; j++)
		out[j] = j;
	qsort_r(out, n, sizeof(*out), by_p_desc, (void *)p);
	return take(p, out, n, n, k, delta);
}

void mp_prefetch_hint(struct mp_prefetch *pf, uint32_t layer, const float *P)
{
	if (layer >= pf->env.layers)
		return;
	memcpy(pf->it->hint_p + (size_t)layer * pf->env.experts, P,
	       pf->env.experts * sizeof(float));
	pf->hint_dirty[layer] = 1;
}

/*
 * δ-selection on P (summing to 1), then emits each member whose value is at
 * least min, with that value as its p; value becomes the layer's hints.
 */
static void plan_select(struct mp_prefetch *pf, uint32_t layer, const float *P,
			const float *value, float min, float score, int32_t l_now)
{
	uint32_t ids[MP_MAX_EXPERTS];
	uint32_t m;

	if (layer >= pf->env.layers)
		return;
	m = mp_prefetch_select(P, pf->env.experts, pf->env.topk, score, ids);
	/* !(v < min) rather than v >= min: a NaN the selection took stays taken. */
	for (uint32_t i = 0; i < m; i++)
		if (!(value[ids[i]] < min))
			mp_prefetch_emit(pf, layer, ids[i], value[ids[i]], l_now);
	mp_prefetch_hint(pf, layer, value);
}

void mp_prefetch_plan(struct mp_prefetch *pf, uint32_t layer, const float *P, float score,
		      int32_t l_now)
{
	plan_select(pf, layer, P, P, -INFINITY, score, l_now);
}

float mp_prefetch_min_p(const struct mp_prefetch *pf, int32_t dist)
{
	float c = pf->load_ratio;

	if (!(c > 0))
		return 0.0f;
	return c / (c + (float)(dist > 0 ? dist : 1));
}

void mp_prefetch_miss_weights(const struct mp_prefetch *pf, float *w)
{
	const uint32_t L = pf->env.layers;
	uint32_t late = 0;

	for (uint32_t l = 0; l < L; l++) {
		float lead = pf->ops->lead ? pf->ops->lead(pf, l) : -1.0f;

		w[l] = pf->load_ratio > 0 && lead < pf->load_ratio ? MP_PREFETCH_MISS_W : 1.0f;
		late += w[l] != 1.0f;
	}
	if (late == L)
		for (uint32_t l = 0; l < L; l++)
			w[l] = 1.0f;
}

void mp_prefetch_plan_use(struct mp_prefetch *pf, uint32_t layer, const float *use, float score,
			  int32_t l_now)
{
	float P[MP_MAX_EXPERTS];

	for (uint32_t j = 0; j < pf->env.experts; j++)
		P[j] = use[j] / (float)pf->env.topk;
	plan_select(pf, layer, P, use, mp_prefetch_min_p(pf, (int32_t)layer - l_now), score,
		    l_now);
}

void mp_prefetch_end(struct mp_prefetch *pf)
{
	struct mp_prefetch_iter *it = pf->it;
	size_t lj = (size_t)pf->env.layers * pf->env.experts;

	clear_out(pf);
	if (!it->in_iter)
		return;
	it->in_iter = false;
	/* An iteration begun on a wrong guess saw no gate: nothing to learn from it. */
	if (!it->gates)
		return;
	if (pf->ops->end)
		pf->ops->end(pf);
	memcpy(it->context, it->traj, lj * sizeof(float));
	it->have_context = true;
	pf->iterations++;
}

void mp_prefetch_begin(struct mp_prefetch *pf, uint32_t request, uint32_t token,
		       const float *sem)
{
	struct mp_prefetch_iter *it = pf->it;
	size_t lj = (size_t)pf->env.layers * pf->env.experts;

	if (it->in_iter)
		mp_prefetch_end(pf);
	clear_out(pf);
	it->used = true;
	it->request = request;
	it->token = token;
	if (pf->env.sem_dim) {
		/* A copy: the caller's vector need not outlive the call, end() stores it. */
		it->sem = sem ? memcpy(it->sem_buf, sem, pf->env.sem_dim * sizeof(float)) : NULL;
		it->sem_len = pf->env.sem_dim;
	} else {
		/* No semantic vector: the last iteration's map is the context (zeros at first). */
		it->sem = it->context;
		it->sem_len = (uint32_t)lj;
	}
	memset(it->traj, 0, lj * sizeof(float));
	it->in_iter = true;
	it->gates = 0;
	if (pf->ops->begin)
		pf->ops->begin(pf);
}

int mp_prefetch_gate(struct mp_prefetch *pf, uint32_t layer, const uint32_t *ids,
		     const float *weights, uint32_t k, const float *probs, const float *spec)
{
	uint32_t J = pf->env.experts;
	float *row;
	double sum = 0;

	clear_out(pf);
	if (layer >= pf->env.layers || !k || k > J || !ids)
		return mp_err(-EINVAL, "prefetch: gate of layer %u with %u experts", layer, k);
	row = pf->it->traj + (size_t)layer * J;
	memset(row, 0, J * sizeof(float));
	if (probs) {
		for (uint32_t j = 0; j < J; j++)
			row[j] = probs[j] > 0 ? probs[j] : 0;
	} else {
		for (uint32_t i = 0; i < k; i++) {
			if (ids[i] >= J)
				return mp_err(-EINVAL, "prefetch: layer %u: expert %u out of range",
					      layer, ids[i]);
			row[ids[i]] = weights ? (weights[i] > 0 ? weights[i] : 0) : 1.0f;
		}
	}
	for (uint32_t j = 0; j < J; j++)
		sum += row[j];
	for (uint32_t j = 0; sum > 0 && j < J; j++)
		row[j] = (float)(row[j] / sum);
	pf->it->gates++;
	if (pf->ops->gate)
		pf->ops->gate(pf, layer, ids, k, spec);
	return 0;
}
